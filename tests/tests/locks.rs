//! Locks held by sessions, end to end: real daemon, real processes, the real CLI.

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use integration_tests::{
    Conn, Daemon, Orphan, cli_as, eventually, json_of, next_event, privileged, process_of,
    register, shared_daemon, shared_daemon_with, subscribe,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

fn acquire(daemon: &Daemon, session: &str, name: &str) -> Value {
    daemon.request(json!({"op": "lock_acquire", "name": name, "session": session}))
}

/// A `lock_acquire` with `wait` sent on its own connection, whose reply is read later.
fn acquire_waiting(daemon: &Daemon, session: &str, name: &str) -> Conn {
    let mut conn = daemon.connect();
    let request = json!({"op": "lock_acquire", "name": name, "session": session, "wait": true});
    conn.send_raw(format!("{request}\n").as_bytes());
    conn
}

fn token(reply: &Value) -> u64 {
    assert_eq!(reply["ok"], true, "the lock should be granted: {reply}");
    reply["lock"]["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token in {reply}"))
}

fn locks(daemon: &Daemon) -> Vec<Value> {
    let reply = daemon.request(json!({"op": "lock_list"}));
    assert_eq!(reply["ok"], true, "lock_list: {reply}");
    reply["locks"].as_array().cloned().unwrap_or_default()
}

/// The next lock event on a subscription: kind, session, token and release reason.
fn next_lock_event(stream: &mut Conn) -> (String, String, u64, Value) {
    loop {
        let event = next_event(stream);
        let kind = event["kind"].as_str().unwrap_or_default();
        if kind.starts_with("lock.") {
            return (
                kind.to_owned(),
                event["session"].as_str().unwrap_or_default().to_owned(),
                event["lock"]["token"]
                    .as_u64()
                    .expect("a lock event has a token"),
                event["lock"]["reason"].clone(),
            );
        }
    }
}

#[test]
fn two_sessions_contend_and_the_waiter_gets_the_lock_on_release() {
    let daemon = Daemon::start(&[]);
    let (a, b) = (Orphan::spawn(&["exit", "0"]), Orphan::spawn(&["exit", "0"]));
    register(&daemon, "a", a.pid);
    register(&daemon, "b", b.pid);
    let mut stream = subscribe(&daemon, None);

    let first = token(&acquire(&daemon, "a", "build"));
    let held = acquire(&daemon, "b", "build");
    assert_eq!(held["error"]["code"], "lock_held", "{held}");
    let cli = daemon.cli(&["lock", "acquire", "build", "--session", "b"]);
    assert_eq!(
        cli.status.code(),
        Some(3),
        "held without --wait has its own exit code: {cli:?}"
    );
    let mut waiter = acquire_waiting(&daemon, "b", "build");
    assert!(
        eventually(WAIT, || locks(&daemon)[0]["waiters"] == 1),
        "b waits in line: {:?}",
        locks(&daemon)
    );

    let released = daemon.cli(&["lock", "release", "build", "--session", "a", "--json"]);
    assert!(released.status.success(), "{released:?}");
    assert_eq!(json_of(&released)["token"], first);
    let second = token(&waiter.next_line().expect("the waiter's reply"));
    assert!(second > first, "tokens grow: {first} then {second}");
    let listed = locks(&daemon);
    assert_eq!(
        (listed.len(), &listed[0]["session"], &listed[0]["waiters"]),
        (1, &json!("b"), &json!(0))
    );

    assert_eq!(
        next_lock_event(&mut stream),
        ("lock.acquired".into(), "a".into(), first, Value::Null)
    );
    assert_eq!(
        next_lock_event(&mut stream),
        ("lock.released".into(), "a".into(), first, json!("released"))
    );
    assert_eq!(
        next_lock_event(&mut stream),
        ("lock.acquired".into(), "b".into(), second, Value::Null)
    );

    // Bad input: a clear error, and nothing changes.
    for (request, code) in [
        (
            json!({"op": "lock_acquire", "name": "", "session": "a"}),
            "invalid_request",
        ),
        (
            json!({"op": "lock_acquire", "name": "x", "session": "nope"}),
            "not_found",
        ),
        (
            json!({"op": "lock_acquire", "name": "x", "session": "a", "timeout_ms": 5}),
            "invalid_request",
        ),
        (
            json!({"op": "lock_release", "name": "build", "session": "a"}),
            "not_held",
        ),
        (
            json!({"op": "lock_acquire", "name": "x", "sesion": "a"}),
            "invalid_request",
        ),
    ] {
        let reply = daemon.request(request.clone());
        assert_eq!(reply["error"]["code"], code, "{request}: {reply}");
    }
    assert_eq!(locks(&daemon), listed, "refused requests changed nothing");
}

