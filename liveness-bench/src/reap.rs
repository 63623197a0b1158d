//! Cleanup at scale: one session registered with `on_end: terminate` and a 1 s grace
//! whose owner leaves hundreds of processes behind. Measures the time from the owner's
//! death to `session.ended` and to `session.reaped`, once with every survivor heeding
//! SIGTERM and once with one ignoring it (then the grace is waited out and SIGKILL
//! follows), and checks that `session.ended` names exactly the survivors and that every
//! one of them was ended and reported. The process-tree part (`trees`) uses the same steps.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use integration_tests::Fingerprint;
use liveness_common::session::MAX_SURVIVORS_LISTED;
use serde_json::{Value, json};

use crate::Dist;
use crate::daemon::{self, Daemon};
use crate::procs::{Tree, TreeShape, monotonic_ns};

/// The grace the sessions ask for.
pub const GRACE_MS: u64 = 1000;
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
    let tree = Tree::spawn(TreeShape {
        before: survivors,
        stubborn,
        ..TreeShape::default()
    })?;
    if tree.children.len() != survivors {
        bail!(
            "the tree's owner forked {} children, not {survivors}",
            tree.children.len()
        );
    }
    register(daemon, session, &tree)?;
    check_listed(daemon, session, &tree, errors);
    let death = kill_owner_and_follow(daemon, session, &tree, stubborn, &[], errors)?;
    Ok((death.to_ended, death.to_reaped))
}

/// Registers the tree's owner as `session`, to be terminated with a [`GRACE_MS`] grace.
pub fn register(daemon: &Daemon, session: &str, tree: &Tree) -> Result<()> {
    let registered = daemon.request(json!({
        "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
        "on_end": "terminate", "grace_ms": GRACE_MS,
    }));
    if registered["ok"] != true {
        bail!("register {session}: {registered}");
    }
    Ok(())
}

/// The processes the session lists: its owner and the tree's living children, no more.
pub fn check_listed(daemon: &Daemon, session: &str, tree: &Tree, errors: &mut Vec<String>) {
    let listed = listed(daemon, session);
    if listed != tree.children.len() + 1 {
        errors.push(format!(
            "{session}: the session lists {listed} processes, not the owner and {} children",
            tree.children.len()
        ));
    }
}

/// How many processes `processes --session` lists.
pub fn listed(daemon: &Daemon, session: &str) -> usize {
    let members = daemon.request(json!({"op": "processes", "session": session}));
    members["processes"].as_array().map_or(0, Vec::len)
}

/// What followed an owner's death.
#[derive(Debug)]
pub struct Death {
    /// Nanoseconds from the kill to reading `session.ended`, and `session.reaped`.
    pub to_ended: u64,
    pub to_reaped: u64,
    /// The `session.ended` event's `survivors`, and how many of them it got wrong (see
    /// [`check_survivors`]).
    pub survivors: Value,
    pub survivors_wrong: usize,
}

