//! Peers: the tools people use instead of liveness, measured side by side with it in one
//! run. Every tool runs at once, each at its best (unbuffered output), and every owner's
//! exit is seen by all of them: one owner exits at a time, the harness waits until each
//! tool has reported it, then lets the next one go. One thread reads every tool's output
//! (pipes and sockets under one `poll`) and stamps each line with CLOCK_MONOTONIC the
//! moment `poll` returned, so no tool is favoured by the order in which ready outputs are
//! read.
//!
//! The tools: libbpf-tools `exitsnoop`, BCC's `exitsnoop-bpfcc`, a `bpftrace` one-liner on
//! `sched_process_exit`, the bench's own proc-connector listener, pidfd waiter and `/proc`
//! pollers and the floor, liveness's own eBPF object read by a minimal loop (see
//! [`crate::watchers`]), and `livenessd` with `--sources ebpf`, `pidfd` and `auto`, each
//! read by a direct socket subscriber and through `liveness watch --json`.
//!
//! With a baseline build, each source runs a daemon of each build, and the owners take
//! turns: each is tracked by one build's daemons (and by every other tool), so that only
//! one build is woken by each death, as in a run without a baseline, and both builds'
//! deaths are spread over the same minutes. Every ratio of a row to the raw tracer is
//! taken over the row's own deaths.

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
use crate::{Dist, round, setup, watchers};
use liveness_ebpf::record::{
    EXIT_PROGRAM_NAME, FORK_PROGRAM_NAME, LINEAGE_EXIT_PROGRAM_NAME, LINEAGE_FORK_PROGRAM_NAME,
    OOM_PROGRAM_NAME, SIGNAL_PROGRAM_NAME,
};

/// Sizes of the peers section.
#[derive(Debug, Clone, Copy)]
pub struct PeersPlan {
    /// Owners whose exit every tool reports.
    pub samples: usize,
    /// Untracked `/bin/true` runs during which each tool's CPU and eBPF time are taken.
    pub storm: usize,
    /// Whether to run the external tools (installing them if needed).
    pub external: bool,
}

/// CPU figures are scaled to this many untracked spawns.
const CPU_PER_SPAWNS: usize = 20_000;
/// Owners forked and tracked together, then let go one at a time.
const BATCH: usize = 50;
/// How long a round waits for every tool before counting it lost for the late ones.
const ROUND_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Reports every exit of the machine from a kernel tracepoint.
    Tracer,
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
            Kind::Own => "own",
            Kind::Floor => "floor",
            Kind::Liveness => "liveness",
        }
    }
}

/// How a tool's lines name the process that exited.
#[derive(Debug)]
enum Format {
    /// exitsnoop's table: the PID column starts where the header's `PID` does (the command
    /// name before it may hold spaces).
    Columns { pid_at: Option<usize> },
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

/// One row of the table: a tool's output stream and what it reported.
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
    acks: usize,
    /// Why its output ended, if it did.
    ended: Option<String>,
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

/// The section's tools and what they reported.
#[derive(Debug, Default)]
struct Peers {
    peers: Vec<Peer>,
    groups: Vec<Group>,
    /// PIDs whose reports are kept (owners and probes); every other line is dropped.
    watched: HashSet<u32>,
    skipped: Vec<(String, String)>,
    /// The build each owner is tracked by, in turns.
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
}

/// The figures of one tool.
#[derive(Debug, Clone)]
pub struct PeerFigures {
    pub name: String,
    kind: Kind,
    /// The build it belongs to, for a liveness row.
    build: Option<&'static str>,
    pub dist: Dist,
    /// Its latencies in exit order.
    series: Vec<u64>,
    /// p50 of each quarter of the run (in exit order): how much p50 wanders within it.
    quarters: Vec<f64>,
    /// Against the raw tracer the ratios are to, over this row's deaths, at p50 and p99.
    pub to_base: Option<(Ratio, Ratio)>,
    /// Against the floor (`ebpf-floor`), the same way.
    pub to_floor: Option<(Ratio, Ratio)>,
    lost: usize,
    startup_ms: Option<f64>,
    cpu_ms_per_20k: f64,
    pub bpf: Option<ProgramCost>,
}

/// The section's result: figures per tool, skipped tools with the reason, harness errors.
#[derive(Debug, Default)]
pub struct PeersReport {
    pub figures: Vec<PeerFigures>,
    /// The raw tracer the ratios are to.
    base: Option<String>,
    pub skipped: Vec<(String, String)>,
    pub storm: usize,
    pub samples: usize,
    pub errors: Vec<String>,
}

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
    let mut peers = Peers {
        builds: builds.len(),
        ..Peers::default()
    };
    let mut errors = Vec::new();
    realtime_reader();

