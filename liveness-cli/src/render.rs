//! How sessions, events, identities and the status are printed, as text or JSON.

use std::io::Write;

use serde::Serialize;

use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, Identity};
use liveness_common::session::{EndReason, Event, Session};
use liveness_common::status::{SourceReport, Status};
use liveness_proc::identity::Liveness;

use crate::exit::Exit;

pub(crate) fn print_session(session: &Session, json: bool) -> Exit {
    if json {
        print_json(session);
    } else {
        println!("{}", describe_session(session));
    }
    Exit::Ok
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
    let lock = event.lock.as_ref().map_or_else(String::new, |lock| {
        let reason = lock.reason.map(|r| format!(" ({})", wire_name(r)));
        format!(
            " lock {} token {}{}",
            lock.name,
            lock.token,
            reason.unwrap_or_default()
        )
    });
    format!(
        "#{} {} {}{lock} owner {}{}",
        event.seq,
        wire_name(event.kind),
        event.session,
        event.owner,
        describe_end(event.reason, event.exit, event.detected_by)
    )
}

/// A time in Unix milliseconds as UTC, `2026-11-23T17:50:23.123Z`.
pub(crate) fn describe_ms(ms: i64) -> String {
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let seconds = ms_of_day / 1000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        ms_of_day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc() {
        assert_eq!(describe_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(describe_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(describe_ms(1_795_369_823_456), "2026-11-22T17:50:23.456Z");
    }
}

pub(crate) fn print_status(status: &Status) {
    let daemon = &status.daemon;
    println!(
        "livenessd {} (protocol {}), pid {}",
        daemon.version, daemon.protocol, daemon.pid
    );
    println!("socket {}  state {}", daemon.socket, daemon.state_dir);
    println!(
        "active sessions {}  head seq {}  subscribers {}",
        status.active_sessions, status.head_seq, status.subscribers
    );
    let monitor = &status.monitor;
    println!(
        "tracked processes {} (without pidfd: {})",
        monitor.tracked, monitor.without_pidfd
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
        println!(
            "  {:<9} {}{reason}",
            source.name.to_string(),
            wire_name(source.state)
        );
        if let Some(test) = &source.self_test {
            println!(
                "  {:<9} self-test {}: {}",
                "",
                if test.passed { "passed" } else { "FAILED" },
                test.detail
            );
        }
    }
}

pub(crate) fn print_json(value: &impl Serialize) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (e.g. `| head`) is not worth a panic.
    let _ = serde_json::to_writer(&mut out, value).map(|()| writeln!(out));
}

pub(crate) fn print_identity(identity: &Identity, json: bool) {
    if json {
        print_json(identity);
    } else {
        println!(
            "pid {} ({}) start_ticks {} boot_id {} host {}",
            identity.pid, identity.comm, identity.start_ticks, identity.boot_id, identity.host
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
        print_json(&Verdict {
            identity,
            liveness: word,
            reason,
            detail,
        });
    } else {
        println!("{word}: {detail} ({identity})");
    }
}
