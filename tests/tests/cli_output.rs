//! The `liveness` command's text output, for people: tables with headers, ages and local
//! times, how a session ended, labels, the owner's current name, status counters, and a
//! friendly line for an empty list; another user's escape sequences printed as text, never
//! passed to root's terminal.

use std::io::BufRead;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{
    BinariesForAnyUser, Daemon, Orphan, TestprocAs, binary, cli_as, eventually, json_of,
    privileged, shared_daemon,
};
use serde_json::Value;

fn text(daemon: &Daemon, args: &[&str]) -> String {
    let output = daemon.cli(args);
    assert!(output.status.success(), "{args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn an_empty_list_says_so() {
    let daemon = Daemon::start(&[]);
    let list = text(&daemon, &["list"]);
    assert!(list.starts_with("No sessions."), "{list}");
    assert!(
        list.contains("liveness register"),
        "says what to do: {list}"
    );
    let filtered = text(&daemon, &["list", "--label", "tool=x"]);
    assert!(filtered.starts_with("No sessions match"), "{filtered}");
}

#[test]
fn list_is_a_table_with_ages_how_sessions_ended_and_labels() {
    let daemon = Daemon::start(&[]);
    let mut killed = Orphan::spawn(&["signal", "9"]);
    let running = Orphan::spawn(&["exit", "0"]);
    for (id, owner, label) in [
        ("killed-one", &killed, "tool=agent"),
        ("running-one", &running, "tool=build"),
    ] {
        let pid = owner.pid.to_string();
        let output = daemon.cli(&[
            "register",
            "--session",
            id,
            "--owner-pid",
            &pid,
            "--label",
            label,
        ]);
        assert!(output.status.success(), "{output:?}");
    }
    killed.release();
    daemon.wait_ended("killed-one");

    let list = text(&daemon, &["list"]);
    let mut lines = list.lines();
    let header = lines.next().unwrap_or_default();
    for column in ["SESSION", "STATE", "OWNER", "CREATED", "STATUS", "LABELS"] {
        assert!(header.contains(column), "header lacks {column}: {list}");
    }
    let row = |id: &str| {
        list.lines()
            .find(|line| line.starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id}: {list}"))
            .to_owned()
    };
    let ended = row("killed-one");
    assert!(
        ended.contains("ended just now,") || ended.contains(" ago,"),
        "an age: {list}"
    );
    assert!(ended.contains("killed by SIGKILL"), "how: {list}");
    assert!(ended.contains("tool=agent"), "labels: {list}");
    assert!(
        ended.contains(&format!("testproc (pid {})", killed.pid)),
        "the owner by name and pid: {list}"
    );
    let active = row("running-one");
    assert!(
        active.contains("active") && active.contains("tool=build"),
        "{list}"
    );
    assert!(!list.contains("start="), "no raw start ticks: {list}");
}

#[test]
fn get_shows_local_times_and_the_owners_current_name() {
    let daemon = Daemon::start(&[]);
    let mut owner = Orphan::spawn(&["exec", "0"]);
    let pid = owner.pid.to_string();
    let output = daemon.cli(&["register", "--session", "s", "--owner-pid", &pid]);
    assert!(output.status.success(), "{output:?}");
    // The owner execs into a process named `execd`: the same process, another name.
    owner.poke();
    let comm = format!("/proc/{pid}/comm");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(&comm)
            .is_ok_and(|c| c.trim() == "execd")),
        "the owner did not exec"
    );
    let get = text(&daemon, &["get", "--session", "s"]);
    assert!(get.contains("s - active"), "{get}");
    assert!(
        get.contains(&format!("execd (pid {pid}, registered as testproc)")),
        "the current name and the registered one: {get}"
    );
    // The stream's lines too: its registration shows the owner as it is now.
    let mut watch = std::process::Command::new(integration_tests::binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["watch", "--since", "0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut registered = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(watch.stdout.take().unwrap()),
        &mut registered,
    )
    .unwrap();
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(
        registered.contains(&format!("owner execd (pid {pid}, registered as testproc)")),
        "{registered}"
    );
    let created = get
        .lines()
        .find(|line| line.trim_start().starts_with("Created:"))
        .unwrap_or_else(|| panic!("no Created line: {get}"));
    // "Created: 2026-11-23 18:01:02 UTC (just now)": a date, a time, an age.
    let date = created.trim_start().trim_start_matches("Created: ");
    assert_eq!(date.as_bytes().get(4), Some(&b'-'), "{get}");
    assert_eq!(date.as_bytes().get(13), Some(&b':'), "{get}");
    assert!(
        created.contains("ago") || created.contains("just now"),
        "{get}"
    );
}