#[test]
fn a_waiter_gets_the_lock_as_soon_as_the_holders_owner_is_killed() {
    let daemon = Daemon::start(&[]);
    let mut holder = Orphan::spawn(&["signal", "9"]);
    let waiter_owner = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "holder", holder.pid);
    register(&daemon, "waiter", waiter_owner.pid);
    let held = token(&acquire(&daemon, "holder", "cache"));
    let mut stream = subscribe(&daemon, None);
    let mut waiter = acquire_waiting(&daemon, "waiter", "cache");
    assert!(eventually(WAIT, || locks(&daemon)[0]["waiters"] == 1));

    let killed = Instant::now();
    holder.release();
    let granted = waiter.next_line().expect("the waiter's reply");
    let delay = killed.elapsed();
    let granted = token(&granted);
    assert!(granted > held);
    // One commit ends the session and releases its lock; the grant follows in the same
    // step of the daemon.
    let ended = next_event(&mut stream);
    let released = next_event(&mut stream);
    let acquired = next_event(&mut stream);
    assert_eq!(
        (
            &ended["kind"],
            &ended["reason"],
            &released["kind"],
            &acquired["kind"]
        ),
        (
            &json!("session.ended"),
            &json!("owner_exited"),
            &json!("lock.released"),
            &json!("lock.acquired")
        ),
        "{ended}\n{released}\n{acquired}"
    );
    assert_eq!(
        (
            &released["session"],
            &released["lock"]["token"],
            &released["lock"]["reason"]
        ),
        (&json!("holder"), &json!(held), &json!("session_ended"))
    );
    assert_eq!(
        (&acquired["session"], &acquired["lock"]["token"]),
        (&json!("waiter"), &json!(granted))
    );
    let ms = |event: &Value, field: &str| event[field].as_i64();
    eprintln!(
        "measured: the waiter had the lock {delay:?} after the holder's owner was told to \
         SIGKILL itself; detected by {}, died_ms {:?} observed_ms {:?}, session.ended at_ms {:?}, \
         lock.acquired at_ms {:?}",
        ended["detected_by"],
        ms(&ended, "died_ms"),
        ms(&ended, "observed_ms"),
        ms(&ended, "at_ms"),
        ms(&acquired, "at_ms"),
    );
}

#[test]
fn locks_and_tokens_survive_daemon_sigkills_and_reconcile_releases_the_dead() {
    let mut daemon = Daemon::start(&[]);
    let live = Orphan::spawn(&["exit", "0"]);
    let mut doomed = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "live", live.pid);
    register(&daemon, "doomed", doomed.pid);
    let first = token(&acquire(&daemon, "live", "repo"));
    let doomed_token = token(&acquire(&daemon, "doomed", "worktree"));

    daemon.kill9();
    // The owner dies while nobody watches.
    doomed.release();
    assert!(eventually(WAIT, || integration_tests::state(doomed.pid).is_none()));
    daemon.restart();

    let listed = locks(&daemon);
    assert_eq!(
        listed.len(),
        1,
        "only the live session's lock is left: {listed:?}"
    );
    assert_eq!(
        (
            &listed[0]["name"],
            &listed[0]["session"],
            &listed[0]["token"]
        ),
        (&json!("repo"), &json!("live"), &json!(first)),
        "held across the restart, same token"
    );
    let ended = daemon.session("doomed");
    assert_eq!(ended["detected_by"], "reconcile", "{ended}");
    let mut replay = subscribe(&daemon, Some(0));
    let released = loop {
        let event = next_lock_event(&mut replay);
        if event.0 == "lock.released" {
            break event;
        }
    };
    assert_eq!(
        released,
        (
            "lock.released".into(),
            "doomed".into(),
            doomed_token,
            json!("session_ended")
        )
    );

    assert_eq!(
        token(&daemon.request(json!({"op": "lock_release", "name": "repo", "session": "live"}))),
        first
    );
    let second = token(&acquire(&daemon, "live", "repo"));
    daemon.kill9();
    daemon.restart();
    daemon.request(json!({"op": "lock_release", "name": "repo", "session": "live"}));
    let third = token(&acquire(&daemon, "live", "repo"));
    assert!(
        doomed_token < second && first < second && second < third,
        "tokens strictly increase across releases and restarts: {first} {doomed_token} {second} {third}"
    );
}

