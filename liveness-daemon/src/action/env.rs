//! An action's environment: a clean, documented base, what the creator registered, and the
//! end facts as `LIVENESS_*` variables. Nothing of the daemon's own environment passes.

use liveness_common::action::{ActionSpec, EndFacts};
use liveness_common::exit::ExitStatus;

use super::user::RunAs;

/// `PATH` when the registration sets none: the usual system directories, as cron gives.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The variables of an action, in the order they are set; a later entry of the same name
/// replaces an earlier one.
pub fn environment(spec: &ActionSpec, facts: &EndFacts, user: &RunAs) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("PATH", DEFAULT_PATH.to_owned()),
        ("HOME", user.home.display().to_string()),
        ("USER", user.name.clone()),
        ("LOGNAME", user.name.clone()),
        ("SHELL", user.shell.display().to_string()),
        ("LANG", "C.UTF-8".to_owned()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    env.extend(
        spec.env_pairs()
            .map(|(name, value)| (name.to_owned(), value.to_owned())),
    );
    env.extend(liveness_variables(facts));
    env
}

/// The end facts as variables; the JSON on stdin has them all, these are for shell one-liners.
fn liveness_variables(facts: &EndFacts) -> Vec<(String, String)> {
    let mut vars = vec![
        ("LIVENESS_SESSION", facts.session.clone()),
        ("LIVENESS_UID", facts.uid.to_string()),
        (
            "LIVENESS_REASON",
            json(&facts.reason).trim_matches('"').to_owned(),
        ),
        ("LIVENESS_OWNER_PID", facts.owner.pid.to_string()),
        ("LIVENESS_ENDED_MS", facts.ended_ms.to_string()),
        ("LIVENESS_LABELS", json(&facts.labels)),
        ("LIVENESS_ACTION_INDEX", facts.action.index.to_string()),
    ];
    match facts.exit {
        Some(ExitStatus::Exited { code }) => vars.push(("LIVENESS_EXIT_CODE", code.to_string())),
        Some(ExitStatus::Signaled { signal, .. }) => {
            vars.push(("LIVENESS_EXIT_SIGNAL", signal.to_string()));
        }
        None => {}
    }
    if let Some(detected_by) = facts.detected_by {
        vars.push(("LIVENESS_DETECTED_BY", detected_by.to_string()));
    }
    if let Some(cause) = &facts.cause {
        vars.push(("LIVENESS_CAUSE", json(cause)));
    }
    if let Some(usage) = &facts.usage {
        vars.push(("LIVENESS_USAGE", json(usage)));
    }
    if let Some(survivors) = &facts.survivors {
        vars.push(("LIVENESS_SURVIVORS", survivors.total.to_string()));
    }
    if facts.action.resumed {
        vars.push(("LIVENESS_RESUMED", "1".to_owned()));
    }
    vars.into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
}

/// Compact JSON of a fact that has structure.
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
