//! The eBPF exit source: a `tp_btf/sched_process_exit` program filters exits in the kernel
//! against a map of tracked processes and reports each tracked death once, with its wait
//! status, through a ring buffer.
//!
//! The programs, their object and their records are the `liveness-ebpf` crate's; this
//! module loads them, attaches them and reads what they report.

use std::collections::HashMap as StdHashMap;
use std::fmt;
use std::io;
use std::time::{Duration, Instant, SystemTime};

use aya::maps::{Array, HashMap, IterableMap, Map, MapData, MapError, RingBuf};
use aya::programs::links::FdLink;
use aya::programs::{BtfTracePoint, ProgramError};
use aya::{Btf, BtfError, Ebpf, EbpfLoader};
use liveness_common::status::CausesReport;
use liveness_ebpf::record::{
    COUNTER_CAUSES_LOST, COUNTER_EMITTED, COUNTER_LOST, COUNTER_SLOTS, COUNTER_USAGE_LOST,
    EXIT_PROGRAM_NAME, ExitRecord, FORK_PROGRAM_NAME, LINEAGE_EXIT_PROGRAM_NAME,
    LINEAGE_FORK_PROGRAM_NAME, MAP_CAUSES, MAP_COUNTERS, MAP_EXITS, MAP_LINEAGES,
    MAP_MEMBER_COUNTERS, MAP_MEMBER_SLOTS, MAP_MEMBERS, MAP_MOVES, MAP_TRACKED, MAP_TREE_USAGES,
    MAP_UID_SHARES, MOVE_PROGRAM_NAME, MoveRecord, OOM_PROGRAM_NAME, SIGNAL_PROGRAM_NAME,
    SignalCause, TreeUsage,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::cgroups::SessionCgroupNames;
use super::child::ProbeChild;
use super::lineage_pin::{self, EXIT_LINK, FORK_LINK, PinSet, StatePins};
use super::shared_array::SharedArray;
use super::tree_map::{LineageKeep, TreeMap, TreeMapError, TreeMaps, map_errno};
use liveness_common::cause::Cause;
use liveness_common::status::{SelfTest, SourceStats};
use liveness_ebpf::KernelFacts;

use super::{ExitObservation, ExitSource, SourceEvent, TrackError};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, ProcessKey};
use liveness_proc::diagnose::{self, Denial};
use liveness_proc::identity::ProcRoot;

use liveness_ebpf::OBJECT;

const TRACEPOINT: &str = "sched_process_exit";
const FORK_TRACEPOINT: &str = "sched_process_fork";
const SIGNAL_TRACEPOINT: &str = "signal_generate";
const OOM_TRACEPOINT: &str = "mark_victim";
const MOVE_TRACEPOINT: &str = "cgroup_attach_task";
/// The program's `.rodata` variable holding the daemon's PID namespace inode number.
const PIDNS_GLOBAL: &str = "daemon_pidns_inum";
/// The program's `.rodata` variable holding the members' share of the members map.
const MAX_MEMBERS_GLOBAL: &str = "max_members";
/// The program's `.rodata` variable holding one uid's share of the members' slots.
const MAX_MEMBERS_PER_UID_GLOBAL: &str = "max_members_per_uid";
/// The program's `.rodata` variables holding the OOM killer's text, `[start, end)`.
const OOM_KILL_START_GLOBAL: &str = "oom_kill_start";
const OOM_KILL_END_GLOBAL: &str = "oom_kill_end";
/// The program's `.rodata` variable that has the fork and exit programs keep the lineages,
/// set when the lineage programs are not pinned (their own programs then run no more).
const LINEAGE_INLINE_GLOBAL: &str = "lineage_inline";
/// The OOM killer's function that sends SIGKILL, or the one it is inlined into.
const OOM_KILL_FUNCTIONS: [&str; 2] = ["__oom_kill_process", "oom_kill_process"];
const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Default capacity of the map of tracked processes (the object's own default).
pub const DEFAULT_MAX_TRACKED: u32 = 262_144;
/// Default capacity of the map of process-tree members (the object's own default).
pub const DEFAULT_MAX_MEMBERS: u32 = 65_536;
/// Default size of the ring buffer (the object's own default): about 43,000 records.
pub const DEFAULT_RING_BYTES: u32 = 8 * 1024 * 1024;

/// Settings of the eBPF source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfConfig {
    /// Capacity of the kernel map of tracked processes; `track` beyond it is refused with
    /// [`TrackError::Exhausted`]. Entries are allocated on insert, so a large value is cheap.
    pub max_tracked: u32,
    /// Size of the ring buffer in bytes: a power of two, at least a page. Deaths that find
    /// it full are counted as lost, which makes the consumer re-check every process.
    pub ring_bytes: u32,
    /// How many process-tree members the kernel map may hold (it has room for one more
    /// entry per tracked process besides). New processes that find no room are counted, and
    /// the daemon then finds members by scanning `/proc` as well.
    pub max_members: u32,
    /// How many of those the processes forked by one uid other than root may hold, so that
    /// one user's storm of forks leaves room for root's and the other users' trees; `None`:
    /// a quarter of `max_members`.
    pub max_members_per_uid: Option<u32>,
    /// Where to pin the lineage programs and their map so that they outlive the daemon
    /// (this daemon's own directory, under `--ebpf-pin-dir`); `None`: they go with it.
    pub pins: Option<StatePins>,
    /// The sessions' cgroups, which an OOM kill's cause names.
    pub cgroup_names: SessionCgroupNames,
}

impl EbpfConfig {
    /// One uid's share of the members' slots.
    pub fn members_per_uid(&self) -> u32 {
        self.max_members_per_uid
            .unwrap_or(self.max_members / 4)
            .clamp(1, self.max_members.max(1))
    }
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            max_tracked: DEFAULT_MAX_TRACKED,
            ring_bytes: DEFAULT_RING_BYTES,
            max_members: DEFAULT_MAX_MEMBERS,
            max_members_per_uid: None,
            pins: None,
            cgroup_names: SessionCgroupNames::default(),
        }
    }
}