    // The bench's own watchers and liveness must run: they are what the harness checks.
    for (name, probe_wait) in [
        ("proc-connector", Duration::from_millis(100)),
        ("pidfd", Duration::from_millis(100)),
        ("poll-10", Duration::from_millis(200)),
        ("poll-1000", Duration::from_millis(1500)),
        ("ebpf-floor", Duration::from_millis(100)),
    ] {
        let mut command = Command::new(std::env::current_exe()?);
        command.args([watchers::WATCHER_ARG, name]);
        let row = match name {
            "pidfd" => "pidfd-waiter".to_owned(),
            "poll-10" => "poll-10ms".to_owned(),
            "poll-1000" => "poll-1s".to_owned(),
            other => other.to_owned(),
        };
        let waited_for = name != "poll-1000";
        peers
            .start_tool(
                Row {
                    name: row.clone(),
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
                logs.path(),
            )
            .with_context(|| format!("starting the bench's {row}"))?;
    }
    for (index, build) in builds.iter().enumerate() {
        for source in ["ebpf", "pidfd", "auto"] {
            peers
                .start_liveness(index, build, source, logs.path())
                .with_context(|| {
                    format!("starting liveness --sources {source} ({})", build.name())
                })?;
        }
    }
    // Declared after the tools: they are stopped before tracefs is unmounted.
    let _tracefs = if plan.external {
        peers.start_tracers(logs.path())
    } else {
        let reason = "smoke run: the external tools are installed and started only by --quick \
                      and full runs";
        for name in ["exitsnoop", "exitsnoop-bpfcc", "bpftrace"] {
            peers.skipped.push((name.into(), reason.into()));
        }
        None
    };
    for (name, reason) in &peers.skipped {
        eprintln!("bench: peers: skipping {name}: {reason}");
    }

    let samples = plan.samples * builds.len();
    eprintln!(
        "bench: peers: {samples} exits seen by {} tools",
        peers.peers.len()
    );
    let exits = peers.rounds(samples)?;
    let (cpu_ticks, bpf) = peers.storm_costs(plan.storm)?;

    // In the order the owners exited, for the p50 of each quarter of the run.
    let mut exits: Vec<(u32, u64)> = exits.into_iter().collect();
    exits.sort_unstable_by_key(|&(_, exit_ns)| exit_ns);
    let latencies = |peer: &Peer, exits: &[(u32, u64)]| -> Vec<u64> {
        exits
            .iter()
            .filter_map(|(pid, exit_ns)| Some(peer.seen.get(pid)?.saturating_sub(*exit_ns)))
            .collect()
    };
    // The ratios are to exitsnoop, or without it to the fastest raw tracer by p50.
    let base = peers
        .peers
        .iter()
        .filter(|p| p.kind == Kind::Tracer)
        .map(|p| (p, Dist::of_ns(&latencies(p, &exits))))
        .filter(|(_, d)| d.samples > 0)
        .min_by(|(a, da), (b, db)| {
            (b.name == "exitsnoop")
                .cmp(&(a.name == "exitsnoop"))
                .then(da.p50.total_cmp(&db.p50))
        })
        .map(|(p, _)| p);
    let floor = peers.peers.iter().find(|p| p.kind == Kind::Floor);
    let mut figures = Vec::new();
    for (index, peer) in peers.peers.iter().enumerate() {
        let own: Vec<(u32, u64)> = exits
            .iter()
            .copied()
            .filter(|(pid, _)| peer.reports(peers.owner_build.get(pid)))
            .collect();
        let samples = latencies(peer, &own);
        let quarters = quarters(&own)
            .map(|quarter| Dist::of_ns(&latencies(peer, quarter)).p50)
            .collect();
        let lost = own.len() - samples.len();
        if lost > 0 && peer.kind != Kind::Tracer {
            errors.push(format!(
                "peers {}: {lost} of {} exits never reported{}",
                peer.name,
                own.len(),
                peer.ended
                    .as_ref()
                    .map_or(String::new(), |why| format!(" ({why})"))
            ));
        }
        let against = |reference: &Peer| {
            let theirs = latencies(reference, &own);
            (
                Ratio::of_latencies(&samples, &theirs, |d| d.p50),
                Ratio::of_latencies(&samples, &theirs, |d| d.p99),
            )
        };
        let to_base = base.map(against);
        let to_floor = floor.map(against);
        figures.push(PeerFigures {
            name: peer.name.clone(),
            kind: peer.kind,
            build: peer.build.map(|b| builds[b].name()),
            dist: Dist::of_ns(&samples),
            series: samples,
            quarters,
            to_base,
            to_floor,
            lost,
            startup_ms: peer.startup_ns.map(|ns| ns as f64 / 1e6),
            cpu_ms_per_20k: cpu_ticks[index] as f64 * 10.0 * CPU_PER_SPAWNS as f64
                / plan.storm.max(1) as f64,
            bpf: bpf[peer.group],
        });
    }
    let base = base.map(|b| b.name.clone());
    // A daemon that failed is a harness failure; the readers end with it.
    for group in &mut peers.groups {
        if let Some(daemon) = &mut group.daemon
            && let Err(e) = daemon::stop(daemon)
        {
            errors.push(format!("peers: {e:#}"));
        }
    }
    let skipped = std::mem::take(&mut peers.skipped);
    drop(peers);
    normal_reader();
    Ok(PeersReport {
        figures,
        base,
        skipped,
        storm: plan.storm,
        samples,
        errors,
    })
}

impl Peers {
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
            acks: 0,
            ended: None,
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

