//! End actions through the real daemon: every way a session ends runs its actions once, as
//! its creator; a SIGKILL of the daemon before, during or after an action, or a stop
//! during one, leaves exactly one outcome, the action run again only where it was cut
//! short; the timeout ends the action's tree, a failing action's stderr is kept (and shown
//! by `get`), `status` counts the actions running and waiting, and a user's unfinished
//! actions are limited. A user's actions stopped before their exec hold up no one and fail
//! to start at their bound; actions share no keyring with the daemon or each other; a
//! leftover's process group is never signalled by a number another user's process took.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::{
    ClientAs, Daemon, Fingerprint, Orphan, eventually, open_socket_to_everyone, privileged,
};
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(20);

/// A directory every user may write into, where actions leave their marks.
struct Marks {
    dir: tempfile::TempDir,
}

impl Marks {
    fn new() -> Marks {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        Marks { dir }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("ran.log")
    }

    /// The lines the actions wrote.
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// An action that writes "start PID RESUMED", waits a minute unless it is a rerun, then
    /// writes "done".
    fn waiting_action(&self) -> Value {
        shell(&format!(
            "echo \"start $$ ${{LIVENESS_RESUMED:-0}}\" >> {log}; \
             [ -n \"$LIVENESS_RESUMED\" ] || sleep 60; echo done >> {log}",
            log = self.log().display()
        ))
    }

    /// The pid of the run that wrote the first line.
    fn first_run(&self) -> u32 {
        self.lines()[0].split(' ').nth(1).unwrap().parse().unwrap()
    }

    /// An action that writes "SESSION REASON RESUMED" and succeeds.
    fn action(&self) -> Value {
        shell(&format!(
            "echo \"$LIVENESS_SESSION $LIVENESS_REASON ${{LIVENESS_RESUMED:-0}}\" >> {}",
            self.log().display()
        ))
    }
}

fn shell(script: &str) -> Value {
    json!({"argv": ["/bin/sh", "-c", script]})
}

fn register(daemon: &Daemon, request: Value) -> Value {
    let mut request = request;
    request["op"] = json!("register");
    let reply = daemon.request(request);
    assert_eq!(reply["ok"], true, "{reply}");
    reply["session"].clone()
}

/// Every event of session `id` from the start, by kind (read from the whole stream up to
/// its head: a session's own events need not reach it).
fn events_of(daemon: &Daemon, id: &str, kind: &str) -> Vec<Value> {
    let mut stream = daemon.connect();
    let ack = stream.request(json!({"op": "subscribe", "since": 0}));
    assert_eq!(ack["ok"], true, "{ack}");
    let head = ack["subscribed"]["head"].as_u64().expect("head");
    let mut found = Vec::new();
    let mut seq = 0;
    while seq < head {
        let Some(line) = stream.next_within(Duration::from_secs(5)) else {
            break;
        };
        let Some(event) = line.get("event") else {
            continue;
        };
        seq = event["seq"].as_u64().unwrap_or(head);
        if event["session"] == id && event["kind"] == kind {
            found.push(event.clone());
        }
    }
    found
}

/// Exactly one `session.action` and one `session.finalized` for session `id`; returns the
/// outcome.
fn one_outcome(daemon: &Daemon, id: &str) -> Value {
    let actions = events_of(daemon, id, "session.action");
    assert_eq!(actions.len(), 1, "{id}: {actions:?}");
    let finals = events_of(daemon, id, "session.finalized");
    assert_eq!(finals.len(), 1, "{id}: {finals:?}");
    actions[0]["action"].clone()
}

fn local_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("host name")
        .trim()
        .to_owned()
}

/// Every way a session can end runs its action once, with the reason it ended.
#[test]
fn every_ending_runs_the_actions_once() {
    if !privileged("every_ending_runs_the_actions_once") {
        return;
    }
    let marks = Marks::new();
    let mut daemon = Daemon::start(&["--pending-ttl", "1s", "--unknown-timeout", "1s"]);
    let action = marks.action();
    let mut exits = Orphan::spawn(&["exit", "3"]);
    register(
        &daemon,
        json!({"session": "exit", "owner": {"pid": exits.pid}, "on_end_run": [action]}),
    );
    let killed = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "kill", "owner": {"pid": killed.pid}, "on_end_run": [action]}),
    );
    let ended = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "end", "owner": {"pid": ended.pid}, "on_end_run": [action]}),
    );
    register(
        &daemon,
        json!({"session": "expiring", "pending": true, "owner": {"pid": ended.pid}, "on_end_run": [action]}),
    );
    let elsewhere =
        json!({"pid": 1, "start_ticks": 1, "boot_id": "another-machine", "host": "elsewhere"});
    register(
        &daemon,
        json!({"session": "timeout", "owner": elsewhere, "on_end_run": [action]}),
    );
    let before_reboot =
        json!({"pid": 1, "start_ticks": 1, "boot_id": "an-earlier-boot", "host": local_host()});
    register(
        &daemon,
        json!({"session": "reboot", "owner": before_reboot, "on_end_run": [action]}),
    );
    let mut downtime = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "downtime", "owner": {"pid": downtime.pid}, "on_end_run": [action]}),
    );

    exits.release();
    Fingerprint::of(killed.pid).kill();
    let reply = daemon.request(json!({"op": "end", "session": "end"}));
    assert_eq!(reply["ok"], true, "{reply}");
    for id in ["exit", "kill", "end", "timeout", "reboot"] {
        daemon.wait_finalized(id, None);
    }
    daemon.wait_finalized("expiring", None);
    // A death while the daemon is down is found by the reconcile, and still runs.
    daemon.kill9();
    downtime.release();
    assert!(eventually(WITHIN, || !Fingerprint::of(downtime.pid).is_running()));
    daemon.restart();
    daemon.wait_finalized("downtime", None);
    // Nothing runs twice, however long one waits.
    std::thread::sleep(Duration::from_millis(1500));
    let mut lines = marks.lines();
    lines.sort();
    assert_eq!(
        lines,
        [
            "downtime owner_exited 0",
            "end stopped 0",
            "exit owner_exited 0",
            "expiring pending_expired 0",
            "kill owner_exited 0",
            "reboot reboot 0",
            "timeout timeout 0",
        ]
    );
    for id in [
        "exit", "kill", "end", "expiring", "timeout", "reboot", "downtime",
    ] {
        let outcome = one_outcome(&daemon, id);
        assert_eq!(outcome["exit"]["code"], 0, "{id}: {outcome}");
        assert!(outcome.get("resumed").is_none(), "{id}: {outcome}");
    }
}

