//! Peers: the tools people use instead of liveness, measured side by side with it in one
//! run, in two ways that differ only in which tools run during which deaths.
//!
//! Alone (the table the goals read): each tool runs by itself for a block of deaths, then
//! stops; the blocks are interleaved in rounds, each round every tool once in an order
//! shuffled from a printed seed, so that every tool's deaths are spread over the same
//! minutes and no tool is measured while another is woken by the same death.
//!
//! The crowd: every tool runs at once, each at its best (unbuffered output), and every
//! owner's exit is seen by all of them. On a small machine this mostly measures the order
//! in which the scheduler runs twenty readers woken by one death; it stays as the second
//! table, and is where each tool's CPU and eBPF cost per untracked exit are taken.
//!
//! Either way one owner exits at a time and the harness waits until each running tool has
//! reported it, then lets the next one go. One thread reads every tool's output (pipes and
//! sockets under one `poll`) and stamps each line with CLOCK_MONOTONIC the moment `poll`
//! returned, so no tool is favoured by the order in which ready outputs are read.
//!
//! The tools: libbpf-tools `exitsnoop`, BCC's `exitsnoop-bpfcc`, a `bpftrace` one-liner on
//! `sched_process_exit`, `forkstat`, the bench's own proc-connector listener, pidfd waiter
//! and `/proc` pollers and the floor, liveness's own eBPF object read by a minimal loop (see
//! [`crate::watchers`]), and `livenessd` with `--sources ebpf`, `pidfd` and `auto`, each
//! read by a direct socket subscriber and through `liveness watch --json`.
//!
//! With a baseline build, each source runs a daemon of each build. In the crowd the owners
//! take turns: each is tracked by one build's daemons (and by every other tool), so that
//! only one build is woken by each death, as in a run without a baseline, and both builds'
//! deaths are spread over the same minutes. Alone, each build's daemons have blocks of
//! their own. Every ratio of a row to the raw tracer is taken over the row's own deaths.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::bpf_stats::{ProgramCost, bpf_program_ids};
use crate::daemon::{self, Build, Daemon, Ended, register_all};
use crate::procs::{self, Owners, monotonic_ns};
use crate::versus::{Ratio, quarters};
use crate::{Dist, median, round, setup, watchers};
use liveness_ebpf::record::PROGRAM_NAMES;

/// Sizes of the peers section.
#[derive(Debug, Clone, Copy)]
pub struct PeersPlan {
    /// Owners whose exit every tool of the crowd reports.
    pub samples: usize,
    /// Untracked `/bin/true` runs during which each tool's CPU and eBPF time are taken.
    pub storm: usize,
    /// Whether to run the external tools (installing them if needed).
    pub external: bool,
    /// Owners whose exit each tool reports while it runs alone.
    pub alone: usize,
    /// Deaths in one tool's block.
    pub block: usize,
    /// Seeds the order of the blocks within each round.
    pub seed: u64,
}

/// CPU figures are scaled to this many untracked spawns.
const CPU_PER_SPAWNS: usize = 20_000;
/// Owners forked and tracked together, then let go one at a time.
const BATCH: usize = 50;
/// How long a round waits for every tool before counting it lost for the late ones.
const ROUND_TIMEOUT: Duration = Duration::from_secs(2);
/// The tools that are not the bench's own nor liveness, in the crowd.
const EXTERNAL: [&str; 4] = ["exitsnoop", "exitsnoop-bpfcc", "bpftrace", "forkstat"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Reports every exit of the machine from a kernel tracepoint.
    Tracer,
    /// Another program that reports every exit of the machine (`forkstat`, from the proc
    /// connector).
    Tool,
    /// The bench's own few lines of code.
    Own,
    /// liveness's own eBPF object read by a minimal loop: the floor under the daemon.
    Floor,
    /// `livenessd`, through its socket protocol.
    Liveness,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tracer => "tracer",
            Kind::Tool => "tool",
            Kind::Own => "own",
            Kind::Floor => "floor",
            Kind::Liveness => "liveness",
        }
    }

    /// Whether an exit it never reported is a harness failure: the bench's own code and
    /// liveness must see every one; another program's misses only show in its `lost`.
    fn checked(self) -> bool {
        matches!(self, Kind::Own | Kind::Floor | Kind::Liveness)
    }
}

/// How a tool's lines name the process that exited.
#[derive(Debug)]
enum Format {
    /// exitsnoop's table: the PID column starts where the header's `PID` does (the command
    /// name before it may hold spaces).
    Columns { pid_at: Option<usize> },
    /// The PID is this whitespace-separated field (forkstat: time, event, PID, ...).
    Field(usize),
    /// One PID per line (`ack` acknowledges a batch of PIDs to track).
    Pid,
    /// liveness stream lines, `session.ended` of the session `peer-<registration>-<pid>`.
    Events,
}

/// What a row of the table is, before it runs.
#[derive(Debug)]
struct Row {
    name: String,
    kind: Kind,
    format: Format,
    /// See [`Peer::waited_for`].
    waited_for: bool,
}

/// One run of a tool's output stream and what it reported: a row of the crowd, or one
/// block of a row alone.
#[derive(Debug)]
struct Peer {
    name: String,
    kind: Kind,
    group: usize,
    /// The build whose owners it reports (its group's), or `None`: every owner.
    build: Option<usize>,
    output: OwnedFd,
    pending: Vec<u8>,
    format: Format,
    /// First report of each watched PID, CLOCK_MONOTONIC ns.
    seen: HashMap<u32, u64>,
    /// The owners that exited while it ran and that it reports: PID and exit time, in
    /// exit order.
    owed: Vec<(u32, u64)>,
    acks: usize,
    /// Why its output ended, if it did.
    ended: Option<String>,
    /// Whether its group still runs: its output is read and deaths are owed to it.
    running: bool,
    startup_ns: Option<u64>,
    /// The rounds wait for it (all but the 1 s poller, whose reports arrive in later rounds).
    waited_for: bool,
    /// Processes whose CPU time is this tool's.
    cpu_pids: Vec<u32>,
}

/// Processes that start together and are told which PIDs to track together: a tool, or
/// one daemon with its two readers.
#[derive(Debug)]
struct Group {
    tracker: Tracker,
    /// A daemon's build: it tracks only that build's owners.
    build: Option<usize>,
    children: Vec<Child>,
    daemon: Option<Daemon>,
    /// Its eBPF programs.
    programs: Vec<u32>,
    started_ns: u64,
    /// How long one start-up probe waits for its exit to be reported.
    probe_wait: Duration,
    log: PathBuf,
}

#[derive(Debug)]
enum Tracker {
    /// Reports every exit: nothing to tell.
    Nothing,
    /// PIDs on stdin, acknowledged on stdout (see [`crate::watchers`]).
    Stdin(ChildStdin),
    /// `register` on the daemon's socket.
    Daemon,
}

