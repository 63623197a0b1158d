//! `livenessd`: wires the store, the exit monitor, the engine and the socket server
//! together, and owns their shutdown.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::cgroup::Support;
use crate::cgroup::systemd::Systemd;

/// Exists where systemd is the init (sd_booted(3)).
const SYSTEMD_BOOTED: &str = "/run/systemd/system";
use crate::engine::{ActionConfig, Clock, EngineConfig};
use crate::fair::limits::Limits;
use crate::source::ebpf::EbpfConfig;
use crate::source::lineage_pin::StatePins;
use crate::source::monitor::MonitorConfig;
use crate::source::pidfd::PidfdConfig;
use crate::store::Store;
use crate::trust::DirUse;
use args::Args;
use engine_thread::{EngineStart, EngineThread};
use liveness_common::status::DaemonInfo;
use liveness_proc::identity::ProcRoot;
use liveness_proc::paths::Env;
use logging::{LogFile, init_logging};
use places::{StateLock, bind_socket, create_dir, lock_state_dir};

mod args;
mod engine_thread;
mod logging;
mod places;

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
    TaskEnded(Task),
    #[error("the {task} task failed: {error}")]
    TaskFailed {
        task: Task,
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
    #[error(transparent)]
    Unpin(#[from] crate::source::lineage_pin::PinError),
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
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
    if args.unpin {
        return match unpin(&args) {
            Ok(message) => {
                println!("{message}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("livenessd: {e}");
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
    // Connections are served a step below the engine's thread (see `crate::fair::offload`).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(|| {
            crate::fair::offload::lower_this_thread(crate::fair::offload::CONNECTIONS_NICE)
        })
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

/// The daemon's long-lived parts, each of which stopping on its own is a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    Engine,
    Server,
    Metrics,
    Fleet,
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Task::Engine => "engine",
            Task::Server => "server",
            Task::Metrics => "metrics",
            Task::Fleet => "fleet mirror",
        })
    }
}

/// The signals the daemon handles, installed before anything else: SIGHUP's default
/// action would kill a daemon that is starting.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    fn install() -> io::Result<Signals> {
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }
}

/// Where the state and the socket are, from the flags or the embedded defaults.
fn places(args: &Args, env: &Env) -> Result<(PathBuf, PathBuf), StartError> {
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
    Ok((state_dir, socket))
}

/// The lineage pins of the state directory under `--ebpf-pin-dir`, if asked for.
fn lineage_pins(args: &Args, state_dir: &Path) -> Option<StatePins> {
    let root = args.ebpf_pin_dir.as_deref()?;
    Some(StatePins::of(root, state_dir))
}

/// `--unpin`: removes the state directory's lineage pins, once no daemon holds it.
fn unpin(args: &Args) -> Result<String, StartError> {
    let (state_dir, _) = places(args, &Env::from_process())?;
    // The running daemon's pins are its own to change.
    let _lock = state_dir
        .exists()
        .then(|| lock_state_dir(&state_dir))
        .transpose()?;
    let pins = lineage_pins(args, &state_dir).ok_or(StartError::NoStateDir)?;
    Ok(if crate::source::lineage_pin::unpin(&pins.dir)? {
        format!(
            "removed the lineage programs pinned in {}",
            pins.dir.display()
        )
    } else {
        format!("no lineage programs were pinned in {}", pins.dir.display())
    })
}

/// Opens the database, first setting a damaged one aside with `--recover`.
fn open_store(database: &Path, recover: bool) -> Result<Store, StartError> {
    if recover {
        let recovered = Store::recover(database)?;
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
        let state_dir = database.parent().unwrap_or(Path::new("."));
        let journal =
            crate::store::journal::recover(state_dir).map_err(crate::store::StoreError::from)?;
        if let Some(journal) = journal {
            tracing::error!(
                kept = %journal.aside.display(),
                entries = journal.entries,
                damaged_bytes = ?journal.skipped,
                lost_seqs = ?journal.lost_seqs,
                "recovered the damaged journal: every entry that reads is applied with its seqs; \
                 the events of the damaged ones are lost, and their sessions are ended again \
                 by the reconcile, under new seqs"
            );
        }
    }
    Ok(Store::open(database)?)
}

