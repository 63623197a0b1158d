//! The cleanup policy: a session's surviving processes are terminated when it ends
//! (`register --on-end terminate --grace`) or on request (`end --terminate`), through
//! pidfds verified against their fingerprints, and `session.reaped` says what happened.
//! Real daemon, real process trees of orphans, real signals.

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use integration_tests::{
    ClientAs, Conn, Daemon, Family, Fingerprint, Orphan, TestprocAs, binary, cli_as,
    copy_executable, eventually, open_socket_to_everyone, privileged, shared_daemon,
};
use serde_json::{Value, json};

/// The grace the tests ask for.
const GRACE: Duration = Duration::from_secs(1);
/// Added to the grace for everything else a reap waits on: generous, as machines are noisy.
const MARGIN: Duration = Duration::from_secs(20);
/// A user with no processes of its own here.
const ALICE: u32 = 61_011;

/// A daemon, and a stream of its events from the first.
fn daemon_and_stream() -> (Daemon, Conn) {
    let daemon = Daemon::start(&[]);
    let stream = subscribe(&daemon);
    (daemon, stream)
}

/// A stream of every event, from the start of the store.
fn subscribe(daemon: &Daemon) -> Conn {
    let mut conn = daemon.connect();
    let reply = conn.request(json!({"op": "subscribe", "since": 0}));
    assert_eq!(reply["ok"], true, "subscribe: {reply}");
    conn
}

fn pids(reaped: &Value, outcome: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = reaped[outcome]
        .as_array()
        .unwrap_or_else(|| panic!("session.reaped has no {outcome} list: {reaped}"))
        .iter()
        .map(|pid| pid.as_u64().expect("a pid") as u32)
        .collect();
    pids.sort_unstable();
    pids
}

fn failed_pids(reaped: &Value) -> Vec<u32> {
    let mut pids: Vec<u32> = reaped["failed"]
        .as_array()
        .expect("a failed list")
        .iter()
        .map(|failure| failure["pid"].as_u64().expect("a pid") as u32)
        .collect();
    pids.sort_unstable();
    pids
}

fn sorted(mut pids: Vec<u32>) -> Vec<u32> {
    pids.sort_unstable();
    pids
}

