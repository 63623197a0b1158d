//! Authorization by SO_PEERCRED between users: the CLI runs as two unprivileged uids.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use integration_tests::{
    BinariesForAnyUser, Daemon, Orphan, UserProcess, cli_as, json_of, privileged, process_of,
    shared_daemon,
};
use serde_json::{Value, json};

const ALICE: u32 = 61_001;
const BOB: u32 = 61_002;

#[test]
fn users_see_and_change_only_their_own_sessions() {
    if !privileged("users_see_and_change_only_their_own_sessions") {
        return;
    }
    let (daemon, binaries) = shared_daemon();
    let alice_process = process_of(ALICE);
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

    // Bob's ids are his own: alice's session is not there for him to see or change.
    for args in [
        &["get", "--session", "alice-1"][..],
        &["end", "--session", "alice-1"],
        &["touch", "--session", "alice-1"],
    ] {
        let output = cli_as(&binaries, &daemon, BOB, args);
        assert_eq!(output.status.code(), Some(66), "bob {args:?}: {output:?}");
    }
    let output = cli_as(
        &binaries,
        &daemon,
        BOB,
        &[
            "register",
            "--session",
            "alice-1",
            "--owner-pid",
            &alice_pid,
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(77),
        "bob registers alice's process: {output:?}"
    );
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

/// The text of an error as a user sees it, with the session id named in it replaced, so
/// that the answers about two ids can be compared.
fn refusal(output: &Output, id: &str) -> (Option<i32>, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).replace(id, "ID"),
    )
}

#[test]
fn a_user_cannot_take_or_probe_another_users_session_id() {
    if !privileged("a_user_cannot_take_or_probe_another_users_session_id") {
        return;
    }
    let (daemon, binaries) = shared_daemon();
    let alice_process = process_of(ALICE);
    let bob_process = process_of(BOB);
    let register = |uid, id: &str, process: &UserProcess| {
        let pid = process.id().to_string();
        let output = cli_as(
            &binaries,
            &daemon,
            uid,
            &["register", "--session", id, "--owner-pid", &pid, "--json"],
        );
        assert!(
            output.status.success(),
            "uid {uid} registers {id}: {output:?}"
        );
        json_of(&output)
    };
    // Alice registers first the id Bob's tool will use: Bob still gets his own session.
    register(ALICE, "build-7", &alice_process);
    let bobs = register(BOB, "build-7", &bob_process);
    assert_eq!(
        (&bobs["creator_uid"], &bobs["owner"]["pid"]),
        (&json!(BOB), &json!(bob_process.id()))
    );
    let alices = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &["get", "--session", "build-7", "--json"],
    );
    assert_eq!(json_of(&alices)["owner"]["pid"], alice_process.id());
    let all = daemon.request(json!({"op": "list"}));
    assert_eq!(all["sessions"].as_array().map(Vec::len), Some(2), "{all}");

    // Whether an id exists for another user, or for nobody, Bob gets the same answer.
    register(ALICE, "alice-only", &alice_process);
    for op in [
        &["get", "--session"][..],
        &["end", "--session"],
        &["touch", "--session"],
        &["wait", "--session"],
    ] {
        let answer = |id: &str| {
            let args: Vec<&str> = op.iter().copied().chain([id]).collect();
            refusal(&cli_as(&binaries, &daemon, BOB, &args), id)
        };
        assert_eq!(
            answer("alice-only"),
            answer("nobody-has-this"),
            "bob {op:?}"
        );
        assert_eq!(answer("nobody-has-this").0, Some(66), "bob {op:?}");
    }
    // A rename to an id another user has is no collision either.
    let pending = cli_as(
        &binaries,
        &daemon,
        BOB,
        &[
            "register",
            "--pending",
            "--owner-pid",
            &bob_process.id().to_string(),
            "--json",
        ],
    );
    let placeholder = json_of(&pending)["id"].as_str().unwrap().to_owned();
    let renamed = cli_as(
        &binaries,
        &daemon,
        BOB,
        &[
            "rename",
            "--session",
            &placeholder,
            "--to",
            "alice-only",
            "--json",
        ],
    );
    assert!(renamed.status.success(), "{renamed:?}");
    assert_eq!(json_of(&renamed)["creator_uid"], BOB);
    // Naming another user's namespace is root's alone, whatever exists there.
    for id in ["build-7", "nobody-has-this"] {
        let alice_uid = ALICE.to_string();
        let output = cli_as(
            &binaries,
            &daemon,
            BOB,
            &["get", "--session", id, "--uid", &alice_uid],
        );
        assert_eq!(output.status.code(), Some(77), "{output:?}");
    }
}

#[test]
fn root_names_a_users_session_by_uid_or_by_a_unique_id() {
    if !privileged("root_names_a_users_session_by_uid_or_by_a_unique_id") {
        return;
    }
    let (daemon, binaries) = shared_daemon();
    let alice_process = process_of(ALICE);
    let bob_process = process_of(BOB);
    let (alice, bob) = (ALICE.to_string(), BOB.to_string());
    // Root registers in a user's namespace with --uid: the session is the user's.
    for (uid, process) in [(&alice, &alice_process), (&bob, &bob_process)] {
        let pid = process.id().to_string();
        let output = daemon.cli(&[
            "register",
            "--session",
            "shared",
            "--uid",
            uid,
            "--owner-pid",
            &pid,
            "--json",
        ]);
        assert!(output.status.success(), "{output:?}");
        assert_eq!(json_of(&output)["creator_uid"].to_string(), *uid);
    }
    let mine = cli_as(
        &binaries,
        &daemon,
        BOB,
        &["get", "--session", "shared", "--json"],
    );
    assert_eq!(
        json_of(&mine)["owner"]["pid"],
        bob_process.id(),
        "bob's own"
    );

    // Two users have the id: root must say which.
    let ambiguous = daemon.cli(&["get", "--session", "shared"]);
    assert_eq!(ambiguous.status.code(), Some(65), "{ambiguous:?}");
    let message = String::from_utf8_lossy(&ambiguous.stderr);
    assert!(
        message.contains("--uid") && message.contains(&alice) && message.contains(&bob),
        "{message}"
    );
    let reply = daemon.request(json!({"op": "end", "session": "shared"}));
    assert_eq!(reply["error"]["code"], "ambiguous", "{reply}");
    let ended = daemon.cli(&["end", "--session", "shared", "--uid", &bob, "--json"]);
    assert_eq!(json_of(&ended)["creator_uid"], BOB);
    let still = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &["get", "--session", "shared", "--json"],
    );
    assert_eq!(
        json_of(&still)["phase"],
        "active",
        "root ended the wrong user's session"
    );

    // One user has the id: root needs no uid.
    let pid = alice_process.id().to_string();
    let output = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &["register", "--session", "alice-only", "--owner-pid", &pid],
    );
    assert!(output.status.success(), "{output:?}");
    let found = daemon.cli(&["get", "--session", "alice-only", "--json"]);
    assert_eq!(json_of(&found)["creator_uid"], ALICE);
    // Root's own registrations, without --uid, are in root's namespace.
    let own = daemon.cli(&[
        "register",
        "--session",
        "alice-only",
        "--owner-pid",
        &pid,
        "--json",
    ]);
    assert_eq!(json_of(&own)["creator_uid"], 0, "{own:?}");
}
