//! Session cgroups taken back once empty: a thread of its own waits for each one's
//! `cgroup.events` to say `populated 0` (so that no death ever waits for a cgroup), then
//! reads its counters and hands them to the engine, which stores them with the session
//! before it removes the cgroup. A session terminated by its policy or on request has
//! what its cgroup still holds at the end of its grace killed there at once
//! (`cgroup.kill`, or freeze, kill each, thaw, or systemd's `KillUnit`), fork loops
//! included. The thread starts with the first cgroup to reclaim or follow: a daemon whose
//! sessions have none runs none.
//!
//! systemd removes a scope's cgroup as soon as it is empty, before the session's end may
//! have reached the engine: the thread follows each scope from its start, reads its
//! counters whenever its `memory.events` or `cgroup.events` changes (an OOM kill, the
//! last member's exit), and hands over the last read when the cgroup is gone.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use liveness_common::identity::ProcessKey;
use liveness_common::session::{CgroupEscape, CgroupUsage};
use liveness_common::status::CgroupTermination;
use liveness_proc::identity::ProcRoot;
use rustix::event::{PollFd, PollFlags, Timespec};
use tokio::sync::mpsc as tokio_mpsc;

use super::systemd::{Systemd, unit_of};
use super::{escapes, kill_all, populated, usage};

/// How long a followed scope may take to appear (its start job) before it is given up,
/// and how often it is looked for meanwhile.
const APPEAR: Duration = Duration::from_secs(10);
const APPEAR_CHECK: Duration = Duration::from_millis(5);

/// How long the thread sleeps in `poll` before it looks at every cgroup again, should a
/// change not wake it (and to take in new cgroups).
const RECHECK: Duration = Duration::from_millis(200);

/// A cgroup to reclaim, and the session whose counters it keeps (`None`: a cgroup the
/// store does not know, or whose counters are already stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub session: Option<(u32, String)>,
    pub path: PathBuf,
    /// The survivors its session's end listed: those found outside the cgroup when the
    /// thread takes the job are its escapes.
    pub survivors: Vec<ProcessKey>,
}

/// A cgroup found empty, with what it counted (read before its removal) and the escapes
/// of its session's survivors.
#[derive(Debug)]
pub struct Emptied {
    pub job: Job,
    pub usage: CgroupUsage,
    pub escaped: Vec<CgroupEscape>,
}

/// What the engine sends the thread.
#[derive(Debug)]
enum Message {
    Reclaim(Job),
    /// Kill what a cgroup handed over already still holds.
    Kill(Kill),
    /// Read a scope's counters on every change, from its start.
    Follow(PathBuf),
}

/// A cgroup's kill at a terminated session's grace's end.
#[derive(Debug)]
struct Kill {
    path: PathBuf,
    at: Instant,
    method: CgroupTermination,
    systemd: Option<Systemd>,
}

/// A scope followed from its start, and its counters as last read.
#[derive(Debug)]
struct Followed {
    /// `cgroup.events` and `memory.events`, open once the scope exists.
    files: Option<[File; 2]>,
    last: Option<CgroupUsage>,
    /// Given up if it does not appear by then.
    until: Instant,
    /// Removed (by systemd, once empty): its files are closed, since a removed kernfs
    /// file polls as changed for ever, and `last` waits for the session's end.
    gone: bool,
}

impl Followed {
    fn new() -> Followed {
        Followed {
            files: None,
            last: None,
            until: Instant::now() + APPEAR,
            gone: false,
        }
    }

    /// Opens the scope's files if it exists now, and reads its counters.
    fn open(&mut self, path: &Path) {
        if self.files.is_some() || self.gone {
            return;
        }
        let open = |name: &str| File::open(path.join(name)).ok();
        if let (Some(events), Some(memory)) = (open("cgroup.events"), open("memory.events")) {
            self.files = Some([events, memory]);
            self.read(path);
        }
    }