fn cli_ok(daemon: &Daemon, args: &[&str]) -> Value {
    let output = daemon.cli(args);
    assert!(
        output.status.success(),
        "liveness {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

/// `liveness register --session SESSION --owner-pid OWNER EXTRA... --json`.
fn register(daemon: &Daemon, session: &str, family: &Family, extra: &[&str]) -> Value {
    let owner = family.pid().to_string();
    let mut args = vec!["register", "--session", session, "--owner-pid", &owner];
    args.extend(extra);
    args.push("--json");
    cli_ok(daemon, &args)
}

fn gone_within(process: Fingerprint, within: Duration) -> bool {
    eventually(within, || !process.is_running())
}

/// A process of the test's own that is given `pid` (free now) through
/// `/proc/sys/kernel/ns_last_pid`: what an unrelated process that reused a member's pid
/// looks like. Other processes fork meanwhile, so it takes a few tries.
fn process_with_pid(pid: u32) -> Child {
    for _ in 0..500 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("write ns_last_pid (needs root)");
        let mut child = Command::new("sleep")
            .arg("300")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        if child.id() == pid {
            return child;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a process with pid {pid}: something else keeps taking it");
}

/// Kills the process `child` on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn reap_on_owner_death_ends_every_survivor_and_nothing_else() {
    if !privileged("reap_on_owner_death_ends_every_survivor_and_nothing_else") {
        return;
    }
    let (daemon, mut stream) = daemon_and_stream();
    let mut family = Family::spawn();
    let bystander = Orphan::spawn(&["exit", "0"]);
    let registered = register(
        &daemon,
        "agent",
        &family,
        &["--on-end", "terminate", "--grace", "1s"],
    );
    assert_eq!(
        (&registered["on_end"], &registered["grace_ms"]),
        (&json!("terminate"), &json!(1000)),
        "{registered}"
    );

    // One member from before the registration, orphaned after it; two forked and
    // orphaned after it, one of which ignores SIGTERM.
    family.release();
    let before = family.before;
    let after = family.orphan();
    let stubborn = family.stubborn();
    // A member that dies, and whose pid an unrelated process then takes.
    let doomed = family.orphan();
    doomed.kill();
    assert!(
        eventually(MARGIN, || integration_tests::state(doomed.pid).is_none()),
        "member {} was not reaped by init",
        doomed.pid
    );
    let reused = Reaped(process_with_pid(doomed.pid));

    family.kill_owner();
    let ended = stream.next_event_of("session.ended", "agent", MARGIN);
    assert_eq!(ended["on_end"], "terminate", "{ended}");
    let survivors: Vec<u32> = ended["survivors"]["members"]
        .as_array()
        .map(|members| {
            members
                .iter()
                .filter_map(|member| member["pid"].as_u64().map(|pid| pid as u32))
                .collect()
        })
        .unwrap_or_default();
    for member in [before, after, stubborn] {
        assert!(
            survivors.contains(&member.pid),
            "the ended event lists survivor {}: {ended}",
            member.pid
        );
    }
    let reaped = stream.next_event_of("session.reaped", "agent", GRACE + MARGIN);
    let outcome = &reaped["reaped"];
    assert_eq!(
        pids(outcome, "terminated"),
        sorted(vec![before.pid, after.pid]),
        "{reaped}"
    );
    assert_eq!(pids(outcome, "killed"), vec![stubborn.pid], "{reaped}");
    assert_eq!(failed_pids(outcome), Vec::<u32>::new(), "{reaped}");
    for untouched in [bystander.pid, reused.0.id()] {
        for list in ["terminated", "killed"] {
            assert!(
                !pids(outcome, list).contains(&untouched),
                "pid {untouched} is outside the tree but was {list}: {reaped}"
            );
        }
    }
    assert_eq!(
        (reaped["seq"].as_u64(), &reaped["owner"]),
        (ended["seq"].as_u64().map(|seq| seq + 1), &ended["owner"]),
        "session.reaped follows session.ended about the same owner"
    );

    for member in [before, after, stubborn] {
        assert!(
            gone_within(member, GRACE + MARGIN),
            "member {} still runs",
            member.pid
        );
    }
    assert!(
        Fingerprint::of(bystander.pid).is_running(),
        "the bystander was signalled"
    );
    let mut reused = reused;
    assert!(
        reused.0.try_wait().expect("try_wait").is_none(),
        "the process that reused a dead member's pid was signalled"
    );
    // Stored, so a consumer that was away replays it.
    let replayed = subscribe(&daemon).next_event_of("session.reaped", "agent", MARGIN);
    assert_eq!(replayed, reaped, "replayed as it was published");
}

#[test]
fn reap_on_request_spares_a_live_owner_and_leave_leaves_a_tree() {
    if !privileged("reap_on_request_spares_a_live_owner_and_leave_leaves_a_tree") {
        return;
    }
    let (daemon, mut stream) = daemon_and_stream();

    // The default policy: the owner's death leaves its tree running.
    let mut left = Family::spawn();
    register(&daemon, "kept", &left, &[]);
    let kept = left.orphan();
    left.kill_owner();
    let ended = stream.next_event_of("session.ended", "kept", MARGIN);
    assert!(
        ended.get("on_end").is_none(),
        "leave is not spelled out: {ended}"
    );

    // On request, whatever the policy. A live owner, and what still descends from it, are
    // the registering tool's to manage; while the owner has another active session, the
    // tree is that session's too.
    let mut asked = Family::spawn();
    register(&daemon, "now", &asked, &[]);
    register(&daemon, "next", &asked, &[]);
    let member = asked.orphan();
    cli_ok(
        &daemon,
        &["end", "--session", "now", "--terminate", "--json"],
    );
    let shared = stream.next_event_of("session.reaped", "now", MARGIN);
    let failed = failed_pids(&shared["reaped"]);
    assert!(
        failed.contains(&asked.before.pid) && failed.contains(&member.pid),
        "{shared}"
    );
    assert!(
        shared["reaped"]["failed"][0]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("\"next\"")),
        "the reason names the session that shares the tree: {shared}"
    );
    assert!(member.is_running(), "a shared tree was signalled");

    let ended = cli_ok(
        &daemon,
        &["end", "--session", "next", "--terminate", "--json"],
    );
    assert_eq!(ended["reason"], "stopped", "{ended}");
    let reaped = stream.next_event_of("session.reaped", "next", MARGIN);
    assert_eq!(
        pids(&reaped["reaped"], "terminated"),
        vec![member.pid],
        "only the orphan: {reaped}"
    );
    assert!(
        gone_within(member, MARGIN),
        "member {} still runs",
        member.pid
    );
    assert!(
        Fingerprint::of(asked.pid()).is_running() && asked.before.is_running(),
        "the live owner or its descendant was signalled"
    );

    assert!(
        kept.is_running(),
        "a session with the leave policy had its process {} ended",
        kept.pid
    );
    let plain_end = daemon.request(json!({"op": "end", "session": "kept", "terminate": true}));
    assert_eq!(
        plain_end["error"]["code"], "already_ended",
        "an ended session's tree is not reaped after the fact: {plain_end}"
    );
    assert!(kept.is_running());
}

#[test]
fn reap_for_a_user_never_signals_roots_processes() {
    if !privileged("reap_for_a_user_never_signals_roots_processes") {
        return;
    }
    let (daemon, binaries) = shared_daemon();
    let mut stream = subscribe(&daemon);
    // Root registers its own process tree in alice's namespace: her session, root's processes.
    let mut family = Family::spawn();
    register(&daemon, "mine", &family, &["--uid", &ALICE.to_string()]);
    family.release();
    let hers = family.orphan_as(ALICE);
    let roots = family.orphan();

    let ended = cli_as(
        &binaries,
        &daemon,
        ALICE,
        &["end", "--session", "mine", "--terminate", "--json"],
    );
    assert!(
        ended.status.success(),
        "alice ends her session: {}",
        String::from_utf8_lossy(&ended.stderr)
    );
    let reaped = stream.next_event_of("session.reaped", "mine", MARGIN);
    let outcome = &reaped["reaped"];
    assert_eq!(pids(outcome, "terminated"), vec![hers.pid], "{reaped}");
    assert_eq!(
        failed_pids(outcome),
        sorted(vec![family.before.pid, roots.pid]),
        "{reaped}"
    );
    for failure in outcome["failed"].as_array().unwrap() {
        let reason = failure["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("uid 0") && reason.contains(&format!("uid {ALICE}")),
            "the reason names both users: {reason}"
        );
    }
    assert!(gone_within(hers, MARGIN), "alice's process still runs");
    for root_process in [roots, family.before] {
        assert!(
            root_process.is_running(),
            "root's process {} was signalled",
            root_process.pid
        );
    }
    assert!(
        Fingerprint::of(family.pid()).is_running(),
        "root's owner was signalled"
    );
}

/// Whether the daemon's database holds `member` among the persisted members of a tree:
/// what a daemon that starts after a crash knows of the trees.
fn persisted(daemon: &Daemon, member: Fingerprint) -> bool {
    let db = rusqlite::Connection::open_with_flags(
        daemon.state_dir.join("liveness.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the daemon's database");
    db.busy_timeout(MARGIN).expect("busy timeout");
    db.query_row(
        "SELECT COUNT(*) FROM members WHERE pid = ?1 AND start_ticks = ?2",
        [i64::from(member.pid), member.start_ticks as i64],
        |row| row.get::<_, i64>(0),
    )
    .expect("read the members table")
        == 1
}

/// Every stored event, replayed from the first up to the head at subscription.
fn replay_all(daemon: &Daemon) -> Vec<Value> {
    let mut conn = daemon.connect();
    let ack = conn.request(json!({"op": "subscribe", "since": 0}));
    let head = ack["subscribed"]["head"]
        .as_u64()
        .unwrap_or_else(|| panic!("subscribe: {ack}"));
    let mut events: Vec<Value> = Vec::new();
    while events
        .last()
        .map_or(0, |event| event["seq"].as_u64().unwrap_or(0))
        < head
    {
        let line = conn
            .next_within(MARGIN)
            .unwrap_or_else(|| panic!("the replay stopped before seq {head}: {events:?}"));
        events.push(line["event"].clone());
    }
    events
}

fn count_of(events: &[Value], kind: &str, session: &str) -> usize {
    events
        .iter()
        .filter(|event| event["kind"] == kind && event["session"] == session)
        .count()
}

#[test]
fn reap_of_an_owner_that_died_while_the_daemon_was_down() {
    if !privileged("reap_of_an_owner_that_died_while_the_daemon_was_down") {
        return;
    }
    let mut daemon = Daemon::start(&[]);
    let mut family = Family::spawn();
    let bystander = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        "away",
        &family,
        &["--on-end", "terminate", "--grace", "1s"],
    );
    family.release();
    let before = family.before;
    let after = family.orphan();
    let doomed = family.orphan();
    // What a daemon that crashes knows of the tree is what it persisted.
    for member in [before, after, doomed] {
        assert!(
            eventually(MARGIN, || persisted(&daemon, member)),
            "member {} was never persisted",
            member.pid
        );
    }
    daemon.kill9();

    // While no daemon runs: a member dies and an unrelated process takes its pid, then the
    // owner dies.
    doomed.kill();
    assert!(
        eventually(MARGIN, || integration_tests::state(doomed.pid).is_none()),
        "member {} was not reaped by init",
        doomed.pid
    );
    let mut impostor = Reaped(process_with_pid(doomed.pid));
    family.kill_owner();
    daemon.restart();

    let mut stream = subscribe(&daemon);
    let ended = stream.next_event_of("session.ended", "away", MARGIN);
    assert_eq!(
        (&ended["detected_by"], &ended["on_end"]),
        (&json!("reconcile"), &json!("terminate")),
        "{ended}"
    );
    let survivors: Vec<u32> = ended["survivors"]["members"]
        .as_array()
        .map(|members| {
            members
                .iter()
                .filter_map(|member| member["pid"].as_u64().map(|pid| pid as u32))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        sorted(survivors),
        sorted(vec![before.pid, after.pid]),
        "the persisted members still alive survive, the dead one's pid is not one: {ended}"
    );
    let reaped = stream.next_event_of("session.reaped", "away", GRACE + MARGIN);
    let outcome = &reaped["reaped"];
    assert_eq!(
        pids(outcome, "terminated"),
        sorted(vec![before.pid, after.pid]),
        "{reaped}"
    );
    assert_eq!(pids(outcome, "killed"), Vec::<u32>::new(), "{reaped}");
    assert_eq!(failed_pids(outcome), Vec::<u32>::new(), "{reaped}");
    for member in [before, after] {
        assert!(
            gone_within(member, MARGIN),
            "member {} still runs",
            member.pid
        );
    }
    assert!(
        Fingerprint::of(bystander.pid).is_running(),
        "the bystander was signalled"
    );
    assert!(
        impostor.0.try_wait().expect("try_wait").is_none(),
        "the process that took a dead member's pid was signalled"
    );
}

/// A reap waiting out its grace when `interrupt` ends the daemon runs again at the next
/// start, and one `session.reaped` is recorded.
fn a_reap_cut_short_runs_again(session: &str, interrupt: fn(&mut Daemon)) {
    // Long enough that the daemon is surely interrupted within it.
    const LONG_GRACE: Duration = Duration::from_secs(8);
    let mut daemon = Daemon::start(&[]);
    let mut family = Family::spawn();
    register(
        &daemon,
        session,
        &family,
        &["--on-end", "terminate", "--grace", "8s"],
    );
    family.release();
    let stubborn = family.stubborn();
    let heeds = family.orphan();
    family.kill_owner();
    // Those that heed SIGTERM are gone once it was sent: the reap waits out its grace.
    for heeds in [family.before, heeds] {
        assert!(
            gone_within(heeds, MARGIN),
            "the reap's SIGTERM did not end {}:\n{}",
            heeds.pid,
            daemon.log()
        );
    }
    interrupt(&mut daemon);
    assert!(
        stubborn.is_running(),
        "SIGKILL was sent though the grace had not passed"
    );

    daemon.restart();
    let mut stream = subscribe(&daemon);
    let reaped = stream.next_event_of("session.reaped", session, LONG_GRACE + MARGIN);
    let outcome = &reaped["reaped"];
    assert_eq!(outcome["resumed"], true, "{reaped}");
    assert_eq!(pids(outcome, "killed"), vec![stubborn.pid], "{reaped}");
    assert_eq!(
        pids(outcome, "exited"),
        sorted(vec![family.before.pid, heeds.pid]),
        "what the first run ended had exited: {reaped}"
    );
    assert_eq!(failed_pids(outcome), Vec::<u32>::new(), "{reaped}");
    assert!(gone_within(stubborn, MARGIN), "{} still runs", stubborn.pid);

    // Once: across one more restart, the log holds one of each.
    assert!(daemon.stop().success());
    daemon.restart();
    let events = replay_all(&daemon);
    assert_eq!(
        (
            count_of(&events, "session.ended", session),
            count_of(&events, "session.reaped", session)
        ),
        (1, 1),
        "{events:?}"
    );
}

#[test]
fn reap_cut_by_a_daemon_crash_runs_again_at_the_next_start() {
    if !privileged("reap_cut_by_a_daemon_crash_runs_again_at_the_next_start") {
        return;
    }
    a_reap_cut_short_runs_again("crashed", Daemon::kill9);
}

#[test]
fn reap_cut_by_a_daemon_stop_runs_again_at_the_next_start() {
    if !privileged("reap_cut_by_a_daemon_stop_runs_again_at_the_next_start") {
        return;
    }
    a_reap_cut_short_runs_again("stopped", |daemon| {
        // Within the daemon's own stop bound, not the grace.
        let status = daemon.stop();
        assert!(status.success(), "livenessd stopped with {status}");
        assert!(
            daemon
                .log()
                .contains("stopping while terminating sessions' processes"),
            "the cut reap is logged:\n{}",
            daemon.log()
        );
    });
}

/// Kills the process on drop, if it is still the same one.
struct KillOnDrop(Fingerprint);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill();
    }
}

