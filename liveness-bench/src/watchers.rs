//! The bench's own exit watchers, the few lines of code a user writes instead of running a
//! daemon: a proc-connector listener, a pidfd waiter and a `/proc` poller; and the floor
//! under liveness, the project's own eBPF object read by as little code as can read it.
//! Each runs as this
//! binary re-executed (see [`WATCHER_ARG`]) and speaks one line protocol on its standard
//! streams, so that the harness reads them exactly like the peer tools it compares them with.
//!
//! stdin: PIDs to track, one per line, each batch ended by an empty line; stdout: `ack` once
//! a batch is tracked, then one line with the PID of each exit seen. The proc connector
//! reports every process exit of the machine, as `forkstat` does, and only acknowledges.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aya::maps::{HashMap as AyaHashMap, MapData, RingBuf};
use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf, EbpfLoader};
use liveness_ebpf::OBJECT;
use liveness_ebpf::record::{
    EXIT_PROGRAM_NAME, ExitRecord, MAP_EXITS, MAP_MEMBERS, MAP_TRACKED, MemberRecord,
};

use crate::procs;

/// First argument that makes this binary a watcher: `WATCHER_ARG KIND`, where KIND is
/// `proc-connector`, `pidfd`, `ebpf-floor` or `poll-<interval ms>`.
pub const WATCHER_ARG: &str = "__watcher";

/// What a watcher does per exit, per batch and between events.
trait Watch {
    /// Starts tracking `pid`.
    fn track(&mut self, pid: u32) -> Result<()>;
    /// Descriptors whose readiness means exits to collect.
    fn fds(&self) -> Vec<RawFd>;
    /// How long to sleep at most before [`Watch::collect`] must run again.
    fn timeout(&self) -> Option<Duration>;
    /// Appends the PIDs of the exits seen since the last call.
    fn collect(&mut self, exited: &mut Vec<u32>) -> Result<()>;
}

pub fn watcher_main(kind: &str) -> Result<()> {
    let mut watch: Box<dyn Watch> = match kind {
        "proc-connector" => Box::new(ProcConnector::open()?),
        "pidfd" => Box::new(PidfdWaiter::default()),
        "ebpf-floor" => Box::new(EbpfFloor::open()?),
        _ => match kind.strip_prefix("poll-").and_then(|ms| ms.parse().ok()) {
            Some(ms) => Box::new(Poller::every(Duration::from_millis(ms))),
            None => {
                bail!("unknown watcher {kind:?}: proc-connector, pidfd, ebpf-floor or poll-<ms>")
            }
        },
    };
    let mut input = Vec::new();
    let mut exited = Vec::new();
    let mut out = std::io::stdout().lock();
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(0)
            .chain(watch.fds())
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let timeout = watch.timeout().map_or(-1, |t| {
            t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        });
        // SAFETY: polling descriptors we own, through a live array.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if ready < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error).context("poll");
        }
        watch.collect(&mut exited)?;
        for pid in exited.drain(..) {
            writeln!(out, "{pid}")?;
        }
        out.flush()?;
        if fds[0].revents != 0 {
            let mut chunk = [0u8; 4096];
            let n = read_fd(0, &mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            input.extend_from_slice(&chunk[..n]);
            while let Some(end) = input.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = input.drain(..=end).collect();
                let line = std::str::from_utf8(&line[..end]).context("non-UTF-8 input")?;
                if line.is_empty() {
                    writeln!(out, "ack")?;
                    out.flush()?;
                } else {
                    watch.track(line.parse().context("a PID to track")?)?;
                }
            }
        }
    }
}

fn read_fd(fd: RawFd, buffer: &mut [u8]) -> Result<usize> {
    loop {
        // SAFETY: reading into a live buffer.
        let n = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error.into());
        }
    }
}

/// One `pidfd_open` per tracked process; a pidfd becomes readable when its process exits.
#[derive(Debug, Default)]
struct PidfdWaiter {
    pidfds: HashMap<RawFd, (u32, OwnedFd)>,
    /// Processes already gone when asked to track them: exited, reported at once.
    gone: Vec<u32>,
}

impl Watch for PidfdWaiter {
    fn track(&mut self, pid: u32) -> Result<()> {
        match liveness_proc::pidfd::open_pidfd(pid) {
            Ok(owned) => {
                self.pidfds.insert(owned.as_raw_fd(), (pid, owned));
                Ok(())
            }
            Err(errno) if errno.raw_os_error() == libc::ESRCH => {
                self.gone.push(pid);
                Ok(())
            }
            Err(errno) => Err(std::io::Error::from(errno)).context(format!("pidfd_open({pid})")),
        }
    }