/// Why the eBPF source cannot start. Every message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error(
        "the kernel lacks BTF ({KERNEL_BTF} does not exist): the eBPF source needs a kernel \
         built with CONFIG_DEBUG_INFO_BTF=y; use the pidfd source instead"
    )]
    NoKernelBtf,
    #[error("cannot read the kernel's BTF from {KERNEL_BTF}: {0}")]
    KernelBtf(#[source] BtfError),
    /// `bpf(2)` is unavailable: filtered, missing, refused or unprivileged (see [`Denial`]).
    #[error("{what} failed: {denial}")]
    Denied {
        what: &'static str,
        denial: Denial,
        /// What aya reported, for the log: its wording names whichever map came first.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "the kernel is too old for the eBPF source, which needs Linux 5.8 or later with BTF \
         raw tracepoints and ring buffers; use the pidfd source instead ({what}: {source})"
    )]
    KernelTooOld {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("the kernel rejected the eBPF program: {0}")]
    Program(#[source] ProgramError),
    #[error(
        "the embedded eBPF object lacks `{0}` or has the wrong kind of it: rebuild it with \
         `cargo xtask build-ebpf`"
    )]
    BadObject(&'static str),
    #[error("cannot set up the eBPF map `{name}`: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot wait on the eBPF ring buffer: {0}")]
    RingBuffer(#[source] io::Error),
    #[error("cannot read the daemon's PID namespace (/proc/self/ns/pid): {0}")]
    PidNamespace(#[source] io::Error),
    #[error("the eBPF self-test failed: {0}")]
    SelfTest(String),
}

impl EbpfError {
    fn from_load(error: aya::EbpfError) -> EbpfError {
        let ring_buffer_refused = matches!(
            &error,
            aya::EbpfError::MapError(MapError::CreateError { name, .. }) if name == MAP_EXITS
        );
        let errno = first_errno(&error);
        match errno {
            // Kernels before 5.8 do not know the ring buffer map type.
            Some(libc::EINVAL) if ring_buffer_refused => EbpfError::KernelTooOld {
                what: "creating the ring buffer",
                source: Box::new(error),
            },
            _ => EbpfError::denied_or("loading the eBPF object", errno, error, EbpfError::Load),
        }
    }

    fn from_program(what: &'static str, error: ProgramError) -> EbpfError {
        match error {
            ProgramError::Btf(BtfError::UnknownBtfTypeName { .. }) => EbpfError::KernelTooOld {
                what: "looking up tp_btf/sched_process_exit",
                source: Box::new(error),
            },
            error => {
                let errno = first_errno(&error);
                EbpfError::denied_or(what, errno, error, EbpfError::Program)
            }
        }
    }

    /// [`EbpfError::Denied`] when probing `bpf(2)` finds why it fails here, else `otherwise`.
    fn denied_or<E: std::error::Error + Send + Sync + 'static>(
        what: &'static str,
        errno: Option<i32>,
        error: E,
        otherwise: fn(E) -> EbpfError,
    ) -> EbpfError {
        match diagnose::explain(&diagnose::BPF, errno) {
            Some(denial) => EbpfError::Denied {
                what,
                denial,
                source: Box::new(error),
            },
            None => otherwise(error),
        }
    }
}

/// The OS error code nearest the top of an error's source chain.
fn first_errno(error: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(code) = error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(code);
        }
        current = error.source();
    }
    None
}

/// How long the start-up self-test waits for the record of its child's exit.
const SELF_TEST_PATIENCE: Duration = Duration::from_secs(2);

/// The eBPF exit source. Its consumer reads the ring buffer in its own task
/// ([`EbpfSource::wait`], [`EbpfSource::drain`]): no hop through another task and channel,
/// and a consumer told of a death by another source can read the kernel's record of it at
/// once, since the program runs before the process's pidfd or parent hear of the death.
pub struct EbpfSource {
    /// Owns the program and its link: dropping it detaches.
    _ebpf: Ebpf,
    map: HashMap<MapData, u32, u64>,
    ring: AsyncFd<RingBuf<MapData>>,
    /// `tgid -> start_ticks` of what user space put in the kernel map, so `stats().tracked`
    /// needs no syscall and `untrack` never deletes a newer process's entry.
    tracked: StdHashMap<u32, u64>,
    /// The `COUNTER_*` slots, read without a system call.
    counters: SharedArray,
    max_tracked: u32,
    refused: u64,
    /// The kernel's loss count when the consumer was last told of losses.
    reported_lost: u64,
    /// Records the self-test made, left out of `stats().observed`.
    self_test_records: u64,
    self_test: SelfTest,
    /// The process trees' map, until the engine's trees take it.
    members: Option<TreeMap>,
    /// This source's handle on the same map, for the entries of tracked processes.
    roots: TreeMap,
    /// Which of the programs that see why a process died are attached.
    causes: CauseWatch,
    /// `tgid -> SignalCause` and `tgid -> TreeUsage`: entries of a process untracked alive
    /// are deleted here (its exit record takes them otherwise).
    causes_map: HashMap<MapData, u32, [u8; size_of::<SignalCause>()]>,
    usages_map: HashMap<MapData, u32, [u8; size_of::<TreeUsage>()]>,
    /// The cgroup moves of tracked processes and members, until their reader takes them;
    /// `None` when the program did not attach.
    moves: Option<MoveRing>,
    cgroup_names: SessionCgroupNames,
}

/// The ring of the cgroup moves of tracked processes and members (`tp_btf/cgroup_attach_task`).
pub struct MoveRing(RingBuf<MapData>);

impl fmt::Debug for MoveRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MoveRing")
    }
}

