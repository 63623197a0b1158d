//! The fleet (`--etcd`, docs/fleet.md) against a real etcd on loopback: a fleet lock handed
//! from a session on host A, whose owner is SIGKILLed, to a waiter on host B, next to
//! etcd's own lock (`etcdctl lock --ttl 10`, its holder SIGKILLed) in the same run; and a
//! victim's local death latency with `--etcd` against a daemon without it, which the
//! mirror must not delay; a session's end on host A as host B's fleet watch sees it; and
//! the mirror's throughput: many registrations and ends on one host, the time until etcd
//! holds the final state, and the daemon's CPU per event with and without `--etcd`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use integration_tests::{Daemon, Etcd, eventually};
use serde_json::{Value, json};

use crate::activity::victim_death;
use crate::daemon;
use crate::procs::{Tree, TreeShape, monotonic_ns};
use crate::{Dist, round};

#[derive(Debug, Clone, Copy)]
pub struct FleetPlan {
    /// Hand-overs between two daemons.
    pub rounds: usize,
    /// Hand-overs of etcd's own lock: each waits for the 10 s TTL, so they run side by
    /// side, each on a lock of its own.
    pub etcd_rounds: usize,
    /// Victim deaths timed per daemon, with and without `--etcd`.
    pub deaths: usize,
    /// Sessions ended on host A, each timed until host B's fleet watch reports it.
    pub watched_ends: usize,
    /// Sessions registered then ended on one host, for the mirror's throughput.
    pub burst: usize,
}

/// The pause after the mirror caught up before a victim dies (see [`caught_up`]).
const STEADY: Duration = Duration::from_millis(50);
/// How long one hand-over may take before the harness gives up.
const HANDOVER_LIMIT: Duration = Duration::from_secs(30);

pub fn run(bin_dir: &std::path::Path, plan: FleetPlan) -> Result<Value> {
    if Command::new("etcd").arg("--version").output().is_err() {
        bail!("the fleet part needs etcd and etcdctl (Debian: etcd-server, etcd-client)");
    }
    let etcd = Etcd::started();
    let url = etcd.url();
    let host = |id: &str| {
        let args = ["--etcd", url.as_str(), "--host-id", id, "--etcd-ttl", "10s"];
        daemon::start(bin_dir, "auto", &args)
    };
    let (mut a, mut b) = (host("bench-a")?, host("bench-b")?);
    let handovers = (0..plan.rounds)
        .map(|n| handover(&etcd, &a, &b, n))
        .collect::<Result<Vec<_>>>()?;
    let handover = Dist::of_ns(&handovers);
    let etcd_lock = Dist::of_ns(&etcdctl_handovers(&etcd, plan.etcd_rounds)?);
    println!(
        "fleet lock, holder's owner SIGKILLed on host A -> granted on host B: p50 {:.1} ms, p99 {:.1} ms ({} rounds); etcdctl lock --ttl 10: p50 {:.0} ms ({} rounds)",
        handover.p50 / 1e3,
        handover.p99 / 1e3,
        plan.rounds,
        etcd_lock.p50 / 1e3,
        plan.etcd_rounds,
    );
    let watched = Dist::of_ns(&watched_ends(&a, &b, plan.watched_ends)?);
    println!(
        "a session's end on host A -> `ended` in host B's fleet watch: p50 {:.1} ms, p99 {:.1} ms ({} ends)",
        watched.p50 / 1e3,
        watched.p99 / 1e3,
        plan.watched_ends,
    );
    daemon::stop(&mut b)?;

    // The same victims, alternately, on a daemon in the fleet and one without it.
    let mut alone = daemon::start(bin_dir, "auto", &[])?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for n in 0..plan.deaths {
        with.push(victim_death(&a, &format!("victim-etcd-{n}"), caught_up)?);
        without.push(victim_death(&alone, &format!("victim-{n}"), caught_up)?);
    }
    let (with, without) = (Dist::of_ns(&with), Dist::of_ns(&without));
    let ratio = (without.p50 > 0.0).then(|| round(with.p50 / without.p50));
    println!(
        "a victim's death -> session.ended: with --etcd p50 {:.0} us p99 {:.0} us, without p50 {:.0} us p99 {:.0} us ({} deaths each)",
        with.p50, with.p99, without.p50, without.p99, plan.deaths
    );
    let mirrored = burst(&a, "burst-etcd", plan.burst)?;
    let local = burst(&alone, "burst", plan.burst)?;
    println!(
        "{} registrations and ends on one host: etcd holds the final state {:.2} s after the first (the last reply after {:.2} s); the daemon's CPU per event {:.1} us with --etcd, {:.1} us without",
        plan.burst,
        mirrored.done_s,
        mirrored.replied_s,
        mirrored.cpu_us_per_event,
        local.cpu_us_per_event,
    );
    daemon::stop(&mut a)?;
    daemon::stop(&mut alone)?;
    let speedup = (handover.p50 > 0.0).then(|| round(etcd_lock.p50 / handover.p50));
    Ok(json!({
        "rounds": plan.rounds,
        "handover": handover.json(),
        "etcd_lock_ttl_10s": etcd_lock.json(),
        "handover_p50_speedup_vs_etcd_lock": speedup,
        "death_to_ended": {"with_etcd": with.json(), "without": without.json()},
        "death_p50_with_vs_without_etcd": ratio,
        "end_to_watcher_on_b": watched.json(),
        "burst": {
            "sessions": plan.burst,
            "with_etcd": mirrored.json(),
            "without": local.json(),
        },
    }))
}

