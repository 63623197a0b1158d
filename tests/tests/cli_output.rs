//! The `liveness` command's text output, for people: tables with headers, ages and local
//! times, how a session ended, labels, the owner's current name, status counters, and a
//! friendly line for an empty list.

use std::time::Duration;

use integration_tests::{Daemon, Orphan, eventually};

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
