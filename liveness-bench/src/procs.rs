//! Processes the benchmark tracks, made with raw fork(2).
//!
//! The harness is multi-threaded, so a forked child only makes async-signal-safe calls
//! (fork, setpgid, read, write, clock_gettime, pause, waitpid, close_range, _exit) and
//! never allocates.

use anyhow::{Context, Result, bail};
use integration_tests::Fingerprint;
use liveness_proc::identity::Stat;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// CLOCK_MONOTONIC in nanoseconds, comparable across processes.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// In a forked child: closes every descriptor except `keep`, so tracked processes hold no
/// socket or pipe end of the harness (they would keep it open for their whole life).
fn close_all_but(keep: &mut [RawFd]) {
    keep.sort_unstable();
    let mut from: libc::c_uint = 0;
    for &fd in keep.iter() {
        let fd = fd as libc::c_uint;
        if fd > from {
            // SAFETY: close_range only closes descriptors; errors are harmless here.
            unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0) };
        }
        from = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) };
}

fn write_all_raw(fd: RawFd, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: writing from a live buffer.
        let n = unsafe { libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        done += n as usize;
    }
    true
}

fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process without running the parent's destructors.
    unsafe { libc::_exit(code) }
}

/// A batch of owners that are not the harness's children (double fork). Each waits for
/// one byte on the shared `go` pipe, then takes CLOCK_MONOTONIC, writes `(pid, ns)` to the
/// report pipe (16 bytes: atomic) and calls `_exit(0)`. Dropping the batch closes `go`:
/// owners still waiting see EOF and exit.
#[derive(Debug)]
pub struct Owners {
    pub pids: Vec<u32>,
    go: File,
    report: File,
}

/// One owner's report: who exited and when (CLOCK_MONOTONIC ns, just before `_exit`).
#[derive(Debug, Clone, Copy)]
pub struct ExitReport {
    pub pid: u32,
    pub exit_ns: u64,
}

impl Owners {
    pub fn spawn(count: usize) -> Result<Owners> {
        let (go_read, go_write) = pipe()?;
        let (report_read, report_write) = pipe()?;
        let (go_fd, report_fd) = (go_read.as_raw_fd(), report_write.as_raw_fd());
        for _ in 0..count {
            // The owner only calls async-signal-safe functions (see the module doc).
            integration_tests::spawn_orphan(|| owner_main(go_fd, report_fd))
                .context("forking an owner")?;
        }
        drop((go_read, report_write));
        let mut owners = Owners {
            pids: Vec::with_capacity(count),
            go: File::from(go_write),
            report: File::from(report_read),
        };
        for _ in 0..count {
            let hello = owners.next_report()?;
            owners.pids.push(hello.pid);
        }
        Ok(owners)
    }

    /// Lets `count` owners (whichever read first) exit.
    pub fn release(&mut self, count: usize) -> Result<()> {
        self.go
            .write_all(&vec![b'x'; count])
            .context("writing to the owners' go pipe")
    }

    /// The next record on the report pipe (blocking).
    pub fn next_report(&mut self) -> Result<ExitReport> {
        let mut record = [0u8; 16];
        self.report
            .read_exact(&mut record)
            .context("reading an owner's report")?;
        Ok(ExitReport {
            pid: u64::from_le_bytes(record[..8].try_into().unwrap()) as u32,
            exit_ns: u64::from_le_bytes(record[8..].try_into().unwrap()),
        })
    }
}

fn owner_main(go: RawFd, report: RawFd) -> ! {
    close_all_but(&mut [go, report]);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    let mut hello = [0u8; 16];
    hello[..8].copy_from_slice(&pid.to_le_bytes());
    if !write_all_raw(report, &hello) {
        exit_now(2);
    }
    let mut byte = 0u8;
    loop {
        // SAFETY: reading one byte into a local.
        match unsafe { libc::read(go, (&raw mut byte).cast(), 1) } {
            1 => break,
            0 => exit_now(3),
            _ if std::io::Error::last_os_error().kind() == ErrorKind::Interrupted => {}
            _ => exit_now(4),
        }
    }
    let now = monotonic_ns();
    let mut record = [0u8; 16];
    record[..8].copy_from_slice(&pid.to_le_bytes());
    record[8..].copy_from_slice(&now.to_le_bytes());
    write_all_raw(report, &record);
    exit_now(0)
}

