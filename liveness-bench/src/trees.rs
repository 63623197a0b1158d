//! A tracked storm: one session whose owner, once registered, forks `long_lived` children
//! that stay and `short_lived` ones that exit at once, interleaved, so that the kernel's
//! fork program adds every one of them. Checks that the session's `session.ended` names
//! exactly the long-lived children as survivors and none of the short-lived ones, measures
//! what a member costs the daemon (its RSS and the kernel's members map), and times the
//! owner's death to `session.reaped` with every long-lived child terminated within a 1 s
//! grace.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use liveness_common::record::MAP_MEMBERS;
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

/// Runs each tree on a fresh daemon (auto sources, so the fork program is loaded);
/// harness failures (a wrong survivor, a short-lived one reported) go to `errors`.
pub fn run(bin_dir: &Path, sizes: &[TreeSize], errors: &mut Vec<String>) -> Result<Value> {
    let trees = sizes
        .iter()
        .map(|&size| one_tree(bin_dir, size, errors))
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({"grace_ms": GRACE_MS, "trees": trees}))
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
