//! Why an owner died and what it cost, from the kernel: real processes killed by real
//! senders, faults, limits, a pty hang-up and the OOM killer in a memory cgroup, with the
//! default sources (eBPF and pidfd). Each ended session must carry exactly the cause the
//! kernel showed, and its usage.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use integration_tests::{
    Daemon, binary, cli_as, eventually, json_of, privileged, process_of, register, shared_daemon,
};
use liveness_proc::mountinfo::cgroup2_mounts;
use serde_json::{Value, json};

/// A non-root user with no account: the tests make processes of it.
const USER: u32 = 61_101;

/// A `dying` process, a child of the test reaped by a thread of its own as soon as it dies.
struct Dying {
    pid: u32,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    reaper: Option<std::thread::JoinHandle<()>>,
}

impl Dying {
    fn spawn(args: &[&str]) -> Dying {
        Dying::spawn_with(args, |_| {})
    }

    fn spawn_with(args: &[&str], setup: impl FnOnce(&mut Command)) -> Dying {
        let mut command = Command::new(binary("dying"));
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        setup(&mut command);
        let mut child: Child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn dying {args:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let pid = child.id();
        let reaper = std::thread::spawn(move || {
            let _ = child.wait();
        });
        Dying {
            pid,
            stdin,
            stdout,
            reaper: Some(reaper),
        }
    }

    /// Sends a line.
    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("write to dying");
    }

    /// The next line it prints.
    fn hear(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from dying");
        line.trim().to_owned()
    }

    /// Ends its stdin: what most modes wait for.
    fn release(&mut self) {
        self.stdin = None;
    }
}

impl Drop for Dying {
    fn drop(&mut self) {
        // Every mode ends at the end of its stdin, if it has not died already; nothing is
        // signalled by pid, which the reaper may have freed for reuse.
        self.stdin = None;
        if let Some(reaper) = self.reaper.take() {
            let _ = reaper.join();
        }
    }
}

fn started(test: &str) -> Option<Daemon> {
    if !privileged(test) {
        return None;
    }
    let daemon = Daemon::start(&[]);
    let causes = &daemon.source_status("ebpf")["causes"];
    assert_eq!(causes["signals"], true, "{test}: {causes}");
    assert_eq!(causes["oom"], true, "{test}: {causes}");
    Some(daemon)
}

/// The cause of session `id` once it has ended.
fn cause_of(daemon: &Daemon, id: &str) -> Value {
    let session = daemon.wait_ended(id);
    assert_eq!(session["detected_by"], "ebpf", "{session}");
    session["cause"].clone()
}

