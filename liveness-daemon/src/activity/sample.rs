//! One sample of a session's tree from `/proc` and sock_diag: each live member's CPU, I/O
//! counters, threads and connected TCP sockets.
//!
//! A process with one thread that did not run since the last round (its scheduler
//! statistics, its run time in nanoseconds and the times it was put on a CPU, unchanged)
//! cannot have changed its state, used CPU, read, written, nor opened or closed a
//! descriptor meanwhile: what that round read of it is taken again ([`Memo`]), and only
//! its sockets' counters in this round's sock_diag dump are read (bytes that arrive need
//! no run of it). A process gone has no statistics to read; one that took its pid has
//! others (its own run time to the nanosecond).

use std::collections::HashMap;

use liveness_common::identity::{Identity, ProcessKey};
use liveness_proc::activity::Ran;
use liveness_proc::identity::ProcRoot;
use liveness_proc::namespace::NANOS_PER_TICK;
use liveness_proc::sockets::{Round, SocketsError, TcpState, socket_inodes};

use super::judge::{Process, Sample, Socket};

/// Milliseconds per clock tick.
const MS_PER_TICK: u64 = (NANOS_PER_TICK / 1_000_000) as u64;

/// What a round read of each process that may spare the next one reading it again, and
/// what this round read of each: a process in several sessions' trees (the one owner of
/// many sessions) is read once a round.
#[derive(Debug, Default)]
pub struct Memo {
    last: HashMap<ProcessKey, Seen>,
    /// `None` for a process found gone (or its pid taken).
    this: HashMap<ProcessKey, Option<Seen>>,
}

impl Memo {
    /// The round is over: what it read of processes of one thread is the next one's
    /// memory, and only that.
    pub fn next_round(&mut self) {
        self.last = std::mem::take(&mut self.this)
            .into_iter()
            .filter_map(|(key, seen)| Some((key, seen?)))
            .filter(|(_, seen)| seen.ran.is_some())
            .collect();
    }
}

