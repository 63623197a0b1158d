//! One deduplicated stream of exits from every active source, with automatic fallback.
//!
//! The monitor arms each event-driven source (eBPF, pidfd) for a process, then re-checks
//! `/proc` once: a death before arming is caught by that check, a death after it by the
//! sources. A process no event source could take (no fds left, map full) is covered by the
//! `/proc` poller, started on demand, so no process is ever tracked by nothing. The first
//! observation of a death wins; later ones for the same process are dropped.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::ebpf::{EbpfConfig, EbpfSource};
use super::pidfd::PidfdSource;
use super::procpoll::{DEFAULT_INTERVAL, ProcpollSource};
use super::{DetectedBy, ExitObservation, ExitSource, SourceEvent, SourceStats, TrackError};
use crate::identity::{Liveness, ProcRoot, ProcessKey};

/// Events buffered between the sources and the monitor by default. When full, sources
/// wait (see the module docs of [`super`]).
pub const DEFAULT_QUEUE: usize = 4096;

/// A source the user can ask for by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceName {
    Ebpf,
    Pidfd,
    Procpoll,
}

impl SourceName {
    pub const ALL: [SourceName; 3] = [SourceName::Ebpf, SourceName::Pidfd, SourceName::Procpoll];

    fn detected_by(self) -> DetectedBy {
        match self {
            SourceName::Ebpf => DetectedBy::Ebpf,
            SourceName::Pidfd => DetectedBy::Pidfd,
            SourceName::Procpoll => DetectedBy::Procpoll,
        }
    }
}

impl fmt::Display for SourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.detected_by().fmt(f)
    }
}

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

/// What status says about one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceReport {
    pub name: SourceName,
    /// `active`, `standby` (procpoll waiting to cover what others cannot) or `off`.
    pub state: String,
    /// Why the source is off or on standby.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<SourceStats>,
}

/// Status of the whole monitor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonitorStatus {
    pub selection: String,
    pub tracked: u64,
    /// Tracked processes the pidfd source could not take (out of fds), covered by others.
    pub without_pidfd: u64,
    /// Times the kernel reported lost exits and every tracked process was re-checked.
    pub loss_reconciles: u64,
    pub sources: Vec<SourceReport>,
}

/// Tries to start each source once, for `liveness doctor`. Must run inside a tokio runtime.
pub fn probe(config: &MonitorConfig) -> Vec<SourceReport> {
    let (sink, _events) = mpsc::channel(1);
    SourceName::ALL
        .iter()
        .map(|&name| match start_source(name, config, sink.clone()) {
            Ok(_) => SourceReport {
                name,
                state: "available".into(),
                reason: None,
                stats: None,
            },
            Err(why) => SourceReport {
                name,
                state: "off".into(),
                reason: Some(why),
                stats: None,
            },
        })
        .collect()
}

fn start_source(
    name: SourceName,
    config: &MonitorConfig,
    sink: mpsc::Sender<SourceEvent>,
) -> Result<Box<dyn ExitSource>, String> {
    Ok(match name {
        SourceName::Ebpf => {
            Box::new(EbpfSource::start(sink, config.ebpf).map_err(|e| e.to_string())?)
        }
        SourceName::Pidfd => Box::new(PidfdSource::start(sink).map_err(|e| e.to_string())?),
        SourceName::Procpoll => Box::new(ProcpollSource::start(
            sink,
            config.procpoll_interval,
            config.proc.clone(),
        )),
    })
}

