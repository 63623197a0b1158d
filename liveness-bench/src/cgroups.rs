//! Session cgroups (docs/cgroups.md): what a cgroup costs a registration, and how fast
//! `end` with `terminate` clears a tree by its cgroup against the pidfd reaper alone.
//!
//! - Registration: fresh owners registered with `cgroup: {}` and without, in pairs whose
//!   order alternates (ABBA), on one connection; the request's round trip.
//! - Termination: a tree of an owner and its orphans (reparented members, which the reaper
//!   signals while the owner lives; they ignore SIGTERM, so a SIGKILL is what ends them),
//!   ended by `end` with `terminate` and a grace of 0, once in a session with a cgroup
//!   (`status.cgroup.termination`: `cgroup.kill`, freeze on 5.2 to 5.13, or systemd's
//!   `KillUnit`) and once without (the reaper's signals alone), alternately: the time from
//!   the request until the last orphan's pidfd is readable. The reaper spares a live
//!   owner, the cgroup does not: the owner is left out of the time, and its fate checked.
//!
//! - Moves: one process moved between two cgroups by writes to `cgroup.procs`, each write
//!   timed: with no daemon running (before it starts and after it stops), and with the
//!   daemon's moves program attached (`bpf/cgroup_attach.c`), for a process it does not
//!   track and for a session's owner (whose moves it reports). Only against a daemon of
//!   its own: a running one's program cannot be taken away for the baseline.
//!
//! Against its own daemon, or one already running (`--socket`: the systemd guest's unit).
//! Where the daemon has no usable cgroup2 (`status.cgroup.usable` false), it says so and
//! measures nothing.

use std::io::BufRead;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use integration_tests::{Conn, Fingerprint, eventually};
use liveness_proc::mountinfo::cgroup2_mounts;
use serde_json::{Value, json};

use crate::Dist;
use crate::daemon;
use crate::procs::{Owners, Tree, TreeShape, monotonic_ns};
use crate::versus::Ratio;

/// How long the harness waits for the daemon (a tree's members listed, the last process
/// gone, `session.reaped`) before calling the run broken.
const PATIENCE: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
pub struct CgroupsPlan {
    /// Registrations of each kind.
    pub registrations: usize,
    /// Processes per tree, the owner included.
    pub tree: usize,
    /// Trees ended of each kind.
    pub rounds: usize,
    /// Moves of a process between two cgroups, in each of the four runs.
    pub moves: usize,
}

/// Runs the plan against the daemon at `socket`, or else one of `bin_dir` started for it;
/// harness failures (a session with or without a cgroup against the request, a process
/// left) go to `errors`.
pub fn run(
    bin_dir: &Path,
    socket: Option<&Path>,
    plan: CgroupsPlan,
    errors: &mut Vec<String>,
) -> Result<Value> {
    raise_open_files(plan.tree)?;
    match socket {
        Some(socket) => measure(socket, plan, errors),
        None => {
            let mut mover = Mover::start(plan.moves)?;
            let before = mover.as_mut().map(Mover::run).transpose()?;
            let mut daemon = daemon::start(bin_dir, "auto", &[])?;
            let measured = measure(&daemon.socket, plan, errors).and_then(|mut report| {
                if let (Some(mover), Some(before), true) =
                    (mover.as_mut(), before, report["skipped"].is_null())
                {
                    let untracked = mover.run()?;
                    let tracked = mover.tracked(&daemon.socket)?;
                    daemon::stop(&mut daemon)?;
                    let after = mover.run()?;
                    report["moves"] = moves_report(plan.moves, [before, after], untracked, tracked);
                    println!("cgroups moves: {}", report["moves"]);
                }
                Ok(report)
            });
            if daemon.is_running() {
                daemon::stop(&mut daemon)?;
            }
            measured
        }
    }
}

