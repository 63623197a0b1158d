//! Where the daemon logs: stderr, a file that SIGHUP reopens, or the journal's own fields.

use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing_subscriber::EnvFilter;

use super::StartError;

/// A log destination that SIGHUP can reopen (after logrotate moved the file).
#[derive(Debug, Clone)]
pub(super) struct LogFile {
    path: PathBuf,
    file: Arc<Mutex<File>>,
}

impl LogFile {
    pub(super) fn open(path: &Path) -> Result<LogFile, StartError> {
        let file = Self::open_file(path).map_err(|source| StartError::LogFile {
            path: path.into(),
            source,
        })?;
        Ok(LogFile {
            path: path.into(),
            file: Arc::new(Mutex::new(file)),
        })
    }

    fn open_file(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(path)
    }

    pub(super) fn reopen(&self) -> io::Result<()> {
        let file = Self::open_file(&self.path)?;
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = file;
        Ok(())
    }
}

impl Write for &LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.lock().unwrap_or_else(|p| p.into_inner()).flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogFile {
    type Writer = &'a LogFile;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

pub(super) fn init_logging(log_file: Option<&LogFile>) {
    let filter = EnvFilter::try_from_env("LIVENESS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // The etcd client's transport logs every HTTP/2 frame at debug: only what the daemon
    // says itself, unless LIVENESS_LOG names those crates.
    let filter = ["h2", "hyper", "hyper_util", "tower", "tonic"]
        .into_iter()
        .filter(|noisy| !std::env::var("LIVENESS_LOG").is_ok_and(|asked| asked.contains(noisy)))
        .fold(filter, |filter, noisy| {
            filter.add_directive(format!("{noisy}=info").parse().expect("a valid directive"))
        });
    // Under systemd with stderr going to the journal, log to journald natively so that
    // every field (session, owner_pid, reason, source, latency_ms...) is a journal field:
    // `journalctl -u livenessd SESSION=abc`.
    if log_file.is_none()
        && stderr_is_the_journal()
        && let Ok(journald) = tracing_journald::layer()
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::registry()
            .with(filter)
            // Fields unprefixed (SESSION, not tracing-journald's default F_SESSION).
            .with(
                journald
                    .with_syslog_identifier("livenessd".into())
                    .with_field_prefix(None),
            )
            .init();
        return;
    }
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match log_file {
        Some(file) => builder.with_ansi(false).with_writer(file.clone()).init(),
        None => builder
            .with_ansi(io::stderr().is_terminal())
            .with_writer(io::stderr)
            .init(),
    }
}

/// Whether stderr is the journal's stream: systemd sets `JOURNAL_STREAM=DEV:INODE` for a
/// service whose output goes to the journal, and the numbers must be stderr's own (a child
/// that inherited the variable but not the stream is not logging to the journal).
fn stderr_is_the_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = rustix::fs::fstat(io::stderr()) else {
        return false;
    };
    stream.to_string_lossy() == format!("{}:{}", stat.st_dev, stat.st_ino)
}
