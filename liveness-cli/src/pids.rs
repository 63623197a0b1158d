//! Pids as the user of this command numbers them. The daemon reports pids of its own PID
//! namespace; run in another one (a container, with the daemon on the host), the command
//! shows a process by its number here and the daemon's beside it, saying which is which,
//! so that no line mixes the two unsaid.

use std::cell::OnceCell;
use std::os::fd::{AsFd, AsRawFd};

use liveness_client::Client;
use liveness_common::identity::{Identity, ProcessKey};
use liveness_proc::identity::{ProcRoot, Stat};
use liveness_proc::namespace::parse_nspid;

/// How the daemon numbers processes, next to this command.
#[derive(Debug)]
pub(crate) enum Numbering {
    /// As this command does (or it cannot be told: as before, the daemon's pids are shown
    /// as they come).
    Same,
    /// Otherwise. `daemon_pid` is the daemon itself here, if it is visible here at all.
    Other {
        daemon_pid: Option<u32>,
        /// This namespace's processes, read once when a pid first needs finding.
        here: OnceCell<Vec<Stat>>,
    },
}

/// A process as this command sees it: its pid here and its command name now.
pub(crate) struct Here {
    pub(crate) pid: u32,
    pub(crate) comm: String,
}

impl Numbering {
    /// How the daemon at the other end of `client` numbers processes, from the kernel's
    /// account of the connection (`SO_PEERCRED`: the daemon's pid here, 0 when it is not
    /// in this namespace or one below it) and the depth of both namespaces (`NSpid:`).
    pub(crate) fn of(client: &Client) -> Numbering {
        match peer_pid(client) {
            Some(0) => Numbering::Other {
                daemon_pid: None,
                here: OnceCell::new(),
            },
            Some(daemon) => match (depth("self"), depth(&daemon.to_string())) {
                (Some(own), Some(daemons)) if own != daemons => Numbering::Other {
                    daemon_pid: Some(daemon),
                    here: OnceCell::new(),
                },
                _ => Numbering::Same,
            },
            None => Numbering::Same,
        }
    }

    /// The process `identity` (of the daemon's numbering) names, if it is alive and can be
    /// seen here. Found by pid where the numbering is the same; otherwise among this
    /// namespace's processes by start time and pidfs inode, without which (before Linux
    /// 6.9) a process here cannot be told to be that one.
    pub(crate) fn here(&self, identity: &Identity) -> Option<Here> {
        let proc = ProcRoot::default();
        match self {
            Numbering::Same => {
                let now = proc.capture(identity.pid).ok()?;
                let same = now.start_ticks == identity.start_ticks
                    && now.boot_id == identity.boot_id
                    && (now.pidfs_ino.is_none()
                        || identity.pidfs_ino.is_none()
                        || now.pidfs_ino == identity.pidfs_ino);
                same.then_some(Here {
                    pid: now.pid,
                    comm: now.comm,
                })
            }
            Numbering::Other { here, .. } => {
                let ino = identity.pidfs_ino?;
                if proc.boot_id().ok()? != identity.boot_id {
                    return None;
                }
                here.get_or_init(|| proc.processes().unwrap_or_default())
                    .iter()
                    .filter(|stat| stat.start_ticks == identity.start_ticks)
                    .find(|stat| {
                        let key = ProcessKey {
                            pid: stat.pid,
                            start_ticks: stat.start_ticks,
                        };
                        proc.pidfs_ino_of_key(key) == Some(ino)
                    })
                    .map(|stat| Here {
                        pid: stat.pid,
                        comm: stat.comm.clone(),
                    })
            }
        }
    }

    /// Whether pids from the daemon must be said to be its own.
    pub(crate) fn differs(&self) -> bool {
        matches!(self, Numbering::Other { .. })
    }

    /// A pid from the daemon, with the caller's number for it when known and different:
    /// "pid 2; 22032 in the daemon's PID namespace", or "pid 22032".
    pub(crate) fn pid(&self, daemons: u32, here: Option<u32>) -> String {
        match (self, here) {
            (Numbering::Same, _) => format!("pid {daemons}"),
            (Numbering::Other { .. }, Some(here)) => {
                format!("pid {here}; {daemons} in the daemon's PID namespace")
            }
            (Numbering::Other { .. }, None) => {
                format!("pid {daemons} in the daemon's PID namespace")
            }
        }
    }

    /// The daemon's own pid (as it reports it, in its namespace), as [`Numbering::pid`]
    /// says it.
    pub(crate) fn daemon(&self, reported: u32) -> String {
        match self {
            Numbering::Same => format!("pid {reported}"),
            Numbering::Other { daemon_pid, .. } => self.pid(reported, *daemon_pid),
        }
    }
}

/// The pid of the process at the other end of `client` in this PID namespace, 0 when it
/// is outside it; `None` when the kernel does not say.
fn peer_pid(client: &Client) -> Option<u32> {
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `credentials`, a ucred, on
    // the connection's socket, which `client` keeps open for the call.
    let done = unsafe {
        libc::getsockopt(
            client.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut length,
        )
    };
    (done == 0).then(|| u32::try_from(credentials.pid).unwrap_or(0))
}

/// How many PID namespaces deep a process is, counted from the one of this `/proc`
/// (`NSpid:` has one entry per level); `None` where it cannot be read (`hidepid`).
fn depth(pid: &str) -> Option<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse_nspid(&status).len()).filter(|&depth| depth > 0)
}
