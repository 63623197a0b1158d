//! End actions: commands a session's creator registers to run when the session ends, the
//! facts each run is given, and what became of it.
//!
//! An action is an argv (no shell), an environment added to a clean one, a working
//! directory and a timeout. The daemon runs it as the session's creator with the
//! [`EndFacts`] as JSON on stdin and as `LIVENESS_*` variables, and records an
//! [`ActionOutcome`]. A run cut short by a stop or a crash of the daemon runs again at its
//! next start, marked `resumed`: actions should be idempotent. JSON field names are public
//! protocol (`docs/end-actions.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cause::{Cause, Usage};
use crate::end::{EndReason, Survivors};
use crate::exit::{DetectedBy, ExitStatus};
use crate::identity::Identity;

/// How long an action may run when its registration names no timeout.
pub const DEFAULT_ACTION_TIMEOUT_MS: u64 = 60_000;
/// The longest timeout an action may ask for.
pub const MAX_ACTION_TIMEOUT_MS: u64 = 3_600_000;
/// Most actions on one session.
pub const MAX_ACTIONS: usize = 16;
/// Most bytes of one action's argv, environment and working directory together: an action
/// is a command line, not a payload (the facts reach it on stdin).
pub const MAX_ACTION_BYTES: usize = 16 * 1024;
/// How much of the end of an action's stderr its outcome keeps.
pub const STDERR_TAIL_BYTES: usize = 4096;
/// The prefix of the variables the daemon sets for every action; a registration may not
/// set them itself.
pub const RESERVED_ENV_PREFIX: &str = "LIVENESS_";

/// One end action, as registered (`on_end_run` in the protocol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionSpec {
    /// The program and its arguments, run without a shell; a program without a `/` is
    /// looked up in the action's `PATH`.
    pub argv: Vec<String>,
    /// `NAME=value` entries added to the action's clean environment (after the defaults,
    /// so they may replace `PATH`, say; never a `LIVENESS_` variable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Milliseconds the action may run before its whole process tree is ended
    /// (default [`DEFAULT_ACTION_TIMEOUT_MS`], at most [`MAX_ACTION_TIMEOUT_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Absolute working directory (default: the user's home directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

impl ActionSpec {
    /// An action running `argv` with the defaults.
    pub fn new(argv: impl IntoIterator<Item = impl Into<String>>) -> ActionSpec {
        ActionSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            timeout_ms: None,
            cwd: None,
        }
    }

    /// How long the action may run.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.unwrap_or(DEFAULT_ACTION_TIMEOUT_MS))
    }

    /// The registered environment as (name, value) pairs; entries are validated first.
    pub fn env_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env.iter().filter_map(|entry| entry.split_once('='))
    }

    /// Checks what the kernel and the daemon would refuse later, so that a registration
    /// with a bad action fails at once and changes nothing.
    pub fn validate(&self) -> Result<(), String> {
        let program = self.argv.first().ok_or("argv is empty: name a program")?;
        if program.is_empty() {
            return Err("argv[0] is empty: name a program".into());
        }
        if let Some(arg) = self.argv.iter().find(|arg| arg.contains('\0')) {
            return Err(format!("argument {arg:?} contains a NUL byte"));
        }
        let mut names = BTreeSet::new();
        for entry in &self.env {
            let Some((name, _)) = entry.split_once('=') else {
                return Err(format!("env entry {entry:?} is not NAME=value"));
            };
            if name.is_empty() || entry.contains('\0') {
                return Err(format!("env entry {entry:?} needs a name and no NUL byte"));
            }
            if name.starts_with(RESERVED_ENV_PREFIX) {
                return Err(format!(
                    "env entry {entry:?}: {RESERVED_ENV_PREFIX}* variables are set by the daemon"
                ));
            }
            if !names.insert(name) {
                return Err(format!("env variable {name} is given twice"));
            }
        }
        match self.timeout_ms {
            Some(0) => return Err("timeout_ms is 0: give at least 1".into()),
            Some(ms) if ms > MAX_ACTION_TIMEOUT_MS => {
                return Err(format!(
                    "timeout_ms {ms} is over the limit of {MAX_ACTION_TIMEOUT_MS} (1 h)"
                ));
            }
            _ => {}
        }
        if let Some(cwd) = &self.cwd
            && (!cwd.starts_with('/') || cwd.contains('\0'))
        {
            return Err(format!(
                "cwd {cwd:?} is not an absolute path without NUL bytes"
            ));
        }
        let bytes = self
            .argv
            .iter()
            .chain(&self.env)
            .map(String::len)
            .sum::<usize>()
            + self.cwd.as_ref().map_or(0, String::len);
        if bytes > MAX_ACTION_BYTES {
            return Err(format!(
                "the action is {bytes} bytes long, over the limit of {MAX_ACTION_BYTES}"
            ));
        }
        Ok(())
    }
}

