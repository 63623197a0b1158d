//! How sessions, events, identities and the status are printed, as text or JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use liveness_common::action::ActionOutcome;
use liveness_common::activity::{Activity, ActivityState, StallReason};
use liveness_common::cause::{Cause, SignalName};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, Identity};
use liveness_common::lock::Lock;
use liveness_common::request::CgroupLimits;
use liveness_common::session::{EndReason, Event, EventKind, OnEnd, Phase, Reaped, Session};
use liveness_common::status::{
    CgroupStatus, CgroupTermination, ClusterStatus, MembershipStatus, SourceReport, Status,
};
use liveness_common::wire::wire_name;
use liveness_proc::identity::{Liveness, ProcRoot};

use crate::clock;
use crate::output::{self, outln};
use crate::pids::{Here, Numbering};

/// A session as the answer to `get`, `register`, `end`, `wait`...: a block like
/// `systemctl status`, or its JSON.
pub(crate) fn print_session(session: &Session, json: bool, pids: &Numbering) {
    if json {
        output::json(session);
    } else {
        print_session_block(session, clock::now_ms(), pids);
    }
}

fn print_session_block(session: &Session, now: i64, pids: &Numbering) {
    let (mark, state) = match session.phase {
        Phase::Active if session.pending => ("●", "active (pending)"),
        Phase::Active => ("●", "active"),
        Phase::Ended => ("○", "ended"),
    };
    outln!("{mark} {} - {state}", session.id);
    outln!("     Owner: {}", describe_owner(session, pids));
    outln!(
        "   Created: {} ({})",
        clock::local_time(session.created_ms),
        clock::age(session.created_ms, now)
    );
    if let Some(ended) = session.ended_ms {
        outln!(
            "     Ended: {} ({}): {}",
            clock::local_time(ended),
            clock::age(ended, now),
            how_session_ended(session)
        );
        if let Some(Cause::Unknown { reason }) = &session.cause {
            outln!("     Cause: unknown: {reason}");
        }
        if let Some(usage) = &session.usage {
            outln!("     Usage: {usage} (members still running are not counted)");
        }
        if let Some(usage) = session.cgroup.as_ref().and_then(|c| c.usage.as_ref()) {
            outln!("    Cgroup: {usage}");
        }
        for escape in session.cgroup.iter().flat_map(|c| &c.escaped) {
            outln!(
                "   Escaped: pid {} left the session's cgroup for {}",
                escape.pid,
                escape.cgroup
            );
        }
        if let Some(unlisted) = session.cgroup.as_ref().and_then(|c| c.unlisted.as_ref()) {
            let pids: Vec<String> = (unlisted.processes.iter())
                .map(|key| key.pid.to_string())
                .collect();
            let unnamed = (unlisted.total as usize).saturating_sub(pids.len());
            let named = match (pids.is_empty(), unnamed) {
                (true, _) => String::new(),
                (false, 0) => format!(": pid {}", pids.join(", ")),
                (false, n) => format!(": pid {}, {n} more", pids.join(", ")),
            };
            outln!(
                "  Unlisted: {} process(es) in its cgroup at its end, none of its tree{named}",
                unlisted.total
            );
        }
        if let Some(survivors) = session.survivors.as_ref().filter(|s| s.total > 0) {
            let unlisted =
                survivors.total as usize - survivors.members.len().min(survivors.total as usize);
            let more = if unlisted > 0 {
                format!(", {unlisted} more not listed")
            } else {
                String::new()
            };
            outln!(
                " Survivors: {} process(es) of its tree still ran at its end{more}",
                survivors.total
            );
            for member in &survivors.members {
                outln!(
                    "            {}",
                    describe_process(member, pids.here(member), pids)
                );
            }
        }
        if let Some(survivors) = session.survivors.as_ref() {
            let requesters: Vec<String> = (survivors.requested_by.iter())
                .map(|process| describe_process(process, None, pids))
                .collect();
            if !requesters.is_empty() {
                outln!(
                    "  Ended by: {} (inside its tree: no survivors, never signalled)",
                    requesters.join(", from ")
                );
            }
        }
        if let Some(reaped) = &session.reaped {
            let (summary, failures) = describe_cleanup(reaped, session, pids);
            outln!("   Cleanup: {summary}");
            for failure in failures {
                outln!("            {failure}");
            }
        }
    } else if let Some(activity) = &session.activity {
        let tool = session.declared.as_ref().and_then(|d| d.tool.as_deref());
        outln!("  Activity: {}", describe_activity(activity, tool, now));
    }
    if let Some(expires) = session
        .pending_expires_ms
        .filter(|_| session.ended_ms.is_none())
    {
        outln!(
            "   Expires: {} ({}) unless renamed",
            clock::local_time(expires),
            clock::age(expires, now)
        );
    }
    if session.on_end == OnEnd::Terminate {
        outln!(
            "    On end: terminate its processes (SIGKILL after {} ms)",
            session.grace_ms
        );
    }
    for (index, spec) in session.on_end_run.iter().enumerate() {
        let state = session.actions.get(index);
        let how = match state.and_then(|state| state.outcome.as_ref()) {
            Some(outcome) => describe_outcome(outcome),
            None => state
                .map(|state| wire_name(state.state))
                .unwrap_or_default(),
        };
        outln!("  End run{index:>2}: {} ({how})", spec.argv.join(" "));
        if let Some(outcome) = state.and_then(|state| state.outcome.as_ref())
            && outcome.skipped.is_none()
            && !outcome.succeeded()
        {
            for line in stderr_excerpt(&outcome.stderr_tail) {
                outln!("             {line}");
            }
        }
    }
    if let Some(finalized) = session.finalized_ms {
        outln!(" Finalized: {}", clock::local_time(finalized));
    }
    if !session.labels.is_empty() {
        outln!("    Labels: {}", describe_labels(&session.labels));
    }
}

