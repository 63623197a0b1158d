//! `livenessd`: wires the store, the exit monitor, the engine and the socket server
//! together, and owns their shutdown.

use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing_subscriber::EnvFilter;

use crate::engine::{Engine, EngineConfig};
use crate::identity::ProcRoot;
use crate::paths::Env;
use crate::source::ebpf::EbpfConfig;
use crate::source::monitor::{Monitor, MonitorConfig, Selection};
use crate::source::pidfd::PidfdConfig;
use crate::store::Store;

/// Commands queued from connections to the engine; connections wait when it is full.
const ENGINE_QUEUE: usize = 1024;

/// The liveness daemon: learns from the kernel when session owners die and finalizes
/// their sessions.
///
/// With no flags it runs on its embedded defaults: as root, state in /var/lib/liveness and
/// the socket /run/liveness/liveness.sock; as another user, $XDG_STATE_HOME/liveness and
/// $XDG_RUNTIME_DIR/liveness.sock. It stays in the foreground and logs to stderr (or
/// --log-file); SIGTERM/SIGINT stop it cleanly, SIGHUP reopens the log file.
#[derive(Debug, Parser)]
#[command(name = "livenessd", version)]
pub struct Args {
    /// Socket to listen on [env: LIVENESS_SOCKET].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Directory for the database [env: LIVENESS_STATE_DIR].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Exit sources: auto, or a comma-separated list of ebpf, pidfd, procpoll.
    #[arg(long, default_value = "auto", value_name = "LIST")]
    sources: Selection,
    /// How often the /proc poller re-checks the processes it covers.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    procpoll_interval: Duration,
    /// Sessions whose owner cannot be watched (another host) end after this long without activity.
    #[arg(long, default_value = "1h", value_parser = parse_duration, value_name = "DURATION")]
    unknown_timeout: Duration,
    /// Pending sessions that are never renamed end after this long.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pending_ttl: Duration,
    /// Keep at most this many events for replay.
    #[arg(long, default_value_t = 100_000, value_name = "COUNT")]
    retain_events: u64,
    /// Keep events for replay at most this long.
    #[arg(long, default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    retain_age: Duration,
    /// Commits (batches of events) queued per subscriber before it is disconnected as lagging.
    #[arg(long, default_value_t = 4096, value_name = "COUNT")]
    subscriber_queue: usize,
    /// How long a death seen only by a pidfd waits for its parent's reap, which gives the
    /// exit status on Linux 6.15+; past it the session ends without a status.
    #[arg(long, default_value = "250ms", value_parser = parse_duration, value_name = "DURATION")]
    exit_status_wait: Duration,
    /// Most processes the eBPF filter map holds.
    #[arg(long, default_value_t = EbpfConfig::default().max_tracked, value_name = "COUNT")]
    ebpf_max_tracked: u32,
    /// Size of the eBPF ring buffer (a power of two, at least 4096). Deaths that find it
    /// full are counted, and every tracked process is then re-checked.
    #[arg(long, default_value_t = EbpfConfig::default().ring_bytes, value_parser = parse_ring_bytes, value_name = "BYTES")]
    ebpf_ring_bytes: u32,
    /// A process name that `owner: "auto"` skips as a wrapper (repeatable).
    #[arg(long = "wrapper", value_name = "COMM")]
    wrappers: Vec<String>,
    /// Log to this file instead of stderr; SIGHUP reopens it (for log rotation).
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
}

fn parse_ring_bytes(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(bytes) if bytes >= 4096 && bytes.is_power_of_two() => Ok(bytes),
        _ => Err(format!("{text:?} is not a power of two of at least 4096")),
    }
}

/// Parses durations such as `250ms`, `30s`, `2m`, `1h`, `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s, 2m, 1h, 7d"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?} has no unit: use ms, s, m, h or d")),
    };
    Ok(Duration::from_millis(number.saturating_mul(millis)))
}