    fn fds(&self) -> Vec<RawFd> {
        self.pidfds.keys().copied().collect()
    }

    fn timeout(&self) -> Option<Duration> {
        None
    }

    fn collect(&mut self, exited: &mut Vec<u32>) -> Result<()> {
        exited.append(&mut self.gone);
        let mut fds: Vec<libc::pollfd> = self
            .pidfds
            .keys()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: a non-blocking poll of descriptors we own.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        for fd in fds.iter().filter(|fd| fd.revents != 0) {
            if let Some((pid, _)) = self.pidfds.remove(&fd.fd) {
                exited.push(pid);
            }
        }
        Ok(())
    }
}

/// The floor under liveness: its own eBPF object, exit program only, with the tracked
/// processes written into its maps as the daemon writes them, and its ring buffer read by
/// the watcher loop: `poll`, the records, one `write` per exit. No durable step, no socket,
/// no runtime: what any daemon built on this object could at best deliver on this machine.
struct EbpfFloor {
    /// Holds the attached program.
    _ebpf: Ebpf,
    tracked: AyaHashMap<MapData, u32, u64>,
    members: AyaHashMap<MapData, u32, Member>,
    ring: RingBuf<MapData>,
    buffer: Vec<u8>,
}

/// A members-map value, as aya writes it.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Member(MemberRecord);

// SAFETY: MemberRecord is repr(C), all integers, no padding (its layout is pinned by
// liveness-common's tests against the C header).
unsafe impl aya::Pod for Member {}

impl EbpfFloor {
    fn open() -> Result<EbpfFloor> {
        let btf = Btf::from_sys_fs().context("reading the kernel's BTF")?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .load(OBJECT)
            .context("loading liveness.bpf.o")?;
        let program: &mut BtfTracePoint = ebpf
            .program_mut(EXIT_PROGRAM_NAME)
            .with_context(|| format!("no {EXIT_PROGRAM_NAME} in liveness.bpf.o"))?
            .try_into()?;
        program.load("sched_process_exit", &btf)?;
        program.attach()?;
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("no map {name} in liveness.bpf.o"))
        };
        let (tracked, members, ring) = (take(MAP_TRACKED)?, take(MAP_MEMBERS)?, take(MAP_EXITS)?);
        Ok(EbpfFloor {
            tracked: AyaHashMap::try_from(tracked)?,
            members: AyaHashMap::try_from(members)?,
            ring: RingBuf::try_from(ring)?,
            _ebpf: ebpf,
            buffer: Vec::with_capacity(512),
        })
    }
}

impl Watch for EbpfFloor {
    fn track(&mut self, pid: u32) -> Result<()> {
        let start_ticks = procs::start_ticks(pid, &mut self.buffer)
            .with_context(|| format!("process {pid} is gone before it was tracked"))?;
        self.tracked.insert(pid, start_ticks, 0)?;
        // The exit program looks every exit up in the members map first: a tracked process
        // is the root of its own tree there.
        let root = MemberRecord {
            start_ticks,
            root_start_ticks: start_ticks,
            root_tgid: pid,
            ..MemberRecord::default()
        };
        self.members.insert(pid, Member(root), 0)?;
        Ok(())
    }

    fn fds(&self) -> Vec<RawFd> {
        vec![self.ring.as_raw_fd()]
    }

    fn timeout(&self) -> Option<Duration> {
        None
    }

    fn collect(&mut self, exited: &mut Vec<u32>) -> Result<()> {
        while let Some(item) = self.ring.next() {
            let record = ExitRecord::from_bytes(&item).context("a short ring-buffer record")?;
            exited.push(record.tgid);
        }
        Ok(())
    }
}

/// Reads `/proc/<pid>/stat` of every tracked process each interval: gone, a zombie, or
/// a new start time means it exited (init here reaps orphans lazily, so zombies count).
#[derive(Debug)]
struct Poller {
    interval: Duration,
    next_sweep: Instant,
    tracked: Vec<(u32, u64)>,
    buffer: Vec<u8>,
}

impl Poller {
    fn every(interval: Duration) -> Poller {
        Poller {
            interval,
            next_sweep: Instant::now() + interval,
            tracked: Vec::new(),
            buffer: Vec::with_capacity(512),
        }
    }
}

impl Watch for Poller {
    fn track(&mut self, pid: u32) -> Result<()> {
        // Already gone: start time 0 never matches, so the next sweep reports it.
        let start = procs::start_ticks(pid, &mut self.buffer).unwrap_or(0);
        self.tracked.push((pid, start));
        Ok(())
    }

