//! One deduplicated stream of exits from every active source, with automatic fallback.
//!
//! The monitor arms each event-driven source (eBPF, pidfd) for a process, then re-checks
//! `/proc` once: a death before arming is caught by that check, a death after it by the
//! sources. A process no event source could take (no fds left, map full) is covered by the
//! `/proc` poller, started on demand, so no process is ever tracked by nothing.
//!
//! Each death is reported once, with the most complete facts any source has: the eBPF ring
//! buffer is read here, in the consumer's task, and a report without an exit status (from a
//! pidfd) first drains that ring, which already holds the kernel's record of the death
//! because `sched_process_exit` runs before the pidfd is woken. So the first report still
//! ends the session at once, and a status the kernel recorded is never thrown away.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use liveness_common::status::{
    MonitorStatus, SelfTest, SourceName, SourceReport, SourceState, SourceStats, StatusFacts,
};

use super::ebpf::{EbpfConfig, EbpfSource};
use super::pidfd::{PidfdConfig, PidfdSource};
use super::procpoll::{DEFAULT_INTERVAL, ProcpollSource};
use super::{ExitObservation, ExitSource, SourceEvent, TrackError};
use crate::deadline::sleep_until;
use liveness_common::exit::DetectedBy;
use liveness_common::identity::ProcessKey;
use liveness_proc::identity::{Liveness, ProcRoot};

/// Events buffered between the sources and the monitor by default. When full, sources
/// wait (see the module docs of [`super`]).
pub const DEFAULT_QUEUE: usize = 4096;

/// Processes re-checked in `/proc` per turn after the kernel lost exit reports: each turn
/// yields first, so a reconcile of 100k processes never holds the engine for long.
const RECONCILE_CHUNK: usize = 1024;
/// How often a process that a re-check found exiting is checked again: its record may be
/// among the lost, and it is not dead in `/proc` until it is a zombie. Most exits end
/// within milliseconds, so the first [`EXITING_RECHECKS`] come quickly; one that takes
/// longer (a close in uninterruptible sleep, the last thread of a process whose main
/// thread ended alone) is then checked every second until it is dead or untracked.
const EXITING_RECHECK: Duration = Duration::from_millis(10);
const EXITING_RECHECKS: u32 = 100;
const EXITING_SLOW_RECHECK: Duration = Duration::from_secs(1);

/// Which sources to run: `auto`, or a comma-separated list such as `ebpf` or `ebpf,pidfd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// eBPF and pidfd where they work; `/proc` polling only for what they cannot cover.
    Auto,
    /// Exactly these; failing to start any of them is an error.
    Only(Vec<SourceName>),
}

impl FromStr for Selection {
    type Err = String;