/// A process of session B (a new process its owner forks) sends SIGTERM to session A's
/// owner: A's cause names the sender's pid, command, uid and session B. Root, outside
/// every session, sends SIGKILL to another owner: uid 0, no session. And a non-root creator
/// whose owner root's session B killed sees the sender, never B's id.
#[test]
fn cause_signal_names_its_sender_and_the_sessions_the_reader_may_see() {
    let test = "cause_signal_names_its_sender_and_the_sessions_the_reader_may_see";
    if !privileged(test) {
        return;
    }
    let (daemon, binaries) = shared_daemon();
    let mut victim = Dying::spawn(&["burn", "0"]);
    let mut sender = Dying::spawn(&["sender"]);
    register(&daemon, "a", victim.pid);
    register(&daemon, "b", sender.pid);
    sender.say(&format!("{} 15", victim.pid));
    let kill = sender.hear();
    let cause = cause_of(&daemon, "a");
    assert_eq!(cause["kind"], "signal", "{cause}");
    assert_eq!(cause["signal"], 15, "{cause}");
    let from = &cause["sender"];
    assert_eq!(from["pid"].to_string(), kill, "{cause}");
    assert_eq!(from["comm"], "dying", "{cause}");
    assert_eq!(from["uid"], 0, "{cause}");
    assert_eq!(from["session"], "b", "{cause}");
    victim.release();

    // Root, from no session at all: this test's own thread.
    let other = Dying::spawn(&["burn", "0"]);
    register(&daemon, "c", other.pid);
    // SAFETY: killing our own child, alive until its reaper sees this death.
    unsafe { libc::kill(other.pid as i32, libc::SIGKILL) };
    let cause = cause_of(&daemon, "c");
    assert_eq!(
        (&cause["kind"], &cause["signal"]),
        (&json!("signal"), &json!(9)),
        "{cause}"
    );
    assert_eq!(cause["sender"]["pid"], std::process::id(), "{cause}");
    assert_eq!(cause["sender"]["uid"], 0, "{cause}");
    // The process's command, not the name of the test's thread that sent it.
    let own = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(cause["sender"]["comm"], own.trim(), "{cause}");
    assert_eq!(cause["sender"].get("session"), None, "{cause}");

    // A user's owner, killed by a process of root's session B.
    let users = process_of(USER);
    let registered = cli_as(
        &binaries,
        &daemon,
        USER,
        &[
            "register",
            "--session",
            "users",
            "--owner-pid",
            &users.id().to_string(),
        ],
    );
    assert!(registered.status.success(), "{registered:?}");
    sender.say(&format!("{} 15", users.id()));
    let kill = sender.hear();
    let mut seen = Value::Null;
    assert!(eventually(Duration::from_secs(15), || {
        seen = json_of(&cli_as(
            &binaries,
            &daemon,
            USER,
            &["get", "--session", "users", "--json"],
        ));
        seen["phase"] == "ended"
    }));
    let from = &seen["cause"]["sender"];
    assert_eq!(from["pid"].to_string(), kill, "{seen}");
    assert_eq!(from["uid"], 0, "{seen}");
    assert_eq!(
        from.get("session"),
        None,
        "root's session id reached a non-root reader: {seen}"
    );
    // Not in the event the user reads either.
    let events = watched(&daemon, USER, &["--since", "0"], "users");
    assert!(!events.contains("\"session\":\"b\""), "{events}");
}

/// The lines `liveness watch --json ARGS` prints as `uid` until the end of `until`.
fn watched(daemon: &Daemon, uid: u32, args: &[&str], until: &str) -> String {
    let mut watch = Command::new(binary("liveness"));
    watch
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["watch", "--json"])
        .args(args)
        .stdout(Stdio::piped());
    if uid != 0 {
        watch.uid(uid).gid(uid);
    }
    let mut watch = watch.spawn().expect("run liveness watch");
    let mut lines = String::new();
    let mut out = BufReader::new(watch.stdout.take().unwrap());
    let end = "\"session.ended\",";
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        lines.push_str(&line);
        if line.contains(end) && line.contains(&format!("\"session\":\"{until}\"")) {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    lines
}

/// Deaths the process brings on itself, or the kernel does: abort() (SIGABRT it sends
/// itself, so the sender is the owner), a segfault and a CPU-time limit (the kernel's).
#[test]
fn cause_self_inflicted_and_kernel_raised_signals() {
    let Some(daemon) = started("cause_self_inflicted_and_kernel_raised_signals") else {
        return;
    };
    let mut aborts = Dying::spawn(&["abort"]);
    let mut faults = Dying::spawn(&["segv"]);
    let mut limited = Dying::spawn(&["cpu-limit"]);
    register(&daemon, "abort", aborts.pid);
    register(&daemon, "segv", faults.pid);
    register(&daemon, "cpu", limited.pid);
    aborts.release();
    faults.release();
    limited.release();

    let cause = cause_of(&daemon, "abort");
    assert_eq!(
        (&cause["kind"], &cause["signal"]),
        (&json!("signal"), &json!(6)),
        "{cause}"
    );
    assert_eq!(cause["sender"]["pid"], aborts.pid, "{cause}");
    assert_eq!(cause.get("kernel"), None, "{cause}");

    let cause = cause_of(&daemon, "segv");
    assert_eq!(
        cause,
        json!({"kind": "signal", "signal": 11, "kernel": "fault"}),
        "a segfault is the kernel's"
    );
    let cause = cause_of(&daemon, "cpu");
    assert_eq!(
        cause,
        json!({"kind": "signal", "signal": 24, "kernel": "cpu_limit"}),
        "RLIMIT_CPU's SIGXCPU is the kernel's"
    );
    let text = daemon.cli(&["get", "--session", "segv"]);
    assert!(
        String::from_utf8_lossy(&text.stdout)
            .contains("killed by SIGSEGV from the kernel (a fault)"),
        "{text:?}"
    );
}