/// A process moved between two cgroups of its own (`liveness-bench-moves-a` and `-b` at
/// the root of the cgroup2 hierarchy), each move a write of its pid to `cgroup.procs`.
struct Mover {
    process: std::process::Child,
    cgroups: [std::path::PathBuf; 2],
    moves: usize,
}

impl Mover {
    /// The mover and its cgroups; `None` on a host without a writable cgroup2 mount (the
    /// part then says it measured nothing).
    fn start(moves: usize) -> Result<Option<Mover>> {
        let Some(mount) = cgroup2_mount()? else {
            return Ok(None);
        };
        let cgroups = ["a", "b"].map(|n| mount.join(format!("liveness-bench-moves-{n}")));
        for cgroup in &cgroups {
            if let Err(e) = std::fs::create_dir(cgroup)
                && e.kind() != std::io::ErrorKind::AlreadyExists
            {
                println!(
                    "cgroups moves: not measured, cannot make {}: {e}",
                    cgroup.display()
                );
                return Ok(None);
            }
        }
        let process = std::process::Command::new("sleep").arg("600").spawn()?;
        let mover = Mover {
            process,
            cgroups,
            moves,
        };
        // A hierarchy that takes no process (a hybrid host's may not): nothing measured.
        let procs = mover.cgroups[0].join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, mover.process.id().to_string()) {
            println!(
                "cgroups moves: not measured, cannot write {}: {e}",
                procs.display()
            );
            return Ok(None);
        }
        Ok(Some(mover))
    }

    /// Each move's time, in nanoseconds.
    fn run(&mut self) -> Result<Vec<u64>> {
        let pid = self.process.id().to_string();
        let mut took = Vec::with_capacity(self.moves);
        for i in 0..self.moves {
            let procs = self.cgroups[i % 2].join("cgroup.procs");
            let started = Instant::now();
            std::fs::write(&procs, &pid).with_context(|| format!("writing {}", procs.display()))?;
            took.push(started.elapsed().as_nanos() as u64);
        }
        Ok(took)
    }

    /// [`Mover::run`] with the process a session's owner, whose moves the daemon's program
    /// reports; the session ends with it.
    fn tracked(&mut self, socket: &Path) -> Result<Vec<u64>> {
        let mut conn = Conn::connect(socket);
        let session = format!("cgmove-{}", std::process::id());
        let reply = conn.request(json!({
            "op": "register", "session": session, "owner": {"pid": self.process.id()},
        }));
        if reply["ok"] != true {
            bail!("register {session}: {reply}");
        }
        let took = self.run()?;
        conn.request(json!({"op": "end", "session": session}));
        Ok(took)
    }
}

impl Drop for Mover {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        for cgroup in &self.cgroups {
            // Removable once the kernel has let the dead process go.
            let _ = eventually(Duration::from_secs(5), || {
                std::fs::remove_dir(cgroup).is_ok()
            });
        }
    }
}

/// The cgroup2 mount point of `/proc/self/mountinfo`, if there is one.
fn cgroup2_mount() -> Result<Option<std::path::PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mounts = cgroup2_mounts(&mountinfo)?;
    Ok(mounts.into_iter().next().map(|m| m.mount_point))
}

/// The moves' figures: the baseline (no daemon: before its start and after its stop)
/// against a process the program does not track and a session's owner.
fn moves_report(
    count: usize,
    without: [Vec<u64>; 2],
    untracked: Vec<u64>,
    tracked: Vec<u64>,
) -> Value {
    let without = without.concat();
    json!({
        "count": count,
        "without_daemon": Dist::of_ns(&without).json(),
        "untracked": Dist::of_ns(&untracked).json(),
        "tracked": Dist::of_ns(&tracked).json(),
        "ratio_untracked_p50": Ratio::of_latencies(&untracked, &without, |d| d.p50).json(),
        "ratio_tracked_p50": Ratio::of_latencies(&tracked, &without, |d| d.p50).json(),
    })
}