    /// The external tracers, installed if needed; each one that cannot run is skipped
    /// with the reason.
    /// Returns the tracefs mount they need, to be held while they run.
    fn start_tracers(&mut self, logs: &Path) -> Option<setup::Tracefs> {
        if !setup::is_root() {
            for name in ["exitsnoop", "exitsnoop-bpfcc", "bpftrace"] {
                self.skipped.push((
                    name.into(),
                    "not root: the tracers load eBPF programs".into(),
                ));
            }
            return None;
        }
        let tracefs = match setup::Tracefs::ensure() {
            Ok(tracefs) => tracefs,
            Err(e) => {
                for name in ["exitsnoop", "exitsnoop-bpfcc", "bpftrace"] {
                    self.skipped.push((name.into(), format!("{e:#}")));
                }
                return None;
            }
        };
        let tracers: [(&str, &dyn Fn() -> Result<Command>); 3] = [
            ("exitsnoop", &|| {
                setup::ensure_program("exitsnoop", &["libbpf-tools"])?;
                let mut command = Command::new("stdbuf");
                command.args(["-oL", "exitsnoop"]);
                Ok(command)
            }),
            ("bpftrace", &|| {
                setup::ensure_program("bpftrace", &["bpftrace"])?;
                let mut command = Command::new("bpftrace");
                command.args([
                    "-B",
                    "line",
                    "-e",
                    r#"tracepoint:sched:sched_process_exit /pid == tid/ { printf("%d\n", pid); }"#,
                ]);
                Ok(command)
            }),
            ("exitsnoop-bpfcc", &|| {
                setup::ensure_program("exitsnoop-bpfcc", &["bpfcc-tools", "python3-bpfcc"])?;
                let headers = setup::bcc_kernel_headers().context("kernel headers for BCC")?;
                let mut command = Command::new("exitsnoop-bpfcc");
                command
                    .env("PYTHONUNBUFFERED", "1")
                    .env("BCC_KERNEL_SOURCE", headers);
                Ok(command)
            }),
        ];
        for (name, command) in tracers {
            let format = if name == "bpftrace" {
                Format::Pid
            } else {
                Format::Columns { pid_at: None }
            };
            let before: HashSet<u32> = ProgramCost::loaded()
                .unwrap_or_default()
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            let started = command().and_then(|command| {
                self.start_tool(
                    Row {
                        name: name.into(),
                        kind: Kind::Tracer,
                        format,
                        waited_for: true,
                    },
                    command,
                    Duration::from_millis(100),
                    logs,
                )
            });
            if let Err(e) = started {
                if self.peers.last().is_some_and(|p| p.name == name) {
                    self.peers.pop();
                    self.groups.pop();
                }
                self.skipped.push((name.into(), format!("{e:#}")));
                continue;
            }
            let group = self.groups.last_mut().unwrap();
            let pid = group.children[0].id();
            group.programs = bpf_program_ids(pid);
            if group.programs.is_empty() {
                // A tool that closed its program descriptors after attaching: the programs
                // loaded while it started, but not liveness's (other daemons may run here).
                let liveness = [
                    EXIT_PROGRAM_NAME,
                    FORK_PROGRAM_NAME,
                    LINEAGE_FORK_PROGRAM_NAME,
                    LINEAGE_EXIT_PROGRAM_NAME,
                    SIGNAL_PROGRAM_NAME,
                    OOM_PROGRAM_NAME,
                ]
                .map(str::as_bytes);
                group.programs = ProgramCost::loaded()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(id, name)| {
                        !before.contains(id) && !liveness.contains(&name.as_slice())
                    })
                    .map(|(id, _)| id)
                    .collect();
            }
        }
        Some(tracefs)
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