impl Drop for Group {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How a group starts: what a block alone runs, and what the crowd runs all of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    /// One of the bench's own watchers, by its name in [`crate::watchers`].
    Watcher(&'static str),
    /// A daemon of a build (by index) with these `--sources`, and its two readers.
    Liveness { build: usize, source: &'static str },
    /// One of [`EXTERNAL`], installed if needed.
    External(&'static str),
}

impl Tool {
    /// The crowd: every tool. Alone: the tools the goals compare (no tracer but exitsnoop,
    /// no 1 s poller, no pidfd-only daemon waiting for an exit status).
    fn all(builds: usize, external: bool, alone: bool) -> Vec<Tool> {
        let mut tools: Vec<Tool> = ["proc-connector", "pidfd", "poll-10", "poll-1000"]
            .into_iter()
            .filter(|&name| !alone || name != "poll-1000")
            .chain(["ebpf-floor"])
            .map(Tool::Watcher)
            .collect();
        let sources: &[&'static str] = if alone {
            &["ebpf", "auto"]
        } else {
            &["ebpf", "pidfd", "auto"]
        };
        for build in 0..builds {
            tools.extend(
                sources
                    .iter()
                    .map(|&source| Tool::Liveness { build, source }),
            );
        }
        if external {
            tools.extend(
                EXTERNAL
                    .into_iter()
                    .filter(|&name| !alone || ["exitsnoop", "forkstat"].contains(&name))
                    .map(Tool::External),
            );
        }
        tools
    }

    /// The name of its first row.
    fn name(self, builds: &[Build]) -> String {
        match self {
            Tool::Watcher(name) => watcher_row(name).0.to_owned(),
            Tool::Liveness { build, source } => {
                format!("liveness-{source}{}", builds[build].suffix())
            }
            Tool::External(name) => name.to_owned(),
        }
    }

    /// The build whose owners it tracks, if it is a daemon.
    fn build(self) -> Option<usize> {
        match self {
            Tool::Liveness { build, .. } => Some(build),
            Tool::Watcher(_) | Tool::External(_) => None,
        }
    }
}

/// A watcher's row name, how long its start-up probe waits, and whether the rounds wait for
/// it.
fn watcher_row(name: &'static str) -> (&'static str, Duration, bool) {
    match name {
        "pidfd" => ("pidfd-waiter", Duration::from_millis(100), true),
        "poll-10" => ("poll-10ms", Duration::from_millis(200), true),
        "poll-1000" => ("poll-1s", Duration::from_millis(1500), false),
        other => (other, Duration::from_millis(100), true),
    }
}

/// One tool's turn alone: `deaths` owners exit while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    tool: usize,
    deaths: usize,
}

/// The blocks of a run alone: `deaths` per tool in blocks of `block`, in rounds of one block
/// per tool, each round in an order shuffled from `seed` (the same seed, the same plan).
fn block_plan(tools: usize, deaths: usize, block: usize, seed: u64) -> Vec<Block> {
    let block = block.max(1);
    let mut state = seed;
    let mut plan = Vec::new();
    let mut done = 0;
    while done < deaths {
        let size = block.min(deaths - done);
        let mut order: Vec<usize> = (0..tools).collect();
        // Fisher-Yates with splitmix64: no dependency for a shuffle.
        for i in (1..order.len()).rev() {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            order.swap(i, (z % (i as u64 + 1)) as usize);
        }
        plan.extend(order.into_iter().map(|tool| Block { tool, deaths: size }));
        done += size;
    }
    plan
}

/// The section's tools and what they reported.
#[derive(Debug, Default)]
struct Peers {
    peers: Vec<Peer>,
    groups: Vec<Group>,
    /// PIDs whose reports are kept (owners and probes); every other line is dropped.
    watched: HashSet<u32>,
    skipped: Vec<(String, String)>,
    /// The build each owner is tracked by.
    owner_build: HashMap<u32, usize>,
    builds: usize,
    /// Registrations with a daemon so far: part of the sessions' ids.
    registrations: usize,
}

impl Peer {
    /// Whether it reports this owner's exit.
    fn reports(&self, owner_build: Option<&usize>) -> bool {
        self.build.is_none() || self.build.as_ref() == owner_build
    }

    /// Its latency for each of these deaths it reported, in their order.
    fn latencies(&self, deaths: &[(u32, u64)]) -> Vec<u64> {
        deaths
            .iter()
            .filter_map(|(pid, exit_ns)| Some(self.seen.get(pid)?.saturating_sub(*exit_ns)))
            .collect()
    }
}

/// The runs of a row: the peers of that name, in the order they ran.
fn runs_named(peers: &[Peer], name: &str) -> Vec<usize> {
    (0..peers.len())
        .filter(|&i| peers[i].name == name)
        .collect()
}

/// How a table's rows were measured, and so how they compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Each tool alone for its blocks: ratios of its deaths to the other row's, block by
    /// block (the k-th block of each, run in the same round).
    Alone,
    /// Every tool during every death: ratios over the same deaths, quarter by quarter.
    Crowd,
}

/// The figures of one tool.
#[derive(Debug, Clone)]
pub struct PeerFigures {
    pub name: String,
    kind: Kind,
    /// The build it belongs to, for a liveness row.
    build: Option<&'static str>,
    pub dist: Dist,
    /// Its latencies in exit order, in parts: its blocks alone, the quarters of the run in
    /// the crowd. How much p50 wanders between them is the run's own measure of noise.
    parts: Vec<Vec<u64>>,
    /// Against the raw tracer the ratios are to, at p50 and p99.
    pub to_base: Option<(Ratio, Ratio)>,
    /// Against the floor (`ebpf-floor`), the same way.
    pub to_floor: Option<(Ratio, Ratio)>,
    lost: usize,
    startup_ms: Option<f64>,
    /// Taken in the crowd only.
    cpu_ms_per_20k: Option<f64>,
    pub bpf: Option<ProgramCost>,
}

/// One table of the section.
#[derive(Debug)]
pub struct Table {
    mode: Mode,
    pub figures: Vec<PeerFigures>,
    /// The raw tracer the ratios are to.
    base: Option<String>,
    /// Deaths: each tool's alone, all of them in the crowd.
    samples: usize,
}

/// The section's result: both tables, skipped tools with the reason, harness errors.
#[derive(Debug)]
pub struct PeersReport {
    /// Each tool alone: what the goals read.
    pub alone: Table,
    pub crowd: Table,
    pub seed: u64,
    pub block: usize,
    /// The rows of each block alone, in the order they ran.
    order: Vec<String>,
    pub skipped: Vec<(String, String)>,
    pub storm: usize,
    pub errors: Vec<String>,
}

/// Each tool's CPU ticks and each group's eBPF cost over the storm.
type Costs = (Vec<u64>, Vec<Option<ProgramCost>>);

pub fn run(builds: &[Build], plan: PeersPlan) -> Result<PeersReport> {
    let logs = tempfile::Builder::new()
        .prefix("liveness-bench-peers")
        .tempdir()?;
    let _stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(e) => {
            eprintln!(
                "bench: peers: no eBPF run-time statistics ({e}); BPF ns per run stays empty"
            );
            None
        }
    };
    // Declared before the tools: they are stopped before tracefs is unmounted.
    let (_tracefs, external) = if !plan.external {
        let reason = "smoke run: the external tools are installed and started only by --quick \
                      and full runs";
        (None, Err(reason.to_owned()))
    } else if !setup::is_root() {
        (
            None,
            Err("not root: the tracers load eBPF programs".to_owned()),
        )
    } else {
        match setup::Tracefs::ensure() {
            Ok(tracefs) => (Some(tracefs), Ok(())),
            Err(e) => (None, Err(format!("{e:#}"))),
        }
    };
    let skipped: Vec<(String, String)> = match &external {
        Ok(()) => Vec::new(),
        Err(reason) => EXTERNAL
            .iter()
            .map(|name| ((*name).to_owned(), reason.clone()))
            .collect(),
    };
    for (name, reason) in &skipped {
        eprintln!("bench: peers: skipping {name}: {reason}");
    }
    realtime_reader();
    let report = measure(builds, plan, external.is_ok(), logs.path(), skipped);
    normal_reader();
    report
}