/// Checks a session's list of actions: each one, and how many.
pub fn validate_actions(actions: &[ActionSpec]) -> Result<(), String> {
    if actions.len() > MAX_ACTIONS {
        return Err(format!(
            "{} end actions, over the limit of {MAX_ACTIONS}",
            actions.len()
        ));
    }
    for (index, action) in actions.iter().enumerate() {
        action
            .validate()
            .map_err(|e| format!("end action {index}: {e}"))?;
    }
    Ok(())
}

/// Which run of which action: part of the facts an action is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionRun {
    /// The action's place in the session's list, from 0.
    pub index: u32,
    /// An earlier run was cut short by a stop or a crash of the daemon: this one repeats it.
    /// Always written, false too: an action reads `.action.resumed` as a boolean.
    #[serde(default)]
    pub resumed: bool,
}

/// What an action is told about the end of its session: the JSON on its stdin, and the
/// source of its `LIVENESS_*` variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndFacts {
    pub session: String,
    /// The session's creator: the user the action runs as.
    pub uid: u32,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub owner: Identity,
    pub reason: EndReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected_by: Option<DetectedBy>,
    pub ended_ms: i64,
    /// Why the session ended, from its owner's side (the `cause` of the session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// What the owner and its tree's exited members used (the `usage` of the session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The processes of the session's tree still alive when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survivors: Option<Survivors>,
    pub action: ActionRun,
}

/// What one run of an action did (`session.action` events, and `get`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionOutcome {
    /// The action's place in the session's list, from 0.
    pub index: u32,
    /// When it was started (wall clock, ms since the epoch).
    pub started_ms: i64,
    pub duration_ms: u64,
    /// How its first process ended; absent when it never ran (`error` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitStatus>,
    /// It ran past its timeout, and its process tree was ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Processes of its tree that had to be SIGKILLed after the timeout.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub killed: u32,
    /// The last [`STDERR_TAIL_BYTES`] of its stderr (invalid UTF-8 replaced).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
    /// How many bytes it wrote to stderr in all.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub stderr_bytes: u64,
    /// Why it could not be run (the working directory, the user, the program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its program never ran: its process could not be prepared or set up, the program
    /// could not be executed, or the process neither ran it nor exited within the start
    /// bound (stopped before its exec) and was killed. `error` says which.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed_to_start: bool,
    /// This run repeats one cut short by a stop or a crash of the daemon.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    /// It was not run, and why (`done_by_agent`: the agent ran its end commands itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Skipped>,
}

/// Why an end action was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Skipped {
    /// The client said the session's end commands were run already (`actions_done`).
    DoneByAgent,
}

impl ActionOutcome {
    /// The outcome of action `index`, not run because of `why`.
    pub fn skipped(index: u32, why: Skipped, at_ms: i64) -> ActionOutcome {
        ActionOutcome {
            index,
            started_ms: at_ms,
            skipped: Some(why),
            ..ActionOutcome::default()
        }
    }

