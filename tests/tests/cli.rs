//! The `liveness` command line against real processes (and a real daemon where needed).

use std::process::{Command, Output};
use std::time::Duration;

use integration_tests::{Daemon, Orphan, binary, eventually};
use serde_json::{Value, json};

fn liveness(args: &[&str]) -> Output {
    Command::new(binary("liveness"))
        .args(args)
        .output()
        .expect("run liveness")
}

fn identity_of(pid: u32) -> Value {
    let output = liveness(&["check", "--pid", &pid.to_string(), "--json"]);
    assert!(output.status.success(), "check --pid {pid}: {output:?}");
    serde_json::from_slice(&output.stdout).expect("identity JSON")
}

fn check(identity: &Value) -> (Option<i32>, Value) {
    let output = liveness(&["check", "--json", "--identity", &identity.to_string()]);
    let verdict = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.code(), verdict)
}

#[test]
fn check_tells_alive_dead_and_unknown_by_exit_code() {
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    let identity = identity_of(child.id());
    assert_eq!(identity["pid"], child.id());
    assert_eq!(identity["comm"], "sleep");
    assert_eq!(
        identity["start_ticks"],
        integration_tests::start_ticks(child.id()).unwrap()
    );
    assert_eq!(check(&identity).0, Some(0), "alive");

    let mut reused = identity.clone();
    reused["start_ticks"] = json!(identity["start_ticks"].as_u64().unwrap() + 1);
    let (code, verdict) = check(&reused);
    assert_eq!(
        (code, verdict["reason"].as_str()),
        (Some(1), Some("owner_reused")),
        "{verdict}"
    );

    let mut rebooted = identity.clone();
    rebooted["boot_id"] = json!("11111111-2222-3333-4444-555555555555");
    assert_eq!(check(&rebooted).1["reason"], "rebooted");
    assert_eq!(check(&rebooted).0, Some(1));

    // The host name is a label: this boot's process is alive whatever name it carries.
    let mut renamed = identity.clone();
    renamed["host"] = json!("renamed-since");
    assert_eq!(check(&renamed).0, Some(0), "alive under another host name");

    let mut remote = rebooted.clone();
    remote["host"] = json!("not-this-host");
    let (code, verdict) = check(&remote);
    assert_eq!(
        (code, verdict["liveness"].as_str()),
        (Some(2), Some("unknown")),
        "{verdict}"
    );

    child.kill().unwrap();
    child.wait().unwrap();
    let (code, verdict) = check(&identity);
    assert_eq!(
        (code, verdict["reason"].as_str()),
        (Some(1), Some("exited")),
        "reaped: {verdict}"
    );
    let gone = liveness(&["check", "--pid", &child.id().to_string()]);
    assert_eq!(
        gone.status.code(),
        Some(1),
        "capturing a dead PID: {gone:?}"
    );
}

#[test]
fn check_rejects_bad_input_with_usage_and_data_codes() {
    assert_eq!(liveness(&["check"]).status.code(), Some(64));
    assert_eq!(liveness(&["check", "--pid", "x"]).status.code(), Some(64));
    assert_eq!(liveness(&["frobnicate"]).status.code(), Some(64));
    let bad = liveness(&["check", "--identity", "{\"pid\":1}"]);
    assert_eq!(bad.status.code(), Some(65), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("start_ticks"),
        "names the missing field: {bad:?}"
    );
    assert_eq!(liveness(&["--help"]).status.code(), Some(0));
    assert!(String::from_utf8_lossy(&liveness(&["check", "--help"]).stdout).contains("Exit codes"));
}