/// A session leader whose pty's master side closes gets SIGHUP from the kernel: `hangup`.
/// The same signal sent by a process is a signal with its sender.
#[test]
fn cause_pty_hang_up_is_told_apart_from_a_sent_sighup() {
    let Some(daemon) = started("cause_pty_hang_up_is_told_apart_from_a_sent_sighup") else {
        return;
    };
    let mut terminal = Dying::spawn(&["hangup"]);
    let leader: u32 = terminal.hear().parse().expect("the session leader's pid");
    register(&daemon, "pty", leader);
    terminal.say("close");
    assert_eq!(cause_of(&daemon, "pty"), json!({"kind": "hangup"}));
    let text = daemon.cli(&["get", "--session", "pty"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("hung up (terminal closed)"),
        "{text:?}"
    );

    let victim = Dying::spawn(&["burn", "0"]);
    let mut sender = Dying::spawn(&["sender"]);
    register(&daemon, "sent", victim.pid);
    sender.say(&format!("{} 1", victim.pid));
    sender.hear();
    let cause = cause_of(&daemon, "sent");
    assert_eq!(
        (&cause["kind"], &cause["signal"]),
        (&json!("signal"), &json!(1)),
        "{cause}"
    );
    assert_eq!(cause["sender"]["comm"], "dying", "{cause}");
}

/// A process that aborts and is sent SIGKILL while it dumps core: the sender named is the
/// one of the signal its status says it died of: its own SIGABRT (Linux before 5.17), or
/// the SIGKILL, which takes the status over from 5.17 on, and its sender.
#[test]
fn cause_a_kill_during_a_core_dump_names_the_sender_of_the_status_signal() {
    let test = "cause_a_kill_during_a_core_dump_names_the_sender_of_the_status_signal";
    let Some(daemon) = started(test) else {
        return;
    };
    let dumps = tempfile::tempdir().expect("a directory for the core file");
    let dir = dumps.path().to_str().expect("a UTF-8 path");
    let mut aborts = Dying::spawn(&["abort-dump", dir, "128"]);
    register(&daemon, "dump", aborts.pid);
    aborts.release();
    let watcher: u32 = aborts
        .hear()
        .parse()
        .expect("the watcher killed it as it dumped");
    let cause = cause_of(&daemon, "dump");
    assert_eq!(cause["kind"], "signal", "{cause}");
    let sender = match cause["signal"].as_u64() {
        Some(6) => aborts.pid,
        Some(9) => watcher,
        _ => panic!("neither SIGABRT nor SIGKILL: {cause}"),
    };
    assert_eq!(cause["sender"]["pid"], sender, "{cause}");
}

/// SIGTERM sent twice while the owner blocks it, first to its thread (`tgkill`), then to
/// the process (`kill`): the kernel delivers the thread's first, and its sender is named.
#[test]
fn cause_names_the_sender_of_the_pending_signal_delivered_first() {
    let Some(daemon) = started("cause_names_the_sender_of_the_pending_signal_delivered_first")
    else {
        return;
    };
    let mut victim = Dying::spawn(&["blocked", "15"]);
    assert_eq!(victim.hear(), "blocked");
    register(&daemon, "twice", victim.pid);
    let mut sender = Dying::spawn(&["sender"]);
    sender.say(&format!("{} 15 tgkill", victim.pid));
    let first = sender.hear();
    sender.say(&format!("{} 15", victim.pid));
    let second = sender.hear();
    victim.release();
    let cause = cause_of(&daemon, "twice");
    assert_eq!(cause["signal"], 15, "{cause}");
    assert_eq!(
        cause["sender"]["pid"].to_string(),
        first,
        "not the later kill's {second}: {cause}"
    );
}

/// A process that queues a signal with a `si_code` of its choosing (`rt_sigqueueinfo`)
/// cannot pass it off as the kernel's: every code up to `SI_USER` is a process's, named
/// with its pid, SI_TIMER (also a POSIX timer's code) included.
#[test]
fn cause_forged_si_codes_name_their_sender() {
    let Some(daemon) = started("cause_forged_si_codes_name_their_sender") else {
        return;
    };
    let mut sender = Dying::spawn(&["sender"]);
    // SIGHUP as SI_ASYNCIO, SIGILL as SI_SIGIO, SIGKILL as SI_TIMER, SIGTERM as SI_DETHREAD
    // (SIGSEGV would meet the Rust runtime's handler, which survives a sent one).
    for (id, signal, code) in [
        ("hup", 1, -4),
        ("ill", 4, -5),
        ("kill", 9, -2),
        ("term", 15, -7),
    ] {
        let victim = Dying::spawn(&["burn", "0"]);
        register(&daemon, id, victim.pid);
        sender.say(&format!("{} {signal} {code}", victim.pid));
        let queued = sender.hear();
        let cause = cause_of(&daemon, id);
        assert_eq!(
            (&cause["kind"], &cause["signal"]),
            (&json!("signal"), &json!(signal)),
            "si_code {code}: {cause}"
        );
        assert_eq!(
            cause["sender"]["pid"].to_string(),
            queued,
            "si_code {code}: {cause}"
        );
        assert_eq!(cause.get("kernel"), None, "si_code {code}: {cause}");
    }
}

/// The kernel's SIGHUPs without a terminal: a child that asked for SIGHUP at its parent's
/// death (`parent_died`), and a stopped process group that its parent's exit orphans
/// (`orphaned_group`). Neither reads `hangup`.
#[test]
fn cause_sighup_without_a_terminal_says_why() {
    let Some(daemon) = started("cause_sighup_without_a_terminal_says_why") else {
        return;
    };
    let mut parent = Dying::spawn(&["pdeath", "1"]);
    let child: u32 = parent.hear().parse().expect("the child's pid");
    register(&daemon, "pdeath", child);
    parent.say("exit");
    assert_eq!(
        cause_of(&daemon, "pdeath"),
        json!({"kind": "signal", "signal": 1, "kernel": "parent_died"})
    );
    let text = daemon.cli(&["get", "--session", "pdeath"]);
    assert!(
        String::from_utf8_lossy(&text.stdout)
            .contains("killed by SIGHUP from the kernel (its parent died)"),
        "{text:?}"
    );

    let mut parent = Dying::spawn(&["orphan"]);
    let stopped: u32 = parent.hear().parse().expect("the stopped child's pid");
    register(&daemon, "orphan", stopped);
    parent.say("exit");
    assert_eq!(
        cause_of(&daemon, "orphan"),
        json!({"kind": "signal", "signal": 1, "kernel": "orphaned_group"})
    );
}

/// The RLIMIT_CPU hard limit's SIGKILL is the CPU-time limit, not `other`.
#[test]
fn cause_cpu_hard_limit_sigkill_is_the_cpu_limit() {
    let Some(daemon) = started("cause_cpu_hard_limit_sigkill_is_the_cpu_limit") else {
        return;
    };
    let mut limited = Dying::spawn(&["cpu-hard"]);
    register(&daemon, "hard", limited.pid);
    limited.release();
    assert_eq!(
        cause_of(&daemon, "hard"),
        json!({"kind": "signal", "signal": 9, "kernel": "cpu_limit"})
    );
}

/// A memory cgroup of 32 MiB, made for one test and removed after it: on a v1 memory
/// hierarchy where one is mounted (this machine's hybrid layout), else on cgroup2, mounted
/// here with the memory controller when no mount has it (the test VMs).
struct MemoryCgroup {
    dir: PathBuf,
    path: String,
    mounted: Option<tempfile::TempDir>,
}

impl MemoryCgroup {
    fn new(name: &str) -> MemoryCgroup {
        const LIMIT: &str = "33554432";
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let path = format!("/{name}");
        if v1.join("memory.limit_in_bytes").exists() {
            let dir = v1.join(name);
            std::fs::create_dir(&dir).expect("create a v1 memory cgroup");
            write(&dir.join("memory.limit_in_bytes"), LIMIT);
            // No swap to spill into, where swap is accounted.
            let swap = dir.join("memory.memsw.limit_in_bytes");
            if swap.exists() {
                write(&swap, LIMIT);
            }
            return MemoryCgroup {
                dir,
                path,
                mounted: None,
            };
        }
        let (root, mounted) = match cgroup2_with_memory() {
            Some(root) => (root, None),
            None => {
                let mount = tempfile::tempdir().unwrap();
                let status = Command::new("mount")
                    .args(["-t", "cgroup2", "none"])
                    .arg(mount.path())
                    .status()
                    .expect("run mount");
                assert!(status.success(), "mount cgroup2: {status}");
                write(&mount.path().join("cgroup.subtree_control"), "+memory");
                (mount.path().to_path_buf(), Some(mount))
            }
        };
        let dir = root.join(name);
        std::fs::create_dir(&dir).expect("create a v2 cgroup");
        write(&dir.join("memory.max"), LIMIT);
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write(&swap, "0");
        }
        MemoryCgroup { dir, path, mounted }
    }

    fn add(&self, pid: u32) {
        write(&self.dir.join("cgroup.procs"), &pid.to_string());
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = eventually(Duration::from_secs(5), || {
            std::fs::remove_dir(&self.dir).is_ok()
        });
        if let Some(mount) = &self.mounted {
            let _ = Command::new("umount").arg(mount.path()).status();
        }
    }
}