/// A user's survivor that takes root's ids during the grace (on SIGTERM it execs a
/// set-user-ID-root program, which calls `setresuid(0, 0, 0)`) may no longer be signalled
/// by that user: the root daemon does not SIGKILL it on the user's behalf, and reports it
/// under `failed` with what changed.
#[test]
fn a_survivor_that_becomes_root_during_the_grace_is_not_killed() {
    if !privileged("a_survivor_that_becomes_root_during_the_grace_is_not_killed") {
        return;
    }
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let mut stream = subscribe(&daemon);
    // A set-user-ID-root copy of testproc, where the user can run it.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), Permissions::from_mode(0o755)).expect("chmod");
    let helper = dir.path().join("testproc-setuid");
    copy_executable(&binary("testproc"), &helper);
    std::fs::set_permissions(&helper, Permissions::from_mode(0o4755)).expect("chmod u+s");

    let mut owner = TestprocAs::spawn(ALICE, &["survivors", "1", &helper.to_string_lossy()]);
    let member = owner
        .read_line()
        .and_then(|line| line.trim().parse().ok())
        .map(Fingerprint::of)
        .expect("the survivor's pid");
    let member = KillOnDrop(member);
    assert_eq!(owner.read_line().as_deref(), Some("ready\n"));
    let mut alice = ClientAs::connect(&daemon, ALICE);
    let reply = alice
        .request(
            &json!({"op": "register", "session": "rooted", "owner": {"pid": owner.pid()},
            "on_end": "terminate", "grace_ms": GRACE.as_millis() as u64}),
        )
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    alice.wait_for_tree("rooted", 2, MARGIN);

    // The owner exits; its child survives it, takes root's ids on SIGTERM and says so.
    owner.to = None;
    let said = owner.into_lines();
    let ended = stream.next_event_of("session.ended", "rooted", MARGIN);
    assert_eq!(ended["reason"], "owner_exited", "{ended}");
    assert_eq!(
        said.recv_timeout(MARGIN).as_deref(),
        Ok("root\n"),
        "the survivor did not become root on SIGTERM"
    );

    let reaped = stream.next_event_of("session.reaped", "rooted", GRACE + MARGIN);
    let outcome = &reaped["reaped"];
    assert_eq!(pids(outcome, "killed"), Vec::<u32>::new(), "{reaped}");
    assert_eq!(failed_pids(outcome), vec![member.0.pid], "{reaped}");
    let reason = outcome["failed"][0]["reason"].as_str().unwrap_or_default();
    let changed = format!("from real uid {ALICE} saved uid {ALICE} to real uid 0 saved uid 0");
    for says in [changed.as_str(), "not sent SIGKILL"] {
        assert!(reason.contains(says), "{reason:?} lacks {says:?}");
    }
    assert!(
        member.0.is_running(),
        "the survivor that became root was signalled"
    );
}

