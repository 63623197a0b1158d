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

use crate::engine::{Clock, Engine, EngineConfig};
use crate::limits::Limits;
use crate::source::ebpf::EbpfConfig;
use crate::source::monitor::{Monitor, MonitorConfig, Selection};
use crate::source::pidfd::PidfdConfig;
use crate::store::Store;
use crate::trust::DirUse;
use liveness_common::status::{DaemonInfo, LimitsConfig};
use liveness_proc::identity::ProcRoot;
use liveness_proc::paths::Env;

/// Commands queued from connections to the engine; connections wait when it is full.
const ENGINE_QUEUE: usize = 1024;

/// The liveness daemon: learns from the kernel when session owners die and finalizes
/// their sessions.
///
/// With no flags it runs on its embedded defaults: as root, state in /var/lib/liveness and
/// the socket /run/liveness/liveness.sock; as another user, $XDG_STATE_HOME/liveness and
/// $XDG_RUNTIME_DIR/liveness.sock. It stays in the foreground and logs to stderr (or
/// --log-file); SIGTERM/SIGINT stop it cleanly, SIGHUP reopens the log file. Should any
/// part of it fail while running, it exits non-zero so that a supervisor restarts it.
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
    /// Keep events for replay, and ended sessions for `get`, at most this long. An ended
    /// session's id is refused while it is kept and free again once it is deleted.
    #[arg(long, default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    retain_age: Duration,
    /// Commits (batches of events) queued per subscriber before it is disconnected as lagging.
    #[arg(long, default_value_t = 4096, value_name = "COUNT")]
    subscriber_queue: usize,
    /// How long a death seen only by a pidfd waits for its parent's reap, which gives the
    /// exit status on Linux 6.15+; past it the session ends without a status.
    #[arg(long, default_value = "50ms", value_parser = parse_duration, value_name = "DURATION")]
    exit_status_wait: Duration,
    /// Put on each `session.ended` event the monotonic time of every hop its death took
    /// through the daemon (`hops`), for benchmarks.
    #[arg(long)]
    trace_hops: bool,
    /// Most processes the eBPF filter map holds.
    #[arg(long, default_value_t = EbpfConfig::default().max_tracked, value_name = "COUNT")]
    ebpf_max_tracked: u32,
    /// Size of the eBPF ring buffer (a power of two, at least 4096). Deaths that find it
    /// full are counted, and every tracked process is then re-checked.
    #[arg(long, default_value_t = EbpfConfig::default().ring_bytes, value_parser = parse_ring_bytes, value_name = "BYTES")]
    ebpf_ring_bytes: u32,
    /// Most session process-tree members the eBPF members map holds (it has room for one
    /// more entry per tracked process besides, so members never take a tracked process's
    /// room). New processes that find no room are counted, and members are then found by
    /// scanning /proc as well.
    #[arg(long, default_value_t = EbpfConfig::default().max_members, value_name = "COUNT")]
    ebpf_max_members: u32,
    /// A process name that `owner: "auto"` skips as a wrapper (repeatable).
    #[arg(long = "wrapper", value_name = "COMM")]
    wrappers: Vec<String>,
    /// Log to this file instead of stderr; SIGHUP reopens it (for log rotation).
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// Set a damaged database aside (renamed with a timestamp), start a new one from what
    /// can still be read, then run as usual (reconciling every session read).
    #[arg(long)]
    recover: bool,
    /// Open connections of one non-root uid.
    #[arg(long, default_value_t = LimitsConfig::default().connections_per_uid, value_parser = parse_count::<usize>, value_name = "COUNT")]
    max_connections_per_uid: usize,
    /// Open connections of all non-root uids together (root's are never refused).
    #[arg(long, default_value_t = LimitsConfig::default().connections, value_parser = parse_count::<usize>, value_name = "COUNT")]
    max_connections: usize,
    /// Requests of one non-root uid handled at once; more wait their turn.
    #[arg(long, default_value_t = LimitsConfig::default().requests_per_uid, value_parser = parse_count::<usize>, value_name = "COUNT")]
    max_requests_per_uid: usize,
    /// A client that begins a request line and does not end it within this long is
    /// disconnected.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    line_timeout: Duration,
    /// ACTIVE sessions of one non-root uid.
    #[arg(long, default_value_t = LimitsConfig::default().sessions_per_uid, value_parser = parse_count::<u64>, value_name = "COUNT")]
    max_sessions_per_uid: u64,
    /// Bytes of label keys and values of one session.
    #[arg(long, default_value_t = LimitsConfig::default().label_bytes, value_parser = parse_count::<u64>, value_name = "BYTES")]
    max_label_bytes: u64,
    /// Bytes of label keys and values of one non-root uid's ACTIVE sessions.
    #[arg(long, default_value_t = LimitsConfig::default().label_bytes_per_uid, value_parser = parse_count::<u64>, value_name = "BYTES")]
    max_label_bytes_per_uid: u64,
    /// Serve the status counters in the Prometheus format at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9464). Off by default; there is no authentication, so keep ADDR local.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Write the man page livenessd.8, generated from these flags, into DIR and exit (for
    /// packaging: `cargo xtask dist`).
    #[arg(long, value_name = "DIR", hide = true)]
    generate_man: Option<PathBuf>,
}

