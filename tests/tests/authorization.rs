//! Authorization by SO_PEERCRED between users: the CLI runs as two unprivileged uids.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use integration_tests::{BinariesForAnyUser, Daemon, Orphan, privileged};
use serde_json::{Value, json};

const ALICE: u32 = 61_001;
const BOB: u32 = 61_002;

fn cli_as(binaries: &BinariesForAnyUser, daemon: &Daemon, uid: u32, args: &[&str]) -> Output {
    Command::new(binaries.path("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(args)
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run liveness as another user")
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?} stderr {:?}",
            output.stdout,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// A process owned by `uid` that lives until dropped.
fn process_of(uid: u32) -> std::process::Child {
    Command::new("sleep")
        .arg("300")
        .uid(uid)
        .gid(uid)
        .spawn()
        .expect("spawn a process as another user")
}

#[test]
fn users_see_and_change_only_their_own_sessions() {
    if !privileged("users_see_and_change_only_their_own_sessions") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let binaries = BinariesForAnyUser::new();
    // Other users must reach the socket: the test's temp dir is private by default.
    for dir in [
        daemon.dir.path().to_path_buf(),
        daemon.socket.parent().unwrap().to_path_buf(),
    ] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut alice_process = process_of(ALICE);
    let alice_pid = alice_process.id().to_string();
    let root_owned = Orphan::spawn(&["exit", "0"]);

    let registered = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &[
            "register",
            "--session",
            "alice-1",
            "--owner-pid",
            &alice_pid,
            "--json",
        ],
    );
    assert!(registered.status.success(), "{registered:?}");
    assert_eq!(json_of(&registered)["creator_uid"], ALICE);

    let refused = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &[
            "register",
            "--session",
            "alice-2",
            "--owner-pid",
            &root_owned.pid.to_string(),
        ],
    );
    assert_eq!(
        refused.status.code(),
        Some(77),
        "registering root's process: {refused:?}"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("belongs to uid 0"),
        "{refused:?}"
    );

    for args in [
        &["get", "--session", "alice-1"][..],
        &["end", "--session", "alice-1"],
        &["touch", "--session", "alice-1"],
        &[
            "register",
            "--session",
            "alice-1",
            "--owner-pid",
            &alice_pid,
        ],
    ] {
        let output = cli_as(&binaries, &daemon, BOB, args);
        assert_eq!(output.status.code(), Some(77), "bob {args:?}: {output:?}");
    }
    let bobs_view = cli_as(&binaries, &daemon, BOB, &["list", "--json"]);
    assert_eq!(json_of(&bobs_view), json!([]), "bob sees alice's sessions");
    let whose = cli_as(&binaries, &daemon, BOB, &["whose", "--pid", &alice_pid]);
    assert_eq!(
        whose.status.code(),
        Some(66),
        "bob learns whose alice's process is: {whose:?}"
    );

    let alices_view = cli_as(&binaries, &daemon, ALICE, &["list", "--json"]);
    assert_eq!(json_of(&alices_view).as_array().map(Vec::len), Some(1));
    let root_view = daemon.request(json!({"op": "list"}));
    assert_eq!(
        root_view["sessions"].as_array().map(Vec::len),
        Some(1),
        "root sees everything"
    );

    // Bob's replay holds none of alice's events; alice's holds hers.
    let bob_replay = daemon_replay_as(&binaries, &daemon, BOB);
    assert!(bob_replay.is_empty(), "bob replayed {bob_replay:?}");
    let alice_replay = daemon_replay_as(&binaries, &daemon, ALICE);
    assert_eq!(alice_replay.len(), 1, "{alice_replay:?}");

    let ended = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &["end", "--session", "alice-1", "--json"],
    );
    assert_eq!(json_of(&ended)["reason"], "stopped");
    let _ = alice_process.kill();
    let _ = alice_process.wait();
}

/// Replays the whole log as `uid` through `liveness watch --since 0 --json`, stopping
/// after a short while.
fn daemon_replay_as(binaries: &BinariesForAnyUser, daemon: &Daemon, uid: u32) -> Vec<Value> {
    let output = Command::new("timeout")
        .args([
            "1",
            binaries.path("liveness").to_str().unwrap(),
            "--socket",
            daemon.socket.to_str().unwrap(),
            "watch",
            "--since",
            "0",
            "--json",
        ])
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run liveness watch");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
