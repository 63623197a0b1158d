//! The daemon end to end: real `livenessd`, real processes, real socket, real SQLite.

use std::time::Duration;

use integration_tests::{
    Conn, Daemon, Orphan, eventually, next_event, privileged, register, subscribe,
};
use serde_json::{Value, json};

const ARRIVAL: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(500);

/// Exit sources for tests that assert the exit status: eBPF knows it for non-children.
fn exact_sources(test: &str) -> &'static str {
    if privileged(test) { "ebpf" } else { "pidfd" }
}

#[test]
fn owner_exit_reaches_a_subscriber_with_its_exit_code() {
    let sources = exact_sources("owner_exit_reaches_a_subscriber_with_its_exit_code");
    let daemon = Daemon::start(&["--sources", sources]);
    let mut stream = subscribe(&daemon, None);
    let mut owner = Orphan::spawn(&["exit", "7"]);
    let session = register(&daemon, "s1", owner.pid);
    assert_eq!(session["phase"], "active");
    assert_eq!(session["owner"]["start_ticks"], owner.start_ticks);

    let registered = next_event(&mut stream);
    assert_eq!(
        (registered["kind"].as_str(), registered["seq"].as_u64()),
        (Some("session.registered"), Some(1))
    );
    owner.release();
    let ended = next_event(&mut stream);
    assert_eq!(ended["kind"], "session.ended", "{ended}");
    assert_eq!(ended["seq"], 2);
    assert_eq!(ended["session"], "s1");
    assert_eq!(ended["reason"], "owner_exited");
    assert_eq!(ended["detected_by"], sources);
    if sources == "ebpf" {
        assert_eq!(ended["exit"], json!({"kind": "exited", "code": 7}));
    }
    let stored = daemon.session("s1");
    assert_eq!(
        (stored["phase"].as_str(), stored["reason"].as_str()),
        (Some("ended"), Some("owner_exited"))
    );
    assert_eq!(
        stored["exit"], ended["exit"],
        "the store holds what was published"
    );
    assert!(
        stream.next_within(QUIET).is_none(),
        "the session ends exactly once"
    );
}

#[test]
fn a_new_owner_is_not_ended_by_the_old_owners_death() {
    let daemon = Daemon::start(&[]);
    let mut first = Orphan::spawn(&["exit", "0"]);
    let mut second = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "turns", first.pid);
    let mut stream = subscribe(&daemon, Some(1));
    let changed = register(&daemon, "turns", second.pid);
    assert_eq!(changed["owner"]["pid"], second.pid);
    let event = next_event(&mut stream);
    assert_eq!(event["kind"], "session.owner_changed");
    assert_eq!(event["previous_owner"]["pid"], first.pid);

    first.release();
    assert!(
        stream.next_within(QUIET).is_none(),
        "the old owner's death ended the session"
    );
    assert_eq!(daemon.session("turns")["phase"], "active");
    second.release();
    let ended = next_event(&mut stream);
    assert_eq!(
        (ended["kind"].as_str(), ended["owner"]["pid"].as_u64()),
        (Some("session.ended"), Some(u64::from(second.pid)))
    );
}

#[test]
fn owners_that_die_while_the_daemon_is_killed_end_once_by_reconcile() {
    let mut daemon = Daemon::start(&[]);
    let mut owners: Vec<Orphan> = (0..3).map(|_| Orphan::spawn(&["exit", "4"])).collect();
    for (i, owner) in owners.iter().enumerate() {
        register(&daemon, &format!("r{i}"), owner.pid);
    }
    let mut survivor = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "survivor", survivor.pid);
    daemon.kill9();
    for owner in &mut owners {
        owner.release();
    }
    assert!(
        eventually(ARRIVAL, || owners
            .iter()
            .all(|o| integration_tests::state(o.pid).is_none_or(|s| s == 'Z'))),
        "owners did not die"
    );
    daemon.restart();

    let mut stream = subscribe(&daemon, Some(0));
    let mut ended = Vec::new();
    for expected_seq in 1..=7u64 {
        let event = next_event(&mut stream);
        assert_eq!(
            event["seq"], expected_seq,
            "seqs are contiguous across the crash: {event}"
        );
        if event["kind"] == "session.ended" {
            assert_eq!(event["detected_by"], "reconcile", "{event}");
            assert_eq!(event["reason"], "owner_exited", "{event}");
            ended.push(event["session"].as_str().unwrap().to_owned());
        }
    }
    ended.sort();
    assert_eq!(ended, ["r0", "r1", "r2"]);
    assert!(stream.next_within(QUIET).is_none(), "a session ended twice");
    assert_eq!(
        daemon.session("survivor")["phase"],
        "active",
        "a live owner was finalized"
    );

    // The survivor is watched again after the restart.
    survivor.release();
    let event = next_event(&mut stream);
    assert_eq!(
        (event["session"].as_str(), event["kind"].as_str()),
        (Some("survivor"), Some("session.ended"))
    );
}