/// Both modes, alone first; `skipped`: the tools already known not to run.
fn measure(
    builds: &[Build],
    plan: PeersPlan,
    external: bool,
    logs: &Path,
    mut skipped: Vec<(String, String)>,
) -> Result<PeersReport> {
    let mut errors = Vec::new();

    let tools = Tool::all(builds.len(), external, true);
    let blocks = block_plan(tools.len(), plan.alone, plan.block, plan.seed);
    eprintln!(
        "bench: peers: alone: {} exits per tool in {} blocks of up to {}, order seeded {}",
        plan.alone,
        blocks.len(),
        plan.block,
        plan.seed
    );
    let mut alone = Peers::new(builds.len());
    let mut order = Vec::new();
    for block in &blocks {
        let tool = tools[block.tool];
        let name = tool.name(builds);
        if alone.skipped.iter().any(|(skipped, _)| *skipped == name) {
            continue;
        }
        let group = alone.groups.len();
        if !alone.start(tool, builds, logs)? {
            continue;
        }
        order.push(name);
        alone.rounds(block.deaths, tool.build())?;
        if let Err(e) = alone.stop(group) {
            errors.push(format!("peers: {e:#}"));
        }
    }
    let alone_table = alone.table(builds, Mode::Alone, plan.alone, None, &mut errors);

    let mut crowd = Peers::new(builds.len());
    for tool in Tool::all(builds.len(), external, false) {
        crowd.start(tool, builds, logs)?;
    }
    let samples = plan.samples * builds.len();
    eprintln!(
        "bench: peers: crowd: {samples} exits seen by {} tools",
        crowd.peers.len()
    );
    crowd.rounds(samples, None)?;
    let costs = crowd.storm_costs(plan.storm)?;
    let crowd_table = crowd.table(
        builds,
        Mode::Crowd,
        samples,
        Some((&costs, plan.storm)),
        &mut errors,
    );
    for group in 0..crowd.groups.len() {
        if let Err(e) = crowd.stop(group) {
            errors.push(format!("peers: {e:#}"));
        }
    }
    for (name, reason) in alone.skipped.drain(..).chain(crowd.skipped.drain(..)) {
        if !skipped.iter().any(|(known, _)| *known == name) {
            skipped.push((name, reason));
        }
    }
    Ok(PeersReport {
        alone: alone_table,
        crowd: crowd_table,
        seed: plan.seed,
        block: plan.block,
        order,
        skipped,
        storm: plan.storm,
        errors,
    })
}

impl Peers {
    fn new(builds: usize) -> Peers {
        Peers {
            builds,
            ..Peers::default()
        }
    }

