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
//! last member's exit) and every [`FOLLOW_READ`] besides, and hands over the last read
//! when the cgroup is gone.
//!
//! A session that lasts until its tree does waits, once its lineage is over, for its
//! cgroup to be empty too: the thread tells the engine when it is (`Drained`).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use liveness_common::identity::ProcessKey;
use liveness_common::session::{CgroupEscape, CgroupUsage, Unlisted};
use liveness_common::status::CgroupTermination;
use liveness_proc::identity::ProcRoot;
use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fd::OwnedFd;
use tokio::sync::mpsc as tokio_mpsc;

use super::systemd::{self, Systemd, unit_of};
use super::{escapes, kill_all, populated, unlisted, usage};

/// How long a followed scope may take to appear before it is given up: longer than its
/// start waits for systemd (a scope that appeared later would have no counters); and how
/// often it is looked for meanwhile.
const APPEAR: Duration = Duration::from_secs(systemd::TIMEOUT.as_secs() + 5);
const APPEAR_CHECK: Duration = Duration::from_millis(5);

/// How long the thread sleeps in `poll` before it looks at every cgroup again, should a
/// change not wake it (and to take in new cgroups).
const RECHECK: Duration = Duration::from_millis(200);

/// How often a followed scope's counters are read when nothing changed: systemd may
/// remove the emptied scope before the read its last member's exit wakes, and the
/// session then keeps a read at most this old (CPU time and I/O counted since are lost).
const FOLLOW_READ: Duration = Duration::from_secs(1);

/// How many survivors' `/proc/<pid>/cgroup` the thread reads before it looks at its
/// messages and kills again: an end lists up to a thousand survivors, and a kill due
/// meanwhile (another session's, or this one's, sent once SQLite has its end) waits for
/// one batch, not for them all.
const READ_BATCH: usize = 32;

/// A cgroup to reclaim, and the session whose counters it keeps (`None`: a cgroup the
/// store does not know, or whose counters are already stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub session: Option<(u32, String)>,
    pub path: PathBuf,
    /// The survivors its session's end listed, and its owner: those found outside the
    /// cgroup when the thread takes the job are its escapes, and what the cgroup holds
    /// besides them is unlisted.
    pub survivors: Vec<ProcessKey>,
}

/// A cgroup found empty, with what it counted (read before its removal), the escapes of
/// its session's survivors, and what it held besides them when the thread took it.
#[derive(Debug)]
pub struct Emptied {
    pub job: Job,
    pub usage: CgroupUsage,
    pub escaped: Vec<CgroupEscape>,
    pub unlisted: Option<Unlisted>,
}

/// What the thread tells the engine.
#[derive(Debug)]
pub enum Report {
    Emptied(Box<Emptied>),
    /// A cgroup asked for by [`Reclaimer::drain`] holds no process (or is gone).
    Drained(PathBuf),
}

/// What the engine sends the thread.
#[derive(Debug)]
enum Message {
    Reclaim(Job),
    /// Kill what a cgroup handed over already still holds.
    Kill(Kill),
    /// Read a scope's counters on every change, from its start.
    Follow(PathBuf),
    /// Say when a cgroup holds no process any more.
    Drain(PathBuf),
}

/// A cgroup's kill at a terminated session's grace's end.
#[derive(Debug)]
struct Kill {
    path: PathBuf,
    at: Instant,
    method: CgroupTermination,
    systemd: Option<Systemd>,
}

/// A job whose survivors' cgroups are being read, [`READ_BATCH`] at a time.
#[derive(Debug)]
struct Reading {
    job: Job,
    unlisted: Option<Unlisted>,
    escaped: Vec<CgroupEscape>,
    /// How many of `job.survivors` are read.
    read: usize,
}

impl Reading {
    /// Reads the next batch; whether all are read.
    fn step(&mut self, proc: &ProcRoot) -> bool {
        let batch = &self.job.survivors[self.read..];
        let batch = &batch[..batch.len().min(READ_BATCH)];
        self.escaped.extend(escapes(&self.job.path, batch, proc));
        self.read += batch.len();
        self.read == self.job.survivors.len()
    }
}

