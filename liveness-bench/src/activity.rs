//! What sampling sessions' activity costs: the daemon's CPU while it samples `sessions`
//! trees of `members` processes each, at the default interval and at 1 s, against sampling
//! once an hour (as good as off) on the same trees in the same run; and a victim's death
//! latency on each, which sampling must not delay.

use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::daemon::{self, Daemon};
use crate::procs::{self, Tree, TreeShape, monotonic_ns};
use crate::{Dist, round};

#[derive(Debug, Clone, Copy)]
pub struct ActivityPlan {
    pub sessions: usize,
    /// Processes per tree, its owner included.
    pub members: usize,
    /// How long the daemon's CPU is measured.
    pub window: Duration,
    /// Victim deaths timed per setting.
    pub deaths: usize,
}

/// The settings measured, by name, with their `--activity-interval`.
const SETTINGS: [(&str, &str); 3] = [("hourly", "1h"), ("default", "5s"), ("every_1s", "1s")];

/// Runs the plan; harness failures (a victim's end never read) are errors. With a
/// `baseline` build (one that samples), its CPU at the default interval is measured on
/// the same trees, right after the new build's, for the ratio.
pub fn run(bin_dir: &Path, baseline: Option<&Path>, plan: ActivityPlan) -> Result<Value> {
    let trees = (0..plan.sessions)
        .map(|_| {
            Tree::spawn(TreeShape {
                before: plan.members - 1,
                ..TreeShape::default()
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut settings = serde_json::Map::new();
    let mut versus_baseline = None;
    for (name, interval) in SETTINGS {
        let (mut daemon, percent) = sampling(bin_dir, interval, &trees, plan.window)?;
        if let (Some(base), "default") = (baseline, name) {
            let (mut base, base_percent) = sampling(base, interval, &trees, plan.window)?;
            daemon::stop(&mut base)?;
            println!("activity default on the baseline: daemon CPU {base_percent:.2} % of a core");
            versus_baseline = (base_percent > 0.0).then(|| {
                json!({"daemon_cpu_percent": round(base_percent), "ratio": round(percent / base_percent)})
            });
        }
        let deaths = (0..plan.deaths)
            .map(|n| victim_death(&daemon, &format!("victim-{n}"), |_| Ok(())))
            .collect::<Result<Vec<_>>>()?;
        let latency = Dist::of_ns(&deaths);
        println!(
            "activity {name} ({interval}): {} sessions of {} processes: daemon CPU {percent:.2} % of a core; a victim's death -> session.ended p50 {:.0} us, p99 {:.0} us",
            plan.sessions, plan.members, latency.p50, latency.p99
        );
        settings.insert(
            name.to_owned(),
            json!({
                "interval": interval,
                "daemon_cpu_percent": round(percent),
                "death_to_ended": latency.json(),
            }),
        );
        daemon::stop(&mut daemon)?;
    }
    let detection = detection_delays(bin_dir, plan.deaths.clamp(1, 2))?;
    let p50 = |name: &str| settings[name]["death_to_ended"]["p50_us"].as_f64();
    let ratio = match (p50("default"), p50("hourly")) {
        (Some(sampled), Some(quiet)) if quiet > 0.0 => Some(round(sampled / quiet)),
        _ => None,
    };
    Ok(json!({
        "sessions": plan.sessions,
        "members": plan.members,
        "window_s": plan.window.as_secs_f64(),
        "settings": settings,
        "death_p50_default_vs_hourly": ratio,
        "default_versus_baseline": versus_baseline,
        "detection": detection,
    }))
}

/// The stall threshold of the detection rounds: short, so that a round is seconds, and
/// no shorter than two intervals (progress within two samples is `working`).
const DETECTION_THRESHOLD: Duration = Duration::from_secs(12);

/// How long after a stall's threshold its `session.stalled` is read, at the default
/// interval: a quiet owner (a sleeping tree) with a turn declared, `rounds` times. The
/// goal is one interval at most.
fn detection_delays(bin_dir: &Path, rounds: usize) -> Result<Value> {
    let threshold = format!("{}s", DETECTION_THRESHOLD.as_secs());
    let daemon = daemon::start(bin_dir, "auto", &["--stall-after", &threshold])?;
    let mut late_ms = Vec::with_capacity(rounds);
    for n in 0..rounds {
        let session = format!("quiet-{n}");
        let tree = Tree::spawn(TreeShape::default())?;
        let registered = daemon.request(json!({
            "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
        }));
        if registered["ok"] != true {
            bail!("register {session}: {registered}");
        }
        let mut stream = daemon::subscribe(&daemon.socket)?;
        stream
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(60)))?;
        let declared = Instant::now();
        let touched = daemon.request(json!({"op": "touch", "session": session, "turn": "start"}));
        if touched["ok"] != true {
            bail!("touch {session}: {touched}");
        }
        let mut line = String::new();
        loop {
            line.clear();
            if stream.read_line(&mut line)? == 0 {
                bail!("the daemon closed the stream");
            }
            let message: Value = serde_json::from_str(&line)?;
            let event = &message["event"];
            if event["session"] == session && event["kind"] == "session.stalled" {
                break;
            }
        }
        let late = declared.elapsed().saturating_sub(DETECTION_THRESHOLD);
        late_ms.push(late.as_millis() as f64);
        println!(
            "activity detection: stalled {:.0} ms after the threshold",
            late.as_millis()
        );
    }
    let worst = late_ms.iter().copied().fold(0.0, f64::max);
    Ok(
        json!({"threshold_s": DETECTION_THRESHOLD.as_secs(), "interval_s": 5, "after_threshold_ms": late_ms, "worst_ms": worst}),
    )
}

/// A daemon of `bin_dir` sampling `trees` every `interval`, each registered as a session,
/// and the share of a core it used over `window`.
fn sampling(
    bin_dir: &Path,
    interval: &str,
    trees: &[Tree],
    window: Duration,
) -> Result<(Daemon, f64)> {
    let daemon = daemon::start(bin_dir, "auto", &["--activity-interval", interval])?;
    for (n, tree) in trees.iter().enumerate() {
        let session = format!("agent-{n}");
        let registered = daemon.request(json!({
            "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
        }));
        if registered["ok"] != true {
            bail!("register {session}: {registered}");
        }
    }
    // Every tree has had its first sample, which reads all of it, before the window opens:
    // the window measures the rounds that follow. (Hourly, the first round came before the
    // registrations, and the next is an hour away: nothing is sampled.)
    if interval == "1h" {
        std::thread::sleep(Duration::from_secs(1));
    }
    let judged = |daemon: &Daemon| {
        let status = daemon.request(json!({"op": "status"}));
        let counts = status["status"]["activity"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        counts.values().filter_map(Value::as_u64).sum::<u64>() >= trees.len() as u64
    };
    let settle = Instant::now();
    while interval != "1h" && !judged(&daemon) {
        if settle.elapsed() > Duration::from_secs(60) {
            bail!("the daemon never judged every session");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cpu_before = procs::cpu_ns(daemon.pid())?;
    let opened = Instant::now();
    std::thread::sleep(window);
    let cpu_ns = procs::cpu_ns(daemon.pid())? - cpu_before;
    let percent = cpu_ns as f64 / opened.elapsed().as_nanos() as f64 * 100.0;
    Ok((daemon, percent))
}

/// Registers a one-process tree as `session`, lets `settle` wait for what the registration
/// set off, SIGKILLs its owner and returns the nanoseconds from the kill to reading its
/// `session.ended`.
pub(crate) fn victim_death(
    daemon: &Daemon,
    session: &str,
    settle: impl Fn(&Daemon) -> Result<()>,
) -> Result<u64> {
    let tree = Tree::spawn(TreeShape::default())?;
    let registered = daemon.request(json!({
        "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
    }));
    if registered["ok"] != true {
        bail!("register {session}: {registered}");
    }
    settle(daemon)?;
    let mut stream = daemon::subscribe(&daemon.socket)?;
    stream
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(30)))?;
    let died = monotonic_ns();
    tree.owner.kill();
    let mut line = String::new();
    loop {
        line.clear();
        if stream
            .read_line(&mut line)
            .with_context(|| format!("waiting for the end of {session}"))?
            == 0
        {
            bail!("the daemon closed the stream");
        }
        let message: Value = serde_json::from_str(&line)?;
        let event = &message["event"];
        if event["session"] == session && event["kind"] == "session.ended" {
            return Ok(monotonic_ns() - died);
        }
    }
}
