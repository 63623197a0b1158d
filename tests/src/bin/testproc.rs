//! Processes with precisely controlled deaths, for the integration tests.
//!
//! `testproc orphan MODE [ARG]` double-forks, prints the grandchild's PID and exits, so the
//! grandchild is *not* the test's child (it is reparented to init or a subreaper). The
//! grandchild keeps stdin: every mode waits for EOF on stdin before it dies, so a test
//! decides the moment of death by closing the pipe's write end. Modes:
//!
//! - `exit CODE`: exit_group(CODE) at EOF.
//! - `signal SIG`: raise SIG at EOF (default action, e.g. SIGKILL).
//! - `threads CODE`: the main thread exits at once (SYS_exit); a second thread keeps the
//!   process alive and calls _exit(CODE) at EOF.
//! - `exec CODE`: at the first line on stdin, execve itself as `named execd CODE`.
//! - `thread-exec CODE`: like `exec`, but the execve is made by a non-leader thread.
//! - `named NAME CODE`: set comm to NAME, then `exit CODE`.
//! - `threads-wait N`: start N threads that never end, print their thread ids on one line,
//!   then exit_group(0) at EOF.
//!
//! `testproc family` is the owner of a process tree whose members are orphans, as a
//! session's are: it forks a middle process that forks the first member and prints its
//! PID, so that member is the owner's grandchild until the line `release` ends the middle
//! process (the reply is the middle's PID). Then each line forks a member that is
//! orphaned at once and prints its PID: `orphan`, `stubborn` (SIGTERM ignored), `as UID`
//! (runs as that user and group). Members live until killed; so does the owner.
//!
//! `testproc client SOCKET` is a raw protocol connection for tests that speak as another
//! user: it copies stdin's lines to the socket and the socket's lines to stdout, until
//! either side ends.
//!
//! `testproc tree N` forks N children that sleep until it dies (they die with it), prints
//! `ready` and lives until stdin ends: a big process tree that costs little.
//!
//! `testproc storm N` is `tree N` that forks its children only at its first line on stdin.
//!
//! `testproc chain N` forks a chain of N processes, each the child of the one before (they
//! die with it), prints the last one's PID and lives until stdin ends: a deep ancestry.
//!
//! `testproc linger SOCKET LINE` passes the daemon a descriptor whose close blocks: a
//! loopback TCP socket with unsent data its peer never reads and a linger of 10^6 s. It
//! sends LINE without its newline and with the socket in `SCM_RIGHTS`, closes its own copy
//! of the socket on a thread of its own, sends the newline, prints the reply, then keeps
//! the peer unread until stdin ends. Whichever copy is closed last lingers: the daemon's,
//! or, when the daemon closed its copy first (a loaded machine), this process's, which
//! holds up only the thread that closes it, never the request.
//!
//! `testproc flood SOCKET [late-first]` keeps one of its closes in the daemon blocked, as
//! `linger` does (its line is `status`, sent again with a new socket until this process's
//! own close returns at once, so that the daemon's is the last; it prints `unblocked` when
//! 20 tries could not; with `late-first`, the first socket is closed here only after the
//! daemon's reply, so that this process's close is the one that lingers), then passes the daemon as many descriptors of `/dev/null` as it takes, 253 a
//! message, without a newline: on one connection within one line, on a subscription, and
//! on 40 connections it closes at once; it prints `sent N` (descriptors sent) and keeps the
//! peers unread until stdin ends.
//!
//! `testproc urgent SOCKET` passes the daemon 16 descriptors whose close blocks, as
//! `linger` does, each attached to one urgent byte (`MSG_OOB`, a space) on a connection of
//! its own, closing its own copies at once on threads of their own; then sends `status` on
//! each and prints `sent`, or `unsupported` where the kernel has no urgent data on Unix
//! sockets; it keeps the peers unread until stdin ends.
//!
//! `testproc survivors N [HELPER]` forks N children that outlive it, prints their PIDs (one
//! a line), then `ready`, and exits when stdin ends: the survivors of a session's owner.
//! They catch SIGTERM and live on: without HELPER each prints `term` for it; with HELPER
//! each execs `HELPER rooted` instead.
//!
//! `testproc rooted`, run from a set-user-ID-root copy of testproc, takes root's ids
//! (`setresuid(0, 0, 0)`), prints `root` and lives until killed.
//!
//! `testproc reuse` is an owner whose child is about to die: at the start of a clock tick it
//! forks a child that pauses and prints its PID; at the line `go` it SIGKILLs and reaps it
//! and prints `reaped`; it lives until stdin ends. With `testproc stranger`, a process
//! outside the tree can take the child's pid within the child's clock tick.
//!
//! `testproc stranger` reads PIDs from stdin, one a line, and for each makes a child with
//! exactly that pid (`clone3` with `set_tid`, root only), which pauses until killed; it
//! prints the child's PID, or `error ERRNO`. A line `PID UID` makes the child the leader of
//! a session and process group of its own, running as UID (and its group of that number).
//!
//! `testproc keys OP...` works on its session keyring and prints a line for each OP:
//! `search:DESC` (`found DESC SERIAL` or `none DESC ERRNO`), `add:DESC` (adds a user key,
//! `added DESC SERIAL`), `read:SERIAL` (`read SERIAL PAYLOAD` or `unreadable SERIAL ERRNO`).
//!
//! `testproc with-key DESC PAYLOAD CMD...` joins a new session keyring, adds the user key
//! DESC holding PAYLOAD to it, and execs CMD.
//!
//! `testproc sibling` makes, for each line on stdin, a child with `clone(CLONE_PARENT)` (so
//! its sibling: its parent is testproc's parent) that pauses until killed, and prints its
//! PID, or `error ERRNO`.
//!
//! `testproc request SOCKET LINE` is a raw protocol client for tests that run commands
//! inside namespaces: it sends LINE to the daemon's socket and prints the reply line.
use std::ffi::CString;
use std::io::{BufRead, Read, Write};

