//! The engine on a thread of its own, with a runtime of its own: the exit sources it
//! waits on, its timers and its tasks (reaps, pidfd watches) are driven there, so a death
//! never waits for a runtime worker that connections keep busy (a big reply to serialize,
//! a slow client to write to).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::StartError;
use crate::engine::{EndMetrics, Engine, EngineConfig, EngineError, Handle};
use crate::source::ebpf::MoveRing;
use crate::source::monitor::{Monitor, MonitorConfig};
use crate::source::tree_map::TreeMap;
use crate::store::Store;
use liveness_common::exit::DetectedBy;
use liveness_common::status::DaemonInfo;

/// Commands queued from connections to the engine; connections wait when it is full.
const QUEUE: usize = 1024;
/// How long the engine's runtime waits at the end for its blocking work (a read of a big
/// tree for a reap) before it is left to the process's exit.
const BLOCKING_GRACE: Duration = Duration::from_secs(1);

/// What the engine needs to start.
#[derive(Debug)]
pub struct EngineStart {
    pub store: Store,
    pub monitor: MonitorConfig,
    pub engine: EngineConfig,
    pub about: DaemonInfo,
}

/// A started engine: where to send it commands, what the rest of the daemon reads beside
/// it, and its outcome once it stops.
#[derive(Debug)]
pub struct EngineThread {
    pub engine: Handle,
    pub sources: Vec<DetectedBy>,
    pub members: Option<Arc<TreeMap>>,
    pub end_metrics: EndMetrics,
    /// The kernel's cgroup moves of tracked processes and members, for their reader.
    pub moves: Option<MoveRing>,
    pub done: oneshot::Receiver<Result<(), EngineError>>,
    /// Ends after `done` resolved, or once the engine was told to stop.
    pub thread: JoinHandle<()>,
}

/// What the thread reports once the engine is built, or why it could not be.
type Ready = Result<
    (
        Vec<DetectedBy>,
        Option<Arc<TreeMap>>,
        EndMetrics,
        Option<MoveRing>,
    ),
    StartError,
>;

impl EngineThread {
    /// Starts the exit sources and the engine on a new thread, which runs the engine until
    /// `shutdown` turns true.
    pub async fn start(
        start: EngineStart,
        shutdown: watch::Receiver<bool>,
    ) -> Result<EngineThread, StartError> {
        let (commands, queue) = mpsc::channel(QUEUE);
        let (ready_tx, ready) = oneshot::channel::<Ready>();
        let (done_tx, done) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                crate::fair::offload::short_slices();
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let (engine, moves) = match build(start).await {
                        Ok(built) => built,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let sources = engine.active_sources();
                    let shared = (sources, engine.tree_reader(), engine.end_metrics(), moves);
                    if ready_tx.send(Ok(shared)).is_err() {
                        return;
                    }
                    let _ = done_tx.send(engine.run(queue, shutdown).await);
                });
                runtime.shutdown_timeout(BLOCKING_GRACE);
            })?;
        match ready.await {
            Ok(Ok((sources, members, end_metrics, moves))) => Ok(EngineThread {
                engine: Handle::new(commands),
                sources,
                members,
                end_metrics,
                moves,
                done,
                thread,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StartError::TaskEnded(super::Task::Engine)),
        }
    }
}

/// The engine, and the ring of cgroup moves its eBPF source read, which is not the
/// engine's to read (see [`crate::cgroup::moves`]).
async fn build(start: EngineStart) -> Result<(Engine, Option<MoveRing>), StartError> {
    let mut monitor = Monitor::start(start.monitor).await?;
    let moves = monitor.take_moves();
    let engine = Engine::new(start.store, monitor, start.engine, start.about)?;
    Ok((engine, moves))
}
