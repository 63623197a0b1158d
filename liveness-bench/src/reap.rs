//! Cleanup at scale: one session registered with `on_end: terminate` and a 1 s grace
//! whose owner leaves hundreds of processes behind. Measures the time from the owner's
//! death to `session.ended` and to `session.reaped`, once with every survivor heeding
//! SIGTERM and once with one ignoring it (then the grace is waited out and SIGKILL
//! follows), and checks that every survivor was ended and reported.

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::Dist;
use crate::daemon::{self, Daemon};
use crate::procs::{Tree, monotonic_ns};

/// The grace the sessions ask for.
const GRACE_MS: u64 = 1000;
/// How long the harness waits for an event before calling the run broken.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
pub struct ReapPlan {
    pub survivors: usize,
    pub rounds: usize,
}

/// Runs the plan on one daemon; harness failures (a survivor missed, a wrong count) go to
/// `errors`.
pub fn run(bin_dir: &Path, plan: ReapPlan, errors: &mut Vec<String>) -> Result<Value> {
    let mut daemon = daemon::start(bin_dir, "auto", &[])?;
    let mut variants = serde_json::Map::new();
    for (variant, stubborn) in [("all_heed_sigterm", 0), ("one_ignores_sigterm", 1)] {
        let (mut to_ended, mut to_reaped) = (Vec::new(), Vec::new());
        for round in 0..plan.rounds {
            let session = format!("reap-{variant}-{round}");
            let (ended, reaped) = one_round(&daemon, &session, plan.survivors, stubborn, errors)?;
            to_ended.push(ended);
            to_reaped.push(reaped);
        }
        let (ended, reaped) = (Dist::of_ns(&to_ended), Dist::of_ns(&to_reaped));
        println!(
            "reap {variant}: {} survivors, grace {GRACE_MS} ms, {} rounds: death -> session.ended p50 {:.0} us; death -> session.reaped p50 {:.1} ms, max {:.1} ms",
            plan.survivors,
            plan.rounds,
            ended.p50,
            reaped.p50 / 1e3,
            reaped.max / 1e3,
        );
        variants.insert(
            variant.to_owned(),
            json!({"death_to_ended": ended.json(), "death_to_reaped": reaped.json()}),
        );
    }
    daemon::stop(&mut daemon)?;
    Ok(json!({
        "survivors": plan.survivors,
        "grace_ms": GRACE_MS,
        "rounds": plan.rounds,
        "variants": variants,
    }))
}

/// One tree: registered, its owner SIGKILLed; returns the nanoseconds from the kill to
/// reading `session.ended` and `session.reaped`.
fn one_round(
    daemon: &Daemon,
    session: &str,
    survivors: usize,
    stubborn: usize,
    errors: &mut Vec<String>,
) -> Result<(u64, u64)> {
    let tree = Tree::spawn(survivors, stubborn)?;
    if tree.children.len() != survivors {
        bail!(
            "the tree's owner forked {} children, not {survivors}",
            tree.children.len()
        );
    }
    let registered = daemon.request(json!({
        "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
        "on_end": "terminate", "grace_ms": GRACE_MS,
    }));
    if registered["ok"] != true {
        bail!("register {session}: {registered}");
    }
    let members = daemon.request(json!({"op": "processes", "session": session}));
    let listed = members["processes"].as_array().map_or(0, Vec::len);
    if listed != survivors + 1 {
        errors.push(format!(
            "reap {session}: the session lists {listed} processes, not the owner and {survivors} children"
        ));
    }
    let mut stream = daemon::subscribe(&daemon.socket)?;
    stream.get_ref().set_read_timeout(Some(PATIENCE))?;
    let died = monotonic_ns();
    tree.owner.kill();
    let mut to_ended = None;
    let mut line = String::new();
    loop {
        line.clear();
        if stream
            .read_line(&mut line)
            .with_context(|| format!("waiting for the events of {session}"))?
            == 0
        {
            bail!("the daemon closed the stream");
        }
        let read = monotonic_ns() - died;
        let message: Value = serde_json::from_str(&line)?;
        let event = &message["event"];
        if event["session"] != session {
            continue;
        }
        match event["kind"].as_str() {
            Some("session.ended") => to_ended = Some(read),
            Some("session.reaped") => {
                let to_ended = to_ended.context("session.reaped came before session.ended")?;
                check(session, &event["reaped"], &tree, stubborn, errors);
                return Ok((to_ended, read));
            }
            _ => {}
        }
    }
}

/// Every child terminated (or, the stubborn ones, killed) and gone; nothing failed.
fn check(session: &str, reaped: &Value, tree: &Tree, stubborn: usize, errors: &mut Vec<String>) {
    let count = |list: &str| reaped[list].as_array().map_or(0, Vec::len);
    let counts = [
        count("terminated"),
        count("killed"),
        count("exited"),
        count("failed"),
    ];
    let expected = [tree.children.len() - stubborn, stubborn, 0, 0];
    if counts != expected {
        errors.push(format!(
            "reap {session}: terminated, killed, exited, failed {counts:?}, expected {expected:?}: {reaped}"
        ));
    }
    let running = tree.children.iter().filter(|c| c.is_running()).count();
    if running > 0 {
        errors.push(format!(
            "reap {session}: {running} survivors still run after session.reaped"
        ));
    }
}
