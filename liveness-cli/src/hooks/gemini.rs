//! Gemini CLI's hook protocol, as Gemini CLI 0.61.0 (`@google/gemini-cli`) has it: hooks in
//! `~/.gemini/settings.json` (and a project's `.gemini/settings.json`, the system's
//! `/etc/gemini-cli/settings.json`) as `"hooks": {"<Event>": [{"matcher": "...", "hooks":
//! [{"type": "command", "command": "...", "timeout": MILLISECONDS}]}]}`, each run with
//! `sh -c` in the session's `cwd`, with `GEMINI_PROJECT_DIR`, `GEMINI_CWD`,
//! `GEMINI_SESSION_ID` and `CLAUDE_PROJECT_DIR` set. The input has `session_id`,
//! `transcript_path`, `cwd`, `hook_event_name`, `timestamp`, and `source` (`startup`,
//! `resume`, `clear`) or `reason` (`exit`, `clear`, `logout`, `prompt_input_exit`,
//! `other`). A hook's stdout is read as JSON: liveness's hooks print nothing there.
//! SessionEnd may fire twice for one session; the second is a no-op.

use std::path::PathBuf;

use serde_json::Value;

use super::Activity::{ToolEnd, ToolStart, TurnEnd, TurnStart};
use super::HookEnv;
use super::command_hooks::{ActivityHook, CommandHooks, Layout, cwd, in_home};

/// Gemini CLI.
pub static GEMINI: CommandHooks = CommandHooks {
    name: "gemini",
    start: "SessionStart",
    end: Some("SessionEnd"),
    layout: Layout::Grouped,
    command: "command",
    typed: true,
    timeout: Some(("timeout", 1)),
    version: None,
    events: None,
    session_key: "session_id",
    alt_session_key: None,
    activity: &[
        ActivityHook::waited("BeforeAgent", TurnStart),
        ActivityHook::waited("AfterAgent", TurnEnd),
        ActivityHook::waited("BeforeTool", ToolStart),
        ActivityHook::waited("AfterTool", ToolEnd),
    ],
    tool_key: "tool_name",
    event_key: Some("hook_event_name"),
    start_fields: &["session_id", "transcript_path", "cwd"],
    reason: "other",
    disable_key: None,
    env: &[],
    npm: Some(("gemini", "@google/gemini-cli")),
    trust_in_config: false,
    user_settings: |env| in_home(env, ".gemini/settings.json"),
    settings_files,
    action_env,
};

fn settings_files(agent: &CommandHooks, input: &Value, env: &HookEnv) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (agent.user_settings)(env).into_iter().collect();
    files.extend(cwd(input).map(|project| project.join(".gemini/settings.json")));
    files.push(PathBuf::from("/etc/gemini-cli/settings.json"));
    files
}

fn action_env(input: &Value, _: &HookEnv) -> Vec<String> {
    let mut env = Vec::new();
    if let Some(dir) = cwd(input) {
        for name in ["GEMINI_PROJECT_DIR", "GEMINI_CWD", "CLAUDE_PROJECT_DIR"] {
            env.push(format!("{name}={}", dir.display()));
        }
    }
    if let Some(id) = input["session_id"].as_str() {
        env.push(format!("GEMINI_SESSION_ID={id}"));
    }
    env
}