/// What an end action did, in a few words: `exit 0 in 12 ms`, `timed out after 60000 ms`,
/// `skipped: done_by_agent`, `failed to start: why` (its program never ran), `could not
/// run: why`.
fn describe_outcome(outcome: &ActionOutcome) -> String {
    let mut text = if let Some(skipped) = outcome.skipped {
        format!("skipped: {}", wire_name(skipped))
    } else if let (Some(error), true) = (&outcome.error, outcome.failed_to_start) {
        format!("failed to start: {error}")
    } else if let Some(error) = &outcome.error {
        format!("could not run: {error}")
    } else if outcome.timed_out {
        format!("timed out after {} ms", outcome.duration_ms)
    } else {
        let exit = outcome.exit.map(|e| e.to_string()).unwrap_or_default();
        format!("{exit} in {} ms", outcome.duration_ms)
    };
    if outcome.resumed {
        text.push_str(", run again after a daemon restart");
    }
    text
}

/// Most lines, and characters of each, of a failed action's stderr that `get` shows; the
/// whole tail (4 KiB) is in `get --json`.
const STDERR_LINES: usize = 3;
const STDERR_LINE_CHARS: usize = 120;

/// The end of a failed action's stderr, shortened for `get`: its last lines, each cut,
/// and a first line saying how much more there was.
fn stderr_excerpt(tail: &str) -> Vec<String> {
    let lines: Vec<&str> = tail
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    let shown = &lines[lines.len().saturating_sub(STDERR_LINES)..];
    let mut excerpt = Vec::new();
    if shown.len() < lines.len() {
        let earlier = lines.len() - shown.len();
        let plural = if earlier == 1 { "" } else { "s" };
        excerpt.push(format!(
            "stderr: ({earlier} earlier line{plural}: get --json has the last 4 KiB)"
        ));
    }
    for line in shown {
        let mut line = line.trim_end().to_owned();
        if let Some((cut, _)) = line.char_indices().nth(STDERR_LINE_CHARS) {
            line.truncate(cut);
            line.push('…');
        }
        excerpt.push(format!("stderr: {line}"));
    }
    excerpt
}

/// Sessions as a table with headers, like `docker ps`; a friendly line when there are none.
pub(crate) fn print_session_table(sessions: &[Session], filtered: bool, pids: &Numbering) {
    if sessions.is_empty() {
        outln!(
            "No sessions{}. Register one with `liveness register --session ID --owner auto`.",
            if filtered { " match" } else { "" }
        );
        return;
    }
    let now = clock::now_ms();
    let rows: Vec<[String; 6]> = sessions
        .iter()
        .map(|session| {
            let (state, status) = match session.ended_ms {
                Some(ended) => (
                    "ended".to_owned(),
                    format!(
                        "ended {}, {}",
                        clock::age(ended, now),
                        how_session_ended(session)
                    ),
                ),
                None if session.pending => ("pending".to_owned(), "waiting for its id".to_owned()),
                None => ("active".to_owned(), "running".to_owned()),
            };
            [
                session.id.clone(),
                state,
                describe_owner(session, pids),
                clock::age(session.created_ms, now),
                status,
                describe_labels(&session.labels),
            ]
        })
        .collect();
    print_table(
        ["SESSION", "STATE", "OWNER", "CREATED", "STATUS", "LABELS"],
        &rows,
    );
}