impl std::os::fd::AsRawFd for MoveRing {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// The ring's map owns its descriptor, which it never replaces.
impl crate::fd::registered::OwnsFd for MoveRing {}

impl MoveRing {
    /// Reads every record in the ring into `out`.
    pub fn read(&mut self, out: &mut Vec<MoveRecord>) {
        while let Some(item) = self.0.next() {
            match MoveRecord::from_bytes(&item) {
                Some(record) => out.push(record),
                None => tracing::warn!(len = item.len(), "ignoring a short eBPF move record"),
            }
        }
    }
}

/// Attaches the program that reports the cgroup moves of tracked processes and members, and
/// takes its ring; `None` (with a warning) where it cannot run: escapes are then found at
/// the sessions' ends only.
fn attach_moves(ebpf: &mut Ebpf, btf: &Btf) -> Option<MoveRing> {
    let attached = attach(ebpf, btf, MOVE_PROGRAM_NAME, MOVE_TRACEPOINT).and_then(|()| {
        let map = take_map(ebpf, MAP_MOVES)?;
        RingBuf::try_from(map).map_err(|source| EbpfError::Map {
            name: MAP_MOVES,
            source,
        })
    });
    match attached {
        Ok(ring) => Some(MoveRing(ring)),
        Err(error) => {
            tracing::warn!(%error, "{MOVE_TRACEPOINT}: not attached; escapes from session cgroups are found at their ends only");
            None
        }
    }
}

/// Which programs that see why a process died attached, and why the others did not.
#[derive(Debug, Clone)]
struct CauseWatch {
    /// `signal_generate`: the senders of killing signals.
    signals: Result<(), String>,
    /// `mark_victim`: the OOM killer's victims.
    oom: Result<(), String>,
}

impl CauseWatch {
    fn report(&self, lost: u64) -> CausesReport {
        let why = |result: &Result<(), String>| result.as_ref().err().cloned();
        let reason = [
            why(&self.signals).map(|e| format!("signal senders are not seen: {e}")),
            why(&self.oom).map(|e| format!("OOM kills are not seen: {e}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>();
        CausesReport {
            signals: self.signals.is_ok(),
            oom: self.oom.is_ok(),
            lost,
            reason: (!reason.is_empty()).then(|| reason.join("; ")),
        }
    }
}

/// Loads and attaches the programs that see why a tracked process died. Each may be missing
/// on a kernel (a tracepoint, or fentry's trampolines): the exit source works without them,
/// and status says which causes are not seen and why.
fn attach_cause_programs(ebpf: &mut Ebpf, btf: &Btf) -> CauseWatch {
    let signals = attach(ebpf, btf, SIGNAL_PROGRAM_NAME, SIGNAL_TRACEPOINT);
    let oom = attach(ebpf, btf, OOM_PROGRAM_NAME, OOM_TRACEPOINT);
    let described = |what: &str, result: Result<(), EbpfError>| {
        result.map_err(|error| {
            tracing::warn!(%error, "{what}: not attached");
            error.to_string()
        })
    };
    CauseWatch {
        signals: described(SIGNAL_TRACEPOINT, signals),
        oom: described(OOM_TRACEPOINT, oom),
    }
}

impl fmt::Debug for EbpfSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EbpfSource")
            .field("tracked", &self.tracked.len())
            .field("max_tracked", &self.max_tracked)
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

/// The inode number of this process's PID namespace, which the program translates pids into.
fn own_pidns_inum() -> Result<u32, EbpfError> {
    let metadata = std::fs::metadata("/proc/self/ns/pid").map_err(EbpfError::PidNamespace)?;
    u32::try_from(std::os::unix::fs::MetadataExt::ino(&metadata)).map_err(|_| {
        EbpfError::PidNamespace(io::Error::other(
            "the namespace inode number exceeds 32 bits",
        ))
    })
}

impl EbpfSource {
    /// Loads and attaches the program, then proves it sees deaths here: it tracks a child of
    /// the daemon and requires the record of its exit, with the right status, within
    /// [`SELF_TEST_PATIENCE`].
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime with I/O enabled.
    pub async fn start(config: EbpfConfig, proc: &ProcRoot) -> Result<EbpfSource, EbpfError> {
        let started = Instant::now();
        let btf = Btf::from_sys_fs().map_err(|error| match error {
            BtfError::FileError { error, .. } if error.kind() == io::ErrorKind::NotFound => {
                EbpfError::NoKernelBtf
            }
            error => EbpfError::KernelBtf(error),
        })?;
        let pidns_inum = own_pidns_inum()?;
        let mut pins = match &config.pins {
            None => Err("not asked for (--ebpf-pin-dir)".to_owned()),
            Some(dir) => PinSet::open(dir, &lineage_pin::set_name(OBJECT, pidns_inum))
                .map_err(|error| error.to_string()),
        };
        let mut ebpf = match load(&btf, pidns_inum, &config, pins.as_ref().ok()) {
            // A map that cannot be pinned must not keep the daemon from running.
            Err(error) if pins.is_ok() => {
                let reason = Err(format!("cannot pin the lineages map: {error}"));
                if let Ok(set) = std::mem::replace(&mut pins, reason) {
                    // No link is pinned yet: nothing to hold.
                    drop(set.abandon());
                }
                load(&btf, pidns_inum, &config, None)
            }
            loaded => loaded,
        }
        .map_err(EbpfError::from_load)?;

        // The pinned lineage programs first: a fork seen by the members' program has its
        // lineage. Unpinned, the fork program records it, and lineages are complete once it
        // is attached.
        let pinned = match pins {
            Ok(set) => Ok(attach_lineage(&mut ebpf, &btf, set)?),
            Err(reason) => Err(reason),
        };
        attach(&mut ebpf, &btf, EXIT_PROGRAM_NAME, TRACEPOINT)?;
        attach(&mut ebpf, &btf, FORK_PROGRAM_NAME, FORK_TRACEPOINT)?;
        let mut lineage =
            pinned.unwrap_or_else(|reason| unpinned(reason, config.pins.is_some(), Vec::new()));
        lineage.pin_root = config
            .pins
            .as_ref()
            .and_then(|pins| Some(pins.dir.parent()?.to_path_buf()));
        let causes = attach_cause_programs(&mut ebpf, &btf);
        let moves = attach_moves(&mut ebpf, &btf);
        let maps = TreeMaps {
            lineages: take_map(&mut ebpf, MAP_LINEAGES)?,
            members: take_map(&mut ebpf, MAP_MEMBERS)?,
            counters: take_map(&mut ebpf, MAP_MEMBER_COUNTERS)?,
            slots: take_map(&mut ebpf, MAP_MEMBER_SLOTS)?,
            uid_shares: take_map(&mut ebpf, MAP_UID_SHARES)?,
        };
        let members = TreeMap::new(maps, config.max_members, config.members_per_uid(), lineage)
            .map_err(|source| EbpfError::Map {
                name: MAP_MEMBERS,
                source,
            })?;
        let roots = members.try_clone().map_err(|source| EbpfError::Map {
            name: MAP_MEMBERS,
            source,
        })?;

        let map = HashMap::try_from(take_map(&mut ebpf, MAP_TRACKED)?).map_err(|source| {
            EbpfError::Map {
                name: MAP_TRACKED,
                source,
            }
        })?;
        let causes_map = HashMap::try_from(take_map(&mut ebpf, MAP_CAUSES)?).map_err(|source| {
            EbpfError::Map {
                name: MAP_CAUSES,
                source,
            }
        })?;
        let usages_map =
            HashMap::try_from(take_map(&mut ebpf, MAP_TREE_USAGES)?).map_err(|source| {
                EbpfError::Map {
                    name: MAP_TREE_USAGES,
                    source,
                }
            })?;
        let counters = Array::<MapData, u64>::try_from(take_map(&mut ebpf, MAP_COUNTERS)?)
            .and_then(|counters| SharedArray::map(counters.map(), COUNTER_SLOTS as usize))
            .map_err(|source| EbpfError::Map {
                name: MAP_COUNTERS,
                source,
            })?;
        let ring = RingBuf::try_from(take_map(&mut ebpf, MAP_EXITS)?).map_err(|source| {
            EbpfError::Map {
                name: MAP_EXITS,
                source,
            }
        })?;
        // SAFETY: the fd belongs to the ring buffer's MapData, which the AsyncFd owns: it stays
        // open and `as_raw_fd` keeps returning it until the AsyncFd is dropped.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|error| EbpfError::RingBuffer(error.into_parts().1))?;

        let mut source = EbpfSource {
            _ebpf: ebpf,
            map,
            ring,
            tracked: StdHashMap::new(),
            counters,
            max_tracked: config.max_tracked,
            refused: 0,
            reported_lost: 0,
            self_test_records: 0,
            self_test: SelfTest {
                passed: false,
                detail: "not run".into(),
            },
            members: Some(members),
            roots,
            causes,
            causes_map,
            usages_map,
            moves,
            cgroup_names: config.cgroup_names.clone(),
        };
        let detail = source
            .run_self_test(proc)
            .await
            .map_err(EbpfError::SelfTest)?;
        source.self_test = SelfTest {
            passed: true,
            detail,
        };
        source.self_test_records = source.stats().observed;
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis(),
            max_tracked = config.max_tracked,
            pidns_inum,
            self_test = source.self_test.detail,
            "eBPF exit source attached to tp_btf/{TRACEPOINT}"
        );
        Ok(source)
    }

    /// Tracks a child of ours, lets it exit and waits for its record. `Ok` says what was
    /// seen; `Err` says why the program cannot be trusted here.
    async fn run_self_test(&mut self, proc: &ProcRoot) -> Result<String, String> {
        let mut child =
            ProbeChild::spawn().map_err(|e| format!("cannot fork a test child: {e}"))?;
        let pid = child.pid();
        let start_ticks = proc
            .stat(pid)
            .map_err(|e| format!("cannot read the test child's start time: {e}"))?
            .start_ticks;
        let key = ProcessKey { pid, start_ticks };
        self.track(key)
            .map_err(|e| format!("cannot track the test child: {e}"))?;
        let released = Instant::now();
        child.release();
        let deadline = tokio::time::Instant::now() + SELF_TEST_PATIENCE;
        let mut events = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, self.wait(&mut events)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(format!("cannot read the ring buffer: {e}")),
                Err(_) => {
                    self.untrack(key);
                    return Err(format!(
                        "the program reported no exit of a test child (pid {pid}) within \
                          {SELF_TEST_PATIENCE:?}, so it cannot see the deaths of this daemon's \
                         processes here (an unusual PID or time namespace, or a kernel that \
                         never runs it); use --sources pidfd"
                    ));
                }
            }
            let seen = events.drain(..).find_map(|event| match event {
                SourceEvent::Exit(observation) if observation.key == key => Some(observation),
                _ => None,
            });
            if let Some(observation) = seen {
                let expected = ExitStatus::Exited {
                    code: super::child::EXIT_CODE,
                };
                return match observation.status {
                    Some(status) if status == expected => Ok(format!(
                        "saw a test child exit with its status in {} us",
                        released.elapsed().as_micros()
                    )),
                    other => Err(format!(
                        "the test child's record carries {other:?}, not {expected:?}"
                    )),
                };
            }
        }
    }

