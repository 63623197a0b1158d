//! Containers and namespaces, made for real with `unshare` as root: clients in child PID
//! namespaces, a daemon in a time namespace, host names changed under a running daemon,
//! kernel threads, pidfd owners, and pids reused by a new process (within one clock tick).

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use integration_tests::{Daemon, Orphan, binary, privileged, start_ticks};
use liveness_client::Client;
use liveness_common::protocol::{ErrorCode, OwnerSpec, PidfdOwner, Request};
use liveness_common::request;
use serde_json::{Value, json};

const QUIET: Duration = Duration::from_millis(600);

/// Whether this test can make namespaces here (root, and `unshare` installed).
fn namespaces_allowed(test: &str) -> bool {
    if !privileged(test) {
        return false;
    }
    let found = Path::new("/usr/bin/unshare").exists() || Path::new("/bin/unshare").exists();
    assert!(found, "{test}: unshare (util-linux) is needed");
    true
}

/// Asserts the session stays active for a while (no false death).
fn stays_active(daemon: &Daemon, session: &str) {
    std::thread::sleep(QUIET);
    let session_now = daemon.session(session);
    assert_eq!(
        session_now["phase"], "active",
        "{session} ended while its owner lives: {session_now}"
    );
}

fn cli_ok(daemon: &Daemon, args: &[&str]) -> Value {
    let out = daemon.cli(args);
    assert!(
        out.status.success(),
        "liveness {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "liveness {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A direct child that lives until dropped or [`Held::end`]ed.
struct Held {
    child: Child,
    pid: u32,
    ticks: u64,
}

impl Held {
    fn spawn() -> Held {
        let child = Command::new(binary("testproc"))
            .args(["exit", "0"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn testproc");
        let pid = child.id();
        let ticks = start_ticks(pid).expect("the child's start time");
        Held { child, pid, ticks }
    }

    /// Kills and reaps it: its pid is free again.
    fn end(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new process with `pid`, the pid of a process that has died and been reaped: made by
/// setting `ns_last_pid` (root) just before forking. Other processes may fork in between,
/// so `None` means try again.
fn respawn_at(pid: u32) -> Option<Held> {
    std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
        .expect("write ns_last_pid (needs root)");
    let held = Held::spawn();
    (held.pid == pid).then_some(held)
}

/// Whether this kernel gives pidfds a pidfs inode (Linux 6.9+).
fn kernel_has_pidfs() -> bool {
    let own = rustix::process::getpid();
    let pidfd = rustix::process::pidfd_open(own, rustix::process::PidfdFlags::empty())
        .expect("pidfd_open of ourselves");
    liveness_proc::pidfd::pidfs_ino(pidfd.as_fd()).is_some()
}

/// `sh -c SCRIPT` as pid 1 of a new PID namespace with its own /proc, like a container,
/// with the binaries in $LIVENESS and $TESTPROC and the daemon's socket in $SOCK and
/// $LIVENESS_SOCKET.
fn in_a_new_pid_namespace(daemon: &Daemon, script: &str) -> Command {
    let mut command = Command::new("unshare");
    command
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            script,
        ])
        .env("LIVENESS", binary("liveness"))
        .env("TESTPROC", binary("testproc"))
        .env("SOCK", &daemon.socket)
        .env("LIVENESS_SOCKET", &daemon.socket);
    command
}

#[test]
fn a_client_in_a_child_pid_namespace_registers_by_pid_and_by_pidfd() {
    if !namespaces_allowed("a_client_in_a_child_pid_namespace_registers_by_pid_and_by_pidfd") {
        return;
    }
    let daemon = Daemon::start(&[]);
    // In the new namespace the shell is pid 1, so its first child, `sleep`, is pid 2: the
    // number of the host's kthreadd.
    let script = r#"
        sleep 1000 &
        # Until the fork has exec'd, pid 2 is still a copy of this shell.
        until [ "$(cat /proc/2/comm)" = sleep ]; do :; done
        echo "{\"owner\": $!}"
        "$LIVENESS" --socket "$SOCK" register --session by-pidfd --owner-pid 2 --json
        "$TESTPROC" request "$SOCK" '{"op":"register","session":"by-pid","owner":{"pid":2}}'
        "$TESTPROC" request "$SOCK" '{"op":"register","session":"nobody","owner":{"pid":999}}'
        "$TESTPROC" request "$SOCK" '{"op":"whose","pid":2}'
        ID=$("$LIVENESS" check --pid 2 --json)
        echo "$ID"
        "$LIVENESS" --socket "$SOCK" register --session by-identity --owner-identity "$ID" --json
        echo '{"done": true}'
        wait
    "#;
    let mut container = in_a_new_pid_namespace(&daemon, script)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run unshare");
    let mut lines = BufReader::new(container.stdout.take().unwrap()).lines();
    let mut next = || -> Value {
        let line = lines
            .next()
            .expect("the script ended early")
            .expect("read the script's output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    };
    assert_eq!(next()["owner"], 2, "the owner is pid 2 in its namespace");
    let by_pidfd = next();
    let by_pid = next();
    let nobody = next();
    let whose = next();
    let captured_inside = next();
    let by_identity = next();
    assert_eq!(next()["done"], true);

    assert_eq!(by_pid["ok"], true, "register by pid: {by_pid}");
    let owner = &by_pid["session"]["owner"];
    assert_eq!(
        owner["comm"], "sleep",
        "bound to the wrong process: {owner}"
    );
    assert_ne!(owner["pid"], 2, "read in the daemon's namespace: {owner}");
    let host_pid = owner["pid"].as_u64().unwrap() as u32;
    assert_eq!(
        by_pidfd["owner"], *owner,
        "the pidfd names the same process"
    );
    assert_eq!(
        captured_inside["pid"], 2,
        "the CLI captures in its own numbering"
    );
    assert_eq!(
        by_identity["owner"], *owner,
        "an identity from the client is read in the client's numbering"
    );
    assert_eq!(nobody["ok"], false);
    assert_eq!(nobody["error"]["code"], "no_owner", "{nobody}");
    assert!(
        nobody["error"]["message"]
            .as_str()
            .unwrap()
            .contains("your PID namespace"),
        "{nobody}"
    );
    assert_eq!(whose["ok"], true, "{whose}");
    assert_eq!(
        whose["owner_pid"], 2,
        "whose answers in the client's namespace"
    );

    stays_active(&daemon, "by-pid");
    // SAFETY: signalling the `sleep` the script started, identified by its session.
    unsafe { libc::kill(host_pid as i32, libc::SIGKILL) };
    for session in ["by-pid", "by-pidfd", "by-identity"] {
        let ended = daemon.wait_ended(session);
        assert_eq!(ended["reason"], "owner_exited", "{ended}");
    }
    let status = container.wait().expect("wait for the namespace");
    assert!(status.success(), "the script failed: {status}");
}

#[test]
fn a_kernel_thread_is_refused_as_owner() {
    if !namespaces_allowed("a_kernel_thread_is_refused_as_owner") {
        return;
    }
    let daemon = Daemon::start(&[]);
    // Pid 2 is kthreadd in the initial PID namespace.
    let reply = daemon.request(json!({"op": "register", "session": "k", "owner": {"pid": 2}}));
    assert_eq!(reply["ok"], false, "{reply}");
    assert_eq!(reply["error"]["code"], "invalid_owner", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("kernel thread"),
        "{reply}"
    );
    let out = daemon.cli(&["register", "--session", "k", "--owner-pid", "2"]);
    assert_eq!(out.status.code(), Some(65), "by pidfd too");
    assert!(String::from_utf8_lossy(&out.stderr).contains("kernel thread"));
    let reply = daemon.request(json!({"op": "get", "session": "k"}));
    assert_eq!(
        reply["error"]["code"], "not_found",
        "nothing was registered"
    );
}

#[test]
fn a_pidfd_owner_is_never_confused_with_a_process_reusing_its_pid() {
    if !namespaces_allowed("a_pidfd_owner_is_never_confused_with_a_process_reusing_its_pid") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut attempts = 0;
    let (stale_pidfd, owner_pid, impostor) = loop {
        attempts += 1;
        assert!(attempts <= 50, "could not reuse a pid in 50 attempts");
        let owner = Held::spawn();
        let session = format!("reused-{attempts}");
        let registered = cli_ok(
            &daemon,
            &[
                "register",
                "--session",
                &session,
                "--owner-pid",
                &owner.pid.to_string(),
                "--json",
            ],
        );
        assert_eq!(registered["owner"]["pid"], owner.pid);
        if kernel_has_pidfs() {
            assert!(
                registered["owner"]["pidfs_ino"].is_u64(),
                "Linux 6.9+: the fingerprint has the pidfs inode: {registered}"
            );
        }
        let pidfd = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(owner.pid as i32).unwrap(),
            rustix::process::PidfdFlags::empty(),
        )
        .expect("pidfd_open");
        let pid = owner.pid;
        owner.end();
        let ended = daemon.wait_ended(&session);
        assert_eq!(ended["reason"], "owner_exited", "{ended}");
        if let Some(impostor) = respawn_at(pid) {
            break (pidfd, pid, impostor);
        }
    };
    // A pidfd names its process, not its number: passed after the pid changed hands, it
    // still names the dead owner.
    let mut client = Client::connect(&daemon.socket).expect("connect");
    let request = Request::Register(request::Register {
        session: Some("late".into()),
        uid: None,
        owner: OwnerSpec::Pidfd(PidfdOwner { pidfd: 0 }),
        pending: false,
        labels: Default::default(),
        on_end: None,
        grace_ms: None,
        until: None,
        wrappers: Vec::new(),
        on_end_run: None,
        on_stall: None,
        cgroup: None,
        no_cgroup: false,
    });
    let refusal = client
        .call_with_fds(&request, &[stale_pidfd.as_fd()])
        .expect_err("a dead owner's pidfd must not bind");
    assert_eq!(refusal.code(), Some(ErrorCode::NoOwner), "{refusal}");
    let whose = daemon.request(json!({"op": "whose", "pid": owner_pid}));
    assert_eq!(
        whose["error"]["code"], "not_found",
        "the new process is nobody's owner: {whose}"
    );
    // The impostor itself registers as a process of its own.
    let fresh = cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "fresh",
            "--owner-pid",
            &impostor.pid.to_string(),
            "--json",
        ],
    );
    assert_eq!(fresh["owner"]["start_ticks"], impostor.ticks);
    stays_active(&daemon, "fresh");
}

/// A dead owner's pid taken by a new process within the same clock tick: the same
/// `{pid, start_ticks}`. Returns the session registered for the owner and the impostor.
fn same_tick_impostor(daemon: &Daemon) -> (String, Held) {
    for attempt in 0..200 {
        let owner = Held::spawn();
        let session = format!("same-tick-{attempt}");
        let reply = daemon
            .request(json!({"op": "register", "session": session, "owner": {"pid": owner.pid}}));
        assert_eq!(reply["ok"], true, "{reply}");
        let (pid, ticks) = (owner.pid, owner.ticks);
        owner.end();
        match respawn_at(pid) {
            Some(impostor) if impostor.ticks == ticks => return (session, impostor),
            _ => {}
        }
    }
    panic!("no pid was reused within one tick in 200 attempts");
}

#[test]
fn a_same_tick_impostor_does_not_fool_the_poller() {
    if !namespaces_allowed("a_same_tick_impostor_does_not_fool_the_poller") || !kernel_has_pidfs() {
        return;
    }
    let daemon = Daemon::start(&["--sources", "procpoll", "--procpoll-interval", "500ms"]);
    let (session, impostor) = same_tick_impostor(&daemon);
    let ended = daemon.wait_ended(&session);
    assert!(
        ended["reason"] == "owner_reused" || ended["reason"] == "owner_exited",
        "{ended}"
    );
    assert_eq!(
        start_ticks(impostor.pid),
        Some(impostor.ticks),
        "the impostor lives on"
    );
}

#[test]
fn a_same_tick_impostor_does_not_fool_the_reconcile() {
    if !namespaces_allowed("a_same_tick_impostor_does_not_fool_the_reconcile")
        || !kernel_has_pidfs()
    {
        return;
    }
    // A poller so slow that the daemon, killed right after, has not looked.
    let mut daemon = Daemon::start(&["--sources", "procpoll", "--procpoll-interval", "1h"]);
    let (session, impostor) = same_tick_impostor(&daemon);
    daemon.kill9();
    daemon.restart();
    let ended = daemon.wait_ended(&session);
    assert_eq!(ended["reason"], "owner_reused", "{ended}");
    assert_eq!(ended["detected_by"], "reconcile", "{ended}");
    assert_eq!(
        start_ticks(impostor.pid),
        Some(impostor.ticks),
        "the impostor lives on"
    );
}

#[test]
fn a_daemon_in_a_time_namespace_finalizes_a_real_death() {
    if !namespaces_allowed("a_daemon_in_a_time_namespace_finalizes_a_real_death") {
        return;
    }
    let daemon = Daemon::start_under(
        &[
            "unshare",
            "--time",
            "--boottime",
            "1000",
            "--fork",
            "--kill-child",
        ],
        None,
        &[],
    );
    let mut owner = Orphan::spawn(&["exit", "7"]);
    let registered = cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "t",
            "--owner-pid",
            &owner.pid.to_string(),
            "--json",
        ],
    );
    assert_eq!(
        registered["owner"]["start_ticks"], owner.start_ticks,
        "the daemon's reading, 1000 s ahead, is normalised"
    );
    let by_number =
        daemon.request(json!({"op": "register", "session": "n", "owner": {"pid": owner.pid}}));
    assert_eq!(
        by_number["session"]["owner"]["start_ticks"],
        owner.start_ticks
    );
    stays_active(&daemon, "t");
    owner.release();
    for session in ["t", "n"] {
        let ended = daemon.wait_ended(session);
        assert_eq!(ended["reason"], "owner_exited", "{ended}");
    }
}

#[test]
fn an_identity_captured_in_a_time_namespace_means_the_same_outside() {
    if !namespaces_allowed("an_identity_captured_in_a_time_namespace_means_the_same_outside") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let mut owner = Orphan::spawn(&["exit", "0"]);
    let in_time_namespace = |args: &[&str]| {
        Command::new("unshare")
            .args(["--time", "--boottime", "1000", "--fork"])
            .arg(binary("liveness"))
            .args(args)
            .output()
            .expect("run unshare")
    };
    let out = in_time_namespace(&["check", "--pid", &owner.pid.to_string(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let identity: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(identity["start_ticks"], owner.start_ticks, "{identity}");
    let text = identity.to_string();
    let checked = in_time_namespace(&["check", "--identity", &text]);
    assert_eq!(checked.status.code(), Some(0), "alive, checked inside");
    cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "i",
            "--owner-identity",
            &text,
            "--json",
        ],
    );
    stays_active(&daemon, "i");
    owner.release();
    assert_eq!(daemon.wait_ended("i")["reason"], "owner_exited");
}

/// `livenessd` in its own UTS namespace, under the host name written in the returned
/// file at each (re)start; first `name`.
fn daemon_with_host_name(name: &str) -> (Daemon, tempfile::TempDir) {
    let names = tempfile::tempdir().unwrap();
    let name_file = names.path().join("name");
    std::fs::write(&name_file, name).unwrap();
    let script = format!(
        "hostname \"$(cat {})\" && exec \"$0\" \"$@\"",
        name_file.display()
    );
    let daemon = Daemon::start_under(&["unshare", "--uts", "sh", "-c", &script], None, &[]);
    (daemon, names)
}

fn rename_host(daemon: &Daemon, name: &str) {
    let status = Command::new("nsenter")
        .args([
            "--target",
            &daemon.pid().to_string(),
            "--uts",
            "hostname",
            name,
        ])
        .status()
        .expect("run nsenter");
    assert!(status.success(), "nsenter hostname {name}: {status}");
}

#[test]
fn a_host_name_changed_while_running_stops_no_watch() {
    if !namespaces_allowed("a_host_name_changed_while_running_stops_no_watch") {
        return;
    }
    let (daemon, _names) = daemon_with_host_name("before");
    let mut first = Orphan::spawn(&["exit", "0"]);
    let registered = cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "first",
            "--owner-pid",
            &first.pid.to_string(),
            "--json",
        ],
    );
    assert_eq!(registered["owner"]["host"], "before");

    rename_host(&daemon, "after");
    let mut second = Orphan::spawn(&["exit", "0"]);
    let by_number = daemon
        .request(json!({"op": "register", "session": "second", "owner": {"pid": second.pid}}));
    assert_eq!(
        by_number["session"]["owner"]["host"], "after",
        "{by_number}"
    );
    // An identity captured under the old name, and one from a container with its own.
    let mut third = Orphan::spawn(&["exit", "0"]);
    let out = Command::new("unshare")
        .args([
            "--uts",
            "sh",
            "-c",
            "hostname container && exec \"$0\" \"$@\"",
        ])
        .arg(binary("liveness"))
        .args(["check", "--pid", &third.pid.to_string(), "--json"])
        .output()
        .expect("run unshare");
    let identity: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(identity["host"], "container");
    cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "third",
            "--owner-identity",
            &identity.to_string(),
            "--json",
        ],
    );

    for session in ["first", "second", "third"] {
        stays_active(&daemon, session);
    }
    first.release();
    second.release();
    third.release();
    for session in ["first", "second", "third"] {
        assert_eq!(daemon.wait_ended(session)["reason"], "owner_exited");
    }
}

