//! Alive but stuck: a session's activity judged from its real process tree (CPU, I/O,
//! threads, TCP sockets read through sock_diag) and what its agent declares, against a real
//! daemon with short thresholds. The agents are `agentlike` processes; their model API is a
//! loopback TCP server in the test.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use integration_tests::{
    ClientAs, Daemon, binary, eventually, privileged, register, scrape, subscribe,
};

/// Another user, who must see nothing of root's sessions' activity.
const MALLORY: u32 = 61_071;
/// The thresholds every test runs with: a stall after 3 s without progress.
const ARGS: &[&str] = &[
    "--activity-interval",
    "300ms",
    "--stall-after",
    "3s",
    "--spin-after",
    "3s",
];
/// Five thresholds: what "never" means here.
const NEVER: Duration = Duration::from_secs(15);

/// A loopback server standing for a model API: it sends what the test asks, when it asks.
struct Api {
    addr: String,
    send: mpsc::Sender<Vec<u8>>,
}

impl Api {
    /// Listens; the first client gets `first` at once, then whatever [`Api::send`] passes.
    fn start(first: &[u8]) -> Api {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().unwrap().to_string();
        let (send, chunks) = mpsc::channel::<Vec<u8>>();
        let first = first.to_vec();
        std::thread::spawn(move || {
            let (mut client, _) = listener.accept().expect("accept");
            client.write_all(&first).expect("send the headers");
            for chunk in chunks {
                if client.write_all(&chunk).is_err() {
                    return;
                }
            }
            // The test is over: hold the connection until the process ends.
            std::thread::sleep(Duration::from_secs(3600));
        });
        Api { addr, send }
    }

    fn send(&self, bytes: &[u8]) {
        self.send.send(bytes.to_vec()).expect("the server runs");
    }
}

/// An `agentlike` process, killed when dropped.
struct Agent(Child);

impl Agent {
    fn start(args: &[&str]) -> Agent {
        let mut child = Command::new(binary("agentlike"))
            .args(args)
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start agentlike");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .expect("agentlike says ready");
        assert_eq!(line.trim(), "ready", "agentlike {args:?}");
        Agent(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // The agent leads a process group of its own: its children go with it.
        // SAFETY: kill(2) of that group, which holds only the agent's processes.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Pins `pids` to one CPU, the first this test may run on: they share it.
fn share_one_cpu(pids: &[u32]) {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: a `cpu_set_t` is plain data, which the calls only read or fill.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, size, &mut allowed), 0);
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .find(|&cpu| libc::CPU_ISSET(cpu, &allowed))
            .expect("a CPU to run on");
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        for &pid in pids {
            let pinned = libc::sched_setaffinity(pid as libc::pid_t, size, &one);
            assert_eq!(pinned, 0, "{}", std::io::Error::last_os_error());
        }
    }
}

/// `touch` of `session` with the fields of `declaration`: the daemon's reply.
fn declare(daemon: &Daemon, session: &str, declaration: &Value) -> Value {
    let mut request = json!({"op": "touch", "session": session});
    for (key, value) in declaration.as_object().unwrap() {
        request[key] = value.clone();
    }
    daemon.request(request)
}

fn touch(daemon: &Daemon, session: &str, declaration: Value) {
    let reply = declare(daemon, session, &declaration);
    assert_eq!(reply["ok"], true, "touch {declaration}: {reply}");
}

fn activity(daemon: &Daemon, session: &str) -> Value {
    let reply = daemon.request(json!({"op": "get", "session": session}));
    assert_eq!(reply["ok"], true, "{reply}");
    reply["session"]["activity"].clone()
}

fn state(daemon: &Daemon, session: &str) -> String {
    activity(daemon, session)["state"]
        .as_str()
        .unwrap_or("none")
        .to_owned()
}

/// Waits until the session is in `wanted`; its activity then.
fn reaches(daemon: &Daemon, session: &str, wanted: &str, within: Duration) -> Value {
    let mut last = Value::Null;
    let reached = eventually(within, || {
        last = activity(daemon, session);
        last["state"] == wanted
    });
    assert!(
        reached,
        "{session} never became {wanted} within {within:?}: {last}\n{}",
        daemon.log()
    );
    last
}