/// What the engine thread needs, from the flags.
fn engine_start(
    args: &Args,
    state_dir: &Path,
    store: Store,
    proc: &ProcRoot,
    limits: &Arc<Limits>,
    about: DaemonInfo,
    systemd: Result<Systemd, String>,
) -> EngineStart {
    let cgroups = Arc::new(Support::detect(
        &proc.path().join("self/mountinfo"),
        systemd,
    ));
    EngineStart {
        store,
        monitor: MonitorConfig {
            selection: args.sources.clone(),
            procpoll_interval: args.procpoll_interval,
            ebpf: EbpfConfig {
                max_tracked: args.ebpf_max_tracked,
                ring_bytes: args.ebpf_ring_bytes,
                max_members: args.ebpf_max_members,
                max_members_per_uid: args.ebpf_max_members_per_uid,
                pins: lineage_pins(args, state_dir),
                cgroup_names: cgroups.names(),
            },
            pidfd: PidfdConfig {
                status_wait: args.exit_status_wait,
            },
            proc: proc.clone(),
            queue: crate::source::monitor::DEFAULT_QUEUE,
        },
        engine: EngineConfig {
            unknown_timeout: args.unknown_timeout,
            pending_ttl: args.pending_ttl,
            retain_events: args.retain_events,
            retain_age: args.retain_age,
            wrappers: args.wrappers.clone(),
            subscriber_queue: args.subscriber_queue.max(1),
            proc: proc.clone(),
            limits: Arc::clone(limits),
            clock: Clock::System,
            trace_hops: args.trace_hops,
            // Off the engine's thread: on the runtime that serves connections.
            actions: ActionConfig {
                per_uid: args.action_slots,
                kill_grace: args.action_grace,
                runtime: Some(tokio::runtime::Handle::current()),
                proc: None,
            },
            cgroups,
            default_cgroup: args.session_cgroup,
        },
        about,
    }
}

/// Binds the metrics listener of `--metrics-listen`, if asked for.
async fn bind_metrics(
    addr: Option<std::net::SocketAddr>,
) -> Result<Option<tokio::net::TcpListener>, StartError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::MetricsListen { addr, source })?;
    tracing::info!(addr = %listener.local_addr()?, "metrics listening");
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "the metrics listener is not on a loopback address: anyone who reaches it reads the daemon's counters, without authentication"
        );
    }
    Ok(Some(listener))
}

async fn run(args: Args, log_file: Option<LogFile>) -> Result<(), StartError> {
    let mut signals = Signals::install()?;
    // Checked before anything is created: a bad --etcd setup fails at once.
    let fleet = crate::fleet::FleetConfig::new(crate::fleet::FleetArgs {
        endpoints: &args.etcd,
        prefix: &args.etcd_prefix,
        host_id: args.host_id.as_deref(),
        ttl: args.etcd_ttl,
        ended_retention: args.etcd_ended_retention,
        user: args.etcd_user.as_deref(),
        password_file: args.etcd_password_file.as_deref(),
        cacert: args.etcd_cacert.as_deref(),
        identity: args.etcd_cert.as_deref().zip(args.etcd_key.as_deref()),
    })?;
    let (state, lock) = prepare(&args)?;
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Tasks::start(&args, state, &lock, fleet, stopped).await?;
    let failure = tasks.until_failure(&mut signals, log_file.as_ref()).await;
    tracing::info!("stopping");
    let _ = stop.send(true);
    tasks.stop(failure.as_ref().map(|(task, _)| *task)).await;
    match failure.map(|(_, failure)| failure) {
        None => {
            tracing::info!("stopped");
            Ok(())
        }
        Some(failure) => Err(failure),
    }
}

/// What the daemon runs on, ready before any task starts.
struct State {
    socket: PathBuf,
    state_dir: PathBuf,
    database: PathBuf,
    store: Store,
    limits: Arc<Limits>,
}