/// A state directory kept across the daemons of a test.
fn state_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A daemon on `state` that SIGKILLs itself at fault point `point`.
fn dying_at(point: &str, state: &Path) -> Daemon {
    let fault = format!("LIVENESS_FAULT={point}");
    Daemon::start_under(&["env", &fault], Some(state.join("state")), &[])
}

fn killed_by_its_fault(daemon: &mut Daemon) {
    use std::os::unix::process::ExitStatusExt;
    assert!(
        eventually(WITHIN, || daemon.exited().is_some()),
        "the daemon did not die at its fault point:\n{}",
        daemon.log()
    );
    let status = daemon.exited().expect("exited");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{}", daemon.log());
}

/// Ends session `s`, whose action is `action`, on a daemon that dies at `point`; returns
/// a daemon started again on the same state, and the session once finalized there.
fn die_at_and_restart(point: &str, action: Value) -> (Daemon, Value, tempfile::TempDir) {
    die_at_and_restart_after(point, action, Ending::Request)
}

/// How session `s` ends in [`die_at_and_restart_after`].
#[derive(PartialEq)]
enum Ending {
    /// `end`: a commit of its own.
    Request,
    /// Its owner's death: the journaled path.
    Death,
}

fn die_at_and_restart_after(
    point: &str,
    action: Value,
    ending: Ending,
) -> (Daemon, Value, tempfile::TempDir) {
    let state = state_dir();
    let mut daemon = dying_at(point, state.path());
    let mut owner = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "s", "owner": {"pid": owner.pid}, "on_end_run": [action]}),
    );
    // The daemon may reach its fault point, and die, before it replies to the `end`: the
    // line is sent, and the connection kept open until then, without a wait for a reply.
    let mut ending_request = daemon.connect();
    if ending == Ending::Death {
        owner.release();
    } else {
        ending_request.send_raw(b"{\"op\":\"end\",\"session\":\"s\"}\n");
    }
    killed_by_its_fault(&mut daemon);
    drop(ending_request);
    let log = daemon.log();
    let again = Daemon::start_with_state(Some(state.path().join("state")), &[]);
    let session = again.wait_finalized("s", None);
    assert!(log.contains(point), "{log}");
    (again, session, state)
}

#[test]
fn a_kill_before_the_action_starts_runs_it_at_the_next_start() {
    if !privileged("a_kill_before_the_action_starts_runs_it_at_the_next_start") {
        return;
    }
    let marks = Marks::new();
    let (daemon, _, _state) = die_at_and_restart("before-action-start", marks.action());
    assert_eq!(marks.lines(), ["s stopped 0"], "it ran once, not resumed");
    let outcome = one_outcome(&daemon, "s");
    assert!(outcome.get("resumed").is_none(), "{outcome}");
}

/// A death published but not yet in SQLite when the daemon dies: the journal's replay at
/// the next start ends the session, and its action runs then, once.
#[test]
fn a_kill_between_a_deaths_publication_and_its_commit_still_runs_the_action() {
    if !privileged("a_kill_between_a_deaths_publication_and_its_commit_still_runs_the_action") {
        return;
    }
    let marks = Marks::new();
    let (daemon, session, _state) =
        die_at_and_restart_after("after-publish", marks.action(), Ending::Death);
    assert_eq!(session["reason"], "owner_exited", "{session}");
    assert_eq!(marks.lines(), ["s owner_exited 0"]);
    one_outcome(&daemon, "s");
}

#[test]
fn a_kill_during_the_action_ends_it_and_runs_it_again_once() {
    if !privileged("a_kill_during_the_action_ends_it_and_runs_it_again_once") {
        return;
    }
    let marks = Marks::new();
    let (daemon, _, _state) = die_at_and_restart("after-action-spawn", marks.waiting_action());
    let lines = marks.lines();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].starts_with("start ") && lines[0].ends_with(" 0"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("start ") && lines[1].ends_with(" 1"),
        "{lines:?}"
    );
    assert_eq!(lines[2], "done", "only the rerun finished");
    let first = marks.first_run();
    assert!(
        eventually(WITHIN, || !Fingerprint::of(first).is_running()),
        "the cut-short run was ended before the rerun"
    );
    let outcome = one_outcome(&daemon, "s");
    assert_eq!(outcome["resumed"], true, "{outcome}");
    assert_eq!(outcome["exit"]["code"], 0, "{outcome}");
}