/// Copies the daemon's state directory to `to` (or back), as a backup tool would while the
/// daemon is stopped: files, modes and all.
fn copy_state(from: &std::path::Path, to: &std::path::Path) {
    if to.exists() {
        std::fs::remove_dir_all(to).expect("remove the state directory");
    }
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(copied.success(), "cp -a {}: {copied}", from.display());
}

/// Tokens grow past a state directory restored from an older copy, and past a deleted
/// database: a guarded resource that refuses a token below the highest it has seen never
/// refuses a later holder, nor lets an earlier one in.
#[test]
fn tokens_grow_past_a_restored_or_deleted_state() {
    let mut daemon = Daemon::start(&[]);
    let owner = Orphan::spawn(&["exit", "0"]);
    let mut granted = Vec::new();
    // A few grants of one lock, each released for the next.
    let grant_some = |daemon: &Daemon, granted: &mut Vec<u64>| {
        for _ in 0..3 {
            let token = token(&acquire(daemon, "holder", "deploy"));
            let release = json!({"op": "lock_release", "name": "deploy", "session": "holder"});
            assert_eq!(daemon.request(release)["ok"], true);
            granted.push(token);
        }
    };
    let newest = |granted: &[u64]| granted.iter().copied().max().unwrap_or_default();
    register(&daemon, "holder", owner.pid);
    grant_some(&daemon, &mut granted);
    assert!(daemon.stop().success());
    let older = daemon.dir.path().join("older-copy");
    copy_state(&daemon.state_dir, &older);

    daemon.restart();
    grant_some(&daemon, &mut granted);
    assert!(daemon.stop().success());
    copy_state(&older, &daemon.state_dir);
    daemon.restart();
    let before = newest(&granted);
    let restored = token(&acquire(&daemon, "holder", "deploy"));
    assert!(
        restored > before,
        "after the older copy was restored: token {restored}, though {before} was granted before"
    );
    granted.push(restored);

    assert!(daemon.stop().success());
    for file in ["liveness.db", "liveness.db-wal", "liveness.db-shm"] {
        let _ = std::fs::remove_file(daemon.state_dir.join(file));
    }
    daemon.restart();
    register(&daemon, "holder", owner.pid);
    let before = newest(&granted);
    let fresh = token(&acquire(&daemon, "holder", "deploy"));
    assert!(
        fresh > before,
        "after the database was deleted: token {fresh}, though {before} was granted before"
    );
}

/// The stuck lock: a pending session that is never renamed and whose owner lives on held
/// a lock forever. Now the expiry ends the session and frees its lock for the next in line.
#[test]
fn a_lock_of_a_pending_session_that_never_resolves_is_freed_when_it_expires() {
    let daemon = Daemon::start(&["--pending-ttl", "1s"]);
    let stuck_owner = Orphan::spawn(&["exit", "0"]);
    let waiter_owner = Orphan::spawn(&["exit", "0"]);
    let reply = daemon
        .request(json!({"op": "register", "pending": true, "owner": {"pid": stuck_owner.pid}}));
    let stuck = reply["session"]["id"]
        .as_str()
        .expect("a pending id")
        .to_owned();
    register(&daemon, "next", waiter_owner.pid);
    let held = token(&acquire(&daemon, &stuck, "worktree"));
    let mut waiter = acquire_waiting(&daemon, "next", "worktree");

    let granted = token(&waiter.next_line().expect("the waiter's reply"));
    assert!(granted > held);
    let ended = daemon.session(&stuck);
    assert_eq!(ended["reason"], "pending_expired", "{ended}");
    assert!(
        integration_tests::state(stuck_owner.pid).is_some(),
        "its owner still runs: only the expiry freed the lock"
    );
}

