//! The hooks file most agents share: a JSON object whose `hooks` maps an event name to a
//! list of command hooks, each run as `sh -c COMMAND` with the hook input as JSON on stdin.
//! The agents differ in the details, which a [`CommandHooks`] names: hooks in groups under
//! a matcher (Claude Code, Codex, Gemini CLI) or listed directly (Copilot CLI, Cursor), the
//! key of the command (`command`, `bash`) and of its timeout (seconds or milliseconds), a
//! `version` the file must carry, the event names the agent accepts, and the field that
//! holds the session id (`session_id`, `sessionId`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use liveness_common::action::{ActionSpec, EndFacts, MAX_ACTION_TIMEOUT_MS, MAX_ACTIONS};

use super::json::{Json, Object};
use liveness_common::request::Touch;

use super::{Activity, Agent, HookCommand, HookEnv, HookError, StartPlan, is_hook_command};

/// How an agent lists the hooks of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[{matcher?, hooks: [HOOK...]}...]`.
    Grouped,
    /// `[HOOK...]`.
    Flat,
}

/// An event of the agent's that declares its activity.
#[derive(Debug, Clone, Copy)]
pub struct ActivityHook {
    pub event: &'static str,
    pub activity: Activity,
    /// Whether the agent runs it without waiting for it (`"async": true`, Claude Code's),
    /// so that it never holds the agent up.
    pub background: bool,
}

impl ActivityHook {
    /// A hook the agent waits for: liveness's bounds its wait for the daemon.
    pub const fn waited(event: &'static str, activity: Activity) -> ActivityHook {
        ActivityHook {
            event,
            activity,
            background: false,
        }
    }

    /// A hook the agent runs in the background.
    pub const fn background(event: &'static str, activity: Activity) -> ActivityHook {
        ActivityHook {
            event,
            activity,
            background: true,
        }
    }
}

/// One agent's hooks file and hook protocol.
#[derive(Debug)]
pub struct CommandHooks {
    /// The agent's name on the command line.
    pub name: &'static str,
    /// The start event, and the end event when the agent has one.
    pub start: &'static str,
    pub end: Option<&'static str>,
    pub layout: Layout,
    /// The key of a hook's shell command.
    pub command: &'static str,
    /// Whether a hook says `"type": "command"`.
    pub typed: bool,
    /// The key of a hook's timeout, and the milliseconds in one of its units.
    pub timeout: Option<(&'static str, u64)>,
    /// The `version` the file carries, when the agent wants one.
    pub version: Option<u64>,
    /// Every event name the agent accepts, when it rejects a file naming another one.
    pub events: Option<&'static [&'static str]>,
    /// The hook input's session id field.
    pub session_key: &'static str,
    /// The field that holds the session id in the input of an activity event that has no
    /// `session_key` (Cursor's `conversation_id`).
    pub alt_session_key: Option<&'static str>,
    /// The events that declare the agent's turns and tools, where it has them.
    pub activity: &'static [ActivityHook],
    /// The hook input field that names a tool.
    pub tool_key: &'static str,
    /// The hook input field that names the event, when it has one.
    pub event_key: Option<&'static str>,
    /// The hook input fields kept from the session's start for the end commands' input.
    pub start_fields: &'static [&'static str],
    /// The end reason given to the end commands livenessd runs, in the agent's vocabulary.
    pub reason: &'static str,
    /// A setting that turns every hook off.
    pub disable_key: Option<&'static str>,
    /// The environment variables the hooks read.
    pub env: &'static [&'static str],
    /// The agent's command and its npm package, when it is one.
    pub npm: Option<(&'static str, &'static str)>,
    /// The agent runs its hooks only once `config.toml` beside them records their trust
    /// (Codex): `install` records it ([`super::codex_trust`]).
    pub trust_in_config: bool,
    pub user_settings: fn(&HookEnv) -> Result<PathBuf, HookError>,
    /// The files whose end commands the agent runs, in its order.
    pub settings_files: fn(&CommandHooks, &Value, &HookEnv) -> Vec<PathBuf>,
    /// The environment the agent gives its hooks, for the end commands livenessd runs.
    pub action_env: fn(&Value, &HookEnv) -> Vec<String>,
}

