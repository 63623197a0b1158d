//! CPU per death: what one death costs the daemon, and `liveness watch --json` reading it,
//! in CPU time. Deaths come one at a time, each after the last one's line was read and a
//! pause, as deaths come on a real host: every one meets a daemon whose caches went cold.
//!
//! Each build under measurement runs its own daemon (default sources) with its own
//! `liveness watch --json` as the only subscriber. Owners come in batches, each batch
//! tracked by one build, the builds taking turns; the CPU clocks of the daemon and of the
//! watcher are read before the batch's first death and after its last line, so that
//! registration costs nothing here. A build's figure is its CPU time over its deaths; the
//! ratio of two builds has the ratios of the batches taken side by side as its spread.

use std::collections::HashMap;
use std::io::BufReader;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::daemon::{self, Build, Daemon, Subscriber, register_all};
use crate::procs::{self, Owners};
use crate::versus::Ratio;
use crate::{Dist, round};

/// Sizes of the part.
#[derive(Debug, Clone, Copy)]
pub struct CpuPlan {
    /// Deaths per build.
    pub deaths: usize,
    /// Owners per batch.
    pub batch: usize,
}

/// The quiet before each death: long enough for other work on the machine to evict the
/// daemon's code and data from the caches, as between real deaths.
const PAUSE: Duration = Duration::from_millis(10);
/// How long a death's line may take before it counts as lost.
const PATIENCE: Duration = Duration::from_secs(5);

/// One build's daemon and watcher.
#[derive(Debug)]
struct Setup {
    build: Build,
    daemon: Daemon,
    watch: Child,
    lines: Subscriber,
    /// Per batch: (ns, deaths) of the daemon and of the watcher.
    daemon_ns: Vec<(f64, usize)>,
    watch_ns: Vec<(f64, usize)>,
    /// Exit to the watcher's line, per death, in order.
    latencies: Vec<u64>,
    lost: usize,
    /// Batches registered so far, probes included: a batch's number is part of its
    /// sessions' ids, which a PID used again later must not meet.
    batches: usize,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.watch.kill();
        let _ = self.watch.wait();
    }
}

/// The part's figures.
#[derive(Debug)]
pub struct CpuReport {
    pub json: Value,
    /// New against the baseline: the daemon's CPU per death and the watcher's.
    pub daemon_ratio: Option<Ratio>,
    pub errors: Vec<String>,
}