    /// Lets `samples` owners exit one at a time, each once every tool has it tracked, and
    /// waits for each exit to be reported by every tool the rounds wait for. Returns each
    /// owner's exit time.
    fn rounds(&mut self, samples: usize) -> Result<HashMap<u32, u64>> {
        let mut exits = HashMap::with_capacity(samples);
        while exits.len() < samples {
            let mut owners = Owners::spawn(BATCH.min(samples - exits.len()))?;
            self.watched.extend(&owners.pids);
            for &pid in &owners.pids {
                let turn = self.owner_build.len() % self.builds.max(1);
                self.owner_build.insert(pid, turn);
            }
            for group in 0..self.groups.len() {
                let build = self.groups[group].build;
                let pids: Vec<u32> = owners
                    .pids
                    .iter()
                    .copied()
                    .filter(|pid| build.is_none() || build == self.owner_build.get(pid).copied())
                    .collect();
                if !pids.is_empty() {
                    self.track(group, &pids)?;
                }
            }
            for _ in 0..owners.pids.len() {
                owners.release(1)?;
                let exit = owners.next_report()?;
                exits.insert(exit.pid, exit.exit_ns);
                let turn = self.owner_build.get(&exit.pid).copied();
                self.pump(Instant::now() + ROUND_TIMEOUT, |peers| {
                    peers
                        .iter()
                        .filter(|p| p.waited_for && p.ended.is_none() && p.reports(turn.as_ref()))
                        .all(|p| p.seen.contains_key(&exit.pid))
                })?;
            }
        }
        // The slow pollers report the last exits after the rounds.
        let owner_build = self.owner_build.clone();
        self.pump(Instant::now() + Duration::from_secs(3), |peers| {
            peers.iter().filter(|p| p.ended.is_none()).all(|p| {
                exits
                    .keys()
                    .filter(|pid| p.reports(owner_build.get(*pid)))
                    .all(|pid| p.seen.contains_key(pid))
            })
        })?;
        Ok(exits)
    }