/// A mounted cgroup2 hierarchy whose root has the memory controller.
fn cgroup2_with_memory() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup2_mounts(&mountinfo).ok()?.into_iter().find_map(|m| {
        let controllers = std::fs::read_to_string(m.mount_point.join("cgroup.subtree_control"));
        (controllers.ok()?.split_whitespace().any(|c| c == "memory")).then_some(m.mount_point)
    })
}

fn write(path: &Path, value: &str) {
    std::fs::write(path, value).unwrap_or_else(|e| panic!("write {value} to {path:?}: {e}"));
}

/// The OOM killer in a 32 MiB memory cgroup: cause `oom`, scope `cgroup`, the cgroup's
/// path, and a peak of the limit's order.
#[test]
fn cause_oom_kill_names_the_cgroup_whose_limit_was_reached() {
    let Some(daemon) = started("cause_oom_kill_names_the_cgroup_whose_limit_was_reached") else {
        return;
    };
    let cgroup = MemoryCgroup::new(&format!("liveness-oom-{}", std::process::id()));
    let mut hog = Dying::spawn(&["hog"]);
    cgroup.add(hog.pid);
    register(&daemon, "oom", hog.pid);
    hog.release();
    let session = daemon.wait_ended("oom");
    assert_eq!(
        session["cause"],
        json!({"kind": "oom", "scope": "cgroup", "cgroup": cgroup.path}),
        "{session}"
    );
    let peak = session["usage"]["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        (8 << 20..=64 << 20).contains(&peak),
        "peak {peak} bytes is not of the order of the 32 MiB limit: {session}"
    );
    let text = daemon.cli(&["get", "--session", "oom"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains(&format!(
            "OOM-killed: cgroup {} reached its memory limit",
            cgroup.path
        )),
        "{text:?}"
    );
}

/// The OOM killer kills the processes that share its victim's memory (`CLONE_VM`) with it,
/// and marks only the victim: both are `oom`, with the cgroup, never a plain SIGKILL.
#[test]
fn cause_oom_kill_of_a_process_sharing_the_victims_memory_is_oom() {
    let Some(daemon) = started("cause_oom_kill_of_a_process_sharing_the_victims_memory_is_oom")
    else {
        return;
    };
    let cgroup = MemoryCgroup::new(&format!("liveness-oom-shared-{}", std::process::id()));
    let mut hog = Dying::spawn(&["hog-shared"]);
    cgroup.add(hog.pid);
    hog.say("clone");
    let sharer: u32 = hog.hear().parse().expect("the sharing process's pid");
    register(&daemon, "hog", hog.pid);
    register(&daemon, "sharer", sharer);
    hog.release();
    for id in ["hog", "sharer"] {
        assert_eq!(
            cause_of(&daemon, id),
            json!({"kind": "oom", "scope": "cgroup", "cgroup": cgroup.path}),
            "{id}"
        );
    }
}

/// CPU time from the kernel at the exit: an owner that burns 300 ms reports at least 250,
/// and the members of a tree that burn and exit before their owner are summed apart from
/// the owner's own (less than half theirs).
#[test]
fn cause_usage_counts_the_owner_and_the_members_that_exited() {
    let Some(daemon) = started("cause_usage_counts_the_owner_and_the_members_that_exited") else {
        return;
    };
    let mut burner = Dying::spawn(&["burn", "300"]);
    assert_eq!(burner.hear(), "burnt");
    register(&daemon, "burn", burner.pid);
    burner.release();
    let usage = daemon.wait_ended("burn")["usage"].clone();
    let cpu = |usage: &Value| {
        usage["cpu_user_us"].as_u64().unwrap() + usage["cpu_system_us"].as_u64().unwrap()
    };
    assert!(cpu(&usage) >= 250_000, "{usage}");
    assert!(usage["peak_rss_bytes"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(usage["members"]["exited"], 0, "{usage}");

    let mut tree = Dying::spawn(&["burn-tree", "3", "150"]);
    register(&daemon, "tree", tree.pid);
    tree.say("go");
    assert_eq!(tree.hear(), "burnt");
    tree.release();
    let usage = daemon.wait_ended("tree")["usage"].clone();
    assert_eq!(usage["members"]["exited"], 3, "{usage}");
    assert!(cpu(&usage["members"]) >= 3 * 120_000, "{usage}");
    // Relative, not absolute: under emulation the owner's own forks and waits take
    // more than 100 ms, yet far less than its members' burn.
    assert!(
        cpu(&usage) < cpu(&usage["members"]) / 2,
        "the owner itself hardly ran: {usage}"
    );
}

/// `watch` (also with `--json`, which otherwise forwards the daemon's lines untouched) and
/// `list` filter ended sessions by cause; `wait` keeps its exit codes and its JSON adds the
/// cause. (The metrics' count by cause is tested in operations.rs.)
#[test]
fn cause_filters_and_counts_endings() {
    let Some(daemon) = started("cause_filters_and_counts_endings") else {
        return;
    };
    let mut exits = Dying::spawn(&["burn", "0"]);
    let killed = Dying::spawn(&["burn", "0"]);
    register(&daemon, "exits", exits.pid);
    register(&daemon, "killed", killed.pid);
    // SAFETY: killing our own child.
    unsafe { libc::kill(killed.pid as i32, libc::SIGTERM) };
    daemon.wait_ended("killed");
    exits.release();
    daemon.wait_ended("exits");

    let list = json_of(&daemon.cli(&["list", "--cause", "signal", "--json"]));
    let ids: Vec<&str> = list
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["killed"], "{list}");

    let wait = daemon.cli(&["wait", "--session", "killed", "--json"]);
    assert_eq!(wait.status.code(), Some(2), "killed: {wait:?}");
    let waited = json_of(&wait);
    assert_eq!(waited["cause"]["kind"], "signal", "{waited}");
    let wait = daemon.cli(&["wait", "--session", "exits"]);
    assert_eq!(wait.status.code(), Some(0), "{wait:?}");

    // "killed" ended first: a filter that let it through would show it before "exits".
    let lines = watched(&daemon, 0, &["--since", "0", "--cause", "exit"], "exits");
    assert!(lines.contains("\"exits\""), "{lines}");
    assert!(!lines.contains("\"killed\""), "{lines}");
}