#[test]
fn a_kill_after_the_action_before_its_commit_runs_it_again_with_one_outcome() {
    if !privileged("a_kill_after_the_action_before_its_commit_runs_it_again_with_one_outcome") {
        return;
    }
    let marks = Marks::new();
    let (daemon, _, _state) = die_at_and_restart("before-action-commit", marks.action());
    // Its outcome was lost with the daemon: it must run again, and is told so.
    assert_eq!(marks.lines(), ["s stopped 0", "s stopped 1"]);
    let outcome = one_outcome(&daemon, "s");
    assert_eq!(outcome["resumed"], true, "{outcome}");
}

#[test]
fn a_stop_during_an_action_ends_it_and_the_next_start_runs_it_again() {
    if !privileged("a_stop_during_an_action_ends_it_and_the_next_start_runs_it_again") {
        return;
    }
    let marks = Marks::new();
    let action = marks.waiting_action();
    let mut daemon = Daemon::start(&["--action-grace", "200ms"]);
    let owner = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "s", "owner": {"pid": owner.pid}, "on_end_run": [action]}),
    );
    daemon.request(json!({"op": "end", "session": "s"}));
    assert!(eventually(WITHIN, || marks.lines().len() == 1));
    let first = marks.first_run();
    assert!(daemon.stop().success(), "{}", daemon.log());
    assert!(
        !Fingerprint::of(first).is_running(),
        "a stop ends its running actions"
    );
    daemon.restart();
    daemon.wait_finalized("s", None);
    assert_eq!(marks.lines().len(), 3, "{:?}", marks.lines());
    assert_eq!(marks.lines()[2], "done");
    let outcome = one_outcome(&daemon, "s");
    assert_eq!(outcome["resumed"], true, "{outcome}");
}