/// SIGKILLs the tree's owner and reads the session's events up to `session.reaped`,
/// checking the survivors against the tree's children (none of `short_lived` among them,
/// see [`check_survivors`]) and what was reaped (see [`check`]).
pub fn kill_owner_and_follow(
    daemon: &Daemon,
    session: &str,
    tree: &Tree,
    stubborn: usize,
    short_lived: &[u32],
    errors: &mut Vec<String>,
) -> Result<Death> {
    let mut stream = daemon::subscribe(&daemon.socket)?;
    stream.get_ref().set_read_timeout(Some(PATIENCE))?;
    let died = monotonic_ns();
    tree.owner.kill();
    let mut ended = None;
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
        let mut message: Value = serde_json::from_str(&line)?;
        let event = message["event"].take();
        if event["session"] != session {
            continue;
        }
        match event["kind"].as_str() {
            Some("session.ended") => {
                let wrong = check_survivors(
                    session,
                    &event["survivors"],
                    &tree.children,
                    short_lived,
                    errors,
                );
                ended = Some((read, event["survivors"].clone(), wrong));
            }
            Some("session.reaped") => {
                let (to_ended, survivors, survivors_wrong) =
                    ended.context("session.reaped came before session.ended")?;
                check(session, &event["reaped"], tree, stubborn, errors);
                return Ok(Death {
                    to_ended,
                    to_reaped: read,
                    survivors,
                    survivors_wrong,
                });
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

/// The ended event's `survivors` against the long-lived children: the same total, the
/// same identities (as many as are listed), and no short-lived child. Returns how many
/// were wrong (missing, extra or short-lived).
fn check_survivors(
    session: &str,
    survivors: &Value,
    long_lived: &[Fingerprint],
    short: &[u32],
    errors: &mut Vec<String>,
) -> usize {
    let total = survivors["total"].as_u64().unwrap_or(0) as usize;
    let listed: HashSet<(u64, u64)> = survivors["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let number = |key: &str| m[key].as_u64().unwrap_or(0);
            (number("pid"), number("start_ticks"))
        })
        .collect();
    let expected: HashSet<(u64, u64)> = long_lived
        .iter()
        .map(|c| (u64::from(c.pid), c.start_ticks))
        .collect();
    let extra = listed.difference(&expected).count();
    // Every one is listed up to the bound; beyond it, only the total says they all are.
    let missing = if expected.len() <= MAX_SURVIVORS_LISTED {
        expected.difference(&listed).count()
    } else {
        MAX_SURVIVORS_LISTED.saturating_sub(listed.len())
    };
    let long: HashSet<u64> = expected.iter().map(|&(pid, _)| pid).collect();
    // A short-lived child's pid reused by a long-lived one is checked by identity above.
    let short: HashSet<u64> = short.iter().map(|&pid| u64::from(pid)).collect();
    let short_reported = listed
        .iter()
        .filter(|(pid, _)| !long.contains(pid) && short.contains(pid))
        .count();
    let miscounted = total.abs_diff(expected.len());
    if extra + missing + miscounted > 0 || short_reported > 0 {
        errors.push(format!(
            "{session}: survivors total {total}, expected {}; {missing} long-lived missing, \
             {extra} others listed ({short_reported} of them short-lived)",
            expected.len()
        ));
    }
    extra + missing + miscounted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprints(pids: &[u32]) -> Vec<Fingerprint> {
        pids.iter()
            .map(|&pid| Fingerprint {
                pid,
                start_ticks: u64::from(pid) * 10,
            })
            .collect()
    }

    fn survivors(total: usize, listed: &[(u32, u64)]) -> Value {
        let members: Vec<Value> = listed
            .iter()
            .map(|&(pid, start_ticks)| json!({"pid": pid, "start_ticks": start_ticks, "comm": "x"}))
            .collect();
        json!({"total": total, "members": members})
    }

    fn wrong(survivors: &Value) -> (usize, Vec<String>) {
        let mut errors = Vec::new();
        let long = fingerprints(&[10, 11, 12]);
        let wrong = check_survivors("s", survivors, &long, &[20, 21], &mut errors);
        (wrong, errors)
    }

    #[test]
    fn exactly_the_long_lived_pass() {
        let (count, errors) = wrong(&survivors(3, &[(10, 100), (11, 110), (12, 120)]));
        assert_eq!((count, errors.len()), (0, 0), "{errors:?}");
    }

    #[test]
    fn a_missing_long_lived_one_is_wrong() {
        let (count, errors) = wrong(&survivors(2, &[(10, 100), (11, 110)]));
        assert_eq!(count, 2, "one missing and the total one short: {errors:?}");
        assert_eq!(errors.len(), 1, "{errors:?}");
    }

    #[test]
    fn a_short_lived_one_reported_is_wrong() {
        let listed = [(10, 100), (11, 110), (12, 120), (20, 5)];
        let (count, errors) = wrong(&survivors(4, &listed));
        assert_eq!(count, 2, "one extra and the total one over: {errors:?}");
        assert!(
            errors[0].contains("1 of them short-lived"),
            "the error names the short-lived one: {errors:?}"
        );
    }

    #[test]
    fn a_reused_pid_with_another_start_is_wrong() {
        let (count, errors) = wrong(&survivors(3, &[(10, 100), (11, 110), (12, 999)]));
        assert_eq!(count, 2, "one missing, one extra: {errors:?}");
    }
}