#[test]
fn a_host_name_changed_across_a_restart_stops_no_watch_and_no_reboot() {
    if !namespaces_allowed("a_host_name_changed_across_a_restart_stops_no_watch_and_no_reboot") {
        return;
    }
    let (mut daemon, names) = daemon_with_host_name("before");
    let mut owner = Orphan::spawn(&["exit", "0"]);
    cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "alive",
            "--owner-pid",
            &owner.pid.to_string(),
            "--json",
        ],
    );
    let gone = Orphan::spawn(&["exit", "0"]);
    cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "old-boot",
            "--owner-pid",
            &gone.pid.to_string(),
            "--json",
        ],
    );
    daemon.stop();

    // A reboot, as the database sees one: the owner's boot is one a daemon ran on before.
    let database = daemon.state_dir.join("liveness.db");
    let conn = rusqlite::Connection::open(&database).unwrap();
    conn.execute(
        "UPDATE sessions SET owner_boot_id = 'an-earlier-boot' WHERE id = 'old-boot'",
        [],
    )
    .unwrap();
    conn.execute("INSERT INTO boots (boot_id) VALUES ('an-earlier-boot')", [])
        .unwrap();
    drop(conn);

    std::fs::write(names.path().join("name"), "after").unwrap();
    daemon.restart();
    let rebooted = daemon.wait_ended("old-boot");
    assert_eq!(rebooted["reason"], "reboot", "{rebooted}");
    assert_eq!(rebooted["detected_by"], "reconcile", "{rebooted}");
    stays_active(&daemon, "alive");
    owner.release();
    assert_eq!(daemon.wait_ended("alive")["reason"], "owner_exited");
}