/// The timeout ends the action's whole tree; a failing action's status and the end of its
/// stderr are its outcome, in the event and in `get`.
#[test]
fn timeouts_end_the_tree_and_failures_keep_their_stderr() {
    if !privileged("timeouts_end_the_tree_and_failures_keep_their_stderr") {
        return;
    }
    let marks = Marks::new();
    let child_pid = marks.dir.path().join("child.pid");
    let daemon = Daemon::start(&["--action-grace", "200ms"]);
    let owner = Orphan::spawn(&["exit", "0"]);
    let slow = json!({
        "argv": ["/bin/sh", "-c", format!("sleep 60 & echo $! > {}; wait", child_pid.display())],
        "timeout_ms": 500,
    });
    let failing = shell("echo 'it went wrong' >&2; exit 4");
    register(
        &daemon,
        json!({"session": "s", "owner": {"pid": owner.pid}, "on_end_run": [slow, failing]}),
    );
    daemon.request(json!({"op": "end", "session": "s"}));
    let session = daemon.wait_finalized("s", None);
    let actions = session["actions"]
        .as_array()
        .expect("get lists the actions");
    assert_eq!(actions.len(), 2, "{session}");
    let timed_out = &actions[0]["outcome"];
    assert_eq!(timed_out["timed_out"], true, "{session}");
    let child: u32 = std::fs::read_to_string(&child_pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(WITHIN, || !Fingerprint::of(child).is_running()),
        "the action's child was ended with it"
    );
    let failed = &actions[1]["outcome"];
    assert_eq!(failed["exit"]["code"], 4, "{session}");
    assert_eq!(failed["stderr_tail"], "it went wrong\n", "{session}");
    let events = events_of(&daemon, "s", "session.action");
    assert_eq!(events.len(), 2);
    // `get` shows the end of a failed action's stderr; the timed-out one wrote none.
    let shown = daemon.cli(&["get", "--session", "s"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{shown:?}");
    assert_eq!(text.matches("stderr: ").count(), 1, "{text}");
    assert!(text.contains("stderr: it went wrong\n"), "{text}");
}

/// `status` counts the actions under way: those running, and those waiting for a slot of
/// their user; the text status says the same.
#[test]
fn status_counts_the_running_and_the_waiting_actions() {
    if !privileged("status_counts_the_running_and_the_waiting_actions") {
        return;
    }
    let marks = Marks::new();
    let go = marks.dir.path().join("go");
    let daemon = Daemon::start(&["--action-slots", "1"]);
    let held = shell(&format!(
        "while [ ! -e {go} ]; do sleep 0.05; done",
        go = go.display()
    ));
    for id in ["a", "b"] {
        let owner = Orphan::spawn(&["exit", "0"]);
        register(
            &daemon,
            json!({"session": id, "owner": {"pid": owner.pid}, "on_end_run": [held]}),
        );
        daemon.request(json!({"op": "end", "session": id}));
    }
    let counts = || {
        let status = daemon.request(json!({"op": "status"}));
        status["status"]["actions"].clone()
    };
    let both = json!({"running": 1, "waiting": 1, "uncommitted_outcomes": 0});
    assert!(
        eventually(WITHIN, || counts() == both),
        "one runs, one waits for its user's slot: {}",
        counts()
    );
    let text = daemon.cli(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("Actions: 1 running, 1 waiting to start, 0 outcomes awaiting commit"),
        "{text}"
    );
    std::fs::write(&go, "").unwrap();
    for id in ["a", "b"] {
        daemon.wait_finalized(id, None);
    }
    let none = json!({"running": 0, "waiting": 0, "uncommitted_outcomes": 0});
    assert!(eventually(WITHIN, || counts() == none), "{}", counts());
}

/// A user's end actions without an outcome are limited (`--max-actions-per-uid`): those
/// of its active sessions and those still waiting or running after their sessions ended.
/// A registration that would pass the limit is refused and changes nothing; a new list
/// for an active session replaces its old one in the count; root is not limited.
#[test]
fn a_users_unfinished_actions_are_limited() {
    if !privileged("a_users_unfinished_actions_are_limited") {
        return;
    }
    let uid = 4_343_435;
    let marks = Marks::new();
    let go = marks.dir.path().join("go");
    let held = shell(&format!(
        "while [ ! -e {go} ]; do sleep 0.05; done",
        go = go.display()
    ));
    let daemon = Daemon::start(&["--max-actions-per-uid", "6", "--action-slots", "1"]);
    open_socket_to_everyone(&daemon);
    let mut client = ClientAs::connect(&daemon, uid);
    let owner = client.0.pid();
    let register = |client: &mut ClientAs, id: &str, actions: usize| {
        let request = json!({"op": "register", "session": id, "owner": {"pid": owner},
            "on_end_run": vec![held.clone(); actions]});
        client.request(&request).expect("a reply")
    };
    assert_eq!(register(&mut client, "a", 4)["ok"], true);
    assert_eq!(register(&mut client, "b", 2)["ok"], true);
    let refused = register(&mut client, "c", 1);
    assert_eq!(refused["error"]["code"], "limit_reached", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("6 end actions"), "{message}");
    let c = daemon.request(json!({"op": "get", "session": "c", "uid": uid}));
    assert_eq!(c["error"]["code"], "not_found", "nothing registered: {c}");
    // Three instead of four: room for one more.
    assert_eq!(register(&mut client, "a", 3)["ok"], true);
    assert_eq!(register(&mut client, "c", 1)["ok"], true);
    assert_eq!(
        register(&mut client, "d", 1)["error"]["code"],
        "limit_reached"
    );
    // An action `actions_done` gave its outcome counts no more, and a new list for its
    // session counts whole.
    let done = json!({"op": "actions_done", "session": "c"});
    assert_eq!(client.request(&done).expect("a reply")["ok"], true);
    assert_eq!(register(&mut client, "d", 1)["ok"], true);
    assert_eq!(
        register(&mut client, "c", 1)["error"]["code"],
        "limit_reached"
    );
    // Ended, their actions wait for the user's one slot, and still count.
    for id in ["a", "b", "c"] {
        let end = json!({"op": "end", "session": id});
        assert_eq!(client.request(&end).expect("a reply")["ok"], true);
    }
    let actions = || daemon.request(json!({"op": "status"}))["status"]["actions"].clone();
    let waiting = json!({"running": 1, "waiting": 4, "uncommitted_outcomes": 0});
    assert!(eventually(WITHIN, || actions() == waiting), "{}", actions());
    assert_eq!(
        register(&mut client, "f", 1)["error"]["code"],
        "limit_reached"
    );
    assert_eq!(
        register(&mut client, "e", 0)["ok"],
        true,
        "no action, no refusal"
    );
    let root = json!({"op": "register", "session": "roots", "owner": {"pid": owner},
        "on_end_run": vec![held.clone(); 7]});
    assert_eq!(daemon.request(root)["ok"], true, "root is not limited");
    std::fs::write(&go, "").unwrap();
    for id in ["a", "b", "c"] {
        daemon.wait_finalized(id, Some(uid));
    }
    assert_eq!(
        register(&mut client, "g", 5)["ok"],
        true,
        "finished actions count no more"
    );
    let limits = &daemon.request(json!({"op": "status"}))["status"]["limits"];
    assert_eq!(
        limits["connections"]["config"]["actions_per_uid"], 6,
        "{limits}"
    );
    assert_eq!(
        limits["sessions"]["refused"]["actions_per_uid"], 4,
        "{limits}"
    );
}

/// An action runs as its creator: that uid and the group it registered with (a uid the
/// user databases do not know), no capabilities, no_new_privs.
#[test]
fn an_unprivileged_users_action_runs_as_that_user() {
    if !privileged("an_unprivileged_users_action_runs_as_that_user") {
        return;
    }
    let uid = 4_343_434;
    let daemon = Daemon::start(&[]);
    open_socket_to_everyone(&daemon);
    let mut client = ClientAs::connect(&daemon, uid);
    let report = shell("cat /proc/self/status >&2; echo FDS >&2; ls /proc/self/fd >&2");
    let reply = client
        .request(
            &json!({"op": "register", "session": "mine", "owner": {"pid": client.0.pid()},
            "on_end_run": [report]}),
        )
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    // A user names only its own sessions, here too.
    let refused = client
        .request(&json!({"op": "actions_done", "session": "mine", "uid": 0}))
        .expect("a reply");
    assert_eq!(refused["error"]["code"], "forbidden", "{refused}");
    let reply = client
        .request(&json!({"op": "end", "session": "mine"}))
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    let session = daemon.wait_finalized("mine", Some(uid));
    let outcome = &session["actions"][0]["outcome"];
    assert_eq!(outcome["exit"]["code"], 0, "{outcome}");
    let status = outcome["stderr_tail"].as_str().unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}:\t")))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .to_owned()
    };
    assert_eq!(field("Uid"), format!("{uid}\t{uid}\t{uid}\t{uid}"));
    assert_eq!(field("Gid"), format!("{uid}\t{uid}\t{uid}\t{uid}"));
    assert_eq!(field("Groups").trim(), "", "no supplementary group");
    assert_eq!(field("CapEff"), "0000000000000000");
    assert_eq!(field("CapPrm"), "0000000000000000");
    assert_eq!(field("NoNewPrivs"), "1");
    // stdin, stdout, stderr, and the descriptor ls reads.
    let fds: Vec<&str> = status
        .lines()
        .skip_while(|line| *line != "FDS")
        .skip(1)
        .collect();
    assert!(fds.len() <= 4, "no descriptor of the daemon's: {fds:?}");
}