/// What a [`Tree`]'s owner forks: `before` children before it reports its pid (the first
/// `stubborn` of them ignore SIGTERM), and on [`Tree::grow`] first `orphans` that ignore
/// SIGTERM, forked by a child of the owner that then exits (so they are reparented: members
/// of its tree that no longer descend from the living owner), then `long_lived` children
/// that stay and `short_lived` ones that exit at once, interleaved.
#[derive(Debug, Clone, Copy, Default)]
pub struct TreeShape {
    pub before: usize,
    pub stubborn: usize,
    pub orphans: usize,
    pub long_lived: usize,
    pub short_lived: usize,
}

/// One session's process tree: an owner that is not the harness's child, and its children.
/// The long-lived children `pause()`. Dropping it kills whatever is left.
#[derive(Debug)]
pub struct Tree {
    pub owner: Fingerprint,
    /// The owner's living children.
    pub children: Vec<Fingerprint>,
    /// The orphans of its shape, once it grew.
    pub orphans: Vec<Fingerprint>,
    /// How many orphans the owner reports first on [`Tree::grow`].
    shape_orphans: usize,
    /// Writing a byte makes the owner fork the rest of its shape; closing it, nothing more.
    go: Option<File>,
    /// The owner reports its pid, then the pids of its short-lived children, here.
    report: File,
}

impl Tree {
    pub fn spawn(shape: TreeShape) -> Result<Tree> {
        let (report_read, report_write) = pipe()?;
        let (go_read, go_write) = pipe()?;
        let fds = [report_write.as_raw_fd(), go_read.as_raw_fd()];
        // The owner only calls async-signal-safe functions (see the module doc).
        integration_tests::spawn_orphan(|| tree_owner_main(shape, fds[0], fds[1]))
            .context("forking a tree's owner")?;
        drop((report_write, go_read));
        let mut report = File::from(report_read);
        let mut pid = [0u8; 8];
        report
            .read_exact(&mut pid)
            .context("reading the tree owner's pid")?;
        let owner = Fingerprint::of(u64::from_le_bytes(pid) as u32);
        let mut tree = Tree {
            children: Vec::new(),
            orphans: Vec::new(),
            shape_orphans: shape.orphans,
            owner,
            go: Some(File::from(go_write)),
            report,
        };
        tree.children = tree.living_children()?;
        Ok(tree)
    }

    /// Makes the owner fork its orphans and its long- and short-lived children; returns
    /// the short-lived ones' pids once all of them have exited and been reaped.
    pub fn grow(&mut self) -> Result<Vec<u32>> {
        let mut go = self.go.take().context("the tree already grew")?;
        go.write_all(b"x")
            .context("telling the tree's owner to fork")?;
        let mut bytes = Vec::new();
        self.report
            .read_to_end(&mut bytes)
            .context("reading the short-lived children's pids")?;
        let mut short: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        if short.len() < self.shape_orphans || short.contains(&0) {
            bail!("the tree's owner failed to fork (pid_max, threads-max or memory)");
        }
        let orphans: Vec<u32> = short.drain(..self.shape_orphans).collect();
        self.orphans = orphans.into_iter().map(Fingerprint::of).collect();
        self.children = self.living_children()?;
        Ok(short)
    }

