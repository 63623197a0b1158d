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

/// Runs the plan; harness failures (a victim's end never read) are errors.
pub fn run(bin_dir: &Path, plan: ActivityPlan) -> Result<Value> {
    let trees = (0..plan.sessions)
        .map(|_| {
            Tree::spawn(TreeShape {
                before: plan.members - 1,
                ..TreeShape::default()
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut settings = serde_json::Map::new();
    for (name, interval) in SETTINGS {
        let mut daemon = daemon::start(bin_dir, "auto", &["--activity-interval", interval])?;
        for (n, tree) in trees.iter().enumerate() {
            let session = format!("agent-{n}");
            let registered = daemon.request(json!({
                "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
            }));
            if registered["ok"] != true {
                bail!("register {session}: {registered}");
            }
        }
        // The first sample of every tree is taken before the window opens.
        std::thread::sleep(Duration::from_secs(1));
        let cpu_before = procs::cpu_ns(daemon.pid())?;
        let opened = Instant::now();
        std::thread::sleep(plan.window);
        let cpu_ns = procs::cpu_ns(daemon.pid())? - cpu_before;
        let percent = cpu_ns as f64 / opened.elapsed().as_nanos() as f64 * 100.0;
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
    }))
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