/// `actions_done` before the end: nothing runs, the outcome says why, and the session is
/// final at its end.
#[test]
fn actions_done_by_the_agent_are_not_run() {
    if !privileged("actions_done_by_the_agent_are_not_run") {
        return;
    }
    let marks = Marks::new();
    let daemon = Daemon::start(&[]);
    let owner = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "s", "owner": {"pid": owner.pid}, "on_end_run": [marks.action()]}),
    );
    let reply = daemon.request(json!({"op": "actions_done", "session": "s"}));
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["session"]["actions"][0]["state"], "done", "{reply}");
    daemon.request(json!({"op": "end", "session": "s"}));
    let session = daemon.wait_finalized("s", None);
    assert_eq!(
        session["actions"][0]["outcome"]["skipped"], "done_by_agent",
        "{session}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(marks.lines(), Vec::<String>::new(), "it did not run");
    one_outcome(&daemon, "s");
}

/// `liveness run --on-end-run CMD`: CMD runs through `sh -c` in the directory `run` was
/// started in, and `liveness wait --finalized` returns once it has.
#[test]
fn the_cli_registers_end_actions_and_waits_for_their_outcome() {
    if !privileged("the_cli_registers_end_actions_and_waits_for_their_outcome") {
        return;
    }
    let marks = Marks::new();
    let daemon = Daemon::start(&[]);
    let command = format!(
        "sleep 0.5; echo \"$LIVENESS_SESSION $LIVENESS_REASON $PWD\" >> {}",
        marks.log().display()
    );
    let ran = std::process::Command::new(integration_tests::binary("liveness"))
        .current_dir(marks.dir.path())
        .args([
            "--socket",
            daemon.socket.to_str().unwrap(),
            "run",
            "--session",
            "cli",
        ])
        .args(["--on-end-run", &command, "--", "true"])
        .output()
        .unwrap();
    assert!(ran.status.success(), "{ran:?}");
    let waited = daemon.cli(&["--json", "wait", "--session", "cli", "--finalized"]);
    assert!(waited.status.success(), "{waited:?}");
    let session: Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert!(session["finalized_ms"].is_i64(), "{session}");
    let dir = marks.dir.path().canonicalize().unwrap();
    assert_eq!(
        marks.lines(),
        [format!("cli owner_exited {}", dir.display())],
        "it ran by the time wait returned"
    );
    let refused = daemon.cli(&[
        "register",
        "--session",
        "x",
        "--owner",
        "auto",
        "--on-end-timeout",
        "2h",
        "--on-end-run",
        "true",
    ]);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("over the limit"), "{said}");
}

