//! opencode (1.18.33, `opencode-ai`) runs no command hooks: it loads JavaScript plugins
//! from `~/.config/opencode/plugin/` (`$XDG_CONFIG_HOME/opencode/plugin/`), each module
//! exporting functions that return handlers, one of which, `event`, sees every bus event
//! (`session.created`, `session.idle`, `session.deleted`, ... with the session in
//! `properties.info`). liveness installs a plugin of its own, `liveness.js`, which runs
//! `liveness hooks opencode session-start` when a session is created and `session-end`
//! when one is deleted; the hook's parent, the opencode server process, is the owner.
//! opencode has no end commands of the user's, and no event when it exits: livenessd
//! sees that exit itself.

use std::path::PathBuf;

use serde_json::{Value, json};

use liveness_common::action::EndFacts;

use super::command_hooks::{in_home, shape};
use super::json::Object;
use super::{
    Agent, HookCommand, HookEnv, HookError, PLUGIN_MARK, StartPlan, tracking_only, with_facts,
};

/// opencode.
#[derive(Debug)]
pub struct OpenCode;

const NAME: &str = "opencode";
const SESSION_KEY: &str = "sessionID";

impl Agent for OpenCode {
    fn name(&self) -> &'static str {
        NAME
    }

    fn env(&self) -> &'static [&'static str] {
        &["XDG_CONFIG_HOME"]
    }

    fn has_end_hook(&self) -> bool {
        false
    }

    fn npm(&self) -> Option<(&'static str, &'static str)> {
        Some((NAME, "opencode-ai"))
    }

    fn plugin(&self, command: &HookCommand) -> Option<String> {
        let mut argv = command.argv(NAME, "");
        argv.pop();
        let argv = json!(argv);
        let start = json!(command.start);
        Some(format!(
            r#"{PLUGIN_MARK} (`liveness hooks install opencode`); `liveness hooks uninstall opencode`
// removes it.
// It registers each opencode session with livenessd, owned by this opencode process, and
// ends it when the session is deleted. It never fails opencode: errors go to stderr.
import {{ spawn }} from "node:child_process";

const LIVENESS = {argv};
// What the session-start hook registers with besides (a cgroup and its limits).
const START = {start};

function hook(name, input) {{
  return new Promise((resolve) => {{
    try {{
      const options = name === "session-start" ? START : [];
      const child = spawn(LIVENESS[0], [...LIVENESS.slice(1), name, ...options], {{
        stdio: ["pipe", "ignore", "inherit"],
      }});
      child.on("error", () => resolve());
      child.on("close", () => resolve());
      child.stdin.on("error", () => {{}});
      child.stdin.end(JSON.stringify(input));
    }} catch {{
      resolve();
    }}
  }});
}}

export const LivenessPlugin = async () => ({{
  event: async ({{ event }}) => {{
    const info = event?.properties?.info;
    if (!info?.id) return;
    if (event.type === "session.created") await hook("session-start", {{ {SESSION_KEY}: info.id, info }});
    if (event.type === "session.deleted") await hook("session-end", {{ {SESSION_KEY}: info.id, info }});
  }},
}});
"#
        ))
    }

    fn user_settings(&self, env: &HookEnv) -> Result<PathBuf, HookError> {
        match env.var("XDG_CONFIG_HOME") {
            Some(dir) => Ok(PathBuf::from(dir).join("opencode/plugin/liveness.js")),
            None => in_home(env, ".config/opencode/plugin/liveness.js"),
        }
    }

    fn add_hooks(&self, _: &mut Object, _: &HookCommand) -> Result<(), HookError> {
        Err(shape("opencode takes a plugin, not settings".into()))
    }

    fn remove_hooks(&self, _: &mut Object) -> Result<(), HookError> {
        Err(shape("opencode takes a plugin, not settings".into()))
    }

    fn session_start(
        &self,
        input: &Value,
        _: &[Value],
        _: &HookEnv,
        _: &HookCommand,
    ) -> Result<StartPlan, HookError> {
        tracking_only(NAME, input, SESSION_KEY)
    }

    fn session_end(&self, input: &Value) -> Result<String, HookError> {
        Ok(tracking_only(NAME, input, SESSION_KEY)?.session)
    }

    fn end_input(&self, start: &Value, facts: &EndFacts) -> Value {
        with_facts(start, facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_passes_the_start_options_to_session_start_only() {
        let command = HookCommand {
            program: "/usr/bin/liveness".into(),
            socket: None,
            start: ["--cgroup", "--tasks-max", "64"].map(String::from).to_vec(),
        };
        let plugin = OpenCode.plugin(&command).unwrap();
        assert!(
            plugin.contains(r#"const LIVENESS = ["/usr/bin/liveness","hooks","opencode"];"#),
            "{plugin}"
        );
        assert!(
            plugin.contains(r#"const START = ["--cgroup","--tasks-max","64"];"#),
            "{plugin}"
        );
        assert!(
            plugin.contains(r#"name === "session-start" ? START : []"#),
            "{plugin}"
        );
    }
}