impl Args {
    fn limits(&self) -> LimitsConfig {
        LimitsConfig {
            connections_per_uid: self.max_connections_per_uid,
            connections: self.max_connections,
            requests_per_uid: self.max_requests_per_uid,
            line_timeout: self.line_timeout,
            sessions_per_uid: self.max_sessions_per_uid,
            label_bytes: self.max_label_bytes,
            label_bytes_per_uid: self.max_label_bytes_per_uid,
        }
    }
}

/// A limit: a positive whole number.
fn parse_count<T: std::str::FromStr + Default + PartialEq>(text: &str) -> Result<T, String> {
    match text.parse::<T>() {
        Ok(count) if count != T::default() => Ok(count),
        Ok(_) => Err("0 would refuse everything; give a positive number".into()),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

fn parse_ring_bytes(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(bytes) if bytes >= 4096 && bytes.is_power_of_two() => Ok(bytes),
        _ => Err(format!("{text:?} is not a power of two of at least 4096")),
    }
}

pub use liveness_common::duration::parse_duration;

#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("cannot create {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error(
        "no state directory: a user without $XDG_STATE_HOME or $HOME must give --state-dir \
         (or LIVENESS_STATE_DIR), a directory only they can write"
    )]
    NoStateDir,
    #[error("refusing an unsafe directory: {0}")]
    Untrusted(#[from] crate::trust::UntrustedDir),
    #[error("the {0} task ended unexpectedly")]
    TaskEnded(&'static str),
    #[error("the {task} task failed: {error}")]
    TaskFailed {
        task: &'static str,
        error: tokio::task::JoinError,
    },
    #[error("another livenessd already uses {0}")]
    StateLocked(PathBuf),
    #[error("another livenessd is listening on {0}")]
    SocketInUse(PathBuf),
    #[error(
        "the socket's directory {0} does not exist: create it first, or check --socket \
         (only the default runtime directory is created)"
    )]
    NoSocketDir(PathBuf),
    #[error("cannot listen for metrics on {addr}: {source}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        source: io::Error,
    },
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

/// Creates `path` (and its parents) unless it exists, then refuses it unless it is safe
/// for `usage`. A directory made here gets exactly the mode `usage` allows.
fn create_dir(path: &Path, usage: DirUse) -> Result<(), StartError> {
    let mode = match usage {
        DirUse::State => 0o700,
        DirUse::Socket => 0o755,
    };
    let created = !path.exists();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|source| StartError::CreateDir {
            path: path.into(),
            source,
        })?;
    if created {
        // The umask (0077 in the daemon) narrows the mode asked for; a socket directory
        // must let everyone in.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    crate::trust::check_dir(path, rustix::process::geteuid().as_raw(), usage)?;
    Ok(())
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
        create_dir(parent, DirUse::Socket)?;
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
    if let Some(dir) = &args.generate_man {
        return match write_man_page(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "livenessd: cannot write the man page into {}: {e}",
                    dir.display()
                );
                ExitCode::from(1)
            }
        };
    }
    // Files 0600 and directories 0700 (the database, its journal, the lock, the log)
    // whatever umask the daemon was started with; the socket is opened up explicitly.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    exit_on_panic();
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