fn wait_for_eof() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().lock().read_to_end(&mut sink);
}

fn wait_for_line() {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

fn arg_u8(args: &[String], i: usize) -> i32 {
    args.get(i)
        .and_then(|a| a.parse::<u8>().ok())
        .map(i32::from)
        .unwrap_or_else(|| {
            eprintln!("testproc: argument {i} must be a number 0-255: {args:?}");
            std::process::exit(100)
        })
}

fn exit_group(code: i32) -> ! {
    // SAFETY: _exit is async-signal-safe and ends the process without unwinding.
    unsafe { libc::_exit(code) }
}

fn exec_self_named(code: i32) -> ! {
    let exe = CString::new("/proc/self/exe").unwrap();
    let args = [
        c"testproc".to_owned(),
        c"named".to_owned(),
        c"execd".to_owned(),
        CString::new(code.to_string()).unwrap(),
    ];
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of valid C strings that outlive the call.
    unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
    eprintln!(
        "testproc: execv failed: {}",
        std::io::Error::last_os_error()
    );
    exit_group(101)
}

fn run_mode(args: &[String]) -> ! {
    match args.first().map(String::as_str) {
        Some("exit") => {
            let code = arg_u8(args, 1);
            wait_for_eof();
            exit_group(code)
        }
        Some("signal") => {
            let signal = arg_u8(args, 1);
            wait_for_eof();
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(signal) };
            exit_group(102)
        }
        Some("threads") => {
            let code = arg_u8(args, 1);
            std::thread::spawn(move || {
                wait_for_eof();
                exit_group(code)
            });
            // The raw exit syscall ends only the calling thread, without unwinding (glibc's
            // pthread_exit would force-unwind through Rust's main and abort).
            // SAFETY: the spawned thread owns everything it uses; nothing here runs after.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!("SYS_exit returned")
        }
        Some("exec") => {
            let code = arg_u8(args, 1);
            wait_for_line();
            exec_self_named(code)
        }
        Some("thread-exec") => {
            let code = arg_u8(args, 1);
            let thread = std::thread::spawn(move || {
                wait_for_line();
                exec_self_named(code)
            });
            let _ = thread.join();
            exit_group(103)
        }
        Some("threads-wait") => {
            let count = arg_u8(args, 1);
            let (tids, rx) = std::sync::mpsc::channel();
            for _ in 0..count {
                let tids = tids.clone();
                std::thread::spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    let _ = tids.send(unsafe { libc::gettid() });
                    loop {
                        std::thread::park();
                    }
                });
            }
            let tids: Vec<String> = rx
                .iter()
                .take(count as usize)
                .map(|t| t.to_string())
                .collect();
            println!("{}", tids.join(" "));
            let _ = std::io::stdout().flush();
            wait_for_eof();
            exit_group(0)
        }
        Some("request") => {
            let (Some(socket), Some(line)) = (args.get(1), args.get(2)) else {
                eprintln!("usage: testproc request SOCKET LINE");
                std::process::exit(100)
            };
            let mut stream = std::os::unix::net::UnixStream::connect(socket)
                .unwrap_or_else(|e| panic!("connect {socket}: {e}"));
            stream
                .write_all(format!("{line}\n").as_bytes())
                .expect("send the request");
            let mut reply = String::new();
            std::io::BufReader::new(stream)
                .read_line(&mut reply)
                .expect("read the reply");
            print!("{reply}");
            std::process::exit(0)
        }
        Some("named") => {
            let name = CString::new(args.get(1).cloned().unwrap_or_default()).unwrap();
            let code = arg_u8(args, 2);
            // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
            wait_for_eof();
            exit_group(code)
        }
        _ => {
            eprintln!(
                "usage: testproc orphan (exit|signal|threads|exec|thread-exec) N | testproc MODE N"
            );
            std::process::exit(100)
        }
    }
}

