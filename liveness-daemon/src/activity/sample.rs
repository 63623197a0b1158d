//! One sample of a session's tree from `/proc` and sock_diag: each live member's CPU, I/O
//! counters, threads and connected TCP sockets.

use liveness_common::identity::{Identity, ProcessKey};
use liveness_proc::identity::ProcRoot;
use liveness_proc::namespace::NANOS_PER_TICK;
use liveness_proc::sockets::{Round, SocketsError, TcpState};

use super::judge::{Process, Sample, Socket};

/// Milliseconds per clock tick.
const MS_PER_TICK: u64 = (NANOS_PER_TICK / 1_000_000) as u64;

/// Reads the `known` members of the tree whose owner is `owner`, at `now_ms`;
/// `uptime_ticks` is the clock their start times are on, `tcp` the round's socket dumps.
/// Each is checked by the stat read for its CPU: one gone (or whose pid another process
/// took, which its start time tells) is left out. Returns the sample and the members
/// alive in it.
pub fn read(
    known: Vec<Identity>,
    owner: ProcessKey,
    proc: &ProcRoot,
    tcp: &mut Round<'_>,
    now_ms: i64,
    uptime_ticks: u64,
) -> (Sample, Vec<Identity>) {
    let mut live = Vec::with_capacity(known.len());
    let mut processes = Vec::with_capacity(known.len());
    for mut member in known {
        let Ok(stat) = proc.stat(member.pid) else {
            continue;
        };
        if stat.start_ticks != member.start_ticks || stat.has_exited() {
            continue;
        }
        processes.push(Process {
            key: member.key(),
            parent: stat.ppid,
            age_ms: i64::try_from(uptime_ticks.saturating_sub(stat.start_ticks) * MS_PER_TICK)
                .unwrap_or(i64::MAX),
            cpu_ms: stat.cpu_ticks() * MS_PER_TICK,
            io: proc.io(member.pid).ok(),
            threads: proc.threads_of(&stat).unwrap_or_default(),
            sockets: connected(tcp, member.pid),
        });
        if member.comm.is_empty() {
            member.comm = stat.comm;
        }
        live.push(member);
    }
    let sample = Sample {
        at_ms: now_ms,
        owner,
        processes,
    };
    (sample, live)
}

/// The connected TCP sockets of `pid`: none where they cannot be read (a namespace this
/// daemon may not enter, a process gone), which only takes evidence away.
fn connected(tcp: &mut Round<'_>, pid: u32) -> Vec<Socket> {
    match tcp.process_tcp(pid) {
        Ok(sockets) => sockets
            .into_iter()
            .filter(|socket| socket.state == TcpState::Established)
            .map(|socket| Socket {
                inode: socket.inode,
                peer: socket.peer.to_string(),
                bytes_received: socket.info.bytes_received,
                idle_ms: socket.info.last_data_recv_ms.map(u64::from),
                unread: u64::from(socket.rqueue),
            })
            .collect(),
        Err(SocketsError::NoSuchProcess(_)) => Vec::new(),
        Err(e) => {
            tracing::debug!(pid, error = %e, "cannot read a member's TCP sockets");
            Vec::new()
        }
    }
}