/// After a run that did not stop cleanly on another boot (a possible power loss, which
/// can drop commits whose events were already streamed), seqs jump so none is reused.
#[test]
fn seqs_skip_ahead_after_an_unclean_stop_on_another_boot() {
    let mut daemon = Daemon::start(&[]);
    let owner = std::process::id();
    register(&daemon, "before", owner);
    assert!(daemon.stop().success());
    // What a power loss leaves behind: the last run's boot, not marked clean.
    let db = rusqlite::Connection::open(daemon.state_dir.join("liveness.db")).unwrap();
    db.execute_batch(
        "UPDATE meta SET value = 'an-earlier-boot' WHERE key = 'run_boot_id';
         UPDATE meta SET value = 0 WHERE key = 'run_clean';",
    )
    .unwrap();
    drop(db);
    daemon.restart();
    let mut stream = subscribe(&daemon, Some(1));
    register(&daemon, "after", owner);
    let event = next_event(&mut stream);
    assert_eq!(event["seq"], 2 + (1u64 << 20), "{event}");

    // A clean stop, or a crash on the same boot, continues the seqs as they are.
    daemon.kill9();
    daemon.restart();
    let mut stream = subscribe(&daemon, None);
    register(&daemon, "again", owner);
    assert_eq!(next_event(&mut stream)["seq"], 3 + (1u64 << 20));
}

#[test]
fn a_registration_for_a_dead_or_reused_pid_ends_at_once() {
    let daemon = Daemon::start(&[]);
    let mut dead = Orphan::spawn(&["exit", "0"]);
    let identity = daemon.cli(&["check", "--pid", &dead.pid.to_string(), "--json"]);
    assert!(identity.status.success());
    let identity: Value = serde_json::from_slice(&identity.stdout).unwrap();
    dead.release();
    assert!(eventually(ARRIVAL, || integration_tests::state(dead.pid)
        .is_none_or(|s| s == 'Z')));
    let reply = daemon.request(json!({"op": "register", "session": "late", "owner": identity}));
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(
        (
            reply["session"]["phase"].as_str(),
            reply["session"]["reason"].as_str()
        ),
        (Some("ended"), Some("owner_exited"))
    );

    let alive = Orphan::spawn(&["exit", "0"]);
    let mut reused: Value = serde_json::from_slice(
        &daemon
            .cli(&["check", "--pid", &alive.pid.to_string(), "--json"])
            .stdout,
    )
    .unwrap();
    reused["start_ticks"] = json!(alive.start_ticks - 1);
    let reply = daemon.request(json!({"op": "register", "session": "reused", "owner": reused}));
    assert_eq!(reply["session"]["reason"], "owner_reused", "{reply}");

    let mut other_boot = reused.clone();
    other_boot["boot_id"] = json!("00000000-0000-0000-0000-000000000000");
    let reply =
        daemon.request(json!({"op": "register", "session": "rebooted", "owner": other_boot}));
    assert_eq!(reply["session"]["reason"], "reboot", "{reply}");
}

/// Smoke: `--pending-ttl` expires a pending session never renamed. That a renamed one never
/// expires is the engine's test, on a paused clock.
#[test]
fn pending_sessions_are_renamed_or_expire() {
    let daemon = Daemon::start(&["--pending-ttl", "400ms"]);
    let owner = Orphan::spawn(&["exit", "0"]);
    let pending = |daemon: &Daemon| {
        let reply =
            daemon.request(json!({"op": "register", "pending": true, "owner": {"pid": owner.pid}}));
        assert_eq!(reply["ok"], true, "{reply}");
        assert_eq!(reply["session"]["pending"], true);
        reply["session"]["id"].as_str().unwrap().to_owned()
    };
    let forgotten = pending(&daemon);
    assert!(forgotten.starts_with("pending-"), "{forgotten}");
    let renamed = pending(&daemon);
    assert_ne!(forgotten, renamed, "pending ids are unique");
    let reply = daemon.request(json!({"op": "rename", "session": renamed, "to": "real-id"}));
    assert_eq!(reply["session"]["id"], "real-id", "{reply}");
    assert_eq!(reply["session"]["pending"], false);

    let expired = daemon.wait_ended(&forgotten);
    assert_eq!(expired["reason"], "pending_expired");
    assert_eq!(daemon.session("real-id")["phase"], "active");
    let reply = daemon.request(json!({"op": "get", "session": renamed}));
    assert_eq!(
        reply["error"]["code"], "not_found",
        "the pending id is gone after rename: {reply}"
    );
}