/// Each of `rounds` sessions on `a`, once `b`'s fleet watch has seen it, has its owner
/// SIGKILLed: nanoseconds from the kill to the `ended` change as `b`'s client reads it
/// (A ends it, its mirror deletes the key and writes the end in one transaction, etcd's
/// watch wakes B's daemon, which sends the change).
fn watched_ends(a: &Daemon, b: &Daemon, rounds: usize) -> Result<Vec<u64>> {
    let mut watch = b.connect();
    watch.send_raw(b"{\"op\":\"fleet_watch\"}\n");
    let view = watch.next_within(HANDOVER_LIMIT);
    if view.as_ref().is_none_or(|view| view["ok"] != true) {
        bail!("fleet_watch on host B: {view:?}");
    }
    // The next change of `kind` about `session`, skipping the others.
    let mut next = |kind: &str, session: &str| -> Result<()> {
        loop {
            let line = watch
                .next_within(HANDOVER_LIMIT)
                .with_context(|| format!("no {kind} of {session} in B's watch"))?;
            let change = &line["fleet_change"];
            if change["change"] == kind && change["session"]["id"] == session {
                return Ok(());
            }
        }
    };
    let mut times = Vec::new();
    for n in 0..rounds {
        let session = format!("watched-{n}");
        let tree = Tree::spawn(TreeShape::default())?;
        let registered = a.request(json!({
            "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
        }));
        if registered["ok"] != true {
            bail!("register {session}: {registered}");
        }
        next("session", &session)?;
        let killed = monotonic_ns();
        tree.owner.kill();
        next("ended", &session)?;
        times.push(monotonic_ns() - killed);
    }
    Ok(times)
}

/// One host's burst: `sessions` registered then ended, one request after another on one
/// connection, all owned by one process.
struct Burst {
    /// From the first request to the last reply.
    replied_s: f64,
    /// From the first request until etcd holds the final state (the mirror's cursor at
    /// the last event); without `--etcd`, the last reply.
    done_s: f64,
    /// The daemon's CPU time (every thread, the mirror's too) until then, per event.
    cpu_us_per_event: f64,
}

impl Burst {
    fn json(&self) -> Value {
        json!({
            "replied_s": round(self.replied_s),
            "done_s": round(self.done_s),
            "cpu_us_per_event": round(self.cpu_us_per_event),
        })
    }
}

fn burst(daemon: &Daemon, prefix: &str, sessions: usize) -> Result<Burst> {
    let owner = Tree::spawn(TreeShape::default())?;
    caught_up(daemon)?;
    let mut conn = daemon.connect();
    let ticks = crate::procs::cpu_ticks(daemon.pid())?;
    let started = monotonic_ns();
    for op in ["register", "end"] {
        for n in 0..sessions {
            let session = format!("{prefix}-{n}");
            let request = match op {
                "register" => json!({
                    "op": op, "session": session, "owner": {"pid": owner.owner.pid},
                }),
                _ => json!({"op": op, "session": session}),
            };
            let reply = conn.request(request);
            if reply["ok"] != true {
                bail!("{op} {session}: {reply}");
            }
        }
    }
    let replied = monotonic_ns();
    // Polled on a connection of its own.
    let mut status = daemon.connect();
    let done = eventually(Duration::from_secs(600), || {
        let reply = status.request(json!({"op": "status"}));
        let cluster = &reply["status"]["cluster"];
        cluster.is_null() || (cluster["connected"] == true && cluster["behind"] == 0)
    });
    if !done {
        bail!("etcd did not have {sessions} sessions' ends within 600 s");
    }
    let finished = monotonic_ns();
    let cpu_ms = (crate::procs::cpu_ticks(daemon.pid())? - ticks) as f64 * 10.0;
    Ok(Burst {
        replied_s: (replied - started) as f64 / 1e9,
        done_s: (finished - started) as f64 / 1e9,
        cpu_us_per_event: cpu_ms * 1e3 / (2 * sessions) as f64,
    })
}