    /// It ran, in time, and exited with status 0.
    pub fn succeeded(&self) -> bool {
        !self.timed_out && self.exit == Some(ExitStatus::Exited { code: 0 })
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<ActionSpec, String> {
        let spec: ActionSpec = serde_json::from_str(json).map_err(|e| e.to_string())?;
        spec.validate().map(|()| spec)
    }

    #[test]
    fn a_minimal_action_gets_the_defaults() {
        let action = spec(r#"{"argv": ["true"]}"#).unwrap();
        assert_eq!(action, ActionSpec::new(["true"]));
        assert_eq!(
            action.timeout(),
            Duration::from_millis(DEFAULT_ACTION_TIMEOUT_MS)
        );
        assert_eq!(
            serde_json::to_string(&action).unwrap(),
            r#"{"argv":["true"]}"#
        );
    }

    #[test]
    fn bad_actions_are_refused_with_the_reason() {
        for (json, expected) in [
            (r#"{"argv": []}"#, "argv is empty"),
            (r#"{"argv": [""]}"#, "argv[0] is empty"),
            (r#"{"argv": ["a\u0000b"]}"#, "NUL"),
            (r#"{"argv": ["x"], "env": ["NOEQUALS"]}"#, "not NAME=value"),
            (r#"{"argv": ["x"], "env": ["=v"]}"#, "needs a name"),
            (
                r#"{"argv": ["x"], "env": ["LIVENESS_SESSION=x"]}"#,
                "set by the daemon",
            ),
            (r#"{"argv": ["x"], "env": ["A=1", "A=2"]}"#, "given twice"),
            (r#"{"argv": ["x"], "timeout_ms": 0}"#, "at least 1"),
            (
                r#"{"argv": ["x"], "timeout_ms": 3600001}"#,
                "over the limit",
            ),
            (r#"{"argv": ["x"], "cwd": "relative"}"#, "absolute"),
            (r#"{"argv": ["x"], "shell": true}"#, "unknown field"),
        ] {
            let error = spec(json).unwrap_err();
            assert!(error.contains(expected), "{json}: {error}");
        }
        let long = ActionSpec::new(["x".repeat(MAX_ACTION_BYTES + 1)]);
        assert!(long.validate().unwrap_err().contains("bytes long"));
    }

    #[test]
    fn the_longest_timeout_and_values_with_equals_signs_are_fine() {
        let action = spec(
            r#"{"argv": ["x"], "env": ["A=b=c", "PATH=/bin"], "timeout_ms": 3600000, "cwd": "/"}"#,
        )
        .unwrap();
        assert_eq!(
            action.env_pairs().collect::<Vec<_>>(),
            [("A", "b=c"), ("PATH", "/bin")]
        );
    }

    #[test]
    fn a_session_has_a_bounded_list_of_actions() {
        let actions = vec![ActionSpec::new(["true"]); MAX_ACTIONS];
        assert_eq!(validate_actions(&actions), Ok(()));
        let too_many = vec![ActionSpec::new(["true"]); MAX_ACTIONS + 1];
        assert!(
            validate_actions(&too_many)
                .unwrap_err()
                .contains("over the limit")
        );
        let one_bad = [ActionSpec::new(["true"]), ActionSpec::new([""])];
        assert!(
            validate_actions(&one_bad)
                .unwrap_err()
                .starts_with("end action 1:")
        );
    }

    #[test]
    fn an_outcome_succeeds_only_with_status_zero_in_time() {
        let ok = ActionOutcome {
            exit: Some(ExitStatus::Exited { code: 0 }),
            ..ActionOutcome::default()
        };
        assert!(ok.succeeded());
        assert!(
            !ActionOutcome {
                timed_out: true,
                ..ok.clone()
            }
            .succeeded()
        );
        assert!(!ActionOutcome::default().succeeded(), "it never ran");
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"index":0,"started_ms":0,"duration_ms":0,"exit":{"kind":"exited","code":0}}"#
        );
    }
}