#[test]
fn a_lock_waiter_that_hangs_up_or_times_out_leaves_the_queue() {
    let daemon = Daemon::start(&[]);
    let owners: Vec<_> = (0..4).map(|_| Orphan::spawn(&["exit", "0"])).collect();
    for (id, owner) in ["h", "gone", "chatty", "next"].iter().zip(&owners) {
        register(&daemon, id, owner.pid);
    }
    token(&acquire(&daemon, "h", "l"));
    let gone = acquire_waiting(&daemon, "gone", "l");
    // One that sent more after its request, then hangs up too: what it sent is not read
    // while it waits, and must not hide that it left.
    let mut chatty = acquire_waiting(&daemon, "chatty", "l");
    chatty.send_raw(b"{\"op\":");
    let timed = daemon.cli(&[
        "lock",
        "acquire",
        "l",
        "--session",
        "next",
        "--wait",
        "--timeout",
        "200ms",
    ]);
    assert_eq!(
        timed.status.code(),
        Some(3),
        "still held after the timeout: {timed:?}"
    );
    let mut next = acquire_waiting(&daemon, "next", "l");
    assert!(eventually(WAIT, || locks(&daemon)[0]["waiters"] == 3));
    drop(gone);
    drop(chatty);
    assert!(
        eventually(WAIT, || locks(&daemon)[0]["waiters"] == 1),
        "the closed connections left the queue: {:?}",
        locks(&daemon)
    );
    daemon.request(json!({"op": "lock_release", "name": "l", "session": "h"}));
    token(
        &next
            .next_line()
            .expect("the reply of the waiter after the one that left"),
    );
    assert_eq!(locks(&daemon)[0]["session"], "next");
}

#[test]
fn another_user_cannot_release_or_see_a_lock() {
    if !privileged("another_user_cannot_release_or_see_a_lock") {
        return;
    }
    const ALICE: u32 = 61_011;
    const BOB: u32 = 61_012;
    let (daemon, binaries) = shared_daemon();
    let (alice, bob) = (process_of(ALICE), process_of(BOB));
    for (uid, process) in [(ALICE, &alice), (BOB, &bob)] {
        let pid = process.id().to_string();
        let registered = cli_as(
            &binaries,
            &daemon,
            uid,
            &["register", "--session", "s", "--owner-pid", &pid],
        );
        assert!(registered.status.success(), "{registered:?}");
    }
    let taken = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &["lock", "acquire", "build", "--session", "s", "--json"],
    );
    assert!(taken.status.success(), "{taken:?}");
    let alices = json_of(&taken);
    assert_eq!(alices["uid"], ALICE);

    let named = cli_as(
        &binaries,
        &daemon,
        BOB,
        &[
            "lock",
            "release",
            "build",
            "--session",
            "s",
            "--uid",
            &ALICE.to_string(),
        ],
    );
    assert_eq!(
        named.status.code(),
        Some(77),
        "bob names alice's session: {named:?}"
    );
    let own = cli_as(
        &binaries,
        &daemon,
        BOB,
        &["lock", "release", "build", "--session", "s"],
    );
    assert_eq!(
        own.status.code(),
        Some(65),
        "bob's own session holds no such lock: {own:?}"
    );
    let bobs_view = cli_as(&binaries, &daemon, BOB, &["lock", "list", "--json"]);
    assert_eq!(
        json_of(&bobs_view),
        json!([]),
        "bob sees none of alice's locks"
    );
    // Names are per user: bob's "build" is another lock.
    let bobs = cli_as(
        &binaries,
        &daemon,
        BOB,
        &["lock", "acquire", "build", "--session", "s", "--json"],
    );
    assert!(bobs.status.success(), "{bobs:?}");
    let root_view = locks(&daemon);
    assert_eq!(root_view.len(), 2, "root sees both: {root_view:?}");
    assert!(
        root_view.contains(&alices),
        "alice's lock is untouched: {root_view:?}"
    );
}