#[test]
fn a_pending_session_whose_owner_dies_ends_like_any_other() {
    let daemon = Daemon::start(&[]);
    let mut owner = Orphan::spawn(&["exit", "0"]);
    let reply =
        daemon.request(json!({"op": "register", "pending": true, "owner": {"pid": owner.pid}}));
    let id = reply["session"]["id"].as_str().unwrap().to_owned();
    owner.release();
    assert_eq!(daemon.wait_ended(&id)["reason"], "owner_exited");
}

/// Smoke: `--unknown-timeout` ends an owner of another host. That a touch postpones it and
/// that an idle local owner never times out are the engine's tests, on a paused clock.
#[test]
fn owners_on_another_host_end_only_by_inactivity_timeout() {
    let daemon = Daemon::start(&["--unknown-timeout", "800ms"]);
    let local = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "local", local.pid);
    let remote = json!({"pid": 1234, "start_ticks": 99, "boot_id": "b", "host": "some-other-host"});
    let reply = daemon.request(json!({"op": "register", "session": "remote", "owner": remote}));
    assert_eq!(reply["session"]["phase"], "active", "{reply}");
    let reply = daemon.request(json!({"op": "touch", "session": "remote"}));
    assert_eq!(reply["session"]["phase"], "active", "{reply}");
    let ended = daemon.wait_ended("remote");
    assert_eq!(ended["reason"], "timeout");
    assert_eq!(
        daemon.session("local")["phase"],
        "active",
        "an idle local owner timed out"
    );
}

#[test]
fn whose_finds_the_owner_of_a_grandchild() {
    let daemon = Daemon::start(&[]);
    let mut tree = std::process::Command::new("sh")
        .args(["-c", "sh -c 'sleep 300 & wait' & wait"])
        .spawn()
        .expect("spawn a process tree");
    let owner = tree.id();
    let children = |pid: u32| -> Vec<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let mut grandchild = None;
    assert!(eventually(ARRIVAL, || {
        grandchild = children(owner)
            .first()
            .and_then(|&child| children(child).first().copied());
        grandchild.is_some()
    }));
    let grandchild = grandchild.unwrap();
    register(&daemon, "tree", owner);
    let reply = daemon.request(json!({"op": "whose", "pid": grandchild}));
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(
        (reply["session"]["id"].as_str(), reply["owner_pid"].as_u64()),
        (Some("tree"), Some(u64::from(owner)))
    );
    let unrelated = daemon.request(json!({"op": "whose", "pid": daemon.pid()}));
    assert_eq!(unrelated["error"]["code"], "not_found", "{unrelated}");
    let _ = tree.kill();
    let _ = tree.wait();
    let _ = std::process::Command::new("kill")
        .arg(grandchild.to_string())
        .status();
}

#[test]
fn sighup_reopens_the_log_and_does_not_stop_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("livenessd.log");
    let mut daemon = Daemon::start(&["--log-file", log.to_str().unwrap()]);
    assert!(eventually(ARRIVAL, || std::fs::read_to_string(&log)
        .is_ok_and(|l| l.contains("listening"))));
    let rotated = dir.path().join("livenessd.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    daemon.signal(libc::SIGHUP);
    assert!(
        eventually(ARRIVAL, || std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("reopened"))),
        "no new log"
    );
    assert!(daemon.is_running(), "SIGHUP stopped the daemon");
    assert_eq!(daemon.request(json!({"op": "status"}))["ok"], true);
}

#[test]
fn sigterm_says_goodbye_and_stops_cleanly() {
    let mut daemon = Daemon::start(&[]);
    let mut stream = subscribe(&daemon, None);
    let mut idle = daemon.connect();
    let status = daemon.stop();
    assert!(status.success(), "livenessd exited with {status}");
    assert_eq!(
        stream.next_within(ARRIVAL).expect("goodbye")["goodbye"]["reason"],
        "shutdown"
    );
    assert_eq!(
        idle.next_within(ARRIVAL).expect("goodbye")["goodbye"]["reason"],
        "shutdown"
    );
    assert!(!daemon.socket.exists(), "the socket is removed at exit");
    daemon.restart();
    assert_eq!(
        daemon.request(json!({"op": "status"}))["ok"],
        true,
        "restart on the same state"
    );
}

#[test]
fn a_second_daemon_on_the_same_state_or_socket_refuses_to_start() {
    let daemon = Daemon::start(&[]);
    let output = std::process::Command::new(integration_tests::binary("livenessd"))
        .arg("--socket")
        .arg(daemon.dir.path().join("other.sock"))
        .arg("--state-dir")
        .arg(&daemon.state_dir)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("already uses"),
        "{output:?}"
    );
    let output = std::process::Command::new(integration_tests::binary("livenessd"))
        .arg("--socket")
        .arg(&daemon.socket)
        .arg("--state-dir")
        .arg(daemon.dir.path().join("other-state"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("listening on"),
        "{output:?}"
    );
}