/// Watches tracked processes through every active source and yields each death once.
#[derive(Debug)]
pub struct Monitor {
    config: MonitorConfig,
    /// Event-driven sources (and procpoll when it was selected explicitly).
    sources: Vec<Box<dyn ExitSource>>,
    /// The `/proc` poller covering processes nothing else could take; started on demand.
    fallback: Option<Box<dyn ExitSource>>,
    /// Every tracked process and whether the fallback covers it.
    tracked: HashMap<ProcessKey, Coverage>,
    /// Why each unselected or failed source is off.
    off: Vec<(SourceName, String)>,
    sink: mpsc::Sender<SourceEvent>,
    events: mpsc::Receiver<SourceEvent>,
    /// Deaths found by re-checking `/proc`, waiting to be handed out.
    reconciled: VecDeque<ExitObservation>,
    loss_reconciles: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Coverage {
    by_fallback: bool,
    without_pidfd: bool,
}

impl Monitor {
    /// Starts the selected sources. Must run inside a tokio runtime.
    pub fn start(config: MonitorConfig) -> Result<Monitor, MonitorError> {
        let (sink, events) = mpsc::channel(config.queue.max(1));
        let mut sources = Vec::new();
        let mut off = Vec::new();
        match &config.selection {
            Selection::Auto => {
                for name in [SourceName::Ebpf, SourceName::Pidfd] {
                    match start_source(name, &config, sink.clone()) {
                        Ok(source) => sources.push(source),
                        Err(why) => off.push((name, why)),
                    }
                }
            }
            Selection::Only(names) => {
                if names.is_empty() {
                    return Err(MonitorError::NothingSelected);
                }
                for &name in names {
                    let source = start_source(name, &config, sink.clone())
                        .map_err(|why| MonitorError::Unavailable { name, why })?;
                    sources.push(source);
                }
                for name in SourceName::ALL {
                    if !names.contains(&name) {
                        off.push((name, "not selected".into()));
                    }
                }
            }
        }
        for source in &sources {
            tracing::info!(source = %source.kind(), "exit source active");
        }
        for (name, why) in &off {
            tracing::info!(source = %name, why, "exit source off");
        }
        Ok(Monitor {
            config,
            sources,
            fallback: None,
            tracked: HashMap::new(),
            off,
            sink,
            events,
            reconciled: VecDeque::new(),
            loss_reconciles: 0,
        })
    }

    /// Names of the sources that are running.
    pub fn active_sources(&self) -> Vec<DetectedBy> {
        self.sources
            .iter()
            .chain(&self.fallback)
            .map(|s| s.kind())
            .collect()
    }

    /// Starts watching a process of this boot. Returns its death at once when it is
    /// already dead (or its PID was reused); it is then not tracked.
    pub fn track(&mut self, key: ProcessKey) -> Option<ExitObservation> {
        if self.tracked.contains_key(&key) {
            return None;
        }
        let mut covered = false;
        let mut coverage = Coverage::default();
        let mut gone = false;
        for source in &mut self.sources {
            match source.track(key) {
                Ok(()) => covered = true,
                Err(TrackError::Gone) => gone = true,
                Err(e) => {
                    if source.kind() == DetectedBy::Pidfd {
                        coverage.without_pidfd = true;
                    }
                    tracing::warn!(source = %source.kind(), %key, error = %e, "source cannot watch process");
                }
            }
        }
        if !covered && !gone {
            coverage.by_fallback = true;
            let fallback = self.fallback.get_or_insert_with(|| {
                tracing::warn!("starting the /proc poller for processes no other source can watch");
                Box::new(ProcpollSource::start(
                    self.sink.clone(),
                    self.config.procpoll_interval,
                    self.config.proc.clone(),
                ))
            });
            if let Err(e) = fallback.track(key) {
                tracing::error!(%key, error = %e, "the /proc poller cannot watch process");
            }
        }
        self.tracked.insert(key, coverage);
        // Sources armed: anything that dies from now on is reported by them, so this one
        // check closes the window between capture and arming.
        match self.config.proc.check_key(key) {
            Liveness::Dead(reason) => {
                self.untrack(key);
                Some(ExitObservation {
                    key,
                    reason,
                    status: None,
                    detected_by: DetectedBy::Reconcile,
                    at: SystemTime::now(),
                })
            }
            Liveness::Alive | Liveness::Unknown(_) => None,
        }
    }