/// A user's actions stopped between taking on its ids and their exec, 1,024 of them in
/// a row (as many at once as its slots allow): another user's `list` and root's `status`
/// are answered meanwhile as fast as before (measured first, in the same run), and each
/// stopped start is killed at the start bound (here the action's timeout, 300 ms) and
/// recorded as `failed_to_start`, leaving no process of the user behind.
#[test]
fn children_stopped_before_their_exec_hold_up_no_one() {
    if !privileged("children_stopped_before_their_exec_hold_up_no_one") {
        return;
    }
    const STARTS: usize = 1_024;
    const TIMEOUT_MS: u64 = 300;
    let (a, b) = (4_343_440, 4_343_441);
    // Each action's child stops itself right after its setresuid, as its user may stop it.
    let daemon = Daemon::start_under(
        &["env", "LIVENESS_FAULT=action-stopped-before-exec"],
        None,
        &["--action-slots", "16", "--max-actions-per-uid", "1024"],
    );
    open_socket_to_everyone(&daemon);
    let mut user_a = ClientAs::connect(&daemon, a);
    let mut user_b = ClientAs::connect(&daemon, b);
    let b_owner = user_b.0.pid();
    let reply = user_b
        .request(&json!({"op": "register", "session": "b", "owner": {"pid": b_owner}}))
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    let mut root = daemon.connect();
    let timed = |user_b: &mut ClientAs, root: &mut integration_tests::Conn| {
        let at = std::time::Instant::now();
        let listed = user_b.request(&json!({"op": "list"})).expect("a reply");
        let list = at.elapsed();
        assert_eq!(listed["ok"], true, "{listed}");
        let at = std::time::Instant::now();
        root.send_raw(b"{\"op\":\"status\"}\n");
        let status = root
            .next_within(Duration::from_secs(30))
            .expect("status answered");
        assert_eq!(status["ok"], true, "{status}");
        (list, at.elapsed())
    };
    let mut baseline = Vec::new();
    for _ in 0..40 {
        baseline.push(timed(&mut user_b, &mut root));
        std::thread::sleep(Duration::from_millis(10));
    }

    let action = json!({"argv": ["/bin/true"], "timeout_ms": TIMEOUT_MS, "cwd": "/"});
    let a_owner = user_a.0.pid();
    let sessions: Vec<String> = (0..STARTS / 16).map(|i| format!("a{i}")).collect();
    for id in &sessions {
        let reply = user_a
            .request(
                &json!({"op": "register", "session": id, "owner": {"pid": a_owner},
                "on_end_run": vec![action.clone(); 16]}),
            )
            .expect("a reply");
        assert_eq!(reply["ok"], true, "{reply}");
    }
    for id in &sessions {
        let reply = user_a
            .request(&json!({"op": "end", "session": id}))
            .expect("a reply");
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let started = std::time::Instant::now();
    let mut during = Vec::new();
    let idle = json!({"running": 0, "waiting": 0, "uncommitted_outcomes": 0});
    loop {
        let at = std::time::Instant::now();
        let status = daemon.request(json!({"op": "status"}));
        during.push(timed(&mut user_b, &mut root));
        if status["status"]["actions"] == idle && during.len() > 10 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the stopped starts were not all ended: {}",
            status["status"]["actions"]
        );
        std::thread::sleep(Duration::from_millis(50).saturating_sub(at.elapsed()));
    }
    let elapsed = started.elapsed();

    let stats = |samples: &[(Duration, Duration)], pick: fn(&(Duration, Duration)) -> Duration| {
        let mut times: Vec<Duration> = samples.iter().map(pick).collect();
        times.sort();
        (times[times.len() / 2], times[times.len() - 1])
    };
    for (what, pick) in [
        ("B's list", (|s: &(Duration, Duration)| s.0) as fn(&_) -> _),
        ("root's status", |s: &(Duration, Duration)| s.1),
    ] {
        let (base_p50, base_max) = stats(&baseline, pick);
        let (p50, max) = stats(&during, pick);
        eprintln!(
            "{what}: baseline p50 {base_p50:?} max {base_max:?}; during {} samples over {elapsed:?}: p50 {p50:?} max {max:?}",
            during.len()
        );
        assert!(
            p50 <= (base_p50 * 10).max(Duration::from_millis(50)),
            "{what}: p50 {p50:?} against a baseline of {base_p50:?}"
        );
        assert!(
            max <= (base_max * 20).max(Duration::from_secs(2)),
            "{what}: max {max:?} against a baseline of {base_max:?}"
        );
    }

    let mut failed = 0;
    for id in &sessions {
        let session = daemon.wait_finalized(id, Some(a));
        for action in session["actions"].as_array().expect("actions") {
            let outcome = &action["outcome"];
            assert_eq!(outcome["failed_to_start"], true, "{outcome}");
            assert!(outcome.get("exit").is_none(), "{outcome}");
            let error = outcome["error"].as_str().expect("an error");
            assert!(
                error.contains("neither ran its program nor exited within 300ms"),
                "{error}"
            );
            let took = outcome["duration_ms"].as_u64().expect("duration");
            assert!(
                (TIMEOUT_MS..TIMEOUT_MS + 2_000).contains(&took),
                "killed at the bound: {outcome}"
            );
            failed += 1;
        }
    }
    assert_eq!(failed, STARTS);
    // Killed and reaped: nothing of A's is left but its client.
    let left: Vec<u32> = integration_tests::proc_root()
        .processes()
        .unwrap()
        .into_iter()
        .map(|stat| stat.pid)
        .filter(|pid| *pid != a_owner && uid_of(*pid) == Some(a))
        .collect();
    assert_eq!(left, Vec::<u32>::new(), "processes of uid {a} left behind");
    let text = daemon.cli(&["get", "--session", "a0", "--uid", &a.to_string()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("failed to start"), "{text}");
}

/// The real uid of process `pid`.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `testproc keys OPS...` as an action, its lines on stderr (the outcome keeps them).
fn keys_action(ops: &[&str]) -> Value {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        "exec \"$0\" \"$@\" >&2".to_owned(),
        integration_tests::binary("testproc").display().to_string(),
        "keys".to_owned(),
    ];
    argv.extend(ops.iter().map(|op| (*op).to_owned()));
    json!({"argv": argv, "cwd": "/"})
}

/// Runs `action` as the end action of a session of `client`'s user; its stderr lines.
fn keys_of(daemon: &Daemon, client: &mut ClientAs, uid: u32, id: &str, action: Value) -> String {
    let reply = client
        .request(
            &json!({"op": "register", "session": id, "owner": {"pid": client.0.pid()},
            "on_end_run": [action]}),
        )
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    let reply = client
        .request(&json!({"op": "end", "session": id}))
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    let session = daemon.wait_finalized(id, Some(uid));
    let outcome = &session["actions"][0]["outcome"];
    assert_eq!(outcome["exit"]["code"], 0, "{outcome}");
    outcome["stderr_tail"].as_str().expect("stderr").to_owned()
}