#[test]
fn a_users_waiting_lock_acquire_does_not_hold_up_its_other_requests() {
    if !privileged("a_users_waiting_lock_acquire_does_not_hold_up_its_other_requests") {
        return;
    }
    const CAROL: u32 = 61_013;
    // One request of hers at a time: a waiting acquire that kept its turn would block the
    // release it waits for.
    let (daemon, binaries) = shared_daemon_with(&["--max-requests-per-uid", "1"]);
    let process = process_of(CAROL);
    let pid = process.id().to_string();
    for id in ["holder", "waiter"] {
        let registered = cli_as(
            &binaries,
            &daemon,
            CAROL,
            &["register", "--session", id, "--owner-pid", &pid],
        );
        assert!(registered.status.success(), "{registered:?}");
    }
    let held = cli_as(
        &binaries,
        &daemon,
        CAROL,
        &["lock", "acquire", "l", "--session", "holder"],
    );
    assert!(held.status.success(), "{held:?}");
    let waiting = std::process::Command::new(binaries.path("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args([
            "lock",
            "acquire",
            "l",
            "--session",
            "waiter",
            "--wait",
            "--json",
        ])
        .uid(CAROL)
        .gid(CAROL)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start a waiting acquire as carol");
    assert!(eventually(WAIT, || locks(&daemon)
        .first()
        .is_some_and(|l| l["waiters"] == 1)));
    // Bounded: held up behind the waiting request, it would never return.
    let released = std::process::Command::new("timeout")
        .arg("20")
        .arg(binaries.path("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["lock", "release", "l", "--session", "holder"])
        .uid(CAROL)
        .gid(CAROL)
        .output()
        .expect("run liveness lock release as carol");
    assert!(
        released.status.success(),
        "the release must not wait behind the waiting acquire: {released:?}"
    );
    let granted = waiting.wait_with_output().expect("the waiting acquire");
    assert!(granted.status.success(), "{granted:?}");
    assert_eq!(json_of(&granted)["session"], "waiter");
}

/// A shell command that reports its environment and then does what `then` says.
fn script(then: &str) -> String {
    format!("echo \"session=$LIVENESS_SESSION token=$LIVENESS_LOCK_TOKEN\"; {then}")
}

#[test]
fn run_exits_with_the_commands_status_and_ends_its_session() {
    let daemon = Daemon::start(&[]);
    for (then, code) in [("exit 0", 0), ("exit 7", 7), ("kill -9 $$", 128 + 9)] {
        let id = format!("job-{code}");
        let output = daemon.cli(&[
            "run",
            "--session",
            &id,
            "--label",
            "k=v",
            "--",
            "sh",
            "-c",
            &script(then),
        ]);
        assert_eq!(output.status.code(), Some(code), "{then}: {output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            stdout.contains(&format!("session={id} token=\n")),
            "{stdout}"
        );
        let ended = daemon.session(&id);
        assert_eq!(
            (&ended["phase"], &ended["reason"], &ended["labels"]["k"]),
            (&json!("ended"), &json!("owner_exited"), &json!("v")),
            "ended by the time run returns: {ended}"
        );
        assert_eq!(
            ended["owner"]["comm"], "sh",
            "registered under CMD's name, not liveness's: {ended}"
        );
    }
    let generated = daemon.cli(&["run", "--", "sh", "-c", &script("true")]);
    let stdout = String::from_utf8_lossy(&generated.stdout).into_owned();
    assert!(
        stdout.starts_with("session=run-"),
        "a generated id: {stdout}"
    );
    let missing = daemon.cli(&["run", "--", "/nonexistent/cmd"]);
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
}

/// 127 when CMD is not found, 126 when it is found but cannot be executed, as a shell
/// says, each with its own reason.
#[test]
fn run_says_whether_cmd_was_not_found_or_not_executable() {
    let daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("not-executable.sh");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    for (cmd, code, says) in [
        ("no-such-program-anywhere", 127, "not found"),
        ("/nonexistent/cmd", 127, "not found"),
        (plain.to_str().unwrap(), 126, "permission denied"),
    ] {
        let output = daemon.cli(&["run", "--", cmd]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{cmd}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot execute {cmd}: {says}")),
            "{cmd}: {stderr}"
        );
    }
}

#[test]
fn lock_run_holds_the_lock_for_the_commands_lifetime_only() {
    let daemon = Daemon::start(&[]);
    let output = daemon.cli(&[
        "lock",
        "run",
        "deploy",
        "--session",
        "r1",
        "--",
        "sh",
        "-c",
        &script("exit 5"),
    ]);
    assert_eq!(
        output.status.code(),
        Some(5),
        "CMD's own status: {output:?}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let run_token: u64 = stdout
        .trim()
        .rsplit("token=")
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in CMD's environment: {stdout:?}"));
    assert!(locks(&daemon).is_empty(), "free once lock run has returned");

    // While one holds it, another without --wait is refused and CMD never runs.
    let holder = Orphan::spawn(&["exit", "0"]);
    register(&daemon, "holder", holder.pid);
    let held = token(&acquire(&daemon, "holder", "deploy"));
    assert!(held > run_token, "{run_token} then {held}");
    let refused = daemon.cli(&[
        "lock",
        "run",
        "deploy",
        "--session",
        "refused",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    assert!(refused.stdout.is_empty(), "CMD must not run: {refused:?}");
    assert_eq!(locks(&daemon)[0]["session"], "holder");
    // It says so, and so does the session: not CMD's exit with the waiting child's code.
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("sh never started: ") && stderr.contains("wait for it with --wait"),
        "{stderr}"
    );
    let session = daemon.session("refused");
    assert_eq!(session["reason"], "stopped", "{session}");
    assert_eq!(session["exit"], Value::Null, "{session}");

    // With --wait, CMD runs once the holder lets go, with the next token.
    let waiting = liveness(&daemon)
        .args([
            "lock",
            "run",
            "deploy",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo $LIVENESS_LOCK_TOKEN",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start liveness lock run --wait");
    assert!(eventually(WAIT, || locks(&daemon)[0]["waiters"] == 1));
    daemon.request(json!({"op": "lock_release", "name": "deploy", "session": "holder"}));
    let output = waiting.wait_with_output().expect("lock run --wait");
    assert!(output.status.success(), "{output:?}");
    let waited: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("a token");
    assert!(waited > held, "{held} then {waited}");
    assert!(locks(&daemon).is_empty(), "free once lock run has returned");
}

/// The `liveness` CLI pointed at `daemon`, to start in the background.
fn liveness(daemon: &Daemon) -> std::process::Command {
    let mut command = std::process::Command::new(integration_tests::binary("liveness"));
    command.arg("--socket").arg(&daemon.socket);
    command
}

#[test]
fn run_passes_sigterm_on_to_the_command() {
    let daemon = Daemon::start(&[]);
    let mut run = liveness(&daemon)
        .args([
            "lock",
            "run",
            "signals",
            "--session",
            "sig",
            "--",
            "sleep",
            "300",
        ])
        .spawn()
        .expect("start liveness lock run");
    assert!(
        eventually(WAIT, || locks(&daemon).len() == 1),
        "the lock is taken before sleep runs"
    );
    // Signals are passed on once CMD runs (before, they stop liveness and CMD never runs).
    let owner = daemon.session("sig")["owner"]["pid"].clone();
    let comm = format!("/proc/{owner}/comm");
    assert!(
        eventually(WAIT, || std::fs::read_to_string(&comm)
            .is_ok_and(|c| c.trim() == "sleep")),
        "the session's owner becomes sleep"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let status = run.wait().expect("wait for liveness");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "sleep died of the forwarded SIGTERM: {status:?}"
    );
    assert!(locks(&daemon).is_empty(), "released with the session");
    let ended = daemon.session("sig");
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    if privileged("run_passes_sigterm_on_to_the_command") {
        assert_eq!(
            ended["exit"]["signal"],
            libc::SIGTERM,
            "eBPF saw the signal: {ended}"
        );
    }
}

#[test]
fn the_client_libraries_take_wait_for_and_release_locks() {
    use liveness_client::nonblocking::AsyncClient;
    use liveness_client::{Client, ErrorCode, Scope};
    let daemon = Daemon::start(&[]);
    let (a, b) = (Orphan::spawn(&["exit", "0"]), Orphan::spawn(&["exit", "0"]));
    register(&daemon, "a", a.pid);
    register(&daemon, "b", b.pid);
    let mut client = Client::connect(&daemon.socket).expect("connect");
    let held = client
        .lock_acquire("lib", "a", None, false, None, Scope::Host)
        .expect("a free lock");
    let refused = client
        .lock_acquire("lib", "b", None, false, None, Scope::Host)
        .expect_err("held by a");
    assert_eq!(refused.code(), Some(ErrorCode::LockHeld), "{refused}");

    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let socket = daemon.socket.clone();
    let waiting = runtime.spawn(async move {
        let mut client = AsyncClient::connect(&socket).await?;
        client
            .lock_acquire("lib", "b", None, true, Some(WAIT), Scope::Host)
            .await
    });
    assert!(eventually(WAIT, || {
        client.lock_list(None).expect("lock_list")[0].waiters == 1
    }));
    let released = client
        .lock_release("lib", "a", None, Scope::Host)
        .expect("release");
    assert_eq!(released.token, held.token);
    let granted = runtime
        .block_on(waiting)
        .expect("the task")
        .expect("granted to the async waiter");
    assert_eq!(granted.session, "b");
    assert!(granted.token > held.token);
}

#[test]
fn run_with_on_end_terminate_ends_what_the_command_left_running() {
    let daemon = Daemon::start(&[]);
    let output = daemon.cli(&[
        "run",
        "--session",
        "leaves",
        "--on-end",
        "terminate",
        "--grace",
        "1s",
        "--",
        "sh",
        "-c",
        "sleep 300 >/dev/null 2>&1 & echo $!",
    ]);
    assert!(output.status.success(), "{output:?}");
    let left: u32 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the background pid: {output:?}"));
    assert!(
        eventually(WAIT, || integration_tests::state(left)
            .is_none_or(|s| s == 'Z')),
        "the sleep CMD left behind was terminated with its session"
    );
    assert_eq!(daemon.session("leaves")["on_end"], "terminate");
}

/// Item 7 of the hardening issue: one user made 102,400 locks and its `lock_list` took
/// seconds. Locks are bounded per uid, their names count in the per-uid bytes, a refusal
/// changes nothing, and `lock_list` comes in pages.
#[test]
fn a_users_locks_are_bounded_counted_in_its_bytes_and_listed_in_pages() {
    if !privileged("a_users_locks_are_bounded_counted_in_its_bytes_and_listed_in_pages") {
        return;
    }
    const MALLORY: u32 = 61_021;
    let daemon = Daemon::start(&[
        "--max-locks-per-uid",
        "3",
        "--max-label-bytes-per-uid",
        "40",
    ]);
    integration_tests::open_socket_to_everyone(&daemon);
    let owner = process_of(MALLORY);
    let mut mallory = integration_tests::ClientAs::connect(&daemon, MALLORY);
    let mut ask = |request: Value| mallory.request(&request).expect("a reply");
    let registered = ask(json!({"op": "register", "session": "s", "owner": {"pid": owner.id()}}));
    assert_eq!(registered["ok"], true, "{registered}");
    let take = |name: &str| json!({"op": "lock_acquire", "name": name, "session": "s"});
    let code = |reply: &Value| {
        reply["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    // 30 bytes of names, then one whose 11 would pass the 40 bytes.
    for name in ["a".repeat(10), "b".repeat(10), "c".repeat(10)] {
        let granted = ask(take(&name));
        assert_eq!(granted["ok"], true, "{name}: {granted}");
    }
    let fourth = ask(take("d"));
    assert_eq!(code(&fourth), "limit_reached", "a fourth lock: {fourth}");
    let released = ask(json!({"op": "lock_release", "name": "c".repeat(10), "session": "s"}));
    assert_eq!(released["ok"], true, "{released}");
    let long = ask(take(&"e".repeat(21)));
    assert_eq!(code(&long), "limit_reached", "41 bytes of names: {long}");
    let short = ask(take(&"e".repeat(20)));
    assert_eq!(short["ok"], true, "40 bytes of names: {short}");

    // The refusals changed nothing: mallory holds exactly what was granted.
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut request = json!({"op": "lock_list", "limit": 1});
        if let Some(after) = &after {
            request["after"] = json!(after);
        }
        let page = ask(request);
        assert_eq!(page["ok"], true, "{page}");
        let locks = page["locks"].as_array().expect("locks");
        assert!(locks.len() <= 1, "a page of 1: {page}");
        names.extend(
            locks
                .iter()
                .map(|lock| lock["name"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(names, ["a".repeat(10), "b".repeat(10), "e".repeat(20)]);
    let bad = ask(json!({"op": "lock_list", "limit": 0}));
    assert_eq!(code(&bad), "invalid_request", "{bad}");
}