impl CommandHooks {
    /// Each event liveness hooks, the hook it runs, and whether in the background.
    fn hooks(&self) -> impl Iterator<Item = (&'static str, &'static str, bool)> {
        std::iter::once((self.start, "session-start", false))
            .chain(self.end.map(|end| (end, "session-end", false)))
            .chain(
                self.activity
                    .iter()
                    .map(|hook| (hook.event, hook.activity.hook(), hook.background)),
            )
    }

    /// The entry liveness lists under an event for `hook`.
    fn entry(&self, command: &HookCommand, hook: &str, background: bool) -> Json {
        let mut handler = serde_json::Map::new();
        if self.typed {
            handler.insert("type".into(), json!("command"));
        }
        handler.insert(
            self.command.into(),
            json!(command.shell_line(self.name, hook)),
        );
        if background {
            handler.insert("async".into(), json!(true));
        }
        let handler = Value::Object(handler);
        Json::from_value(&match self.layout {
            Layout::Grouped => json!({ "hooks": [handler] }),
            Layout::Flat => handler,
        })
    }

    /// The handlers of an entry under an event.
    fn handlers<'a>(&self, entry: &'a Value) -> Vec<&'a Value> {
        match self.layout {
            Layout::Grouped => list(&entry["hooks"]).iter().collect(),
            Layout::Flat => vec![entry],
        }
    }

    /// Whether an entry is the one liveness lists for `hook`.
    fn is_ours(&self, entry: &Json, hook: &str) -> bool {
        let entry = entry.to_value();
        let handlers = self.handlers(&entry);
        !handlers.is_empty()
            && handlers.iter().all(|h| {
                h[self.command]
                    .as_str()
                    .is_some_and(|line| is_hook_command(line, self.name, hook))
            })
    }

    /// A file the agent would reject: a wrong `version`, an event it does not know.
    fn validate(&self, settings: &Object) -> Result<(), HookError> {
        if let Some(version) = self.version {
            let found = settings.get("version").map(Json::to_value);
            if found.as_ref().is_some_and(|v| v != &json!(version)) {
                return Err(shape(format!(
                    "\"version\" is {}, not {version}",
                    found.unwrap_or_default()
                )));
            }
        }
        if let (Some(events), Some(Json::Object(hooks))) = (self.events, settings.get("hooks")) {
            let hooks = Json::Object(hooks.clone()).to_value();
            let keys = hooks.as_object().into_iter().flat_map(|m| m.keys());
            for event in keys {
                if !events.contains(&event.as_str()) {
                    return Err(shape(format!(
                        "\"hooks.{event}\" is not an event {} knows, and one unknown event makes it ignore the whole file",
                        self.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// The user's end commands for the reason liveness reports, as argvs with their
    /// timeouts; what is left out is noted.
    fn end_commands(
        &self,
        settings: &[Value],
        notes: &mut Vec<String>,
    ) -> Vec<(Vec<String>, Option<u64>)> {
        let Some(end) = self.end else {
            return Vec::new();
        };
        if let Some(key) = self.disable_key
            && settings.iter().any(|s| s[key] == true)
        {
            notes.push(format!("{key} is set: no {end} command is registered"));
            return Vec::new();
        }
        let mut commands = Vec::new();
        for entry in settings.iter().flat_map(|s| list(&s["hooks"][end])) {
            if self.layout == Layout::Grouped && !matches_reason(&entry["matcher"], self.reason) {
                notes.push(format!(
                    "{end} hooks with matcher {} are not run by liveness, which ends sessions with reason \"{}\"",
                    entry["matcher"], self.reason
                ));
                continue;
            }
            for hook in self.handlers(entry) {
                match self.user_argv(hook) {
                    Some(argv) => commands.push((argv, self.timeout_ms(hook))),
                    None if self.typed && hook["type"] != "command" => notes.push(format!(
                        "a {end} hook of type {} is not a command: skipped",
                        hook["type"]
                    )),
                    None => {}
                }
            }
        }
        commands
    }

    fn timeout_ms(&self, hook: &Value) -> Option<u64> {
        let (key, unit_ms) = self.timeout?;
        hook[key]
            .as_f64()
            .map(|units| ((units * unit_ms as f64) as u64).clamp(1, MAX_ACTION_TIMEOUT_MS))
    }

    /// The argv of a user's command hook, as the agent would run it; `None` for another
    /// kind of hook and for liveness's own.
    fn user_argv(&self, hook: &Value) -> Option<Vec<String>> {
        if self.typed && hook["type"] != "command" {
            return None;
        }
        let line = hook[self.command].as_str()?;
        if self
            .hooks()
            .any(|(_, ours, _)| is_hook_command(line, self.name, ours))
        {
            return None;
        }
        if let Some(args) = hook["args"].as_array() {
            let args: Option<Vec<String>> =
                args.iter().map(|a| a.as_str().map(str::to_owned)).collect();
            let mut argv = vec![line.to_owned()];
            argv.extend(args?);
            return Some(argv);
        }
        let shell = hook["shell"].as_str().unwrap_or("sh");
        Some(vec![shell.to_owned(), "-c".to_owned(), line.to_owned()])
    }

    fn session_id(&self, input: &Value) -> Result<String, HookError> {
        input[self.session_key]
            .as_str()
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                HookError::Input(format!(
                    "no {} in the hook's JSON on stdin",
                    self.session_key
                ))
            })
    }

    /// The fields of a hook input kept for the end commands, as given.
    fn start_fields(&self, input: &Value) -> Value {
        Value::Object(
            self.start_fields
                .iter()
                .filter_map(|field| Some(((*field).to_owned(), input.get(*field)?.clone())))
                .collect(),
        )
    }
}

impl Agent for CommandHooks {
    fn name(&self) -> &'static str {
        self.name
    }

    fn env(&self) -> &'static [&'static str] {
        self.env
    }

    fn has_end_hook(&self) -> bool {
        self.end.is_some()
    }

    fn npm(&self) -> Option<(&'static str, &'static str)> {
        self.npm
    }

    fn trust_in_config(&self) -> bool {
        self.trust_in_config
    }

    fn user_settings(&self, env: &HookEnv) -> Result<PathBuf, HookError> {
        (self.user_settings)(env)
    }

    fn add_hooks(&self, settings: &mut Object, command: &HookCommand) -> Result<(), HookError> {
        self.validate(settings)?;
        if let Some(version) = self.version
            && settings.get("version").is_none()
        {
            settings.insert("version", Json::from_value(&json!(version)));
        }
        if settings.get("hooks").is_none() {
            settings.insert("hooks", Json::Object(Object::default()));
        }
        let hooks = object(settings.get_mut("hooks"), "hooks")?;
        for (event, hook, background) in self.hooks() {
            if hooks.get(event).is_none() {
                hooks.insert(event, Json::Array(Vec::new()));
            }
            let entries = array(hooks.get_mut(event), event)?;
            let ours = self.entry(command, hook, background);
            match entries.iter().position(|entry| self.is_ours(entry, hook)) {
                Some(at) => entries[at] = ours,
                None => entries.push(ours),
            }
        }
        Ok(())
    }

    fn remove_hooks(&self, settings: &mut Object) -> Result<(), HookError> {
        let Some(hooks) = settings.get_mut("hooks") else {
            return Ok(());
        };
        let hooks = object(Some(hooks), "hooks")?;
        let mut removed = false;
        for (event, hook, _) in self.hooks() {
            let Some(entries) = hooks.get_mut(event) else {
                continue;
            };
            let entries = array(Some(entries), event)?;
            let before = entries.len();
            entries.retain(|entry| !self.is_ours(entry, hook));
            removed |= entries.len() < before;
            // Only a list that liveness's removal emptied goes: the user's own empty one stays.
            if entries.is_empty() && before > 0 {
                hooks.remove(event);
            }
        }
        if removed && hooks.is_empty() {
            settings.remove("hooks");
            // The version liveness added to a file of its own goes with its hooks.
            if let Some(version) = self.version
                && settings.len() == 1
                && settings.get("version").map(Json::to_value) == Some(json!(version))
            {
                settings.remove("version");
            }
        }
        Ok(())
    }

    fn settings_files(&self, input: &Value, env: &HookEnv) -> Vec<PathBuf> {
        (self.settings_files)(self, input, env)
    }

    fn session_start(
        &self,
        input: &Value,
        settings: &[Value],
        env: &HookEnv,
        command: &HookCommand,
    ) -> Result<StartPlan, HookError> {
        let session = self.session_id(input)?;
        let mut notes = Vec::new();
        let start = self.start_fields(input);
        let cwd = input["cwd"].as_str().filter(|cwd| cwd.starts_with('/'));
        // The agent's own variables as it gives them to its hooks, over what it ran with.
        let own = (self.action_env)(input, env);
        let name = |entry: &str| entry.split('=').next().unwrap_or_default().to_owned();
        let mut action_env: Vec<String> = env
            .replayed(self.env, &mut notes)
            .into_iter()
            .filter(|entry| !own.iter().any(|o| name(o) == name(entry)))
            .collect();
        action_env.extend(own);
        let mut actions: Vec<ActionSpec> = Vec::new();
        for (user_argv, timeout_ms) in self.end_commands(settings, &mut notes) {
            let mut argv = command.argv(self.name, "end-hook");
            argv.extend(["--input".to_owned(), start.to_string(), "--".to_owned()]);
            argv.extend(user_argv);
            let action = ActionSpec {
                argv,
                env: action_env.clone(),
                timeout_ms,
                cwd: cwd.map(str::to_owned),
            };
            if actions.contains(&action) {
                continue; // the same command in two files runs once, as in the agents
            }
            match action.validate() {
                Ok(()) if actions.len() < MAX_ACTIONS => actions.push(action),
                Ok(()) => notes.push(format!(
                    "more than {MAX_ACTIONS} end commands: the rest are skipped"
                )),
                Err(e) => notes.push(format!(
                    "an end command cannot be an end action ({e}): skipped"
                )),
            }
        }
        Ok(StartPlan {
            session,
            labels: BTreeMap::from([("agent".to_owned(), self.name.to_owned())]),
            actions,
            notes,
        })
    }

    fn session_end(&self, input: &Value) -> Result<String, HookError> {
        self.session_id(input)
    }

    fn declaration(&self, activity: Activity, input: &Value) -> Result<Touch, HookError> {
        if !self.activity.iter().any(|hook| hook.activity == activity) {
            return Err(HookError::Input(format!(
                "{} has no {} hook",
                self.name,
                activity.hook()
            )));
        }
        let session = match self.alt_session_key {
            Some(key) if input.get(self.session_key).is_none() => input[key]
                .as_str()
                .filter(|id| !id.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| HookError::Input(format!("no {key} in the hook's JSON on stdin")))?,
            _ => self.session_id(input)?,
        };
        // A tool without a name is still a tool in flight.
        let tool = input[self.tool_key]
            .as_str()
            .unwrap_or("unnamed")
            .to_owned();
        Ok(activity.touch(session, Some(tool)))
    }

    fn end_input(&self, start: &Value, facts: &EndFacts) -> Value {
        let mut input = self.start_fields(start);
        input[self.session_key] = json!(super::agent_session(facts));
        if let (Some(key), Some(end)) = (self.event_key, self.end) {
            input[key] = json!(end);
        }
        input["reason"] = json!(self.reason);
        input["liveness"] = serde_json::to_value(facts).unwrap_or(Value::Null);
        input
    }
}

/// Whether a matcher selects `reason`: absent, empty, `*`, `.*`, or alternatives (`a|b`)
/// naming it. Other patterns are not interpreted.
fn matches_reason(matcher: &Value, reason: &str) -> bool {
    match matcher {
        Value::Null => true,
        Value::String(m) => {
            matches!(m.as_str(), "" | "*" | ".*") || m.split('|').any(|alt| alt.trim() == reason)
        }
        _ => false,
    }
}

pub(super) fn list(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn object<'a>(value: Option<&'a mut Json>, name: &str) -> Result<&'a mut Object, HookError> {
    match value {
        Some(Json::Object(object)) => Ok(object),
        _ => Err(shape(format!("\"{name}\" is not an object"))),
    }
}

fn array<'a>(value: Option<&'a mut Json>, name: &str) -> Result<&'a mut Vec<Json>, HookError> {
    match value {
        Some(Json::Array(items)) => Ok(items),
        _ => Err(shape(format!("\"hooks.{name}\" is not a list"))),
    }
}

/// A settings shape error; `install` and `uninstall` name the file.
pub(super) fn shape(what: String) -> HookError {
    HookError::Settings {
        path: PathBuf::new(),
        what,
    }
}

/// `HOME/rest`, or the error that says HOME is missing.
pub(super) fn in_home(env: &HookEnv, rest: &str) -> Result<PathBuf, HookError> {
    Ok(env.home.as_ref().ok_or(HookError::NoHome)?.join(rest))
}

/// The project directory of a hook input: its absolute `cwd`.
pub(super) fn cwd(input: &Value) -> Option<PathBuf> {
    input["cwd"]
        .as_str()
        .filter(|dir| dir.starts_with('/'))
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests;