/// A scope followed from its start, and its counters as last read.
#[derive(Debug)]
struct Followed {
    /// `cgroup.events` and `memory.events`, open once the scope exists.
    files: Option<[File; 2]>,
    last: Option<CgroupUsage>,
    /// When `last` was read.
    read_at: Instant,
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
            read_at: Instant::now(),
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
        self.read_at = Instant::now();
        if !path.is_dir() {
            self.files = None;
            self.gone = true;
        }
        self.last = Some(newest(read, self.last.take()));
    }
}

/// Each counter of `read` that it has, and of `kept` those it lacks: a read that raced
/// the scope's removal has the files read before it and lost those after, and each lost
/// counter keeps its previous read.
fn newest(read: CgroupUsage, kept: Option<CgroupUsage>) -> CgroupUsage {
    let Some(kept) = kept else {
        return read;
    };
    CgroupUsage {
        memory_peak: read.memory_peak.or(kept.memory_peak),
        memory_events: read.memory_events.or(kept.memory_events),
        cpu_usec: read.cpu_usec.or(kept.cpu_usec),
        pids_peak: read.pids_peak.or(kept.pids_peak),
        io: read.io.or(kept.io),
    }
}

/// The engine's side of the thread: how it sends and what it receives.
#[derive(Debug)]
struct Worker {
    jobs: mpsc::Sender<Message>,
    /// Written after each job: the thread's `poll` wakes at once, not at its next check
    /// (a drain is on the way of a session's end).
    wake: OwnedFd,
    reports: tokio_mpsc::UnboundedReceiver<Report>,
}