    /// Stops watching a process in every source.
    pub fn untrack(&mut self, key: ProcessKey) {
        if let Some(coverage) = self.tracked.remove(&key) {
            for source in &mut self.sources {
                source.untrack(key);
            }
            if coverage.by_fallback
                && let Some(fallback) = &mut self.fallback
            {
                fallback.untrack(key);
            }
        }
    }

    /// The next death of a tracked process. Cancel-safe: usable in `tokio::select!`.
    pub async fn next(&mut self) -> ExitObservation {
        loop {
            if let Some(observation) = self.reconciled.pop_front() {
                return observation;
            }
            // The monitor holds a sender itself, so the channel never closes.
            let Some(event) = self.events.recv().await else {
                continue;
            };
            if let Some(observation) = self.accept(event) {
                return observation;
            }
        }
    }

    /// A death that is ready now, without waiting.
    pub fn try_next(&mut self) -> Option<ExitObservation> {
        loop {
            if let Some(observation) = self.reconciled.pop_front() {
                return Some(observation);
            }
            let event = self.events.try_recv().ok()?;
            if let Some(observation) = self.accept(event) {
                return Some(observation);
            }
        }
    }

    fn accept(&mut self, event: SourceEvent) -> Option<ExitObservation> {
        match event {
            SourceEvent::Exit(observation) => {
                // Only the first report of a death passes; the others find it untracked.
                if self.tracked.contains_key(&observation.key) {
                    self.untrack(observation.key);
                    Some(observation)
                } else {
                    None
                }
            }
            SourceEvent::Lost { detected_by, total } => {
                tracing::warn!(source = %detected_by, total, "kernel lost exit reports; re-checking every tracked process");
                self.loss_reconciles += 1;
                self.reconcile();
                None
            }
        }
    }

    /// Re-checks every tracked process in `/proc` and queues the dead ones.
    fn reconcile(&mut self) {
        let keys: Vec<ProcessKey> = self.tracked.keys().copied().collect();
        for key in keys {
            if let Liveness::Dead(reason) = self.config.proc.check_key(key) {
                self.untrack(key);
                self.reconciled.push_back(ExitObservation {
                    key,
                    reason,
                    status: None,
                    detected_by: DetectedBy::Reconcile,
                    at: SystemTime::now(),
                });
            }
        }
    }

    pub fn status(&self) -> MonitorStatus {
        let mut sources: Vec<SourceReport> = self
            .sources
            .iter()
            .map(|s| SourceReport {
                name: name_of(s.kind()),
                state: "active".into(),
                reason: None,
                stats: Some(s.stats()),
            })
            .collect();
        let fallback_selected = sources.iter().any(|s| s.name == SourceName::Procpoll);
        if !fallback_selected {
            sources.push(match &self.fallback {
                Some(fallback) => SourceReport {
                    name: SourceName::Procpoll,
                    state: "active".into(),
                    reason: Some("covering processes no other source could watch".into()),
                    stats: Some(fallback.stats()),
                },
                None => SourceReport {
                    name: SourceName::Procpoll,
                    state: "standby".into(),
                    reason: Some("starts only for processes no other source can watch".into()),
                    stats: None,
                },
            });
        }
        for (name, why) in &self.off {
            if !sources.iter().any(|s| s.name == *name) {
                sources.push(SourceReport {
                    name: *name,
                    state: "off".into(),
                    reason: Some(why.clone()),
                    stats: None,
                });
            }
        }
        sources.sort_by_key(|s| s.name);
        MonitorStatus {
            selection: self.config.selection.to_string(),
            tracked: self.tracked.len() as u64,
            without_pidfd: self.tracked.values().filter(|c| c.without_pidfd).count() as u64,
            loss_reconciles: self.loss_reconciles,
            sources,
        }
    }
}

fn name_of(kind: DetectedBy) -> SourceName {
    match kind {
        DetectedBy::Ebpf => SourceName::Ebpf,
        DetectedBy::Pidfd => SourceName::Pidfd,
        DetectedBy::Procpoll | DetectedBy::Reconcile => SourceName::Procpoll,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