    fn living_children(&self) -> Result<Vec<Fingerprint>> {
        let owner = self.owner.pid;
        let listed = std::fs::read_to_string(format!("/proc/{owner}/task/{owner}/children"))
            .context("reading the tree owner's children")?;
        Ok(listed
            .split_ascii_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .map(Fingerprint::of)
            .collect())
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.owner.kill();
        for child in self.children.iter().chain(&self.orphans) {
            child.kill();
        }
    }
}

/// Forks a child that forks `count` sleepers ignoring SIGTERM, writes their pids (u32 LE,
/// 0 if a fork failed) to `report` and exits; returns once it is reaped, false if it could
/// not be forked.
fn fork_orphans(count: usize, report: RawFd, go: RawFd) -> bool {
    // SAFETY: fork in a process that makes only async-signal-safe calls.
    match unsafe { libc::fork() } {
        0 => {
            let mut buffer = [0u8; 4096];
            let mut filled = 0;
            for _ in 0..count {
                let pid = fork_sleeper(true, &[report, go]).max(0);
                buffer[filled..filled + 4].copy_from_slice(&(pid as u32).to_le_bytes());
                filled += 4;
                if filled == buffer.len() {
                    write_all_raw(report, &buffer);
                    filled = 0;
                }
            }
            write_all_raw(report, &buffer[..filled]);
            exit_now(0)
        }
        -1 => false,
        child => {
            // SAFETY: reaping our own child, so that its children are orphans at once.
            unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
            true
        }
    }
}

/// Forks a child that pauses for ever, ignoring SIGTERM if `stubborn`; -1 if fork failed.
fn fork_sleeper(stubborn: bool, close: &[RawFd]) -> libc::pid_t {
    // Ignored across the fork, so that the child ignores SIGTERM from its first instant: set
    // in the child, a SIGTERM sent as soon as its pid is reported could come first.
    // SAFETY: setting this single-threaded process's disposition of SIGTERM.
    let previous = stubborn.then(|| unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) });
    // SAFETY: fork in a process that makes only async-signal-safe calls.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        for &fd in close {
            // SAFETY: closing the owner's pipes, which the child does not use.
            unsafe { libc::close(fd) };
        }
        pause_forever()
    }
    if let Some(previous) = previous {
        // SAFETY: restoring the disposition saved above.
        unsafe { libc::signal(libc::SIGTERM, previous) };
    }
    pid
}