/// A member of a `family`: prints its PID and lives until killed.
fn member(ignore_term: bool, uid: Option<u32>) -> ! {
    if ignore_term {
        // SAFETY: setting a signal disposition of this single-threaded process.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    if let Some(uid) = uid {
        // SAFETY: plain syscalls changing this process's credentials.
        let changed = unsafe { libc::setgid(uid) == 0 && libc::setuid(uid) == 0 };
        if !changed {
            eprintln!("testproc: cannot become uid {uid}");
            exit_group(106)
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", std::process::id());
    let _ = out.flush();
    loop {
        // SAFETY: pause only waits for a signal.
        unsafe { libc::pause() };
    }
}

/// `family`: see the module comment. Single-threaded, so its children may do anything.
fn family() -> ! {
    let (hold_read, hold_write) = rustix::pipe::pipe().expect("pipe");
    // SAFETY: this process has one thread; the children run ordinary code after fork.
    let middle = match unsafe { libc::fork() } {
        -1 => exit_group(107),
        0 => {
            drop(hold_write);
            // SAFETY: as above.
            match unsafe { libc::fork() } {
                0 => {
                    drop(hold_read);
                    member(false, None)
                }
                -1 => exit_group(107),
                _ => {
                    let mut sink = Vec::new();
                    let _ = std::fs::File::from(hold_read).read_to_end(&mut sink);
                    exit_group(0)
                }
            }
        }
        middle => middle,
    };
    drop(hold_read);
    let mut hold = Some(hold_write);
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        // Members must not keep the middle process's pipe open.
        let held = hold.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        let spawn = |ignore_term: bool, uid: Option<u32>| {
            integration_tests::spawn_orphan(|| {
                if let Some(fd) = held {
                    // SAFETY: closing an inherited descriptor this process does not use.
                    unsafe { libc::close(fd) };
                }
                member(ignore_term, uid)
            })
        };
        let spawned = match words[..] {
            ["release"] => {
                hold = None;
                let mut status = 0;
                // SAFETY: reaping our own child, the middle process.
                unsafe { libc::waitpid(middle, &mut status, 0) };
                let _ = writeln!(out, "{middle}");
                Ok(())
            }
            ["orphan"] => spawn(false, None),
            ["stubborn"] => spawn(true, None),
            ["as", uid] => match uid.parse() {
                Ok(uid) => spawn(false, Some(uid)),
                Err(_) => exit_group(100),
            },
            _ => {
                eprintln!("testproc family: unknown command {line:?}");
                exit_group(100)
            }
        };
        if let Err(e) = spawned {
            eprintln!("testproc family: {e}");
            exit_group(104)
        }
        let _ = out.flush();
    }
    loop {
        // SAFETY: pause only waits for a signal.
        unsafe { libc::pause() };
    }
}

/// `client SOCKET`: see the module comment.
fn client(socket: &str) -> ! {
    let stream = std::os::unix::net::UnixStream::connect(socket).unwrap_or_else(|e| {
        eprintln!("testproc: connect {socket}: {e}");
        std::process::exit(105)
    });
    let to_daemon = stream.try_clone().expect("clone the stream");
    std::thread::spawn(move || forward(std::io::stdin(), to_daemon));
    forward(stream, std::io::stdout());
    exit_group(0)
}

/// Copies until either side ends, each read passed on at once (`io::copy` may wait to
/// fill a pipe-to-socket splice).
fn forward(mut from: impl Read, mut to: impl Write) {
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read @ 1..) = from.read(&mut buffer) {
        if to
            .write_all(&buffer[..read])
            .and_then(|()| to.flush())
            .is_err()
        {
            return;
        }
    }
}