    /// The kernel's map of process-tree members, once: its reader owns it from then on.
    /// The ring of cgroup moves, once, for its reader ([`crate::cgroup::moves`]).
    pub fn take_moves(&mut self) -> Option<MoveRing> {
        self.moves.take()
    }

    pub fn take_members(&mut self) -> Option<TreeMap> {
        self.members.take()
    }

    /// What start-up found when it checked that the program sees deaths.
    pub fn self_test(&self) -> &SelfTest {
        &self.self_test
    }

    /// Which causes of death the kernel programs see here, and what they lost.
    pub fn causes(&self) -> CausesReport {
        let lost = self.counters.get(COUNTER_CAUSES_LOST) + self.counters.get(COUNTER_USAGE_LOST);
        self.causes.report(lost)
    }

    /// Waits until the ring buffer has records, then reads them all into `out` (followed by
    /// a [`SourceEvent::Lost`] when the kernel counted new losses). Cancel-safe: nothing is
    /// read until the wait is over.
    pub async fn wait(&mut self, out: &mut Vec<SourceEvent>) -> io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        read_records(
            guard.get_inner_mut(),
            &mut self.tracked,
            &self.cgroup_names,
            out,
        );
        // Readiness that arrived during the read is kept by the guard's tick.
        guard.clear_ready();
        drop(guard);
        self.check_losses(out);
        Ok(())
    }

    /// Reads the records already in the ring buffer, without waiting.
    pub fn drain(&mut self, out: &mut Vec<SourceEvent>) {
        read_records(
            self.ring.get_mut(),
            &mut self.tracked,
            &self.cgroup_names,
            out,
        );
        self.check_losses(out);
    }

    fn check_losses(&mut self, out: &mut Vec<SourceEvent>) {
        let total = self.counters.get(COUNTER_LOST);
        if total != self.reported_lost {
            self.reported_lost = total;
            out.push(SourceEvent::Lost {
                detected_by: DetectedBy::Ebpf,
                total,
            });
        }
    }
}

/// Loads the object with this daemon's settings, its lineages map pinned in `pins` (opened
/// there when it is pinned already).
fn load(
    btf: &Btf,
    pidns_inum: u32,
    config: &EbpfConfig,
    pins: Option<&PinSet>,
) -> Result<Ebpf, aya::EbpfError> {
    let (max_members, per_uid) = (
        u64::from(config.max_members),
        u64::from(config.members_per_uid()),
    );
    // Unreadable (kptr_restrict hides the addresses): OOM kills are then told by their mark.
    let (oom_start, oom_end) = std::fs::read_to_string("/proc/kallsyms")
        .ok()
        .and_then(|symbols| oom_killer_text(&symbols))
        .unwrap_or((0, 0));
    // Pinned, the lineage programs keep the lineages; else the fork and exit programs do.
    let lineage_inline = u32::from(pins.is_none());
    let mut loader = EbpfLoader::new();
    loader
        .btf(Some(btf))
        .override_global(LINEAGE_INLINE_GLOBAL, &lineage_inline, true)
        .override_global(PIDNS_GLOBAL, &pidns_inum, true)
        .override_global(OOM_KILL_START_GLOBAL, &oom_start, true)
        .override_global(OOM_KILL_END_GLOBAL, &oom_end, true)
        .map_max_entries(MAP_TRACKED, config.max_tracked)
        // One entry per tracked process at most, each until its exit record takes it.
        .map_max_entries(MAP_CAUSES, config.max_tracked)
        .map_max_entries(MAP_TREE_USAGES, config.max_tracked)
        .map_max_entries(MAP_EXITS, config.ring_bytes)
        .override_global(MAX_MEMBERS_GLOBAL, &max_members, true)
        .override_global(MAX_MEMBERS_PER_UID_GLOBAL, &per_uid, true)
        // Members take at most max_members entries; every tracked process has one more.
        .map_max_entries(
            MAP_MEMBERS,
            config.max_members.saturating_add(config.max_tracked),
        );
    if let Some(pins) = pins {
        loader.map_pin_path(MAP_LINEAGES, pins.lineages());
    }
    loader.load(OBJECT)
}

/// The text of the OOM killer's function in `/proc/kallsyms` (`ADDRESS TYPE NAME`, by
/// address): from its address to the next symbol's.
fn oom_killer_text(symbols: &str) -> Option<(u64, u64)> {
    let entry = |line: &str| {
        let mut fields = line.split_whitespace();
        let address = u64::from_str_radix(fields.next()?, 16).ok()?;
        Some((address, fields.nth(1)?.to_owned()))
    };
    OOM_KILL_FUNCTIONS.iter().find_map(|function| {
        let mut lines = symbols.lines().map_while(entry);
        let (start, _) = lines.find(|(_, name)| name == function)?;
        let (end, _) = lines.find(|(address, _)| *address > start)?;
        (start != 0).then_some((start, end))
    })
}

/// The program `name` of the object, as a BTF tracepoint program.
fn tracepoint_program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut BtfTracePoint, EbpfError> {
    ebpf.program_mut(name)
        .ok_or(EbpfError::BadObject(name))?
        .try_into()
        .map_err(|_| EbpfError::BadObject(name))
}

/// Loads the program `name` and attaches it to `tracepoint`, for as long as `ebpf` lives.
fn attach(
    ebpf: &mut Ebpf,
    btf: &Btf,
    name: &'static str,
    tracepoint: &str,
) -> Result<(), EbpfError> {
    let program = tracepoint_program(ebpf, name)?;
    program
        .load(tracepoint, btf)
        .map_err(|e| EbpfError::from_program("loading an eBPF program", e))?;
    program
        .attach()
        .map(drop)
        .map_err(|e| EbpfError::from_program("attaching an eBPF program", e))
}