    fn fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.next_sweep.saturating_duration_since(Instant::now()))
    }

    fn collect(&mut self, exited: &mut Vec<u32>) -> Result<()> {
        let now = Instant::now();
        if now < self.next_sweep {
            return Ok(());
        }
        // Sweeps keep their phase; one that overran starts the next interval from now.
        self.next_sweep = (self.next_sweep + self.interval).max(now);
        let buffer = &mut self.buffer;
        self.tracked.retain(|&(pid, start)| {
            let alive = matches!(procs::read_stat(pid, buffer),
                Some(stat) if stat.start_ticks == start && !stat.has_exited());
            if !alive {
                exited.push(pid);
            }
            alive
        });
        Ok(())
    }
}

/// The kernel's process events connector (`CONFIG_PROC_EVENTS`): a netlink socket that
/// receives a message for every fork, exec and exit of the machine.
#[derive(Debug)]
struct ProcConnector {
    socket: OwnedFd,
}

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// `struct nlmsghdr` (16 bytes) then `struct cn_msg` (20 bytes) precede the payload.
const HEADERS: usize = 16 + 20;

impl ProcConnector {
    fn open() -> Result<ProcConnector> {
        // SAFETY: socket(2) returns a new descriptor or -1.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_CONNECTOR,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("netlink connector socket");
        }
        // SAFETY: the descriptor is fresh and ours.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // Every fork, exec and exit of the machine arrives here: a large buffer (as root,
        // past rmem_max) keeps a burst from overflowing it while this process waits for a CPU.
        let size: libc::c_int = 8 << 20;
        for option in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            // SAFETY: setting an int option of our socket from a live value.
            let set = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    option,
                    (&raw const size).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if set == 0 {
                break;
            }
        }
        // SAFETY: sockaddr_nl is plain data; zero is a valid start.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = CN_IDX_PROC;
        // SAFETY: getpid has no preconditions.
        address.nl_pid = unsafe { libc::getpid() } as u32;
        // SAFETY: binding our socket to a live, correctly sized address.
        if unsafe {
            libc::bind(
                fd,
                (&raw const address).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error())
                .context("binding the proc connector (needs root and CONFIG_PROC_EVENTS)");
        }
        let mut message = [0u8; HEADERS + 4];
        let length = message.len() as u32;
        message[0..4].copy_from_slice(&length.to_ne_bytes());
        message[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        message[12..16].copy_from_slice(&address.nl_pid.to_ne_bytes());
        message[16..20].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
        message[20..24].copy_from_slice(&CN_VAL_PROC.to_ne_bytes());
        message[32..34].copy_from_slice(&4u16.to_ne_bytes());
        message[36..40].copy_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        // SAFETY: sending from a live buffer on our socket.
        if unsafe { libc::send(fd, message.as_ptr().cast(), message.len(), 0) } < 0 {
            return Err(std::io::Error::last_os_error()).context("PROC_CN_MCAST_LISTEN");
        }
        Ok(ProcConnector { socket })
    }
}

impl Watch for ProcConnector {
    fn track(&mut self, _pid: u32) -> Result<()> {
        Ok(())
    }

    fn fds(&self) -> Vec<RawFd> {
        vec![self.socket.as_raw_fd()]
    }

    fn timeout(&self) -> Option<Duration> {
        None
    }

    fn collect(&mut self, exited: &mut Vec<u32>) -> Result<()> {
        let mut message = [0u8; 1024];
        loop {
            // SAFETY: receiving into a live buffer from our non-blocking socket.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    message.as_mut_ptr().cast(),
                    message.len(),
                    0,
                )
            };
            if n < 0 {
                let error = std::io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(()),
                    Some(libc::EINTR) => continue,
                    // The kernel dropped messages: those exits are lost, as they are for any
                    // listener that falls behind; say so and go on.
                    Some(libc::ENOBUFS) => {
                        eprintln!("proc connector: the socket overflowed, exits were lost");
                        continue;
                    }
                    _ => return Err(error).context("recv on the proc connector"),
                }
            }
            // struct proc_event: what, cpu, timestamp_ns, then for an exit: process_pid,
            // process_tgid. Only the whole process's end counts (pid == tgid).
            let event = &message[HEADERS..n as usize];
            let word = |at: usize| {
                event
                    .get(at..at + 4)
                    .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
            };
            if word(0) == Some(PROC_EVENT_EXIT)
                && let (Some(pid), Some(tgid)) = (word(16), word(20))
                && pid == tgid
            {
                exited.push(tgid);
            }
        }
    }
}