fn write_man_page(dir: &Path) -> io::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(<Args as clap::CommandFactory>::command())
        .section("8")
        .render(&mut page)?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("livenessd.8"), page)
}

/// Exit code after a panic (EX_SOFTWARE).
const EXIT_PANIC: i32 = 70;

/// A panic anywhere (a source's task, a runtime worker) would leave a daemon that looks
/// alive but no longer does its job: it is logged and the process exits, so that the
/// supervisor restarts it.
fn exit_on_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!("panic: {info}; exiting so that the daemon is restarted");
        default_hook(info);
        std::process::exit(EXIT_PANIC);
    }));
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
        .or_else(|| env.default_state_dir())
        .ok_or(StartError::NoStateDir)?;
    let socket = args
        .socket
        .clone()
        .or_else(|| env.default_socket())
        .ok_or(StartError::NoStateDir)?;
    // Checked before anything is created or loaded: a typo in --socket fails at once.
    if let Some(dir) = socket.parent()
        && !dir.exists()
        && !env.may_create_socket_dir(dir)
    {
        return Err(StartError::NoSocketDir(dir.into()));
    }
    create_dir(&state_dir, DirUse::State)?;
    let _lock = lock_state_dir(&state_dir)?;

    match crate::source::pidfd::raise_nofile_limit() {
        Ok((soft, hard)) => tracing::debug!(soft, hard, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let database = state_dir.join("liveness.db");
    if args.recover {
        let recovered = Store::recover(&database)?;
        match &recovered.aside {
            Some(aside) => tracing::warn!(
                kept = %aside.display(),
                sessions = recovered.sessions,
                events = recovered.events,
                seq_floor = recovered.seq_floor,
                "recovered the damaged database: a new one holds what could be read"
            ),
            None => tracing::info!("--recover: the database is intact, nothing to recover"),
        }
    }
    let store = Store::open(&database)?;
    let limits = Limits::new(args.limits());
    let proc = ProcRoot::default();
    let monitor = Monitor::start(MonitorConfig {
        selection: args.sources.clone(),
        procpoll_interval: args.procpoll_interval,
        ebpf: EbpfConfig {
            max_tracked: args.ebpf_max_tracked,
            ring_bytes: args.ebpf_ring_bytes,
            max_members: args.ebpf_max_members,
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
    let about = DaemonInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        protocol: liveness_common::protocol::PROTOCOL_VERSION,
        pid: std::process::id(),
        socket: socket.display().to_string(),
        state_dir: state_dir.display().to_string(),
    };
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
            limits: Arc::clone(&limits),
            clock: Clock::System,
            trace_hops: args.trace_hops,
        },
        about,
    )?;
    let metrics = match args.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::MetricsListen { addr, source })?;
            tracing::info!(addr = %listener.local_addr()?, "metrics listening");
            Some((listener, engine.end_metrics()))
        }
        None => None,
    };
    let listener = bind_socket(&socket)?;
    tracing::info!(socket = %socket.display(), state_dir = %state_dir.display(), sources = %sources.join(","), "livenessd listening");
    crate::systemd::notify_ready(&format!("listening; sources {}", sources.join(",")));

    let (stop, stopped) = watch::channel(false);
    let (commands, command_queue) = mpsc::channel(ENGINE_QUEUE);
    let mut engine_task = tokio::spawn(engine.run(command_queue, stopped.clone()));
    let mut metrics_task = metrics.map(|(listener, ends)| {
        tokio::spawn(crate::metrics::serve(
            listener,
            commands.clone(),
            ends,
            stopped.clone(),
        ))
    });
    let mut server_task = tokio::spawn(crate::server::serve(
        listener, commands, database, limits, stopped,
    ));

    // The engine and the server run until told to stop: either ending first is a failure
    // that stops the daemon (non-zero), never a daemon left up without them.
    let failure = loop {
        tokio::select! {
            _ = terminate.recv() => break None,
            _ = interrupt.recv() => break None,
            _ = hangup.recv() => match &log_file {
                Some(file) => match file.reopen() {
                    Ok(()) => tracing::info!("SIGHUP: reopened the log file"),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: cannot reopen the log file"),
                },
                None => tracing::info!("SIGHUP: logging to stderr, nothing to reopen"),
            },
            ended = &mut engine_task => break Some(("engine", match ended {
                Ok(Ok(())) => StartError::TaskEnded("engine"),
                Ok(Err(e)) => StartError::Engine(e),
                Err(error) => StartError::TaskFailed { task: "engine", error },
            })),
            ended = &mut server_task => break Some(("server", match ended {
                Ok(()) => StartError::TaskEnded("server"),
                Err(error) => StartError::TaskFailed { task: "server", error },
            })),
            Some(ended) = async {
                match &mut metrics_task {
                    Some(task) => Some(task.await),
                    None => std::future::pending().await,
                }
            } => break Some(("metrics", match ended {
                Ok(()) => StartError::TaskEnded("metrics"),
                Err(error) => StartError::TaskFailed { task: "metrics", error },
            })),
        }
    };
    tracing::info!("stopping");
    let _ = stop.send(true);
    // The task that failed has ended (and its handle is spent); the other stops cleanly.
    let failed = failure.as_ref().map(|(task, _)| *task);
    if failed != Some("server")
        && let Err(e) = server_task.await
    {
        tracing::error!(error = %e, "server task failed");
    }
    if failed != Some("metrics")
        && let Some(task) = metrics_task
        && let Err(e) = task.await
    {
        tracing::error!(error = %e, "metrics task failed");
    }
    if failed != Some("engine") {
        match engine_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "engine failed while stopping"),
            Err(e) => tracing::error!(error = %e, "engine task failed"),
        }
    }
    let _ = std::fs::remove_file(&socket);
    match failure.map(|(_, failure)| failure) {
        None => {
            tracing::info!("stopped");
            Ok(())
        }
        Some(failure) => Err(failure),
    }
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
    fn the_status_wait_flag_defaults_to_the_librarys() {
        assert_eq!(
            Args::parse_from(["livenessd"]).exit_status_wait,
            DEFAULT_STATUS_WAIT,
            "the flag's default is the library's"
        );
    }

    /// The old reproduction of a zombie daemon: a source panicking in a task on a runtime
    /// worker (a zero poll interval, which the flags no longer accept) now ends the
    /// process with [`EXIT_PANIC`].
    #[test]
    fn a_task_that_panics_ends_the_process() {
        const CHILD: &str = "LIVENESS_DAEMON_TEST_PANICKING_CHILD";
        if std::env::var_os(CHILD).is_some() {
            exit_on_panic();
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let (sink, _events) = mpsc::channel(1);
                let task = tokio::spawn(async move {
                    crate::source::procpoll::ProcpollSource::start(
                        sink,
                        Duration::ZERO,
                        ProcRoot::default(),
                    )
                });
                let _ = task.await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
            unreachable!("the panic did not end the process");
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "daemon::tests::a_task_that_panics_ends_the_process",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(EXIT_PANIC), "{stderr}");
        assert!(stderr.contains("interval must not be zero"), "{stderr}");
    }

    #[test]
    fn zero_durations_and_limits_are_refused() {
        let refused = Args::try_parse_from(["livenessd", "--procpoll-interval", "0ms"])
            .expect_err("a zero poll interval");
        assert!(refused.to_string().contains("zero"), "{refused}");
        assert!(Args::try_parse_from(["livenessd", "--max-connections-per-uid", "0"]).is_err());
    }
}