/// Attaches the lineage programs of `ebpf`, loaded with its lineages map pinned in `pins`:
/// adopted from there when they run there already, else pinned there, else (pinning failed)
/// for as long as `ebpf` lives. (Loaded unpinned, the fork and exit programs keep the
/// lineages themselves, and the lineage programs run not at all.)
fn attach_lineage(ebpf: &mut Ebpf, btf: &Btf, pins: PinSet) -> Result<LineageKeep, EbpfError> {
    if let Some(since_ms) = pins.adopted_since_ms {
        // Those of another version, left by an upgrade stopped halfway.
        pins.remove_others();
        tracing::info!(
            pins = %pins.dir.display(),
            since_ms,
            "adopted the pinned lineage programs: orphans made while no daemon ran are placed"
        );
        return Ok(LineageKeep::pinned(since_ms, pins));
    }
    let mut pins = Ok::<_, String>(pins);
    // Links pinned in a set given up on, held so that they stay attached.
    let mut held = Vec::new();
    let programs = [
        (LINEAGE_EXIT_PROGRAM_NAME, TRACEPOINT, EXIT_LINK),
        (LINEAGE_FORK_PROGRAM_NAME, FORK_TRACEPOINT, FORK_LINK),
    ];
    for (name, tracepoint, pin) in programs {
        let program = tracepoint_program(ebpf, name)?;
        program
            .load(tracepoint, btf)
            .map_err(|e| EbpfError::from_program("loading an eBPF lineage program", e))?;
        let link = program
            .attach()
            .map_err(|e| EbpfError::from_program("attaching an eBPF lineage program", e))?;
        let Ok(set) = &mut pins else { continue };
        let pinned = program
            .take_link(link)
            .map_err(EbpfError::Program)
            .map(FdLink::from)
            .map_err(|error| error.to_string())
            .and_then(|link| set.pin_link(pin, link).map_err(|error| error.to_string()));
        if let Err(error) = pinned {
            // The failed pin took the link with it: attach again, for this daemon's life.
            program
                .attach()
                .map_err(|e| EbpfError::from_program("attaching an eBPF lineage program", e))?;
            if let Ok(set) = std::mem::replace(&mut pins, Err(error)) {
                held = set.abandon();
            }
        }
    }
    match pins {
        Ok(set) => {
            let since_ms = set
                .pinned_since_ms()
                .unwrap_or_else(|| lineage_pin::epoch_ms(SystemTime::now()));
            set.remove_others();
            tracing::info!(pins = %set.dir.display(), "pinned the lineage programs: they outlive this daemon");
            Ok(LineageKeep::pinned(since_ms, set))
        }
        Err(reason) => Ok(unpinned(reason, true, held)),
    }
}

