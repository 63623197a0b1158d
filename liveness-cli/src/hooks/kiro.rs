//! Kiro CLI 3.x: user hooks are files of their own in `~/.kiro/hooks/*.json`, `{"version":
//! "v1", "hooks": [{"name": "...", "trigger": "SessionStart", "action": {"type":
//! "command", "command": "..."}, "timeout": SECONDS}]}`; the `SessionStart` input has
//! `session_id`, `hook_event_name` and `cwd`. Kiro has no end hook, and a hook that exits
//! non-zero ends its session: liveness writes `liveness.json` there, whose one hook
//! registers the session, which livenessd then tracks to its end (there is no end command
//! of the user's to run). Not tried against a real Kiro here: it is not published on a
//! package registry.

use std::path::PathBuf;

use serde_json::{Value, json};

use liveness_common::action::EndFacts;

use super::command_hooks::{in_home, list, shape};
use super::json::{Json, Object};
use super::{
    Agent, HookCommand, HookEnv, HookError, StartPlan, is_hook_command, tracking_only, with_facts,
};

/// Kiro CLI 3.x.
#[derive(Debug)]
pub struct Kiro;

const NAME: &str = "kiro";
const VERSION: &str = "v1";

fn is_ours(hook: &Value) -> bool {
    hook["action"]["command"]
        .as_str()
        .is_some_and(|line| is_hook_command(line, NAME, "session-start"))
}

/// The file's hooks, checked to be Kiro's shape.
fn hooks(settings: &Object) -> Result<Vec<Value>, HookError> {
    let value = Json::Object(settings.clone()).to_value();
    match &value["version"] {
        Value::Null => {}
        Value::String(v) if v == VERSION => {}
        other => return Err(shape(format!("\"version\" is {other}, not \"{VERSION}\""))),
    }
    match &value["hooks"] {
        Value::Null | Value::Array(_) => Ok(list(&value["hooks"]).to_vec()),
        _ => Err(shape("\"hooks\" is not a list".into())),
    }
}

impl Agent for Kiro {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_end_hook(&self) -> bool {
        false
    }

    fn user_settings(&self, env: &HookEnv) -> Result<PathBuf, HookError> {
        in_home(env, ".kiro/hooks/liveness.json")
    }

    fn add_hooks(&self, settings: &mut Object, command: &HookCommand) -> Result<(), HookError> {
        let mut hooks = hooks(settings)?;
        let ours = json!({
            "name": "liveness-session-start",
            "trigger": "SessionStart",
            "action": {"type": "command", "command": command.shell_line(NAME, "session-start")},
        });
        match hooks.iter().position(is_ours) {
            Some(at) => hooks[at] = ours,
            None => hooks.push(ours),
        }
        settings.insert("version", Json::from_value(&json!(VERSION)));
        settings.insert("hooks", Json::from_value(&Value::Array(hooks)));
        Ok(())
    }

    fn remove_hooks(&self, settings: &mut Object) -> Result<(), HookError> {
        let mut hooks = hooks(settings)?;
        let before = hooks.len();
        hooks.retain(|hook| !is_ours(hook));
        if hooks.len() == before {
            return Ok(());
        }
        if hooks.is_empty() {
            settings.remove("hooks");
            if settings.len() == 1 {
                settings.remove("version");
            }
        } else {
            settings.insert("hooks", Json::from_value(&Value::Array(hooks)));
        }
        Ok(())
    }

    fn session_start(
        &self,
        input: &Value,
        _: &[Value],
        _: &HookEnv,
        _: &HookCommand,
    ) -> Result<StartPlan, HookError> {
        tracking_only(NAME, input, "session_id")
    }

    fn session_end(&self, _: &Value) -> Result<String, HookError> {
        Err(HookError::Input("Kiro has no end hook".into()))
    }

    fn end_input(&self, start: &Value, facts: &EndFacts) -> Value {
        with_facts(start, facts)
    }
}