/// See the module's `tree`.
fn tree(count: usize, storm: bool) -> ! {
    if storm {
        wait_for_line();
    }
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    for _ in 0..count {
        // SAFETY: the child only calls async-signal-safe functions, then pauses.
        match unsafe { libc::fork() } {
            // SAFETY: prctl, getppid, _exit and pause are async-signal-safe.
            0 => unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The parent died before the signal was asked for.
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            },
            -1 => {
                eprintln!("testproc: fork: {}", std::io::Error::last_os_error());
                exit_group(101)
            }
            _ => {}
        }
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    wait_for_eof();
    exit_group(0)
}

/// See the module's `chain`.
fn chain(depth: usize) -> ! {
    let (read, write) = rustix::pipe::pipe().expect("pipe");
    // SAFETY: getpid cannot fail.
    let first = unsafe { libc::getpid() };
    for level in 0..depth {
        // SAFETY: getpid cannot fail.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the child goes on with async-signal-safe calls only.
        match unsafe { libc::fork() } {
            // SAFETY: prctl, getppid and _exit are async-signal-safe.
            0 => unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
            },
            -1 => exit_group(101),
            _ if level == 0 => break,
            _ => loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            },
        }
    }
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    if me != first {
        // The last of the chain (whatever forked it pauses): it tells the first its PID.
        let _ = rustix::io::write(&write, format!("{me}\n").as_bytes());
        loop {
            // SAFETY: pause only waits for a signal.
            unsafe { libc::pause() };
        }
    }
    drop(write);
    let mut last = String::new();
    let _ = std::io::BufReader::new(std::fs::File::from(read)).read_line(&mut last);
    print!("{last}");
    let _ = std::io::stdout().flush();
    wait_for_eof();
    exit_group(0)
}

/// A loopback TCP socket whose last close blocks: unsent data its peer (returned second,
/// to keep unread) never reads, and a linger of 10^6 s.
fn lingering_tcp() -> (std::net::TcpStream, std::net::TcpStream) {
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    let small = |fd: std::os::fd::BorrowedFd<'_>, option| {
        // SAFETY: setsockopt with a valid int; failure only leaves the default size.
        unsafe {
            let size: libc::c_int = 4096;
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::SOL_SOCKET,
                option,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    };
    small(listener.as_fd(), libc::SO_RCVBUF);
    let stuck = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
    let (peer, _) = listener.accept().expect("accept");
    small(stuck.as_fd(), libc::SO_SNDBUF);
    stuck.set_nonblocking(true).unwrap();
    let chunk = [0u8; 4096];
    while (&stuck).write(&chunk).is_ok() {}
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 1_000_000,
    };
    // SAFETY: setsockopt with a valid struct linger.
    let set = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&stuck),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_LINGER");
    (stuck, peer)
}