    /// Starts a tool's group and waits until it reports exits. An external tool that cannot
    /// run is skipped, with the reason: returns whether it started.
    fn start(&mut self, tool: Tool, builds: &[Build], logs: &Path) -> Result<bool> {
        match tool {
            Tool::Watcher(name) => {
                let (row, probe_wait, waited_for) = watcher_row(name);
                let mut command = Command::new(std::env::current_exe()?);
                command.args([watchers::WATCHER_ARG, name]);
                self.start_tool(
                    Row {
                        name: row.to_owned(),
                        kind: if name == "ebpf-floor" {
                            Kind::Floor
                        } else {
                            Kind::Own
                        },
                        format: Format::Pid,
                        waited_for,
                    },
                    command,
                    probe_wait,
                    logs,
                )
                .with_context(|| format!("starting the bench's {row}"))?;
            }
            Tool::Liveness { build, source } => {
                self.start_liveness(build, &builds[build], source, logs)
                    .with_context(|| {
                        format!(
                            "starting liveness --sources {source} ({})",
                            builds[build].name()
                        )
                    })?;
            }
            Tool::External(name) => {
                if let Err(e) = self.start_external(name, logs) {
                    if self.peers.last().is_some_and(|p| p.name == name) {
                        self.peers.pop();
                        self.groups.pop();
                    }
                    eprintln!("bench: peers: skipping {name}: {e:#}");
                    self.skipped.push((name.into(), format!("{e:#}")));
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Stops a group: its rows are no longer read, and no more deaths are owed to them.
    /// A daemon that failed is a harness failure.
    fn stop(&mut self, group: usize) -> Result<()> {
        for peer in self.peers.iter_mut().filter(|p| p.group == group) {
            peer.running = false;
        }
        let group = &mut self.groups[group];
        for child in &mut group.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        group.children.clear();
        match group.daemon.take() {
            Some(mut daemon) => daemon::stop(&mut daemon),
            None => Ok(()),
        }
    }

    /// The table of what the rows reported; `costs` from the crowd's storm. A row's runs
    /// (one in the crowd, one per block alone) make its parts.
    fn table(
        &self,
        builds: &[Build],
        mode: Mode,
        samples: usize,
        costs: Option<(&Costs, usize)>,
        errors: &mut Vec<String>,
    ) -> Table {
        let mut names: Vec<&str> = Vec::new();
        for peer in &self.peers {
            if !names.contains(&peer.name.as_str()) {
                names.push(&peer.name);
            }
        }
        let runs = |name: &str| runs_named(&self.peers, name);
        // Alone, each run is a part; in the crowd, the one run's deaths are cut in quarters.
        let parts_of = |runs: &[usize]| -> Vec<Vec<u64>> {
            match mode {
                Mode::Alone => runs
                    .iter()
                    .map(|&i| self.peers[i].latencies(&self.peers[i].owed))
                    .collect(),
                Mode::Crowd => runs
                    .iter()
                    .flat_map(|&i| {
                        quarters(&self.peers[i].owed).map(move |q| self.peers[i].latencies(q))
                    })
                    .collect(),
            }
        };
        // The ratios are to exitsnoop, or without it to the fastest raw tracer by p50.
        let base = names
            .iter()
            .filter(|name| self.peers[runs(name)[0]].kind == Kind::Tracer)
            .map(|name| (*name, Dist::of_ns(&parts_of(&runs(name)).concat())))
            .filter(|(_, d)| d.samples > 0)
            .min_by(|(a, da), (b, db)| {
                (*b == "exitsnoop")
                    .cmp(&(*a == "exitsnoop"))
                    .then(da.p50.total_cmp(&db.p50))
            })
            .map(|(name, _)| name);
        let floor = names
            .iter()
            .find(|name| self.peers[runs(name)[0]].kind == Kind::Floor)
            .copied();
        let mut figures = Vec::new();
        for name in &names {
            let runs = runs(name);
            let first = &self.peers[runs[0]];
            let parts = parts_of(&runs);
            let samples = parts.iter().map(Vec::len).sum::<usize>();
            let owed = runs
                .iter()
                .map(|&i| self.peers[i].owed.len())
                .sum::<usize>();
            let lost = owed - samples;
            if lost > 0 && first.kind.checked() {
                let why: Vec<&str> = runs
                    .iter()
                    .filter_map(|&i| self.peers[i].ended.as_deref())
                    .collect();
                errors.push(format!(
                    "peers {name}: {lost} of {owed} exits never reported{}",
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", why.join("; "))
                    }
                ));
            }
            // Alone, the other row's own blocks; in the crowd, its reports of this row's
            // deaths.
            let against = |reference: &str| {
                let theirs: Vec<Vec<u64>> = match mode {
                    Mode::Alone => parts_of(&runs_named(&self.peers, reference)),
                    Mode::Crowd => {
                        let reference = &self.peers[runs_named(&self.peers, reference)[0]];
                        quarters(&first.owed)
                            .map(|q| reference.latencies(q))
                            .collect()
                    }
                };
                (
                    Ratio::of_parts(&parts, &theirs, |d| d.p50),
                    Ratio::of_parts(&parts, &theirs, |d| d.p99),
                )
            };
            let startups: Vec<f64> = runs
                .iter()
                .filter_map(|&i| self.peers[i].startup_ns)
                .map(|ns| ns as f64 / 1e6)
                .collect();
            figures.push(PeerFigures {
                name: (*name).to_owned(),
                kind: first.kind,
                build: first.build.map(|b| builds[b].name()),
                dist: Dist::of_ns(&parts.concat()),
                to_base: base.map(against),
                to_floor: floor.map(against),
                parts,
                lost,
                startup_ms: (!startups.is_empty()).then(|| median(&startups)),
                cpu_ms_per_20k: costs.map(|((ticks, _), storm)| {
                    ticks[runs[0]] as f64 * 10.0 * CPU_PER_SPAWNS as f64 / storm.max(1) as f64
                }),
                bpf: costs.and_then(|((_, bpf), _)| bpf[first.group]),
            });
        }
        Table {
            mode,
            figures,
            base: base.map(str::to_owned),
            samples,
        }
    }

    /// Starts one tool process (its stdout is its report; the bench's own watchers take
    /// PIDs on stdin) and waits until it reports a probe's exit.
    fn start_tool(
        &mut self,
        row: Row,
        mut command: Command,
        probe_wait: Duration,
        logs: &Path,
    ) -> Result<()> {
        let log = logs.join(format!("{}.log", row.name));
        let tracks = matches!(row.kind, Kind::Own | Kind::Floor);
        let started_ns = monotonic_ns();
        let mut child = command
            .stdin(if tracks {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {command:?}"))?;
        let output = nonblocking(child.stdout.take().context("stdout")?.into())?;
        let tracker = match child.stdin.take() {
            Some(stdin) => Tracker::Stdin(stdin),
            None => Tracker::Nothing,
        };
        let pid = child.id();
        self.groups.push(Group {
            tracker,
            build: None,
            children: vec![child],
            daemon: None,
            programs: Vec::new(),
            started_ns,
            probe_wait,
            log,
        });
        self.add_peer(row, output, Vec::new(), vec![pid]);
        self.await_startup()
    }

    /// Adds a row to the newest group.
    fn add_peer(&mut self, row: Row, output: OwnedFd, pending: Vec<u8>, cpu_pids: Vec<u32>) {
        self.peers.push(Peer {
            name: row.name,
            kind: row.kind,
            group: self.groups.len() - 1,
            build: self.groups.last().and_then(|g| g.build),
            output,
            pending,
            format: row.format,
            seen: HashMap::new(),
            owed: Vec::new(),
            acks: 0,
            ended: None,
            running: true,
            startup_ns: None,
            waited_for: row.waited_for,
            cpu_pids,
        });
    }

    /// A daemon of build number `index`, a direct subscriber on its socket and a
    /// `liveness watch --json` of the same build.
    fn start_liveness(
        &mut self,
        index: usize,
        build: &Build,
        source: &str,
        logs: &Path,
    ) -> Result<()> {
        let started_ns = monotonic_ns();
        let daemon = build.start(source, &[])?;
        let reader = daemon::subscribe(&daemon.socket)?;
        let buffered = reader.buffer().to_vec();
        let stream = reader.into_inner();
        stream.set_nonblocking(true)?;
        let name = format!("liveness-{source}");
        let suffix = build.suffix();
        let log = logs.join(format!("{name}-watch{suffix}.log"));
        let mut watch = build.watch(&daemon.socket, &log)?;
        let watch_output = nonblocking(watch.stdout.take().context("stdout")?.into())?;
        let (daemon_pid, watch_pid) = (daemon.pid(), watch.id());
        self.groups.push(Group {
            tracker: Tracker::Daemon,
            build: Some(index),
            children: vec![watch],
            programs: bpf_program_ids(daemon_pid),
            daemon: Some(daemon),
            started_ns,
            probe_wait: Duration::from_millis(200),
            log,
        });
        let row = |name: String| Row {
            name,
            kind: Kind::Liveness,
            format: Format::Events,
            waited_for: true,
        };
        self.add_peer(
            row(format!("{name}{suffix}")),
            stream.into(),
            buffered,
            vec![daemon_pid],
        );
        self.add_peer(
            row(format!("{name}-watch{suffix}")),
            watch_output,
            Vec::new(),
            vec![daemon_pid, watch_pid],
        );
        self.await_startup()
    }

    /// One of [`EXTERNAL`], installed if needed, and the eBPF programs it holds.
    fn start_external(&mut self, name: &'static str, logs: &Path) -> Result<()> {
        let (command, kind, format) = match name {
            "exitsnoop" => {
                setup::ensure_program("exitsnoop", &["libbpf-tools"])?;
                let mut command = Command::new("stdbuf");
                command.args(["-oL", "exitsnoop"]);
                (command, Kind::Tracer, Format::Columns { pid_at: None })
            }
            "bpftrace" => {
                setup::ensure_program("bpftrace", &["bpftrace"])?;
                let mut command = Command::new("bpftrace");
                command.args([
                    "-B",
                    "line",
                    "-e",
                    r#"tracepoint:sched:sched_process_exit /pid == tid/ { printf("%d\n", pid); }"#,
                ]);
                (command, Kind::Tracer, Format::Pid)
            }
            "exitsnoop-bpfcc" => {
                setup::ensure_program("exitsnoop-bpfcc", &["bpfcc-tools", "python3-bpfcc"])?;
                let headers = setup::bcc_kernel_headers().context("kernel headers for BCC")?;
                let mut command = Command::new("exitsnoop-bpfcc");
                command
                    .env("PYTHONUNBUFFERED", "1")
                    .env("BCC_KERNEL_SOURCE", headers);
                (command, Kind::Tracer, Format::Columns { pid_at: None })
            }
            "forkstat" => {
                setup::ensure_program("forkstat", &["forkstat"])?;
                let mut command = Command::new("stdbuf");
                command.args(["-oL", "forkstat", "-e", "exit"]);
                // Time, event, then the PID, right-aligned under a shorter header.
                (command, Kind::Tool, Format::Field(2))
            }
            other => bail!("no such tool: {other}"),
        };
        let before: HashSet<u32> = ProgramCost::loaded()
            .unwrap_or_default()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        self.start_tool(
            Row {
                name: name.into(),
                kind,
                format,
                waited_for: true,
            },
            command,
            Duration::from_millis(100),
            logs,
        )?;
        if kind != Kind::Tracer {
            return Ok(());
        }
        let group = self.groups.last_mut().context("no group")?;
        let pid = group.children[0].id();
        group.programs = bpf_program_ids(pid);
        if group.programs.is_empty() {
            // A tool that closed its program descriptors after attaching: the programs
            // loaded while it started, but not liveness's (other daemons may run here).
            let liveness = PROGRAM_NAMES.map(str::as_bytes);
            group.programs = ProgramCost::loaded()
                .unwrap_or_default()
                .into_iter()
                .filter(|(id, name)| !before.contains(id) && !liveness.contains(&name.as_slice()))
                .map(|(id, _)| id)
                .collect();
        }
        Ok(())
    }

    /// Probes the newest group until each of its tools has reported an exit: start-up time
    /// is from launch to that report. A probe is an owner like the measured ones.
    fn await_startup(&mut self) -> Result<()> {
        let group = self.groups.len() - 1;
        let deadline = Instant::now() + Duration::from_secs(180);
        let members: Vec<usize> = (0..self.peers.len())
            .filter(|&i| self.peers[i].group == group)
            .collect();
        let mut probes = Vec::new();
        while members.iter().any(|&i| self.peers[i].startup_ns.is_none()) {
            if let Some(peer) = members
                .iter()
                .map(|&i| &self.peers[i])
                .find(|p| p.ended.is_some())
            {
                bail!(
                    "{} stopped ({}): {}",
                    peer.name,
                    peer.ended.as_deref().unwrap_or(""),
                    log_tail(&self.groups[group].log)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "no exit reported within 180 s of the start: {}",
                    log_tail(&self.groups[group].log)
                );
            }
            let mut probe = Owners::spawn(1)?;
            let pid = probe.pids[0];
            self.watched.insert(pid);
            self.track(group, &[pid])?;
            probe.release(1)?;
            probe.next_report()?;
            let wait = Instant::now() + self.groups[group].probe_wait;
            self.pump(wait, |peers| {
                members.iter().all(|&i| peers[i].seen.contains_key(&pid))
            })?;
            probes.push(pid);
            // A report of an earlier probe that came late counts too: the tool was up.
            let started_ns = self.groups[group].started_ns;
            for &i in &members {
                let peer = &mut self.peers[i];
                if peer.startup_ns.is_none() {
                    peer.startup_ns = probes
                        .iter()
                        .filter_map(|pid| peer.seen.get(pid))
                        .min()
                        .map(|at| at.saturating_sub(started_ns));
                }
            }
        }
        Ok(())
    }

    /// Tells one group to track these PIDs and waits until it has.
    fn track(&mut self, group: usize, pids: &[u32]) -> Result<()> {
        let target = &mut self.groups[group];
        match &mut target.tracker {
            Tracker::Nothing => Ok(()),
            Tracker::Daemon => {
                let daemon = target.daemon.as_ref().context("no daemon")?;
                // A PID can come again over a run, its earlier session still kept.
                self.registrations += 1;
                let registration = self.registrations;
                let session = |pid| format!("peer-{registration}-{pid}");
                register_all(&daemon.socket, pids, session, 1).with_context(|| {
                    let log = daemon.log();
                    let tail: Vec<&str> = log.lines().rev().take(3).collect();
                    format!("registering with livenessd (log, last lines first: {tail:?})")
                })?;
                Ok(())
            }
            Tracker::Stdin(stdin) => {
                let mut batch: String = pids.iter().map(|pid| format!("{pid}\n")).collect();
                batch.push('\n');
                if let Err(e) = stdin
                    .write_all(batch.as_bytes())
                    .and_then(|()| stdin.flush())
                {
                    bail!("writing PIDs to a watcher: {e}: {}", log_tail(&target.log));
                }
                let wanted: Vec<(usize, usize)> = self
                    .peers
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.group == group)
                    .map(|(i, p)| (i, p.acks + 1))
                    .collect();
                let acked = self.pump(Instant::now() + Duration::from_secs(10), |peers| {
                    wanted.iter().all(|&(i, acks)| peers[i].acks >= acks)
                })?;
                if !acked {
                    bail!(
                        "a watcher did not acknowledge its PIDs within 10 s: {}",
                        log_tail(&self.groups[group].log)
                    );
                }
                Ok(())
            }
        }
    }

    /// Lets `samples` owners exit one at a time, each once every running tool has it
    /// tracked, and waits for each exit to be reported by every running tool the rounds
    /// wait for. Each owner is tracked by the daemons of `build`, or without one by each
    /// build's in turn.
    fn rounds(&mut self, samples: usize, build: Option<usize>) -> Result<()> {
        let mut done = 0;
        while done < samples {
            let mut owners = Owners::spawn(BATCH.min(samples - done))?;
            self.watched.extend(&owners.pids);
            for &pid in &owners.pids {
                let turn = build.unwrap_or(self.owner_build.len() % self.builds.max(1));
                self.owner_build.insert(pid, turn);
            }
            for group in 0..self.groups.len() {
                let running = self.peers.iter().any(|p| p.group == group && p.running);
                let build = self.groups[group].build;
                let pids: Vec<u32> = owners
                    .pids
                    .iter()
                    .copied()
                    .filter(|pid| build.is_none() || build == self.owner_build.get(pid).copied())
                    .collect();
                if running && !pids.is_empty() {
                    self.track(group, &pids)?;
                }
            }
            for _ in 0..owners.pids.len() {
                owners.release(1)?;
                let exit = owners.next_report()?;
                done += 1;
                let turn = self.owner_build.get(&exit.pid).copied();
                for peer in &mut self.peers {
                    if peer.running && peer.reports(turn.as_ref()) {
                        peer.owed.push((exit.pid, exit.exit_ns));
                    }
                }
                self.pump(Instant::now() + ROUND_TIMEOUT, |peers| {
                    peers
                        .iter()
                        .filter(|p| p.waited_for && p.running && p.ended.is_none())
                        .filter(|p| p.reports(turn.as_ref()))
                        .all(|p| p.seen.contains_key(&exit.pid))
                })?;
            }
        }
        // The slow pollers report the last exits after the rounds.
        self.pump(Instant::now() + Duration::from_secs(3), |peers| {
            peers
                .iter()
                .filter(|p| !p.waited_for && p.running && p.ended.is_none())
                .all(|p| p.owed.iter().all(|(pid, _)| p.seen.contains_key(pid)))
        })?;
        Ok(())
    }

    /// Runs the storm of untracked exits while reading every tool's output (a tool whose
    /// pipe is full would stall and look cheap), and returns each tool's CPU ticks and
    /// each group's eBPF cost over it.
    fn storm_costs(&mut self, storm: usize) -> Result<Costs> {
        let ticks = |peers: &Peers| -> Vec<u64> {
            peers
                .peers
                .iter()
                .map(|p| {
                    p.cpu_pids
                        .iter()
                        .map(|&pid| procs::cpu_ticks(pid).unwrap_or(0))
                        .sum()
                })
                .collect()
        };
        let costs = |peers: &Peers| -> Vec<Option<ProgramCost>> {
            peers
                .groups
                .iter()
                .map(|g| {
                    (!g.programs.is_empty())
                        .then(|| ProgramCost::of_ids(&g.programs).ok())
                        .flatten()
                })
                .collect()
        };
        eprintln!("bench: peers: {storm} untracked spawns for the costs");
        let (ticks_before, costs_before) = (ticks(self), costs(self));
        std::thread::scope(|scope| -> Result<()> {
            let worker = scope.spawn(|| procs::storm(storm));
            while !worker.is_finished() {
                self.pump(Instant::now() + Duration::from_millis(20), |_| false)?;
            }
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("storm panicked"))?
                .map(|_| ())
        })?;
        // What the tools still have to print about the storm is part of its cost.
        self.pump(Instant::now() + Duration::from_millis(500), |_| false)?;
        let ticks_after = ticks(self);
        let costs_after = costs(self);
        let ticks = ticks_after
            .iter()
            .zip(&ticks_before)
            .map(|(after, before)| after.saturating_sub(*before))
            .collect();
        let costs = costs_after
            .into_iter()
            .zip(costs_before)
            .map(|(after, before)| Some(after?.since(before?)))
            .collect();
        Ok((ticks, costs))
    }

    /// Reads every tool's output until `done` holds or `deadline` passes; returns whether
    /// `done` held. Lines are stamped with the time `poll` returned.
    fn pump(&mut self, deadline: Instant, done: impl Fn(&[Peer]) -> bool) -> Result<bool> {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if done(&self.peers) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let live: Vec<usize> = (0..self.peers.len())
                .filter(|&i| self.peers[i].running && self.peers[i].ended.is_none())
                .collect();
            let mut fds: Vec<libc::pollfd> = live
                .iter()
                .map(|&i| libc::pollfd {
                    fd: self.peers[i].output.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let timeout = (deadline - now).as_micros().div_ceil(1000) as i32;
            // SAFETY: polling descriptors we own, through a live array.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            let stamp = monotonic_ns();
            if ready < 0 {
                let error = std::io::Error::last_os_error();
                if error.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error).context("poll");
            }
            for (fd, &i) in fds.iter().zip(&live) {
                if fd.revents != 0 {
                    self.read_peer(i, stamp, &mut chunk)?;
                }
            }
        }
    }

    fn read_peer(&mut self, index: usize, stamp: u64, chunk: &mut [u8]) -> Result<()> {
        let peer = &mut self.peers[index];
        loop {
            // SAFETY: reading into a live buffer from a non-blocking descriptor we own.
            let n = unsafe {
                libc::read(
                    peer.output.as_raw_fd(),
                    chunk.as_mut_ptr().cast(),
                    chunk.len(),
                )
            };
            if n > 0 {
                peer.pending.extend_from_slice(&chunk[..n as usize]);
                continue;
            }
            if n == 0 {
                peer.ended = Some("its output ended".into());
                break;
            }
            let error = std::io::Error::last_os_error();
            match error.kind() {
                std::io::ErrorKind::WouldBlock => break,
                std::io::ErrorKind::Interrupted => {}
                _ => {
                    peer.ended = Some(format!("reading its output failed: {error}"));
                    break;
                }
            }
        }
        let mut consumed = 0;
        while let Some(end) = peer.pending[consumed..].iter().position(|&b| b == b'\n') {
            let line = &peer.pending[consumed..consumed + end];
            consumed += end + 1;
            let pid = match &mut peer.format {
                Format::Columns { pid_at: None } => {
                    let text = String::from_utf8_lossy(line);
                    peer.format = Format::Columns {
                        pid_at: text.find(" PID ").map(|at| at + 1),
                    };
                    None
                }
                Format::Columns { pid_at: Some(at) } => line
                    .get(*at..)
                    .and_then(|rest| std::str::from_utf8(rest).ok())
                    .and_then(|rest| rest.split_ascii_whitespace().next()?.parse().ok()),
                Format::Field(field) => std::str::from_utf8(line)
                    .ok()
                    .and_then(|l| l.split_ascii_whitespace().nth(*field)?.parse().ok()),
                Format::Pid if line == b"ack" => {
                    peer.acks += 1;
                    None
                }
                Format::Pid => std::str::from_utf8(line)
                    .ok()
                    .and_then(|l| l.trim().parse().ok()),
                Format::Events => {
                    let text = std::str::from_utf8(line).context("a non-UTF-8 stream line")?;
                    Ended::parse(text, stamp)
                        .with_context(|| peer.name.clone())?
                        .and_then(|ended| {
                            let (_, pid) = ended.session.strip_prefix("peer-")?.rsplit_once('-')?;
                            pid.parse().ok()
                        })
                }
            };
            if let Some(pid) = pid
                && self.watched.contains(&pid)
            {
                peer.seen.entry(pid).or_insert(stamp);
            }
        }
        peer.pending.drain(..consumed);
        Ok(())
    }
}

/// Makes this thread, which stamps every tool's lines, a real-time one while it runs the
/// section (`SCHED_FIFO`, reset in every process and thread it creates): otherwise, on a
/// loaded machine, the stamps measure when the harness got a CPU back, the same for every
/// tool. Without root it stays as it is, and says so.
fn realtime_reader() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: changing our own thread's policy with a live parameter.
    let set = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if set != 0 {
        eprintln!(
            "bench: peers: the reader stays at normal priority ({}): stamps include its wake-ups",
            std::io::Error::last_os_error()
        );
    }
}

/// Back to normal priority once the section is over.
fn normal_reader() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in realtime_reader.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
}

fn nonblocking(fd: OwnedFd) -> Result<OwnedFd> {
    // SAFETY: reading and setting the flags of a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error()).context("O_NONBLOCK");
        }
    }
    Ok(fd)
}

