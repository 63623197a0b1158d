//! Processes that die in one particular way, or cost a known amount, for the tests of an
//! ending's cause and usage. Each waits for its stdin to end (or for a line) before it
//! does what it is for, so a test tracks it first.
//!
//! - `abort`: calls abort(3) at EOF: SIGABRT it sends itself.
//! - `segv`: writes through a null pointer at EOF: SIGSEGV from the kernel.
//! - `cpu-limit`: at EOF sets RLIMIT_CPU's soft limit to 1 s and spins: SIGXCPU.
//! - `hog`: at EOF allocates and touches memory, 1 MiB at a time, until it is killed.
//! - `burn MS`: spins for MS ms of its own CPU time, prints `burnt`, exits 0 at EOF.
//! - `burn-tree N MS`: at a line forks N children that each spin MS ms and exit, waits
//!   for them, prints `burnt`, exits 0 at EOF.
//! - `sender`: for each line `PID SIG` forks a child that sends SIG to PID and exits, waits
//!   for it and prints its pid: the sender is a new process of this one's tree. With a line
//!   `PID SIG CODE` the child sends it with `rt_sigqueueinfo` and that `si_code`; with
//!   `PID SIG tgkill`, to the thread PID alone.
//! - `blocked SIG`: blocks SIG, prints `blocked`, and unblocks it at EOF.
//! - `abort-dump DIR MB`: holds MB MiB, forks a watcher, and at EOF calls abort(3) with
//!   core dumps on (into DIR); the watcher sends it SIGKILL while it dumps core, prints
//!   its own pid.
//! - `hog-shared`: at a line clones a process that shares its memory (`CLONE_VM`, not a
//!   thread) and only sleeps, prints its pid, and at EOF hogs memory as `hog` does: the OOM
//!   killer kills both.
//! - `cpu-hard`: at EOF ignores SIGXCPU, sets both RLIMIT_CPU limits to 1 s and spins:
//!   the hard limit's SIGKILL.
//! - `pdeath SIG`: forks a child that asks for SIG at its parent's death and prints its
//!   pid; at a line this process exits.
//! - `orphan`: forks a child in a process group of its own, prints its pid, waits until it
//!   has stopped itself; at a line this process exits, orphaning the stopped group.
//! - `hangup`: opens a pseudo-terminal and forks a session leader whose controlling
//!   terminal is its slave side, prints the leader's pid; at a line closes the master side
//!   (a hang-up: the kernel sends the leader SIGHUP), waits for the leader and exits.
use std::io::{BufRead, Read, Write};
use std::time::Duration;

fn wait_for_eof() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().lock().read_to_end(&mut sink);
}

fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn fail(why: &str) -> ! {
    eprintln!("dying: {why}: {}", std::io::Error::last_os_error());
    // SAFETY: _exit ends the process without unwinding.
    unsafe { libc::_exit(100) }
}

/// The calling thread's CPU time.
fn cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Spins until this thread has used `cpu` of CPU time.
fn burn(cpu: Duration) {
    let until = cpu_time() + cpu;
    let mut x = 0u64;
    while cpu_time() < until {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
}

fn millis(args: &[String], i: usize) -> Duration {
    Duration::from_millis(
        args.get(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| fail("expected a number of milliseconds")),
    )
}

/// Forks; the child runs `child` and exits 0.
fn fork(child: impl FnOnce()) -> libc::pid_t {
    // SAFETY: this program is single-threaded; the child runs plain code and exits.
    match unsafe { libc::fork() } {
        -1 => fail("fork"),
        0 => {
            child();
            // SAFETY: as in fail.
            unsafe { libc::_exit(0) }
        }
        pid => pid,
    }
}

/// Sends `signal` to `pid` with a siginfo of this `code`, as `sigqueue` would with another.
fn queue(pid: libc::pid_t, signal: i32, code: i32) {
    // SAFETY: a zeroed siginfo is valid; its first three ints are signo, errno and code.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = signal;
    info.si_code = code;
    // SAFETY: passes a live siginfo to the kernel, which copies it.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_rt_sigqueueinfo,
            pid,
            signal,
            &info as *const libc::siginfo_t,
        )
    };
    if sent != 0 {
        fail("rt_sigqueueinfo")
    }
}