/// Finds the daemon's places, locks its state directory (the lock is held until it is
/// dropped) and opens its database.
fn prepare(args: &Args) -> Result<(State, StateLock), StartError> {
    let env = Env::from_process();
    let (state_dir, socket) = places(args, &env)?;
    create_dir(&state_dir, DirUse::State)?;
    let lock = lock_state_dir(&state_dir)?;
    if let Some(root) = &args.ebpf_pin_dir {
        crate::source::lineage_pin::remove_stale(root);
    }
    match crate::source::pidfd::raise_nofile_limit() {
        Ok((soft, hard)) => tracing::debug!(soft, hard, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let database = state_dir.join("liveness.db");
    let store = open_store(&database, args.recover)?;
    let state = State {
        socket,
        state_dir,
        database,
        store,
        limits: Limits::new(args.limits()),
    };
    Ok((state, lock))
}

/// The daemon's running parts.
struct Tasks {
    engine_done: oneshot::Receiver<Result<(), crate::engine::EngineError>>,
    engine_thread: std::thread::JoinHandle<()>,
    server: JoinHandle<()>,
    metrics: Option<JoinHandle<()>>,
    fleet: Option<JoinHandle<()>>,
    socket: PathBuf,
}

impl Tasks {
    /// Starts the engine on its thread, then listens: for metrics if asked, and on the
    /// socket, after which systemd hears that the daemon is ready; then the fleet mirror,
    /// with `--etcd`.
    async fn start(
        args: &Args,
        state: State,
        lock: &StateLock,
        fleet: Option<crate::fleet::FleetConfig>,
        stopped: watch::Receiver<bool>,
    ) -> Result<Tasks, StartError> {
        let State {
            socket,
            state_dir,
            database,
            store,
            limits,
        } = state;
        let proc = ProcRoot::default();
        let about = DaemonInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: liveness_common::protocol::PROTOCOL_VERSION,
            pid: std::process::id(),
            socket: socket.display().to_string(),
            state_dir: state_dir.display().to_string(),
        };
        // Before the engine starts: whether systemd makes the session cgroups.
        let systemd = Systemd::probe(Path::new(SYSTEMD_BOOTED)).await;
        let start = engine_start(args, &state_dir, store, &proc, &limits, about, systemd);
        let EngineThread {
            engine,
            sources,
            members,
            end_metrics,
            moves,
            done: engine_done,
            thread: engine_thread,
        } = EngineThread::start(start, stopped.clone()).await?;
        let metrics = bind_metrics(args.metrics_listen).await?;
        let listener = bind_socket(&socket, lock)?;
        let sources: Vec<String> = sources.iter().map(ToString::to_string).collect();
        tracing::info!(socket = %socket.display(), state_dir = %state_dir.display(), sources = %sources.join(","), "livenessd listening");
        crate::systemd::notify_ready(&format!("listening; sources {}", sources.join(",")));

        if let Some(moves) = moves {
            let (engine, proc) = (engine.clone(), proc.clone());
            tokio::spawn(crate::cgroup::moves::run(
                moves,
                engine,
                proc,
                stopped.clone(),
            ));
        }
        let activities = crate::activity::Activities::default();
        let responder = crate::activity::Responder::new(
            crate::action::ActionRunner::new(crate::action::RunOptions {
                proc: proc.clone(),
                kill_grace: args.action_grace,
            }),
            crate::reap::Reaper::new(proc.clone()),
            args.action_slots,
        );
        tokio::spawn(crate::activity::run(
            args.activity(),
            responder,
            engine.clone(),
            proc.clone(),
            members.clone(),
            activities.clone(),
            stopped.clone(),
        ));
        let cluster = fleet.as_ref().map(crate::fleet::ClusterView::new);
        let fleet_locks = fleet.clone().map(|config| {
            let socket = socket.clone();
            crate::fleet::FleetLocks::start(config, engine.clone(), socket, stopped.clone())
        });
        let readers = crate::server::Readers {
            database,
            proc,
            members,
            activities,
            cluster: cluster.clone(),
            fleet_locks,
            fleet: fleet.clone().map(crate::fleet::FleetReader::new),
        };
        let metrics = metrics.map(|listener| {
            let scraped = crate::metrics::Scraped {
                engine: engine.clone(),
                ends: end_metrics,
                activities: readers.activities.clone(),
            };
            tokio::spawn(crate::metrics::serve(listener, scraped, stopped.clone()))
        });
        let fleet = fleet
            .zip(cluster)
            .map(|(config, view)| start_fleet(config, socket.clone(), view, stopped.clone()));
        let server = tokio::spawn(crate::server::serve(
            listener, engine, readers, limits, stopped,
        ));
        Ok(Tasks {
            engine_done,
            engine_thread,
            server,
            metrics,
            fleet,
            socket,
        })
    }

    /// Runs until a signal says stop (`None`), or a task ends: the engine and the server
    /// run until told to stop, so either ending first is a failure that stops the daemon
    /// (non-zero), never a daemon left up without them. SIGHUP reopens the log file.
    async fn until_failure(
        &mut self,
        signals: &mut Signals,
        log_file: Option<&LogFile>,
    ) -> Option<(Task, StartError)> {
        loop {
            tokio::select! {
                _ = signals.terminate.recv() => return None,
                _ = signals.interrupt.recv() => return None,
                _ = signals.hangup.recv() => match log_file {
                    Some(file) => match file.reopen() {
                        Ok(()) => tracing::info!("SIGHUP: reopened the log file"),
                        Err(e) => tracing::error!(error = %e, "SIGHUP: cannot reopen the log file"),
                    },
                    None => tracing::info!("SIGHUP: logging to stderr, nothing to reopen"),
                },
                ended = &mut self.engine_done => return Some((Task::Engine, match ended {
                    Ok(Ok(())) | Err(_) => StartError::TaskEnded(Task::Engine),
                    Ok(Err(e)) => StartError::Engine(e),
                })),
                ended = &mut self.server => return Some((Task::Server, task_ended(Task::Server, ended))),
                Some(ended) = async {
                    match &mut self.metrics {
                        Some(task) => Some(task.await),
                        None => std::future::pending().await,
                    }
                } => return Some((Task::Metrics, task_ended(Task::Metrics, ended))),
                Some(ended) = async {
                    match &mut self.fleet {
                        Some(task) => Some(task.await),
                        None => std::future::pending().await,
                    }
                } => return Some((Task::Fleet, task_ended(Task::Fleet, ended))),
            }
        }
    }

    /// Waits for every task but the one that `failed` (it has ended, and its handle is
    /// spent) to stop cleanly, and removes the socket.
    async fn stop(self, failed: Option<Task>) {
        if failed != Some(Task::Server)
            && let Err(e) = self.server.await
        {
            tracing::error!(error = %e, "server task failed");
        }
        if failed != Some(Task::Metrics)
            && let Some(task) = self.metrics
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "metrics task failed");
        }
        if failed != Some(Task::Fleet)
            && let Some(task) = self.fleet
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "fleet mirror task failed");
        }
        if failed != Some(Task::Engine) {
            match self.engine_done.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "engine failed while stopping"),
                Err(_) => tracing::error!("the engine ended without a word"),
            }
        }
        if self.engine_thread.join().is_err() {
            tracing::error!("the engine thread panicked");
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Starts the fleet mirror, which follows the daemon's own socket (`--etcd`), below the
/// connections' priority (see [`crate::fleet::spawn_below`]).
#[cfg(feature = "fleet")]
fn start_fleet(
    config: crate::fleet::FleetConfig,
    socket: PathBuf,
    view: crate::fleet::ClusterView,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    crate::fleet::spawn_below(
        "the fleet mirror",
        crate::fair::offload::CLIENT_WORK_NICE,
        crate::fleet::run(config, socket, view, stopped),
    )
}

/// Never called: without the feature, `--etcd` is refused before anything starts.
#[cfg(not(feature = "fleet"))]
fn start_fleet(
    _: crate::fleet::FleetConfig,
    _: PathBuf,
    _: crate::fleet::ClusterView,
    _: watch::Receiver<bool>,
) -> JoinHandle<()> {
    unreachable!("FleetConfig::new refuses --etcd in a build without the fleet feature")
}

/// The error of a task that ended while it should have run on.
fn task_ended(task: Task, ended: Result<(), tokio::task::JoinError>) -> StartError {
    match ended {
        Ok(()) => StartError::TaskEnded(task),
        Err(error) => StartError::TaskFailed { task, error },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::mpsc;

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
}