/// The last lines a tool wrote to its log, for an error message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() {
        format!("nothing in {}", log.display())
    } else {
        tail
    }
}

impl Table {
    /// The raw tracer the ratios are to: exitsnoop, or without it the fastest by p50.
    pub fn base(&self) -> Option<&PeerFigures> {
        self.find(self.base.as_deref()?)
    }

    pub fn find(&self, name: &str) -> Option<&PeerFigures> {
        self.figures
            .iter()
            .find(|f| f.name == name && f.dist.samples > 0)
    }

    /// What a row's parts are.
    fn parts(&self) -> &'static str {
        match self.mode {
            Mode::Alone => "blocks",
            Mode::Crowd => "quarters",
        }
    }

    /// Each liveness row of the build under test against the same row of the baseline, at
    /// p50 and p99, part by part: `(row, p50, p99)`.
    pub fn versus_baseline(&self) -> Vec<(&str, Ratio, Ratio)> {
        self.figures
            .iter()
            .filter(|f| f.build == Some("new"))
            .filter_map(|new| {
                let base = self.find(&format!("{}@base", new.name))?;
                let at = |at: fn(&Dist) -> f64| Ratio::of_parts(&new.parts, &base.parts, at);
                Some((new.name.as_str(), at(|d| d.p50), at(|d| d.p99)))
            })
            .collect()
    }

    pub fn json(&self) -> Value {
        let parts = self.parts();
        let tools: Vec<Value> = self
            .figures
            .iter()
            .map(|f| {
                let mut value = f.dist.json();
                value["name"] = json!(f.name);
                value["kind"] = json!(f.kind.name());
                value["build"] = json!(f.build);
                value["lost"] = json!(f.lost);
                value["ratio_p50"] = json!(f.to_base.as_ref().map(|(p50, _)| round(p50.value)));
                value["ratio_p99"] = json!(f.to_base.as_ref().map(|(_, p99)| round(p99.value)));
                value["ratio_to_floor_p50"] =
                    json!(f.to_floor.as_ref().map(|(p50, _)| round(p50.value)));
                value["ratio_to_floor_p99"] =
                    json!(f.to_floor.as_ref().map(|(_, p99)| round(p99.value)));
                value[format!("p50_{parts}_us")] = json!(
                    f.parts
                        .iter()
                        .map(|part| round(Dist::of_ns(part).p50))
                        .collect::<Vec<_>>()
                );
                value[format!("ratio_p50_{parts}")] =
                    json!(f.to_base.as_ref().map(|(p50, _)| {
                        p50.parts.iter().map(|&r| round(r)).collect::<Vec<_>>()
                    }));
                value[format!("ratio_p99_{parts}")] =
                    json!(f.to_base.as_ref().map(|(_, p99)| {
                        p99.parts.iter().map(|&r| round(r)).collect::<Vec<_>>()
                    }));
                value["startup_ms"] = json!(f.startup_ms.map(round));
                value["cpu_ms_per_20k_spawns"] = json!(f.cpu_ms_per_20k.map(round));
                value["bpf_runs"] = json!(f.bpf.map(|c| c.runs));
                value["bpf_ns_per_run"] = json!(f.bpf.and_then(ProgramCost::ns_per_run).map(round));
                value
            })
            .collect();
        json!({
            "samples": self.samples,
            "ratio_base": self.base,
            "tools": tools,
            "versus_baseline": self.versus_baseline().into_iter().map(|(name, p50, p99)| {
                json!({"name": name, "p50": p50.json(), "p99": p99.json()})
            }).collect::<Vec<_>>(),
        })
    }

    fn print(&self) {
        println!(
            "{:<26} {:>7} {:>5} {:>9} {:>9} {:>9} {:>10} {:>6} {:>6} {:>10} {:>9} {:>8}",
            "tool",
            "samples",
            "lost",
            "p50",
            "p90",
            "p99",
            "max",
            "x p50",
            "x p99",
            "start ms",
            "CPU ms",
            "BPF ns"
        );
        let ratio = |r: Option<&Ratio>| r.map_or("-".to_owned(), |r| format!("{:.2}", r.value));
        for f in &self.figures {
            println!(
                "{:<26} {:>7} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>6} {:>6} {:>10} {:>9} {:>8}",
                f.name,
                f.dist.samples,
                f.lost,
                f.dist.p50,
                f.dist.p90,
                f.dist.p99,
                f.dist.max,
                ratio(f.to_base.as_ref().map(|(p50, _)| p50)),
                ratio(f.to_base.as_ref().map(|(_, p99)| p99)),
                f.startup_ms.map_or("-".to_owned(), |ms| format!("{ms:.0}")),
                f.cpu_ms_per_20k
                    .map_or("-".to_owned(), |ms| format!("{ms:.0}")),
                f.bpf
                    .and_then(ProgramCost::ns_per_run)
                    .map_or("-".to_owned(), |ns| format!("{ns:.0}")),
            );
        }
        match (&self.base, self.mode) {
            (Some(base), Mode::Alone) => println!(
                "  x: ratio to {base}, each over its own deaths, alone (a build's rows: its own blocks)"
            ),
            (Some(base), Mode::Crowd) => println!(
                "  x: ratio to {base} over the same deaths (a build's rows: its own half of them)"
            ),
            (None, _) => println!("  x: no raw tracer ran, no ratios"),
        }
        let parts = self.parts();
        println!(
            "  Noise: p50 in each of the {parts}, and the x p50 and x p99 of each (min .. max)"
        );
        for f in &self.figures {
            let p50s = Ratio {
                value: 0.0,
                parts: f.parts.iter().map(|part| Dist::of_ns(part).p50).collect(),
            };
            let (low, high) = p50s.spread();
            println!(
                "  {:<26} p50 {:>9.1} .. {:>9.1}{}",
                f.name,
                low,
                high,
                f.to_base.as_ref().map_or(String::new(), |(p50, p99)| {
                    let (low, high) = p50.spread();
                    let (low99, high99) = p99.spread();
                    format!("   x p50 {low:.2} .. {high:.2}   x p99 {low99:.2} .. {high99:.2}")
                })
            );
        }
        if let Some(floor) = self.figures.iter().find(|f| f.kind == Kind::Floor) {
            println!(
                "  Floor: {} (liveness's eBPF object, a poll loop, one write per exit) p50 {:.1} us{}",
                floor.name,
                floor.dist.p50,
                floor.to_base.as_ref().map_or(String::new(), |(p50, _)| {
                    format!(", {} the tracer", p50.show())
                })
            );
            for f in self.figures.iter().filter(|f| f.kind == Kind::Liveness) {
                if let Some((p50, p99)) = &f.to_floor {
                    println!(
                        "    {:<26} x floor p50 {}  p99 {}",
                        f.name,
                        p50.show(),
                        p99.show()
                    );
                }
            }
        }
        let versus = self.versus_baseline();
        if !versus.is_empty() {
            println!(
                "  New against the baseline, each on its own deaths: p50 and p99 ratios ({parts})"
            );
            for (name, p50, p99) in versus {
                println!("  {name:<26} p50 {}   p99 {}", p50.show(), p99.show());
            }
        }
    }
}