/// Held locks as a table, like the sessions'; a friendly line when there are none.
pub(crate) fn print_lock_table(locks: &[Lock]) {
    if locks.is_empty() {
        outln!("No locks are held. Take one with `liveness lock acquire NAME --session ID`.");
        return;
    }
    let now = clock::now_ms();
    let rows: Vec<[String; 7]> = locks
        .iter()
        .map(|lock| {
            // A fleet lock's line waits in etcd: its length is not counted here.
            let (waiters, scope) = match &lock.host {
                Some(host) if lock.cluster => ("-".to_owned(), format!("fleet, held on {host}")),
                _ => (lock.waiters.to_string(), "host".to_owned()),
            };
            [
                lock.name.clone(),
                lock.session.clone(),
                lock.uid.to_string(),
                lock.token.to_string(),
                format!(
                    "{} ({})",
                    clock::local_time(lock.since_ms),
                    clock::age(lock.since_ms, now)
                ),
                waiters,
                scope,
            ]
        })
        .collect();
    print_table(
        [
            "LOCK", "SESSION", "UID", "TOKEN", "SINCE", "WAITERS", "SCOPE",
        ],
        &rows,
    );
}

/// Left-aligned columns, two spaces apart; the last one is not padded.
pub(crate) fn print_table<const N: usize>(headers: [&str; N], rows: &[[String; N]]) {
    let mut widths = headers.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        text.trim_end().to_owned()
    };
    outln!("{}", line(headers));
    for row in rows {
        outln!("{}", line(row.each_ref().map(String::as_str)));
    }
}

/// A session's owner: as it is now if it is still running (see [`describe_process`]).
fn describe_owner(session: &Session, pids: &Numbering) -> String {
    let here = (session.phase == Phase::Active)
        .then(|| pids.here(&session.owner))
        .flatten();
    describe_process(&session.owner, here, pids)
}

/// "claude (pid 1234)", with the name the process has now when it changed (an `exec`
/// since registration): "node (pid 1234, registered as claude)"; run in another PID
/// namespace than the daemon, with its pid here first: "claude (pid 2; 1234 in the
/// daemon's PID namespace)". `here` is the process now, if it still runs and is seen here.
fn describe_process(identity: &Identity, here: Option<Here>, pids: &Numbering) -> String {
    let pid = pids.pid(identity.pid, here.as_ref().map(|here| here.pid));
    match here.filter(|here| here.comm != identity.comm) {
        Some(now) => format!("{} ({pid}, registered as {})", now.comm, identity.comm),
        None => format!("{} ({pid})", identity.comm),
    }
}

pub(crate) fn describe_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn how_session_ended(session: &Session) -> String {
    how_it_ended(
        session.reason,
        session.exit,
        session.cause.as_ref(),
        session.detected_by,
    )
}

/// How a session ended, for people: "killed by SIGTERM from kill (pid 4121, uid 1000,
/// session build-7) (detected by ebpf)", "stopped with `end`", "owner gone unseen: its PID
/// was reused (detected by procpoll)". The cause where one was seen, else the status.
fn how_it_ended(
    reason: Option<EndReason>,
    exit: Option<ExitStatus>,
    cause: Option<&Cause>,
    detected_by: Option<DetectedBy>,
) -> String {
    let core = match exit {
        Some(ExitStatus::Signaled {
            core_dumped: true, ..
        }) => " (core dumped)",
        _ => "",
    };
    let what = match (cause, exit, reason) {
        (Some(cause @ (Cause::Signal { .. } | Cause::Oom { .. } | Cause::Hangup)), _, _) => {
            format!("{cause}{core}")
        }
        (_, Some(exit), _) => describe_exit(exit),
        (_, None, Some(EndReason::OwnerExited)) => "owner exited (status unknown)".to_owned(),
        (_, None, Some(EndReason::TreeExited)) => "exited (status unknown)".to_owned(),
        (_, None, Some(EndReason::OwnerReused)) => {
            "owner gone unseen: its PID was reused".to_owned()
        }
        (_, None, Some(EndReason::Reboot)) => "the machine rebooted".to_owned(),
        (_, None, Some(EndReason::Stopped)) => "stopped with `end`".to_owned(),
        (_, None, Some(EndReason::Timeout)) => "no activity within the timeout".to_owned(),
        (_, None, Some(EndReason::PendingExpired)) => "pending, never renamed".to_owned(),
        (_, None, None) => "ended".to_owned(),
    };
    let what = match reason {
        Some(EndReason::TreeExited) => format!("the last process of its tree {what}"),
        _ => what,
    };
    match detected_by {
        Some(by) => format!("{what} (detected by {by})"),
        None => what,
    }
}

