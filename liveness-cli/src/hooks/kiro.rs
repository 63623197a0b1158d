//! Kiro CLI. Neither version is tried against a real Kiro here: it is not published on a
//! package registry.
//!
//! 3.x: user hooks are files of their own in `~/.kiro/hooks/*.json`, `{"version": "v1",
//! "hooks": [{"name": "...", "trigger": "SessionStart", "action": {"type": "command",
//! "command": "..."}, "timeout": SECONDS}]}`; the `SessionStart` input has `session_id`,
//! `hook_event_name` and `cwd`. Kiro has no end hook, and a hook that exits non-zero ends
//! its session: liveness writes `liveness.json` there, whose one hook registers the
//! session, which livenessd then tracks to its end (there is no end command of the user's
//! to run).
//!
//! 2.x ([`KiroAgent`]): hooks belong to one agent, in its own file
//! `~/.kiro/agents/NAME.json` (`kiro-cli chat --agent NAME`), as `"hooks": {"<trigger>":
//! [{"command": "...", "timeout_ms": N, "matcher": "..."}]}`, triggers `agentSpawn`,
//! `userPromptSubmit`, `preToolUse`, `postToolUse` and `stop`. The input is `{"hook_event_name",
//! "cwd"}` (and the prompt or the tool): no session id, so the hooks name the session after
//! the agent process ([`Agent::session_from_process`]). `stop` runs at the end of each
//! turn, not of the session: it declares a turn's end; there is no end hook. What
//! `agentSpawn` and `userPromptSubmit` hooks print goes into the agent's context: liveness's
//! print nothing.

use std::path::PathBuf;

use serde_json::{Value, json};

use liveness_common::action::EndFacts;

use liveness_common::request::Touch;

use super::Activity::{self, ToolEnd, ToolStart, TurnEnd, TurnStart};
use super::command_hooks::{ActivityHook, CommandHooks, Layout, in_home, list, shape};
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

    /// Kiro 2.x gives no session id (3.x does, and never runs the activity hooks).
    fn session_from_process(&self, input: &Value) -> Option<&'static str> {
        input.get("session_id").is_none().then_some("session_id")
    }

    fn declaration(&self, activity: Activity, input: &Value) -> Result<Touch, HookError> {
        AGENT_HOOKS.declaration(activity, input)
    }
}

/// The hooks of one Kiro 2.x agent's file. Their command lines name `kiro`, whose hooks
/// ([`Kiro`]) take a 2.x input as well as a 3.x one.
static AGENT_HOOKS: CommandHooks = CommandHooks {
    name: NAME,
    start: "agentSpawn",
    end: None,
    layout: Layout::Flat,
    command: "command",
    typed: false,
    timeout: Some(("timeout_ms", 1)),
    version: None,
    // Kiro reads the triggers into a closed set: a file naming another one is not an agent.
    events: Some(&[
        "agentSpawn",
        "userPromptSubmit",
        "preToolUse",
        "postToolUse",
        "stop",
    ]),
    session_key: "session_id",
    alt_session_key: None,
    activity: &[
        ActivityHook::waited("userPromptSubmit", TurnStart),
        ActivityHook::waited("stop", TurnEnd),
        ActivityHook::waited("preToolUse", ToolStart),
        ActivityHook::waited("postToolUse", ToolEnd),
    ],
    tool_key: "tool_name",
    event_key: Some("hook_event_name"),
    start_fields: &["cwd"],
    reason: "",
    disable_key: None,
    env: &[],
    npm: None,
    trust_in_config: false,
    user_settings: |_| {
        Err(HookError::Usage(
            "a Kiro 2.x agent is named by --agent".into(),
        ))
    },
    settings_files: |_, _, _| Vec::new(),
    action_env: |_, _| Vec::new(),
};

/// Kiro CLI 2.x, one agent's hooks (`liveness hooks install kiro --agent NAME`).
#[derive(Debug, Clone)]
pub struct KiroAgent {
    agent: String,
}

impl KiroAgent {
    /// The agent `name`, which must name a file in the agents directory and nothing else.
    pub fn new(name: &str) -> Result<KiroAgent, HookError> {
        let plain = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
        if name.is_empty() || name.starts_with('.') || !name.chars().all(plain) {
            return Err(HookError::Usage(format!(
                "{name:?} is not a Kiro agent name (letters, digits, '.', '_', '-')"
            )));
        }
        Ok(KiroAgent {
            agent: name.to_owned(),
        })
    }
}