impl PeersReport {
    pub fn json(&self) -> Value {
        let mut value = self.alone.json();
        value["seed"] = json!(self.seed);
        value["block"] = json!(self.block);
        value["order"] = json!(self.order);
        let mut crowd = self.crowd.json();
        crowd["storm_spawns"] = json!(self.storm);
        value["crowd"] = crowd;
        value["skipped"] = json!(
            self.skipped
                .iter()
                .map(|(name, reason)| json!({"name": name, "reason": reason}))
                .collect::<Vec<_>>()
        );
        value
    }

    pub fn print(&self) {
        println!(
            "\nPeers, one tool at a time: exit -> the tool's line read by the harness (us), {} \
             exits per tool alone in blocks of up to {}, {} blocks in rounds shuffled from seed {}",
            self.alone.samples,
            self.block,
            self.order.len(),
            self.seed
        );
        self.alone.print();
        println!(
            "\nPeers, all at once (the crowd): {} exits seen by every tool at once",
            self.crowd.samples
        );
        self.crowd.print();
        println!(
            "  CPU ms: the tool's processes' CPU time per {CPU_PER_SPAWNS} untracked spawns \
             ({} run); BPF ns: its eBPF programs' mean run time per exit over them",
            self.storm
        );
        for (name, reason) in &self.skipped {
            println!("  skipped {name}: {reason}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn peer(format: Format) -> Peers {
        let (read, _write) = std::os::unix::net::UnixStream::pair().unwrap();
        read.set_nonblocking(true).unwrap();
        let mut peers = Peers::default();
        peers.groups.push(Group {
            tracker: Tracker::Nothing,
            build: None,
            children: Vec::new(),
            daemon: None,
            programs: Vec::new(),
            started_ns: 0,
            probe_wait: Duration::ZERO,
            log: PathBuf::new(),
        });
        let row = Row {
            name: "t".into(),
            kind: Kind::Tracer,
            format,
            waited_for: true,
        };
        peers.add_peer(row, read.into(), Vec::new(), Vec::new());
        peers
    }

    fn feed(peers: &mut Peers, text: &str) {
        peers.peers[0].pending.extend_from_slice(text.as_bytes());
        peers.read_peer(0, 7, &mut [0u8; 16]).unwrap();
    }

    #[test]
    fn exitsnoop_columns_find_the_pid_after_a_command_with_spaces() {
        let mut peers = peer(Format::Columns { pid_at: None });
        peers.watched.extend([4242, 77]);
        feed(
            &mut peers,
            "PCOMM            PID     PPID    TID     AGE(s)  EXIT_CODE\n\
             opt cgu.02       77      1       77      0.01    0\n\
             liveness-bench   4242    1       4242    0.00    0\n\
             true             999     1       999     0.00    0\n",
        );
        let seen: BTreeMap<u32, u64> = peers.peers[0].seen.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            seen,
            BTreeMap::from([(77, 7), (4242, 7)]),
            "PIDs read from the PID column"
        );
    }

    #[test]
    fn pid_lines_count_acks_and_keep_only_watched_pids_once() {
        let mut peers = peer(Format::Pid);
        peers.watched.insert(10);
        feed(&mut peers, "ack\n10\n11\nAttaching 1 probe...\n10\npartial");
        let peer = &peers.peers[0];
        assert_eq!(peer.acks, 1, "one acknowledgement");
        assert_eq!(
            peer.seen.len(),
            1,
            "only the watched PID is kept: {:?}",
            peer.seen
        );
        assert_eq!(
            peer.pending, b"partial",
            "an unfinished line waits for its end"
        );
    }

    #[test]
    fn forkstat_fields_find_the_right_aligned_pid() {
        let mut peers = peer(Format::Field(2));
        peers.watched.extend([18238, 5]);
        feed(
            &mut peers,
            "Time     Event   PID Info   Duration Process\n\
             01:54:09 exit  18238      0   0.034s /usr/bin/rustc --crate-name x\n\
             01:54:09 exit      5      0   0.001s true\n",
        );
        let seen: BTreeMap<u32, u64> = peers.peers[0].seen.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            seen,
            BTreeMap::from([(5, 7), (18238, 7)]),
            "the third field"
        );
    }

