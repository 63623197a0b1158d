//! Forced fallbacks: the real daemon under `seccomp-deny`, which makes `bpf(2)`,
//! `pidfd_open(2)` or both fail as a container's seccomp profile would. In each leg the
//! daemon must say which source is off and why (in `status` and in `liveness doctor`),
//! and still finalize a real SIGKILLed owner through the source that is left, with the
//! exit status exactly where that source can know it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use integration_tests::{Daemon, binary, eventually, privileged};
use liveness_proc::diagnose::Release;
use serde_json::{Value, json};

const ARRIVAL: Duration = Duration::from_secs(20);

/// What a leg expects of one source in `status`.
struct Expected {
    name: &'static str,
    state: &'static str,
    /// The syscall a source that is off must name as blocked by seccomp.
    blocked: Option<&'static str>,
}

const fn source(name: &'static str, state: &'static str) -> Expected {
    Expected {
        name,
        state,
        blocked: None,
    }
}

const fn blocked(name: &'static str, syscall: &'static str) -> Expected {
    Expected {
        name,
        state: "off",
        blocked: Some(syscall),
    }
}

/// `seccomp-deny --deny SYSCALLS --errno ERRNO --`, as a command prefix.
fn wrapper(deny: &str, errno: &str) -> Vec<String> {
    vec![
        binary("seccomp-deny").display().to_string(),
        "--deny".into(),
        deny.into(),
        "--errno".into(),
        errno.into(),
        "--".into(),
    ]
}

fn start(deny: &str, errno: &str, args: &[&str]) -> Daemon {
    let prefix = wrapper(deny, errno);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    Daemon::start_under(&prefix, None, args)
}

/// The daemon's sources as `status` reports them.
fn status_sources(daemon: &Daemon) -> Vec<Value> {
    let reply = daemon.request(json!({"op": "status"}));
    assert_eq!(reply["ok"], true, "status: {reply}");
    reply["status"]["monitor"]["sources"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("status without monitor.sources: {reply}"))
}

fn find<'a>(sources: &'a [Value], name: &str) -> &'a Value {
    sources
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no source {name} in {sources:?}"))
}

fn check_sources(leg: &str, sources: &[Value], expected: &[Expected]) {
    for want in expected {
        let got = find(sources, want.name);
        assert_eq!(
            got["state"], want.state,
            "{leg}: source {} should be {}: {got}",
            want.name, want.state
        );
        if let Some(syscall) = want.blocked {
            let reason = got["reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains("seccomp filter") && reason.contains(&format!("{syscall}(2)")),
                "{leg}: the reason for {} must name seccomp blocking {syscall}(2): {reason:?}",
                want.name
            );
            for wrong in ["older than", "map error", "CAP_BPF"] {
                assert!(
                    !reason.contains(wrong),
                    "{leg}: the reason for {} blames something else ({wrong:?}): {reason:?}",
                    want.name
                );
            }
        }
    }
}