/// Polls the session for `span`: every state it was seen in.
fn states_during(daemon: &Daemon, session: &str, span: Duration) -> Vec<String> {
    let until = Instant::now() + span;
    let mut seen: Vec<String> = Vec::new();
    while Instant::now() < until {
        let now = state(daemon, session);
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    seen
}

/// The kinds of the session's stall events recorded so far, replayed from the start.
fn episodes(daemon: &Daemon, session: &str) -> Vec<String> {
    let mut stream = subscribe(daemon, Some(0));
    let mut kinds = Vec::new();
    while let Some(line) = stream.next_within(Duration::from_millis(500)) {
        let event = &line["event"];
        let kind = event["kind"].as_str().unwrap_or_default();
        if event["session"] == session && kind.contains("stalled") {
            kinds.push(kind.to_owned());
        }
    }
    kinds
}

/// (a) A streaming response that stops: the owner blocked in `recv` on a connection that
/// sent its headers and then nothing, a turn in flight: `stalled` for `network` within the
/// threshold and an interval or two, the socket named; bytes again: `unstalled`. One
/// event each. The text `get` says it in one line; another user sees none of it.
#[test]
fn a_response_that_stops_arriving_is_a_network_stall_until_bytes_come_again() {
    if !privileged("a_response_that_stops_arriving_is_a_network_stall_until_bytes_come_again") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\ndata: {}\n");
    let agent = Agent::start(&["read", &api.addr]);
    register(&daemon, "a", agent.pid());
    touch(&daemon, "a", json!({"turn": "start"}));
    let quiet_from = Instant::now();
    let stalled = reaches(&daemon, "a", "stalled", Duration::from_secs(20));
    let detected = quiet_from.elapsed();
    eprintln!("stalled after {detected:?} of silence: {stalled}");
    assert!(
        detected < Duration::from_millis(3000 + 2 * 300 + 1500),
        "detected after {detected:?}"
    );
    assert_eq!(stalled["reason"], "network", "{stalled}");
    let socket = &stalled["evidence"]["sockets"][0];
    assert_eq!(socket["peer"], api.addr, "{stalled}");
    assert!(socket["bytes_received"].as_u64() >= Some(25), "{stalled}");

    let text = daemon.cli(&["get", "--session", "a"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("Activity: stalled") && text.contains(&format!("no bytes from {}", api.addr)),
        "{text}"
    );

    let mut mallory = ClientAs::connect(&daemon, MALLORY);
    let listed = mallory
        .request(&json!({"op": "list"}))
        .expect("a reply to another user");
    assert_eq!(listed["sessions"], json!([]), "{listed}");

    api.send(b"data: more\n");
    reaches(&daemon, "a", "working", Duration::from_secs(10));
    assert_eq!(
        episodes(&daemon, "a"),
        ["session.stalled", "session.unstalled"]
    );
}

/// (b) Bytes arrive and the owner does not read them: `not_reading`, even without hooks.
#[test]
fn bytes_left_unread_are_not_reading() {
    if !privileged("bytes_left_unread_are_not_reading") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let api = Api::start(&[b'x'; 300]);
    let agent = Agent::start(&["unread", &api.addr]);
    register(&daemon, "b", agent.pid());
    let stalled = reaches(&daemon, "b", "stalled", Duration::from_secs(20));
    assert_eq!(stalled["reason"], "not_reading", "{stalled}");
    assert_eq!(
        stalled["evidence"]["sockets"][0]["unread"], 300,
        "{stalled}"
    );
}

/// (c) Extended thinking: one byte a second, below the threshold, for five thresholds:
/// never stalled.
#[test]
fn a_byte_a_second_is_never_a_stall() {
    if !privileged("a_byte_a_second_is_never_a_stall") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\n");
    let agent = Agent::start(&["read", &api.addr]);
    register(&daemon, "c", agent.pid());
    touch(&daemon, "c", json!({"turn": "start"}));
    let trickle = std::thread::spawn(move || {
        for _ in 0..NEVER.as_secs() {
            api.send(b".");
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let seen = states_during(&daemon, "c", NEVER);
    trickle.join().unwrap();
    assert!(!seen.contains(&"stalled".to_owned()), "{seen:?}");
    assert_eq!(episodes(&daemon, "c"), Vec::<String>::new());
}

/// (d) A declared tool with a silent child: `tool`, no event.
#[test]
fn a_silent_declared_tool_is_tool_and_no_stall() {
    if !privileged("a_silent_declared_tool_is_tool_and_no_stall") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let agent = Agent::start(&["tool"]);
    register(&daemon, "d", agent.pid());
    touch(&daemon, "d", json!({"turn": "start", "tool": "Bash"}));
    let seen = states_during(&daemon, "d", NEVER);
    assert_eq!(seen.last().map(String::as_str), Some("tool"), "{seen:?}");
    assert!(!seen.contains(&"stalled".to_owned()), "{seen:?}");
    assert_eq!(episodes(&daemon, "d"), Vec::<String>::new());
    let text = daemon.cli(&["get", "--session", "d"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("running tool Bash"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
}

/// (e) An idle prompt: the turn ended, the agent waits for its user: `idle`, no event.
#[test]
fn waiting_for_the_user_is_idle_and_no_stall() {
    if !privileged("waiting_for_the_user_is_idle_and_no_stall") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\n");
    let agent = Agent::start(&["read", &api.addr]);
    register(&daemon, "e", agent.pid());
    touch(&daemon, "e", json!({"turn": "start"}));
    touch(&daemon, "e", json!({"turn": "end"}));
    let seen = states_during(&daemon, "e", NEVER);
    assert_eq!(seen.last().map(String::as_str), Some("idle"), "{seen:?}");
    assert!(!seen.contains(&"stalled".to_owned()), "{seen:?}");
    assert_eq!(episodes(&daemon, "e"), Vec::<String>::new());
}

/// (f) The MCP trickle: the owner blocked, a long-lived child burning 2 % of a core with a
/// little I/O: `stalled` all the same.
#[test]
fn a_long_lived_childs_trickle_does_not_hide_a_stall() {
    if !privileged("a_long_lived_childs_trickle_does_not_hide_a_stall") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\n");
    let agent = Agent::start(&["mcp", &api.addr]);
    register(&daemon, "f", agent.pid());
    // The child started before the turn: it is long-lived.
    std::thread::sleep(Duration::from_millis(300));
    touch(&daemon, "f", json!({"turn": "start"}));
    let stalled = reaches(&daemon, "f", "stalled", Duration::from_secs(20));
    assert_eq!(
        stalled["evidence"]["processes"], 2,
        "the child was sampled and set aside: {stalled}"
    );
}

/// (g) A busy loop with no I/O: `spinning`, even while another busy loop shares its one CPU
/// and it gets half of it (the time it waited for the CPU counts); `status` and the metrics
/// count it.
#[test]
fn a_busy_loop_is_spinning() {
    if !privileged("a_busy_loop_is_spinning") {
        return;
    }
    let daemon = Daemon::start(&[ARGS, &["--metrics-listen", "127.0.0.1:0"]].concat());
    let agent = Agent::start(&["spin"]);
    let rival = Agent::start(&["spin"]);
    share_one_cpu(&[agent.pid(), rival.pid()]);
    register(&daemon, "g", agent.pid());
    let spinning = reaches(&daemon, "g", "spinning", Duration::from_secs(20));
    let had = spinning["evidence"]["cpu_permille"].as_u64().unwrap();
    let waited = spinning["evidence"]["cpu_wait_permille"]
        .as_u64()
        .unwrap_or(0);
    assert!(had + waited >= 800, "{spinning}");
    assert!(had < 800 && waited > 0, "the CPU was shared: {spinning}");
    assert_eq!(episodes(&daemon, "g"), ["session.stalled"]);
    let status = daemon.request(json!({"op": "status"}));
    assert_eq!(status["status"]["activity"]["spinning"], 1, "{status}");
    let metrics = scrape(&daemon.metrics_addr(), "/metrics");
    assert!(
        metrics.contains("liveness_sessions_activity{state=\"spinning\"} 1"),
        "{metrics}"
    );
}

/// (h) A worker writing files, no sockets: `working` throughout.
#[test]
fn a_worker_writing_files_is_working() {
    if !privileged("a_worker_writing_files_is_working") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let dir = tempfile::tempdir().expect("temp dir");
    let agent = Agent::start(&["write", dir.path().to_str().unwrap()]);
    register(&daemon, "h", agent.pid());
    touch(&daemon, "h", json!({"turn": "start"}));
    let seen = states_during(&daemon, "h", NEVER);
    assert_eq!(seen.last().map(String::as_str), Some("working"), "{seen:?}");
    assert!(!seen.contains(&"stalled".to_owned()), "{seen:?}");
}

/// (i) A stall across a daemon's crash and restart is reported once, not twice; its end
/// after the restart is reported.
#[test]
fn a_stall_across_a_restart_is_reported_once() {
    if !privileged("a_stall_across_a_restart_is_reported_once") {
        return;
    }
    let mut daemon = Daemon::start(ARGS);
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\n");
    let agent = Agent::start(&["read", &api.addr]);
    register(&daemon, "i", agent.pid());
    touch(&daemon, "i", json!({"turn": "start"}));
    reaches(&daemon, "i", "stalled", Duration::from_secs(20));
    daemon.kill9();
    daemon.restart();
    let seen = states_during(&daemon, "i", Duration::from_secs(5));
    assert_eq!(seen.last().map(String::as_str), Some("stalled"), "{seen:?}");
    assert_eq!(episodes(&daemon, "i"), ["session.stalled"]);
    api.send(b"data: at last\n");
    reaches(&daemon, "i", "working", Duration::from_secs(10));
    assert_eq!(
        episodes(&daemon, "i"),
        ["session.stalled", "session.unstalled"]
    );
}

/// A declaration the daemon cannot show as it is (control characters, too long, a tool
/// started and ended at once) is refused and changes nothing.
#[test]
fn a_bad_declaration_is_refused_and_changes_nothing() {
    if !privileged("a_bad_declaration_is_refused_and_changes_nothing") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let agent = Agent::start(&["tool"]);
    register(&daemon, "j", agent.pid());
    touch(&daemon, "j", json!({"turn": "start", "tool": "Read"}));
    for bad in [
        json!({"tool": "a\u{1b}[2Jb"}),
        json!({"tool": "x".repeat(129)}),
        json!({"tool": "Bash", "tool_end": true}),
        json!({"turn": "sideways"}),
    ] {
        let reply = declare(&daemon, "j", &bad);
        assert_eq!(reply["ok"], false, "{bad}: {reply}");
    }
    let session = daemon.request(json!({"op": "get", "session": "j"}))["session"].clone();
    assert_eq!(session["declared"]["tool"], "Read", "{session}");
}

/// A registration for `MALLORY`'s namespace, made by root, of `owner` with `on_stall`.
fn register_for_mallory(daemon: &Daemon, session: &str, owner: u32, on_stall: Value) {
    let reply = daemon.request(json!({
        "op": "register", "session": session, "uid": MALLORY, "owner": {"pid": owner},
        "on_stall": on_stall,
    }));
    assert_eq!(reply["ok"], true, "register {session}: {reply}");
    let reply =
        daemon.request(json!({"op": "touch", "session": session, "uid": MALLORY, "turn": "start"}));
    assert_eq!(reply["ok"], true, "{reply}");
}

/// The state of `MALLORY`'s session.
fn mallory_state(daemon: &Daemon, session: &str) -> String {
    let reply = daemon.request(json!({"op": "get", "session": session, "uid": MALLORY}));
    reply["session"]["activity"]["state"]
        .as_str()
        .unwrap_or("none")
        .to_owned()
}

/// (j) `on_stall` `run`: the command runs once per episode, as the session's creator, the
/// judgement on its stdin; a second episode runs it again, and nothing between them.
#[test]
fn a_stall_runs_its_command_once_per_episode_as_its_user() {
    if !privileged("a_stall_runs_its_command_once_per_episode_as_its_user") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let runs = dir.path().join("runs");
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\n");
    let agent = Agent::start(&["read", &api.addr]);
    let command = format!("{{ id -u; cat; }} >> {}", runs.display());
    register_for_mallory(
        &daemon,
        "j",
        agent.pid(),
        json!({"action": "run", "run": {"argv": ["/bin/sh", "-c", command]}}),
    );
    let lines = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let ran = eventually(Duration::from_secs(20), || lines().len() >= 2);
    assert!(
        ran,
        "the stall command never ran: {:?}\n{}",
        lines(),
        daemon.log()
    );
    // Sampled a few times more while stalled: no second run.
    std::thread::sleep(Duration::from_secs(2));
    let first = lines();
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0], MALLORY.to_string(), "run as its creator");
    let facts: Value = serde_json::from_str(&first[1]).expect("the facts as JSON");
    assert_eq!(
        (
            &facts["session"],
            &facts["uid"],
            &facts["activity"]["state"]
        ),
        (&json!("j"), &json!(MALLORY), &json!("stalled")),
        "{facts}"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&runs).unwrap().uid(), MALLORY);

    // Bytes again: the episode ends. Silence again: a second episode, a second run.
    api.send(b"data: more\n");
    assert!(eventually(Duration::from_secs(10), || mallory_state(
        &daemon, "j"
    ) == "working"));
    let again = eventually(Duration::from_secs(20), || lines().len() >= 4);
    assert!(again, "no run for the second episode: {:?}", lines());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(lines().len(), 4, "{:?}", lines());
}

/// `on_stall` `terminate`: the owner and its long-lived child get SIGTERM; the owner's
/// death ends the session as any death does, naming the signal.
#[test]
fn terminate_on_stall_ends_the_tree_and_its_death_ends_the_session() {
    if !privileged("terminate_on_stall_ends_the_tree_and_its_death_ends_the_session") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\n");
    let mut agent = Agent::start(&["mcp", &api.addr]);
    let reply = daemon.request(json!({
        "op": "register", "session": "t", "owner": {"pid": agent.pid()},
        "grace_ms": 1000, "on_stall": {"action": "terminate"},
    }));
    assert_eq!(reply["ok"], true, "{reply}");
    std::thread::sleep(Duration::from_millis(300));
    touch(&daemon, "t", json!({"turn": "start"}));
    let ended = eventually(Duration::from_secs(20), || {
        daemon.request(json!({"op": "get", "session": "t"}))["session"]["phase"] == "ended"
    });
    let session = daemon.request(json!({"op": "get", "session": "t"}))["session"].clone();
    assert!(ended, "{session}\n{}", daemon.log());
    assert_eq!(session["exit"]["signal"], 15, "{session}");
    let status = agent.0.wait().expect("reap the owner");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(15)
    );
    let group = agent.pid() as i32;
    // SAFETY: kill(2) with signal 0 only asks whether the group has a process left.
    let empty = eventually(
        Duration::from_secs(5),
        || unsafe { libc::kill(-group, 0) } == -1,
    );
    assert!(empty, "the child outlived the terminate");
    assert_eq!(episodes(&daemon, "t"), ["session.stalled"]);
}

/// A user's policy never signals what the user could not: `MALLORY`'s session whose owner
/// is root's process stalls, and `signal:KILL` leaves the owner alive.
#[test]
fn a_stall_signal_never_reaches_a_process_its_user_could_not_signal() {
    if !privileged("a_stall_signal_never_reaches_a_process_its_user_could_not_signal") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let api = Api::start(b"HTTP/1.1 200 OK\r\n\r\n");
    let mut agent = Agent::start(&["read", &api.addr]);
    register_for_mallory(
        &daemon,
        "m",
        agent.pid(),
        json!({"action": "signal", "signal": 9}),
    );
    assert!(eventually(Duration::from_secs(20), || mallory_state(
        &daemon, "m"
    ) == "stalled"));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "root's process was killed for another user\n{}",
        daemon.log()
    );
    assert!(daemon.log().contains("not signalled"), "{}", daemon.log());
}

/// A stall policy that does not hold together is refused, and no session is made.
#[test]
fn a_bad_stall_policy_is_refused_and_registers_nothing() {
    if !privileged("a_bad_stall_policy_is_refused_and_registers_nothing") {
        return;
    }
    let daemon = Daemon::start(ARGS);
    let agent = Agent::start(&["tool"]);
    for bad in [
        json!({"action": "signal"}),
        json!({"action": "signal", "signal": 0}),
        json!({"action": "run", "run": {"argv": []}}),
        json!({"action": "terminate", "signal": 9}),
        json!({"stall_after_ms": 10}),
        json!({"action": "explode"}),
        json!({"stall_after": 1000}),
    ] {
        let reply = daemon.request(json!({
            "op": "register", "session": "bad", "owner": {"pid": agent.pid()}, "on_stall": bad,
        }));
        assert_eq!(reply["ok"], false, "{bad}: {reply}");
    }
    let reply = daemon.request(json!({"op": "get", "session": "bad"}));
    assert_eq!(reply["ok"], false, "{reply}");
    let cli = daemon.cli(&[
        "register",
        "--session",
        "bad",
        "--owner-pid",
        &agent.pid().to_string(),
        "--on-stall",
        "explode",
    ]);
    assert_eq!(cli.status.code(), Some(64), "{cli:?}");
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains("not a stall action"),
        "{cli:?}"
    );
    let reply = daemon.request(json!({"op": "get", "session": "bad"}));
    assert_eq!(reply["ok"], false, "{reply}");
}