/// The engine's side: jobs sent to the thread, emptied cgroups received from it.
#[derive(Debug, Default)]
pub struct Reclaimer {
    worker: Option<Worker>,
    /// Where the thread reads the survivors' cgroups.
    proc: ProcRoot,
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
        self.send(Message::Reclaim(job));
    }

    /// Has the scope at `path` followed from now on (see the module's doc).
    pub fn follow(&mut self, path: PathBuf) {
        self.send(Message::Follow(path));
    }

    /// Has the thread report [`Report::Drained`] once the cgroup at `path` holds no
    /// process. Returns false if there is no thread to ask.
    pub fn drain(&mut self, path: PathBuf) -> bool {
        self.send(Message::Drain(path))
    }

    /// A reclaimer whose thread reads processes under `proc`.
    #[cfg(test)]
    fn reading(proc: ProcRoot) -> Reclaimer {
        Reclaimer {
            proc,
            ..Reclaimer::default()
        }
    }

    /// Sends `message` to the thread, started if it is not yet, and wakes it.
    fn send(&mut self, message: Message) -> bool {
        if self.worker.is_none() {
            self.worker = start(self.proc.clone());
        }
        let Some(worker) = &self.worker else {
            return false;
        };
        let sent = worker.jobs.send(message).is_ok();
        let _ = rustix::io::write(&worker.wake, &1u64.to_ne_bytes());
        sent
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
        if self.worker.is_some() && self.queued.contains(&path) {
            let at = Instant::now() + grace;
            let kill = Kill {
                path,
                at,
                method,
                systemd,
            };
            self.send(Message::Kill(kill));
        }
    }

    /// Whether `path` waits to be emptied.
    pub fn is_queued(&self, path: &Path) -> bool {
        self.queued.contains(path)
    }

    /// The thread's next report; pending forever while there is none to wait for.
    pub async fn next(&mut self) -> Report {
        match self.worker.as_mut() {
            Some(worker) => match worker.reports.recv().await {
                Some(report) => {
                    if let Report::Emptied(emptied) = &report {
                        self.queued.remove(&emptied.job.path);
                    }
                    report
                }
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

/// Starts the thread; `None` (said in the log) if it cannot be.
fn start(proc: ProcRoot) -> Option<Worker> {
    let started = (|| {
        let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let woken = wake.try_clone()?;
        let (jobs, incoming) = mpsc::channel();
        let (reports, received) = tokio_mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("cgroup-reclaim".into())
            .spawn(move || run(incoming, woken, reports, proc))?;
        Ok::<_, std::io::Error>(Worker {
            jobs,
            wake,
            reports: received,
        })
    })();
    started
        .inspect_err(|e| tracing::error!(error = %e, "cannot start the cgroup reclaimer; session cgroups stay until the next start"))
        .ok()
}

/// The thread: waits for each cgroup to be empty, reads it, sends it back; kills what a
/// cgroup holds when its time comes; says when a drained cgroup is empty. Ends when the
/// engine drops its side.
fn run(
    incoming: mpsc::Receiver<Message>,
    wake: OwnedFd,
    reports: tokio_mpsc::UnboundedSender<Report>,
    proc: ProcRoot,
) {
    let mut reading: Vec<Reading> = Vec::new();
    let mut waiting: Vec<Reading> = Vec::new();
    let mut kills: Vec<Kill> = Vec::new();
    let mut followed: HashMap<PathBuf, Followed> = HashMap::new();
    let mut draining: Vec<PathBuf> = Vec::new();
    loop {
        let mut messages: Vec<Message> = Vec::new();
        if reading.is_empty() && waiting.is_empty() && followed.is_empty() && draining.is_empty() {
            match incoming.recv() {
                Ok(message) => messages.push(message),
                Err(mpsc::RecvError) => return,
            }
        }
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&wake, &mut count);
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
                    // What the cgroup holds besides the survivors, at once: before any kill.
                    let unlisted = unlisted(&job.path, &job.survivors, &proc);
                    // The escapes from now on: before the reaper's signals, or the
                    // survivors' exits.
                    reading.push(Reading {
                        job,
                        unlisted,
                        escaped: Vec::new(),
                        read: 0,
                    });
                }
                Message::Kill(kill) => kills.push(kill),
                Message::Follow(path) => {
                    followed.entry(path).or_insert_with(Followed::new);
                }
                Message::Drain(path) => draining.push(path),
            }
        }
        let mut drained = Vec::new();
        draining.retain(|path| match populated(path) {
            Ok(true) => true,
            Ok(false) => {
                drained.push(path.clone());
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a session cgroup's events");
                true
            }
        });
        for path in drained {
            if reports.send(Report::Drained(path)).is_err() {
                return;
            }
        }
        let now = Instant::now();
        followed.retain(|path, follow| {
            follow.open(path);
            if follow.files.is_some() && now.duration_since(follow.read_at) >= FOLLOW_READ {
                follow.read(path);
            }
            follow.files.is_some()
                || follow.gone
                || follow.until > now
                || waiting.iter().any(|w| &w.job.path == path)
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
        // After the kills: a cgroup's kill reaches only the processes inside it, never an
        // escape, so it need not wait for the reads.
        let mut unread = Vec::new();
        for mut r in reading.drain(..) {
            if r.step(&proc) {
                waiting.push(r);
            } else {
                unread.push(r);
            }
        }
        reading = unread;
        let mut still = Vec::new();
        for read in waiting.drain(..) {
            let job = &read.job;
            match populated(&job.path) {
                Ok(true) => still.push(read),
                Ok(false) => {
                    kills.retain(|kill| kill.path != job.path);
                    let mut usage = usage(&job.path);
                    if let Some(follow) = followed.remove(&job.path) {
                        // systemd removed the emptied scope first, or while it was
                        // read: what this read lacks, from its last.
                        usage = newest(usage, follow.last);
                    }
                    let done = Emptied {
                        job: read.job,
                        usage,
                        escaped: read.escaped,
                        unlisted: read.unlisted,
                    };
                    if reports.send(Report::Emptied(Box::new(done))).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    // Not readable now (a file system under pressure): looked at again.
                    tracing::warn!(error = %e, "cannot read a session cgroup's events");
                    still.push(read);
                }
            }
        }
        waiting = still;
        if !reading.is_empty() {
            // More to read: the messages and kills first, without sleeping.
            continue;
        }
        if !waiting.is_empty() || !followed.is_empty() || !draining.is_empty() {
            let next_kill = kills.iter().map(|kill| kill.at).min();
            let appearing = followed.values().any(|f| f.files.is_none() && !f.gone);
            let recheck = if appearing { APPEAR_CHECK } else { RECHECK };
            let sleep = next_kill.map_or(recheck, |at| {
                at.saturating_duration_since(Instant::now()).min(recheck)
            });
            let watched = waiting.iter().map(|w| &w.job.path).chain(&draining);
            wait_for_change(watched, &wake, &mut followed, sleep);
        }
    }
}

/// Sleeps until one of the `watched` cgroups' `cgroup.events`, or a followed scope's
/// `memory.events`, changes (the kernel signals it as `POLLPRI`), the engine sends a job
/// (`wake`), or for `sleep`; a followed scope that changed has its counters read.
fn wait_for_change<'a>(
    watched: impl Iterator<Item = &'a PathBuf>,
    wake: &OwnedFd,
    followed: &mut HashMap<PathBuf, Followed>,
    sleep: Duration,
) {
    let files: Vec<File> = watched
        .filter_map(|path| File::open(path.join("cgroup.events")).ok())
        .collect();
    // An open file is armed once read: only changes after this read wake the poll. One
    // that emptied since it was last looked at is looked at again at once.
    for file in &files {
        let mut buf = [0u8; 128];
        let read = rustix::io::read(file, &mut buf).unwrap_or(0);
        if buf[..read]
            .split(|&b| b == b'\n')
            .any(|l| l == b"populated 0")
        {
            return;
        }
    }
    let scopes: Vec<(&PathBuf, &[File; 2])> = followed
        .iter()
        .filter_map(|(path, follow)| Some((path, follow.files.as_ref()?)))
        .collect();
    let mut fds: Vec<PollFd<'_>> = files
        .iter()
        .chain(scopes.iter().flat_map(|(_, files)| files.iter()))
        .map(|f| PollFd::new(f, PollFlags::PRI))
        .collect();
    fds.push(PollFd::new(wake, PollFlags::IN));
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: sleep.as_nanos() as i64,
    };
    let _ = rustix::event::poll(&mut fds, Some(&timeout));
    let changed: Vec<PathBuf> = fds[files.len()..fds.len() - 1]
        .chunks(2)
        .zip(&scopes)
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

