//! What eBPF programs cost, as the kernel counts it: run count and run time per program,
//! kept while statistics are enabled (`BPF_ENABLE_STATS`, held by the caller).

use anyhow::{Context, Result};
use liveness_ebpf::record::{
    FORK_PROGRAM_NAME, LINEAGE_EXIT_PROGRAM_NAME, LINEAGE_FORK_PROGRAM_NAME, OOM_PROGRAM_NAME,
    PROGRAM_NAMES, SIGNAL_PROGRAM_NAME,
};

/// liveness's programs that serve its exit program: their time is charged to the exits.
const SERVING_EXITS: [&str; 5] = [
    FORK_PROGRAM_NAME,
    LINEAGE_FORK_PROGRAM_NAME,
    LINEAGE_EXIT_PROGRAM_NAME,
    SIGNAL_PROGRAM_NAME,
    OOM_PROGRAM_NAME,
];

/// Runs and run time of a set of eBPF programs.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProgramCost {
    pub runs: u64,
    pub nanos: u64,
}

impl ProgramCost {
    /// The totals now of the programs of this name that process `pid` holds (the kernel
    /// truncates program names to 15 bytes): another daemon's, or a pinned set no daemon
    /// holds, run on the same events but are not counted (see [`foreign_programs`]).
    pub fn named(pid: u32, name: &str) -> Result<ProgramCost> {
        let own = bpf_program_ids(pid);
        ProgramCost::of(
            |info| own.contains(&info.id()) && info.name() == name.as_bytes(),
            false,
        )
    }

    /// The programs named `name` that `pid` holds, with the run time of those named
    /// `helper`, which run on the same event (the lineage programs beside the fork and exit
    /// programs, where they are apart): one run of each is one run of `name`.
    pub fn named_with(pid: u32, name: &str, helper: &str) -> Result<ProgramCost> {
        let mut cost = ProgramCost::named(pid, name)?;
        cost.nanos += ProgramCost::named(pid, helper)?.nanos;
        Ok(cost)
    }

    /// The totals now over the programs with these IDs.
    /// One tool's programs. liveness's fork, signal and OOM programs serve its exit program:
    /// their time is charged to the exits, so that `ns_per_run` is liveness's cost per exit,
    /// as it is a tracer's.
    pub fn of_ids(ids: &[u32]) -> Result<ProgramCost> {
        ProgramCost::of(|info| ids.contains(&info.id()), true)
    }

    fn of(
        wanted: impl Fn(&aya::programs::ProgramInfo) -> bool,
        forks_charged_to_exits: bool,
    ) -> Result<ProgramCost> {
        let mut total = ProgramCost::default();
        for info in aya::programs::loaded_programs() {
            let info = info.context("listing eBPF programs")?;
            if wanted(&info) {
                let serving = SERVING_EXITS
                    .iter()
                    .any(|name| info.name() == name.as_bytes());
                if !(forks_charged_to_exits && serving) {
                    total.runs += info.run_count();
                }
                total.nanos += info.run_time().as_nanos() as u64;
            }
        }
        Ok(total)
    }

    /// IDs and names of every loaded program.
    pub fn loaded() -> Result<Vec<(u32, Vec<u8>)>> {
        aya::programs::loaded_programs()
            .map(|info| {
                let info = info.context("listing eBPF programs")?;
                Ok((info.id(), info.name().to_vec()))
            })
            .collect()
    }

    pub fn since(self, earlier: ProgramCost) -> ProgramCost {
        ProgramCost {
            runs: self.runs.saturating_sub(earlier.runs),
            nanos: self.nanos.saturating_sub(earlier.nanos),
        }
    }

    pub fn add(&mut self, more: ProgramCost) {
        self.runs += more.runs;
        self.nanos += more.nanos;
    }

    /// Mean run time, if the program ran.
    pub fn ns_per_run(self) -> Option<f64> {
        (self.runs > 0).then(|| self.nanos as f64 / self.runs as f64)
    }
}

/// IDs of the eBPF programs a process holds: through a program's descriptor
/// (`anon_inode:bpf-prog`), or a link's (`anon_inode:bpf_link`: a pinned program the
/// process adopted is held by its link only), read from `/proc/<pid>/fdinfo`.
pub fn bpf_program_ids(pid: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = ["anon_inode:bpf-prog", "anon_inode:bpf_link"]
        .iter()
        .flat_map(|target| fdinfos(pid, target))
        .filter_map(|fdinfo| field(&fdinfo, "prog_id"))
        .map(|id| id as u32)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// liveness's programs loaded beside those the process `pid` holds (ID and name): another
/// daemon's, or a pinned lineage set's that a daemon started with `--ebpf-pin-dir` left.
/// They run on the same forks and exits, and the costs by name count them too.
pub fn foreign_programs(pid: u32) -> Result<Vec<(u32, String)>> {
    let own = bpf_program_ids(pid);
    let ours = |name: &[u8]| PROGRAM_NAMES.iter().any(|ours| ours.as_bytes() == name);
    Ok(ProgramCost::loaded()?
        .into_iter()
        .filter(|(id, name)| !own.contains(id) && ours(name))
        .map(|(id, name)| (id, String::from_utf8_lossy(&name).into_owned()))
        .collect())
}

/// Whether a process holds a program of this name.
pub fn holds_program(pid: u32, name: &str) -> Result<bool> {
    let ids = bpf_program_ids(pid);
    Ok(ProgramCost::loaded()?
        .iter()
        .any(|(id, loaded)| ids.contains(id) && loaded == name.as_bytes()))
}

/// The kernel memory of an eBPF map a process holds, as its fdinfo counts it.
#[derive(Debug, Clone, Copy)]
pub struct MapMemory {
    pub max_entries: u64,
    /// `memlock`: the map's memory use in bytes (of its elements so far, for a map that
    /// is not preallocated).
    pub bytes: u64,
}

/// The memory of the map of this name a process holds, if it holds one.
pub fn map_memory(pid: u32, name: &str) -> Result<Option<MapMemory>> {
    for fdinfo in fdinfos(pid, "anon_inode:bpf-map") {
        let Some(id) = field(&fdinfo, "map_id") else {
            continue;
        };
        let info = aya::maps::MapInfo::from_id(id as u32)
            .with_context(|| format!("reading eBPF map {id}"))?;
        if info.name() == name.as_bytes() {
            return Ok(Some(MapMemory {
                max_entries: field(&fdinfo, "max_entries").unwrap_or(0),
                bytes: field(&fdinfo, "memlock").unwrap_or(0),
            }));
        }
    }
    Ok(None)
}

/// The fdinfo of each descriptor of a process that links to `target`.
fn fdinfos(pid: u32, target: &str) -> Vec<String> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.filter_map(|fd| {
        let fd = fd.ok()?;
        if std::fs::read_link(fd.path()).ok()?.as_os_str() != target {
            return None;
        }
        std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_str()?)).ok()
    })
    .collect()
}

/// A numeric `name:` line of an fdinfo.
fn field(fdinfo: &str, name: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?
        .trim()
        .parse()
        .ok()
}