/// The CLI run in a child PID namespace shows every pid in its own numbering, with the
/// daemon's beside it, said to be the daemon's; never one numbering passed for the other.
#[test]
fn the_cli_in_a_child_pid_namespace_numbers_pids_as_its_user_does() {
    if !namespaces_allowed("the_cli_in_a_child_pid_namespace_numbers_pids_as_its_user_does") {
        return;
    }
    let daemon = Daemon::start(&[]);
    // The owner is pid 2 here, a shell whose child `sleep` is pid 3: the loop forks
    // nothing (`read` and `[` are builtins), so no other process takes pid 3 first.
    let script = r#"
        sh -c 'sleep 1000; true' &
        until read -r comm </proc/3/comm && [ "$comm" = sleep ]; do :; done 2>/dev/null
        "$LIVENESS" register --session in-ns --owner-pid 2 >/dev/null || exit 1
        echo "== whose 2"; "$LIVENESS" whose --pid 2
        echo "== whose 3"; "$LIVENESS" whose --pid 3
        echo "== get"; "$LIVENESS" get --session in-ns
        echo "== list"; "$LIVENESS" list
        echo "== processes"; "$LIVENESS" processes --session in-ns
        echo "== status"; "$LIVENESS" status
        kill -9 $!
    "#;
    let output = in_a_new_pid_namespace(&daemon, script)
        .output()
        .expect("run unshare");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{output:?}");
    let part = |name: &str| {
        text.split("== ")
            .find_map(|part| part.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} in:\n{text}"))
            .to_owned()
    };
    let host = daemon.session("in-ns")["owner"]["pid"].as_u64().unwrap();
    assert_ne!(host, 2, "the daemon numbers the owner otherwise");
    let owner = format!("sh (pid 2; {host} in the daemon's PID namespace)");
    assert!(
        part("whose 2").contains(&format!("in-ns active, owner {owner}\n")),
        "{text}"
    );
    assert!(
        part("whose 3").contains(&format!("owner {owner}, in its owner's process tree")),
        "{text}"
    );
    // `whose` is answered about a pid of the caller's; a stored identity is placed in the
    // caller's namespace by its pidfs inode, which kernels before 6.9 do not have: there
    // only the daemon's pid is given, and said to be the daemon's.
    let placed = if daemon.session("in-ns")["owner"]["pidfs_ino"].is_u64() {
        owner.clone()
    } else {
        format!("sh (pid {host} in the daemon's PID namespace)")
    };
    assert!(part("get").contains(&format!("Owner: {placed}")), "{text}");
    assert!(part("list").contains(&placed), "{text}");
    let processes = part("processes");
    assert!(processes.contains("DAEMON-PID"), "{text}");
    let here = if placed == owner { "*2 " } else { "*- " };
    let owner_row = processes
        .lines()
        .find(|line| line.trim_start().starts_with(here))
        .unwrap_or_else(|| panic!("no row for the owner, {here}here: {text}"));
    assert!(owner_row.contains(&format!(" {host} ")), "{text}");
    let daemon_pid = daemon.pid();
    assert!(
        part("status").contains(&format!("pid {daemon_pid} in the daemon's PID namespace")),
        "{text}"
    );
    // The same commands in the daemon's own namespace say nothing of namespaces.
    let get = daemon.cli(&["get", "--session", "in-ns"]);
    let get = String::from_utf8_lossy(&get.stdout);
    assert!(
        get.contains(&format!("(pid {host})")) && !get.contains("namespace"),
        "{get}"
    );
}