#[test]
fn resolve_owner_walks_past_sh_and_bash_layers() {
    // `; true` keeps each shell from exec'ing its last command, so the layers are real.
    let script = format!(
        "bash -c '{} resolve-owner --json; true'; true",
        binary("liveness").display()
    );
    let output = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let owner: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        owner["pid"],
        std::process::id(),
        "the owner is this test, above sh and bash: {owner}"
    );

    // A hook script run through its `#!` line: its process is named after the script.
    let dir = tempfile::tempdir().unwrap();
    let hook = dir.path().join("session-start-hook");
    let body = format!(
        "#!/bin/sh\n{} resolve-owner --json\ntrue\n",
        binary("liveness").display()
    );
    std::fs::write(&hook, body).unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let output = Command::new(&hook).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let owner: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        owner["pid"],
        std::process::id(),
        "the hook script's shell is skipped: {owner}"
    );

    let direct = liveness(&[
        "resolve-owner",
        "--pid",
        &std::process::id().to_string(),
        "--json",
    ]);
    let direct: Value = serde_json::from_slice(&direct.stdout).unwrap();
    assert_eq!(
        direct["pid"],
        std::process::id(),
        "a non-shell resolves to itself"
    );

    // A chain of shells up to init has no owner.
    let orphan_shell = Command::new("sh")
        .args(["-c", "sleep 60 >/dev/null 2>&1 & echo $!"])
        .output()
        .unwrap();
    let sleeper: u32 = String::from_utf8_lossy(&orphan_shell.stdout)
        .trim()
        .parse()
        .unwrap();
    let wrapped = liveness(&[
        "resolve-owner",
        "--pid",
        &sleeper.to_string(),
        "--wrapper",
        "sleep",
    ]);
    assert_eq!(wrapped.status.code(), Some(66), "{wrapped:?}");
    assert!(
        String::from_utf8_lossy(&wrapped.stderr).contains("has no owner"),
        "{wrapped:?}"
    );
    let _ = Command::new("kill").arg(sleeper.to_string()).status();
}

