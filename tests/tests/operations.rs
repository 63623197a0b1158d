//! What an operator sees of the daemon: a log line per session registered and ended, the
//! retention of ended sessions, and the metrics listener.

use std::time::Duration;

use integration_tests::{Daemon, Orphan, eventually, scrape};
use serde_json::json;

/// The line of the daemon's log that says `message` about `session`.
fn log_line(daemon: &Daemon, message: &str, session: &str) -> Option<String> {
    daemon
        .log()
        .lines()
        .find(|line| line.contains(message) && line.contains(&format!("session={session} ")))
        .map(str::to_owned)
}

#[test]
fn each_session_registered_and_ended_is_one_info_line() {
    let daemon = Daemon::start(&[]);
    let mut owner = Orphan::spawn(&["exit", "3"]);
    let reply =
        daemon.request(json!({"op": "register", "session": "logged", "owner": {"pid": owner.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    owner.release();
    daemon.wait_ended("logged");
    let mut ended = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            ended = log_line(&daemon, "session ended", "logged");
            ended.is_some()
        }),
        "no 'session ended' line:\n{}",
        daemon.log()
    );
    let ended = ended.unwrap();
    for field in [
        " INFO ",
        &format!("owner_pid={}", owner.pid),
        "reason=owner_exited",
        "source=",
        "exit=exited with code 3",
        "latency_ms=",
    ] {
        assert!(ended.contains(field), "lacks {field:?}: {ended}");
    }
    let registered = log_line(&daemon, "session registered", "logged")
        .unwrap_or_else(|| panic!("no 'session registered' line:\n{}", daemon.log()));
    assert!(registered.contains(" INFO "), "{registered}");
    assert!(
        registered.contains(&format!("owner_pid={}", owner.pid)),
        "{registered}"
    );
}

/// Smoke: ended ids stay taken while their session is kept; retention deletes the session
/// (and says so in the log), after which the id may be registered again, as documented.
/// The engine's test follows the same on a paused clock, retention's period included.
#[test]
fn an_ended_id_is_free_again_after_retention_and_the_prune_is_logged() {
    let mut daemon = Daemon::start(&[]);
    let me = std::process::id();
    let register = |daemon: &Daemon| {
        daemon.request(json!({"op": "register", "session": "reused", "owner": {"pid": me}}))
    };
    assert_eq!(register(&daemon)["ok"], true);
    let ended = daemon.request(json!({"op": "end", "session": "reused"}));
    assert_eq!(ended["ok"], true, "{ended}");
    let refused = register(&daemon);
    assert_eq!(refused["error"]["code"], "already_ended", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("--retain-age"),
        "says until when: {message}"
    );
    daemon.stop();

    // Under a retention of 1 ms, the next start prunes it.
    let state = daemon.state_dir.clone();
    let daemon = Daemon::start_with_state(Some(state), &["--retain-age", "1ms"]);
    assert!(
        eventually(Duration::from_secs(10), || daemon
            .log()
            .contains("pruned ended sessions beyond retention")),
        "the prune is not logged:\n{}",
        daemon.log()
    );
    let gone = daemon.request(json!({"op": "get", "session": "reused"}));
    assert_eq!(gone["error"]["code"], "not_found", "{gone}");
    let again = register(&daemon);
    assert_eq!(again["ok"], true, "the id is free again: {again}");
}

/// The value of the sample `name` (with its labels, as exposed) in an exposition.
fn sample(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

#[test]
fn the_metrics_listener_serves_the_status_counters() {
    let daemon = Daemon::start(&["--metrics-listen", "127.0.0.1:0"]);
    let addr = daemon.metrics_addr();

    let mut killed = Orphan::spawn(&["signal", "9"]);
    let reply =
        daemon.request(json!({"op": "register", "session": "m1", "owner": {"pid": killed.pid}}));
    assert_eq!(reply["ok"], true, "{reply}");
    let me = std::process::id();
    let reply = daemon.request(json!({"op": "register", "session": "m2", "owner": {"pid": me}}));
    assert_eq!(reply["ok"], true, "{reply}");
    killed.release();
    let ended = daemon.wait_ended("m1");
    let source = ended["detected_by"].as_str().unwrap().to_owned();

    let response = scrape(&addr, "/metrics");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("openmetrics-text"), "{head}");
    assert!(
        body.trim_end().ends_with("# EOF"),
        "a complete exposition:\n{body}"
    );
    let expect = |name: &str, value: f64| {
        assert_eq!(sample(body, name), Some(value), "{name} in:\n{body}");
    };
    expect("liveness_sessions{phase=\"active\"}", 1.0);
    expect("liveness_sessions{phase=\"ended\"}", 1.0);
    expect(
        &format!(
            "liveness_sessions_ended_total{{reason=\"owner_exited\",source=\"{source}\",cause=\"{}\"}}",
            ended["cause"]["kind"].as_str().unwrap()
        ),
        1.0,
    );
    expect("liveness_end_latency_seconds_count", 1.0);
    expect("liveness_end_latency_seconds_bucket{le=\"+Inf\"}", 1.0);
    for name in [
        "liveness_ringbuf_lost_total",
        "liveness_loss_reconciles_total",
        "liveness_subscribers",
        "liveness_subscribers_lagged_total",
        "liveness_commits_failed_total",
    ] {
        expect(name, 0.0);
    }
    expect("liveness_source_up{source=\"pidfd\"}", 1.0);

    let missing = scrape(&addr, "/other");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
}