/// What the inner owner of [`nested_session_of_another_user`] runs (`sh SCRIPT LIVENESS
/// SOCKET`): it registers a session of its own on itself, prints its pid, forks a daemon
/// (`setsid`, orphaned at once) that prints its pid, and lives on. Pids are read in
/// `/proc`, which is the daemon's, as the field `ppid` of a `cut` the shell forks: in a PID
/// namespace of its own, `$$` is 1.
const INNER_OWNER: &str = r#"
"$1" --socket "$2" register --session inner --owner-pid $$ >/dev/null || exit 1
cut -d' ' -f4 /proc/self/stat
(setsid sh -c 'cut -d" " -f4 /proc/self/stat; exec sleep 1000' &)
exec sleep 1000
"#;

/// Where alice's session is nested in root's job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nesting {
    /// On the job's owner itself (as an agent's hook registers with `--owner auto`); root
    /// ends the job with `end` while that owner lives on.
    OnTheJobsOwner,
    /// On a process the job started in a user and PID namespace of hers; the job's owner
    /// dies.
    InHerNamespaces,
}

/// A user escapes nothing by nesting: root registers a job of alice's with `--on-end
/// terminate`; inside it, a process of alice's registers a session of its own on itself, in
/// her namespace of session ids, and forks a daemon. When the job ends, the reap of root's
/// session ends that daemon (and the inner owner, unless it is the job's owner, which is
/// never signalled): what alice started inside root's job belongs to the job for life,
/// whoever registered what inside it.
fn nested_session_of_another_user(nesting: Nesting) {
    let (daemon, binaries) = shared_daemon();
    let mut stream = subscribe(&daemon);
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::set_permissions(dir.path(), Permissions::from_mode(0o755)).expect("chmod");
    let script = dir.path().join("inner.sh");
    std::fs::write(&script, INNER_OWNER).expect("write the inner owner's script");
    // Alice's job starts the inner owner once it is told to: after its registration.
    let start = match nesting {
        Nesting::OnTheJobsOwner => ". \"$script\"",
        Nesting::InHerNamespaces => {
            "unshare --user --map-root-user --pid --fork sh \"$script\" \"$@\" & read -r never"
        }
    };
    let job = format!(r#"read -r go; script=$1; shift; {start}"#);
    let mut job = Command::new("sh")
        .args(["-c", &job, "job"])
        .arg(&script)
        .arg(binaries.path("liveness"))
        .arg(&daemon.socket)
        .uid(ALICE)
        .gid(ALICE)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run alice's job");
    let job_owner = Fingerprint::of(job.id());
    let mut go = job.stdin.take().expect("stdin");
    let mut lines = std::io::BufReader::new(job.stdout.take().expect("stdout"));
    let job = Reaped(job);
    let grace = format!("{}ms", GRACE.as_millis());
    cli_ok(
        &daemon,
        &[
            "register",
            "--session",
            "job",
            "--owner-pid",
            &job_owner.pid.to_string(),
            "--on-end",
            "terminate",
            "--grace",
            &grace,
            "--json",
        ],
    );
    std::io::Write::write_all(&mut go, b"go\n").expect("start the inner owner");
    let mut read_pid = || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut lines, &mut line).expect("a pid from alice's job");
        Fingerprint::of(line.trim().parse().unwrap_or_else(|_| panic!("{line:?}")))
    };
    let (inner, forked) = (read_pid(), read_pid());
    let _cleanup = (KillOnDrop(inner), KillOnDrop(forked));
    let session = daemon.request(json!({"op": "get", "session": "inner", "uid": ALICE}));
    assert_eq!(session["session"]["phase"], "active", "{session}");
    assert_eq!(session["session"]["owner"]["pid"], inner.pid, "{session}");

    let ended = match nesting {
        Nesting::OnTheJobsOwner => {
            assert_eq!(inner, job_owner, "alice's session is on the job's owner");
            cli_ok(&daemon, &["end", "--session", "job", "--json"]);
            vec![forked]
        }
        Nesting::InHerNamespaces => {
            drop(job);
            vec![forked, inner]
        }
    };
    let reaped = stream.next_event_of("session.reaped", "job", MARGIN + GRACE);
    for process in ended {
        assert!(
            gone_within(process, MARGIN),
            "{} of alice's, started inside root's job, still runs after its terminate: {reaped}",
            process.pid
        );
    }
    if nesting == Nesting::OnTheJobsOwner {
        assert!(
            job_owner.is_running(),
            "the live owner was signalled: {reaped}"
        );
        let session = daemon.request(json!({"op": "get", "session": "inner", "uid": ALICE}));
        assert_eq!(session["session"]["phase"], "active", "{session}");
    }
}