#[test]
fn status_text_has_the_counters() {
    let daemon = Daemon::start(&[]);
    let status = text(&daemon, &["status"]);
    for words in [
        "active",
        "finalized by",
        "failed commits",
        "subscribers",
        "lagging",
        "tracked",
        "refusals",
        "up since",
    ] {
        assert!(status.contains(words), "status lacks {words:?}:\n{status}");
    }
}

#[test]
fn check_prints_the_start_as_a_time_not_ticks() {
    let me = std::process::id().to_string();
    let output = std::process::Command::new(integration_tests::binary("liveness"))
        .args(["check", "--pid", &me])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let check = String::from_utf8_lossy(&output.stdout);
    let started = check
        .lines()
        .find(|line| line.trim_start().starts_with("Started:"))
        .unwrap_or_else(|| panic!("no Started line: {check}"));
    let when = started.trim_start().trim_start_matches("Started: ");
    assert_eq!(when.as_bytes().get(4), Some(&b'-'), "a date: {check}");
    assert!(
        when.contains(" ago;") || when.contains("just now;"),
        "an age: {check}"
    );
}

/// A uid of no account here, for the user whose words root reads.
const USER: u32 = 61_041;

/// Fails unless `output` holds nothing a terminal acts on: no C0 control but the newline,
/// no DEL, no C1 control (U+0080..U+009F).
fn assert_for_terminal(what: &str, output: &str) {
    let commands: Vec<char> = output
        .chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect();
    assert!(
        commands.is_empty(),
        "{what} printed {commands:?} raw:\n{}",
        output.escape_debug()
    );
}

fn run_as(binaries: &BinariesForAnyUser, daemon: &Daemon, args: &[&str]) -> Output {
    let output = cli_as(binaries, daemon, USER, args);
    assert!(output.status.success(), "{args:?}: {output:?}");
    output
}

