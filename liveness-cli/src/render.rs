//! How sessions, events, identities and the status are printed, as text or JSON.

use serde::Serialize;

use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, Identity};
use liveness_common::session::{EndReason, Event, Session};
use liveness_common::status::{SourceReport, Status};
use liveness_proc::identity::Liveness;

use crate::output::{self, outln};

pub(crate) fn print_session(session: &Session, json: bool) {
    if json {
        output::json(session);
    } else {
        outln!("{}", describe_session(session));
    }
}

/// The name a value has on the wire (`"active"`, `"owner_exited"`, ...); empty for none.
pub(crate) fn wire_name(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

/// How something ended, for the one-line descriptions.
fn describe_end(
    reason: Option<EndReason>,
    exit: Option<ExitStatus>,
    detected_by: Option<DetectedBy>,
) -> String {
    let mut text = String::new();
    if let Some(reason) = reason {
        text.push_str(&format!(" ended: {}", wire_name(reason)));
    }
    if let Some(exit) = exit {
        text.push_str(&format!(", {exit}"));
    }
    if let Some(by) = detected_by {
        text.push_str(&format!(" (detected by {by})"));
    }
    text
}

pub(crate) fn describe_session(session: &Session) -> String {
    let pending = if session.pending { " (pending)" } else { "" };
    format!(
        "{} {} owner {}{pending}{}",
        session.id,
        wire_name(session.phase),
        session.owner,
        describe_end(session.reason, session.exit, session.detected_by)
    )
}

pub(crate) fn describe_event(event: &Event) -> String {
    format!(
        "#{} {} {} owner {}{}",
        event.seq,
        wire_name(event.kind),
        event.session,
        event.owner,
        describe_end(event.reason, event.exit, event.detected_by)
    )
}

pub(crate) fn print_status(status: &Status) {
    let daemon = &status.daemon;
    outln!(
        "livenessd {} (protocol {}), pid {}",
        daemon.version,
        daemon.protocol,
        daemon.pid
    );
    outln!("socket {}  state {}", daemon.socket, daemon.state_dir);
    outln!(
        "active sessions {}  head seq {}  subscribers {}",
        status.active_sessions,
        status.head_seq,
        status.subscribers
    );
    let monitor = &status.monitor;
    outln!(
        "tracked processes {} (without pidfd: {})",
        monitor.tracked,
        monitor.without_pidfd
    );
    print_sources(&monitor.sources);
}

/// One line per exit source: name, state and reason, and the eBPF self-test where run.
pub(crate) fn print_sources(sources: &[SourceReport]) {
    for source in sources {
        let reason = source
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        outln!(
            "  {:<9} {}{reason}",
            source.name.to_string(),
            wire_name(source.state)
        );
        if let Some(test) = &source.self_test {
            outln!(
                "  {:<9} self-test {}: {}",
                "",
                if test.passed { "passed" } else { "FAILED" },
                test.detail
            );
        }
    }
}

pub(crate) fn print_identity(identity: &Identity, json: bool) {
    if json {
        output::json(identity);
    } else {
        outln!(
            "pid {} ({}) start_ticks {} boot_id {} host {}",
            identity.pid,
            identity.comm,
            identity.start_ticks,
            identity.boot_id,
            identity.host
        );
    }
}

/// The JSON shape of a liveness verdict.
#[derive(Debug, Serialize)]
struct Verdict<'a> {
    identity: &'a Identity,
    liveness: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<DeathReason>,
    detail: String,
}

pub(crate) fn print_liveness(identity: &Identity, liveness: &Liveness, json: bool) {
    let (word, reason, detail) = match liveness {
        Liveness::Alive => ("alive", None, "the process is running".to_owned()),
        Liveness::Dead(reason) => ("dead", Some(*reason), reason.to_string()),
        Liveness::Unknown(why) => ("unknown", None, why.clone()),
    };
    if json {
        output::json(&Verdict {
            identity,
            liveness: word,
            reason,
            detail,
        });
    } else {
        outln!("{word}: {detail} ({identity})");
    }
}