/// `liveness doctor --json` must show the daemon's own view, the same as its status, and
/// the client's apart: this test process has no filter, so it could start every source.
fn check_doctor(leg: &str, daemon: &Daemon, status: &[Value]) {
    let output = daemon.cli(&["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{leg}: doctor --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(output.status.code(), Some(0), "{leg}: doctor: {report}");
    assert!(report.get("daemon_error").is_none(), "{leg}: {report}");
    assert_eq!(report["daemon"]["pid"], daemon.pid(), "{leg}: {report}");
    let shown = report["daemon"]["sources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(shown.len(), status.len(), "{leg}: {report}");
    for source in status {
        let doctor = find(&shown, source["name"].as_str().unwrap_or_default());
        for field in ["state", "reason", "self_test"] {
            assert_eq!(
                doctor[field], source[field],
                "{leg}: doctor and status disagree on {field} of {}",
                source["name"]
            );
        }
    }
    let client = report["client"]["sources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for name in ["ebpf", "pidfd"] {
        assert_eq!(
            find(&client, name)["state"],
            "available",
            "{leg}: this unfiltered test process could start {name}: {report}"
        );
    }
    // The text form says the same, each part under its own heading.
    let text = daemon.cli(&["doctor"]);
    let text = String::from_utf8_lossy(&text.stdout);
    let (daemon_part, client_part) = text
        .split_once("this client")
        .unwrap_or_else(|| panic!("{leg}: doctor has no client part:\n{text}"));
    assert!(
        daemon_part.starts_with("daemon: livenessd"),
        "{leg}:\n{text}"
    );
    for source in status {
        let line = format!(
            "  {:<9} {}",
            source["name"].as_str().unwrap_or_default(),
            source["state"].as_str().unwrap_or_default()
        );
        let line = match source["reason"].as_str() {
            Some(reason) => format!("{line}: {reason}"),
            None => line,
        };
        assert!(
            daemon_part.lines().any(|l| l == line),
            "{leg}: the daemon part lacks {line:?}:\n{text}"
        );
    }
    assert!(
        client_part.contains("ebpf      available"),
        "{leg}: the client part:\n{text}"
    );
}

/// A child of the test, registered as a session's owner, SIGKILLed and reaped at once (so
/// a source that reads the status after the reap has it to read).
fn kill_owner(leg: &str, daemon: &Daemon, session: &str) -> Value {
    let mut owner: Child = Command::new(binary("testproc"))
        .args(["exit", "0"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn testproc");
    let reply =
        daemon.request(json!({"op": "register", "session": session, "owner": {"pid": owner.id()}}));
    assert_eq!(reply["ok"], true, "{leg}: register: {reply}");
    owner.kill().expect("SIGKILL the owner");
    let status = owner.wait().expect("reap the owner");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{leg}: the owner died of SIGKILL"
    );
    let mut session_now = Value::Null;
    let ended = eventually(ARRIVAL, || {
        let reply = daemon.request(json!({"op": "get", "session": session}));
        session_now = reply["session"].clone();
        session_now["phase"] == "ended"
    });
    assert!(ended, "{leg}: the session did not end: {session_now}");
    assert_eq!(
        session_now["reason"], "owner_exited",
        "{leg}: {session_now}"
    );
    // Only the eBPF programs see why: any other source says the cause is unknown, and why.
    let cause = &session_now["cause"];
    if session_now["detected_by"] == "ebpf" {
        assert_eq!(cause["kind"], "signal", "{leg}: {session_now}");
        assert_eq!(cause["sender"]["pid"], std::process::id(), "{leg}: {cause}");
    } else {
        assert_eq!(cause["kind"], "unknown", "{leg}: {session_now}");
        assert!(
            cause["reason"]
                .as_str()
                .is_some_and(|reason| reason.contains("does not show why")),
            "{leg}: {cause}"
        );
    }
    session_now
}

const SIGKILLED: fn() -> Value = || json!({"kind": "signaled", "signal": 9, "core_dumped": false});

/// Linux 6.15 added `PIDFD_INFO_EXIT`: from then on pidfd gives the status once reaped.
fn pidfd_knows_status() -> bool {
    Release::running().is_some_and(|r| r >= Release::new(6, 15))
}

#[test]
fn bpf_denied_falls_back_to_pidfd() {
    let leg = "bpf denied";
    if !privileged("bpf_denied_falls_back_to_pidfd") {
        return;
    }
    let daemon = start("bpf", "ENOSYS", &[]);
    let sources = status_sources(&daemon);
    check_sources(
        leg,
        &sources,
        &[blocked("ebpf", "bpf"), source("pidfd", "active")],
    );
    check_doctor(leg, &daemon, &sources);
    let ended = kill_owner(leg, &daemon, "bpf-denied");
    assert_eq!(ended["detected_by"], "pidfd", "{leg}: {ended}");
    let expected = if pidfd_knows_status() {
        SIGKILLED()
    } else {
        Value::Null
    };
    assert_eq!(
        ended["exit"], expected,
        "{leg}: pidfd gives the status after the reap on Linux 6.15+ and none before"
    );
}

#[test]
fn bpf_denied_with_only_ebpf_selected_fails_at_start() {
    if !privileged("bpf_denied_with_only_ebpf_selected_fails_at_start") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = wrapper("bpf", "ENOSYS");
    let output = Command::new(&prefix[0])
        .args(&prefix[1..])
        .arg(binary("livenessd"))
        .arg("--socket")
        .arg(dir.path().join("liveness.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--sources", "ebpf"])
        .stdin(Stdio::null())
        .output()
        .expect("run livenessd");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "livenessd --sources ebpf started with bpf(2) blocked: {stderr}"
    );
    assert!(
        stderr.contains("seccomp filter") && stderr.contains("bpf(2)"),
        "the start failure must name seccomp blocking bpf(2): {stderr}"
    );
    assert!(
        !dir.path().join("liveness.sock").exists(),
        "a daemon that cannot run its only source must not listen"
    );
}

#[test]
fn pidfd_open_denied_falls_back_to_ebpf() {
    let leg = "pidfd_open denied";
    if !privileged("pidfd_open_denied_falls_back_to_ebpf") {
        return;
    }
    let daemon = start("pidfd_open", "EPERM", &[]);
    let sources = status_sources(&daemon);
    check_sources(
        leg,
        &sources,
        &[source("ebpf", "active"), blocked("pidfd", "pidfd_open")],
    );
    assert_eq!(
        find(&sources, "ebpf")["self_test"]["passed"],
        true,
        "{leg}: the eBPF self-test passes: {sources:?}"
    );
    check_doctor(leg, &daemon, &sources);
    let ended = kill_owner(leg, &daemon, "pidfd-denied");
    assert_eq!(ended["detected_by"], "ebpf", "{leg}: {ended}");
    assert_eq!(
        ended["exit"],
        SIGKILLED(),
        "{leg}: eBPF always knows the status"
    );
}

#[test]
fn both_denied_fall_back_to_procpoll() {
    let leg = "bpf and pidfd_open denied";
    if !privileged("both_denied_fall_back_to_procpoll") {
        return;
    }
    let daemon = start(
        "bpf,pidfd_open",
        "ENOSYS",
        &["--procpoll-interval", "100ms"],
    );
    let sources = status_sources(&daemon);
    check_sources(
        leg,
        &sources,
        &[
            blocked("ebpf", "bpf"),
            blocked("pidfd", "pidfd_open"),
            source("procpoll", "active"),
        ],
    );
    check_doctor(leg, &daemon, &sources);
    let ended = kill_owner(leg, &daemon, "both-denied");
    assert_eq!(ended["detected_by"], "procpoll", "{leg}: {ended}");
    assert_eq!(
        ended["exit"],
        Value::Null,
        "{leg}: /proc polling cannot know the status"
    );
}

/// The wrapper blocks exactly what it lists, with the errno asked for, and the client part
/// of `doctor` diagnoses its own filter as it would the daemon's (no daemon needed: the
/// client part is printed even when none answers).
#[test]
fn seccomp_deny_blocks_only_the_listed_syscalls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = wrapper("bpf", "EPERM");
    let output = Command::new(&prefix[0])
        .args(&prefix[1..])
        .arg(binary("liveness"))
        .arg("--socket")
        .arg(dir.path().join("none.sock"))
        .args(["doctor", "--json"])
        .output()
        .expect("run liveness doctor under seccomp-deny");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(output.status.code(), Some(69), "no daemon: {report}");
    assert_eq!(report["daemon"], Value::Null, "{report}");
    assert!(report["daemon_error"].is_string(), "{report}");
    assert_eq!(report["client"]["seccomp_mode"], 2, "{report}");
    let sources = report["client"]["sources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ebpf = find(&sources, "ebpf");
    let reason = ebpf["reason"].as_str().unwrap_or_default();
    assert!(
        ebpf["state"] == "off"
            && reason.contains("seccomp filter")
            && reason.contains("bpf(2)")
            && reason.contains("EPERM"),
        "bpf(2) blocked with EPERM: {ebpf}"
    );
    assert_eq!(
        find(&sources, "pidfd")["state"],
        "available",
        "pidfd_open was not listed: {report}"
    );

    let refused = Command::new(binary("seccomp-deny"))
        .args(["--deny", "open", "--", "true"])
        .output()
        .expect("run seccomp-deny");
    assert_eq!(
        refused.status.code(),
        Some(64),
        "an unknown syscall is a usage error"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unknown syscall \"open\""),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