/// Closes this process's copy of a passed lingering socket on a thread of its own, for the
/// last close lingers: when the daemon closed its copy first (it refuses a socket at
/// receipt, and on a loaded machine it may get there before this process does), this one
/// blocks for the linger, which must hold up only that thread, never a request or the
/// process's exit. The receiver hears once the close returned.
fn close_elsewhere(stuck: std::net::TcpStream) -> std::sync::mpsc::Receiver<()> {
    let (closed, returned) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(stuck);
        let _ = closed.send(());
    });
    returned
}

/// See the module's `linger`.
fn linger(socket: &str, line: &str) -> ! {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    let (stuck, peer) = lingering_tcp();
    let mut daemon = UnixStream::connect(socket).expect("connect to the daemon");
    liveness_client::fdpass::send_with_fds(&mut daemon, line.as_bytes(), &[stuck.as_fd()])
        .expect("send the line with the socket");
    close_elsewhere(stuck);
    daemon.write_all(b"\n").expect("send the newline");
    let mut reply = String::new();
    let _ = std::io::BufReader::new(&daemon).read_line(&mut reply);
    print!("{reply}");
    let _ = std::io::stdout().flush();
    wait_for_eof();
    drop(peer);
    exit_group(0)
}

/// One `sendmsg` of a single space with `fds` (at most 253) attached, with `flags`.
fn send_space_with(
    connection: &std::os::unix::net::UnixStream,
    fds: &[std::os::fd::BorrowedFd<'_>],
    flags: rustix::net::SendFlags,
) -> rustix::io::Result<usize> {
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(253))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    control.push(rustix::net::SendAncillaryMessage::ScmRights(fds));
    let space = [std::io::IoSlice::new(b" ")];
    rustix::net::sendmsg(connection, &space, &mut control, flags)
}

/// See the module's `flood`.
fn flood(socket: &str, late_first: bool) -> ! {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;
    /// The line's newline, and its reply read.
    fn complete(first: &mut UnixStream, replies: &mut impl BufRead) {
        first.write_all(b"\n").expect("send the newline");
        let mut reply = String::new();
        let _ = replies.read_line(&mut reply);
    }
    let mut first = UnixStream::connect(socket).expect("connect to the daemon");
    let mut replies = std::io::BufReader::new(first.try_clone().expect("clone the connection"));
    let mut peers = Vec::new();
    // Until this process's close returns at once: then the daemon's copy is the last, and
    // its close lingers.
    let lingers_in_the_daemon = (0..20).any(|attempt| {
        let (stuck, peer) = lingering_tcp();
        peers.push(peer);
        let line = br#"{"op":"status"}"#;
        liveness_client::fdpass::send_with_fds(&mut first, line, &[stuck.as_fd()])
            .expect("send the line with the socket");
        let closed = if late_first && attempt == 0 {
            // Closed once the daemon has surely closed its copy: the last close is this
            // process's, as when a loaded machine runs the daemon first.
            complete(&mut first, &mut replies);
            std::thread::sleep(Duration::from_millis(300));
            close_elsewhere(stuck).recv_timeout(Duration::from_millis(500))
        } else {
            let closed = close_elsewhere(stuck).recv_timeout(Duration::from_millis(500));
            complete(&mut first, &mut replies);
            closed
        };
        closed.is_ok()
    });
    if !lingers_in_the_daemon {
        println!("unblocked");
        let _ = std::io::stdout().flush();
        wait_for_eof();
        exit_group(0)
    }
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    let fds = [null.as_fd(); 253];
    // Up to `messages` messages of one space and 253 descriptors, until the socket is full.
    let send = |connection: &UnixStream, messages: usize| {
        let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
        let mut sent = 0;
        for _ in 0..messages {
            match send_space_with(connection, &fds, flags) {
                Ok(1) => sent += fds.len(),
                _ => break,
            }
        }
        sent
    };
    let connect = || UnixStream::connect(socket).expect("connect to the daemon");
    let in_a_line = connect();
    let mut sent = send(&in_a_line, 40);
    let mut subscribed = connect();
    subscribed
        .write_all(b"{\"op\":\"subscribe\"}\n")
        .expect("subscribe");
    sent += send(&subscribed, 40);
    for _ in 0..40 {
        sent += send(&connect(), 2);
    }
    println!("sent {sent}");
    let _ = std::io::stdout().flush();
    wait_for_eof();
    drop((peers, first, in_a_line, subscribed));
    exit_group(0)
}