fn tree_owner_main(shape: TreeShape, report: RawFd, go: RawFd) -> ! {
    close_all_but(&mut [report, go]);
    for i in 0..shape.before {
        if fork_sleeper(i < shape.stubborn, &[report, go]) < 0 {
            exit_now(5);
        }
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    if !write_all_raw(report, &pid.to_le_bytes()) {
        exit_now(2);
    }
    let mut byte = 0u8;
    // SAFETY: reading one byte into a local; EOF (or an error) means nothing more to fork.
    if unsafe { libc::read(go, (&raw mut byte).cast(), 1) } == 1 {
        if shape.orphans > 0 && !fork_orphans(shape.orphans, report, go) {
            exit_now(5);
        }
        let total = shape.long_lived + shape.short_lived;
        let mut buffer = [0u8; 4096];
        let mut filled = 0;
        for i in 0..total {
            // Long-lived children spread evenly among the short-lived ones.
            let long = (i + 1) * shape.long_lived / total != i * shape.long_lived / total;
            if long {
                if fork_sleeper(false, &[report, go]) < 0 {
                    exit_now(5);
                }
                continue;
            }
            // SAFETY: as in fork_sleeper; the child exits at once.
            let child = match unsafe { libc::fork() } {
                0 => exit_now(0),
                -1 => 0,
                child => {
                    // SAFETY: reaping our own child, so that it leaves no zombie behind.
                    unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
                    child
                }
            };
            buffer[filled..filled + 4].copy_from_slice(&(child as u32).to_le_bytes());
            filled += 4;
            if filled == buffer.len() {
                write_all_raw(report, &buffer);
                filled = 0;
            }
            if child == 0 {
                break;
            }
        }
        write_all_raw(report, &buffer[..filled]);
    }
    // SAFETY: closing the pipes: the harness reads the report to its end.
    unsafe { libc::close(report) };
    // SAFETY: as above.
    unsafe { libc::close(go) };
    pause_forever()
}

fn pause_forever() -> ! {
    loop {
        // SAFETY: pause is async-signal-safe and takes no arguments.
        unsafe { libc::pause() };
    }
}

/// Many sleeping processes (`pause()`), forked by one small spawner process that is the
/// harness's child. They form process groups of `group_size`, so a burst can kill one group
/// (SIGKILL to the group) and leave the rest. Dropping kills them all.
///
/// The spawner ignores SIGCHLD, so the kernel reaps its children as they die, and it waits
/// on its stdin rather than in `waitpid`: a parent blocked in `waitpid(-1)` is woken by every
/// child's death and rescans its whole list of children each time, under `tasklist_lock`,
/// which the dying children need too. With 10,000 children that roughly doubled the time the
/// kernel took to kill a burst (measured here: 0.45 s to 1 s), a cost of the harness, not
/// of what it measures.
#[derive(Debug)]
pub struct Sleepers {
    spawner: std::process::Child,
    /// Closing it tells the spawner to wait for its (killed) children and exit.
    hold: Option<std::process::ChildStdin>,
    /// Every sleeper, in process groups of `group_size` consecutive entries.
    pub pids: Vec<u32>,
    pub group_size: usize,
    killed: Vec<bool>,
}

impl Sleepers {
    /// The spawner is this binary re-executed (see [`SPAWNER_ARG`]): forked straight from the
    /// harness, every sleeper would copy the harness's mappings and page tables, which at
    /// 100k processes is more memory than the machine has.
    pub fn spawn(count: usize, group_size: usize) -> Result<Sleepers> {
        let (read, write) = pipe()?;
        let mut spawner = std::process::Command::new(std::env::current_exe()?)
            .args([SPAWNER_ARG, &count.to_string(), &group_size.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::from(write))
            .spawn()
            .context("starting the sleeper spawner")?;
        let mut sleepers = Sleepers {
            hold: spawner.stdin.take(),
            spawner,
            pids: Vec::with_capacity(count),
            group_size,
            killed: Vec::new(),
        };
        let mut bytes = Vec::with_capacity(count * 4);
        File::from(read)
            .read_to_end(&mut bytes)
            .context("reading the spawner's PIDs")?;
        sleepers.pids.extend(
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap())),
        );
        sleepers.killed = vec![false; sleepers.groups()];
        if sleepers.pids.len() != count || sleepers.pids.contains(&0) {
            let made = sleepers.pids.iter().take_while(|&&p| p != 0).count();
            bail!(
                "the spawner made only {made} of {count} sleeping processes (fork failed: \
                 pid_max, threads-max or memory)"
            );
        }
        Ok(sleepers)
    }

    pub fn groups(&self) -> usize {
        self.pids.len().div_ceil(self.group_size)
    }

    pub fn group(&self, index: usize) -> &[u32] {
        let start = index * self.group_size;
        &self.pids[start..(start + self.group_size).min(self.pids.len())]
    }

    /// SIGKILL to one process group: all its members die at once.
    pub fn kill_group(&mut self, index: usize) {
        let leader = self.group(index)[0] as libc::pid_t;
        // SAFETY: signalling a process group we created.
        unsafe { libc::kill(-leader, libc::SIGKILL) };
        self.killed[index] = true;
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for index in 0..self.groups() {
            if !self.killed[index] {
                self.kill_group(index);
            }
        }
        // The spawner exits once every sleeper is gone.
        self.hold = None;
        let _ = self.spawner.wait();
    }
}

/// First argument that makes this binary the sleeper spawner: `SPAWNER_ARG COUNT GROUP`,
/// writing each sleeper's PID (u32 LE, 0 if a fork failed) to stdout.
pub const SPAWNER_ARG: &str = "__spawn-sleepers";

