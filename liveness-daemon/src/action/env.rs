//! An action's environment: a clean, documented base, what the creator registered, and its
//! facts as `LIVENESS_*` variables. Nothing of the daemon's own environment passes.

use liveness_common::action::{ActionRun, ActionSpec, EndFacts};
use liveness_common::activity::StallFacts;
use liveness_common::exit::ExitStatus;

use super::user::RunAs;

/// What an action is told: the JSON on its stdin, and its `LIVENESS_*` variables. A
/// session's end ([`EndFacts`]) or a stall episode's start ([`StallFacts`]).
pub trait Facts: serde::Serialize + Sync {
    fn session(&self) -> &str;
    /// The user the action runs as.
    fn uid(&self) -> u32;
    /// Which run of which of the session's actions.
    fn run(&self) -> ActionRun;
    /// The facts as variables; the JSON on stdin has them all, these are for shell
    /// one-liners.
    fn variables(&self) -> Vec<(String, String)>;
}

/// `PATH` when the registration sets none: the usual system directories, as cron gives.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The variables of an action, in the order they are set; a later entry of the same name
/// replaces an earlier one.
pub fn environment(spec: &ActionSpec, facts: &impl Facts, user: &RunAs) -> Vec<(String, String)> {
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
    env.extend(facts.variables());
    env
}

impl Facts for EndFacts {
    fn session(&self) -> &str {
        &self.session
    }

    fn uid(&self) -> u32 {
        self.uid
    }

    fn run(&self) -> ActionRun {
        self.action
    }

    fn variables(&self) -> Vec<(String, String)> {
        end_variables(self)
    }
}

impl Facts for StallFacts {
    fn session(&self) -> &str {
        &self.session
    }

    fn uid(&self) -> u32 {
        self.uid
    }

    fn run(&self) -> ActionRun {
        ActionRun::default()
    }

    fn variables(&self) -> Vec<(String, String)> {
        let activity = &self.activity;
        let mut vars = vec![
            ("LIVENESS_SESSION", self.session.clone()),
            ("LIVENESS_UID", self.uid.to_string()),
            ("LIVENESS_OWNER_PID", self.owner.pid.to_string()),
            ("LIVENESS_LABELS", json(&self.labels)),
            (
                "LIVENESS_STATE",
                json(&activity.state).trim_matches('"').to_owned(),
            ),
            ("LIVENESS_SINCE_MS", activity.since_ms.to_string()),
            ("LIVENESS_ACTIVITY", json(activity)),
        ];
        if let Some(reason) = activity.reason {
            vars.push((
                "LIVENESS_STALL_REASON",
                json(&reason).trim_matches('"').to_owned(),
            ));
        }
        vars.into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect()
    }
}

/// The end facts as variables.
fn end_variables(facts: &EndFacts) -> Vec<(String, String)> {
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
