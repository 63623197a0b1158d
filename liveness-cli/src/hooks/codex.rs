//! Codex's hook protocol, as Codex 0.171.0 (`@openai/codex`) has it: its hooks file
//! `$CODEX_HOME/hooks.json` (`~/.codex/hooks.json`) holds `{"hooks": {"<Event>": [{"matcher":
//! "...", "hooks": [{"type": "command", "command": "...", "timeout": SECONDS}]}]}}`; the
//! hook input has `session_id`, `transcript_path`, `cwd`, `hook_event_name`, `model`,
//! `permission_mode`, and `source` (`startup`, `resume`, `fork`...) at `SessionStart` or
//! `reason` at `SessionEnd`. SessionEnd runs for `codex exec` on its own exit, not on a
//! SIGTERM or a SIGKILL.
//!
//! Codex runs a hook that is not managed only once the user has trusted it (`/hooks`,
//! which records a `trusted_hash` in `config.toml`): `install` records that trust for
//! liveness's hooks itself ([`super::codex_trust`]).

use std::path::PathBuf;

use serde_json::Value;

use super::Activity::{ToolEnd, ToolStart, TurnEnd, TurnStart};
use super::HookEnv;
use super::command_hooks::{ActivityHook, CommandHooks, Layout, in_home};

/// Codex.
pub static CODEX: CommandHooks = CommandHooks {
    name: "codex",
    start: "SessionStart",
    end: Some("SessionEnd"),
    layout: Layout::Grouped,
    command: "command",
    typed: true,
    timeout: Some(("timeout", 1000)),
    version: None,
    events: None,
    session_key: "session_id",
    alt_session_key: None,
    activity: &[
        ActivityHook::waited("UserPromptSubmit", TurnStart),
        ActivityHook::waited("Stop", TurnEnd),
        ActivityHook::waited("PreToolUse", ToolStart),
        ActivityHook::waited("PostToolUse", ToolEnd),
    ],
    tool_key: "tool_name",
    event_key: Some("hook_event_name"),
    start_fields: &[
        "session_id",
        "transcript_path",
        "cwd",
        "model",
        "permission_mode",
    ],
    reason: "other",
    disable_key: None,
    env: &["CODEX_HOME"],
    npm: Some(("codex", "@openai/codex")),
    trust_in_config: true,
    user_settings,
    settings_files: |agent, _, env| (agent.user_settings)(env).into_iter().collect(),
    action_env: |_: &Value, _: &HookEnv| Vec::new(),
};

fn user_settings(env: &HookEnv) -> Result<PathBuf, super::HookError> {
    match env.var("CODEX_HOME") {
        Some(dir) => Ok(PathBuf::from(dir).join("hooks.json")),
        None => in_home(env, ".codex/hooks.json"),
    }
}