fn measure(socket: &Path, plan: CgroupsPlan, errors: &mut Vec<String>) -> Result<Value> {
    let mut conn = Conn::connect(socket);
    let status = conn.request(json!({"op": "status"}));
    let cgroup = status["status"]["cgroup"].clone();
    if cgroup["usable"] != true {
        let reason = cgroup["reason"]
            .as_str()
            .unwrap_or("the daemon's status gives no reason");
        // The test guests mount one: there, none is a failure, not a skip.
        if std::env::var("LIVENESS_REQUIRE_CGROUP2").as_deref() == Ok("1") {
            bail!("LIVENESS_REQUIRE_CGROUP2=1 but the daemon has no usable cgroup2: {reason}");
        }
        println!("cgroups: SKIPPED, the daemon has no usable cgroup2 here: {reason}");
        return Ok(json!({"skipped": reason, "status": cgroup}));
    }
    let manager = cgroup["manager"].as_str().unwrap_or("?").to_owned();
    let method = cgroup["termination"].as_str().unwrap_or("?").to_owned();
    // Session ids of their own: the daemon may be a shared one (the systemd guest's).
    let run_id = format!("{}-{}", std::process::id(), monotonic_ns() / 1_000_000);

    let (with, without) = registrations(&mut conn, &run_id, plan.registrations, errors)?;
    let (with_dist, without_dist) = (Dist::of_ns(&with), Dist::of_ns(&without));
    let (p50, p99) = (
        Ratio::of_latencies(&with, &without, |d| d.p50),
        Ratio::of_latencies(&with, &without, |d| d.p99),
    );
    println!(
        "cgroups register ({manager}): {} each; with a cgroup p50 {:.0} us, p99 {:.0} us; \
         without p50 {:.0} us, p99 {:.0} us; with / without p50 {}, p99 {}",
        plan.registrations,
        with_dist.p50,
        with_dist.p99,
        without_dist.p50,
        without_dist.p99,
        p50.show(),
        p99.show(),
    );

    let (by_cgroup, by_reaper) = terminations(&mut conn, socket, &run_id, plan, errors)?;
    let series = |ended: &[Ended], of: fn(&Ended) -> u64| ended.iter().map(of).collect::<Vec<_>>();
    let after_reply = |e: &Ended| e.gone.saturating_sub(e.reply);
    let (cgroup_gone, reaper_gone) = (
        series(&by_cgroup, |e| e.gone),
        series(&by_reaper, |e| e.gone),
    );
    let (cgroup_after, reaper_after) = (
        series(&by_cgroup, after_reply),
        series(&by_reaper, after_reply),
    );
    let (cgroup_dist, reaper_dist) = (Dist::of_ns(&cgroup_gone), Dist::of_ns(&reaper_gone));
    let gone = Ratio::of_latencies(&cgroup_gone, &reaper_gone, |d| d.p50);
    let after = Ratio::of_latencies(&cgroup_after, &reaper_after, |d| d.p50);
    println!(
        "cgroups end --terminate of {} processes, grace 0, {} rounds each: last member gone \
         p50 {:.1} ms by the cgroup ({method}), {:.1} ms by the reaper; cgroup / reaper {}; \
         from the end's reply on {}",
        plan.tree,
        plan.rounds,
        cgroup_dist.p50 / 1e3,
        reaper_dist.p50 / 1e3,
        gone.show(),
        after.show(),
    );
    Ok(json!({
        "manager": manager,
        "termination": method,
        "cgroup_kill": cgroup["kill"],
        "register": {
            "count": plan.registrations,
            "with_cgroup": with_dist.json(),
            "without": without_dist.json(),
            "ratio_p50": p50.json(),
            "ratio_p99": p99.json(),
        },
        "terminate": {
            "processes": plan.tree,
            "grace_ms": 0,
            "rounds": plan.rounds,
            "by_cgroup": cgroup_dist.json(),
            "by_reaper": reaper_dist.json(),
            "ratio_p50": gone.json(),
            "reply": {
                "by_cgroup": Dist::of_ns(&series(&by_cgroup, |e| e.reply)).json(),
                "by_reaper": Dist::of_ns(&series(&by_reaper, |e| e.reply)).json(),
            },
            "after_reply": {
                "by_cgroup": Dist::of_ns(&cgroup_after).json(),
                "by_reaper": Dist::of_ns(&reaper_after).json(),
                "ratio_p50": after.json(),
            },
        },
    }))
}

