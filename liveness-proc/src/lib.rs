//! Facts about processes, read from `/proc`, pidfds and the kernel itself, shared by the
//! daemon and the `liveness` CLI (which must not link the daemon's SQLite or aya).
//!
//! - [`activity`]: what a live process is doing: I/O counters, thread states.
//! - [`identity`]: capturing and checking fingerprints, resolving a hook's owner.
//! - [`pidfd`]: the bare pidfd calls (open, exited, pidfs inode).
//! - [`pidref`]: [`pidref::PidRef`], one verified handle on one process, through which
//!   every signal, wait, exit status and liveness check goes; and
//!   [`pidref::UnreapedChild`], one's own child, signalled and reaped by number.
//! - [`namespace`]: PID and time namespace arithmetic (`NSpid`, `timens_offsets`, fdinfo).
//! - [`diagnose`]: why a syscall fails here (missing, filtered, unprivileged, old kernel).
//! - [`mountinfo`]: the mounts of `/proc/self/mountinfo`: where the cgroup hierarchies are.
//! - [`paths`]: where the daemon listens and keeps its state by default.
//! - [`sockets`]: the TCP sockets a process holds, with their queues, byte counters and
//!   idle times, from `NETLINK_SOCK_DIAG` in the process's network namespace.
//! - `fake` (feature `fake`): a crafted `/proc` for tests.

pub mod activity;
pub mod diagnose;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod identity;
pub mod mountinfo;
pub mod namespace;
pub mod paths;
pub mod pidfd;
pub mod pidref;
pub mod sockets;