/// The veto that was: alice's session on the job's owner kept root's terminate off the
/// whole tree ("it also belongs to the active session").
#[test]
fn a_users_session_on_the_owner_of_roots_job_does_not_escape_its_terminate() {
    if privileged("a_users_session_on_the_owner_of_roots_job_does_not_escape_its_terminate") {
        nested_session_of_another_user(Nesting::OnTheJobsOwner);
    }
}

#[test]
fn a_nested_session_in_another_users_namespaces_does_not_escape_the_outer_terminate() {
    if privileged(
        "a_nested_session_in_another_users_namespaces_does_not_escape_the_outer_terminate",
    ) {
        nested_session_of_another_user(Nesting::InHerNamespaces);
    }
}

/// An owner that is a shell: registered first, then told to go, it runs `script` in a
/// directory of its own, where the script leaves what the test reads (pids, markers).
struct ShellOwner {
    child: Child,
    dir: tempfile::TempDir,
}

impl ShellOwner {
    fn spawn(script: &str, env: &[(&str, &std::ffi::OsStr)]) -> ShellOwner {
        let dir = tempfile::tempdir().expect("temp dir");
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("read go; {script}"))
            .current_dir(dir.path())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sh");
        ShellOwner { child, dir }
    }

    fn register(&self, daemon: &Daemon, session: &str) {
        let owner = self.child.id().to_string();
        cli_ok(
            daemon,
            &[
                "register",
                "--session",
                session,
                "--owner-pid",
                &owner,
                "--on-end",
                "terminate",
                "--grace",
                "1s",
                "--json",
            ],
        );
    }

    fn go(&mut self) {
        use std::io::Write;
        writeln!(self.child.stdin.as_mut().expect("stdin"), "go").expect("tell the owner to go");
    }

    /// The content of the file `name` the script writes, once it is a whole line.
    fn read(&self, name: &str) -> String {
        let path = self.dir.path().join(name);
        let mut text = String::new();
        let written = eventually(MARGIN, || {
            text = std::fs::read_to_string(&path).unwrap_or_default();
            text.ends_with('\n')
        });
        assert!(written, "the owner's script never wrote {name}");
        text.trim().to_owned()
    }

    fn pid(&self, name: &str) -> u32 {
        self.read(name).parse().expect("a pid")
    }
}