/// "exited with code 0", "killed by SIGKILL", "killed by SIGSEGV (core dumped)".
fn describe_exit(exit: ExitStatus) -> String {
    match exit {
        ExitStatus::Exited { code } => format!("exited with code {code}"),
        ExitStatus::Signaled {
            signal,
            core_dumped,
        } => format!(
            "killed by {}{}",
            SignalName(signal),
            if core_dumped { " (core dumped)" } else { "" }
        ),
    }
}

/// A session in one line (`whose`): "agent-1 active, owner claude (pid 1234)". `here` is
/// its owner as this command sees it, when known.
pub(crate) fn describe_session(session: &Session, here: Option<Here>, pids: &Numbering) -> String {
    let state = match (session.phase, session.pending) {
        (Phase::Active, true) => "active (pending)",
        (Phase::Active, false) => "active",
        (Phase::Ended, _) => "ended",
    };
    let owner = describe_process(&session.owner, here, pids);
    format!("{} {state}, owner {owner}", session.id)
}

/// An event in one line: local time, seq, kind, session, owner, how it ended, labels.
pub(crate) fn describe_event(event: &Event, pids: &Numbering) -> String {
    let mut text = format!(
        "{}  #{} {} {} owner {}",
        clock::local_time(event.at_ms),
        event.seq,
        wire_name(event.kind),
        event.session,
        describe_process(&event.owner, pids.here(&event.owner), pids)
    );
    if let Some(previous) = &event.previous_session {
        text.push_str(&format!(" (was {previous})"));
    }
    if let Some(lock) = &event.lock {
        text.push_str(&format!(": lock {} token {}", lock.name, lock.token));
        if let Some(reason) = lock.reason {
            text.push_str(&format!(" ({})", wire_name(reason)));
        }
    }
    if event.kind == EventKind::Ended {
        text.push_str(&format!(
            ": {}",
            how_it_ended(
                event.reason,
                event.exit,
                event.cause.as_ref(),
                event.detected_by
            )
        ));
    }
    if let Some(outcome) = &event.action {
        text.push_str(&format!(
            ": end action {}: {}",
            outcome.index,
            describe_outcome(outcome)
        ));
    }
    if let Some(activity) = &event.activity {
        text.push_str(&format!(
            ": {}",
            describe_activity(activity, None, event.at_ms)
        ));
    }
    if let Some(escape) = &event.escape {
        text.push_str(&format!(
            ": pid {} left the session's cgroup for {}",
            escape.pid, escape.cgroup
        ));
    }
    if let Some(reaped) = &event.reaped {
        text.push_str(&describe_reaped(reaped));
        if pids.differs() {
            text.push_str(" (pids in the daemon's PID namespace)");
        }
    }
    if !event.labels.is_empty() {
        text.push_str(&format!("  [{}]", describe_labels(&event.labels)));
    }
    text
}