    /// Runs the storm of untracked exits while reading every tool's output (a tool whose
    /// pipe is full would stall and look cheap), and returns each tool's CPU ticks and
    /// each group's eBPF cost over it.
    fn storm_costs(&mut self, storm: usize) -> Result<(Vec<u64>, Vec<Option<ProgramCost>>)> {
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
                .filter(|&i| self.peers[i].ended.is_none())
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

impl PeersReport {
    /// The raw tracer the ratios are to: exitsnoop, or without it the fastest by p50.
    pub fn base(&self) -> Option<&PeerFigures> {
        self.find(self.base.as_deref()?)
    }

    pub fn find(&self, name: &str) -> Option<&PeerFigures> {
        self.figures
            .iter()
            .find(|f| f.name == name && f.dist.samples > 0)
    }

    /// Each liveness row of the build under test against the same row of the baseline, at
    /// p50 and p99: `(row, p50, p99)`.
    pub fn versus_baseline(&self) -> Vec<(&str, Ratio, Ratio)> {
        self.figures
            .iter()
            .filter(|f| f.build == Some("new"))
            .filter_map(|new| {
                let base = self.find(&format!("{}@base", new.name))?;
                let at = |at: fn(&Dist) -> f64| Ratio::of_latencies(&new.series, &base.series, at);
                Some((new.name.as_str(), at(|d| d.p50), at(|d| d.p99)))
            })
            .collect()
    }

    pub fn json(&self) -> Value {
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
                value["p50_quarters_us"] =
                    json!(f.quarters.iter().map(|&q| round(q)).collect::<Vec<_>>());
                value["ratio_p50_quarters"] =
                    json!(f.to_base.as_ref().map(|(p50, _)| {
                        p50.parts.iter().map(|&r| round(r)).collect::<Vec<_>>()
                    }));
                value["startup_ms"] = json!(f.startup_ms.map(round));
                value["cpu_ms_per_20k_spawns"] = json!(round(f.cpu_ms_per_20k));
                value["bpf_runs"] = json!(f.bpf.map(|c| c.runs));
                value["bpf_ns_per_run"] = json!(f.bpf.and_then(ProgramCost::ns_per_run).map(round));
                value
            })
            .collect();
        json!({
            "samples": self.samples,
            "storm_spawns": self.storm,
            "ratio_base": self.base,
            "tools": tools,
            "versus_baseline": self.versus_baseline().into_iter().map(|(name, p50, p99)| {
                json!({"name": name, "p50": p50.json(), "p99": p99.json()})
            }).collect::<Vec<_>>(),
            "skipped": self.skipped.iter().map(|(name, reason)| json!({"name": name, "reason": reason})).collect::<Vec<_>>(),
        })
    }

    pub fn print(&self) {
        println!(
            "\nPeers: exit -> the tool's line read by the harness (us), {} exits seen by every tool at once",
            self.samples
        );
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
                "{:<26} {:>7} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>6} {:>6} {:>10} {:>9.0} {:>8}",
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
                f.cpu_ms_per_20k,
                f.bpf
                    .and_then(ProgramCost::ns_per_run)
                    .map_or("-".to_owned(), |ns| format!("{ns:.0}")),
            );
        }
        match &self.base {
            Some(base) => println!(
                "  x: ratio to {base} over the same deaths (a build's rows: its own half of them)"
            ),
            None => println!("  x: no raw tracer ran, no ratios"),
        }
        println!("  Noise: p50 in each quarter of the run, and the x p50 of each quarter");
        for f in &self.figures {
            let quarters = Ratio {
                value: 0.0,
                parts: f.quarters.clone(),
            };
            let (low, high) = quarters.spread();
            println!(
                "  {:<26} p50 {:>9.1} .. {:>9.1}{}",
                f.name,
                low,
                high,
                f.to_base.as_ref().map_or(String::new(), |(p50, _)| {
                    let (low, high) = p50.spread();
                    format!("   x p50 {low:.2} .. {high:.2}")
                })
            );
        }
        println!(
            "  CPU ms: the tool's processes' CPU time per {CPU_PER_SPAWNS} untracked spawns \
             ({} run); BPF ns: its eBPF programs' mean run time per exit over them",
            self.storm
        );
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
                "  New against the baseline, each on its own half of the deaths: p50 and p99 ratios (quarters)"
            );
            for (name, p50, p99) in versus {
                println!("  {name:<26} p50 {}   p99 {}", p50.show(), p99.show());
            }
        }
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