/// Root's `watch --since 0` as text (or `--json`): its lines until one contains `last`.
fn watched(daemon: &Daemon, json: bool, last: &str) -> String {
    let mut watch = Command::new(binary("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["watch", "--since", "0"])
        .args(json.then_some("--json"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("run liveness watch");
    let stdout = watch.stdout.take().expect("stdout");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = Vec::new();
    let mut seen = false;
    while !seen {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = received.recv_timeout(left) else {
            break;
        };
        seen = String::from_utf8_lossy(&line).contains(last);
        text.extend(line);
        text.push(b'\n');
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let text = String::from_utf8(text).expect("UTF-8 output");
    assert!(seen, "watch never printed {last:?}: {text}");
    text
}

/// Another user's words reach root's terminal as text, never as the terminal's commands:
/// a process whose name (set with PR_SET_NAME) and command line hold OSC 52 (a clipboard
/// write), title and clear-screen sequences, a label with ESC and BEL, and an end action
/// whose stderr holds the same, all of a second uid. Root's `list`, `get`, `watch` and
/// `processes` print no byte a terminal acts on (C0 but the newline, DEL, C1); their
/// `--json` gives back the exact strings.
#[test]
fn other_users_escape_sequences_reach_no_terminal() {
    if !privileged("other_users_escape_sequences_reach_no_terminal") {
        return;
    }
    let (daemon, binaries) = shared_daemon();
    let comm = "\u{1b}]0;x\u{7}\u{1b}[2J\u{9b}J";
    let clipboard = "\u{1b}]52;c;cm0gLXJmIH4K\u{7}";
    let title = "\u{1b}]2;owned\u{1b}\\";
    let clear = "\u{1b}[2J\u{1b}[H\u{7f}\u{9b}31m";
    let label = "bell\u{7}\u{1b}[5mblink";
    let stderr = r"printf '\033]52;c;b3duZWQ=\007\033]0;pwn\007\033[2J' >&2; exit 3";

    let owner = TestprocAs::spawn(USER, &["named", comm, "0", clipboard, title, clear]);
    let pid = owner.pid().to_string();
    let named = eventually(Duration::from_secs(10), || {
        std::fs::read(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c == format!("{comm}\n").as_bytes())
    });
    assert!(named, "testproc did not take its name");
    let register = |extra: &[&str]| {
        let mut args = vec!["register", "--session", "hostile", "--owner-pid", &pid];
        args.extend(extra);
        run_as(&binaries, &daemon, &args);
    };
    register(&["--label", &format!("note={label}")]);
    let uid = USER.to_string();
    let root = |args: &[&str]| -> String {
        let output = daemon.cli(args);
        assert!(output.status.success(), "{args:?}: {output:?}");
        let text = String::from_utf8(output.stdout).expect("UTF-8 output");
        assert_for_terminal(&format!("`liveness {}`", args.join(" ")), &text);
        text
    };
    let list = root(&["list"]);
    assert!(list.contains(r"bell\u{7}\u{1b}[5mblink"), "{list}");
    let processes = root(&["processes", "--session", "hostile", "--uid", &uid]);
    assert!(
        processes.contains(r"\u{1b}]52;c;cm0gLXJmIH4K\u{7}"),
        "{processes}"
    );
    let json =
        json_of(&daemon.cli(&["processes", "--session", "hostile", "--uid", &uid, "--json"]));
    let cmdline = &json[0]["cmdline"];
    assert_eq!(cmdline[4], clipboard, "{json}");
    assert_eq!(cmdline[5], title, "{json}");
    assert_eq!(cmdline[6], clear, "{json}");

    // Ended by its user, with a failed end action whose stderr is all escapes.
    register(&["--on-end-run", stderr]);
    run_as(&binaries, &daemon, &["end", "--session", "hostile"]);
    daemon.wait_finalized("hostile", Some(USER));
    let get = root(&["get", "--session", "hostile", "--uid", &uid]);
    assert!(get.contains(r"\u{1b}]52;c;b3duZWQ=\u{7}"), "{get}");
    assert!(
        get.contains(r"\u{1b}]0;x\u{7}\u{1b}[2J\u{9b}J (pid"),
        "{get}"
    );
    let watch = watched(&daemon, false, "end action");
    assert_for_terminal("`liveness watch`", &watch);
    assert!(watch.contains(r"bell\u{7}\u{1b}[5mblink"), "{watch}");

    let get = json_of(&daemon.cli(&["get", "--session", "hostile", "--uid", &uid, "--json"]));
    assert_eq!(get["labels"]["note"], label, "{get}");
    assert_eq!(get["owner"]["comm"], comm, "{get}");
    let tail = get["actions"][0]["outcome"]["stderr_tail"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        tail, "\u{1b}]52;c;b3duZWQ=\u{7}\u{1b}]0;pwn\u{7}\u{1b}[2J",
        "{get}"
    );
    let listed = json_of(&daemon.cli(&["list", "--json"]));
    assert_eq!(listed[0]["labels"]["note"], label, "{listed}");
    let events = watched(&daemon, true, "\"action\"");
    let registered: Value = serde_json::from_str(events.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {events}"));
    assert_eq!(registered["event"]["labels"]["note"], label, "{events}");
    assert_for_terminal("`liveness watch --json`", &events);
    drop(owner);
}
