//! Session cgroups taken back once empty: a thread of its own waits for each one's
//! `cgroup.events` to say `populated 0` (so that no death ever waits for a cgroup), then
//! reads its counters and hands them to the engine, which stores them with the session
//! before it removes the cgroup. A session terminated by its policy or on request has
//! what its cgroup still holds at the end of its grace killed there at once
//! (`cgroup.kill`, or freeze, kill each, thaw), fork loops included. The thread starts with the first cgroup to
//! reclaim: a daemon whose sessions have none runs none.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use liveness_common::session::CgroupUsage;
use liveness_common::status::CgroupTermination;
use rustix::event::{PollFd, PollFlags, Timespec};
use tokio::sync::mpsc as tokio_mpsc;

use super::{kill_all, populated, usage};

/// How long the thread sleeps in `poll` before it looks at every cgroup again, should a
/// change not wake it (and to take in new cgroups).
const RECHECK: Duration = Duration::from_millis(200);

/// A cgroup to reclaim, and the session whose counters it keeps (`None`: a cgroup the
/// store does not know, or whose counters are already stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub session: Option<(u32, String)>,
    pub path: PathBuf,
}

/// A cgroup found empty, with what it counted (read before its removal).
#[derive(Debug)]
pub struct Emptied {
    pub job: Job,
    pub usage: CgroupUsage,
}

/// What the engine sends the thread.
#[derive(Debug)]
enum Message {
    Reclaim(Job),
    /// Kill what a cgroup handed over already still holds.
    Kill(Kill),
}

/// A cgroup's kill at a terminated session's grace's end.
#[derive(Debug)]
struct Kill {
    path: PathBuf,
    at: Instant,
    method: CgroupTermination,
}

/// The engine's side: jobs sent to the thread, emptied cgroups received from it.
#[derive(Debug, Default)]
pub struct Reclaimer {
    worker: Option<(
        mpsc::Sender<Message>,
        tokio_mpsc::UnboundedReceiver<Emptied>,
    )>,
    /// The cgroups sent and not yet emptied: a cgroup is reclaimed once.
    queued: HashSet<PathBuf>,
}

impl Reclaimer {
    /// Hands a cgroup to the thread (started now if it is not yet); one already handed
    /// over is not sent twice.
    pub fn queue(&mut self, job: Job) {
        if !self.queued.insert(job.path.clone()) {
            return;
        }
        let (jobs, _) = self.worker.get_or_insert_with(|| {
            let (jobs, incoming) = mpsc::channel();
            let (emptied, received) = tokio_mpsc::unbounded_channel();
            let spawned = std::thread::Builder::new()
                .name("cgroup-reclaim".into())
                .spawn(move || run(incoming, emptied));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the cgroup reclaimer; session cgroups stay until the next start");
            }
            (jobs, received)
        });
        // A thread that could not start leaves the cgroup to the next start's reconcile.
        let _ = jobs.send(Message::Reclaim(job));
    }

    /// Kills what the queued cgroup at `path` still holds after `grace`, by `method`.
    pub fn kill_after(&mut self, path: PathBuf, grace: Duration, method: CgroupTermination) {
        if let Some((jobs, _)) = &self.worker
            && self.queued.contains(&path)
        {
            let at = Instant::now() + grace;
            let _ = jobs.send(Message::Kill(Kill { path, at, method }));
        }
    }

    /// Whether `path` waits to be emptied.
    pub fn is_queued(&self, path: &Path) -> bool {
        self.queued.contains(path)
    }

    /// The next cgroup found empty; pending forever while there is none to wait for.
    pub async fn next(&mut self) -> Emptied {
        match self.worker.as_mut() {
            Some((_, received)) => match received.recv().await {
                Some(emptied) => {
                    self.queued.remove(&emptied.job.path);
                    emptied
                }
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

/// The thread: waits for each cgroup to be empty, reads it, sends it back; kills what a
/// cgroup holds when its time comes. Ends when the engine drops its side.
fn run(incoming: mpsc::Receiver<Message>, emptied: tokio_mpsc::UnboundedSender<Emptied>) {
    let mut waiting: Vec<Job> = Vec::new();
    let mut kills: Vec<Kill> = Vec::new();
    loop {
        let mut messages: Vec<Message> = Vec::new();
        if waiting.is_empty() {
            match incoming.recv() {
                Ok(message) => messages.push(message),
                Err(mpsc::RecvError) => return,
            }
        }
        messages.extend(incoming.try_iter());
        for message in messages {
            match message {
                Message::Reclaim(job) => waiting.push(job),
                Message::Kill(kill) => kills.push(kill),
            }
        }
        let now = Instant::now();
        kills.retain(|kill| {
            if kill.at > now {
                return true;
            }
            if populated(&kill.path).unwrap_or(true)
                && let Err(e) = kill_all(&kill.path, kill.method)
            {
                // The reaper's signals alone (docs/cgroups.md).
                tracing::warn!(error = %e, "cannot kill what a session's cgroup holds");
            }
            false
        });
        let mut still = Vec::new();
        for job in waiting.drain(..) {
            match populated(&job.path) {
                Ok(true) => still.push(job),
                Ok(false) => {
                    kills.retain(|kill| kill.path != job.path);
                    let usage = usage(&job.path);
                    if emptied.send(Emptied { job, usage }).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    // Not readable now (a file system under pressure): looked at again.
                    tracing::warn!(error = %e, "cannot read a session cgroup's events");
                    still.push(job);
                }
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            let next_kill = kills.iter().map(|kill| kill.at).min();
            let sleep = next_kill.map_or(RECHECK, |at| {
                at.saturating_duration_since(Instant::now()).min(RECHECK)
            });
            wait_for_change(&waiting, sleep);
        }
    }
}

/// Sleeps until one of the cgroups' `cgroup.events` changes (the kernel signals it as
/// `POLLPRI`), or for `sleep`.
fn wait_for_change(waiting: &[Job], sleep: Duration) {
    let files: Vec<File> = waiting
        .iter()
        .filter_map(|job| File::open(job.path.join("cgroup.events")).ok())
        .collect();
    // An open file is armed once read: only changes after this read wake the poll.
    for file in &files {
        let mut buf = [0u8; 128];
        let _ = rustix::io::read(file, &mut buf);
    }
    let mut fds: Vec<PollFd<'_>> = files
        .iter()
        .map(|f| PollFd::new(f, PollFlags::PRI))
        .collect();
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: sleep.as_nanos() as i64,
    };
    let _ = rustix::event::poll(&mut fds, Some(&timeout));
}