/// Waits until the daemon's mirror (if any) wrote every event into etcd: a victim's
/// registration sets the mirror off, and its death is timed once it is done, as a death
/// in a steady fleet. A daemon without `--etcd` is asked the same `status`.
fn caught_up(daemon: &Daemon) -> Result<()> {
    let done = eventually(HANDOVER_LIMIT, || {
        let status = daemon.request(json!({"op": "status"}));
        let cluster = &status["status"]["cluster"];
        cluster.is_null() || (cluster["connected"] == true && cluster["behind"] == 0)
    });
    if !done {
        bail!("the mirror did not catch up within {HANDOVER_LIMIT:?}");
    }
    // `behind` 0 is the mirror's write acknowledged; etcd's own work on it (its log,
    // the watchers it notifies) and the mirror's next step may still run: a steady fleet
    // has them done.
    std::thread::sleep(STEADY);
    Ok(())
}

/// One hand-over: a session on `a` holds fleet lock `handover-N`, a session on `b` waits
/// in line for it; the holder's owner is SIGKILLed. Nanoseconds from the kill to the
/// waiter's grant, as its client reads it.
fn handover(etcd: &Etcd, a: &Daemon, b: &Daemon, n: usize) -> Result<u64> {
    let name = format!("handover-{n}");
    let (holder, waiter) = (
        Tree::spawn(TreeShape::default())?,
        Tree::spawn(TreeShape::default())?,
    );
    for (daemon, session, tree) in [(a, "holder", &holder), (b, "waiter", &waiter)] {
        let session = format!("{session}-{n}");
        let registered = daemon.request(json!({
            "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
        }));
        if registered["ok"] != true {
            bail!("register {session}: {registered}");
        }
    }
    let acquire = |session: String, wait: bool| json!({"op": "lock_acquire", "name": name, "session": session, "cluster": true, "wait": wait});
    let held = a.request(acquire(format!("holder-{n}"), false));
    if held["ok"] != true {
        bail!("fleet lock {name} on host A: {held}");
    }
    let mut waiting = b.connect();
    waiting.send_raw(format!("{}\n", acquire(format!("waiter-{n}"), true)).as_bytes());
    let prefix = format!("/liveness/locks/{name}/");
    if !eventually(HANDOVER_LIMIT, || etcd.key_count(&prefix) == 2) {
        bail!("the waiter on host B never got in line for {name}");
    }
    let killed = monotonic_ns();
    holder.owner.kill();
    let granted = waiting
        .next_within(HANDOVER_LIMIT)
        .with_context(|| format!("no grant of {name} within {HANDOVER_LIMIT:?}"))?;
    let elapsed = monotonic_ns() - killed;
    if granted["ok"] != true {
        bail!("fleet lock {name} on host B: {granted}");
    }
    drop(waiter);
    Ok(elapsed)
}

/// `etcdctl lock --ttl 10 NAME`: its stdout, whose first line says it holds the lock.
fn etcdctl_lock(etcd: &Etcd, name: &str) -> Result<(Child, BufReader<std::process::ChildStdout>)> {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.url(), "lock", "--ttl", "10", name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting etcdctl lock")?;
    let stdout = BufReader::new(child.stdout.take().context("etcdctl's stdout")?);
    Ok((child, stdout))
}

/// etcd's own lock, `rounds` of them side by side, each on a name of its own: a holder
/// SIGKILLed, the time until its waiter says it holds the lock (its session's TTL).
fn etcdctl_handovers(etcd: &Etcd, rounds: usize) -> Result<Vec<u64>> {
    let mut pairs = Vec::new();
    for n in 0..rounds {
        let name = format!("etcd-lock-{n}");
        let (holder, mut held) = etcdctl_lock(etcd, &name)?;
        let mut line = String::new();
        held.read_line(&mut line).context("etcdctl lock's holder")?;
        let (waiter, waiting) = etcdctl_lock(etcd, &name)?;
        let queued = eventually(HANDOVER_LIMIT, || etcd.key_count(&format!("{name}/")) == 2);
        if !queued {
            bail!("etcdctl's waiter never got in line for {name}");
        }
        pairs.push((holder, waiter, waiting));
    }
    let killed = monotonic_ns();
    for (holder, _, _) in &mut pairs {
        holder.kill()?;
    }
    let mut times = Vec::new();
    for (mut holder, mut waiter, mut waiting) in pairs {
        let mut line = String::new();
        waiting
            .read_line(&mut line)
            .context("etcdctl lock's waiter")?;
        if line.is_empty() {
            bail!("etcdctl lock's waiter ended without the lock");
        }
        times.push(monotonic_ns() - killed);
        let _ = holder.wait();
        let _ = waiter.kill();
        let _ = waiter.wait();
    }
    Ok(times)
}