impl Drop for ShellOwner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The session `id` once its cleanup is recorded on it.
fn wait_reaped(daemon: &Daemon, id: &str) -> Value {
    let mut session = Value::Null;
    let recorded = eventually(GRACE + MARGIN, || {
        session = daemon.session(id);
        session.get("reaped").is_some()
    });
    assert!(recorded, "no cleanup recorded on {id}: {session}");
    session
}

#[test]
fn get_says_what_a_cleanup_terminated_and_killed_also_after_a_restart() {
    if !privileged("get_says_what_a_cleanup_terminated_and_killed_also_after_a_restart") {
        return;
    }
    let mut daemon = Daemon::start(&[]);
    // A survivor whose name is a user's string with a terminal's escape in it, and one
    // that ignores SIGTERM.
    let links = tempfile::tempdir().expect("temp dir");
    let hostile = links.path().join("sl\u{1b}[31mep");
    std::os::unix::fs::symlink("/bin/sleep", &hostile).expect("link sleep");
    let mut owner = ShellOwner::spawn(
        r#"( "$HOSTILE" 300 & echo $! > soft ); ( trap '' TERM; sleep 300 & echo $! > hard ); exec sleep 300"#,
        &[("HOSTILE", hostile.as_os_str())],
    );
    owner.register(&daemon, "cleaned");
    owner.go();
    let (soft, hard) = (owner.pid("soft"), owner.pid("hard"));
    owner.child.kill().expect("kill the owner");
    owner.child.wait().expect("reap the owner");

    let check = |daemon: &Daemon, when: &str| {
        let session = cli_ok(daemon, &["get", "--session", "cleaned", "--json"]);
        let reaped = &session["reaped"];
        assert_eq!(
            (pids(reaped, "terminated"), pids(reaped, "killed")),
            (vec![soft], vec![hard]),
            "{when}: {session}"
        );
        let text = daemon.cli(&["get", "--session", "cleaned"]);
        assert!(text.status.success(), "{when}: {text:?}");
        let text = String::from_utf8(text.stdout).expect("UTF-8");
        let cleanup = text
            .lines()
            .find(|line| line.trim_start().starts_with("Cleanup:"))
            .unwrap_or_else(|| panic!("{when}: no cleanup line in\n{text}"));
        assert!(
            cleanup.contains(&format!(r"terminated 1: sl\u{{1b}}[31mep (pid {soft})"))
                && cleanup.contains(&format!("killed 1: sleep (pid {hard})")),
            "{when}: {cleanup}"
        );
        assert!(
            !text.contains('\u{1b}'),
            "{when}: a raw escape reached the terminal: {text:?}"
        );
    };
    wait_reaped(&daemon, "cleaned");
    check(&daemon, "after the cleanup");
    daemon.stop();
    daemon.restart();
    check(&daemon, "after a restart");
}