/// See the module's `urgent`.
fn urgent(socket: &str) -> ! {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    let mut kept = Vec::new();
    for _ in 0..16 {
        let (stuck, peer) = lingering_tcp();
        let mut daemon = UnixStream::connect(socket).expect("connect to the daemon");
        let flags = rustix::net::SendFlags::OOB | rustix::net::SendFlags::NOSIGNAL;
        match send_space_with(&daemon, &[stuck.as_fd()], flags) {
            Ok(_) => {}
            Err(rustix::io::Errno::OPNOTSUPP) => {
                println!("unsupported");
                let _ = std::io::stdout().flush();
                wait_for_eof();
                exit_group(0);
            }
            Err(e) => panic!("sendmsg MSG_OOB: {e}"),
        }
        close_elsewhere(stuck);
        let _ = daemon.write_all(b"{\"op\":\"status\"}\n");
        kept.push((daemon, peer));
    }
    println!("sent");
    let _ = std::io::stdout().flush();
    wait_for_eof();
    drop(kept);
    exit_group(0)
}

/// The `execv` arguments of a survivor's SIGTERM handler, made before the forks (a
/// handler may not allocate): null until `survivors` is given a HELPER.
static ON_TERM_EXEC: std::sync::atomic::AtomicPtr<*const libc::c_char> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_term(_: libc::c_int) {
    let argv = ON_TERM_EXEC.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: write and execv are async-signal-safe; `argv` is a leaked, NULL-terminated
    // array of leaked C strings.
    unsafe {
        if argv.is_null() {
            libc::write(1, c"term\n".as_ptr().cast(), 5);
        } else {
            libc::execv(*argv, argv.cast_const());
            libc::write(1, c"exec failed\n".as_ptr().cast(), 12);
        }
    }
}

/// See the module's `survivors`.
fn survivors(count: usize, helper: Option<&str>) -> ! {
    if let Some(helper) = helper {
        let strings = [CString::new(helper).unwrap(), c"rooted".to_owned()];
        let mut argv: Vec<*const libc::c_char> = strings.iter().map(|arg| arg.as_ptr()).collect();
        argv.push(std::ptr::null());
        std::mem::forget(strings);
        ON_TERM_EXEC.store(
            argv.leak().as_mut_ptr(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    // Installed before the forks, which inherit it.
    // SAFETY: `on_term` only makes async-signal-safe calls.
    unsafe { libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t) };
    let mut out = std::io::stdout().lock();
    for _ in 0..count {
        // SAFETY: this process has one thread; the child only pauses.
        match unsafe { libc::fork() } {
            0 => loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            },
            -1 => {
                eprintln!("testproc: fork: {}", std::io::Error::last_os_error());
                exit_group(101)
            }
            child => {
                let _ = writeln!(out, "{child}");
            }
        }
    }
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);
    wait_for_eof();
    exit_group(0)
}

/// Waits for the start of the next clock tick of `/proc/<pid>/stat`'s start times (USER_HZ
/// is 100: 10 ms of CLOCK_BOOTTIME), so that what follows has a whole tick.
fn next_tick() {
    let now = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        (ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64) / 10_000_000
    };
    let tick = now();
    while now() == tick {
        std::hint::spin_loop();
    }
}

