//! Replay at start: a daemon killed after it journaled (and published) deaths but before
//! SQLite had them applies them at its next start, before it answers anyone. This part
//! leaves such a journal behind: sessions registered in a stopped daemon's database, their
//! endings journaled in entries of the engine's size, as the engine writes them. It then
//! times the start that replays them against the next start of the same state, with
//! nothing left to replay, and checks that the stream holds every ending once, in order.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::Identity;
use liveness_common::session::{EndReason, OnEnd, Until};
use liveness_daemon::{Active, NewSession, OwnerDeath, Store, journal, journal_deaths};
use liveness_proc::identity::ProcRoot;

use crate::Dist;
use crate::daemon::{self, Daemon};

/// Owner PIDs above the kernel's limit (`PID_MAX_LIMIT`, 2^22): no process can be one.
const NO_SUCH_PID: u32 = 1 << 23;

#[derive(Debug, Clone, Copy)]
pub struct ReplayPlan {
    /// Endings left unapplied in the journal, per round.
    pub records: usize,
    /// Endings per journal entry (one engine batch).
    pub per_entry: usize,
    pub rounds: usize,
}

/// Runs the plan on one daemon of `bin_dir`; a stream that misses or repeats an ending
/// goes to `errors`.
pub fn run(bin_dir: &Path, plan: ReplayPlan, errors: &mut Vec<String>) -> Result<Value> {
    // The pidfd source: its start is the cheapest, and no source has a part in a replay.
    let mut daemon = daemon::start(bin_dir, "pidfd", &[])?;
    let boot_id = ProcRoot::default().boot_id()?;
    let (mut replaying, mut idle, mut bytes) = (Vec::new(), Vec::new(), 0);
    for round in 0..plan.rounds {
        daemon::stop(&mut daemon)?;
        let (head, journal_bytes) = leave_a_journal(&daemon.state_dir, &boot_id, round, plan)?;
        bytes = journal_bytes;
        replaying.push(start_timed(&mut daemon)?.as_nanos() as u64);
        check_the_stream(&daemon, head, plan, errors)?;
        daemon::stop(&mut daemon)?;
        idle.push(start_timed(&mut daemon)?.as_nanos() as u64);
    }
    daemon::stop(&mut daemon)?;
    let (replaying, idle) = (Dist::of_ns(&replaying), Dist::of_ns(&idle));
    let per_record_us = (replaying.p50 - idle.p50) / plan.records as f64;
    println!(
        "replay: {} endings unapplied in {} journal entries ({:.1} MiB): start p50 {:.1} ms, \
         against {:.1} ms with nothing to replay ({} rounds): {:.1} us per ending",
        plan.records,
        plan.records.div_ceil(plan.per_entry),
        bytes as f64 / f64::from(1 << 20),
        replaying.p50 / 1e3,
        idle.p50 / 1e3,
        plan.rounds,
        per_record_us,
    );
    Ok(json!({
        "records": plan.records,
        "entries": plan.records.div_ceil(plan.per_entry),
        "journal_bytes": bytes,
        "start_replaying": replaying.json(),
        "start_with_nothing_to_replay": idle.json(),
        "us_per_record": crate::round(per_record_us),
    }))
}

/// Registers `plan.records` sessions in the stopped daemon's database and journals their
/// endings without applying them, as a daemon SIGKILLed after its publish leaves them.
/// Returns the head the database had before, and the journal's size.
fn leave_a_journal(
    state_dir: &Path,
    boot_id: &str,
    round: usize,
    plan: ReplayPlan,
) -> Result<(u64, u64)> {
    let mut store = Store::open(state_dir.join("liveness.db"))?;
    let now_ms = crate::wall_ms();
    let owners: Vec<Identity> = (0..plan.records)
        .map(|i| Identity {
            pid: NO_SUCH_PID + i as u32,
            start_ticks: 1 + round as u64,
            boot_id: boot_id.to_owned(),
            host: "bench".into(),
            pidfs_ino: None,
            comm: "agent".into(),
        })
        .collect();
    for (i, owner) in owners.iter().enumerate() {
        store.register(new_session(format!("replay-{round}-{i}"), owner), now_ms)?;
    }
    let active = Active::load(&store)?;
    let head = store.head_seq()?;
    drop(store);
    let (mut journal, left) = journal::Journal::open(state_dir)?;
    if !left.is_empty() {
        bail!(
            "a cleanly stopped daemon left {} journal entries",
            left.len()
        );
    }
    let mut seq = head;
    for owners in owners.chunks(plan.per_entry) {
        let deaths: Vec<OwnerDeath> = owners.iter().map(|owner| death(owner, now_ms)).collect();
        let batch = journal_deaths(&active, &deaths, now_ms + 1, seq)?;
        seq = batch.events.last().map_or(seq, |event| event.seq);
        journal.append(&batch.entry)?;
    }
    Ok((head, journal.entry_bytes()))
}

fn new_session(id: String, owner: &Identity) -> NewSession {
    NewSession {
        id,
        owner: owner.clone(),
        pending: false,
        pending_expires_ms: None,
        creator_uid: 0,
        labels: BTreeMap::from([("tool".into(), "bench".into())]),
        on_end: OnEnd::Leave,
        grace_ms: 1000,
        until: Until::Owner,
        on_end_run: None,
        on_stall: None,
        cgroup: None,
        creator_gid: None,
    }
}

fn death(owner: &Identity, now_ms: i64) -> OwnerDeath {
    OwnerDeath {
        owner: owner.clone(),
        reason: EndReason::OwnerExited,
        exit: Some(ExitStatus::Exited { code: 0 }),
        detected_by: DetectedBy::Ebpf,
        observed_ms: now_ms,
        died_ms: Some(now_ms),
        survivors: None,
        cause: None,
        usage: None,
        sender_root: None,
        tree_cgroups: Default::default(),
    }
}

/// From the daemon's spawn to its first `status` answer (it answers once the journal is
/// applied and the ACTIVE sessions reconciled).
fn start_timed(daemon: &mut Daemon) -> Result<Duration> {
    let started = Instant::now();
    daemon.restart();
    daemon::ready(daemon)?;
    Ok(started.elapsed())
}

/// The stream after `head` holds each journaled ending once, in seq order, and the
/// database has each session ended.
fn check_the_stream(
    daemon: &Daemon,
    head: u64,
    plan: ReplayPlan,
    errors: &mut Vec<String>,
) -> Result<()> {
    let mut stream = integration_tests::subscribe(daemon, Some(head));
    let (mut sessions, mut last) = (HashSet::new(), head);
    for _ in 0..plan.records {
        let event = integration_tests::next_event(&mut stream);
        let seq = event["seq"].as_u64().context("an event without a seq")?;
        if seq <= last {
            errors.push(format!("replay: event {seq} came after {last}"));
        }
        last = seq;
        if event["kind"] != "session.ended" {
            errors.push(format!("replay: not an ending: {event}"));
        }
        let session = event["session"].as_str().unwrap_or_default().to_owned();
        if !sessions.insert(session.clone()) {
            errors.push(format!("replay: {session} ended twice"));
        }
    }
    let any = sessions.iter().next().cloned().unwrap_or_default();
    let stored = daemon.session(&any);
    if stored["phase"] != "ended" {
        errors.push(format!(
            "replay: {any} is not ended in the database: {stored}"
        ));
    }
    Ok(())
}