/// Whether the `round`-th pair registers its owner with a cgroup first: ABBA, so that
/// neither kind is always the one that follows the other.
fn cgroup_first(round: usize) -> bool {
    matches!(round % 4, 0 | 3)
}

/// `count` fresh owners registered with `cgroup: {}` and as many without, in pairs;
/// returns the round trips in nanoseconds (with, without), in the order taken.
fn registrations(
    conn: &mut Conn,
    run_id: &str,
    count: usize,
    errors: &mut Vec<String>,
) -> Result<(Vec<u64>, Vec<u64>)> {
    let owners = Owners::spawn(2 * count)?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut sessions = Vec::new();
    for (round, pair) in owners.pids.chunks_exact(2).enumerate() {
        for (slot, &pid) in pair.iter().enumerate() {
            let cgroup = cgroup_first(round) == (slot == 0);
            let session = format!("cgreg-{run_id}-{pid}");
            let mut request = json!({"op": "register", "session": session, "owner": {"pid": pid}});
            if cgroup {
                request["cgroup"] = json!({});
            }
            let started = Instant::now();
            let reply = conn.request(request);
            let took = started.elapsed().as_nanos() as u64;
            check_registered(&session, &reply, cgroup)?;
            if cgroup && reply["warnings"].as_array().is_some_and(|w| !w.is_empty()) {
                errors.push(format!("register {session}: warned {}", reply["warnings"]));
            }
            if cgroup { &mut with } else { &mut without }.push(took);
            sessions.push(session);
        }
    }
    // The owners exit; their sessions end, and their cgroups go, before the trees start.
    drop(owners);
    for session in &sessions {
        if !eventually(PATIENCE, || {
            conn.request(json!({"op": "get", "session": session}))["session"]["phase"] == "ended"
        }) {
            bail!("{session} did not end once its owner exited");
        }
    }
    Ok((with, without))
}

/// A registration's reply: ok, and with a cgroup exactly when one was asked for (a host
/// where it was not given would make the figures a lie).
fn check_registered(session: &str, reply: &Value, cgroup: bool) -> Result<()> {
    if reply["ok"] != true {
        bail!("register {session}: {reply}");
    }
    if reply["session"]["cgroup"].is_object() != cgroup {
        bail!("register {session}: a cgroup was asked for: {cgroup}; the reply: {reply}");
    }
    Ok(())
}

/// `plan.rounds` trees ended by the cgroup and as many by the reaper, alternately (ABBA),
/// in the order taken (by cgroup, by reaper).
fn terminations(
    conn: &mut Conn,
    socket: &Path,
    run_id: &str,
    plan: CgroupsPlan,
    errors: &mut Vec<String>,
) -> Result<(Vec<Ended>, Vec<Ended>)> {
    let (mut by_cgroup, mut by_reaper) = (Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        for slot in 0..2 {
            let cgroup = cgroup_first(round) == (slot == 0);
            let session = format!(
                "cgend-{run_id}-{round}-{}",
                if cgroup { "cg" } else { "reaper" }
            );
            let ended = end_tree(conn, socket, &session, plan.tree, cgroup, errors)?;
            if cgroup {
                &mut by_cgroup
            } else {
                &mut by_reaper
            }
            .push(ended);
        }
    }
    Ok((by_cgroup, by_reaper))
}