/// A session's activity in one line: "stalled 12 min: no bytes from 1.2.3.4:443 for 11
/// min, CPU 0.0 %".
fn describe_activity(activity: &Activity, tool: Option<&str>, now: i64) -> String {
    let evidence = &activity.evidence;
    let cpu = format!("CPU {:.1} %", f64::from(evidence.cpu_permille) / 10.0);
    let lasted = clock::span(now.saturating_sub(activity.since_ms).unsigned_abs());
    let quietest = evidence.sockets.first();
    match (activity.state, activity.reason) {
        (ActivityState::Working, _) => format!("working ({cpu})"),
        (ActivityState::Idle, _) => "idle: no turn in flight, waiting for its user".into(),
        (ActivityState::Tool, _) => match tool {
            Some(tool) => format!("running tool {tool} for {lasted}"),
            None => format!("running a tool for {lasted}"),
        },
        (ActivityState::Quiet, _) => {
            format!("quiet for {lasted}, below the stall threshold ({cpu})")
        }
        (ActivityState::Spinning, _) => {
            format!("spinning for {lasted}: {cpu} with no I/O and no new process")
        }
        (ActivityState::Stalled, reason) => {
            let why = match (reason, quietest) {
                (Some(StallReason::NotReading), _) => {
                    let unread = evidence.sockets.iter().find(|s| s.unread > 0);
                    unread.map_or("bytes left unread".into(), |s| {
                        format!("{} bytes from {} left unread", s.unread, s.peer)
                    })
                }
                (Some(StallReason::Blocked), _) => format!(
                    "{} thread(s) blocked in the kernel{}",
                    evidence.threads.blocked,
                    if evidence.blocked_in.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", evidence.blocked_in.join(", "))
                    }
                ),
                (Some(StallReason::Network), Some(socket)) => match socket.idle_ms {
                    Some(idle) => {
                        format!("no bytes from {} for {}", socket.peer, clock::span(idle))
                    }
                    None => format!("no bytes from {}", socket.peer),
                },
                (Some(StallReason::Tool), _) => "a tool runs with no progress".into(),
                _ => "no activity".into(),
            };
            format!("stalled {lasted}: {why}, {cpu}")
        }
    }
}

/// What a reap did, by pid: `terminated [12 13], killed [14], failed [1: why]`.
fn describe_reaped(reaped: &Reaped) -> String {
    let pids = |pids: &[u32]| {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        pids.join(" ")
    };
    let failed: Vec<String> = reaped
        .failed
        .iter()
        .map(|f| format!("{}: {}", f.pid, f.reason))
        .collect();
    format!(
        ": terminated [{}], killed [{}], already exited [{}], failed [{}]{}",
        pids(&reaped.terminated),
        pids(&reaped.killed),
        pids(&reaped.exited),
        failed.join("; "),
        if reaped.resumed {
            " (run again after a daemon restart)"
        } else {
            ""
        }
    )
}

/// What a session's cleanup did, for `get`: `terminated 2: sleep (pid 12), sh (pid 13);
/// killed 1: sleep (pid 14); already gone 1: pid 15`, each process named as the session's
/// survivors list names it; then one line per process not ended, with why.
fn describe_cleanup(reaped: &Reaped, session: &Session, pids: &Numbering) -> (String, Vec<String>) {
    let listed = session
        .survivors
        .as_ref()
        .map_or(&[][..], |s| &s.members[..]);
    let name = |pid: u32| match listed.iter().find(|member| member.pid == pid) {
        Some(member) => describe_process(member, None, pids),
        None => pids.pid(pid, None),
    };
    let mut parts = Vec::new();
    for (word, list) in [
        ("terminated", &reaped.terminated),
        ("killed", &reaped.killed),
        ("already gone", &reaped.exited),
    ] {
        if !list.is_empty() {
            let names: Vec<String> = list.iter().map(|pid| name(*pid)).collect();
            parts.push(format!("{word} {}: {}", list.len(), names.join(", ")));
        }
    }
    if !reaped.failed.is_empty() {
        parts.push(format!("not ended {}", reaped.failed.len()));
    }
    let mut summary = if parts.is_empty() {
        "nothing was left to end".to_owned()
    } else {
        parts.join("; ")
    };
    if reaped.resumed {
        summary.push_str(" (run again after a daemon restart)");
    }
    let failures = (reaped.failed.iter())
        .map(|failure| format!("not ended: {}: {}", name(failure.pid), failure.reason))
        .collect();
    (summary, failures)
}