    fn from_str(text: &str) -> Result<Selection, String> {
        if text == "auto" {
            return Ok(Selection::Auto);
        }
        let mut names = Vec::new();
        for part in text.split(',') {
            let name = match part.trim() {
                "ebpf" => SourceName::Ebpf,
                "pidfd" => SourceName::Pidfd,
                "procpoll" => SourceName::Procpoll,
                other => {
                    return Err(format!(
                        "unknown exit source {other:?}: expected auto, or a list of ebpf, pidfd, procpoll"
                    ));
                }
            };
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(Selection::Only(names))
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selection::Auto => f.write_str("auto"),
            Selection::Only(names) => {
                let names: Vec<String> = names.iter().map(ToString::to_string).collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct MonitorConfig {
    pub selection: Selection,
    pub procpoll_interval: Duration,
    pub ebpf: EbpfConfig,
    pub pidfd: PidfdConfig,
    pub proc: ProcRoot,
    /// Events buffered between the sources and the monitor.
    pub queue: usize,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            selection: Selection::Auto,
            procpoll_interval: DEFAULT_INTERVAL,
            ebpf: EbpfConfig::default(),
            pidfd: PidfdConfig::default(),
            proc: ProcRoot::default(),
            queue: DEFAULT_QUEUE,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("exit source {name} was requested but cannot run: {why}")]
    Unavailable { name: SourceName, why: String },
    #[error("no exit source was selected")]
    NothingSelected,
}

/// The report of a source that does not run, and why.
fn off_report(name: SourceName, why: impl Into<String>) -> SourceReport {
    SourceReport {
        name,
        state: SourceState::Off,
        reason: Some(why.into()),
        exit_status: None,
        self_test: None,
        causes: None,
        stats: None,
    }
}

/// A source that started.
enum Started {
    Ebpf(Box<EbpfSource>),
    Pidfd(PidfdSource),
    Procpoll(ProcpollSource),
}

impl Started {
    async fn start(
        name: SourceName,
        config: &MonitorConfig,
        sink: &mpsc::Sender<SourceEvent>,
    ) -> Result<Started, String> {
        Ok(match name {
            SourceName::Ebpf => Started::Ebpf(Box::new(
                EbpfSource::start(config.ebpf.clone(), &config.proc)
                    .await
                    .map_err(|e| e.to_string())?,
            )),
            SourceName::Pidfd => Started::Pidfd(
                PidfdSource::start(sink.clone(), config.pidfd).map_err(|e| e.to_string())?,
            ),
            SourceName::Procpoll => Started::Procpoll(start_procpoll(config, sink)),
        })
    }
}

fn running(name: SourceName, exit_status: StatusFacts, stats: SourceStats) -> SourceReport {
    SourceReport {
        name,
        state: SourceState::Active,
        reason: None,
        exit_status: Some(exit_status),
        self_test: None,
        causes: None,
        stats: Some(stats),
    }
}

fn report_ebpf(source: &EbpfSource) -> SourceReport {
    SourceReport {
        self_test: Some(source.self_test().clone()),
        causes: Some(source.causes()),
        ..running(SourceName::Ebpf, StatusFacts::Always, source.stats())
    }
}

fn report_pidfd(source: &PidfdSource) -> SourceReport {
    let facts = if source.gives_exit_status() {
        StatusFacts::AfterReap
    } else {
        StatusFacts::Never
    };
    running(SourceName::Pidfd, facts, source.stats())
}

fn report_procpoll(source: &ProcpollSource) -> SourceReport {
    running(SourceName::Procpoll, StatusFacts::Never, source.stats())
}

fn start_procpoll(config: &MonitorConfig, sink: &mpsc::Sender<SourceEvent>) -> ProcpollSource {
    ProcpollSource::start(sink.clone(), config.procpoll_interval, config.proc.clone())
}

/// Which sources watch one tracked process.
#[derive(Debug, Clone, Copy, Default)]
struct Coverage {
    ebpf: bool,
    pidfd: bool,
    procpoll: bool,
    #[cfg(test)]
    fake: bool,
}

impl Coverage {
    /// Whether a source that reports deaths as they happen watches the process.
    fn event_driven(&self) -> bool {
        #[cfg(test)]
        if self.fake {
            return true;
        }
        self.ebpf || self.pidfd
    }
}

/// Watches tracked processes through every active source and yields each death once.
#[derive(Debug)]
pub struct Monitor {
    config: MonitorConfig,
    /// Read here, not through the channel (see the module docs).
    ebpf: Option<EbpfSource>,
    pidfd: Option<PidfdSource>,
    /// The `/proc` poller: selected, or started for what nothing else could take.
    procpoll: Option<ProcpollSource>,
    procpoll_selected: bool,
    /// Every tracked process and the sources watching it.
    tracked: HashMap<ProcessKey, Coverage>,
    /// Why each source that is not running is off.
    off: Vec<(SourceName, String)>,
    /// The eBPF self-test's verdict when it failed (a passing one is the source's own).
    ebpf_self_test: Option<SelfTest>,
    sink: mpsc::Sender<SourceEvent>,
    events: mpsc::Receiver<SourceEvent>,
    /// Deaths ready to be handed out.
    ready: VecDeque<ExitObservation>,
    /// Processes still to re-check after the kernel lost exit reports.
    to_reconcile: Vec<ProcessKey>,
    /// Processes a re-check found exiting, each once (a later loss finds them again), with
    /// how often they were checked again and when they are next; and the earliest of those.
    exiting: HashMap<ProcessKey, (u32, tokio::time::Instant)>,
    exiting_due: Option<tokio::time::Instant>,
    loss_reconciles: u64,
    /// Deaths decided by a test (see [`Monitor::with_fake`]).
    #[cfg(test)]
    fake: Option<super::fake::FakeSource>,
}

/// What woke [`Monitor::next`].
enum Wake {
    Ring(std::io::Result<()>),
    Channel(Option<SourceEvent>),
    Exiting,
}

/// Waits on the eBPF ring buffer, or forever without one.
async fn wait_ring(
    ebpf: &mut Option<EbpfSource>,
    out: &mut Vec<SourceEvent>,
) -> std::io::Result<()> {
    match ebpf {
        Some(source) => source.wait(out).await,
        None => std::future::pending().await,
    }
}

impl Monitor {
    /// A monitor with no source running yet.
    fn idle(config: MonitorConfig) -> Monitor {
        let (sink, events) = mpsc::channel(config.queue.max(1));
        Monitor {
            ebpf: None,
            pidfd: None,
            procpoll: None,
            procpoll_selected: false,
            tracked: HashMap::new(),
            off: Vec::new(),
            ebpf_self_test: None,
            sink,
            events,
            ready: VecDeque::new(),
            to_reconcile: Vec::new(),
            exiting: HashMap::new(),
            exiting_due: None,
            loss_reconciles: 0,
            config,
            #[cfg(test)]
            fake: None,
        }
    }

    /// A monitor whose only source is in memory: the handle decides every death, and
    /// `/proc` (the config's) is read only to check a process once it is tracked.
    #[cfg(test)]
    pub(crate) fn with_fake(config: MonitorConfig) -> (Monitor, super::fake::FakeExits) {
        let mut monitor = Monitor::idle(config);
        let (source, exits) = super::fake::FakeSource::new(monitor.sink.clone());
        monitor.fake = Some(source);
        (monitor, exits)
    }

    /// Starts the selected sources. Must run inside a tokio runtime.
    pub async fn start(config: MonitorConfig) -> Result<Monitor, MonitorError> {
        let mut monitor = Monitor::idle(config);
        let (wanted, required) = match &monitor.config.selection {
            Selection::Auto => (vec![SourceName::Ebpf, SourceName::Pidfd], false),
            Selection::Only(names) if names.is_empty() => {
                return Err(MonitorError::NothingSelected);
            }
            Selection::Only(names) => (names.clone(), true),
        };
        for name in SourceName::ALL {
            if !wanted.contains(&name) {
                // The poller stays on standby as the fallback even when not selected.
                if required && name != SourceName::Procpoll {
                    monitor.off.push((name, "not selected".into()));
                }
                continue;
            }
            match Started::start(name, &monitor.config, &monitor.sink).await {
                Ok(started) => {
                    tracing::info!(source = %name, "exit source active");
                    monitor.install(started);
                }
                Err(why) if required => return Err(MonitorError::Unavailable { name, why }),
                Err(why) => {
                    tracing::warn!(source = %name, why, "exit source off");
                    if name == SourceName::Ebpf && why.contains("self-test") {
                        monitor.ebpf_self_test = Some(SelfTest {
                            passed: false,
                            detail: why.clone(),
                        });
                    }
                    monitor.off.push((name, why));
                }
            }
        }
        if monitor.ebpf.is_none() && monitor.pidfd.is_none() && monitor.procpoll.is_none() {
            tracing::warn!("no event-driven exit source works here; polling /proc instead");
            let poller = start_procpoll(&monitor.config, &monitor.sink);
            monitor.procpoll = Some(poller);
        }
        Ok(monitor)
    }

    fn install(&mut self, started: Started) {
        match started {
            Started::Ebpf(source) => self.ebpf = Some(*source),
            Started::Pidfd(source) => self.pidfd = Some(source),
            Started::Procpoll(source) => {
                self.procpoll = Some(source);
                self.procpoll_selected = true;
            }
        }
    }

    /// The eBPF source's map of process-tree members, once, when that source runs.
    pub fn take_tree_map(&mut self) -> Option<super::tree_map::TreeMap> {
        self.ebpf.as_mut()?.take_members()
    }

    /// The eBPF source's ring of cgroup moves, once, when that source runs and its program
    /// attached.
    pub fn take_moves(&mut self) -> Option<super::ebpf::MoveRing> {
        self.ebpf.as_mut()?.take_moves()
    }

    /// Names of the sources that are running.
    pub fn active_sources(&self) -> Vec<DetectedBy> {
        let mut active = Vec::new();
        if self.ebpf.is_some() {
            active.push(DetectedBy::Ebpf);
        }
        if self.pidfd.is_some() {
            active.push(DetectedBy::Pidfd);
        }
        if self.procpoll.is_some() {
            active.push(DetectedBy::Procpoll);
        }
        active
    }

    /// Whether `key` is watched.
    pub fn is_tracked(&self, key: ProcessKey) -> bool {
        self.tracked.contains_key(&key)
    }

    /// Starts watching a process of this boot. Returns its death at once when it is
    /// already dead (or its PID was reused); it is then not tracked.
    pub fn track(&mut self, key: ProcessKey) -> Option<ExitObservation> {
        self.track_as(key, false)
    }

    /// [`Monitor::track`] for a member of a tracked process's tree (see
    /// [`ExitSource::track_member`]).
    pub fn track_member(&mut self, key: ProcessKey) -> Option<ExitObservation> {
        self.track_as(key, true)
    }

    fn track_as(&mut self, key: ProcessKey, member: bool) -> Option<ExitObservation> {
        if self.tracked.contains_key(&key) {
            return None;
        }
        let mut coverage = Coverage::default();
        let mut gone = false;
        if let Some(ebpf) = &mut self.ebpf {
            coverage.ebpf = arm(ebpf, key, member, &mut gone);
        }
        if let Some(pidfd) = &mut self.pidfd {
            coverage.pidfd = arm(pidfd, key, member, &mut gone);
        }
        #[cfg(test)]
        if let Some(fake) = &mut self.fake {
            coverage.fake = arm(fake, key, member, &mut gone);
        }
        if self.procpoll_selected || !(coverage.event_driven() || gone) {
            coverage.procpoll = self.cover_by_procpoll(key);
        }
        self.tracked.insert(key, coverage);
        // Sources armed: anything that dies from now on is reported by them, so this one
        // check closes the window between capture and arming.
        match self.config.proc.check_key(key) {
            Liveness::Dead(reason) => {
                self.untrack(key);
                Some(reconciled(key, reason))
            }
            Liveness::Alive | Liveness::Unknown(_) => None,
        }
    }

    /// Tracks `key` with the `/proc` poller, starting it if needed.
    fn cover_by_procpoll(&mut self, key: ProcessKey) -> bool {
        let (config, sink) = (&self.config, &self.sink);
        let poller = self.procpoll.get_or_insert_with(|| {
            tracing::warn!("starting the /proc poller for processes no other source can watch");
            start_procpoll(config, sink)
        });
        match poller.track(key) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(%key, error = %e, "the /proc poller cannot watch process");
                false
            }
        }
    }

    /// Stops watching a process in every source.
    pub fn untrack(&mut self, key: ProcessKey) {
        if let Some(coverage) = self.tracked.remove(&key) {
            if let (true, Some(source)) = (coverage.ebpf, &mut self.ebpf) {
                source.untrack(key);
            }
            if let (true, Some(source)) = (coverage.pidfd, &mut self.pidfd) {
                source.untrack(key);
            }
            if let (true, Some(source)) = (coverage.procpoll, &mut self.procpoll) {
                source.untrack(key);
            }
            #[cfg(test)]
            if let (true, Some(source)) = (coverage.fake, &mut self.fake) {
                source.untrack(key);
            }
        }
    }

    /// The next death of a tracked process. Cancel-safe: usable in `tokio::select!`.
    pub async fn next(&mut self) -> ExitObservation {
        loop {
            if let Some(observation) = self.ready.pop_front() {
                return observation;
            }
            if !self.to_reconcile.is_empty() {
                // Lets the caller serve others between two chunks; nothing is lost if this
                // future is dropped here.
                tokio::task::yield_now().await;
                self.reconcile_chunk();
                continue;
            }
            let mut records = Vec::new();
            let wake = tokio::select! {
                biased;
                read = wait_ring(&mut self.ebpf, &mut records) => Wake::Ring(read),
                event = self.events.recv() => Wake::Channel(event),
                () = sleep_until(self.exiting_due) => Wake::Exiting,
            };
            match wake {
                Wake::Ring(Ok(())) => records.into_iter().for_each(|r| self.accept(r)),
                Wake::Ring(Err(error)) => self.ebpf_failed(&error.to_string()),
                Wake::Channel(Some(event)) => self.accept(event),
                // The monitor holds a sender itself, so the channel never closes.
                Wake::Channel(None) => {}
                Wake::Exiting => self.recheck_exiting(),
            }
        }
    }

    /// A death that is ready now, without waiting.
    pub fn try_next(&mut self) -> Option<ExitObservation> {
        loop {
            if let Some(observation) = self.ready.pop_front() {
                return Some(observation);
            }
            if !self.to_reconcile.is_empty() {
                self.reconcile_chunk();
                continue;
            }
            let mut records = Vec::new();
            if let Some(ebpf) = &mut self.ebpf {
                ebpf.drain(&mut records);
            }
            if !records.is_empty() {
                records.into_iter().for_each(|r| self.accept(r));
                continue;
            }
            let event = self.events.try_recv().ok()?;
            self.accept(event);
        }
    }

    fn accept(&mut self, event: SourceEvent) {
        match event {
            SourceEvent::Exit(observation) => {
                // Only the first report of a death passes; the others find it untracked.
                let Some(coverage) = self.tracked.get(&observation.key).copied() else {
                    return;
                };
                if observation.facts.is_none()
                    && coverage.ebpf
                    && let Some(ebpf) = &mut self.ebpf
                {
                    // The kernel's record, with the status and the cause, is already in the
                    // ring: the death ends with the most complete facts.
                    let mut records = Vec::new();
                    ebpf.drain(&mut records);
                    records.into_iter().for_each(|r| self.accept(r));
                    if !self.tracked.contains_key(&observation.key) {
                        return;
                    }
                }
                self.untrack(observation.key);
                self.ready.push_back(observation);
            }
            SourceEvent::Lost { detected_by, total } => {
                tracing::warn!(source = %detected_by, total, "kernel lost exit reports; re-checking every tracked process");
                self.loss_reconciles += 1;
                // Any tracked death may be among the lost: re-check them all, in chunks.
                self.to_reconcile = self.tracked.keys().copied().collect();
            }
        }
    }

    /// Re-checks a chunk of the processes queued by a loss in `/proc`, queueing the dead.
    fn reconcile_chunk(&mut self) {
        let at = self.to_reconcile.len().saturating_sub(RECONCILE_CHUNK);
        for key in self.to_reconcile.split_off(at) {
            self.recheck(key, 0);
        }
    }

    /// Queues `key`'s death if it is dead in `/proc`. One that is exiting is checked again
    /// (see [`EXITING_RECHECK`]): the kernel drops a record as the process enters its
    /// exit, when it is not a zombie yet, and a loss is noticed during the very burst of
    /// deaths that caused it.
    fn recheck(&mut self, key: ProcessKey, rechecked: u32) {
        if !self.tracked.contains_key(&key) {
            return;
        }
        match self.config.proc.check_key_exiting(key) {
            (Liveness::Dead(reason), _) => {
                self.untrack(key);
                self.ready.push_back(reconciled(key, reason));
            }
            (_, true) => {
                let rechecked = rechecked.saturating_add(1);
                let after = if rechecked <= EXITING_RECHECKS {
                    EXITING_RECHECK
                } else {
                    EXITING_SLOW_RECHECK
                };
                let due = tokio::time::Instant::now() + after;
                self.exiting.insert(key, (rechecked, due));
                self.exiting_due = Some(self.exiting_due.map_or(due, |at| at.min(due)));
            }
            _ => {}
        }
    }

    /// Checks again the exiting processes that are due; the slow ones wait their second.
    fn recheck_exiting(&mut self) {
        let now = tokio::time::Instant::now();
        let due: Vec<(ProcessKey, u32)> = self
            .exiting
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(key, (rechecked, _))| (*key, *rechecked))
            .collect();
        for (key, rechecked) in due {
            self.exiting.remove(&key);
            self.recheck(key, rechecked);
        }
        self.exiting_due = self.exiting.values().map(|(_, at)| *at).min();
    }

