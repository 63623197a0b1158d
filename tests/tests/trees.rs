//! Session process trees with real processes: orphans left before and after registration
//! stay attributed to their session (`whose`, `processes`), are reported as `survivors`
//! when the owner is SIGKILLed, threads are not members, membership survives a daemon
//! restart, and the `/proc`-scan fallback does the same without eBPF.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use integration_tests::{
    Daemon, Fingerprint, TestprocAs, binary, eventually, privileged, proc_root, start_ticks, state,
};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(15);

/// An owner process that runs the shell commands the test sends it, one per line, and
/// whose output the test reads.
struct Owner {
    child: Child,
    commands: ChildStdin,
    output: BufReader<ChildStdout>,
    pid: u32,
    /// Processes the test made through the owner, killed at the end by fingerprint.
    spawned: Vec<(u32, u64)>,
}

impl Owner {
    fn spawn() -> Owner {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"echo ready; while read -r cmd; do eval "$cmd"; done"#)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Its sleepers outlive the test: with the test's stderr they would hold the
            // output pipe of `cargo test` open, and whoever reads it to the end would wait.
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh");
        let commands = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        let pid = child.id();
        let mut owner = Owner {
            child,
            commands,
            output,
            pid,
            spawned: Vec::new(),
        };
        assert_eq!(owner.line(), "ready");
        owner
    }

    fn send(&mut self, line: &str) {
        writeln!(self.commands, "{line}").expect("write to the owner");
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.output
            .read_line(&mut line)
            .expect("read from the owner");
        line.trim().to_owned()
    }

    fn pid_line(&mut self) -> u32 {
        let line = self.line();
        let pid: u32 = line
            .parse()
            .unwrap_or_else(|_| panic!("the owner printed {line:?}, not a pid"));
        let start = start_ticks(pid).unwrap_or_else(|| panic!("{pid} is already gone"));
        self.spawned.push((pid, start));
        pid
    }

    /// A sleeper whose parent, a subshell of the owner, stays until [`Owner::release`]:
    /// then the sleeper is orphaned.
    fn held_orphan(&mut self) -> u32 {
        self.send("(sleep 1000 & echo $!; read -r x)");
        self.pid_line()
    }

    /// Lets the subshell of [`Owner::held_orphan`] exit.
    fn release(&mut self) {
        self.send("x");
    }

    /// A sleeper whose parent subshell exits at once.
    fn orphan(&mut self) -> u32 {
        self.send("(sleep 1000 & echo $!)");
        self.pid_line()
    }

    fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.sigkill();
        for &(pid, start) in &self.spawned {
            kill_if_same(pid, start);
        }
    }
}