/// `status` for people: who answered, then sessions, events, deaths, processes and limits
/// with their counters, then the sources.
pub(crate) fn print_status(status: &Status, pids: &Numbering) {
    let daemon = &status.daemon;
    let now = clock::now_ms();
    outln!(
        "livenessd {} (protocol {}), {}, up since {} ({})",
        daemon.version,
        daemon.protocol,
        pids.daemon(daemon.pid),
        clock::local_time(now - status.uptime_ms as i64),
        clock::age(now - status.uptime_ms as i64, now)
    );
    outln!("    Socket: {}", daemon.socket);
    outln!("     State: {}", daemon.state_dir);
    outln!(
        "  Sessions: {} active, {} deaths awaiting commit",
        status.active_sessions,
        status.uncommitted_deaths
    );
    if !status.activity.is_empty() {
        let states: Vec<String> = (status.activity.iter())
            .map(|(state, count)| format!("{count} {}", wire_name(state)))
            .collect();
        outln!("  Activity: {}", states.join(", "));
    }
    let store = &status.store;
    if store.disk_full || store.waiting > 0 {
        outln!(
            "  Database: {}: {} published endings wait for it (reads show them)",
            if store.disk_full {
                "cannot be written, the disk is full"
            } else {
                "behind"
            },
            store.waiting
        );
    }
    let actions = &status.actions;
    outln!(
        "   Actions: {} running, {} waiting to start, {} outcomes awaiting commit",
        actions.running,
        actions.waiting,
        actions.uncommitted_outcomes
    );
    let counters = &status.counters;
    let finalized = if counters.finalized_by.is_empty() {
        "none yet".to_owned()
    } else {
        counters
            .finalized_by
            .iter()
            .map(|(by, count)| format!("{by} {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!(
        "    Deaths: finalized by {finalized}; {} failed commits, largest batch {}",
        counters.failed_commits,
        counters.largest_batch
    );
    outln!(
        "    Events: head seq {}, {} subscribers, {} disconnected for lagging",
        status.head_seq,
        status.subscribers,
        counters.lagged_subscribers
    );
    let monitor = &status.monitor;
    outln!(
        " Processes: {} tracked, {} without a pidfd, {} re-checks after kernel losses",
        monitor.tracked,
        monitor.without_pidfd,
        monitor.loss_reconciles
    );
    let limits = &status.limits;
    let refused: u64 = limits.connections.refused.values().sum::<u64>()
        + limits.sessions.refused.values().sum::<u64>();
    outln!(
        "    Limits: {} root and {} other connections open, {} requests waited, {refused} refusals",
        limits.connections.connections.root,
        limits.connections.connections.non_root,
        limits.connections.requests_waited
    );
    outln!("   Sources: {}", monitor.selection);
    print_sources(&monitor.sources);
    if let Some(membership) = &status.membership {
        print_membership(membership);
    }
    if let Some(cluster) = &status.cluster {
        print_cluster(cluster, now);
    }
    if let Some(cgroup) = &status.cgroup {
        print_cgroup(cgroup);
    }
}

/// What cgroup support sessions have here (`register --cgroup`), and why none.
pub(crate) fn print_cgroup(cgroup: &CgroupStatus) {
    let mount = cgroup.mount.as_deref().unwrap_or("none");
    let controllers = match cgroup.controllers.as_slice() {
        [] => "none".to_owned(),
        list => list.join(" "),
    };
    match (&cgroup.subtree, &cgroup.reason) {
        (Some(subtree), _) if cgroup.usable => {
            let missing = |present: bool, what: &'static str| (!present).then_some(what);
            let termination = match cgroup.termination {
                Some(CgroupTermination::Freeze) => {
                    Some("no cgroup.kill: killed frozen, one by one, then thawed")
                }
                Some(CgroupTermination::Signals) => Some(
                    "no cgroup.kill nor cgroup.freeze: terminated by the reaper's signals only",
                ),
                Some(CgroupTermination::Unit) => Some("killed by systemd's KillUnit"),
                Some(CgroupTermination::Kill) | None => None,
            };
            let fallbacks: Vec<&str> = [
                termination,
                missing(cgroup.peak, "no memory.peak: no peak in the accounting"),
            ]
            .into_iter()
            .flatten()
            .collect();
            outln!(
                "   Cgroups: sessions' under {subtree} (cgroup2 at {mount}), controllers {controllers}"
            );
            if let Some(manager) = cgroup.manager {
                let reason = cgroup.manager_reason.as_deref().unwrap_or("");
                outln!("            made by {}: {reason}", wire_name(manager));
            }
            if !fallbacks.is_empty() {
                outln!("            {}", fallbacks.join("; "));
            }
        }
        (_, reason) => outln!(
            "   Cgroups: none for sessions: {}",
            reason.as_deref().unwrap_or("unusable")
        ),
    }
    if let Some(limits) = &cgroup.default {
        outln!(
            "            every new session asks for one unless it refuses (--no-cgroup): {}",
            limits_text(limits)
        );
    }
}

/// A cgroup's limits as `livenessd --session-cgroup` takes them (`none`: no limits).
fn limits_text(limits: &CgroupLimits) -> String {
    let parts: Vec<String> = (limits.pairs().iter())
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    match parts.is_empty() {
        true => "no limits".to_owned(),
        false => parts.join(","),
    }
}

/// Where the mirror of this host in etcd stands (`--etcd`).
fn print_cluster(cluster: &ClusterStatus, now: i64) {
    let state = if cluster.connected {
        "connected"
    } else {
        "disconnected"
    };
    outln!(
        "   Cluster: {state} since {} ({}), host {} under {} at {}",
        clock::local_time(cluster.since_ms),
        clock::age(cluster.since_ms, now),
        cluster.host_id,
        cluster.prefix,
        cluster.endpoints.join(",")
    );
    match cluster.mirrored_seq {
        Some(seq) => outln!(
            "            {} events behind (etcd has them through seq {seq})",
            cluster.behind
        ),
        None => outln!(
            "            {} events behind (etcd not reached since the daemon started)",
            cluster.behind
        ),
    }
    if let Some(error) = &cluster.error {
        outln!("            {error}");
    }
}

/// How process trees are followed, and what that can miss.
pub(crate) fn print_membership(membership: &MembershipStatus) {
    outln!(
        "     Trees: {} followed, {} members, by {}; can miss {}",
        membership.trees,
        membership.members,
        wire_name(membership.mode),
        membership.misses
    );
    if let (Some(capacity), Some(used)) = (membership.kernel_capacity, membership.kernel_used) {
        outln!(
            "            kernel map: {used} of {capacity} member entries, {} new processes found it full",
            membership.kernel_full
        );
    }
    if let Some(since) = membership.lineage_since_ms {
        outln!(
            "            lineages complete since {}: orphans made since then are placed",
            clock::local_time(since)
        );
    }
    if let Some(pins) = &membership.lineage_pins {
        outln!("            lineages kept across restarts (pinned in {pins})");
    }
    if let Some(reason) = &membership.lineage_unpinned {
        outln!(
            "            lineages not kept across a restart ({reason}): orphans made while no daemon runs are not placed"
        );
    }
    for pins in &membership.pin_sets {
        let whose = match (&pins.state_dir, &pins.unknown_owner) {
            (Some(dir), _) if pins.state_dir_exists => format!("state directory {dir}"),
            (Some(dir), _) => format!(
                "state directory {dir}, which no longer exists: removed at the next daemon start unless a running daemon holds it"
            ),
            (None, Some(why)) => format!("owner unknown, left as it is: {why}"),
            (None, None) => "owner unknown".to_owned(),
        };
        outln!(
            "            pinned in the pin directory: {} ({whose})",
            pins.path
        );
    }
    if let Some(share) = membership.kernel_share_per_uid {
        outln!("            a uid other than root may hold {share} of them");
    }
    for over in &membership.over_share {
        outln!(
            "            uid {} over its share: {} held, {} refused (scans cover the rest)",
            over.uid,
            over.used,
            over.refused
        );
    }
}

/// One line per exit source: name, state and reason, and the eBPF self-test where run.
pub(crate) fn print_sources(sources: &[SourceReport]) {
    for source in sources {
        let reason = source
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        outln!(
            "  {:<9} {}{reason}",
            source.name.to_string(),
            wire_name(source.state)
        );
        if let Some(stats) = &source.stats {
            outln!(
                "  {:<9} {} watched, {} exits seen, {} lost, {} refused",
                "",
                stats.tracked,
                stats.observed,
                stats.lost,
                stats.refused
            );
        }
        if let Some(test) = &source.self_test {
            outln!(
                "  {:<9} self-test {}: {}",
                "",
                if test.passed { "passed" } else { "FAILED" },
                test.detail
            );
        }
        if let Some(causes) = &source.causes {
            // Usage comes with every exit record.
            let seen = [
                (causes.signals, "signal senders"),
                (causes.oom, "OOM kills"),
                (true, "usage"),
            ]
            .iter()
            .filter(|(seen, _)| *seen)
            .map(|(_, what)| *what)
            .collect::<Vec<_>>()
            .join(", ");
            outln!("  {:<9} causes seen: {seen}; {} lost", "", causes.lost);
            if let Some(reason) = &causes.reason {
                outln!("  {:<9} {reason}", "");
            }
        }
    }
}

pub(crate) fn print_identity(identity: &Identity, json: bool) {
    if json {
        output::json(identity);
    } else {
        outln!("{} (pid {})", identity.comm, identity.pid);
        outln!("   Started: {}", describe_start(identity));
        outln!("      Boot: {}", identity.boot_id);
        outln!("      Host: {}", identity.host);
    }
}

/// A process's start as a local time and an age when it is of this boot, else in ticks.
fn describe_start(identity: &Identity) -> String {
    let this_boot = ProcRoot::default()
        .boot_id()
        .is_ok_and(|boot| boot == identity.boot_id);
    match clock::process_start_ms(identity.start_ticks).filter(|_| this_boot) {
        Some(start) => format!(
            "{} ({}; start_ticks {})",
            clock::local_time(start),
            clock::age(start, clock::now_ms()),
            identity.start_ticks
        ),
        None => format!("start_ticks {} of another boot", identity.start_ticks),
    }
}

/// The JSON shape of a liveness verdict.
#[derive(Debug, Serialize)]
struct Verdict<'a> {
    identity: &'a Identity,
    liveness: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<DeathReason>,
    detail: String,
}

pub(crate) fn print_liveness(identity: &Identity, liveness: &Liveness, json: bool) {
    let (word, reason, detail) = match liveness {
        Liveness::Alive => ("alive", None, "the process is running".to_owned()),
        Liveness::Dead(reason) => ("dead", Some(*reason), reason.to_string()),
        Liveness::Unknown(why) => ("unknown", None, why.clone()),
    };
    if json {
        output::json(&Verdict {
            identity,
            liveness: word,
            reason,
            detail,
        });
    } else {
        outln!("{word}: {detail} ({identity})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use liveness_common::session::ReapFailure;

    #[test]
    fn a_failed_actions_stderr_is_shortened_to_its_last_lines() {
        assert!(stderr_excerpt("").is_empty());
        assert_eq!(stderr_excerpt("oops\n"), ["stderr: oops"]);
        let long = format!("{}\n", "é".repeat(200));
        assert_eq!(
            stderr_excerpt(&format!("one\ntwo\n\nthree\n{long}")),
            [
                "stderr: (1 earlier line: get --json has the last 4 KiB)".to_owned(),
                "stderr: two".to_owned(),
                "stderr: three".to_owned(),
                format!("stderr: {}…", "é".repeat(STDERR_LINE_CHARS)),
            ]
        );
    }

    #[test]
    fn a_cleanup_names_each_process_by_the_survivors_list() {
        let session: Session = serde_json::from_value(serde_json::json!({
            "id": "s", "phase": "ended", "pending": false, "reason": "stopped", "exit": null,
            "detected_by": null, "creator_uid": 0, "labels": {}, "created_ms": 1,
            "updated_ms": 1, "touched_ms": 1, "ended_ms": 1, "pending_expires_ms": null,
            "owner": {"pid": 10, "start_ticks": 1, "boot_id": "b", "host": "h", "comm": "agent"},
            "survivors": {"total": 2, "members": [
                {"pid": 12, "start_ticks": 2, "boot_id": "b", "host": "h", "comm": "sleep"},
                {"pid": 13, "start_ticks": 3, "boot_id": "b", "host": "h", "comm": "trap"}]},
        }))
        .unwrap();
        let reaped = Reaped {
            terminated: vec![12, 15],
            killed: vec![13],
            failed: vec![ReapFailure {
                pid: 16,
                reason: "why".into(),
            }],
            ..Reaped::default()
        };
        assert_eq!(
            describe_cleanup(&reaped, &session, &Numbering::Same),
            (
                "terminated 2: sleep (pid 12), pid 15; killed 1: trap (pid 13); not ended 1"
                    .to_owned(),
                vec!["not ended: pid 16: why".to_owned()]
            )
        );
        let (nothing, _) = describe_cleanup(&Reaped::default(), &session, &Numbering::Same);
        assert_eq!(nothing, "nothing was left to end");
    }

    #[test]
    fn a_reap_run_again_after_a_restart_says_so() {
        let resumed = Reaped {
            killed: vec![14],
            resumed: true,
            ..Reaped::default()
        };
        assert_eq!(
            describe_reaped(&resumed),
            ": terminated [], killed [14], already exited [], failed [] (run again after a daemon restart)"
        );
        let first = describe_reaped(&Reaped::default());
        assert!(!first.contains("again"), "{first}");
    }
}
