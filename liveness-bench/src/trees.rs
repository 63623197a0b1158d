//! A tracked storm: one session whose owner, once registered, forks `long_lived` children
//! that stay and `short_lived` ones that exit at once, interleaved, so that the kernel's
//! fork program adds every one of them. Checks that the session's `session.ended` names
//! exactly the long-lived children as survivors and none of the short-lived ones, measures
//! what a member costs the daemon (its RSS and the kernel's members map), and times the
//! owner's death to `session.reaped` with every long-lived child terminated within a 1 s
//! grace. With `until` (a build that has sessions `until: "tree"`), it also times the last
//! member's death to `session.ended` of such a session, beside an owner's death to its
//! `session.ended`, on the same daemon.

use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use liveness_ebpf::record::MAP_MEMBERS;
use serde_json::{Value, json};

use crate::bpf_stats::{self, MapMemory};
use crate::daemon;
use crate::procs::{self, Tree, TreeShape};
use crate::reap::{self, GRACE_MS};
use crate::round;

/// One tree of the run.
#[derive(Debug, Clone, Copy)]
pub struct TreeSize {
    pub long_lived: usize,
    pub short_lived: usize,
}

/// Deaths timed for sessions `until: "tree"`, and for owners beside them.
const UNTIL_ROUNDS: usize = 20;

/// Runs each tree on a fresh daemon (auto sources, so the fork program is loaded);
/// harness failures (a wrong survivor, a short-lived one reported) go to `errors`.
pub fn run(
    bin_dir: &Path,
    sizes: &[TreeSize],
    until: bool,
    errors: &mut Vec<String>,
) -> Result<Value> {
    let trees = sizes
        .iter()
        .map(|&size| one_tree(bin_dir, size, errors))
        .collect::<Result<Vec<_>>>()?;
    let until_tree = until.then(|| until_tree(bin_dir)).transpose()?;
    Ok(json!({"grace_ms": GRACE_MS, "trees": trees, "until_tree": until_tree}))
}

/// Median ns from a SIGKILL to its session's `session.ended`: of the last member of a
/// session `until: "tree"` (its owner dead already), and of an owner.
fn until_tree(bin_dir: &Path) -> Result<Value> {
    let daemon = daemon::start(bin_dir, "auto", &[])?;
    daemon::require_fork_tracking(&daemon)?;
    let (mut last_member, mut owner) = (Vec::new(), Vec::new());
    for round in 0..UNTIL_ROUNDS {
        for until in [true, false] {
            let session = format!("until-{until}-{round}");
            let mut tree = Tree::spawn(TreeShape {
                long_lived: 1,
                short_lived: 0,
                ..TreeShape::default()
            })?;
            let mut register = json!({
                "op": "register", "session": session, "owner": {"pid": tree.owner.pid},
            });
            if until {
                register["until"] = json!("tree");
            }
            let registered = daemon.request(register);
            if registered["ok"] != true {
                bail!("register {session}: {registered}");
            }
            tree.grow()?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while reap::listed(&daemon, &session) != 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if until {
                tree.owner.kill();
                // The owner's death is taken in, and its member watched, before the timing.
                std::thread::sleep(Duration::from_millis(100));
                let phase = daemon.request(json!({"op": "get", "session": session}));
                if phase["session"]["phase"] != "active" {
                    bail!("{session} ended with its owner: {phase}");
                }
            }
            let victim = if until { tree.children[0] } else { tree.owner };
            let mut stream = daemon::subscribe(&daemon.socket)?;
            stream
                .get_ref()
                .set_read_timeout(Some(Duration::from_secs(10)))?;
            let died = procs::monotonic_ns();
            victim.kill();
            let took = loop {
                let mut line = String::new();
                if stream.read_line(&mut line)? == 0 {
                    bail!("the daemon closed the stream");
                }
                let message: Value = serde_json::from_str(&line)?;
                let event = &message["event"];
                if event["session"] == session && event["kind"] == "session.ended" {
                    break procs::monotonic_ns() - died;
                }
            };
            if until { &mut last_member } else { &mut owner }.push(took);
        }
    }
    let median = |times: &mut Vec<u64>| {
        times.sort_unstable();
        times[times.len() / 2] as f64 / 1e3
    };
    let (member_us, owner_us) = (median(&mut last_member), median(&mut owner));
    println!(
        "until tree: the last member's death -> session.ended p50 {member_us:.0} us, an \
         owner's {owner_us:.0} us ({UNTIL_ROUNDS} each, one daemon)"
    );
    Ok(json!({
        "rounds": UNTIL_ROUNDS,
        "last_member_to_ended_p50_us": round(member_us),
        "owner_to_ended_p50_us": round(owner_us),
    }))
}