/// An action gets a session keyring of its own, made as its user (as `pam_keyinit` gives
/// a login): the keys in the daemon's session keyring are not its, and a key it adds to
/// its session keyring is not another user's action's to find or read.
#[test]
fn actions_share_no_keyring_with_the_daemon_or_each_other() {
    if !privileged("actions_share_no_keyring_with_the_daemon_or_each_other") {
        return;
    }
    let (a, b) = (4_343_444, 4_343_445);
    let testproc = integration_tests::binary("testproc");
    let testproc = testproc.to_str().expect("a UTF-8 path");
    let daemon = Daemon::start_under(
        &[testproc, "with-key", "livenessd-secret", "the daemon's"],
        None,
        &[],
    );
    open_socket_to_everyone(&daemon);
    let mut user_a = ClientAs::connect(&daemon, a);
    let mut user_b = ClientAs::connect(&daemon, b);
    let of_a = keys_of(
        &daemon,
        &mut user_a,
        a,
        "a",
        keys_action(&["search:livenessd-secret", "add:a-secret"]),
    );
    assert!(
        of_a.contains("none livenessd-secret"),
        "A's action found the daemon's key: {of_a}"
    );
    let serial = of_a
        .lines()
        .find_map(|line| line.strip_prefix("added a-secret "))
        .unwrap_or_else(|| panic!("A's action added no key: {of_a}"))
        .trim()
        .to_owned();
    let read = format!("read:{serial}");
    let of_b = keys_of(
        &daemon,
        &mut user_b,
        b,
        "b",
        keys_action(&["search:livenessd-secret", "search:a-secret", &read]),
    );
    assert!(of_b.contains("none livenessd-secret"), "{of_b}");
    assert!(
        of_b.contains("none a-secret"),
        "B's action found A's key: {of_b}"
    );
    assert!(
        of_b.contains(&format!("unreadable {serial}")),
        "B's action read A's key: {of_b}"
    );
    // Root's own actions, too, have a keyring of their own.
    let owner = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "r", "owner": {"pid": owner.pid},
            "on_end_run": [keys_action(&["search:livenessd-secret"])]}),
    );
    daemon.request(json!({"op": "end", "session": "r"}));
    let session = daemon.wait_finalized("r", None);
    let of_root = session["actions"][0]["outcome"]["stderr_tail"]
        .as_str()
        .expect("stderr")
        .to_owned();
    assert!(of_root.contains("none livenessd-secret"), "{of_root}");
}