    /// Reads the counters, and re-arms the files (a kernfs file signals a change once,
    /// until it is read again).
    fn read(&mut self, path: &Path) {
        for file in self.files.iter().flatten() {
            let mut buf = [0u8; 256];
            let _ = rustix::io::pread(file, &mut buf, 0);
        }
        let read = usage(path);
        if !path.is_dir() {
            self.files = None;
            self.gone = true;
        }
        // A read that raced the cgroup's removal keeps the previous one.
        if read.memory_events.is_some() || self.last.is_none() {
            self.last = Some(read);
        }
    }
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
        // A thread that could not start leaves the cgroup to the next start's reconcile.
        let _ = self.jobs().send(Message::Reclaim(job));
    }

    /// Has the scope at `path` followed from now on (see the module's doc).
    pub fn follow(&mut self, path: PathBuf) {
        let _ = self.jobs().send(Message::Follow(path));
    }

    /// The thread's side of the channel, the thread started if it is not yet.
    fn jobs(&mut self) -> &mpsc::Sender<Message> {
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
        jobs
    }

    /// Kills what the queued cgroup at `path` still holds after `grace`, by `method`
    /// (`systemd`'s for a scope).
    pub fn kill_after(
        &mut self,
        path: PathBuf,
        grace: Duration,
        method: CgroupTermination,
        systemd: Option<Systemd>,
    ) {
        if let Some((jobs, _)) = &self.worker
            && self.queued.contains(&path)
        {
            let at = Instant::now() + grace;
            let kill = Kill {
                path,
                at,
                method,
                systemd,
            };
            let _ = jobs.send(Message::Kill(kill));
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
    let proc = ProcRoot::default();
    let mut waiting: Vec<(Job, Vec<CgroupEscape>)> = Vec::new();
    let mut kills: Vec<Kill> = Vec::new();
    let mut followed: HashMap<PathBuf, Followed> = HashMap::new();
    loop {
        let mut messages: Vec<Message> = Vec::new();
        if waiting.is_empty() && followed.is_empty() {
            match incoming.recv() {
                Ok(message) => messages.push(message),
                Err(mpsc::RecvError) => return,
            }
        }
        messages.extend(incoming.try_iter());
        for message in messages {
            match message {
                Message::Reclaim(job) => {
                    // A scope's counters are read before anything may kill it.
                    if unit_of(&job.path).is_some() {
                        let follow = followed
                            .entry(job.path.clone())
                            .or_insert_with(Followed::new);
                        follow.open(&job.path);
                    }
                    // Read at once: before the reaper's signals, or the survivors' exits.
                    let escaped = escapes(&job.path, &job.survivors, &proc);
                    waiting.push((job, escaped));
                }
                Message::Kill(kill) => kills.push(kill),
                Message::Follow(path) => {
                    followed.entry(path).or_insert_with(Followed::new);
                }
            }
        }
        let now = Instant::now();
        followed.retain(|path, follow| {
            follow.open(path);
            follow.files.is_some()
                || follow.gone
                || follow.until > now
                || waiting.iter().any(|(j, _)| &j.path == path)
        });
        kills.retain(|kill| {
            if kill.at > now {
                return true;
            }
            if populated(&kill.path).unwrap_or(true)
                && let Err(e) = kill_all(&kill.path, kill.method, kill.systemd.as_ref())
            {
                // The reaper's signals alone (docs/cgroups.md).
                tracing::warn!(error = %e, "cannot kill what a session's cgroup holds");
            }
            false
        });
        let mut still = Vec::new();
        for (job, escaped) in waiting.drain(..) {
            match populated(&job.path) {
                Ok(true) => still.push((job, escaped)),
                Ok(false) => {
                    kills.retain(|kill| kill.path != job.path);
                    crate::source::cgroups::forget_session_cgroup(&job.path);
                    let mut usage = usage(&job.path);
                    if let Some(follow) = followed.remove(&job.path)
                        && usage.memory_events.is_none()
                        && let Some(last) = follow.last
                    {
                        // systemd removed the emptied scope first: its last read.
                        usage = last;
                    }
                    let done = Emptied {
                        job,
                        usage,
                        escaped,
                    };
                    if emptied.send(done).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    // Not readable now (a file system under pressure): looked at again.
                    tracing::warn!(error = %e, "cannot read a session cgroup's events");
                    still.push((job, escaped));
                }
            }
        }
        waiting = still;
        if !waiting.is_empty() || !followed.is_empty() {
            let next_kill = kills.iter().map(|kill| kill.at).min();
            let appearing = followed.values().any(|f| f.files.is_none() && !f.gone);
            let recheck = if appearing { APPEAR_CHECK } else { RECHECK };
            let sleep = next_kill.map_or(recheck, |at| {
                at.saturating_duration_since(Instant::now()).min(recheck)
            });
            wait_for_change(&waiting, &mut followed, sleep);
        }
    }
}

/// Sleeps until one of the cgroups' `cgroup.events`, or a followed scope's
/// `memory.events`, changes (the kernel signals it as `POLLPRI`), or for `sleep`; a
/// followed scope that changed has its counters read.
fn wait_for_change(
    waiting: &[(Job, Vec<CgroupEscape>)],
    followed: &mut HashMap<PathBuf, Followed>,
    sleep: Duration,
) {
    let files: Vec<File> = waiting
        .iter()
        .filter_map(|(job, _)| File::open(job.path.join("cgroup.events")).ok())
        .collect();
    // An open file is armed once read: only changes after this read wake the poll.
    for file in &files {
        let mut buf = [0u8; 128];
        let _ = rustix::io::read(file, &mut buf);
    }
    let watched: Vec<(&PathBuf, &[File; 2])> = followed
        .iter()
        .filter_map(|(path, follow)| Some((path, follow.files.as_ref()?)))
        .collect();
    let mut fds: Vec<PollFd<'_>> = files
        .iter()
        .chain(watched.iter().flat_map(|(_, files)| files.iter()))
        .map(|f| PollFd::new(f, PollFlags::PRI))
        .collect();
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: sleep.as_nanos() as i64,
    };
    let _ = rustix::event::poll(&mut fds, Some(&timeout));
    let changed: Vec<PathBuf> = fds[files.len()..]
        .chunks(2)
        .zip(&watched)
        .filter(|(fds, _)| fds.iter().any(|fd| !fd.revents().is_empty()))
        .map(|(_, (path, _))| (*path).clone())
        .collect();
    drop(fds);
    for path in changed {
        if let Some(follow) = followed.get_mut(&path) {
            follow.read(&path);
        }
    }
}