fn kill_if_same(pid: u32, start: u64) {
    if start_ticks(pid) == Some(start) {
        // SAFETY: signalling a process this test started, checked by its start time.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

fn ppid(pid: u32) -> u32 {
    proc_root().stat(pid).expect("stat").ppid
}

/// Waits until `pid`'s parent is neither the owner nor a child of it: it was orphaned.
fn wait_orphaned(owner: &Owner, pid: u32) {
    let out_of_tree = eventually(PATIENCE, || {
        let parent = ppid(pid);
        parent != owner.pid
            && proc_root()
                .stat(parent)
                .map_or(true, |p| p.ppid != owner.pid)
    });
    assert!(
        out_of_tree,
        "{pid} was not reparented out of the owner's tree"
    );
}

fn register(daemon: &Daemon, session: &str, owner: &Owner) {
    let reply = daemon.request(json!({
        "op": "register", "session": session, "owner": {"pid": owner.pid}
    }));
    assert_eq!(reply["ok"], true, "register: {reply}");
}

/// The id of the session `whose --pid` names, through the CLI.
fn whose(daemon: &Daemon, pid: u32) -> Value {
    whose_session(daemon, pid)["id"].clone()
}

/// The session `whose --pid --json` prints.
fn whose_session(daemon: &Daemon, pid: u32) -> Value {
    let out = daemon.cli(&["whose", "--pid", &pid.to_string(), "--json"]);
    assert!(
        out.status.success(),
        "whose --pid {pid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("whose --json output")
}

/// The pids `processes --session` lists, through the CLI.
fn processes(daemon: &Daemon, session: &str) -> Vec<u32> {
    let out = daemon.cli(&["processes", "--session", session, "--json"]);
    assert!(
        out.status.success(),
        "processes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).expect("processes --json");
    listed
        .iter()
        .map(|p| p["identity"]["pid"].as_u64().expect("pid") as u32)
        .collect()
}

fn wait_listed(daemon: &Daemon, session: &str, pid: u32) {
    let mut last = Vec::new();
    let listed = eventually(PATIENCE, || {
        last = processes(daemon, session);
        last.contains(&pid)
    });
    assert!(
        listed,
        "{pid} never listed among {session}'s processes: {last:?}"
    );
}

/// `(pid, start_ticks)` of each listed survivor.
fn survivor_keys(survivors: &Value) -> Vec<(u32, u64)> {
    survivors["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no survivors list: {survivors}"))
        .iter()
        .map(|m| {
            (
                m["pid"].as_u64().unwrap() as u32,
                m["start_ticks"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The `session.ended` event of `session`, from a replay of the whole stream.
fn ended_event(daemon: &Daemon, session: &str) -> Value {
    let mut conn = daemon.connect();
    let reply = conn.request(json!({"op": "subscribe", "since": 0, "session": session}));
    assert_eq!(reply["ok"], true, "subscribe: {reply}");
    loop {
        let line = conn
            .next_within(PATIENCE)
            .unwrap_or_else(|| panic!("no session.ended event for {session}"));
        if line["event"]["kind"] == "session.ended" {
            return line["event"].clone();
        }
    }
}

/// Kills the owner and checks that `expected` are survivors, in the stored session and in
/// its ended event, and `gone` and the dead owner are not.
fn kill_owner_and_check_survivors(
    daemon: &Daemon,
    session: &str,
    owner: &mut Owner,
    expected: &[u32],
    gone: &[u32],
) {
    let keys: Vec<(u32, u64)> = expected
        .iter()
        .map(|&pid| (pid, start_ticks(pid).expect("a survivor-to-be is alive")))
        .collect();
    owner.sigkill();
    let ended = daemon.wait_ended(session);
    let event = ended_event(daemon, session);
    for (what, survivors) in [
        ("session", &ended["survivors"]),
        ("event", &event["survivors"]),
    ] {
        let listed = survivor_keys(survivors);
        for key in &keys {
            assert!(
                listed.contains(key),
                "{what}: {key:?} not among {survivors}"
            );
        }
        for pid in gone.iter().chain([&owner.pid]) {
            assert!(
                !listed.iter().any(|(p, _)| p == pid),
                "{what}: dead {pid} reported alive: {survivors}"
            );
        }
        assert!(
            survivors["total"].as_u64().unwrap() as usize >= keys.len(),
            "{what}: total {survivors}"
        );
    }
}

/// An orphan of a process forked before `session` was registered, and one forked after,
/// both reparented out of the owner's tree. The second one's parent stays until the
/// daemon lists it: a scan misses a process forked and orphaned between two scans.
fn orphans_around_registration(daemon: &Daemon, session: &str, owner: &mut Owner) -> (u32, u32) {
    let before = owner.held_orphan();
    register(daemon, session, owner);
    owner.release();
    let after = owner.held_orphan();
    wait_listed(daemon, session, after);
    owner.release();
    wait_orphaned(owner, before);
    wait_orphaned(owner, after);
    (before, after)
}

fn membership_mode(daemon: &Daemon) -> Value {
    let reply = daemon.request(json!({"op": "status"}));
    reply["status"]["membership"]["mode"].clone()
}

#[test]
fn orphans_left_before_and_after_registration_stay_in_the_tree() {
    if !privileged("orphans in the kernel's tree") {
        return;
    }
    let daemon = Daemon::start(&[]);
    assert_eq!(membership_mode(&daemon), "kernel");
    let mut owner = Owner::spawn();
    let before = owner.held_orphan();
    register(&daemon, "agent", &owner);
    owner.release();
    // Forked after registration, orphaned at once: only the kernel's fork tracking sees it.
    let after = owner.orphan();
    wait_orphaned(&owner, before);
    wait_orphaned(&owner, after);

    for pid in [before, after] {
        assert_eq!(whose(&daemon, pid), "agent", "whose --pid {pid}");
    }
    let listed = processes(&daemon, "agent");
    for pid in [owner.pid, before, after] {
        assert!(listed.contains(&pid), "{pid} not in {listed:?}");
    }
    // The two orphans hold a member slot each once their subshells are gone; the owner's
    // own entry takes none.
    wait_kernel_used(&daemon, 2);
    kill_owner_and_check_survivors(&daemon, "agent", &mut owner, &[before, after], &[]);
    // A tree nobody follows gives its slots back, its live members' too.
    wait_kernel_used(&daemon, 0);
}

/// Waits until `status.membership.kernel_used` is `expected`.
fn wait_kernel_used(daemon: &Daemon, expected: u64) {
    let mut last = Value::Null;
    let reached = eventually(PATIENCE, || {
        last = daemon.request(json!({"op": "status"}))["status"]["membership"].clone();
        last["kernel_used"] == expected
    });
    assert!(reached, "kernel_used never {expected}: {last}");
}

/// A child that exited before registration but was not reaped yet (a zombie) is in
/// `/proc`, so the registration walk finds it. Written to the kernel's map after its exit,
/// its entry had no exit to remove it, and it was reported as a survivor of the owner.
#[test]
fn a_zombie_found_at_registration_is_not_a_survivor() {
    if !privileged("zombies in the kernel's tree") {
        return;
    }
    let daemon = Daemon::start(&[]);
    assert_eq!(membership_mode(&daemon), "kernel");
    // Once the shell has exec'd `sleep`, nothing in the owner ever waits: a child killed
    // then stays its zombie (the shell itself may reap one that dies before the exec).
    // The other child keeps the tree from being empty, so the whole kernel map is read.
    let mut owner = Command::new("sh")
        .arg("-c")
        .arg("sleep 1000 & z=$!; sleep 1000 & echo $z $!; exec sleep 1000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sh");
    let mut line = String::new();
    BufReader::new(owner.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the children's pids");
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(|pid| pid.parse().expect("a pid"))
        .collect();
    let [zombie, alive] = pids[..] else {
        panic!("the owner printed {line:?}, not two pids");
    };
    let alive_key = (
        alive,
        start_ticks(alive).expect("the sleeping child is alive"),
    );
    let owner_pid = owner.id();
    let exec_done = eventually(PATIENCE, || {
        proc_root()
            .stat(owner_pid)
            .is_ok_and(|stat| stat.comm == "sleep")
    });
    assert!(exec_done, "the owner shell did not exec sleep");
    kill_if_same(
        zombie,
        start_ticks(zombie).expect("the child to kill is alive"),
    );
    let exited = eventually(PATIENCE, || {
        proc_root().stat(zombie).is_ok_and(|stat| stat.has_exited())
    });
    assert!(
        exited,
        "{zombie} did not become a zombie of the owner: {:?}",
        proc_root().stat(zombie)
    );
    let reply = daemon.request(json!({
        "op": "register", "session": "zombie", "owner": {"pid": owner.id()}
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    let _ = owner.kill();
    let _ = owner.wait();
    let ended = daemon.wait_ended("zombie");
    kill_if_same(alive_key.0, alive_key.1);
    let event = ended_event(&daemon, "zombie");
    for (what, survivors) in [
        ("session", &ended["survivors"]),
        ("event", &event["survivors"]),
    ] {
        let listed = survivor_keys(survivors);
        assert!(
            listed.contains(&alive_key),
            "{what}: {alive} not among {survivors}"
        );
        assert!(
            !listed.iter().any(|(pid, _)| *pid == zombie),
            "{what}: the zombie {zombie} reported alive: {survivors}"
        );
    }
}

#[test]
fn threads_are_not_members_of_a_tree() {
    if !privileged("threads in the kernel's tree") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut owner = Owner::spawn();
    register(&daemon, "threads", &owner);
    let testproc = binary("testproc");
    // The sleep only holds the pipeline open; it ends on its own after the test.
    owner.send(&format!(
        "sleep 120 | {} threads-wait 3 & echo $!",
        testproc.display()
    ));
    // The pid line and the thread-id line come in either order.
    let (first, second) = (owner.line(), owner.line());
    let (pid_line, tids) = if first.contains(' ') {
        (second, first)
    } else {
        (first, second)
    };
    let pid: u32 = pid_line.parse().expect("pid");
    owner.spawned.push((pid, start_ticks(pid).expect("alive")));
    let tids: Vec<u32> = tids.split(' ').map(|t| t.parse().expect("tid")).collect();
    assert_eq!(tids.len(), 3);

    wait_listed(&daemon, "threads", pid);
    let listed = processes(&daemon, "threads");
    for tid in &tids {
        assert!(
            !listed.contains(tid),
            "thread {tid} listed as a process: {listed:?}"
        );
    }
    let reply = daemon.request(json!({"op": "status"}));
    let members = reply["status"]["membership"]["members"].as_u64().unwrap();
    // sleep and testproc (and maybe a subshell for the pipeline): never the 3 threads.
    assert!(
        members <= 3,
        "{members} members for 2 or 3 processes: {reply}"
    );
}

#[test]
fn a_tree_survives_a_daemon_restart() {
    let daemon_args: &[&str] = if privileged("membership across a restart") {
        &[]
    } else {
        &["--sources", "pidfd"]
    };
    let mut daemon = Daemon::start(daemon_args);
    let mut owner = Owner::spawn();
    let (kept, dies) = orphans_around_registration(&daemon, "restart", &mut owner);

    daemon.stop();
    let dies_start = start_ticks(dies).expect("alive");
    kill_if_same(dies, dies_start);
    assert!(
        eventually(PATIENCE, || start_ticks(dies) != Some(dies_start)
            || proc_root().stat(dies).is_ok_and(|s| s.state == 'Z')),
        "{dies} did not die"
    );
    daemon.restart();

    assert_eq!(
        whose(&daemon, kept),
        "restart",
        "an orphan kept across the restart"
    );
    let listed = processes(&daemon, "restart");
    assert!(listed.contains(&kept), "{kept} not in {listed:?}");
    assert!(
        !listed.contains(&dies),
        "dead {dies} listed alive: {listed:?}"
    );
    // The tree is followed again: a process forked now joins it.
    let later = owner.held_orphan();
    wait_listed(&daemon, "restart", later);
    owner.release();
    wait_orphaned(&owner, later);
    assert_eq!(whose(&daemon, later), "restart");
    kill_owner_and_check_survivors(&daemon, "restart", &mut owner, &[kept, later], &[dies]);
}

#[test]
fn without_ebpf_a_proc_scan_finds_the_tree() {
    let daemon = Daemon::start(&["--sources", "pidfd"]);
    assert_eq!(membership_mode(&daemon), "scan");
    let mut owner = Owner::spawn();
    let (before, after) = orphans_around_registration(&daemon, "scanned", &mut owner);

    for pid in [before, after] {
        assert_eq!(whose(&daemon, pid), "scanned", "whose --pid {pid}");
    }
    kill_owner_and_check_survivors(&daemon, "scanned", &mut owner, &[before, after], &[]);
}

/// An owner inside another session's tree (a nested session): while it is tracked, the
/// processes it forks join its own tree, and are in the outer tree too; once its session
/// ends, while it lives on, they stay in the outer tree, and what it forks joins the outer
/// tree again, even when orphaned at once. A restart changes none of it, and the outer
/// session's `terminate` ends them all.
#[test]
fn a_nested_session_has_its_own_tree_and_gives_the_owner_back_at_its_end() {
    if !privileged("nested trees in the kernel") {
        return;
    }
    let mut daemon = Daemon::start(&[]);
    assert_eq!(membership_mode(&daemon), "kernel");
    let dir = tempfile::tempdir().expect("a temporary directory");
    // One fifo per turn: a reader opening a fifo while the last turn's writer still has it
    // open would read its end of file as a turn.
    let turns = ["first", "second"].map(|turn| dir.path().join(turn));
    for fifo in &turns {
        let made = Command::new("mkfifo")
            .arg(fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo {}", fifo.display());
    }
    let turn = |fifo: &std::path::Path| {
        std::fs::write(fifo, "x\n").expect("write to the inner owner's fifo");
    };

    let mut owner = Owner::spawn();
    let reply = daemon.request(json!({
        "op": "register", "session": "outer", "owner": {"pid": owner.pid},
        "on_end": "terminate", "grace_ms": 100
    }));
    assert_eq!(reply["ok"], true, "register the outer session: {reply}");
    // The inner owner: a member of the outer tree, which forks a sleep at its first turn
    // and an orphaned one at its second.
    owner.send(&format!(
        "sh -c 'echo $$; read -r x < {}; sleep 1000 & echo $!; read -r x < {}; (sleep 1000 & echo $!); exec sleep 1000' &",
        turns[0].display(),
        turns[1].display()
    ));
    let inner_owner = owner.pid_line();
    wait_listed(&daemon, "outer", inner_owner);
    let reply = daemon.request(json!({
        "op": "register", "session": "inner", "owner": {"pid": inner_owner}
    }));
    assert_eq!(reply["ok"], true, "register the inner session: {reply}");

    turn(&turns[0]);
    let inner_child = owner.pid_line();
    wait_listed(&daemon, "inner", inner_child);
    assert_eq!(whose(&daemon, inner_child), "inner");
    wait_listed(&daemon, "outer", inner_child);

    let reply = daemon.request(json!({"op": "end", "session": "inner"}));
    assert_eq!(reply["ok"], true, "end the inner session: {reply}");
    turn(&turns[1]);
    let orphan = owner.pid_line();
    wait_orphaned(&owner, orphan);
    wait_listed(&daemon, "outer", orphan);
    for pid in [orphan, inner_child] {
        assert_eq!(whose(&daemon, pid), "outer", "whose --pid {pid}");
    }
    wait_listed(&daemon, "outer", inner_child);

    // Persisted in the outer tree before the stop (a refresh a second).
    std::thread::sleep(Duration::from_millis(1500));
    daemon.stop();
    daemon.restart();
    for pid in [orphan, inner_child, inner_owner] {
        assert_eq!(
            whose(&daemon, pid),
            "outer",
            "after a restart, whose --pid {pid}"
        );
    }

    let processes: Vec<(u32, u64)> = [orphan, inner_child, inner_owner]
        .iter()
        .map(|&pid| (pid, start_ticks(pid).expect("alive")))
        .collect();
    owner.sigkill();
    let ended = daemon.wait_ended("outer");
    let survivors = survivor_keys(&ended["survivors"]);
    for key in &processes {
        assert!(survivors.contains(key), "{key:?} not among {survivors:?}");
    }
    for (pid, start) in processes {
        let ended = eventually(PATIENCE, || {
            start_ticks(pid) != Some(start) || state(pid) == Some('Z')
        });
        assert!(ended, "the outer session's terminate left {pid} running");
    }
}

/// An owner the kernel cannot track (its map of tracked processes full) has no entry of its
/// own there, so the kernel adds nothing it forks: its tree is scanned in `/proc` instead,
/// and status says so.
#[test]
fn the_tree_of_an_owner_the_kernel_cannot_track_is_scanned() {
    if !privileged("an owner beyond the kernel's map") {
        return;
    }
    let daemon = Daemon::start(&["--ebpf-max-tracked", "1"]);
    let first = Owner::spawn();
    register(&daemon, "in-kernel", &first);
    assert_eq!(membership_mode(&daemon), "kernel");
    let mut second = Owner::spawn();
    register(&daemon, "beyond", &second);
    let ebpf = daemon.source_status("ebpf");
    assert_eq!(
        ebpf["stats"]["refused"], 1,
        "the second owner is refused: {ebpf}"
    );
    assert_eq!(membership_mode(&daemon), "kernel_and_scan");

    // Forked after registration, orphaned once a scan has seen it.
    let orphan = second.held_orphan();
    wait_listed(&daemon, "beyond", orphan);
    second.release();
    wait_orphaned(&second, orphan);
    assert_eq!(whose(&daemon, orphan), "beyond");
    kill_owner_and_check_survivors(&daemon, "beyond", &mut second, &[orphan], &[]);
    drop(first);
}

/// A line-driven helper process (`testproc MODE`), killed on drop.
struct Helper {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Helper {
    fn spawn(mode: &str) -> Helper {
        let mut child = Command::new(binary("testproc"))
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn testproc");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Helper {
            child,
            input,
            output,
        }
    }

    fn ask(&mut self, line: &str) -> String {
        writeln!(self.input, "{line}").expect("write to testproc");
        self.line()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.output.read_line(&mut line).expect("read testproc");
        line.trim().to_owned()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A member that died, and a process outside the tree that took its pid within the
/// member's clock tick (so with its start time): `(owner, session, stranger)`.
fn stranger_with_a_members_pid_and_start(
    daemon: &Daemon,
    strangers: &mut Helper,
    made: &mut Vec<(u32, u64)>,
) -> (Helper, String, u32) {
    // Everything from the member's fork to the stranger's must fit in one 10 ms tick,
    // a registration included: a busy machine needs a few tries.
    for attempt in 0..100 {
        let session = format!("reuse-{attempt}");
        let mut owner = Helper::spawn("reuse");
        let member: u32 = owner.line().parse().expect("the member's pid");
        let member_start = start_ticks(member).expect("the member is alive");
        let reply = daemon.request(json!({
            "op": "register", "session": session, "owner": {"pid": owner.child.id()},
            "on_end": "terminate", "grace_ms": 100
        }));
        assert_eq!(reply["ok"], true, "register: {reply}");
        assert_eq!(owner.ask("go"), "reaped");
        let answer = strangers.ask(&member.to_string());
        if let Ok(pid) = answer.parse::<u32>() {
            let start = start_ticks(pid).expect("the stranger is alive");
            made.push((pid, start));
            if start == member_start {
                return (owner, session, pid);
            }
        }
        let reply = daemon.request(json!({"op": "end", "session": session}));
        assert_eq!(reply["ok"], true, "end: {reply}");
    }
    panic!("no stranger took a member's pid within its clock tick in 100 tries");
}

/// A member dies and a process outside the tree takes its pid within the same clock tick:
/// it has the member's pid and start time, but not its pidfs inode. It is never named by
/// `whose`, listed by `processes` (before and after a refresh), reported as a survivor, or
/// signalled by the `terminate` policy.
#[test]
fn a_stranger_that_took_a_members_pid_in_its_tick_is_no_member() {
    if !privileged("a member's pid reused within its tick") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut strangers = Helper::spawn("stranger");
    let mut made = Vec::new();
    let (mut owner, session, stranger) =
        stranger_with_a_members_pid_and_start(&daemon, &mut strangers, &mut made);
    let check = |when: &str| {
        let reply = daemon.request(json!({"op": "whose", "pid": stranger}));
        assert_eq!(
            reply["ok"], false,
            "{when}: whose names the stranger: {reply}"
        );
        let listed = processes(&daemon, &session);
        assert!(
            !listed.contains(&stranger),
            "{when}: the stranger {stranger} is listed: {listed:?}"
        );
    };
    check("at once");
    // A refresh of the trees (every second) checks every member again.
    std::thread::sleep(Duration::from_millis(1500));
    check("after a refresh");

    let key = (stranger, start_ticks(stranger).expect("alive"));
    let _ = owner.child.kill();
    let _ = owner.child.wait();
    let ended = daemon.wait_ended(&session);
    assert!(
        !survivor_keys(&ended["survivors"]).contains(&key),
        "the stranger is a survivor: {ended}"
    );
    // Past the grace: a SIGTERM or SIGKILL of the policy would have ended it by now.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        start_ticks(stranger),
        Some(key.1),
        "the terminate policy signalled the stranger"
    );
    assert_ne!(state(stranger), Some('Z'), "the stranger was killed");
    for (pid, start) in made {
        kill_if_same(pid, start);
    }
}

/// `status.membership` now.
fn membership(daemon: &Daemon) -> Value {
    daemon.request(json!({"op": "status"}))["status"]["membership"].clone()
}

/// Waits until the membership mode is `expected`.
fn wait_mode(daemon: &Daemon, expected: &str) -> Value {
    let mut last = Value::Null;
    let reached = eventually(PATIENCE, || {
        last = membership(daemon);
        last["mode"] == expected
    });
    assert!(
        reached,
        "the membership mode never became {expected}: {last}"
    );
    last
}

/// The kernel's members map is walked (two system calls per entry, every owner's own
/// included) only once the kernel added members: owners whose trees are themselves alone
/// die, and neither their deaths nor the refreshes meanwhile read the map; a fork in a
/// tree makes the next read walk it, and finds the child.
#[test]
fn the_members_map_is_walked_only_after_the_kernel_added_members() {
    if !privileged("walks of the kernel's members map") {
        return;
    }
    let daemon = Daemon::start(&["--sources", "ebpf"]);
    let mut owners: Vec<Owner> = (0..5).map(|_| Owner::spawn()).collect();
    for (i, owner) in owners.iter().enumerate() {
        register(&daemon, &format!("lone-{i}"), owner);
    }
    let walks = || {
        membership(&daemon)["kernel_walks"]
            .as_u64()
            .expect("kernel_walks, with eBPF")
    };
    // Two refreshes (a second apart) take in whatever the registrations changed.
    std::thread::sleep(Duration::from_millis(2500));
    let before = walks();
    for (i, owner) in owners.iter_mut().enumerate().skip(1) {
        owner.sigkill();
        daemon.wait_ended(&format!("lone-{i}"));
    }
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        walks(),
        before,
        "deaths of owners with no member, or the refreshes meanwhile, walked the map"
    );
    let child = owners[0].orphan();
    wait_listed(&daemon, "lone-0", child);
    assert!(
        walks() > before,
        "a member the kernel added was found without a walk?"
    );
}

/// A round of the activity sampler walks the kernel's members map once for all the
/// sessions it samples, not once each (with 10,000 sessions, walks of a map as big as the
/// machine's processes took a round past a minute, which a stop then waited for). A tree
/// forks all the time, so that the kernel has always added members since the trees last
/// took them in: three seconds of rounds a second and of refreshes walk the map a few
/// times, where one round session by session walks it as many times as there are sessions.
#[test]
fn a_round_of_the_activity_sampler_walks_the_members_map_once() {
    if !privileged("walks of the kernel's members map") {
        return;
    }
    const SESSIONS: u64 = 40;
    let daemon = Daemon::start(&["--sources", "ebpf", "--activity-interval", "1s"]);
    let mut owners: Vec<Owner> = (0..SESSIONS).map(|_| Owner::spawn()).collect();
    for (i, owner) in owners.iter().enumerate() {
        register(&daemon, &format!("sampled-{i}"), owner);
    }
    owners[0].send("(while :; do sleep 0.02; done) & echo $!");
    owners[0].pid_line();
    let walks = || {
        membership(&daemon)["kernel_walks"]
            .as_u64()
            .expect("kernel_walks, with eBPF")
    };
    let before = walks();
    std::thread::sleep(Duration::from_secs(3));
    let walked = walks() - before;
    assert!(
        walked < SESSIONS,
        "{walked} walks of the members map in 3 s of rounds over {SESSIONS} sessions"
    );
}

/// With a members map of five slots, five sleepers fill it: a process forked then (a
/// `testproc family`, its middle process and first member) is refused a slot, found by a
/// scan, and counted once in `kernel_full`. Once the sleepers are gone, a refresh gives the
/// refused members their entries back and the mode is `kernel` again: what such a member
/// forks and orphans at once is a member.
#[test]
fn members_refused_a_slot_get_one_back_once_slots_are_free() {
    if !privileged("members refused a kernel slot") {
        return;
    }
    let daemon = Daemon::start(&["--ebpf-max-members", "5"]);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    for fifo in [&input, &output] {
        let made = Command::new("mkfifo").arg(fifo).status().expect("mkfifo");
        assert!(made.success(), "mkfifo {}", fifo.display());
    }
    let mut owner = Owner::spawn();
    register(&daemon, "storm", &owner);
    owner.send("s=; for i in 1 2 3 4 5; do sleep 1000 & s=\"$s $!\"; done; echo $s");
    for pid in owner.line().split(' ') {
        let pid = pid.parse().expect("a pid");
        owner.spawned.push((pid, start_ticks(pid).expect("alive")));
    }
    wait_kernel_used(&daemon, 5);

    owner.send(&format!(
        "{} family < {} > {} & echo $!",
        binary("testproc").display(),
        input.display(),
        output.display()
    ));
    let family = owner.pid_line();
    let mut commands = std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .expect("open the family's input");
    let mut replies = BufReader::new(std::fs::File::open(&output).expect("open its output"));
    let mut reply = |owner: &mut Owner| {
        let mut line = String::new();
        replies.read_line(&mut line).expect("read the family");
        let pid: u32 = line.trim().parse().expect("a pid");
        owner
            .spawned
            .push((pid, start_ticks(pid).expect("a member is alive")));
        pid
    };
    let before = reply(&mut owner);
    wait_listed(&daemon, "storm", family);
    wait_listed(&daemon, "storm", before);
    assert_eq!(membership(&daemon)["mode"], "kernel_and_scan");

    owner.send("kill $s");
    let status = wait_mode(&daemon, "kernel");
    // The family, its middle process and its first member: each refused once.
    assert_eq!(status["kernel_full"], 3, "{status}");
    wait_kernel_used(&daemon, 3);

    // The orphan and the middle process it is orphaned by take the two slots left.
    writeln!(commands, "orphan").expect("ask the family for an orphan");
    let orphan = reply(&mut owner);
    wait_orphaned(&owner, orphan);
    assert_eq!(whose(&daemon, orphan), "storm");
    wait_listed(&daemon, "storm", orphan);
}

/// An orphan left running by a session that ended (the default `leave` policy) is still
/// placed: `whose` names the ended session and says it ended, and the text `get` lists the
/// survivors.
#[test]
fn whose_names_the_ended_session_an_orphan_survived() {
    if !privileged("survivors of an ended session") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut owner = Owner::spawn();
    register(&daemon, "left", &owner);
    let orphan = owner.orphan();
    wait_orphaned(&owner, orphan);
    kill_owner_and_check_survivors(&daemon, "left", &mut owner, &[orphan], &[]);

    let reply = whose_session(&daemon, orphan);
    assert_eq!(reply["id"], "left", "{reply}");
    assert_eq!(reply["phase"], "ended", "{reply}");
    assert!(reply["ended_ms"].is_u64(), "{reply}");

    let out = daemon.cli(&["whose", "--pid", &orphan.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("left ended") && text.contains(&format!("left PID {orphan} running")),
        "whose --pid {orphan}: {text}"
    );
    let out = daemon.cli(&["get", "--session", "left"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Survivors: 1 process") && text.contains(&format!("(pid {orphan}")),
        "get left: {text}"
    );
}

/// A child the owner makes with `CLONE_PARENT` has the owner's parent for its parent: the
/// kernel's fork program sees who forked it and makes it a member, while no walk of `/proc`
/// from the tree can reach it, which the scan mode's status says.
#[test]
fn a_clone_parent_child_is_a_member_in_the_kernel_and_a_stated_miss_of_scans() {
    let modes: &[&[&str]] = if privileged("CLONE_PARENT children in the kernel's tree") {
        &[&[], &["--sources", "pidfd"]]
    } else {
        &[&["--sources", "pidfd"]]
    };
    for &args in modes {
        let daemon = Daemon::start(args);
        let mut owner = Helper::spawn("sibling");
        let reply = daemon.request(json!({
            "op": "register", "session": "clone-parent", "owner": {"pid": owner.child.id()}
        }));
        assert_eq!(reply["ok"], true, "register: {reply}");
        let sibling: u32 = owner.ask("go").parse().expect("the sibling's pid");
        let key = (sibling, start_ticks(sibling).expect("alive"));
        assert_eq!(ppid(sibling), std::process::id(), "not the owner's sibling");
        let status = membership(&daemon);
        if status["mode"] == "kernel" {
            assert_eq!(whose(&daemon, sibling), "clone-parent");
            wait_listed(&daemon, "clone-parent", sibling);
        } else {
            // Two scans later it is still no member, as status says.
            std::thread::sleep(Duration::from_millis(2500));
            assert!(!processes(&daemon, "clone-parent").contains(&sibling));
            let misses = status["misses"].as_str().expect("misses");
            assert!(misses.contains("CLONE_PARENT"), "{status}");
        }
        kill_if_same(key.0, key.1);
        // SAFETY: reaping the sibling, this test's child by CLONE_PARENT.
        unsafe { libc::waitpid(key.0 as i32, std::ptr::null_mut(), 0) };
    }
}

/// One user's storm of forks (600 processes, a members map of 300) takes no more than its
/// share of the map: another user's process, forked and orphaned at once afterwards, is
/// still a member, placed by `whose` and ended by its session's `terminate`; status says
/// which uid is over its share.
#[test]
fn one_users_storm_leaves_the_kernel_map_to_other_users() {
    if !privileged("per-uid shares of the kernel map") {
        return;
    }
    const STORMER: u32 = 61_041;
    const OTHER: u32 = 61_042;
    let daemon = Daemon::start(&["--ebpf-max-members", "300"]);
    let mut storm = TestprocAs::spawn(STORMER, &["storm", "600"]);
    let reply = daemon.request(json!({
        "op": "register", "session": "storm", "owner": {"pid": storm.pid()}
    }));
    assert_eq!(reply["ok"], true, "register the storm: {reply}");
    writeln!(storm.to.as_mut().expect("stdin"), "go").expect("start the storm");
    assert_eq!(storm.read_line().as_deref(), Some("ready\n"));
    let status = membership(&daemon);
    assert_eq!(status["kernel_share_per_uid"], 75, "{status}");
    let over = &status["over_share"][0];
    assert_eq!(over["uid"], STORMER, "{status}");
    assert_eq!(over["used"], 75, "{status}");
    assert!(over["refused"].as_u64() >= Some(525), "{status}");

    let mut family = TestprocAs::spawn(OTHER, &["family"]);
    let first = family.read_line().expect("the family's first member");
    let first = Fingerprint::of(first.trim().parse().expect("a pid"));
    let reply = daemon.request(json!({
        "op": "register", "session": "other", "owner": {"pid": family.pid()},
        "on_end": "terminate", "grace_ms": 100
    }));
    assert_eq!(reply["ok"], true, "register the other user's: {reply}");
    writeln!(family.to.as_mut().expect("stdin"), "orphan").expect("ask for an orphan");
    let orphan = family.read_line().expect("the orphan's pid");
    let orphan = Fingerprint::of(orphan.trim().parse().expect("a pid"));
    assert_eq!(whose(&daemon, orphan.pid), "other");

    drop(family);
    daemon.wait_ended("other");
    let ended = eventually(PATIENCE, || !orphan.is_running());
    assert!(ended, "the other user's orphan survived its terminate");
    first.kill();
    orphan.kill();
}

/// Registers `session` for `owner`, lasting until its tree does.
fn register_until_tree(daemon: &Daemon, session: &str, owner: &Owner) {
    let reply = daemon.request(json!({
        "op": "register", "session": session, "owner": {"pid": owner.pid}, "until": "tree"
    }));
    assert_eq!(reply["ok"], true, "register: {reply}");
    assert_eq!(reply["session"]["until"], "tree", "{reply}");
}

/// The `session.ended` events of `session` in the whole stream.
fn ended_events(daemon: &Daemon, session: &str) -> usize {
    let mut conn = daemon.connect();
    let reply = conn.request(json!({"op": "subscribe", "since": 0, "session": session}));
    assert_eq!(reply["ok"], true, "subscribe: {reply}");
    let mut ended = 0;
    while let Some(line) = conn.next_within(Duration::from_millis(500)) {
        if line["event"]["kind"] == "session.ended" {
            ended += 1;
        }
    }
    ended
}

/// A session registered `until: "tree"` outlives its owner while members of its tree live,
/// whatever order they die in, and across a daemon restart; it ends once, when the last
/// one exits, with that one's status and reason `tree_exited` — in the kernel's mode and
/// with the scan fallback.
#[test]
fn a_session_until_tree_ends_with_its_last_process() {
    let modes: &[&[&str]] = if privileged("sessions until their tree") {
        &[&[], &["--sources", "pidfd"]]
    } else {
        &[&["--sources", "pidfd"]]
    };
    for &args in modes {
        let mut daemon = Daemon::start(args);
        let mut owner = Owner::spawn();
        register_until_tree(&daemon, "build", &owner);
        // Each listed before it is orphaned: a scan sees it under its parent.
        let mut held = || {
            let pid = owner.held_orphan();
            wait_listed(&daemon, "build", pid);
            owner.release();
            wait_orphaned(&owner, pid);
            pid
        };
        let (first, last) = (held(), held());
        let last_key = (last, start_ticks(last).expect("alive"));

        owner.sigkill();
        daemon.still_active("build", "after the owner's death");
        assert_eq!(
            whose(&daemon, first),
            "build",
            "a member while the tree lives"
        );
        kill_if_same(first, start_ticks(first).expect("alive"));
        daemon.still_active("build", "after a member's death");

        daemon.stop();
        daemon.restart();
        daemon.still_active("build", "after a restart");
        assert_eq!(start_ticks(last_key.0), Some(last_key.1));
        // SAFETY: signalling the test's own process, checked by its start time just above.
        unsafe { libc::kill(last_key.0 as i32, libc::SIGTERM) };
        let ended = daemon.wait_ended("build");
        assert_eq!(ended["reason"], "tree_exited", "{ended}");
        // A pidfd shows a status only once init has reaped the orphan, which may be late.
        let status = json!({"kind": "signaled", "signal": 15, "core_dumped": false});
        assert!(
            ended["exit"] == status || (!args.is_empty() && ended["exit"].is_null()),
            "the last member's status: {ended}"
        );
        assert_eq!(ended["survivors"]["total"], 0, "{ended}");
        assert_eq!(ended_events(&daemon, "build"), 1, "ended exactly once");
    }
}

/// `liveness run --until tree` waits for the whole tree of a launcher that exits first, and
/// exits with the last process's status, saying so when the launcher's differs. Eight run
/// at once: the deaths of the launchers, of their children and of the children's `sleep`
/// then come in every order and in shared batches, and the first member to die (sleep) is
/// never taken for the last.
#[test]
fn run_until_tree_waits_for_the_whole_tree() {
    if !privileged("run --until tree") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let started = std::time::Instant::now();
    let outs: Vec<(String, std::process::Output)> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..8)
            .map(|i| {
                let daemon = &daemon;
                scope.spawn(move || {
                    let session = format!("launcher-{i}");
                    let out = daemon.cli(&[
                        "run",
                        "--session",
                        &session,
                        "--until",
                        "tree",
                        "--",
                        "sh",
                        "-c",
                        "(sleep 1; exit 4) & exit 3",
                    ]);
                    (session, out)
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "run returned before the tree's last process exited"
    );
    for (session, out) in outs {
        assert_eq!(out.status.code(), Some(4), "{session}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("exited with 3") && stderr.contains("with 4"),
            "{session}: {stderr}"
        );
        let ended = daemon.session(&session);
        assert_eq!(ended["reason"], "tree_exited", "{ended}");
        assert_eq!(
            ended["exit"],
            json!({"kind": "exited", "code": 4}),
            "{ended}"
        );
    }
}

/// A process the owner started and that was orphaned before the session was registered is
/// placed by the kernel's lineages: `whose` names the session, `processes` lists it, and
/// the `terminate` policy ends it with the session.
#[test]
fn an_orphan_made_before_registration_is_placed_by_its_lineage() {
    if !privileged("lineage from before registration") {
        return;
    }
    let daemon = Daemon::start(&[]);
    // Unpinned unless asked: status says the lineages go with this daemon, and why.
    let membership = membership(&daemon);
    assert!(
        membership["lineage_unpinned"]
            .as_str()
            .is_some_and(|why| why.contains("--ebpf-pin-dir")),
        "{membership}"
    );
    assert_eq!(membership["lineage_pins"], Value::Null, "{membership}");
    let mut owner = Owner::spawn();
    let orphan = owner.orphan();
    wait_orphaned(&owner, orphan);
    let reply = daemon.request(json!({
        "op": "register", "session": "late", "owner": {"pid": owner.pid},
        "on_end": "terminate", "grace_ms": 100
    }));
    assert_eq!(reply["ok"], true, "register: {reply}");
    assert_eq!(whose(&daemon, orphan), "late");
    let listed = processes(&daemon, "late");
    assert!(listed.contains(&orphan), "{orphan} not in {listed:?}");

    let key = (orphan, start_ticks(orphan).expect("alive"));
    owner.sigkill();
    let ended = daemon.wait_ended("late");
    assert!(survivor_keys(&ended["survivors"]).contains(&key), "{ended}");
    let gone = eventually(PATIENCE, || {
        start_ticks(key.0) != Some(key.1) || state(key.0) == Some('Z')
    });
    assert!(gone, "the terminate policy left {orphan} running");
}

/// `processes` comes in pages (item 4 of the hardening issue: a request whose size a client
/// chooses is paged where it can be long): pages of 3 list the same processes, each once,
/// as the CLI's whole listing, and a bad cursor is refused.
#[test]
fn processes_come_in_pages_that_list_each_process_once() {
    if !privileged("processes_come_in_pages_that_list_each_process_once") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut tree = integration_tests::TestprocAs::spawn(0, &["tree", "7"]);
    assert_eq!(tree.read_line().as_deref(), Some("ready\n"));
    let reply =
        daemon.request(json!({"op": "register", "session": "big", "owner": {"pid": tree.pid()}}));
    assert_eq!(reply["ok"], true, "register: {reply}");
    let mut whole = Vec::new();
    assert!(
        eventually(PATIENCE, || {
            whole = processes(&daemon, "big");
            whole.len() == 8
        }),
        "the owner and its 7 children, listed: {whole:?}"
    );
    let (mut paged, mut after, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let mut request = json!({"op": "processes", "session": "big", "limit": 3});
        if let Some(after) = &after {
            request["after"] = json!(after);
        }
        let page = daemon.request(request);
        assert_eq!(page["ok"], true, "{page}");
        let listed = page["processes"].as_array().expect("processes");
        assert!(listed.len() <= 3, "a page of 3: {page}");
        paged.extend(
            listed
                .iter()
                .map(|p| p["identity"]["pid"].as_u64().unwrap() as u32),
        );
        pages += 1;
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3, "8 processes in pages of 3");
    assert_eq!(
        paged, whole,
        "the pages list the whole tree, by pid, each once"
    );
    let bad = daemon.request(json!({"op": "processes", "session": "big", "after": "x"}));
    assert_eq!(bad["error"]["code"], "invalid_request", "{bad}");
}

/// A bpffs directory of one test's own for `--ebpf-pin-dir`, removed at the end with
/// whatever the daemons left pinned there. Declared before the test's daemons, it is
/// dropped after they are stopped, and checks that the kernel then let go of every link it
/// held and of their programs: no test leaves programs running on the machine's forks.
struct PinRoot(std::path::PathBuf);

impl PinRoot {
    fn new(test: &str) -> PinRoot {
        PinRoot(format!("/sys/fs/bpf/liveness-test-{}-{test}", std::process::id()).into())
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        let links = integration_tests::pinned_links(&self.0);
        let removed = std::fs::remove_dir_all(&self.0);
        if std::thread::panicking() {
            return;
        }
        assert!(!self.0.exists(), "{} left: {removed:?}", self.0.display());
        assert!(
            released(&links),
            "pinned links still held once unpinned: {links:?}"
        );
    }
}

/// Whether the kernel lets go of every one of `links` and of their programs, soon: links are
/// freed a moment after their last holder goes.
fn released(links: &[integration_tests::PinnedLink]) -> bool {
    eventually(PATIENCE, || {
        links
            .iter()
            .all(|link| integration_tests::link_released(*link))
    })
}

/// A daemon that pins its lineage programs under `pins`, its membership status, and the
/// directory of its pin set.
fn start_pinned(pins: &PinRoot) -> (Daemon, Value, String) {
    let daemon = Daemon::start(&["--ebpf-pin-dir", pins.arg()]);
    let status = membership(&daemon);
    let pinned_in = status["lineage_pins"]
        .as_str()
        .unwrap_or_else(|| panic!("the lineage programs are not pinned: {status}"))
        .to_owned();
    (daemon, status, pinned_in)
}

/// Registers `owner` as `session`, ended with its tree by the `terminate` policy.
fn register_terminating(daemon: &Daemon, session: &str, owner: &Owner) {
    let reply = daemon.request(json!({
        "op": "register", "session": session, "owner": {"pid": owner.pid},
        "on_end": "terminate", "grace_ms": 100
    }));
    assert_eq!(reply["ok"], true, "register: {reply}");
}

/// With the lineage programs pinned (`--ebpf-pin-dir`), a process the owner started and
/// orphaned while no daemon ran is placed after the restart: for a session registered
/// before the stop and for one registered after the restart. `whose` names the session,
/// `processes` and the survivors list it, and `terminate` ends it. The restarted daemon
/// adopts the pinned programs once, so lineages stay complete since their first load.
#[test]
fn orphans_made_while_the_daemon_was_down_are_placed_after_its_restart() {
    if !privileged("lineage across a daemon restart") {
        return;
    }
    let pins = PinRoot::new("down");
    let (mut daemon, first, pinned_in) = start_pinned(&pins);
    assert!(first["lineage_since_ms"].is_i64(), "{first}");

    let mut registered = Owner::spawn();
    register_terminating(&daemon, "registered", &registered);
    let mut late = Owner::spawn();
    daemon.stop();
    // A set of another version (another object or layout), as an upgrade stopped halfway
    // leaves it: never adopted, and removed.
    let state_pins = std::path::Path::new(&pinned_in)
        .parent()
        .unwrap()
        .to_owned();
    let other_version = state_pins.join("0000000000000000");
    std::fs::create_dir(&other_version).expect("a set of another version");
    // While no daemon runs: a subshell forks a sleeper and exits, which orphans it.
    let orphans = [registered.orphan(), late.orphan()];
    wait_orphaned(&registered, orphans[0]);
    wait_orphaned(&late, orphans[1]);
    daemon.restart();

    let second = membership(&daemon);
    assert_eq!(second["lineage_pins"], pinned_in, "{second}");
    assert_eq!(
        second["lineage_since_ms"], first["lineage_since_ms"],
        "lineages are complete since the pinned programs' first load"
    );
    let sets = std::fs::read_dir(&state_pins)
        .expect("the state directory's pins")
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .count();
    assert_eq!(sets, 1, "one pin set for the state directory");
    assert_eq!(
        std::fs::read_link(state_pins.join("owner")).ok(),
        std::fs::canonicalize(&daemon.state_dir).ok(),
        "the pins name their state directory"
    );
    assert!(!other_version.exists(), "another version's set was kept");
    let log = daemon.log();
    assert_eq!(
        log.matches("adopted the pinned lineage programs").count(),
        1,
        "{log}"
    );
    register_terminating(&daemon, "late", &late);

    for ((session, owner), orphan) in [("registered", &mut registered), ("late", &mut late)]
        .into_iter()
        .zip(orphans)
    {
        assert_eq!(whose(&daemon, orphan), session, "whose --pid {orphan}");
        let listed = processes(&daemon, session);
        assert!(listed.contains(&orphan), "{orphan} not in {listed:?}");
        let key = (orphan, start_ticks(orphan).expect("alive"));
        owner.sigkill();
        let ended = daemon.wait_ended(session);
        assert!(survivor_keys(&ended["survivors"]).contains(&key), "{ended}");
        let gone = eventually(PATIENCE, || {
            start_ticks(key.0) != Some(key.1) || state(key.0) == Some('Z')
        });
        assert!(gone, "the terminate policy left {orphan} running");
    }

    // Refused while the daemon runs; once it is stopped, the programs and the map go.
    let state_dir = daemon.state_dir.clone();
    let unpin = || {
        Command::new(binary("livenessd"))
            .arg("--state-dir")
            .arg(&state_dir)
            .args(["--ebpf-pin-dir", pins.arg(), "--unpin"])
            .output()
            .expect("livenessd --unpin")
    };
    assert!(!unpin().status.success(), "--unpin beside a running daemon");
    daemon.stop();
    let out = unpin();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !std::path::Path::new(&pinned_in).exists(),
        "{pinned_in} left"
    );
}

/// A pin directory that is not on bpffs does not keep the daemon from starting: it runs
/// with lineages of its own life, and says why in status.
#[test]
fn a_daemon_that_cannot_pin_runs_unpinned_and_says_why() {
    if !privileged("lineage pins off bpffs") {
        return;
    }
    let elsewhere = tempfile::tempdir().expect("a directory off bpffs");
    let pins = elsewhere.path().join("pins");
    let daemon = Daemon::start(&["--ebpf-pin-dir", pins.to_str().unwrap()]);
    let membership = membership(&daemon);
    assert_eq!(membership["mode"], "kernel", "{membership}");
    assert!(membership["lineage_since_ms"].is_i64(), "{membership}");
    assert_eq!(membership["lineage_pins"], Value::Null, "{membership}");
    assert!(
        membership["lineage_unpinned"]
            .as_str()
            .is_some_and(|why| why.contains("not on a bpffs")),
        "{membership}"
    );
    assert!(!pins.exists(), "nothing is made off bpffs");
    let log = daemon.log();
    assert!(log.contains("the lineage programs are not pinned"), "{log}");
}

/// A pin set is adopted whole or not at all: one that lost a link (its program detached,
/// so lineages have a gap) is made again at the next start, and lineages are complete only
/// since then.
#[test]
fn a_pin_set_missing_a_link_is_made_again() {
    if !privileged("an incomplete lineage pin set") {
        return;
    }
    let pins = PinRoot::new("incomplete");
    let (mut daemon, first, pinned_in) = start_pinned(&pins);
    daemon.stop();
    let exit_link = std::path::Path::new(&pinned_in).join("lineage_exit");
    std::fs::remove_file(&exit_link).expect("remove the exit program's pin");
    // Lineage times are in ms: the new set's is a later one.
    std::thread::sleep(Duration::from_millis(20));
    daemon.restart();

    let second = membership(&daemon);
    assert_eq!(second["lineage_pins"], pinned_in, "{second}");
    assert!(
        second["lineage_since_ms"].as_i64() > first["lineage_since_ms"].as_i64(),
        "lineages complete since the new set only: {first} then {second}"
    );
    assert!(exit_link.exists(), "the exit program pinned again");
    let log = daemon.log();
    assert_eq!(
        log.matches("adopted the pinned lineage programs").count(),
        0,
        "{log}"
    );
    assert_eq!(
        log.matches("pinned the lineage programs: they outlive")
            .count(),
        2,
        "{log}"
    );
}

/// The directory of one state directory's pins, from the path of its set.
fn state_pins_of(set: &str) -> std::path::PathBuf {
    std::path::Path::new(set)
        .parent()
        .expect("a set's parent")
        .to_owned()
}

/// The directory of the pins of the state directory of `daemon`, which pinned its lineage
/// programs.
fn pinned_state_pins(daemon: &Daemon) -> std::path::PathBuf {
    state_pins_of(
        membership(daemon)["lineage_pins"]
            .as_str()
            .unwrap_or_else(|| panic!("not pinned: {}", daemon.log())),
    )
}

/// A daemon that starts removes the pins of state directories deleted since, so that their
/// programs stop running on every fork and exit, and says so, once per set; it keeps the
/// pins of a state directory that exists (another daemon's, stopped here) and leaves alone,
/// with a warning, every entry whose owner it cannot tell: junk, a symbolic link, a
/// directory with no owner record (as pinned before records were kept) or with one that
/// does not match its name. `status` and `liveness status` list them all.
#[test]
fn pins_of_a_deleted_state_directory_are_removed_at_the_next_start() {
    if !privileged("stale lineage pins") {
        return;
    }
    let pins = PinRoot::new("stale");
    let states = tempfile::tempdir().expect("state directories");
    let pinned = |name: &str| {
        let state_dir = states.path().join(name);
        let mut daemon =
            Daemon::start_with_state(Some(state_dir.clone()), &["--ebpf-pin-dir", pins.arg()]);
        let state_pins = pinned_state_pins(&daemon);
        daemon.stop();
        (state_dir, state_pins)
    };
    let (gone_state, gone_pins) = pinned("gone");
    let (kept_state, kept_pins) = pinned("kept");
    let gone_links = integration_tests::pinned_links(&gone_pins);
    let kept_links = integration_tests::pinned_links(&kept_pins);
    assert_eq!(
        gone_links.len(),
        2,
        "the fork and exit links: {gone_links:?}"
    );
    assert_eq!(
        kept_links.len(),
        2,
        "the fork and exit links: {kept_links:?}"
    );

    // What no daemon made, or an older one: each is left as it is.
    let root = std::path::Path::new(pins.arg());
    let junk = root.join("junk");
    std::fs::create_dir(&junk).expect("a junk directory");
    let link = root.join("state-0000000000000000");
    std::os::unix::fs::symlink(&kept_pins, &link).expect("a symbolic link");
    let (no_record, no_record_pins) = pinned("unrecorded");
    std::fs::remove_file(no_record_pins.join("owner")).expect("remove an owner record");
    std::fs::remove_dir_all(&no_record).expect("delete its state directory");
    std::fs::remove_dir_all(&gone_state).expect("delete a state directory");
    let garbled = root.join("state-1111111111111111");
    std::fs::create_dir(&garbled).expect("a directory");
    std::os::unix::fs::symlink(&gone_state, garbled.join("owner")).expect("a wrong record");

    let daemon = Daemon::start_with_state(
        Some(states.path().join("new")),
        &["--ebpf-pin-dir", pins.arg()],
    );
    let own_pins = pinned_state_pins(&daemon);
    assert!(
        !gone_pins.exists(),
        "the deleted state directory's pins were kept"
    );
    assert!(
        released(&gone_links),
        "their programs still run: {gone_links:?}"
    );
    assert!(
        kept_pins.exists(),
        "an existing state directory's pins were removed"
    );
    assert!(
        !kept_links
            .iter()
            .any(|link| integration_tests::link_released(*link)),
        "an existing state directory's programs were detached"
    );
    for left in [&junk, &link, &no_record_pins, &garbled] {
        assert!(
            std::fs::symlink_metadata(left).is_ok(),
            "{} removed",
            left.display()
        );
    }
    assert!(
        std::fs::symlink_metadata(&kept_pins).is_ok_and(|meta| meta.is_dir()),
        "the link's target is intact"
    );

    let log = daemon.log();
    let removed: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("for a state directory that no longer exists"))
        .collect();
    assert_eq!(removed.len(), 1, "{log}");
    assert!(
        removed[0].contains(&gone_pins.display().to_string())
            && removed[0].contains(&gone_state.display().to_string()),
        "{log}"
    );
    assert_eq!(
        log.matches("its owner is unknown").count(),
        4,
        "junk, the link, no record, a wrong record: {log}"
    );

    let listed = membership(&daemon)["pin_sets"].clone();
    let entry = |path: &std::path::Path| {
        listed
            .as_array()
            .expect("pin_sets")
            .iter()
            .find(|set| set["path"] == path.display().to_string())
            .unwrap_or_else(|| panic!("{} not in {listed}", path.display()))
            .clone()
    };
    let kept = entry(&kept_pins);
    assert_eq!(kept["state_dir_exists"], true, "{kept}");
    assert_eq!(
        kept["state_dir"],
        std::fs::canonicalize(&kept_state)
            .unwrap()
            .display()
            .to_string(),
        "{kept}"
    );
    assert_eq!(entry(&own_pins)["state_dir_exists"], true, "{listed}");
    for unknown in [&junk, &link, &no_record_pins, &garbled] {
        let unknown = entry(unknown);
        assert_eq!(unknown["state_dir"], Value::Null, "{unknown}");
        assert!(unknown["unknown_owner"].is_string(), "{unknown}");
    }
    assert_eq!(listed.as_array().unwrap().len(), 6, "{listed}");
    for command in ["status", "doctor"] {
        let out = daemon.cli(&[command]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!(
                "{} (state directory {})",
                kept_pins.display(),
                kept["state_dir"].as_str().unwrap()
            )),
            "liveness {command}: {text}"
        );
        assert!(
            text.contains("owner unknown, left as it is"),
            "liveness {command}: {text}"
        );
    }
}

/// A running daemon's pins are never removed by another daemon's start, even once the state
/// directory its owner record names is gone (as the record would then have them removed): it
/// holds a lock on them, and the daemon that starts says it left them. Stopped, it lets go
/// of the lock, and the next start removes them.
///
/// The directory is moved behind the link the daemon was started with, not deleted: a
/// daemon whose database is deleted stops within a second (its file check), which would let
/// go of the lock before the other daemon's start, as slow as loading eBPF, looks.
#[test]
fn a_running_daemons_pins_are_never_removed_as_stale() {
    if !privileged("a running daemon's lineage pins") {
        return;
    }
    use std::os::unix::fs::DirBuilderExt;
    let pins = PinRoot::new("running");
    let states = tempfile::tempdir().expect("state directories");
    let named = states.path().join("running");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&named)
        .expect("state directory");
    let link = states.path().join("link");
    std::os::unix::fs::symlink("running", &link).expect("link to the state directory");
    let mut running = Daemon::start_with_state(Some(link.clone()), &["--ebpf-pin-dir", pins.arg()]);
    let running_pins = pinned_state_pins(&running);
    let links = integration_tests::pinned_links(&running_pins);
    std::fs::rename(&named, states.path().join("moved")).expect("move the state directory");
    std::fs::remove_file(&link).expect("unlink");
    std::os::unix::fs::symlink("moved", &link).expect("link to the moved state directory");

    let mut other = Daemon::start_with_state(
        Some(states.path().join("other")),
        &["--ebpf-pin-dir", pins.arg()],
    );
    assert!(
        running.is_running(),
        "the running daemon stopped: {}",
        running.log()
    );
    assert!(
        running_pins.exists(),
        "a running daemon's pins were removed"
    );
    assert!(
        !links
            .iter()
            .any(|link| integration_tests::link_released(*link)),
        "a running daemon's programs were detached"
    );
    let log = other.log();
    assert!(
        log.contains("a running daemon holds them")
            && log.contains(&running_pins.display().to_string()),
        "{log}"
    );
    assert!(
        !log.contains("removed the lineage programs pinned"),
        "{log}"
    );
    other.stop();

    running.stop();
    let next = Daemon::start_with_state(
        Some(states.path().join("other")),
        &["--ebpf-pin-dir", pins.arg()],
    );
    assert!(!running_pins.exists(), "stale pins kept once unlocked");
    assert!(
        next.log().contains(
            "removed the lineage programs pinned for a state directory that no longer exists"
        ),
        "{}",
        next.log()
    );
}