#[test]
fn status_names_the_active_sources() {
    let daemon = Daemon::start(&["--sources", "pidfd"]);
    let reply = daemon.request(json!({"op": "status"}));
    let sources = reply["status"]["monitor"]["sources"]
        .as_array()
        .expect("sources")
        .clone();
    let state = |name: &str| {
        sources
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["state"].clone())
    };
    assert_eq!(state("pidfd"), Some(json!("active")), "{reply}");
    assert_eq!(state("ebpf"), Some(json!("off")), "{reply}");
    assert_eq!(state("procpoll"), Some(json!("standby")), "{reply}");
}

/// With too few file descriptors for a pidfd each, the processes beyond the limit are
/// still covered (by the /proc poller) and status says how many lack a pidfd.
#[test]
fn processes_beyond_the_fd_limit_are_still_covered() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s.sock");
    let mut command = std::process::Command::new(integration_tests::binary("livenessd"));
    command
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--sources", "pidfd", "--procpoll-interval", "50ms"])
        .stderr(std::process::Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; it only lowers this child's own limit.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    assert!(
        eventually(ARRIVAL, || std::os::unix::net::UnixStream::connect(&socket)
            .is_ok()),
        "daemon did not start"
    );
    let mut owners: Vec<Orphan> = (0..80).map(|_| Orphan::spawn(&["exit", "0"])).collect();
    let mut conn = Conn::connect(&socket);
    for (i, owner) in owners.iter().enumerate() {
        let reply = conn.request(
            json!({"op": "register", "session": format!("fd{i}"), "owner": {"pid": owner.pid}}),
        );
        assert_eq!(reply["session"]["phase"], "active", "{reply}");
    }
    let status = conn.request(json!({"op": "status"}));
    let monitor = &status["status"]["monitor"];
    assert!(monitor["without_pidfd"].as_u64().unwrap() > 0, "{status}");
    let procpoll = monitor["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "procpoll")
        .unwrap();
    assert_eq!(procpoll["state"], "active", "{status}");
    owners.last_mut().unwrap().release();
    let ended = eventually(ARRIVAL, || {
        conn.request(json!({"op": "get", "session": "fd79"}))["session"]["phase"] == "ended"
    });
    assert!(ended, "a process without a pidfd was not covered");
    let _ = child.kill();
    let _ = child.wait();
}

/// Forcing a source that cannot work here is an error at start that says why; `auto`
/// falls back to what works.
#[test]
fn forcing_an_unavailable_source_fails_with_the_reason() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !privileged("forcing_an_unavailable_source_fails_with_the_reason") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // The user's own directory for its sockets: one all may write to is refused.
    let sockets = dir.path().join("run");
    std::fs::create_dir(&sockets).unwrap();
    std::os::unix::fs::chown(&sockets, Some(61_003), Some(61_003)).unwrap();
    let binaries = integration_tests::BinariesForAnyUser::new();
    let run_as_user = |sources: &str| {
        std::process::Command::new(binaries.path("livenessd"))
            .arg("--socket")
            .arg(sockets.join(format!("{sources}.sock")))
            .arg("--state-dir")
            .arg(dir.path().join(format!("{sources}-state")))
            .args(["--sources", sources])
            .uid(61_003)
            .gid(61_003)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let output = run_as_user("ebpf").wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("exit source ebpf was requested but cannot run"),
        "{stderr}"
    );
    assert!(
        stderr.contains("CAP_BPF"),
        "the reason names the capability: {stderr}"
    );

    let mut auto = run_as_user("auto");
    let socket = sockets.join("auto.sock");
    assert!(
        eventually(ARRIVAL, || std::os::unix::net::UnixStream::connect(&socket)
            .is_ok()),
        "auto did not start"
    );
    let status = Conn::connect(&socket).request(json!({"op": "status"}));
    let sources = status["status"]["monitor"]["sources"]
        .as_array()
        .unwrap()
        .clone();
    let ebpf = sources.iter().find(|s| s["name"] == "ebpf").unwrap();
    assert_eq!(ebpf["state"], "off", "{status}");
    assert!(
        ebpf["reason"].as_str().unwrap().contains("CAP_BPF"),
        "{status}"
    );
    assert!(
        sources
            .iter()
            .any(|s| s["name"] == "pidfd" && s["state"] == "active"),
        "{status}"
    );
    let _ = auto.kill();
    let _ = auto.wait();
}