#[cfg(test)]
mod tests {
    use std::fs;

    use rustix::fs::inotify;

    use super::*;

    /// A kill due while an end's survivors are read happens between two batches. Two
    /// survivors' `cgroup` files here are FIFOs, each holding the thread's read until the
    /// test writes to it: the kill is sent while the first holds it, and must be written
    /// before the thread reaches the second, 20,000 survivors later.
    #[tokio::test]
    async fn a_kill_due_never_waits_for_the_survivors_cgroups_to_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let cgroup = dir.path().join("cg").join(super::super::SUBTREE).join("s1");
        fs::create_dir_all(&cgroup).unwrap();
        fs::write(cgroup.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        fs::write(cgroup.join("cgroup.kill"), "").unwrap();
        let proc = dir.path().join("proc");
        let held = |pid: u32| {
            let fifo = proc.join(pid.to_string()).join("cgroup");
            fs::create_dir_all(fifo.parent().unwrap()).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &fifo,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap();
            (
                ProcessKey {
                    pid,
                    start_ticks: 1,
                },
                fifo,
            )
        };
        let (first, first_fifo) = held(4_000_000);
        let (last, last_fifo) = held(4_000_001);
        // Between them, processes that are gone: each read fails at once.
        let gone = (1_000_000..1_020_000).map(|pid| ProcessKey {
            pid,
            start_ticks: 1,
        });
        let survivors: Vec<ProcessKey> = std::iter::once(first).chain(gone).chain([last]).collect();
        let mut reclaimer = Reclaimer::reading(ProcRoot::new(&proc));
        reclaimer.queue(Job {
            session: None,
            path: cgroup.clone(),
            survivors,
        });
        // Opened once the thread opens it to read: the reads have begun.
        let mut first_writer = fs::OpenOptions::new()
            .write(true)
            .open(&first_fifo)
            .unwrap();
        reclaimer.kill_after(
            cgroup.clone(),
            Duration::ZERO,
            CgroupTermination::Kill,
            None,
        );
        std::io::Write::write_all(&mut first_writer, b"0::/elsewhere\n").unwrap();
        drop(first_writer);
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::read_to_string(cgroup.join("cgroup.kill")).unwrap() != "1" {
            assert!(
                Instant::now() < deadline,
                "the kill waited for the survivors' reads"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The thread is let go, and the job ends as any other once the cgroup is empty.
        fs::write(&last_fifo, "0::/elsewhere\n").unwrap();
        fs::write(cgroup.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        let report = tokio::time::timeout(Duration::from_secs(10), reclaimer.next())
            .await
            .expect("the emptied cgroup reported");
        let Report::Emptied(emptied) = report else {
            panic!("{report:?}");
        };
        assert_eq!(emptied.job.path, cgroup);
        assert_eq!(emptied.job.survivors.len(), 20_002);
        // The held processes' stat files do not exist: they are no processes, so no
        // escapes.
        assert!(emptied.escaped.is_empty(), "{:?}", emptied.escaped);
    }

    /// A scope the test removes as systemd would once it is empty: a directory whose
    /// files the test writes, followed by a reclaimer's thread. inotify tells when the
    /// thread has read it (`io.stat`, the last file a read opens, is closed), so that each
    /// change comes after the read before it, however slow the thread.
    struct Scope {
        _dir: tempfile::TempDir,
        path: PathBuf,
        read: OwnedFd,
        reclaimer: Reclaimer,
    }

    impl Scope {
        /// A scope followed from its start, once read.
        fn followed() -> Scope {
            let dir = tempfile::tempdir().unwrap();
            let path = dir
                .path()
                .join(super::super::SUBTREE)
                .join("liveness-s0-1-1.scope");
            fs::create_dir_all(&path).unwrap();
            fs::write(path.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
            fs::write(path.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
            fs::write(path.join("cpu.stat"), "usage_usec 0\n").unwrap();
            fs::write(path.join("io.stat"), "").unwrap();
            let flags = inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK;
            let read = inotify::init(flags).unwrap();
            // A close, not an access: `read_to_string` reads again after the content it got.
            inotify::add_watch(
                &read,
                path.join("io.stat"),
                inotify::WatchFlags::CLOSE_NOWRITE,
            )
            .unwrap();
            let mut reclaimer = Reclaimer::default();
            reclaimer.follow(path.clone());
            let scope = Scope {
                _dir: dir,
                path,
                read,
                reclaimer,
            };
            scope.next_read("when it appeared");
            scope
        }

        /// Waits for the thread's next read to be over, forgetting those before.
        fn next_read(&self, what: &str) {
            let mut buf = [0u8; 4096];
            while rustix::io::read(&self.read, &mut buf).is_ok() {}
            let mut fds = [PollFd::new(&self.read, PollFlags::IN)];
            let ten_s = Timespec {
                tv_sec: 10,
                tv_nsec: 0,
            };
            let ready = rustix::event::poll(&mut fds, Some(&ten_s)).unwrap();
            assert_eq!(ready, 1, "the scope was not read {what}");
        }

        /// Its owner runs: its CPU time, which nothing the thread polls signals.
        fn runs(&self, usec: u64) {
            fs::write(self.path.join("cpu.stat"), format!("usage_usec {usec}\n")).unwrap();
            self.next_read("while it ran");
        }

        /// Removes it, ends its session, and returns what the session keeps.
        async fn removed(mut self) -> CgroupUsage {
            fs::remove_dir_all(&self.path).unwrap();
            self.reclaimer.queue(Job {
                session: None,
                path: self.path.clone(),
                survivors: Vec::new(),
            });
            let report = tokio::time::timeout(Duration::from_secs(10), self.reclaimer.next())
                .await
                .expect("the removed scope reported");
            let Report::Emptied(emptied) = report else {
                panic!("{report:?}");
            };
            emptied.usage
        }
    }

    /// A scope systemd removes before the thread reads its last member's exit keeps a
    /// read made while it ran, not the one made when it appeared: the CPU time its owner
    /// spent after its start is there.
    #[tokio::test]
    async fn a_scope_removed_before_its_last_read_keeps_a_read_made_while_it_ran() {
        let scope = Scope::followed();
        scope.runs(38000);
        let usage = scope.removed().await;
        assert_eq!(usage.cpu_usec, Some(38000), "{usage:?}");
    }

    /// A read that systemd's removal of the scope cuts short, after `memory.events` and
    /// before `cpu.stat`, keeps the CPU time of the read before it.
    #[tokio::test]
    async fn a_read_cut_short_by_the_scopes_removal_keeps_what_it_lost() {
        let scope = Scope::followed();
        scope.runs(38000);
        fs::remove_file(scope.path.join("cpu.stat")).unwrap();
        scope.next_read("as it was removed");
        let usage = scope.removed().await;
        assert_eq!(usage.cpu_usec, Some(38000), "{usage:?}");
        assert!(usage.memory_events.is_some(), "{usage:?}");
    }
}