/// After a crash, what is left of a cut-short action is signalled through pidfds only, its
/// process group too. Its leader dies at the restart's SIGTERM while a member that ignores
/// it (in a session of its own) keeps the grace running; meanwhile another user's process
/// takes the leader's pid, as the leader of a process group of that number. It gets no
/// signal: the group signals reach the group the leader's pidfd holds, not the number.
#[test]
fn a_leftovers_group_number_taken_by_another_users_process_is_never_signalled() {
    if !privileged("a_leftovers_group_number_taken_by_another_users_process_is_never_signalled") {
        return;
    }
    let stranger_uid = 4_343_446;
    let marks = Marks::new();
    let (leader_file, member_file) = (
        marks.dir.path().join("leader"),
        marks.dir.path().join("member"),
    );
    let action = shell(&format!(
        "[ -n \"$LIVENESS_RESUMED\" ] && exit 0; echo $$ > {leader}; \
         setsid sh -c 'trap \"\" TERM; echo $$ > {member}; exec sleep 60' & wait",
        leader = leader_file.display(),
        member = member_file.display(),
    ));
    let state = state_dir();
    let mut daemon = dying_at("after-action-spawn", state.path());
    let owner = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "s", "owner": {"pid": owner.pid}, "on_end_run": [action]}),
    );
    let mut ending = daemon.connect();
    ending.send_raw(b"{\"op\":\"end\",\"session\":\"s\"}\n");
    killed_by_its_fault(&mut daemon);
    let pid_in =
        |file: &Path| -> Option<u32> { std::fs::read_to_string(file).ok()?.trim().parse().ok() };
    assert!(
        eventually(WITHIN, || pid_in(&member_file).is_some()),
        "the action ran"
    );
    let (leader, member) = (pid_in(&leader_file).unwrap(), pid_in(&member_file).unwrap());
    let member = Fingerprint::of(member);

    let again =
        Daemon::start_with_state(Some(state.path().join("state")), &["--action-grace", "5s"]);
    assert!(
        eventually(WITHIN, || !Path::new(&format!("/proc/{leader}")).exists()),
        "the leader died at SIGTERM and was reaped"
    );
    let mut stranger = integration_tests::TestprocAs::spawn(0, &["stranger"]);
    let planted = (0..100).find_map(|_| {
        let to = stranger.to.as_mut().expect("stdin");
        writeln!(to, "{leader} {stranger_uid}").unwrap();
        let line = stranger.read_line().expect("a reply");
        // EEXIST while the kernel has not let the number go yet.
        line.trim().parse::<u32>().ok().or_else(|| {
            std::thread::sleep(Duration::from_millis(20));
            None
        })
    });
    assert_eq!(
        planted,
        Some(leader),
        "another user's process took pid {leader}"
    );
    let taken = Fingerprint::of(leader);
    assert!(
        eventually(WITHIN, || uid_of(leader) == Some(stranger_uid)),
        "the stranger runs as its user"
    );
    let log = again.log_path();
    again.wait_finalized("s", None);
    assert!(!member.is_running(), "the leftover's member was ended");
    let alive = taken.is_running();
    let state_now = integration_tests::state(leader);
    taken.kill();
    drop(stranger);
    assert!(
        alive && state_now == Some('S'),
        "the process that took the leader's pid was signalled (state {state_now:?}):\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// The same attack without a fault point: a process of the user sends SIGSTOP to every
/// process of its user (`kill(-1)`, in a loop) while that user's actions start, catching
/// some between their uid change and their exec and the others after it. Another user's
/// `list` and root's `status` are still answered, and every action gets its outcome: a
/// failed start at the bound, or a timeout that ends its tree.
#[test]
fn a_user_stopping_all_its_processes_holds_up_no_one() {
    if !privileged("a_user_stopping_all_its_processes_holds_up_no_one") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let (a, b) = (4_343_447, 4_343_448);
    let daemon = Daemon::start(&["--action-slots", "16"]);
    open_socket_to_everyone(&daemon);
    let mut user_a = ClientAs::connect(&daemon, a);
    let mut user_b = ClientAs::connect(&daemon, b);
    let b_owner = user_b.0.pid();
    let reply = user_b
        .request(&json!({"op": "register", "session": "b", "owner": {"pid": b_owner}}))
        .expect("a reply");
    assert_eq!(reply["ok"], true, "{reply}");
    let action = json!({"argv": ["/bin/true"], "timeout_ms": 300, "cwd": "/"});
    let a_owner = user_a.0.pid();
    let sessions: Vec<String> = (0..16).map(|i| format!("a{i}")).collect();
    for id in &sessions {
        let reply = user_a
            .request(
                &json!({"op": "register", "session": id, "owner": {"pid": a_owner},
                "on_end_run": vec![action.clone(); 16]}),
            )
            .expect("a reply");
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let mut attacker = std::process::Command::new("/bin/sh")
        .args(["-c", "while :; do kill -STOP -1 2>/dev/null; done"])
        .uid(a)
        .gid(a)
        .spawn()
        .expect("the attacker");
    // Ended by root: the attacker stops A's client too.
    for id in &sessions {
        let reply = daemon.request(json!({"op": "end", "session": id, "uid": a}));
        assert_eq!(reply["ok"], true, "{reply}");
    }
    let mut root = daemon.connect();
    let mut worst = (Duration::ZERO, Duration::ZERO);
    let idle = json!({"running": 0, "waiting": 0, "uncommitted_outcomes": 0});
    let finished = eventually(Duration::from_secs(300), || {
        let at = std::time::Instant::now();
        let listed = user_b.request(&json!({"op": "list"})).expect("a reply");
        assert_eq!(listed["ok"], true, "{listed}");
        worst.0 = worst.0.max(at.elapsed());
        let at = std::time::Instant::now();
        root.send_raw(b"{\"op\":\"status\"}\n");
        let status = root
            .next_within(Duration::from_secs(30))
            .expect("status answered");
        worst.1 = worst.1.max(at.elapsed());
        status["status"]["actions"] == idle
    });
    let _ = attacker.kill();
    let _ = attacker.wait();
    assert!(finished, "the actions did not all end");
    let (mut failed_to_start, mut timed_out, mut exited) = (0, 0, 0);
    for id in &sessions {
        let session = daemon.wait_finalized(id, Some(a));
        for action in session["actions"].as_array().expect("actions") {
            let outcome = &action["outcome"];
            if outcome["failed_to_start"] == true {
                failed_to_start += 1;
            } else if outcome["timed_out"] == true {
                timed_out += 1;
            } else {
                assert_eq!(outcome["exit"]["code"], 0, "{outcome}");
                exited += 1;
            }
        }
    }
    eprintln!(
        "256 actions: {failed_to_start} stopped before their exec, {timed_out} after it, {exited} not stopped; worst list {:?}, status {:?}",
        worst.0, worst.1
    );
    assert_eq!(failed_to_start + timed_out + exited, 256);
    assert!(
        worst.0 < Duration::from_secs(5) && worst.1 < Duration::from_secs(5),
        "{worst:?}"
    );
}

/// An action's child holds none of the daemon's descriptors from its first step: held
/// before its exec (here it stops itself there, as its user may stop it), it keeps only its
/// stdin, stdout and stderr (copied onto 0, 1 and 2) and the two pipes of its start. A child that held the daemon's
/// state lock while waiting to be let run made the restart of a daemon killed meanwhile
/// fail with "another livenessd already uses" the state.
#[test]
fn a_child_held_before_its_exec_keeps_none_of_the_daemons_descriptors() {
    if !privileged("a_child_held_before_its_exec_keeps_none_of_the_daemons_descriptors") {
        return;
    }
    let daemon = Daemon::start_under(
        &["env", "LIVENESS_FAULT=action-stopped-before-exec"],
        None,
        &[],
    );
    let mut owner = Orphan::spawn(&["exit", "0"]);
    register(
        &daemon,
        json!({"session": "s", "owner": {"pid": owner.pid},
            "on_end_run": [{"argv": ["/bin/true"], "timeout_ms": 30_000}]}),
    );
    owner.release();
    let stopped_child = || {
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .find_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                // `pid (comm) state ppid ...`: the fields after the last `)`.
                let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
                (fields.first() == Some(&"T")
                    && fields.get(1) == Some(&daemon.pid().to_string().as_str()))
                .then_some(pid)
            })
    };
    let mut child = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            child = stopped_child();
            child.is_some()
        }),
        "no action child stopped before its exec:\n{}",
        daemon.log()
    );
    let child = child.unwrap();
    let held: Vec<String> = std::fs::read_dir(format!("/proc/{child}/fd"))
        .expect("the child's descriptors")
        .flatten()
        .map(|fd| {
            std::fs::read_link(fd.path())
                .map_or_else(|e| e.to_string(), |l| l.display().to_string())
        })
        .collect();
    // SAFETY: kill(2) of the stopped child found above; the daemon reaps it.
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
    // Its stdin (the facts, a memfd), /dev/null, its stderr's and its start's pipes: the
    // daemon's database, state lock, socket and eBPF maps are none of these.
    assert!(
        held.iter().all(|target| target.starts_with("pipe:")
            || target == "/dev/null"
            || target.starts_with("/memfd:liveness-end-facts")),
        "the child holds more than its own descriptors: {held:?}"
    );
}