/// Lineages kept for this daemon's life only, and why: a warning only when pins were `asked`
/// for, since by default it is the normal case. `held` are links to keep attached.
fn unpinned(reason: String, asked: bool, held: Vec<FdLink>) -> LineageKeep {
    let message =
        "the lineage programs are not pinned: orphans made while no daemon runs will not be placed";
    if asked {
        tracing::warn!(%reason, "{message}");
    } else {
        tracing::info!(%reason, "{message}");
    }
    LineageKeep::unpinned(reason, held)
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, EbpfError> {
    ebpf.take_map(name).ok_or(EbpfError::BadObject(name))
}

/// The size of a page, which the kernel counts peak memory in.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// `CLOCK_MONOTONIC` now, the clock of `bpf_ktime_get_ns`.
pub(crate) fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Reads every record in the ring into `out`, forgetting the reported processes.
fn read_records(
    ring: &mut RingBuf<MapData>,
    tracked: &mut StdHashMap<u32, u64>,
    cgroup_names: &SessionCgroupNames,
    out: &mut Vec<SourceEvent>,
) {
    // One pair of clock readings turns the kernel's monotonic exit times into wall times.
    let (now_wall, now_mono) = (SystemTime::now(), monotonic_ns());
    while let Some(item) = ring.next() {
        let record = ExitRecord::from_bytes(&item);
        let len = item.len();
        drop(item);
        let Some(record) = record else {
            tracing::warn!(len, "ignoring a short eBPF exit record");
            continue;
        };
        let key = ProcessKey {
            pid: record.tgid,
            start_ticks: record.start_ticks,
        };
        if tracked.get(&key.pid) == Some(&key.start_ticks) {
            tracked.remove(&key.pid);
        }
        let died_at = now_wall.checked_sub(Duration::from_nanos(
            now_mono.saturating_sub(record.exit_monotonic_ns),
        ));
        let status = ExitStatus::from_wait_status(record.wait_status);
        let mut facts = KernelFacts::of_record(&record, status, page_size());
        // Only an OOM kill confined to a cgroup has an id: its path is read while it exists.
        if let (Some(id), Cause::Oom { cgroup, .. }) = (facts.oom_cgroup_id, &mut facts.cause) {
            *cgroup = cgroup_names.memory_cgroup_path(id);
        }
        out.push(SourceEvent::Exit(ExitObservation {
            key,
            reason: DeathReason::Exited,
            status: Some(status),
            detected_by: DetectedBy::Ebpf,
            at: now_wall,
            died_at,
            facts: Some(Box::new(facts)),
        }));
    }
}

impl EbpfSource {
    /// Writes `key`'s entry in the map of tracked processes, whose exits are reported.
    fn insert_tracked(&mut self, key: ProcessKey) -> Result<(), TrackError> {
        let Err(error) = self.map.insert(key.pid, key.start_ticks, 0) else {
            return Ok(());
        };
        match map_errno(&error) {
            Some(libc::E2BIG | libc::ENOMEM) => {
                self.refused += 1;
                Err(TrackError::Exhausted(format!(
                    "the eBPF map of tracked processes is full ({} entries)",
                    self.max_tracked
                )))
            }
            _ => Err(TrackError::Io(io::Error::other(error))),
        }
    }
}

impl ExitSource for EbpfSource {
    fn kind(&self) -> DetectedBy {
        DetectedBy::Ebpf
    }

    fn track(&mut self, key: ProcessKey) -> Result<(), TrackError> {
        // The tracked entry first: the members map then never holds more tracked
        // processes' entries than the tracked map holds processes, which its size counts on.
        self.insert_tracked(key)?;
        // Without its entry in the members map, the programs would not see its exit.
        if let Err(error) = self.roots.add_root(key) {
            // Whatever this pid's entry was, it was replaced: forget it.
            self.tracked.remove(&key.pid);
            if let Err(error) = self.map.remove(&key.pid) {
                tracing::warn!(%key, %error, "cannot remove a process from the eBPF map");
            }
            return match error {
                TreeMapError::NoRoom(_) => {
                    self.refused += 1;
                    Err(TrackError::Exhausted(error.to_string()))
                }
                error => Err(TrackError::Io(io::Error::other(error))),
            };
        }
        self.tracked.insert(key.pid, key.start_ticks);
        Ok(())
    }

    fn track_member(&mut self, key: ProcessKey) -> Result<(), TrackError> {
        // Its entry as a member is what the programs see its exit through; it stays, so
        // that what the member forks still joins its tree.
        if self
            .roots
            .get(key.pid)
            .is_none_or(|entry| entry.member != key)
        {
            return Err(TrackError::Exhausted(
                "the process has no entry in the members map".to_owned(),
            ));
        }
        self.insert_tracked(key)?;
        self.tracked.insert(key.pid, key.start_ticks);
        Ok(())
    }

    fn untrack(&mut self, key: ProcessKey) {
        // The map is keyed by PID alone: never delete a newer process's entry.
        if self.tracked.get(&key.pid) != Some(&key.start_ticks) {
            return;
        }
        self.tracked.remove(&key.pid);
        // The root entry first: the members map never holds more of them than the tracked
        // map holds processes.
        self.roots.remove_root(key);
        match self.map.remove(&key.pid) {
            Ok(()) => {}
            // The kernel deletes the entry when it reports the death.
            Err(error) if map_errno(&error) == Some(libc::ENOENT) => {}
            Err(error) => tracing::warn!(%key, %error, "cannot remove a process from the eBPF map"),
        }
        // Its signal sender and its tree's usage, which no exit record will take now. Only
        // the programs write them for a tracked process: none can come after the removal.
        let causes = self.causes_map.remove(&key.pid).err();
        let usages = self.usages_map.remove(&key.pid).err();
        for error in [causes, usages].into_iter().flatten() {
            if map_errno(&error) != Some(libc::ENOENT) {
                tracing::warn!(%key, %error, "cannot remove a process's cause from the eBPF maps");
            }
        }
    }

    fn stats(&self) -> SourceStats {
        let total = |slot| self.counters.get(slot);
        SourceStats {
            tracked: self.tracked.len() as u64,
            observed: total(COUNTER_EMITTED).saturating_sub(self.self_test_records),
            lost: total(COUNTER_LOST),
            refused: self.refused,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_oom_killers_text_runs_to_the_next_symbol() {
        let symbols = "ffffffff815afe50 t __pfx___oom_kill_process\n\
                       ffffffff815afe60 t __oom_kill_process\n\
                       ffffffff815afe60 t alias_at_the_same_address\n\
                       ffffffff815b02a0 t __pfx_oom_kill_process\n\
                       ffffffff815b02b0 t oom_kill_process\n\
                       ffffffff815b0400 t next\n";
        assert_eq!(
            oom_killer_text(symbols),
            Some((0xffffffff815afe60, 0xffffffff815b02a0))
        );
        // Inlined: the function it is inlined into.
        let inlined = symbols.replace(" __oom_kill_process", " other");
        assert_eq!(
            oom_killer_text(&inlined),
            Some((0xffffffff815b02b0, 0xffffffff815b0400))
        );
        // Hidden by kptr_restrict: every address reads 0.
        assert_eq!(
            oom_killer_text("0000000000000000 t __oom_kill_process\n0000000000000000 t x\n"),
            None
        );
    }

    use std::collections::HashSet;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    use super::*;
    use crate::source::testutil::{PATIENCE, Proc, QUIET, privileged, wait_until};
    use crate::source::tree_map::KernelMember;
    use liveness_proc::identity::ProcRoot;

    /// Selects a mode of [`helper_main`] in a re-executed test binary.
    const HELPER_ENV: &str = "LIVENESS_EBPF_TEST_HELPER";
    /// Threads besides the leader in the `many-threads` helper.
    const HELPER_THREADS: usize = 8;

    // Runs before the test harness's `main`, on the main thread: the helper modes need the
    // thread-group leader itself to exit or to be replaced by execve, and the harness runs
    // tests on other threads.
    #[used]
    #[unsafe(link_section = ".init_array")]
    static HELPER_ENTRY: extern "C" fn() = helper_main;

    extern "C" fn helper_main() {
        let Some(mode) = std::env::var_os(HELPER_ENV) else {
            return;
        };
        match mode.to_str() {
            // The leader exits first; the remaining thread ends the process later with code 7.
            Some("leader-exits-first") => {
                read_trigger();
                std::thread::spawn(|| {
                    read_trigger();
                    // SAFETY: exit_group(2); nothing needs cleaning up.
                    unsafe { libc::_exit(7) }
                });
                // exit(2), not exit_group(2): ends the leader only. Not pthread_exit: before main,
                // glibc has not yet set up the main thread's unwind buffer and it crashes.
                // SAFETY: the thread ends here; nothing on its stack is used afterwards.
                unsafe { libc::syscall(libc::SYS_exit, 0) };
                unreachable!("exit(2) returned");
            }
            // A non-leader thread execs: de_thread kills the leader, the process lives on.
            Some("thread-execs") => {
                read_trigger();
                std::thread::spawn(|| {
                    let error = Command::new("sleep").arg("1000").exec();
                    eprintln!("helper: exec sleep: {error}");
                    // SAFETY: exit_group(2); nothing needs cleaning up.
                    unsafe { libc::_exit(2) }
                });
                park_forever();
            }
            // Threads that all die at once on SIGKILL.
            Some("many-threads") => {
                for _ in 0..HELPER_THREADS {
                    std::thread::spawn(park_forever);
                }
                park_forever();
            }
            // SAFETY: exit_group(2).
            _ => unsafe { libc::_exit(2) },
        }
    }

    fn park_forever() {
        loop {
            std::thread::park();
        }
    }

    /// Blocks until the test writes one byte to stdin; exits if the test is gone.
    fn read_trigger() {
        let mut byte = 0u8;
        // Unbuffered, so the leader and a later thread each consume exactly their own byte.
        // SAFETY: reads one byte into a live local.
        if unsafe { libc::read(0, (&raw mut byte).cast(), 1) } != 1 {
            // SAFETY: exit_group(2).
            unsafe { libc::_exit(3) }
        }
    }

    /// The source, and the events read from its ring but not yet taken by the test.
    struct Reader {
        source: EbpfSource,
        buffered: std::collections::VecDeque<SourceEvent>,
    }

    impl std::ops::Deref for Reader {
        type Target = EbpfSource;
        fn deref(&self) -> &EbpfSource {
            &self.source
        }
    }

    impl std::ops::DerefMut for Reader {
        fn deref_mut(&mut self) -> &mut EbpfSource {
            &mut self.source
        }
    }

    impl Reader {
        /// The next event read within `patience`, if any.
        async fn next_within(&mut self, patience: Duration) -> Option<SourceEvent> {
            let deadline = tokio::time::Instant::now() + patience;
            while self.buffered.is_empty() {
                let mut events = Vec::new();
                match tokio::time::timeout_at(deadline, self.source.wait(&mut events)).await {
                    Ok(read) => read.expect("reading the ring buffer"),
                    Err(_) => return None,
                }
                self.buffered.extend(events);
            }
            self.buffered.pop_front()
        }
    }

    /// The next event, which must be an exit arriving within [`PATIENCE`].
    async fn next_exit(reader: &mut Reader) -> ExitObservation {
        match reader.next_within(PATIENCE).await {
            Some(SourceEvent::Exit(observation)) => observation,
            Some(other) => panic!("expected an exit observation, got {other:?}"),
            None => panic!("no exit observation within {PATIENCE:?}"),
        }
    }

    /// Panics if any event arrives within [`QUIET`]; `why` says why none should.
    async fn assert_quiet(reader: &mut Reader, why: &str) {
        if let Some(event) = reader.next_within(QUIET).await {
            panic!("{why}, yet the source sent {event:?}");
        }
    }

    /// Starts the source, or returns `None` where [`skip`] says so.
    async fn start(test: &str, config: EbpfConfig) -> Option<Reader> {
        if !privileged(test) {
            return None;
        }
        let source = EbpfSource::start(config, &ProcRoot::default())
            .await
            .unwrap_or_else(|error| panic!("{test}: starting the eBPF source: {error}"));
        assert!(
            source.self_test().passed,
            "{test}: {:?}",
            source.self_test()
        );
        Some(Reader {
            source,
            buffered: Default::default(),
        })
    }

    fn spawn_helper(mode: &str) -> Proc {
        Proc::spawn(
            Command::new(std::env::current_exe().unwrap())
                .env(HELPER_ENV, mode)
                .stdin(Stdio::piped()),
        )
    }

    fn stat_of(pid: u32) -> liveness_proc::identity::Stat {
        ProcRoot::default()
            .stat(pid)
            .unwrap_or_else(|error| panic!("reading /proc/{pid}/stat: {error}"))
    }

    /// Checks the observation names `key` and carries the status the parent's wait() gets.
    fn assert_reported(
        observation: &ExitObservation,
        key: ProcessKey,
        child: &mut Proc,
    ) -> ExitStatus {
        assert_eq!(observation.key, key, "observed a different process");
        assert_eq!(observation.detected_by, DetectedBy::Ebpf);
        assert_eq!(observation.reason, DeathReason::Exited);
        let raw = child.reap().into_raw();
        let waited = ExitStatus::from_wait_status(raw as u32);
        assert_eq!(
            observation.status,
            Some(waited),
            "the eBPF status differs from what wait() returned ({raw:#x})"
        );
        waited
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_the_exit_code_of_a_tracked_process() {
        let Some(mut source) = start("exit code", EbpfConfig::default()).await else {
            return;
        };
        let mut child = Proc::sh("read x; exit 7", &[]);
        let key = child.key();
        source.track(key).unwrap();
        // Untracking another process with this PID must leave this one tracked.
        source.untrack(ProcessKey {
            start_ticks: key.start_ticks + 1,
            ..key
        });
        assert_eq!(source.stats().tracked, 1);

        child.close_stdin();
        let observation = next_exit(&mut source).await;
        let status = assert_reported(&observation, key, &mut child);
        assert_eq!(status, ExitStatus::Exited { code: 7 });
        assert_eq!(
            source.stats(),
            SourceStats {
                tracked: 0,
                observed: 1,
                lost: 0,
                refused: 0
            }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_sigkill() {
        let Some(mut source) = start("SIGKILL", EbpfConfig::default()).await else {
            return;
        };
        let mut child = Proc::sleeper();
        let key = child.key();
        source.track(key).unwrap();
        child.kill();
        let observation = next_exit(&mut source).await;
        let status = assert_reported(&observation, key, &mut child);
        assert_eq!(
            status,
            ExitStatus::Signaled {
                signal: 9,
                core_dumped: false
            }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn untracked_untracked_and_stale_processes_report_nothing() {
        let Some(mut source) = start("not tracked", EbpfConfig::default()).await else {
            return;
        };
        let never = Proc::sh("read x; exit 1", &[]);
        let untracked = Proc::sh("read x; exit 2", &[]);
        source.track(untracked.key()).unwrap();
        source.untrack(untracked.key());
        // An entry left for an earlier process with the same PID.
        let stale = Proc::sh("read x; exit 3", &[]);
        source
            .track(ProcessKey {
                start_ticks: stale.key().start_ticks + 1,
                ..stale.key()
            })
            .unwrap();

        for mut child in [never, untracked, stale] {
            child.close_stdin();
            child.reap();
        }
        assert_quiet(&mut source, "untracked processes exited").await;
        assert_eq!(source.stats().observed, 0);
        assert_eq!(
            source.stats().tracked,
            1,
            "the stale entry stays until untracked"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_exiting_before_its_threads_is_not_a_death() {
        let Some(mut source) = start("leader exits first", EbpfConfig::default()).await else {
            return;
        };
        let mut child = spawn_helper("leader-exits-first");
        let key = child.key();
        source.track(key).unwrap();

        child.poke();
        wait_until("the leader is a zombie", || stat_of(key.pid).state == 'Z').await;
        assert_quiet(&mut source, "the leader exited while a thread runs").await;

        child.poke();
        let observation = next_exit(&mut source).await;
        let status = assert_reported(&observation, key, &mut child);
        assert_eq!(status, ExitStatus::Exited { code: 7 });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn execve_is_not_a_death() {
        let Some(mut source) = start("execve", EbpfConfig::default()).await else {
            return;
        };
        // Single-threaded exec, and exec from a non-leader thread (de_thread kills the leader).
        let mut shell = Proc::sh("read x; exec sleep 1000", &[]);
        let mut threaded = spawn_helper("thread-execs");
        let keys = [shell.key(), threaded.key()];
        for key in keys {
            source.track(key).unwrap();
        }

        shell.close_stdin();
        threaded.poke();
        for key in keys {
            wait_until("the process runs sleep", || {
                stat_of(key.pid).comm == "sleep"
            })
            .await;
            assert_eq!(stat_of(key.pid).start_ticks, key.start_ticks);
        }
        assert_quiet(&mut source, "tracked processes called execve").await;

        for (child, key) in [(&mut shell, keys[0]), (&mut threaded, keys[1])] {
            child.kill();
            let observation = next_exit(&mut source).await;
            assert_reported(&observation, key, child);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn threads_dying_together_report_one_death() {
        let Some(mut source) = start("many threads", EbpfConfig::default()).await else {
            return;
        };
        let mut children: Vec<Proc> = (0..20).map(|_| spawn_helper("many-threads")).collect();
        let mut keys = HashSet::new();
        for child in &children {
            let key = child.key();
            let tasks = format!("/proc/{}/task", key.pid);
            wait_until("all helper threads run", || {
                std::fs::read_dir(&tasks).map_or(0, Iterator::count) == HELPER_THREADS + 1
            })
            .await;
            source.track(key).unwrap();
            keys.insert(key);
        }
        for child in &mut children {
            child.kill();
        }

        let mut seen = HashSet::new();
        for _ in 0..children.len() {
            let observation = next_exit(&mut source).await;
            assert!(
                seen.insert(observation.key),
                "{} reported twice",
                observation.key
            );
        }
        assert_eq!(seen, keys);
        assert_quiet(&mut source, "every process was reported").await;
        for mut child in children {
            child.reap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hundred_simultaneous_exits_are_each_reported_once() {
        let Some(mut source) = start("200 exits", EbpfConfig::default()).await else {
            return;
        };
        let mut children: Vec<(Proc, ProcessKey, u8)> = (0..200u8)
            .map(|code| {
                let child = Proc::sh("read x; exit \"$1\"", &[&code.to_string()]);
                let key = child.key();
                source.track(key).unwrap();
                (child, key, code)
            })
            .collect();
        assert_eq!(source.stats().tracked, 200);
        for (child, _, _) in &mut children {
            child.close_stdin();
        }

        let mut seen = std::collections::HashMap::new();
        for _ in 0..children.len() {
            let observation = next_exit(&mut source).await;
            if let Some(earlier) = seen.insert(observation.key, observation.status) {
                panic!("{} reported twice ({earlier:?})", observation.key);
            }
        }
        assert_quiet(&mut source, "all 200 were reported").await;
        for (mut child, key, code) in children {
            assert_eq!(
                seen.get(&key),
                Some(&Some(ExitStatus::Exited { code })),
                "{key}"
            );
            child.reap();
        }
        let stats = source.stats();
        assert_eq!((stats.tracked, stats.observed, stats.lost), (0, 200, 0));
    }

    /// The members map is read in batches: a walk sees every entry, however many batches it
    /// takes and whichever bucket each falls in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_walk_of_the_members_map_sees_every_entry_past_one_batch() {
        let Some(mut source) = start(
            "members walk",
            EbpfConfig {
                max_members: 5000,
                max_members_per_uid: Some(5000),
                ..EbpfConfig::default()
            },
        )
        .await
        else {
            return;
        };
        let mut members = source.take_members().expect("the members map");
        // Pids above any the machine gives out: no process forks or exits under them.
        let key = |pid: u32| ProcessKey {
            pid: 4_200_000 + pid,
            start_ticks: 7,
        };
        let root = key(0);
        members.add_root(root).unwrap();
        let written: HashSet<ProcessKey> = (1..=4500).map(key).collect();
        for &member in &written {
            assert!(members.insert(KernelMember { member, root }, 0).unwrap());
        }
        let walked: Vec<ProcessKey> = (members.members().into_iter())
            .filter(|entry| entry.root == root)
            .map(|entry| entry.member)
            .collect();
        assert_eq!(walked.len(), written.len(), "each entry once");
        assert_eq!(walked.into_iter().collect::<HashSet<_>>(), written);
    }

    /// Sends one line to a [`Proc::sh`] script blocked in `read`.
    fn send_line(process: &mut Proc) {
        let stdin = process.0.stdin.as_mut().expect("piped stdin");
        std::io::Write::write_all(stdin, b"\n").expect("write to the script");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forks_join_the_tree_leave_it_at_exit_and_a_full_map_is_counted() {
        let Some(mut source) = start(
            "fork tracking",
            EbpfConfig {
                max_members: 3,
                // The owner and one more: the map has room for five entries in all, which
                // the owner's five descendants would fill without the members' budget.
                max_tracked: 2,
                ..EbpfConfig::default()
            },
        )
        .await
        else {
            return;
        };
        let members = source.take_members().expect("the members map");
        let mut owner = Proc::sh(
            "read x; (sleep 1000 &); read x; sleep 1000 & sleep 1000 & sleep 1000 & sleep 1000 & read x",
            &[],
        );
        let root = owner.key();
        source.track(root).unwrap();
        let in_tree = || {
            members
                .members()
                .into_iter()
                .filter(|entry| entry.root == root)
                .map(|entry| entry.member)
                .collect::<Vec<_>>()
        };

        // A subshell forked by the owner, and its sleep forked by that member. Members
        // that have exited already (the subshell may have) are no sleep.
        let is_sleep = |m: &&ProcessKey| {
            ProcRoot::default()
                .stat(m.pid)
                .is_ok_and(|stat| stat.comm == "sleep")
        };
        let added_before = members.added_count();
        send_line(&mut owner);
        wait_until("the subshell's sleep is a member", || {
            in_tree().iter().any(|m| is_sleep(&m))
        })
        .await;
        let sleeper = *in_tree().iter().find(is_sleep).unwrap();
        assert_eq!(stat_of(sleeper.pid).start_ticks, sleeper.start_ticks);
        // The count that tells user space whether a walk of the map can find anything new.
        let added = members.added_count() - added_before;
        assert!(
            added >= 2,
            "the subshell and its sleep joined, yet {added} were counted"
        );
        // SAFETY: killing the test's own grandchild, just identified by its start time.
        unsafe { libc::kill(sleeper.pid as i32, libc::SIGKILL) };
        wait_until("a dead member leaves the map", || {
            !in_tree().contains(&sleeper)
        })
        .await;
        assert_eq!(members.full_count(), 0);

        // Four more processes and room for three.
        send_line(&mut owner);
        wait_until("a fork found the map full", || members.full_count() > 0).await;
        assert!(in_tree().len() <= 3, "{:?}", in_tree());
        assert_eq!(
            members.slots_used(),
            in_tree().len() as u64,
            "one slot per member entry"
        );

        // However many members there are, a tracked process's entry has room, and its
        // exit is reported.
        let mut late = Proc::exit_on_eof(3);
        let late_key = late.key();
        source
            .track(late_key)
            .expect("tracking with every member slot taken");
        late.close_stdin();
        let observation = next_exit(&mut source).await;
        assert_eq!(
            (observation.key, observation.status),
            (late_key, Some(ExitStatus::Exited { code: 3 }))
        );

        // The map holds at most three of the four sleepers; the owner's children list has
        // them all.
        let children = ProcRoot::default()
            .children(owner.pid())
            .expect("the owner's children");
        for pid in in_tree().iter().map(|member| member.pid).chain(children) {
            // SAFETY: killing the test's own descendants, named by the map or the kernel's
            // children list of the owner, which is still alive.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        owner.kill();
        wait_until("every member's exit gave its slot back", || {
            members.slots_used() == 0
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tracked_member_roots_its_own_tree_until_untracked() {
        let Some(mut source) = start("nested trees", EbpfConfig::default()).await else {
            return;
        };
        let members = source.take_members().expect("the members map");
        // The inner shell reads the owner's stdin too: one line each, in turn.
        let mut owner = Proc::sh("read x; sh -c 'read y; sleep 1000 & read y'; read x", &[]);
        let outer = owner.key();
        source.track(outer).unwrap();
        let child_of = |root: ProcessKey, comm: &str| {
            members
                .members()
                .into_iter()
                .find(|entry| entry.root == root && stat_of(entry.member.pid).comm == comm)
                .map(|entry| entry.member)
        };
        send_line(&mut owner);
        // Kept as found: a second walk of the map, right after one found it, once came back
        // without it (Linux 6.1 under TCG).
        let found = std::cell::Cell::new(None);
        wait_until("the inner shell is a member", || {
            found.set(child_of(outer, "sh"));
            found.get().is_some()
        })
        .await;
        let inner = found.get().unwrap();
        assert_eq!(members.slots_used(), 1);

        // Tracked, the member is the root of a tree of its own, in its slot.
        source.track(inner).unwrap();
        assert_eq!(
            members.get(inner.pid),
            None,
            "a root is not listed as a member"
        );
        assert_eq!(members.slots_used(), 1);
        send_line(&mut owner);
        wait_until("the inner shell's sleep joins its tree", || {
            child_of(inner, "sleep").is_some()
        })
        .await;
        let sleeper = child_of(inner, "sleep").unwrap();
        assert_eq!(child_of(outer, "sleep"), None);

        // Untracked, its entry goes with its slot; the sleep stays a member.
        source.untrack(inner);
        assert_eq!(members.get(inner.pid), None);
        assert_eq!(members.slots_used(), 1);
        for pid in [sleeper.pid, inner.pid] {
            // SAFETY: killing the test's own descendants, just identified by their start
            // times.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        owner.kill();
        wait_until("every slot is given back", || members.slots_used() == 0).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tracking_beyond_capacity_is_refused() {
        let Some(mut source) = start(
            "capacity",
            EbpfConfig {
                // The self-test needs one slot while the source starts.
                max_tracked: 2,
                ..EbpfConfig::default()
            },
        )
        .await
        else {
            return;
        };
        // PIDs above pid_max's ceiling: no process will ever exit with them.
        let key = |pid| ProcessKey {
            pid,
            start_ticks: 1,
        };
        source.track(key(1 << 30)).unwrap();
        source.track(key((1 << 30) + 1)).unwrap();
        match source.track(key((1 << 30) + 2)) {
            Err(TrackError::Exhausted(_)) => {}
            other => panic!("expected TrackError::Exhausted, got {other:?}"),
        }
        // Re-tracking a PID replaces its entry and needs no room.
        source.track(key(1 << 30)).unwrap();
        assert_eq!(source.stats().tracked, 2);
        assert_eq!(source.stats().refused, 1);
    }

    #[test]
    fn missing_privileges_name_the_capabilities() {
        if !privileged("privileges") {
            return;
        }
        // Credentials are per thread in the kernel; the raw syscall drops them for this
        // thread only (glibc's setresuid would change every thread of the test binary).
        let result = std::thread::spawn(|| {
            // SAFETY: changes this thread's credentials and nothing else.
            let rc = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
            assert_eq!(rc, 0, "setresuid: {}", io::Error::last_os_error());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime
                .block_on(EbpfSource::start(
                    EbpfConfig::default(),
                    &ProcRoot::default(),
                ))
                .map(drop)
        })
        .join()
        .unwrap();
        match result {
            Err(
                error @ EbpfError::Denied {
                    denial: Denial::Privileges { .. },
                    ..
                },
            ) => {
                assert!(
                    error.to_string().contains("CAP_BPF and CAP_PERFMON"),
                    "{error}"
                );
            }
            other => panic!("expected EbpfError::Denied for privileges, got {other:?}"),
        }
    }
}
