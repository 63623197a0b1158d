//! Exit sources: the mechanisms that learn a tracked process has died.
//!
//! Each source implements [`ExitSource`] and sends [`SourceEvent`]s into one bounded
//! channel. When the channel is full a source *waits* (backpressure); for the eBPF source
//! that lets the ring buffer fill and the kernel count the loss, which the consumer answers
//! by reconciling — so nothing is dropped silently anywhere.

use std::fmt;
use std::io;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::identity::{DeathReason, ProcessKey};

pub mod child;
pub mod diagnose;
pub mod ebpf;
pub mod monitor;
pub mod pidfd;
pub mod procpoll;
#[cfg(test)]
mod testutil;

/// Which mechanism detected a death. Serialized as `detected_by` in events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DetectedBy {
    Ebpf,
    Pidfd,
    Procpoll,
    /// A re-check of `/proc` after a restart or a kernel-side loss, not a live source.
    Reconcile,
}

impl fmt::Display for DetectedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DetectedBy::Ebpf => "ebpf",
            DetectedBy::Pidfd => "pidfd",
            DetectedBy::Procpoll => "procpoll",
            DetectedBy::Reconcile => "reconcile",
        })
    }
}

/// How a process ended, as `wait(2)` would tell its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExitStatus {
    /// `exit(code)` or a return from `main`.
    Exited { code: u8 },
    /// Terminated by a signal.
    Signaled { signal: u8, core_dumped: bool },
}

impl ExitStatus {
    /// Decodes a raw `wait(2)` status word (`WIFEXITED`, `WEXITSTATUS`, `WTERMSIG`, `WCOREDUMP`).
    pub fn from_wait_status(status: u32) -> ExitStatus {
        let signal = (status & 0x7f) as u8;
        if signal == 0 {
            ExitStatus::Exited {
                code: ((status >> 8) & 0xff) as u8,
            }
        } else {
            ExitStatus::Signaled {
                signal,
                core_dumped: status & 0x80 != 0,
            }
        }
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Exited { code } => write!(f, "exited with code {code}"),
            ExitStatus::Signaled {
                signal,
                core_dumped: false,
            } => write!(f, "killed by signal {signal}"),
            ExitStatus::Signaled {
                signal,
                core_dumped: true,
            } => {
                write!(f, "killed by signal {signal} (core dumped)")
            }
        }
    }
}

/// One source's report that a tracked process died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitObservation {
    pub key: ProcessKey,
    pub reason: DeathReason,
    /// The wait status, when the source can know it.
    pub status: Option<ExitStatus>,
    pub detected_by: DetectedBy,
    /// When the source observed the death.
    pub at: SystemTime,
    /// When the process died by the kernel's clock, where the source reads it (eBPF).
    pub died_at: Option<SystemTime>,
}

/// What sources send to their consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    Exit(ExitObservation),
    /// The kernel dropped exit reports; `total` is the source's cumulative loss count.
    /// Tracked processes must be re-checked, since any of their deaths may be among them.
    Lost {
        detected_by: DetectedBy,
        total: u64,
    },
}

/// Sending side of the channel every source reports into.
pub type EventSink = tokio::sync::mpsc::Sender<SourceEvent>;

/// Why a source cannot watch one process.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    /// The process is already gone: the caller treats it as dead.
    #[error("the process is already gone")]
    Gone,
    /// The source is out of a resource (file descriptors, map slots); another source must
    /// cover the process.
    #[error("out of capacity: {0}")]
    Exhausted(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Counters a source exposes in status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStats {
    /// Processes being watched right now.
    pub tracked: u64,
    /// Exit observations sent.
    pub observed: u64,
    /// Exits the kernel could not report (eBPF ring buffer full).
    pub lost: u64,
    /// `track` calls refused with [`TrackError::Exhausted`].
    pub refused: u64,
}

/// A mechanism that watches tracked processes and reports their deaths.
///
/// Contract: after `track` returns `Ok`, every later death of that process is reported
/// (at least once) until `untrack`. A death *before* `track` returned may be missed; the
/// caller closes that window by re-checking `/proc` after `track`.
pub trait ExitSource: Send + fmt::Debug {
    fn kind(&self) -> DetectedBy;
    fn track(&mut self, key: ProcessKey) -> Result<(), TrackError>;
    /// Stops watching; a no-op for a process that is not tracked.
    fn untrack(&mut self, key: ProcessKey);
    fn stats(&self) -> SourceStats;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_wait_status_like_the_libc_macros() {
        for (raw, expected) in [
            (0x0000, ExitStatus::Exited { code: 0 }),
            (0x0700, ExitStatus::Exited { code: 7 }),
            (0xff00, ExitStatus::Exited { code: 255 }),
            (
                0x0009,
                ExitStatus::Signaled {
                    signal: 9,
                    core_dumped: false,
                },
            ),
            (
                0x008b,
                ExitStatus::Signaled {
                    signal: 11,
                    core_dumped: true,
                },
            ),
        ] {
            assert_eq!(
                ExitStatus::from_wait_status(raw),
                expected,
                "status {raw:#x}"
            );
            let raw_c = raw as libc::c_int;
            assert_eq!(
                libc::WIFEXITED(raw_c),
                matches!(expected, ExitStatus::Exited { .. })
            );
        }
    }

    #[test]
    fn exit_status_json_is_tagged() {
        let json = serde_json::to_string(&ExitStatus::Signaled {
            signal: 9,
            core_dumped: false,
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"kind":"signaled","signal":9,"core_dumped":false}"#
        );
        let json = serde_json::to_string(&ExitStatus::Exited { code: 7 }).unwrap();
        assert_eq!(json, r#"{"kind":"exited","code":7}"#);
    }
}