pub fn spawner_main(count: usize, group_size: usize) -> ! {
    let (hold, report): (RawFd, RawFd) = (0, 1);
    close_all_but(&mut [hold, report]);
    // SAFETY: setting a signal disposition; children inherit it, which they never notice.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    let mut buffer = [0u8; 4096];
    let mut filled = 0;
    let mut leader: libc::pid_t = 0;
    for i in 0..count {
        if i % group_size == 0 {
            leader = 0;
        }
        // SAFETY: async-signal-safe calls only, in this process and in the sleeper.
        let pid = match unsafe { libc::fork() } {
            0 => {
                // Holding the pipes would keep the harness from ever seeing their ends.
                // SAFETY: close is async-signal-safe; both descriptors are this child's
                // inherited copies, which nothing else in it uses.
                unsafe { libc::close(report) };
                // SAFETY: as above.
                unsafe { libc::close(hold) };
                // SAFETY: setpgid is async-signal-safe and touches no memory of ours.
                unsafe { libc::setpgid(0, leader) };
                pause_forever()
            }
            -1 => 0,
            pid => {
                // Set from both sides so a kill of the group never races the child.
                // SAFETY: setpgid on our own child's PID; no memory is passed.
                unsafe { libc::setpgid(pid, if leader == 0 { pid } else { leader }) };
                pid
            }
        };
        if leader == 0 {
            leader = pid;
        }
        buffer[filled..filled + 4].copy_from_slice(&(pid as u32).to_le_bytes());
        filled += 4;
        if filled == buffer.len() || i + 1 == count || pid == 0 {
            write_all_raw(report, &buffer[..filled]);
            filled = 0;
        }
        if pid == 0 {
            break;
        }
    }
    // SAFETY: closing our end tells the harness every PID is written.
    unsafe { libc::close(report) };
    // errno is meaningful only after a call returned -1.
    let interrupted = || std::io::Error::last_os_error().kind() == ErrorKind::Interrupted;
    let mut byte = 0u8;
    loop {
        // SAFETY: reading into a local until the harness closes the pipe.
        match unsafe { libc::read(hold, (&raw mut byte).cast(), 1) } {
            n if n > 0 => {}
            -1 if interrupted() => {}
            _ => break,
        }
    }
    // With SIGCHLD ignored, wait blocks until every child is gone, then fails (ECHILD).
    // SAFETY: waiting for our own children.
    while unsafe { libc::wait(std::ptr::null_mut()) } >= 0 || interrupted() {}
    exit_now(0)
}

/// Raises `kernel.pid_max` for the benchmark and restores the old value when dropped.
#[derive(Debug)]
pub struct PidMax {
    original: Option<u64>,
}

const PID_MAX: &str = "/proc/sys/kernel/pid_max";

pub fn read_sysctl(path: &str) -> Result<u64> {
    std::fs::read_to_string(path)
        .with_context(|| format!("reading {path}"))?
        .trim()
        .parse()
        .with_context(|| format!("parsing {path}"))
}

impl PidMax {
    /// Makes room for `needed` more processes than are running now.
    pub fn ensure(needed: u64) -> Result<PidMax> {
        let current = read_sysctl(PID_MAX)?;
        let running = std::fs::read_dir("/proc")?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .count() as u64;
        // Headroom: PIDs are allocated cyclically and the latency runs keep forking.
        let wanted = (running + needed) * 2 + 10_000;
        if wanted <= current {
            return Ok(PidMax { original: None });
        }
        let raised = wanted.clamp(current, 4_194_304);
        std::fs::write(PID_MAX, raised.to_string())
            .with_context(|| format!("raising {PID_MAX} to {raised} (needs root)"))?;
        eprintln!("bench: raised kernel.pid_max {current} -> {raised} (restored at the end)");
        Ok(PidMax {
            original: Some(current),
        })
    }
}