    /// The ring-buffer reader failed: the eBPF source is off, and what only it watched
    /// moves to the `/proc` poller after a re-check of everything (deaths may be unread).
    fn ebpf_failed(&mut self, error: &str) {
        let why = format!("the ring-buffer reader failed: {error}");
        tracing::error!(why, "eBPF exit source off");
        self.ebpf = None;
        self.off.push((SourceName::Ebpf, why));
        let orphaned: Vec<ProcessKey> = self
            .tracked
            .iter()
            .filter(|(_, c)| c.ebpf && !c.pidfd && !c.procpoll)
            .map(|(key, _)| *key)
            .collect();
        for key in orphaned {
            let covered = self.cover_by_procpoll(key);
            if let Some(coverage) = self.tracked.get_mut(&key) {
                coverage.ebpf = false;
                coverage.procpoll = covered;
            }
        }
        for coverage in self.tracked.values_mut() {
            coverage.ebpf = false;
        }
        self.loss_reconciles += 1;
        self.to_reconcile = self.tracked.keys().copied().collect();
    }

    pub fn status(&self) -> MonitorStatus {
        let lacking = |covered: fn(&Coverage) -> bool| {
            self.tracked.values().filter(|c| !covered(c)).count() as u64
        };
        let without_pidfd = if self.pidfd.is_some() {
            lacking(|c| c.pidfd)
        } else {
            0
        };
        let mut sources = Vec::new();
        if let Some(ebpf) = &self.ebpf {
            let mut report = report_ebpf(ebpf);
            let missing = lacking(|c| c.ebpf);
            if missing > 0 {
                report.state = SourceState::Degraded;
                report.reason = Some(format!(
                    "{missing} tracked processes are not in the eBPF map (full); other sources cover them"
                ));
            }
            sources.push(report);
        }
        if let Some(pidfd) = &self.pidfd {
            let mut report = report_pidfd(pidfd);
            if without_pidfd > 0 {
                report.state = SourceState::Degraded;
                report.reason = Some(format!(
                    "{without_pidfd} tracked processes have no pidfd (out of file descriptors); other sources cover them"
                ));
            }
            sources.push(report);
        }
        let only = self.ebpf.is_none() && self.pidfd.is_none();
        match &self.procpoll {
            Some(poller) => {
                let mut report = report_procpoll(poller);
                if only && !self.procpoll_selected {
                    report.reason = Some("the only exit source that works here".into());
                } else if !self.procpoll_selected {
                    report.reason = Some("covering processes no other source could watch".into());
                }
                sources.push(report);
            }
            None if !self.off.iter().any(|(n, _)| *n == SourceName::Procpoll) => {
                sources.push(SourceReport {
                    state: SourceState::Standby,
                    ..off_report(
                        SourceName::Procpoll,
                        "starts only for processes no other source can watch",
                    )
                })
            }
            None => {}
        }
        for (name, why) in &self.off {
            if !sources.iter().any(|s| s.name == *name) {
                let mut report = off_report(*name, why.clone());
                if *name == SourceName::Ebpf {
                    report.self_test = self.ebpf_self_test.clone();
                }
                sources.push(report);
            }
        }
        sources.sort_by_key(|s| s.name);
        MonitorStatus {
            selection: self.config.selection.to_string(),
            tracked: self.tracked.len() as u64,
            without_pidfd,
            loss_reconciles: self.loss_reconciles,
            sources,
        }
    }
}