/// See the module's `reuse`. Single-threaded, so its child may do anything.
fn reuse() -> ! {
    next_tick();
    // SAFETY: this process has one thread.
    let child = match unsafe { libc::fork() } {
        -1 => exit_group(107),
        0 => loop {
            // SAFETY: pause only waits for a signal.
            unsafe { libc::pause() };
        },
        child => child,
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{child}");
    let _ = out.flush();
    wait_for_line();
    // SAFETY: killing and reaping our own child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    let _ = writeln!(out, "reaped");
    let _ = out.flush();
    wait_for_eof();
    exit_group(0)
}

/// `struct clone_args` of `clone3(2)`, up to `set_tid_size`.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// Makes a child with `clone3` (`flags`, and exactly the pid `set_tid` if given) that pauses
/// until killed, and prints its PID, or `error ERRNO`. Single-threaded callers only.
fn clone_paused(flags: u64, set_tid: Option<libc::pid_t>, leader_as: Option<u32>) {
    let tids = [set_tid.unwrap_or(0)];
    let args = CloneArgs {
        flags,
        // clone3 refuses an exit signal with CLONE_PARENT: the child gets the caller's own.
        exit_signal: if flags & libc::CLONE_PARENT as u64 != 0 {
            0
        } else {
            libc::SIGCHLD as u64
        },
        set_tid: set_tid.map_or(0, |_| tids.as_ptr() as u64),
        set_tid_size: u64::from(set_tid.is_some()),
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM is a fork; the child only pauses.
    let made = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    let mut out = std::io::stdout();
    match made {
        0 => {
            if let Some(uid) = leader_as {
                // SAFETY: plain syscalls changing this child's own session and ids.
                let made = unsafe {
                    libc::setsid() >= 0
                        && libc::setgroups(0, std::ptr::null()) == 0
                        && libc::setresgid(uid, uid, uid) == 0
                        && libc::setresuid(uid, uid, uid) == 0
                };
                if !made {
                    exit_group(106);
                }
            }
            loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            }
        }
        -1 => {
            let _ = writeln!(out, "error {}", std::io::Error::last_os_error());
        }
        child => {
            let _ = writeln!(out, "{child}");
        }
    }
    let _ = out.flush();
}

/// See the module's `stranger`.
fn stranger() -> ! {
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap_or_default();
        let mut words = line.split_whitespace();
        let Some(Ok(pid)) = words.next().map(str::parse::<libc::pid_t>) else {
            exit_group(100)
        };
        let leader_as = words.next().and_then(|uid| uid.parse().ok());
        clone_paused(0, Some(pid), leader_as);
    }
    exit_group(0)
}

/// See the module's `sibling`.
fn sibling() -> ! {
    for _ in std::io::stdin().lock().lines() {
        clone_paused(libc::CLONE_PARENT as u64, None, None);
    }
    exit_group(0)
}

/// `KEY_SPEC_SESSION_KEYRING` of add_key(2) and keyctl(2).
const SESSION_KEYRING: libc::c_long = -3;

/// A user key DESC holding PAYLOAD, added to the session keyring: its serial.
fn add_user_key(desc: &str, payload: &[u8]) -> std::io::Result<libc::c_long> {
    let desc = CString::new(desc).unwrap_or_default();
    // SAFETY: add_key reads the strings and the payload we pass.
    let serial = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            desc.as_ptr(),
            payload.as_ptr(),
            payload.len(),
            SESSION_KEYRING,
        )
    };
    if serial < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(serial)
}

/// See the module's `keys`.
fn keys(ops: &[String]) -> ! {
    for op in ops {
        let (op, what) = op.split_once(':').unwrap_or((op, ""));
        let desc = CString::new(what).unwrap_or_default();
        let line = match op {
            // SAFETY: keyctl(KEYCTL_SEARCH) reads the strings we pass.
            "search" => match unsafe {
                libc::syscall(
                    libc::SYS_keyctl,
                    libc::KEYCTL_SEARCH,
                    SESSION_KEYRING,
                    c"user".as_ptr(),
                    desc.as_ptr(),
                    0,
                )
            } {
                serial @ 0.. => format!("found {what} {serial}"),
                _ => format!("none {what} {}", std::io::Error::last_os_error()),
            },
            "add" => match add_user_key(what, b"from an action") {
                Ok(serial) => format!("added {what} {serial}"),
                Err(e) => format!("not-added {what} {e}"),
            },
            "read" => {
                let mut payload = [0u8; 256];
                let serial: libc::c_long = what.parse().unwrap_or(0);
                // SAFETY: keyctl(KEYCTL_READ) writes at most the buffer's length.
                match unsafe {
                    libc::syscall(
                        libc::SYS_keyctl,
                        libc::KEYCTL_READ,
                        serial,
                        payload.as_mut_ptr(),
                        payload.len(),
                    )
                } {
                    read @ 0.. => {
                        let read = usize::try_from(read).unwrap_or(0).min(payload.len());
                        format!("read {what} {}", String::from_utf8_lossy(&payload[..read]))
                    }
                    _ => format!("unreadable {what} {}", std::io::Error::last_os_error()),
                }
            }
            _ => exit_group(100),
        };
        println!("{line}");
    }
    let _ = std::io::stdout().flush();
    exit_group(0)
}