    #[test]
    fn the_block_plan_interleaves_every_tool_in_seeded_rounds() {
        let plan = block_plan(8, 100, 20, 46);
        for tool in 0..8 {
            let blocks: Vec<usize> = plan
                .iter()
                .filter(|b| b.tool == tool)
                .map(|b| b.deaths)
                .collect();
            assert_eq!(blocks, vec![20; 5], "tool {tool}: five blocks of 20");
        }
        for (index, round) in plan.chunks(8).enumerate() {
            let mut tools: Vec<usize> = round.iter().map(|b| b.tool).collect();
            tools.sort_unstable();
            assert_eq!(
                tools,
                (0..8).collect::<Vec<_>>(),
                "round {index}: every tool once"
            );
        }
        let order = |plan: &[Block]| plan.iter().map(|b| b.tool).collect::<Vec<_>>();
        assert_eq!(
            order(&plan),
            order(&block_plan(8, 100, 20, 46)),
            "the same seed, the same order"
        );
        assert_ne!(
            order(&plan),
            order(&block_plan(8, 100, 20, 47)),
            "another seed, another order"
        );
        assert_ne!(
            order(&plan[..8]),
            order(&plan[8..16]),
            "each round shuffled anew"
        );
        let short: Vec<usize> = block_plan(3, 25, 20, 1).iter().map(|b| b.deaths).collect();
        assert_eq!(
            short,
            [vec![20; 3], vec![5; 3]].concat(),
            "the last round takes the rest"
        );
    }

    #[test]
    fn liveness_lines_give_the_pid_of_the_ended_session() {
        let mut peers = peer(Format::Events);
        peers.watched.insert(31);
        feed(
            &mut peers,
            r#"{"event":{"kind":"session.started","session":"peer-7-31","at_ms":1}}
{"event":{"kind":"session.ended","session":"peer-7-31","at_ms":2}}
"#,
        );
        assert_eq!(
            peers.peers[0].seen.get(&31),
            Some(&7),
            "the ended event counts"
        );
    }
}