/// Arms one source for `key`; a refusal is logged and the others cover the process.
fn arm(source: &mut dyn ExitSource, key: ProcessKey, member: bool, gone: &mut bool) -> bool {
    let tracked = if member {
        source.track_member(key)
    } else {
        source.track(key)
    };
    match tracked {
        Ok(()) => true,
        Err(TrackError::Gone) => {
            *gone = true;
            false
        }
        Err(e) => {
            tracing::warn!(source = %source.kind(), %key, error = %e, "source cannot watch process");
            false
        }
    }
}

/// A death found by re-checking `/proc`.
fn reconciled(key: ProcessKey, reason: liveness_common::identity::DeathReason) -> ExitObservation {
    ExitObservation {
        key,
        reason,
        status: None,
        detected_by: DetectedBy::Reconcile,
        at: SystemTime::now(),
        died_at: None,
        facts: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::testutil::Proc;
    use liveness_common::exit::ExitStatus;

    /// A report without a status (a pidfd's, before the reap) must not hide the status the
    /// eBPF program already wrote into the ring for the same death.
    #[tokio::test]
    async fn a_status_less_report_takes_the_status_from_the_ring() {
        if !crate::source::testutil::privileged("status-less report") {
            return;
        }
        let mut monitor = Monitor::start(MonitorConfig {
            selection: "ebpf".parse().unwrap(),
            ..MonitorConfig::default()
        })
        .await
        .expect("the eBPF monitor starts");
        let mut child = Proc::sh("read x; exit 5", &[]);
        let key = child.key();
        assert_eq!(monitor.track(key), None);
        child.close_stdin();
        child.reap();
        // The record is in the ring; nothing has read it yet.
        monitor.accept(SourceEvent::Exit(ExitObservation {
            key,
            reason: liveness_common::identity::DeathReason::Exited,
            status: None,
            detected_by: DetectedBy::Pidfd,
            at: SystemTime::now(),
            died_at: None,
            facts: None,
        }));
        let reported = monitor.try_next().expect("the death is reported");
        assert_eq!(
            (reported.detected_by, reported.status),
            (DetectedBy::Ebpf, Some(ExitStatus::Exited { code: 5 })),
            "the kernel's record must win over a report without a status"
        );
        assert_eq!(monitor.try_next(), None, "one death, one report");
    }

    /// A tracked process in `do_exit` (PF_EXITING among its stat flags, field 9) in
    /// `state`, whose record the kernel lost: the loss has just been reported.
    fn lost_while_exiting(
        state: char,
    ) -> (
        liveness_proc::fake::FakeProc,
        Monitor,
        super::super::fake::FakeExits,
        ProcessKey,
    ) {
        use liveness_proc::fake::{FakeProc, stat_line};
        const PID: u32 = 4242;
        const START: u64 = 5242;
        let proc = FakeProc::new();
        proc.spawn(PID, 1000);
        let (mut monitor, exits) = Monitor::with_fake(MonitorConfig {
            proc: proc.root(),
            ..MonitorConfig::default()
        });
        let key = ProcessKey {
            pid: PID,
            start_ticks: START,
        };
        assert_eq!(monitor.track(key), None);
        let line = stat_line(PID, "proc4242", state, 1, START);
        let mut fields: Vec<&str> = line.split(' ').collect();
        fields[8] = "4194564";
        std::fs::write(proc.path().join("4242/stat"), fields.join(" ")).unwrap();
        monitor.accept(SourceEvent::Lost {
            detected_by: DetectedBy::Ebpf,
            total: 1,
        });
        (proc, monitor, exits, key)
    }

    /// Kills the process and expects its death from the re-checks.
    async fn ended_by_a_recheck(
        proc: &liveness_proc::fake::FakeProc,
        monitor: &mut Monitor,
        key: ProcessKey,
    ) {
        proc.kill(key.pid);
        let reported = tokio::time::timeout(std::time::Duration::from_secs(5), monitor.next())
            .await
            .expect("the exiting process is checked again");
        assert_eq!(
            (reported.key, reported.detected_by),
            (key, DetectedBy::Reconcile)
        );
    }

    /// A loss noticed while a dropped process is still in its exit (not a zombie yet):
    /// the re-check finds it alive, and must look again until it is dead.
    #[tokio::test]
    async fn a_loss_ends_a_process_that_was_still_exiting_at_the_recheck() {
        let (proc, mut monitor, _exits, key) = lost_while_exiting('R');
        assert_eq!(monitor.try_next(), None, "not dead in /proc yet");
        ended_by_a_recheck(&proc, &mut monitor, key).await;
    }

    /// An exit that outlasts the quick re-checks (a close in uninterruptible sleep) is
    /// still followed until it ends.
    #[tokio::test(start_paused = true)]
    async fn a_loss_ends_a_process_whose_exit_outlasts_the_quick_rechecks() {
        let (proc, mut monitor, _exits, key) = lost_while_exiting('D');
        // Ten times the quick re-checks' second.
        let exiting = std::time::Duration::from_secs(10);
        assert!(
            tokio::time::timeout(exiting, monitor.next()).await.is_err(),
            "not dead in /proc yet"
        );
        ended_by_a_recheck(&proc, &mut monitor, key).await;
    }

    /// A process still exiting through several losses is followed once, not once more
    /// per loss.
    #[tokio::test(start_paused = true)]
    async fn a_process_exiting_through_several_losses_is_followed_once() {
        let (_proc, mut monitor, _exits, _key) = lost_while_exiting('D');
        let moment = std::time::Duration::from_millis(50);
        for total in 2..=4 {
            assert!(tokio::time::timeout(moment, monitor.next()).await.is_err());
            monitor.accept(SourceEvent::Lost {
                detected_by: DetectedBy::Ebpf,
                total,
            });
        }
        assert!(tokio::time::timeout(moment, monitor.next()).await.is_err());
        assert_eq!(monitor.exiting.len(), 1, "one entry for the one process");
    }

    #[test]
    fn selection_parses_lists_and_rejects_unknown_names() {
        assert_eq!("auto".parse(), Ok(Selection::Auto));
        assert_eq!(
            "ebpf, pidfd,ebpf".parse(),
            Ok(Selection::Only(vec![SourceName::Ebpf, SourceName::Pidfd]))
        );
        let err = "ebpf,kqueue".parse::<Selection>().unwrap_err();
        assert!(err.contains("\"kqueue\""), "{err}");
        assert_eq!(
            Selection::Only(vec![SourceName::Pidfd, SourceName::Procpoll]).to_string(),
            "pidfd,procpoll"
        );
    }
}