#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("cannot create {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("another livenessd already uses {0}")]
    StateLocked(PathBuf),
    #[error("another livenessd is listening on {0}")]
    SocketInUse(PathBuf),
    #[error("cannot listen on {path}: {source}")]
    Listen { path: PathBuf, source: io::Error },
    #[error("cannot open the log file {path}: {source}")]
    LogFile { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("cannot open the database: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Monitor(#[from] crate::source::monitor::MonitorError),
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
}

/// A log destination that SIGHUP can reopen (after logrotate moved the file).
#[derive(Debug, Clone)]
struct LogFile {
    path: PathBuf,
    file: Arc<Mutex<File>>,
}

impl LogFile {
    fn open(path: &Path) -> Result<LogFile, StartError> {
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

    fn reopen(&self) -> io::Result<()> {
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

fn init_logging(log_file: Option<&LogFile>) {
    let filter = EnvFilter::try_from_env("LIVENESS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match log_file {
        Some(file) => builder.with_ansi(false).with_writer(file.clone()).init(),
        None => builder
            .with_ansi(io::stderr().is_terminal())
            .with_writer(io::stderr)
            .init(),
    }
}

fn create_dir(path: &Path, mode: u32) -> Result<(), StartError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|source| StartError::CreateDir {
            path: path.into(),
            source,
        })
}

/// Holds an exclusive lock on the state directory for the daemon's life: two daemons on
/// one database would each finalize what the other tracks.
fn lock_state_dir(dir: &Path) -> Result<File, StartError> {
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(|_| StartError::StateLocked(dir.into()))?;
    Ok(file)
}

/// Binds the socket, replacing a stale one left by a crash but never a live daemon's.
fn bind_socket(path: &Path) -> Result<UnixListener, StartError> {
    if let Some(parent) = path.parent() {
        create_dir(parent, 0o755)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(StartError::SocketInUse(path.into()));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path).map_err(|source| StartError::Listen {
        path: path.into(),
        source,
    })?;
    // Anyone may connect; SO_PEERCRED decides what each caller may see and change.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// Entry point of `livenessd`.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let log_file = match args.log_file.as_deref().map(LogFile::open).transpose() {
        Ok(file) => file,
        Err(e) => {
            eprintln!("livenessd: {e}");
            return ExitCode::from(1);
        }
    };
    init_logging(log_file.as_ref());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::from(1);
        }
    };
    let logs_to_file = log_file.is_some();
    match runtime.block_on(run(args, log_file)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            // Whoever started the daemon reads stderr, not the log file.
            if logs_to_file {
                eprintln!("livenessd: {e}");
            }
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args, log_file: Option<LogFile>) -> Result<(), StartError> {
    // Before anything else: SIGHUP's default action would kill a daemon that is starting.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let env = Env::from_process();
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| env.default_state_dir());
    let socket = args.socket.clone().unwrap_or_else(|| env.default_socket());
    create_dir(&state_dir, 0o700)?;
    let _lock = lock_state_dir(&state_dir)?;

    match crate::source::pidfd::raise_nofile_limit() {
        Ok((soft, hard)) => tracing::debug!(soft, hard, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let database = state_dir.join("liveness.db");
    let store = Store::open(&database)?;
    let proc = ProcRoot::default();
    let monitor = Monitor::start(MonitorConfig {
        selection: args.sources.clone(),
        procpoll_interval: args.procpoll_interval,
        ebpf: EbpfConfig {
            max_tracked: args.ebpf_max_tracked,
            ring_bytes: args.ebpf_ring_bytes,
        },
        pidfd: PidfdConfig {
            status_wait: args.exit_status_wait,
        },
        proc: proc.clone(),
        queue: crate::source::monitor::DEFAULT_QUEUE,
    })
    .await?;
    let sources: Vec<String> = monitor
        .active_sources()
        .iter()
        .map(ToString::to_string)
        .collect();
    let about = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": crate::protocol::PROTOCOL_VERSION,
        "pid": std::process::id(),
        "socket": socket,
        "state_dir": state_dir,
    });
    let engine = Engine::new(
        store,
        monitor,
        EngineConfig {
            unknown_timeout: args.unknown_timeout,
            pending_ttl: args.pending_ttl,
            retain_events: args.retain_events,
            retain_age: args.retain_age,
            wrappers: args.wrappers.clone(),
            subscriber_queue: args.subscriber_queue.max(1),
            proc,
        },
        about,
    )?;
    let listener = bind_socket(&socket)?;
    tracing::info!(socket = %socket.display(), state_dir = %state_dir.display(), sources = %sources.join(","), "livenessd listening");

    let (stop, stopped) = watch::channel(false);
    let (commands, command_queue) = mpsc::channel(ENGINE_QUEUE);
    let engine_task = tokio::spawn(engine.run(command_queue, stopped.clone()));
    let server_task = tokio::spawn(crate::server::serve(listener, commands, database, stopped));

    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => match &log_file {
                Some(file) => match file.reopen() {
                    Ok(()) => tracing::info!("SIGHUP: reopened the log file"),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: cannot reopen the log file"),
                },
                None => tracing::info!("SIGHUP: logging to stderr, nothing to reopen"),
            },
        }
    }
    tracing::info!("stopping");
    let _ = stop.send(true);
    if let Err(e) = server_task.await {
        tracing::error!(error = %e, "server task failed");
    }
    if let Err(e) = engine_task.await {
        tracing::error!(error = %e, "engine task failed");
    }
    let _ = std::fs::remove_file(&socket);
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::pidfd::DEFAULT_STATUS_WAIT;

    #[test]
    fn ring_sizes_are_powers_of_two_of_a_page_or_more() {
        assert_eq!(parse_ring_bytes("4096"), Ok(4096));
        assert_eq!(parse_ring_bytes("2097152"), Ok(2 * 1024 * 1024));
        for bad in ["4095", "6144", "2048", "0", "big"] {
            assert!(parse_ring_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("h").unwrap_err().contains("not a duration"));
        assert!(parse_duration("5 weeks").is_err());
        assert_eq!(
            Args::parse_from(["livenessd"]).exit_status_wait,
            DEFAULT_STATUS_WAIT,
            "the flag's default is the library's"
        );
    }
}