/// One tree of `processes` (its owner and its orphans) registered with a grace of 0, with
/// a cgroup or not, and ended with `terminate`.
fn end_tree(
    conn: &mut Conn,
    socket: &Path,
    session: &str,
    processes: usize,
    cgroup: bool,
    errors: &mut Vec<String>,
) -> Result<Ended> {
    let mut tree = Tree::spawn(TreeShape {
        orphans: processes - 1,
        ..TreeShape::default()
    })?;
    let mut request = json!({
        "op": "register", "session": session, "owner": {"pid": tree.owner.pid}, "grace_ms": 0,
    });
    if cgroup {
        request["cgroup"] = json!({});
    }
    check_registered(session, &conn.request(request), cgroup)?;
    tree.grow()?;
    // The daemon follows the forks off the engine: the whole tree, before it is ended.
    let listed = |conn: &mut Conn| {
        let reply = conn.request(json!({"op": "processes", "session": session, "limit": 10_000}));
        reply["processes"].as_array().map_or(0, Vec::len)
    };
    if !eventually(PATIENCE, || listed(conn) == processes) {
        bail!(
            "{session}: the daemon lists {} processes, not the owner and its {} orphans",
            listed(conn),
            tree.orphans.len()
        );
    }
    let orphans = tree
        .orphans
        .iter()
        .map(open_pidfd)
        .collect::<Result<Vec<_>>>()?;
    let owner = open_pidfd(&tree.owner)?;
    let mut stream = daemon::subscribe(socket)?;
    stream.get_ref().set_read_timeout(Some(PATIENCE))?;
    let asked = monotonic_ns();
    let reply = conn.request(json!({"op": "end", "session": session, "terminate": true}));
    let replied = monotonic_ns();
    if reply["ok"] != true {
        bail!("end {session}: {reply}");
    }
    let last_gone = wait_exited(orphans)?;
    // The cgroup takes the owner too; the reaper spares a live owner (docs/protocol.md).
    let owner_gone = eventually(Duration::from_secs(if cgroup { 30 } else { 0 }), || {
        exited(&owner)
    });
    if owner_gone != cgroup {
        errors.push(format!(
            "{session}: the owner is {} after end --terminate {} a cgroup",
            if owner_gone { "gone" } else { "alive" },
            if cgroup { "with" } else { "without" },
        ));
    }
    wait_reaped(&mut stream, session)?;
    Ok(Ended {
        reply: replied - asked,
        gone: last_gone - asked,
    })
}

/// The times of one tree's end, in nanoseconds from the request: its reply (the end
/// committed, its survivors listed), and the last orphan gone.
#[derive(Debug, Clone, Copy)]
struct Ended {
    reply: u64,
    gone: u64,
}

/// A pidfd of the process, checked to be the one its fingerprint names.
fn open_pidfd(process: &Fingerprint) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, process.pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("pidfd_open {}", process.pid));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if !process.is_running() {
        bail!("process {} is gone before its tree was ended", process.pid);
    }
    Ok(fd)
}

/// Whether the pidfd's process has exited (a pidfd is readable from then on), after
/// waiting up to `timeout_ms` for it.
fn exited_within(pidfd: &OwnedFd, timeout_ms: i32) -> bool {
    let mut fd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes the one pollfd we own.
    unsafe { libc::poll(&mut fd, 1, timeout_ms) > 0 }
}

fn exited(pidfd: &OwnedFd) -> bool {
    exited_within(pidfd, 0)
}

/// Waits until every pidfd is readable; returns CLOCK_MONOTONIC when the last one was.
/// One at a time: once the one waited for is gone, those gone before it answer at once,
/// so a tree costs a poll per process, not a poll of the whole set per death (which,
/// for 1,000 processes dying one by one, would be the harness's own CPU against theirs).
fn wait_exited(pidfds: Vec<OwnedFd>) -> Result<u64> {
    let deadline = Instant::now() + PATIENCE;
    for (done, pidfd) in pidfds.iter().enumerate() {
        while !exited_within(pidfd, 100) {
            if Instant::now() > deadline {
                bail!(
                    "{} processes still run after {PATIENCE:?}",
                    pidfds.len() - done
                );
            }
        }
    }
    Ok(monotonic_ns())
}