pub fn run(builds: &[Build], plan: CpuPlan) -> Result<CpuReport> {
    let logs = tempfile::Builder::new()
        .prefix("liveness-bench-cpu")
        .tempdir()?;
    let mut setups = builds
        .iter()
        .map(|build| {
            start(
                build,
                &logs.path().join(format!("watch-{}.log", build.name())),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let batches = plan.deaths.div_ceil(plan.batch) * setups.len();
    for batch in 0..batches {
        let setup = &mut setups[batch % builds.len()];
        let owners = setup.register(plan.batch)?;
        deaths(setup, owners)?;
    }
    let mut errors = Vec::new();
    let mut figures = serde_json::Map::new();
    for setup in &mut setups {
        if let Err(e) = daemon::stop(&mut setup.daemon) {
            errors.push(format!("cpu: {e:#}"));
        }
        if setup.lost > 0 {
            errors.push(format!(
                "cpu {}: {} deaths never reached liveness watch",
                setup.build.name(),
                setup.lost
            ));
        }
        let per_death = |series: &[(f64, usize)]| {
            let (ns, deaths) = series
                .iter()
                .fold((0.0, 0), |(t, n), &(ns, d)| (t + ns, n + d));
            round(ns / deaths.max(1) as f64 / 1e3)
        };
        figures.insert(
            setup.build.name().into(),
            json!({
                "deaths": setup.latencies.len(),
                "lost": setup.lost,
                "daemon_us_per_death": per_death(&setup.daemon_ns),
                "watch_us_per_death": per_death(&setup.watch_ns),
                "watch_latency": Dist::of_ns(&setup.latencies).json(),
            }),
        );
    }
    let versus = |of: fn(&Setup) -> &[(f64, usize)]| {
        (setups.len() > 1).then(|| Ratio::of_costs(of(&setups[0]), of(&setups[1])))
    };
    let daemon_ratio = versus(|s| &s.daemon_ns);
    let watch_ratio = versus(|s| &s.watch_ns);
    let latency_ratio = (setups.len() > 1)
        .then(|| Ratio::of_latencies(&setups[0].latencies, &setups[1].latencies, |d| d.p50));
    Ok(CpuReport {
        json: json!({
            "deaths_per_build": plan.deaths,
            "batch": plan.batch,
            "pause_ms": PAUSE.as_millis() as u64,
            "sources": "auto",
            "builds": figures,
            "versus_baseline": daemon_ratio.as_ref().map(|daemon| json!({
                "daemon_cpu_per_death": daemon.json(),
                "watch_cpu_per_death": watch_ratio.as_ref().map(Ratio::json),
                "watch_latency_p50": latency_ratio.as_ref().map(Ratio::json),
            })),
        }),
        daemon_ratio,
        errors,
    })
}

impl Setup {
    /// Forks `count` owners and registers them with the daemon.
    fn register(&mut self, count: usize) -> Result<Owners> {
        let owners = Owners::spawn(count)?;
        self.batches += 1;
        let batch = self.batches;
        register_all(
            &self.daemon.socket,
            &owners.pids,
            |pid| session(batch, pid),
            1,
        )?;
        Ok(owners)
    }
}

fn session(batch: usize, pid: u32) -> String {
    format!("cpu-{batch}-{pid}")
}

/// The build's daemon and watcher, once the watcher has printed an owner's end.
fn start(build: &Build, log: &std::path::Path) -> Result<Setup> {
    let daemon = build.start("auto", &[])?;
    let mut watch = build.watch(&daemon.socket, log)?;
    let lines = Subscriber::reading(BufReader::new(watch.stdout.take().context("stdout")?));
    let mut setup = Setup {
        build: build.clone(),
        daemon,
        watch,
        lines,
        daemon_ns: Vec::new(),
        watch_ns: Vec::new(),
        latencies: Vec::new(),
        lost: 0,
        batches: 0,
    };
    // The watcher subscribes on its own time: probe until one end reaches it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = HashMap::new();
    loop {
        let mut probe = setup.register(1)?;
        probe.release(1)?;
        let pid = probe.next_report()?.pid;
        let waited = Duration::from_millis(200);
        let probed = session(setup.batches, pid);
        if setup.lines.wait_for(&probed, waited, &mut seen).is_some() {
            return Ok(setup);
        }
        if Instant::now() > deadline {
            bail!(
                "liveness watch ({}) printed nothing within 30 s: {}",
                build.name(),
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }
}

/// Lets the batch's owners die one at a time and takes the CPU time it cost.
fn deaths(setup: &mut Setup, mut owners: Owners) -> Result<()> {
    let (daemon_pid, watch_pid) = (setup.daemon.pid(), setup.watch.id());
    let (mut seen, batch) = (HashMap::new(), setup.batches);
    std::thread::sleep(PAUSE);
    let (daemon_before, watch_before) = (procs::cpu_ns(daemon_pid)?, procs::cpu_ns(watch_pid)?);
    for _ in 0..owners.pids.len() {
        owners.release(1)?;
        let exit = owners.next_report()?;
        match setup
            .lines
            .wait_for(&session(batch, exit.pid), PATIENCE, &mut seen)
        {
            Some(ended) => setup
                .latencies
                .push(ended.received_ns.saturating_sub(exit.exit_ns)),
            None => setup.lost += 1,
        }
        std::thread::sleep(PAUSE);
    }
    let deaths = owners.pids.len();
    let daemon_ns = procs::cpu_ns(daemon_pid)? - daemon_before;
    let watch_ns = procs::cpu_ns(watch_pid)? - watch_before;
    setup.daemon_ns.push((daemon_ns as f64, deaths));
    setup.watch_ns.push((watch_ns as f64, deaths));
    Ok(())
}