/// See the module's `with-key`.
fn with_key(args: &[String]) -> ! {
    let [desc, payload, command @ ..] = args else {
        exit_group(100)
    };
    // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) reads no memory of ours.
    let joined = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            libc::KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    if joined < 0 || add_user_key(desc, payload.as_bytes()).is_err() {
        eprintln!("testproc with-key: {}", std::io::Error::last_os_error());
        exit_group(106)
    }
    use std::os::unix::process::CommandExt;
    let Some((program, rest)) = command.split_first() else {
        exit_group(100)
    };
    let error = std::process::Command::new(program).args(rest).exec();
    eprintln!("testproc with-key: {program}: {error}");
    exit_group(107)
}

/// See the module's `rooted`.
fn rooted() -> ! {
    // SAFETY: a plain syscall changing this process's credentials.
    if unsafe { libc::setresuid(0, 0, 0) } != 0 {
        println!("not root: {}", std::io::Error::last_os_error());
        exit_group(106)
    }
    println!("root");
    let _ = std::io::stdout().flush();
    loop {
        // SAFETY: pause only waits for a signal.
        unsafe { libc::pause() };
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("chain") {
        chain(args.get(1).and_then(|n| n.parse().ok()).unwrap_or(1));
    }
    if args.first().map(String::as_str) == Some("survivors") {
        survivors(
            args.get(1).and_then(|n| n.parse().ok()).unwrap_or(1),
            args.get(2).map(String::as_str),
        );
    }
    if args.first().map(String::as_str) == Some("reuse") {
        reuse();
    }
    if args.first().map(String::as_str) == Some("stranger") {
        stranger();
    }
    if args.first().map(String::as_str) == Some("sibling") {
        sibling();
    }
    if args.first().map(String::as_str) == Some("rooted") {
        rooted();
    }
    if args.first().map(String::as_str) == Some("keys") {
        keys(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("with-key") {
        with_key(&args[1..]);
    }
    if let Some(mode @ ("tree" | "storm")) = args.first().map(String::as_str) {
        tree(
            args.get(1).and_then(|n| n.parse().ok()).unwrap_or(1),
            mode == "storm",
        );
    }
    if args.first().map(String::as_str) == Some("linger") {
        linger(
            args.get(1).map_or("", String::as_str),
            args.get(2).map_or("", String::as_str),
        );
    }
    if args.first().map(String::as_str) == Some("urgent") {
        urgent(args.get(1).map_or("", String::as_str));
    }
    if args.first().map(String::as_str) == Some("flood") {
        flood(
            args.get(1).map_or("", String::as_str),
            args.get(2).map(String::as_str) == Some("late-first"),
        );
    }
    if args.first().map(String::as_str) == Some("client") {
        client(args.get(1).map_or("", String::as_str));
    }
    if args.first().map(String::as_str) == Some("family") {
        family();
    }
    if args.first().map(String::as_str) != Some("orphan") {
        run_mode(&args);
    }
    let orphan = integration_tests::spawn_orphan(|| {
        // The orphan tells its PID itself, after the forks, so the line is written exactly
        // once; then stdout is closed so readers see EOF.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", std::process::id());
        let _ = out.flush();
        // SAFETY: closing our own stdout; nothing else uses it.
        unsafe { libc::close(1) };
        drop(out);
        run_mode(&args[1..])
    });
    if let Err(e) = orphan {
        eprintln!("testproc: {e}");
        exit_group(104)
    }
    exit_group(0)
}