impl Drop for PidMax {
    fn drop(&mut self) {
        if let Some(original) = self.original {
            match std::fs::write(PID_MAX, original.to_string()) {
                Ok(()) => eprintln!("bench: restored kernel.pid_max to {original}"),
                Err(e) => eprintln!("bench: cannot restore kernel.pid_max to {original}: {e}"),
            }
        }
    }
}

/// utime + stime of a process, in clock ticks (USER_HZ = 100).
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    Ok(integration_tests::proc_root().stat(pid)?.cpu_ticks())
}

/// The CPU time of a whole process (every thread, those that ended too), in nanoseconds:
/// its process CPU-time clock, which the kernel keeps exactly, where `/proc/<pid>/stat`
/// gives it in 10 ms ticks.
pub fn cpu_ns(pid: u32) -> Result<u64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: writes the clock id into a local.
    let found = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) };
    if found != 0 {
        return Err(std::io::Error::from_raw_os_error(found))
            .with_context(|| format!("the CPU clock of process {pid}"));
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("reading the CPU clock of process {pid}"));
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// VmRSS of a process in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_ascii_whitespace().next())
        .context("no VmRSS")?
        .parse()?;
    Ok(kb * 1024)
}

/// Start time (field 22 of /proc/<pid>/stat), read into a reused buffer: the work a
/// polling tool does per owner and per sweep.
pub fn start_ticks(pid: u32, buffer: &mut Vec<u8>) -> Option<u64> {
    read_stat(pid, buffer).map(|stat| stat.start_ticks)
}

/// `/proc/<pid>/stat` read into a reused buffer, parsed by the daemon's parser.
pub fn read_stat(pid: u32, buffer: &mut Vec<u8>) -> Option<Stat> {
    buffer.clear();
    let mut file = File::open(format!("/proc/{pid}/stat")).ok()?;
    file.read_to_end(buffer).ok()?;
    Stat::parse(buffer).ok()
}

/// Forks, execs and waits for `/bin/true` `count` times over two worker threads: exits
/// that nobody tracks. Returns the wall time in milliseconds.
pub fn storm(count: usize) -> Result<f64> {
    let started = std::time::Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                scope.spawn(move || -> Result<()> {
                    for _ in (w..count).step_by(2) {
                        let status = std::process::Command::new("/bin/true")
                            .stdin(std::process::Stdio::null())
                            .stdout(std::process::Stdio::null())
                            .status()?;
                        if !status.success() {
                            bail!("/bin/true failed: {status}");
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("storm worker panicked"))??;
        }
        Ok(())
    })?;
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree's orphans: forked on `grow` by a child that exits, so none descends from the
    /// owner; each ignores SIGTERM, and dropping the tree kills them.
    #[test]
    fn a_trees_orphans_are_reparented_and_ignore_sigterm() {
        let mut tree = Tree::spawn(TreeShape {
            orphans: 3,
            ..TreeShape::default()
        })
        .unwrap();
        assert_eq!(
            tree.grow().unwrap(),
            Vec::<u32>::new(),
            "no short-lived child"
        );
        assert!(tree.children.is_empty(), "{:?}", tree.children);
        assert_eq!(tree.orphans.len(), 3);
        for orphan in &tree.orphans {
            let stat = integration_tests::proc_root().stat(orphan.pid).unwrap();
            assert_ne!(stat.ppid, tree.owner.pid, "reparented away from the owner");
            // SAFETY: signalling a process of this test's own tree.
            unsafe { libc::kill(orphan.pid as libc::pid_t, libc::SIGTERM) };
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(tree.orphans.iter().all(Fingerprint::is_running));
        let orphans = tree.orphans.clone();
        drop(tree);
        assert!(integration_tests::eventually(
            std::time::Duration::from_secs(10),
            || !orphans.iter().any(Fingerprint::is_running)
        ));
    }
}