#[test]
fn an_end_sent_from_inside_the_tree_spares_its_sender_and_its_shell() {
    if !privileged("an_end_sent_from_inside_the_tree_spares_its_sender_and_its_shell") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let cli = binary("liveness");
    // As an agent runs its end hook: `sh -c` running `liveness end`, here orphaned like any
    // member a terminate policy cleans up, and going on after the end.
    let mut owner = ShellOwner::spawn(
        r#"( sleep 300 & echo $! > survivor )
           ( sh -c 'echo $$ > shell; "$LIVENESS" --socket "$SOCKET" end --session hooked --json > ended.json; sleep 3; echo alive > marker' & )
           exec sleep 300"#,
        &[
            ("LIVENESS", cli.as_os_str()),
            ("SOCKET", daemon.socket.as_os_str()),
        ],
    );
    owner.register(&daemon, "hooked");
    owner.go();
    let (survivor, shell) = (owner.pid("survivor"), owner.pid("shell"));
    let survivor_process = Fingerprint::of(survivor);
    let ended: Value = serde_json::from_str(&owner.read("ended.json")).expect("the end's reply");
    let listed: Vec<u32> = ended["survivors"]["members"]
        .as_array()
        .expect("survivors listed")
        .iter()
        .map(|member| member["pid"].as_u64().expect("a pid") as u32)
        .collect();
    assert_eq!(
        (listed, &ended["survivors"]["total"]),
        (vec![survivor], &json!(1)),
        "only the other member survives: {ended}"
    );
    let requesters = &ended["survivors"]["requested_by"];
    assert_eq!(
        (
            &requesters[0]["comm"],
            &requesters[1]["pid"],
            requesters.as_array().map(Vec::len)
        ),
        (&json!("liveness"), &json!(shell), Some(2)),
        "the sender, then its shell: {ended}"
    );

    let text = daemon.cli(&["get", "--session", "hooked"]);
    let text = String::from_utf8(text.stdout).expect("UTF-8");
    assert!(
        text.lines().any(
            |line| line.trim_start().starts_with("Ended by: liveness (pid")
                && line.contains(&format!("from sh (pid {shell})"))
        ),
        "get names who ended it from inside the tree:\n{text}"
    );

    let session = wait_reaped(&daemon, "hooked");
    let reaped = &session["reaped"];
    assert_eq!(pids(reaped, "terminated"), vec![survivor], "{session}");
    for list in ["killed", "exited"] {
        assert!(!pids(reaped, list).contains(&shell), "{session}");
    }
    assert_eq!(failed_pids(reaped), Vec::<u32>::new(), "{session}");
    assert_eq!(
        owner.read("marker"),
        "alive",
        "the shell that sent the end ran on, unsignalled"
    );
    assert!(
        gone_within(survivor_process, MARGIN),
        "the survivor {survivor} still runs"
    );
}