/// Sends `pid` SIGKILL once it has dequeued its fatal signal (`PF_SIGNALED` in the flags
/// of `/proc/PID/stat`), while it dumps core; returns when it is gone.
fn kill_while_dumping(pid: u32) {
    const PF_SIGNALED: u64 = 0x400;
    let path = format!("/proc/{pid}/stat");
    while let Ok(stat) = std::fs::read_to_string(&path) {
        // The flags are the sixth field after the command's closing parenthesis.
        let flags = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(6))
            .and_then(|flags| flags.parse::<u64>().ok())
            .unwrap_or(0);
        if flags & PF_SIGNALED != 0 {
            // SAFETY: signals the parent this watcher was forked to kill.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            say(std::process::id());
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Allocates and touches memory, 1 MiB at a time, until it is killed.
fn hog() -> ! {
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        // Touched, so every page is resident.
        held.push(vec![1u8; 1 << 20]);
        std::hint::black_box(&held);
    }
}

/// A process that shares this one's memory and only sleeps: its pid.
fn clone_sleeper() -> libc::pid_t {
    extern "C" fn sleep_forever(_: *mut libc::c_void) -> libc::c_int {
        loop {
            // SAFETY: waits for a signal; touches nothing of the shared memory.
            unsafe { libc::pause() };
        }
    }
    // Its stack, in the shared memory: leaked, as the process outlives this call.
    let stack: &'static mut [u8] = Box::leak(vec![0u8; 64 << 10].into_boxed_slice());
    // SAFETY: the stack is valid for the child's life and the child runs only pause().
    let pid = unsafe {
        libc::clone(
            sleep_forever,
            stack.as_mut_ptr().add(stack.len()).cast(),
            libc::CLONE_VM | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    };
    if pid < 0 {
        fail("clone")
    }
    pid
}

/// Exits at the next line of stdin, leaving its children behind.
fn exit_at_a_line() -> ! {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    // SAFETY: as in fail.
    unsafe { libc::_exit(0) }
}

fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

fn hangup() -> ! {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors; the other arguments may be null.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if opened != 0 {
        fail("openpty");
    }
    // SAFETY: ptsname returns the slave's path in a static buffer, copied at once.
    let path = unsafe { std::ffi::CStr::from_ptr(libc::ptsname(master)) }.to_owned();
    let leader = fork(|| {
        // SAFETY: plain syscalls in the single-threaded child. A session leader without a
        // controlling terminal acquires the first terminal it opens.
        unsafe {
            libc::close(master);
            libc::close(slave);
            if libc::setsid() < 0 {
                fail("setsid");
            }
            if libc::open(path.as_ptr(), libc::O_RDWR) < 0 {
                fail("open the pty");
            }
        }
        say(std::process::id());
        loop {
            // SAFETY: waits for a signal.
            unsafe { libc::pause() };
        }
    });
    // SAFETY: our copy of the slave side; the leader opened its own.
    unsafe { libc::close(slave) };
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    // SAFETY: closing the master side hangs the terminal up.
    unsafe { libc::close(master) };
    reap(leader);
    // SAFETY: as in fail.
    unsafe { libc::_exit(0) }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Deaths that dump core by default leave no core file behind (unless a mode raises the
    // soft limit again, up to the hard one).
    let mut core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and lowers this process's own limit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_CORE, &mut core);
        core.rlim_cur = 0;
        libc::setrlimit(libc::RLIMIT_CORE, &core);
    }
    // The deaths asked for are the default actions: a run under `nohup`, or started in the
    // background by a shell, would hand some of these signals on ignored.
    for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
        // SAFETY: sets this process's disposition of a catchable signal to its default.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    match args.first().map(String::as_str) {
        Some("abort") => {
            wait_for_eof();
            std::process::abort()
        }
        Some("segv") => {
            wait_for_eof();
            // SAFETY: it is not: the write faults, which is the point.
            unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u64>(), 1) };
        }
        Some("cpu-limit") => {
            wait_for_eof();
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: reads and then lowers this process's own limit.
            unsafe {
                libc::getrlimit(libc::RLIMIT_CPU, &mut limit);
                limit.rlim_cur = 1;
                libc::setrlimit(libc::RLIMIT_CPU, &limit);
            }
            loop {
                burn(Duration::from_secs(1));
            }
        }
        Some("blocked") => {
            let signal: i32 = args
                .get(1)
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| fail("expected a signal number"));
            // SAFETY: a zeroed sigset_t is valid, and emptied before use.
            let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: a set of this one signal, blocked and later unblocked in this thread.
            unsafe {
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, signal);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            say("blocked");
            wait_for_eof();
            // SAFETY: as above: what is pending is delivered now.
            unsafe { libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        }
        Some("hog-shared") => {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            say(clone_sleeper());
            wait_for_eof();
            hog()
        }
        Some("hog") => {
            wait_for_eof();
            hog()
        }
        Some("burn") => {
            burn(millis(&args, 1));
            say("burnt");
            wait_for_eof();
        }
        Some("burn-tree") => {
            let count: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
            let cpu = millis(&args, 2);
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            let children: Vec<_> = (0..count).map(|_| fork(|| burn(cpu))).collect();
            children.into_iter().for_each(reap);
            say("burnt");
            wait_for_eof();
        }
        Some("sender") => {
            for line in std::io::stdin().lock().lines() {
                let line = line.unwrap_or_default();
                let numbers: Vec<i32> = line
                    .split_whitespace()
                    .filter_map(|word| word.parse().ok())
                    .collect();
                let (pid, signal, code) = match numbers[..] {
                    [pid, signal] => (pid, signal, None),
                    [pid, signal, code] => (pid, signal, Some(code)),
                    _ => fail("expected a line `PID SIG [CODE]`"),
                };
                let to_thread = line.ends_with("tgkill");
                let child = fork(|| match code {
                    // SAFETY: sends a signal; the test chose the target.
                    None if to_thread && unsafe { libc::tgkill(pid, pid, signal) } != 0 => {
                        fail("tgkill")
                    }
                    // SAFETY: as above.
                    None if !to_thread && unsafe { libc::kill(pid, signal) } != 0 => fail("kill"),
                    None => {}
                    Some(code) => queue(pid, signal, code),
                });
                reap(child);
                say(child);
            }
        }
        Some("hangup") => hangup(),
        Some("abort-dump") => {
            let dir = args.get(1).unwrap_or_else(|| fail("expected a directory"));
            let size = args
                .get(2)
                .and_then(|a| a.parse::<usize>().ok())
                .unwrap_or_else(|| fail("expected a size in MiB"));
            core.rlim_cur = core.rlim_max;
            if std::env::set_current_dir(dir).is_err()
                // SAFETY: raises this process's own soft limit to its hard one.
                || unsafe { libc::setrlimit(libc::RLIMIT_CORE, &core) } != 0
            {
                fail("core dumps into the directory")
            }
            // Touched, so the dump has it to write.
            let held = vec![1u8; size << 20];
            std::hint::black_box(&held);
            let dumping = std::process::id();
            fork(|| kill_while_dumping(dumping));
            wait_for_eof();
            std::process::abort()
        }
        Some("cpu-hard") => {
            wait_for_eof();
            let both = libc::rlimit {
                rlim_cur: 1,
                rlim_max: 1,
            };
            // SAFETY: sets this process's own disposition and lowers its own limit.
            unsafe {
                libc::signal(libc::SIGXCPU, libc::SIG_IGN);
                libc::setrlimit(libc::RLIMIT_CPU, &both);
            }
            loop {
                burn(Duration::from_secs(1));
            }
        }
        Some("pdeath") => {
            let signal: i32 = args
                .get(1)
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| fail("expected a signal number"));
            let parent = std::process::id() as libc::pid_t;
            fork(|| {
                // SAFETY: plain syscalls in the single-threaded child.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong);
                    // The parent may have died before the request: then it never comes.
                    if libc::getppid() != parent {
                        fail("the parent died first");
                    }
                }
                say(std::process::id());
                loop {
                    // SAFETY: waits for a signal.
                    unsafe { libc::pause() };
                }
            });
            exit_at_a_line()
        }
        Some("orphan") => {
            let child = fork(|| {
                // SAFETY: plain syscalls in the single-threaded child.
                unsafe {
                    libc::setpgid(0, 0);
                    libc::raise(libc::SIGSTOP);
                }
                // Continued without SIGHUP would be a test's failure: it waits.
                loop {
                    // SAFETY: waits for a signal.
                    unsafe { libc::pause() };
                }
            });
            let mut status = 0;
            // SAFETY: waits for our own child to stop.
            unsafe { libc::waitpid(child, &mut status, libc::WUNTRACED) };
            say(child);
            exit_at_a_line()
        }
        _ => {
            eprintln!(
                "usage: dying abort|segv|cpu-limit|cpu-hard|hog|hog-shared|blocked SIG|burn MS|burn-tree N MS|sender|\
                 hangup|pdeath SIG|orphan"
            );
            std::process::exit(100)
        }
    }
}