fn one_tree(bin_dir: &Path, size: TreeSize, errors: &mut Vec<String>) -> Result<Value> {
    let mut daemon = daemon::start(bin_dir, "auto", &[])?;
    daemon::require_fork_tracking(&daemon)?;
    let session = format!("trees-{}-{}", size.long_lived, size.short_lived);
    let mut tree = Tree::spawn(TreeShape {
        long_lived: size.long_lived,
        short_lived: size.short_lived,
        ..TreeShape::default()
    })?;
    reap::register(&daemon, &session, &tree)?;
    let before = Memory::of(&daemon)?;

    let forking = Instant::now();
    let short = tree.grow()?;
    let fork_s = forking.elapsed().as_secs_f64();
    if tree.children.len() != size.long_lived || short.len() != size.short_lived {
        bail!(
            "the tree's owner left {} long-lived and {} short-lived children, not {} and {}",
            tree.children.len(),
            short.len(),
            size.long_lived,
            size.short_lived
        );
    }
    // The daemon learns of the members from the kernel's ring buffer, a little later.
    let deadline = Instant::now() + Duration::from_secs(30);
    while reap::listed(&daemon, &session) != size.long_lived + 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    reap::check_listed(&daemon, &session, &tree, errors);
    let after = Memory::of(&daemon)?;

    let death = reap::kill_owner_and_follow(&daemon, &session, &tree, 0, &short, errors)?;
    let wrong = death.survivors_wrong;
    daemon::stop(&mut daemon)?;

    let rss_growth = after.rss as i64 - before.rss as i64;
    let map = |m: Option<MapMemory>| m.map_or(0, |m| m.bytes as i64);
    let map_growth = map(after.members_map) - map(before.members_map);
    let per_member = |bytes: i64| bytes as f64 / size.long_lived as f64;
    println!(
        "trees {}+{}: forked in {fork_s:.2} s; {wrong} survivors wrong; per member: daemon RSS \
         {:.0} B, kernel map {:.0} B; death -> session.ended {:.1} ms, -> session.reaped {:.1} ms",
        size.long_lived,
        size.short_lived,
        per_member(rss_growth),
        per_member(map_growth),
        death.to_ended as f64 / 1e6,
        death.to_reaped as f64 / 1e6,
    );
    Ok(json!({
        "long_lived": size.long_lived,
        "short_lived": size.short_lived,
        "fork_s": round(fork_s),
        "survivors_total": death.survivors["total"],
        "survivors_wrong": wrong,
        "daemon_rss_growth_bytes": rss_growth,
        "rss_bytes_per_member": round(per_member(rss_growth)),
        "members_map": after.members_map.map(|m| json!({
            "max_entries": m.max_entries,
            "bytes_before": map(before.members_map),
            "bytes_after": m.bytes,
            "bytes_per_member": round(per_member(map_growth)),
        })),
        "death_to_ended_ms": round(death.to_ended as f64 / 1e6),
        "death_to_reaped_ms": round(death.to_reaped as f64 / 1e6),
    }))
}

/// The daemon's memory at one moment.
#[derive(Debug)]
struct Memory {
    rss: u64,
    members_map: Option<MapMemory>,
}

impl Memory {
    /// After half a second of quiet, so that the figures have settled.
    fn of(daemon: &daemon::Daemon) -> Result<Memory> {
        std::thread::sleep(Duration::from_millis(500));
        Ok(Memory {
            rss: procs::rss_bytes(daemon.pid())?,
            members_map: bpf_stats::map_memory(daemon.pid(), MAP_MEMBERS)?,
        })
    }
}
