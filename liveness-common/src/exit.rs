//! How a process ended, and what noticed it.

use std::fmt;

use serde::{Deserialize, Serialize};

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