#[test]
fn wait_exit_code_tells_how_the_session_ended() {
    let daemon = Daemon::start(&[]);
    let cases = [("exit", "0", 0), ("exit", "3", 1), ("signal", "9", 2)];
    for (i, (mode, arg, expected)) in cases.into_iter().enumerate() {
        let mut owner = Orphan::spawn(&[mode, arg]);
        let session = format!("w{i}");
        let register = daemon.cli(&[
            "register",
            "--session",
            &session,
            "--owner-pid",
            &owner.pid.to_string(),
        ]);
        assert!(register.status.success(), "{register:?}");
        let wait = Command::new(binary("liveness"))
            .arg("--socket")
            .arg(&daemon.socket)
            .args(["wait", "--session", &session, "--json"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A wait that returned before the session ended could not tell how it ended: the
        // exit code says it.
        owner.release();
        let output = wait.wait_with_output().unwrap();
        let session: Value = serde_json::from_slice(&output.stdout).unwrap();
        // The exit status needs eBPF (non-child); without it the owner died unseen.
        let expected = if session["exit"].is_null() {
            4
        } else {
            expected
        };
        assert_eq!(
            output.status.code(),
            Some(expected),
            "{mode} {arg}: {session}"
        );
    }
    let stopped = daemon.cli(&[
        "register",
        "--session",
        "stop-me",
        "--owner-pid",
        &std::process::id().to_string(),
    ]);
    assert!(stopped.status.success());
    assert!(
        daemon
            .cli(&["end", "--session", "stop-me"])
            .status
            .success()
    );
    assert_eq!(
        daemon.cli(&["wait", "--session", "stop-me"]).status.code(),
        Some(0),
        "already stopped"
    );
    assert_eq!(
        daemon.cli(&["wait", "--session", "nope"]).status.code(),
        Some(66)
    );
}

/// An owner that exited while no daemon ran is found dead by the check at the next start,
/// which cannot know its status: `wait` says so with 4, apart from the endings that are no
/// exit of the owner (3).
#[test]
fn wait_exits_4_when_the_owner_died_unseen() {
    let mut daemon = Daemon::start(&["--pending-ttl", "1s"]);
    let mut owner = Orphan::spawn(&["exit", "0"]);
    let register = daemon.cli(&[
        "register",
        "--session",
        "unseen",
        "--owner-pid",
        &owner.pid.to_string(),
    ]);
    assert!(register.status.success(), "{register:?}");
    daemon.stop();
    owner.release();
    assert!(
        eventually(Duration::from_secs(10), || {
            integration_tests::state(owner.pid).is_none_or(|state| state == 'Z')
        }),
        "the owner did not exit"
    );
    daemon.restart();
    let wait = daemon.cli(&["wait", "--session", "unseen", "--json"]);
    let session: Value = serde_json::from_slice(&wait.stdout).unwrap();
    assert_eq!(
        (&session["detected_by"], &session["exit"]),
        (&json!("reconcile"), &Value::Null),
        "{session}"
    );
    assert_eq!(wait.status.code(), Some(4), "{session}");

    // A pending session never renamed expires: no exit of its owner, which lives on.
    let pending = daemon.cli(&[
        "register",
        "--pending",
        "--owner-pid",
        &std::process::id().to_string(),
        "--json",
    ]);
    assert!(pending.status.success(), "{pending:?}");
    let pending: Value = serde_json::from_slice(&pending.stdout).unwrap();
    let id = pending["id"].as_str().unwrap();
    assert_eq!(
        daemon.cli(&["wait", "--session", id]).status.code(),
        Some(3),
        "pending expired"
    );
}

#[test]
fn watch_exec_resumes_from_its_cursor_exactly() {
    let daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cursor = dir.path().join("cursor");
    let handled = dir.path().join("handled");
    let command = format!(
        "echo \"$LIVENESS_SEQ $LIVENESS_SESSION $LIVENESS_REASON\" >> {}",
        handled.display()
    );
    let start_watcher = || {
        Command::new(binary("liveness"))
            .arg("--socket")
            .arg(&daemon.socket)
            .args([
                "watch",
                "--since",
                "0",
                "--exec",
                &command,
                "--cursor",
                cursor.to_str().unwrap(),
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let lines = || {
        std::fs::read_to_string(&handled)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let owner = std::process::id().to_string();
    let end = |session: &str| {
        assert!(
            daemon
                .cli(&["register", "--session", session, "--owner-pid", &owner])
                .status
                .success()
        );
        assert!(daemon.cli(&["end", "--session", session]).status.success());
    };

    let mut watcher = start_watcher();
    end("a");
    end("b");
    // "SEQ STORE_ID": the seq is what this test follows.
    let cursor_at = || {
        std::fs::read_to_string(&cursor)
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    // The cursor is written once the command has finished: wait for both.
    assert!(
        eventually(Duration::from_secs(10), || lines().len() == 2
            && cursor_at() == "4"),
        "handled {:?}, cursor {:?}",
        lines(),
        cursor_at()
    );
    watcher.kill().unwrap();
    watcher.wait().unwrap();

    end("c");
    let mut watcher = start_watcher();
    // One more end after the restart: a repeat of an earlier one would come before it.
    end("d");
    assert!(
        eventually(Duration::from_secs(10), || lines().len() == 4),
        "handled {:?}",
        lines()
    );
    watcher.kill().unwrap();
    watcher.wait().unwrap();
    assert_eq!(
        lines(),
        ["2 a stopped", "4 b stopped", "6 c stopped", "8 d stopped"],
        "each end handled exactly once"
    );
}

/// A watcher with a new cursor file, stopped before it handled anything, is followed by
/// one that handles the ends in between: the start of the first is its cursor.
#[test]
fn watch_exec_saves_where_a_new_cursor_starts() {
    let daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cursor = dir.path().join("cursor");
    let handled = dir.path().join("handled");
    let command = format!("echo \"$LIVENESS_SESSION\" >> {}", handled.display());
    let start_watcher = || {
        Command::new(binary("liveness"))
            .arg("--socket")
            .arg(&daemon.socket)
            .args(["watch", "--exec", &command, "--cursor"])
            .arg(&cursor)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let owner = std::process::id().to_string();
    let register = |session: &str| {
        let registered = daemon.cli(&["register", "--session", session, "--owner-pid", &owner]);
        assert!(registered.status.success(), "{registered:?}");
    };
    // Before the first watcher: not its to handle.
    register("before");
    assert!(daemon.cli(&["end", "--session", "before"]).status.success());

    let mut first = start_watcher();
    assert!(
        eventually(Duration::from_secs(10), || cursor.exists()),
        "no cursor saved when the stream started"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    register("between");
    assert!(
        daemon
            .cli(&["end", "--session", "between"])
            .status
            .success()
    );

    let mut second = start_watcher();
    let lines = || std::fs::read_to_string(&handled).unwrap_or_default();
    let handled_between = eventually(Duration::from_secs(10), || lines() == "between\n");
    second.kill().unwrap();
    second.wait().unwrap();
    assert!(handled_between, "handled {:?}", lines());
}

/// Ids that display as another id (bidirectional overrides, zero-width characters) or
/// hold controls are refused, and nothing is written.
#[test]
fn ids_that_hide_or_reorder_characters_are_refused() {
    let daemon = Daemon::start(&[]);
    let owner = std::process::id().to_string();
    for (id, code_point) in [
        ("invoice\u{202E}gpj.exe", "U+202E"),
        ("a\u{2066}b", "U+2066"),
        ("zero\u{200B}width", "U+200B"),
        ("\u{FEFF}bom", "U+FEFF"),
        ("bell\u{7}", "U+0007"),
    ] {
        let output = daemon.cli(&["register", "--session", id, "--owner-pid", &owner]);
        assert_eq!(output.status.code(), Some(65), "{id:?}: {output:?}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains(code_point), "{id:?}: {message}");
    }
    let list = daemon.cli(&["list", "--json"]);
    assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");
}

/// `watch --json` passes each event on as the very line the daemon sent, in one write(2),
/// and that line is also the one that parsing the event and printing it again gives (what
/// `watch --json` printed before it forwarded lines): for a line longer than stdout's
/// 1 KiB buffer, an exit status, labels, and across a daemon restart, each event once.
#[test]
fn watch_json_writes_the_daemons_own_lines_whole_across_a_restart() {
    use std::io::BufRead;
    use std::os::unix::net::UnixDatagram;

    let mut daemon = Daemon::start(&[]);
    // Its stdout keeps the bounds of each write: one datagram per write(2).
    let (stdout, writes) = UnixDatagram::pair().unwrap();
    let mut watcher = Command::new(binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["watch", "--json", "--since", "0"])
        .stdout(std::os::fd::OwnedFd::from(stdout))
        .spawn()
        .unwrap();
    let (lines, written) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut write = vec![0u8; 64 * 1024];
        while let Ok(n) = writes.recv(&mut write) {
            let text = String::from_utf8(write[..n].to_vec()).expect("UTF-8");
            if n == 0 || lines.send(text).is_err() {
                break;
            }
        }
    });
    let mut watched = Vec::new();
    let mut read_until_ended = |session: &str| loop {
        let line = written
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no session.ended of {session} from watch"));
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "one write(2) per line, the whole line: {line:?}"
        );
        watched.push(line.clone());
        let event: Value = serde_json::from_str(&line).unwrap();
        if event["event"]["kind"] == "session.ended" && event["event"]["session"] == session {
            break;
        }
    };

    let long = "x".repeat(700);
    let mut owner = Orphan::spawn(&["exit", "3"]);
    let registered = daemon.cli(&[
        "register",
        "--session",
        "long",
        "--owner-pid",
        &owner.pid.to_string(),
        "--label",
        &format!("first={long}"),
        "--label",
        &format!("second={long}"),
    ]);
    assert!(registered.status.success(), "{registered:?}");
    owner.release();
    read_until_ended("long");
    daemon.stop();
    daemon.restart();
    let me = std::process::id().to_string();
    for args in [
        &["register", "--session", "after", "--owner-pid", &me][..],
        &["end", "--session", "after"],
    ] {
        assert!(daemon.cli(args).status.success(), "{args:?}");
    }
    read_until_ended("after");
    let _ = watcher.kill();
    let _ = watcher.wait();

    // The daemon's own lines of the same events, replayed to a subscriber of its socket.
    let (mut socket, _writer) = integration_tests::subscribe(&daemon, Some(0)).into_parts();
    let sent: Vec<String> = (0..watched.len())
        .map(|_| {
            let mut line = String::new();
            socket.read_line(&mut line).expect("a replayed event");
            line
        })
        .collect();
    assert_eq!(watched, sent, "watch printed the daemon's lines, each once");
    assert!(
        watched.iter().any(|line| line.len() > 1024),
        "a line longer than stdout's 1 KiB buffer"
    );
    for line in &watched {
        let event: liveness_common::protocol::StreamMessage =
            serde_json::from_str(line).expect("a stream message");
        assert_eq!(
            serde_json::to_string(&event).unwrap() + "\n",
            *line,
            "the same bytes as the event parsed and printed again"
        );
    }
}