#[derive(Debug, Clone)]
struct Seen {
    /// The scheduler's statistics it was read with; `None` when they cannot speak for the
    /// process (they are its main thread's: only a process of one thread is taken again).
    ran: Option<Ran>,
    process: Process,
    comm: String,
    inodes: Vec<u64>,
}

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
    memo: &mut Memo,
    now_ms: i64,
    uptime_ticks: u64,
) -> (Sample, Vec<Identity>) {
    let mut live = Vec::with_capacity(known.len());
    let mut processes = Vec::with_capacity(known.len());
    for mut member in known {
        let key = member.key();
        let seen = match memo.this.get(&key) {
            Some(seen) => seen.clone(),
            None => {
                let seen = look(proc, key, memo.last.remove(&key));
                memo.this.insert(key, seen.clone());
                seen
            }
        };
        let Some(Seen {
            mut process,
            comm,
            inodes,
            ..
        }) = seen
        else {
            continue;
        };
        process.age_ms = i64::try_from(uptime_ticks.saturating_sub(key.start_ticks) * MS_PER_TICK)
            .unwrap_or(i64::MAX);
        process.sockets = connected(tcp, member.pid, &inodes);
        processes.push(process);
        if member.comm.is_empty() {
            member.comm = comm;
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

/// Reads the process `key`, unless what the last round read of it (`last`) still holds;
/// `None` if it is gone.
fn look(proc: &ProcRoot, key: ProcessKey, last: Option<Seen>) -> Option<Seen> {
    // Read first: whatever the process does after it shows at the next round.
    let ran = proc.ran(key.pid).ok().flatten();
    if let Some(seen) = last.filter(|seen| seen.ran.is_some() && seen.ran == ran) {
        return Some(seen);
    }
    let stat = proc.stat(key.pid).ok()?;
    if stat.start_ticks != key.start_ticks || stat.has_exited() {
        return None;
    }
    let threads = proc.threads_of(&stat).unwrap_or_default();
    // The one thread's statistics are the process's; the threads of a larger one are read
    // only when one of them is runnable, as a busy loop is at every round.
    let waited_ns = if stat.num_threads == 1 {
        ran.map(|ran| ran.wait_ns)
    } else if threads.iter().any(|thread| thread.state == 'R') {
        proc.waited_ns(key.pid).ok().flatten()
    } else {
        None
    };
    let process = Process {
        key,
        parent: stat.ppid,
        age_ms: 0,
        cpu_ms: stat.cpu_ticks() * MS_PER_TICK,
        waited_ms: waited_ns.map(|ns| ns / 1_000_000),
        io: proc.io(key.pid).ok(),
        threads,
        sockets: Vec::new(),
    };
    Some(Seen {
        ran: ran.filter(|_| stat.num_threads == 1),
        process,
        inodes: socket_inodes(proc, key.pid).unwrap_or_default(),
        comm: stat.comm,
    })
}

/// The connected TCP sockets of `pid` among its sockets `inodes`: none where they cannot be
/// read (a namespace this daemon may not enter, a process gone), which only takes evidence
/// away.
fn connected(tcp: &mut Round<'_>, pid: u32, inodes: &[u64]) -> Vec<Socket> {
    match tcp.tcp_of(pid, inodes) {
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

#[cfg(test)]
mod tests {
    use liveness_common::activity::{ActivityState, Declared, StallReason, TurnMark};
    use liveness_common::identity::Identity;
    use liveness_proc::fake::{FakeProc, stat_line, stat_line_threads};
    use liveness_proc::sockets::DiagSockets;

    use super::super::judge::{Thresholds, Tracker};
    use super::*;

    const OWNER: u32 = 100;
    const CHILD: u32 = 101;

    fn identity(pid: u32) -> Identity {
        Identity {
            pid,
            start_ticks: 1000 + u64::from(pid),
            boot_id: String::new(),
            host: String::new(),
            comm: String::new(),
            pidfs_ino: None,
        }
    }

    /// Rewrites a crafted process: its state, CPU ticks and I/O counters, and its scheduler
    /// statistics as they would follow (it ran when any changed).
    fn set(proc: &FakeProc, pid: u32, state: char, cpu_ticks: u64, wchar: u64) {
        set_io(proc, pid, wchar);
        let dir = proc.path().join(pid.to_string());
        let slices = 1 + cpu_ticks + wchar + u64::from(state);
        std::fs::write(dir.join("schedstat"), format!("{cpu_ticks} 0 {slices}\n")).unwrap();
        let line = stat_line(pid, "agent", state, 1, 1000 + u64::from(pid)).replacen(
            " 3 4 ",
            &format!(" {cpu_ticks} 0 "),
            1,
        );
        std::fs::write(dir.join("stat"), line).unwrap();
        std::fs::write(dir.join("wchan"), "pipe_read").unwrap();
        std::fs::create_dir_all(dir.join("fd")).unwrap();
    }

    /// Rewrites a crafted process's I/O counters alone.
    fn set_io(proc: &FakeProc, pid: u32, wchar: u64) {
        let dir = proc.path().join(pid.to_string());
        std::fs::write(dir.join("io"), format!("rchar: 0\nwchar: {wchar}\n")).unwrap();
    }

    /// The sampler's reads of a crafted `/proc`, judged sample after sample on a made-up
    /// clock: each transition of a session with a turn in flight, and members gone or
    /// whose pid was taken left out.
    #[test]
    fn crafted_proc_samples_go_through_each_transition() {
        let proc = FakeProc::new()
            .with(OWNER, "agent", 1)
            .with(CHILD, "mcp", OWNER);
        set(&proc, OWNER, 'S', 10, 0);
        set(&proc, CHILD, 'S', 0, 0);
        let root = proc.root();
        let mut diag = DiagSockets::new(root.clone());
        let limits = Thresholds {
            stall_after_ms: 3_000,
            spin_after_ms: 3_000,
            tool_stall_after_ms: 60_000,
            interval_ms: 500,
        };
        let turn = Declared::default().declare(Some(TurnMark::Start), None, false, 0);
        let mut tracker = Tracker::new(0, Some(&turn), None, limits.interval_ms);
        let uptime = 1_000_000;
        let mut memo = Memo::default();
        let mut judge = |at_ms: i64, known: Vec<Identity>| {
            let (sample, live) = read(
                known,
                identity(OWNER).key(),
                &root,
                &mut diag.round(),
                &mut memo,
                at_ms,
                uptime,
            );
            memo.next_round();
            let (activity, transition) = tracker.judge(&sample, Some(&turn), &limits);
            (activity, transition.is_some(), live.len())
        };
        let both = || vec![identity(OWNER), identity(CHILD)];

        let (first, _, live) = judge(0, both());
        assert_eq!((first.state, live), (ActivityState::Working, 2));
        // Nothing moves: quiet, then stalled with nothing to blame.
        let (quiet, ..) = judge(2_000, both());
        assert_eq!(quiet.state, ActivityState::Quiet);
        let (stalled, started, _) = judge(3_500, both());
        assert_eq!(
            (stalled.state, stalled.reason, started),
            (ActivityState::Stalled, Some(StallReason::NoActivity), true)
        );
        // The owner writes: working again, the episode over.
        set(&proc, OWNER, 'S', 10, 4096);
        let (working, ended, _) = judge(4_000, both());
        assert_eq!((working.state, ended), (ActivityState::Working, true));
        // Stuck in the kernel past the threshold: blocked, where it waits named.
        set(&proc, OWNER, 'D', 10, 4096);
        let (blocked, started, _) = judge(8_000, both());
        assert_eq!(
            (blocked.state, blocked.reason, started),
            (ActivityState::Stalled, Some(StallReason::Blocked), true)
        );
        assert_eq!(blocked.evidence.blocked_in, ["pipe_read"]);
        // Counters that moved while the scheduler says it never ran are not read again
        // (the memo), until it runs.
        set_io(&proc, OWNER, 8192);
        let (still, ..) = judge(8_600, both());
        assert_eq!(still.state, ActivityState::Stalled);
        set(&proc, OWNER, 'D', 10, 8192);
        let (moved, ended, _) = judge(8_700, both());
        assert_eq!((moved.state, ended), (ActivityState::Working, true));
        // The child is gone, and its pid taken by another process: both left out.
        proc.kill(CHILD);
        let (_, _, live) = judge(9_000, both());
        assert_eq!(live, 1);
        let other = stat_line_threads(CHILD, "other", 'R', 1, 5, 4);
        let proc = proc.with_raw(CHILD, other.as_bytes());
        let (_, _, live) = judge(9_500, both());
        assert_eq!(live, 1, "a pid another process took is not the member");
        drop(proc);
    }

    /// One owner of many sessions is read once a round, whatever its sessions' number: a
    /// second session's sample in the same round is the first's reading, even after the
    /// process changed; the next round reads it again.
    #[test]
    fn a_process_in_several_trees_is_read_once_a_round() {
        let proc = FakeProc::new().with(OWNER, "agent", 1);
        set(&proc, OWNER, 'S', 10, 0);
        let root = proc.root();
        let mut diag = DiagSockets::new(root.clone());
        let mut memo = Memo::default();
        let mut cpu_of_session = |memo: &mut Memo| {
            let (sample, _) = read(
                vec![identity(OWNER)],
                identity(OWNER).key(),
                &root,
                &mut diag.round(),
                memo,
                0,
                1_000_000,
            );
            sample.processes[0].cpu_ms
        };
        let first = cpu_of_session(&mut memo);
        set(&proc, OWNER, 'S', 20, 0);
        assert_eq!(cpu_of_session(&mut memo), first, "read twice in one round");
        memo.next_round();
        assert_eq!(cpu_of_session(&mut memo), 20 * MS_PER_TICK);
        // Gone: left out of every later session's sample of the round without a read.
        memo.next_round();
        proc.kill(OWNER);
        assert!(memo.this.is_empty());
        let (sample, live) = read(
            vec![identity(OWNER)],
            identity(OWNER).key(),
            &root,
            &mut diag.round(),
            &mut memo,
            0,
            1_000_000,
        );
        assert!(sample.processes.is_empty() && live.is_empty());
        assert!(matches!(memo.this.get(&identity(OWNER).key()), Some(None)));
        drop(proc);
    }
}