/// Reads the event stream up to the session's `session.reaped`.
fn wait_reaped(stream: &mut impl BufRead, session: &str) -> Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if stream
            .read_line(&mut line)
            .with_context(|| format!("waiting for {session}'s session.reaped"))?
            == 0
        {
            bail!("the daemon closed the stream");
        }
        let message: Value = serde_json::from_str(&line)?;
        let event = &message["event"];
        if event["session"] == session && event["kind"] == "session.reaped" {
            return Ok(());
        }
    }
}

/// The soft limit of open files raised to the hard one: a tree's pidfds are one each.
fn raise_open_files(needed: usize) -> Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrlimit(RLIMIT_NOFILE)");
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setrlimit(RLIMIT_NOFILE)");
    }
    if (limit.rlim_max as usize) < needed + 100 {
        bail!(
            "RLIMIT_NOFILE's hard limit {} is too low for a pidfd of each of {needed} processes",
            limit.rlim_max
        );
    }
    Ok(())
}

/// The part's lines of the table: each ratio with its spread, or why there is none.
pub fn table(report: &Value) -> Vec<String> {
    if let Some(reason) = report["skipped"].as_str() {
        return vec![format!(
            "  skipped: the daemon has no usable cgroup2 here ({reason})"
        )];
    }
    let ms = |dist: &Value, key: &str| dist[key].as_f64().unwrap_or(0.0) / 1e3;
    let ratio = |r: &Value| {
        format!(
            "{:.2} ({:.2}..{:.2})",
            r["ratio"].as_f64().unwrap_or(0.0),
            r["min"].as_f64().unwrap_or(0.0),
            r["max"].as_f64().unwrap_or(0.0)
        )
    };
    let (register, terminate) = (&report["register"], &report["terminate"]);
    vec![
        format!(
            "  register, cgroups made by {}: with a cgroup p50 {:.2} ms p99 {:.2} ms, without \
             p50 {:.2} ms p99 {:.2} ms ({} each)",
            report["manager"].as_str().unwrap_or("?"),
            ms(&register["with_cgroup"], "p50_us"),
            ms(&register["with_cgroup"], "p99_us"),
            ms(&register["without"], "p50_us"),
            ms(&register["without"], "p99_us"),
            register["count"],
        ),
        format!(
            "  register with / without: p50 {}, p99 {}",
            ratio(&register["ratio_p50"]),
            ratio(&register["ratio_p99"]),
        ),
        format!(
            "  end --terminate of {} processes (grace 0, {} rounds each), last one gone: by the \
             cgroup ({}) p50 {:.1} ms, by the reaper p50 {:.1} ms; cgroup / reaper {}",
            terminate["processes"],
            terminate["rounds"],
            report["termination"].as_str().unwrap_or("?"),
            ms(&terminate["by_cgroup"], "p50_us"),
            ms(&terminate["by_reaper"], "p50_us"),
            ratio(&terminate["ratio_p50"]),
        ),
        format!(
            "  of which the end's reply (its survivors listed, committed): p50 {:.1} ms, {:.1} \
             ms; from the reply to the last one gone: p50 {:.1} ms, {:.1} ms; cgroup / reaper {}",
            ms(&terminate["reply"]["by_cgroup"], "p50_us"),
            ms(&terminate["reply"]["by_reaper"], "p50_us"),
            ms(&terminate["after_reply"]["by_cgroup"], "p50_us"),
            ms(&terminate["after_reply"]["by_reaper"], "p50_us"),
            ratio(&terminate["after_reply"]["ratio_p50"]),
        ),
    ]
    .into_iter()
    .chain(report["moves"].is_object().then(|| {
        let moves = &report["moves"];
        let us = |dist: &Value| dist["p50_us"].as_f64().unwrap_or(0.0);
        format!(
            "  a process moved between two cgroups ({} moves each): p50 {:.1} us with no daemon, \
             {:.1} us untracked, {:.1} us a session's owner, with the moves program; \
             untracked / none {}, owner / none {}",
            moves["count"],
            us(&moves["without_daemon"]),
            us(&moves["untracked"]),
            us(&moves["tracked"]),
            ratio(&moves["ratio_untracked_p50"]),
            ratio(&moves["ratio_tracked_p50"]),
        )
    }))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_alternate_abba_so_each_kind_leads_as_often() {
        let firsts: Vec<bool> = (0..8).map(cgroup_first).collect();
        assert_eq!(firsts, [true, false, false, true, true, false, false, true]);
        for n in [4, 8, 200] {
            let leads = (0..n).filter(|&r| cgroup_first(r)).count();
            assert_eq!(leads * 2, n, "{n} rounds");
        }
    }

    #[test]
    fn a_reply_without_the_cgroup_asked_for_is_refused() {
        let with = json!({"ok": true, "session": {"cgroup": {"path": "/x"}}});
        let without = json!({"ok": true, "session": {"cgroup": null}});
        check_registered("s", &with, true).unwrap();
        check_registered("s", &without, false).unwrap();
        let error = check_registered("s", &without, true)
            .unwrap_err()
            .to_string();
        assert!(error.contains("asked for: true"), "{error}");
        assert!(check_registered("s", &with, false).is_err());
        assert!(check_registered("s", &json!({"ok": false}), false).is_err());
    }

    #[test]
    fn the_table_says_why_it_measured_nothing() {
        let skipped = json!({"skipped": "the cgroup2 hierarchy at /sys/fs/cgroup/unified has no memory or pids controller"});
        let lines = table(&skipped);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("skipped") && lines[0].contains("unified"),
            "{lines:?}"
        );
    }

    #[test]
    fn the_table_shows_the_ratios_and_the_method() {
        let dist = |p50: f64| json!({"p50_us": p50, "p99_us": p50 * 2.0});
        let ratio = json!({"ratio": 1.5, "min": 1.25, "max": 1.75});
        let report = json!({
            "manager": "cgroupfs", "termination": "kill",
            "register": {"count": 200, "with_cgroup": dist(1500.0), "without": dist(1000.0),
                         "ratio_p50": ratio, "ratio_p99": ratio},
            "terminate": {"processes": 1000, "rounds": 5, "by_cgroup": dist(20_000.0),
                          "by_reaper": dist(80_000.0), "ratio_p50": {"ratio": 0.25, "min": 0.2, "max": 0.3},
                          "reply": {"by_cgroup": dist(10_000.0), "by_reaper": dist(10_000.0)},
                          "after_reply": {"by_cgroup": dist(10_000.0), "by_reaper": dist(70_000.0),
                                          "ratio_p50": {"ratio": 0.14, "min": 0.1, "max": 0.2}}},
            "moves": moves_report(4, [vec![10_000, 10_000], vec![10_000, 10_000]],
                                  vec![11_000; 4], vec![20_000; 4]),
        });
        let text = table(&report).join("\n");
        assert!(
            text.contains("with a cgroup p50 1.50 ms p99 3.00 ms"),
            "{text}"
        );
        assert!(text.contains("p50 1.50 (1.25..1.75)"), "{text}");
        assert!(text.contains("by the cgroup (kill) p50 20.0 ms"), "{text}");
        assert!(text.contains("cgroup / reaper 0.25 (0.20..0.30)"), "{text}");
        assert!(
            text.contains("to the last one gone: p50 10.0 ms, 70.0 ms; cgroup / reaper 0.14"),
            "{text}"
        );
        assert!(
            text.contains("(4 moves each): p50 10.0 us with no daemon, 11.0 us untracked, 20.0 us"),
            "{text}"
        );
        assert!(text.contains("untracked / none 1.10"), "{text}");
        assert!(text.contains("owner / none 2.00"), "{text}");
    }
}