impl Agent for KiroAgent {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_end_hook(&self) -> bool {
        false
    }

    fn user_settings(&self, env: &HookEnv) -> Result<PathBuf, HookError> {
        in_home(env, &format!(".kiro/agents/{}.json", self.agent))
    }

    fn add_hooks(&self, settings: &mut Object, command: &HookCommand) -> Result<(), HookError> {
        // An agent is made in Kiro (`/agent create`): liveness adds to one, never makes one.
        if settings.is_empty() {
            return Err(shape(format!(
                "no Kiro agent {:?} here (create it in Kiro first)",
                self.agent
            )));
        }
        AGENT_HOOKS.add_hooks(settings, command)
    }

    fn remove_hooks(&self, settings: &mut Object) -> Result<(), HookError> {
        AGENT_HOOKS.remove_hooks(settings)
    }

    fn session_start(
        &self,
        input: &Value,
        settings: &[Value],
        env: &HookEnv,
        command: &HookCommand,
    ) -> Result<StartPlan, HookError> {
        Kiro.session_start(input, settings, env, command)
    }

    fn session_end(&self, input: &Value) -> Result<String, HookError> {
        Kiro.session_end(input)
    }

    fn end_input(&self, start: &Value, facts: &EndFacts) -> Value {
        Kiro.end_input(start, facts)
    }

    fn session_from_process(&self, input: &Value) -> Option<&'static str> {
        Kiro.session_from_process(input)
    }

    fn declaration(&self, activity: Activity, input: &Value) -> Result<Touch, HookError> {
        Kiro.declaration(activity, input)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Object {
        match Json::from_value(&value) {
            Json::Object(object) => object,
            _ => unreachable!(),
        }
    }

    fn command() -> HookCommand {
        HookCommand {
            program: "/usr/bin/liveness".into(),
            socket: None,
            start: Vec::new(),
        }
    }

    #[test]
    fn an_agent_s_hooks_are_added_beside_the_user_s_and_taken_out_again() {
        let agent = KiroAgent::new("dev").unwrap();
        let before = object(json!({"name": "dev", "hooks": {
            "agentSpawn": [{"command": "git status"}],
            "stop": [{"command": "notify", "timeout_ms": 500}]
        }}));
        let mut settings = before.clone();
        agent.add_hooks(&mut settings, &command()).unwrap();
        let value = Json::Object(settings.clone()).to_value();
        assert_eq!(
            value["hooks"]["agentSpawn"],
            json!([{"command": "git status"},
                   {"command": "/usr/bin/liveness hooks kiro session-start"}])
        );
        assert_eq!(
            value["hooks"]["stop"][1],
            json!({"command": "/usr/bin/liveness hooks kiro turn-end"})
        );
        let again = settings.clone();
        agent.add_hooks(&mut settings, &command()).unwrap();
        assert_eq!(settings, again, "installing again changes nothing");
        agent.remove_hooks(&mut settings).unwrap();
        assert_eq!(settings, before);
    }

    #[test]
    fn what_is_not_a_kiro_agent_is_refused() {
        let agent = KiroAgent::new("dev").unwrap();
        let refused = |value: Value| {
            let mut settings = object(value);
            agent
                .add_hooks(&mut settings, &command())
                .unwrap_err()
                .to_string()
        };
        assert!(refused(json!({})).contains("no Kiro agent \"dev\""));
        assert!(
            refused(json!({"name": "dev", "hooks": []})).contains("\"hooks\" is not an object")
        );
        assert!(
            refused(json!({"name": "dev", "hooks": {"SessionStart": []}}))
                .contains("\"hooks.SessionStart\" is not an event kiro knows")
        );
        for name in ["", "../x", ".hidden", "a/b", "a b"] {
            assert!(KiroAgent::new(name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn a_2_x_input_is_given_a_session_and_registers_it() {
        let spawn = json!({"hook_event_name": "agentSpawn", "cwd": "/repo"});
        assert_eq!(Kiro.session_from_process(&spawn), Some("session_id"));
        let three = json!({"hook_event_name": "SessionStart", "session_id": "k-1"});
        assert_eq!(Kiro.session_from_process(&three), None);
        let mut filled = spawn;
        filled["session_id"] = json!("kiro~7-9");
        let plan = Kiro
            .session_start(&filled, &[], &HookEnv::default(), &command())
            .unwrap();
        assert_eq!(plan.session, "kiro~7-9");
        assert!(plan.actions.is_empty());
    }
}
