//! Agent adapters: liveness's hooks in a coding agent's settings, so that the end commands a
//! user gave the agent run exactly once per session: by the agent when it manages to, by
//! livenessd (as end actions) when it does not (a crash, SIGKILL, a closed terminal, a
//! mode that skips its end hooks). `docs/end-actions.md` describes the flow.
//!
//! The installed hooks run `liveness hooks AGENT HOOK`:
//! - `session-start`, given the agent's hook input on stdin: registers the session (owner
//!   `auto`: the agent, found by walking up from the hook) with the user's end commands as
//!   end actions ([`Agent::session_start`]);
//! - `session-end`: tells the daemon the agent ran them itself, and ends the session
//!   ([`Agent::session_end`]);
//! - `turn-start`, `turn-end`, `tool-start`, `tool-end`, where the agent has the events:
//!   declares the agent's phase on its session (`touch`), which the daemon judges a stall
//!   by ([`Agent::declaration`]);
//! - `end-hook --input START -- ARGV…`, the end action itself: turns the end facts on its
//!   stdin into the agent's own hook input ([`Agent::end_input`]) and runs the user's
//!   command with it ([`end_hook_command`]).
//!
//! Adding an agent is one file: a type implementing [`Agent`], listed in [`AGENTS`].
//! [`install`] and [`uninstall`] are the same for every agent, and read and write the
//! user's files only through [`files::SettingsDir`] (no link followed, root acting as the
//! user, files replaced whole).

pub mod claude_code;
pub mod codex;
pub mod codex_trust;
pub mod command_hooks;
pub mod copilot;
pub mod cursor;
pub mod files;
pub mod gemini;
pub mod json;
pub mod kiro;
pub mod opencode;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use liveness_common::action::{ActionSpec, EndFacts};
use liveness_common::activity::TurnMark;
use liveness_common::request::Touch;

use self::files::{FileError, SettingsDir};
use self::json::{Json, Object};

/// Every agent liveness has an adapter for.
pub static AGENTS: &[&dyn Agent] = &[
    &claude_code::CLAUDE_CODE,
    &codex::CODEX,
    &gemini::GEMINI,
    &copilot::COPILOT,
    &cursor::CURSOR,
    &kiro::Kiro,
    &opencode::OpenCode,
];

/// The agent called `name` on the command line.
pub fn agent(name: &str) -> Result<&'static dyn Agent, HookError> {
    AGENTS
        .iter()
        .copied()
        .find(|agent| agent.name() == name)
        .ok_or_else(|| HookError::UnknownAgent(name.to_owned()))
}

/// The adapter `liveness hooks install|uninstall|status` acts with: the agent called `name`,
/// or with `kiro_agent`, the hooks of that one Kiro 2.x agent.
pub fn adapter(name: &str, kiro_agent: Option<&str>) -> Result<Adapter, HookError> {
    let shared = agent(name)?;
    match kiro_agent {
        None => Ok(Adapter::Shared(shared)),
        Some(one) if name == kiro::Kiro.name() => {
            Ok(Adapter::KiroAgent(kiro::KiroAgent::new(one)?))
        }
        Some(_) => Err(HookError::Usage(format!(
            "--agent names a Kiro 2.x agent: {name} has none"
        ))),
    }
}

/// An adapter of [`AGENTS`], or one made for the Kiro 2.x agent named on the command line.
#[derive(Debug)]
pub enum Adapter {
    Shared(&'static dyn Agent),
    KiroAgent(kiro::KiroAgent),
}

impl std::ops::Deref for Adapter {
    type Target = dyn Agent;

    fn deref(&self) -> &(dyn Agent + 'static) {
        match self {
            Adapter::Shared(agent) => *agent,
            Adapter::KiroAgent(agent) => agent,
        }
    }
}

/// One agent's hook protocol, as liveness adapts it.
pub trait Agent: Sync + fmt::Debug {
    /// Its name on the command line (`liveness hooks install NAME`).
    fn name(&self) -> &'static str;

    /// The environment variables its hooks read.
    fn env(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether the agent has an end hook of its own, run when it ends a session itself.
    fn has_end_hook(&self) -> bool;

    /// The agent's command and the npm package that installs it, when it is one: how
    /// `hooks status` reads its version cheaply ([`npm_version`]).
    fn npm(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Whether the agent runs its hooks only once the `config.toml` beside them records
    /// their trust (Codex): `install` records it for liveness's, `uninstall` takes it out
    /// ([`codex_trust`]).
    fn trust_in_config(&self) -> bool {
        false
    }

    /// For an agent extended by code rather than settings: the whole file `install`
    /// writes (a plugin of liveness's own), in place of editing a JSON settings file.
    fn plugin(&self, _command: &HookCommand) -> Option<String> {
        None
    }

    /// The settings file `install` edits when none is named.
    fn user_settings(&self, env: &HookEnv) -> Result<PathBuf, HookError>;

    /// Adds liveness's hooks to `settings`, or refreshes them in place; everything else is
    /// kept as it is.
    fn add_hooks(&self, settings: &mut Object, command: &HookCommand) -> Result<(), HookError>;

    /// Removes every hook of liveness's from `settings`, and what only held them.
    fn remove_hooks(&self, settings: &mut Object) -> Result<(), HookError>;

    /// The settings files whose end commands a session started with `input` runs, in the
    /// agent's order (none for an agent without end commands).
    fn settings_files(&self, _input: &Value, _env: &HookEnv) -> Vec<PathBuf> {
        Vec::new()
    }

    /// What the session-start hook registers, from its input and the agent's settings.
    fn session_start(
        &self,
        input: &Value,
        settings: &[Value],
        env: &HookEnv,
        command: &HookCommand,
    ) -> Result<StartPlan, HookError>;

    /// The session whose end commands the agent ran itself (the session-end hook's input).
    fn session_end(&self, input: &Value) -> Result<String, HookError>;

    /// The hook input an end command gets when livenessd runs it: the agent's own schema,
    /// from the fields its session started with (`start`), plus a `liveness` object with
    /// the end facts.
    fn end_input(&self, start: &Value, facts: &EndFacts) -> Value;

    /// The input field to fill with a session id made from the agent process (its pid and
    /// start time), for an agent whose hook input names no session (Kiro 2.x): the hooks
    /// fill it in before [`Agent::session_start`] and [`Agent::declaration`] read it, so
    /// that every hook of one agent process names the same session.
    fn session_from_process(&self, _input: &Value) -> Option<&'static str> {
        None
    }

    /// What an activity hook declares on the agent's session, from its input. The tool
    /// name is the agent's as given: the caller makes it fit the protocol.
    fn declaration(&self, activity: Activity, _input: &Value) -> Result<Touch, HookError> {
        Err(HookError::Input(format!(
            "{} has no {} hook",
            self.name(),
            activity.hook()
        )))
    }
}

/// A phase of the agent's work that its hooks declare on its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// A prompt was sent: a turn is in flight.
    TurnStart,
    /// The agent answered (or gave up): it waits for its user.
    TurnEnd,
    ToolStart,
    ToolEnd,
}

impl Activity {
    /// The hook's name on the command line (`liveness hooks AGENT HOOK`).
    pub fn hook(self) -> &'static str {
        match self {
            Activity::TurnStart => "turn-start",
            Activity::TurnEnd => "turn-end",
            Activity::ToolStart => "tool-start",
            Activity::ToolEnd => "tool-end",
        }
    }

    /// The declaration on `session`; `tool` names the tool a tool-start declares.
    pub fn touch(self, session: String, tool: Option<String>) -> Touch {
        let mut touch = Touch {
            session,
            ..Touch::default()
        };
        match self {
            Activity::TurnStart => touch.turn = Some(TurnMark::Start),
            Activity::TurnEnd => touch.turn = Some(TurnMark::End),
            Activity::ToolStart => touch.tool = tool,
            Activity::ToolEnd => touch.tool_end = true,
        }
        touch
    }
}

/// What the hooks of an agent read from their environment, gathered once (and given
/// explicitly in tests).
#[derive(Debug, Clone, Default)]
pub struct HookEnv {
    pub home: Option<PathBuf>,
    /// Each variable the adapters read, by name.
    pub vars: BTreeMap<String, String>,
}

/// The variables of the agent's environment that the end commands livenessd runs get too
/// (with the agent's own, [`Agent::env`]), so that a command that works under the agent
/// works under livenessd: found on the same `PATH`, with the same `HOME`, able to reach
/// the user's desktop. Only these: a library path or a shell's start-up file would run
/// code the user did not name.
pub const REPLAYED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "DBUS_SESSION_BUS_ADDRESS",
    "DISPLAY",
    "WAYLAND_DISPLAY",
];

/// Most bytes of the agent's environment kept for one end command: an end action is at
/// most [`liveness_common::action::MAX_ACTION_BYTES`], and its command line comes first.
pub const MAX_REPLAYED_BYTES: usize = 8 * 1024;

impl HookEnv {
    /// The process's own environment: the variables `names` and [`REPLAYED_ENV`].
    pub fn from_process(names: &[&str]) -> HookEnv {
        HookEnv {
            home: std::env::var_os("HOME").map(PathBuf::from),
            vars: names
                .iter()
                .chain(REPLAYED_ENV)
                .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
                .collect(),
        }
    }

    /// `NAME=value` for each of [`REPLAYED_ENV`] and `agent`'s variables that is set, in
    /// that order, as long as they fit in [`MAX_REPLAYED_BYTES`]; those left out are noted.
    pub fn replayed(&self, agent: &[&str], notes: &mut Vec<String>) -> Vec<String> {
        let mut left = MAX_REPLAYED_BYTES;
        let mut entries: Vec<String> = Vec::new();
        for name in REPLAYED_ENV.iter().chain(agent) {
            let Some(value) = self.var(name) else {
                continue;
            };
            let entry = format!("{name}={value}");
            if entries.contains(&entry) {
                continue;
            }
            if entry.len() > left {
                notes.push(format!(
                    "{name} is {} bytes long: the end commands livenessd runs do not get it",
                    value.len()
                ));
                continue;
            }
            left -= entry.len();
            entries.push(entry);
        }
        entries
    }

    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// The command line the installed hooks run: this `liveness` binary, the daemon's socket
/// when one was named at install time, and the options the session-start hook registers
/// with (a cgroup and its limits).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookCommand {
    pub program: PathBuf,
    pub socket: Option<PathBuf>,
    /// Options of the daemon's making (`--cgroup --memory-max 2147483648`), after
    /// `session-start` only.
    pub start: Vec<String>,
}

impl HookCommand {
    /// `PROGRAM [--socket PATH] hooks AGENT HOOK [START OPTIONS]`, as an argv.
    pub fn argv(&self, agent: &str, hook: &str) -> Vec<String> {
        let mut argv = vec![self.program.display().to_string()];
        if let Some(socket) = &self.socket {
            argv.extend(["--socket".to_owned(), socket.display().to_string()]);
        }
        argv.extend(["hooks", agent, hook].map(str::to_owned));
        if hook == START_HOOK {
            argv.extend(self.start.iter().cloned());
        }
        argv
    }

    /// The same as one shell command line (agents run hook commands with `sh -c`).
    pub fn shell_line(&self, agent: &str, hook: &str) -> String {
        self.argv(agent, hook)
            .iter()
            .map(|word| shell_quote(word))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The hook that registers the session, the one given [`HookCommand::start`].
const START_HOOK: &str = "session-start";

/// Whether a hook's command line is liveness's `hooks AGENT HOOK` (whatever the path of
/// the binary, the options before `hooks`, and those after it).
pub fn is_hook_command(line: &str, agent: &str, hook: &str) -> bool {
    let words = shell_words(line);
    let named = ["hooks".to_owned(), agent.to_owned(), hook.to_owned()];
    let at = words.windows(3).position(|window| window == named);
    words
        .first()
        .and_then(|program| Path::new(program).file_name())
        .is_some_and(|name| name == "liveness")
        && at.is_some_and(|at| words.get(at + 3).is_none_or(|next| next.starts_with("--")))
}

/// `word` as one shell word: as is when it is plain, else in single quotes.
fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._+-=:,@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The words of a simple command line: quotes and backslashes as `sh` reads them, and
/// nothing else of the shell's (a line with pipes or variables is not one of ours).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => word
                .get_or_insert_with(String::new)
                .extend(chars.by_ref().take_while(|&c| c != '\'')),
            '"' => word
                .get_or_insert_with(String::new)
                .extend(chars.by_ref().take_while(|&c| c != '"')),
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// The label carrying the agent's own session id on every run of that session (a resume
/// or a fork is a run of its own, under an id of its own).
pub const SESSION_LABEL: &str = "agent_session";

/// The agent's own id of the session whose run ended with `facts`: what its end command is
/// given in the agent's session id field.
pub(crate) fn agent_session(facts: &EndFacts) -> &str {
    facts
        .labels
        .get(SESSION_LABEL)
        .map_or(&facts.session, String::as_str)
}

/// What a session-start hook registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartPlan {
    /// The agent's session id.
    pub session: String,
    pub labels: BTreeMap<String, String>,
    /// The user's end commands, as end actions.
    pub actions: Vec<ActionSpec>,
    /// End hooks that were not carried over, and why (for the hook's stderr).
    pub notes: Vec<String>,
}

/// The plan of an agent without end commands of the user's: the session, tracked to its
/// end, with the agent's session id taken from the input's `key`.
pub(crate) fn tracking_only(agent: &str, input: &Value, key: &str) -> Result<StartPlan, HookError> {
    let session = input[key]
        .as_str()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| HookError::Input(format!("no {key} in the hook's JSON on stdin")))?;
    Ok(StartPlan {
        session: session.to_owned(),
        labels: BTreeMap::from([("agent".to_owned(), agent.to_owned())]),
        actions: Vec::new(),
        notes: Vec::new(),
    })
}

/// The input an end command of an agent without an end schema of its own gets: the start
/// input, plus the `liveness` object with the end facts.
pub(crate) fn with_facts(start: &Value, facts: &EndFacts) -> Value {
    let mut input = start.clone();
    input["liveness"] = serde_json::to_value(facts).unwrap_or(Value::Null);
    input
}

/// The version of the npm `package` whose `command` comes first on `path` (a `PATH`
/// value): the `version` of the `package.json` named `package` above the file the command
/// links to. Nothing is run; `None` when the command is not found or not from npm.
pub fn npm_version(command: &str, package: &str, path: &OsStr) -> Option<String> {
    let found = std::env::split_paths(path)
        .map(|dir| dir.join(command))
        .find(|file| file.is_file())?;
    let file = std::fs::canonicalize(found).ok()?;
    file.ancestors().skip(1).find_map(|dir| {
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(dir.join("package.json")).ok()?).ok()?;
        (manifest["name"] == package).then(|| manifest["version"].as_str().map(str::to_owned))?
    })
}

/// Why a hook or an install could not do its work.
#[derive(Debug)]
pub enum HookError {
    UnknownAgent(String),
    NoHome,
    Read {
        path: PathBuf,
        source: io::Error,
    },
    /// Reading or writing the settings file or its directory for `install`/`uninstall`.
    File(FileError),
    /// A settings file that is not what the agent reads (not JSON, not an object, a
    /// `hooks` that is not an object...): it is left as it is.
    Settings {
        path: PathBuf,
        what: String,
    },
    /// The hook input the agent gave is not what its protocol says.
    Input(String),
    /// A command line option that does not fit the agent (`--agent`).
    Usage(String),
}

impl fmt::Display for HookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookError::UnknownAgent(name) => {
                let known: Vec<&str> = AGENTS.iter().map(|agent| agent.name()).collect();
                write!(
                    f,
                    "no adapter for agent {name:?} (known: {})",
                    known.join(", ")
                )
            }
            HookError::NoHome => f.write_str("HOME is not set: name the settings file"),
            HookError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            HookError::File(e) => e.fmt(f),
            HookError::Settings { path, what } => {
                write!(f, "{}: {what}; it was left unchanged", path.display())
            }
            HookError::Input(what) => write!(f, "bad hook input: {what}"),
            HookError::Usage(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for HookError {}

impl From<FileError> for HookError {
    fn from(e: FileError) -> HookError {
        HookError::File(e)
    }
}

/// The file that keeps a settings file as it was before liveness first changed it.
pub fn backup_path(settings: &Path) -> PathBuf {
    settings.with_file_name(backup_name(settings.file_name().unwrap_or_default()))
}

fn backup_name(settings: &OsStr) -> OsString {
    let mut name = settings.to_os_string();
    name.push(".liveness-backup");
    name
}

/// The directory of the settings file `path` and the file's name in it.
fn split(path: &Path) -> Result<(&Path, &OsStr), HookError> {
    let name = path.file_name().ok_or_else(|| HookError::Settings {
        path: path.to_owned(),
        what: "not the path of a file".into(),
    })?;
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty());
    Ok((dir.unwrap_or(Path::new(".")), name))
}

/// What `install` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// The hooks were there already, as they would be written: nothing was touched.
    Unchanged,
    /// The hooks were added (or refreshed); `backup` keeps the file as it was before
    /// liveness first changed it (none when there was no file).
    Changed { backup: Option<PathBuf> },
}

/// Adds `agent`'s hooks to the settings file `path` (created if missing), keeping every
/// other setting and hook. Idempotent: installing again changes no byte. Before the first
/// change, the file is copied to [`backup_path`]. The files are read and written through
/// [`SettingsDir`]: no link is followed, and root acts as the user who owns them.
pub fn install(
    agent: &dyn Agent,
    path: &Path,
    command: &HookCommand,
) -> Result<Installed, HookError> {
    let (dir, name) = split(path)?;
    let dir = SettingsDir::open(dir, true)?.expect("a created directory exists");
    let original = dir.read(name)?;
    if let Some(plugin) = agent.plugin(command) {
        return install_plugin(&dir, path, name, original.as_ref(), &plugin);
    }
    let settings = match &original {
        Some(file) => parse_object(path, &file.bytes)?,
        None => Object::default(),
    };
    let mut edited = settings.clone();
    agent
        .add_hooks(&mut edited, command)
        .map_err(|e| e.at(path))?;
    // Checked before anything is written: a trust that cannot be recorded changes nothing.
    let trust = match agent.trust_in_config() {
        true => Some(trust_edit(&dir, path, agent, &edited)?),
        false => None,
    };
    let hooks_changed = original.is_none() || edited != settings;
    let backup = match &original {
        Some(file) if hooks_changed => {
            // The oldest copy is the user's own: a later install keeps it.
            dir.create_new(&backup_name(name), &file.bytes, file)?;
            Some(backup_path(path))
        }
        _ => None,
    };
    if hooks_changed {
        let bytes = Json::Object(edited).to_pretty();
        dir.replace(name, bytes.as_bytes(), original.as_ref())?;
    }
    let trust_changed = match trust {
        Some(edit) => edit.write(&dir)?,
        None => false,
    };
    Ok(match hooks_changed || trust_changed {
        true => Installed::Changed { backup },
        false => Installed::Unchanged,
    })
}

/// The agent's `config.toml` in the settings directory, and what it becomes: as it is, with
/// liveness's trust block for the hooks of `settings` ([`codex_trust::with_trust`]).
struct TrustEdit {
    config: Option<files::Existing>,
    text: String,
}

fn trust_edit(
    dir: &SettingsDir,
    path: &Path,
    agent: &dyn Agent,
    settings: &Object,
) -> Result<TrustEdit, HookError> {
    let name = OsStr::new(codex_trust::CONFIG);
    let config = dir.read(name)?;
    let current = config_text(dir, name, config.as_ref())?;
    let absolute = std::path::absolute(path).map_err(|source| HookError::Read {
        path: path.to_owned(),
        source,
    })?;
    let entries = codex_trust::entries(&absolute, settings, |line| ours(line, agent.name()));
    let text = codex_trust::with_trust(&current, &entries).map_err(|what| HookError::Settings {
        path: dir.path_of(name),
        what,
    })?;
    Ok(TrustEdit { config, text })
}

impl TrustEdit {
    /// Writes the edited `config.toml`, keeping a copy of the user's own first; whether it
    /// changed.
    fn write(self, dir: &SettingsDir) -> Result<bool, HookError> {
        let name = OsStr::new(codex_trust::CONFIG);
        let before = self.config.as_ref().map(|file| file.bytes.as_slice());
        if before.unwrap_or_default() == self.text.as_bytes() {
            return Ok(false);
        }
        if let Some(file) = &self.config {
            dir.create_new(&backup_name(name), &file.bytes, file)?;
        }
        dir.replace(name, self.text.as_bytes(), self.config.as_ref())?;
        Ok(true)
    }
}

/// The text of `config.toml` (empty when there is none).
fn config_text(
    dir: &SettingsDir,
    name: &OsStr,
    config: Option<&files::Existing>,
) -> Result<String, HookError> {
    let bytes = config.map(|file| file.bytes.clone()).unwrap_or_default();
    String::from_utf8(bytes).map_err(|_| HookError::Settings {
        path: dir.path_of(name),
        what: "not UTF-8".into(),
    })
}

/// Takes liveness's trust block out of the agent's `config.toml`: the file as it was,
/// removed if liveness created it, and its copy removed once the file is that copy again.
fn untrust(dir: &SettingsDir) -> Result<(), HookError> {
    let name = OsStr::new(codex_trust::CONFIG);
    let Some(config) = dir.read(name)? else {
        return Ok(());
    };
    let current = config_text(dir, name, Some(&config))?;
    let text = codex_trust::without_trust(&current);
    if text == current {
        return Ok(());
    }
    let backup = dir.read(&backup_name(name))?;
    match backup {
        None if text.is_empty() => dir.remove(name)?,
        _ => dir.replace(name, text.as_bytes(), Some(&config))?,
    }
    if backup.is_some_and(|copy| copy.bytes == text.as_bytes()) {
        dir.remove(&backup_name(name))?;
    }
    Ok(())
}

/// Whether the agent records liveness's hooks in the file `path` as trusted: `None` for an
/// agent without trust, or when the hooks are not installed.
pub fn trusted(agent: &dyn Agent, path: &Path) -> Result<Option<bool>, HookError> {
    if !agent.trust_in_config() || !installed(agent, path)? {
        return Ok(None);
    }
    let (dir, name) = split(path)?;
    let Some(dir) = SettingsDir::open(dir, false)? else {
        return Ok(None);
    };
    let Some(hooks) = dir.read(name)? else {
        return Ok(None);
    };
    let settings = parse_object(path, &hooks.bytes)?;
    let config_name = OsStr::new(codex_trust::CONFIG);
    let config = dir.read(config_name)?;
    let text = config_text(&dir, config_name, config.as_ref())?;
    let absolute = std::path::absolute(path).map_err(|source| HookError::Read {
        path: path.to_owned(),
        source,
    })?;
    let entries = codex_trust::entries(&absolute, &settings, |line| ours(line, agent.name()));
    Ok(Some(codex_trust::trusted(&text, &entries)))
}

/// Whether a hook's command line is one of liveness's hooks of `agent`.
fn ours(line: &str, agent: &str) -> bool {
    HOOKS.iter().any(|hook| is_hook_command(line, agent, hook))
}

/// Every hook `liveness hooks AGENT HOOK` an agent's settings may name.
const HOOKS: &[&str] = &[
    "session-start",
    "session-end",
    "turn-start",
    "turn-end",
    "tool-start",
    "tool-end",
];

/// Whether liveness's hooks are in the file `path` (read through [`SettingsDir`], as
/// [`install`] reads it).
pub fn installed(agent: &dyn Agent, path: &Path) -> Result<bool, HookError> {
    let (dir, name) = split(path)?;
    let Some(dir) = SettingsDir::open(dir, false)? else {
        return Ok(false);
    };
    let Some(current) = dir.read(name)? else {
        return Ok(false);
    };
    if agent.plugin(&HookCommand::default()).is_some() {
        return Ok(is_our_plugin(&current.bytes));
    }
    let settings = parse_object(path, &current.bytes)?;
    let mut cleaned = settings.clone();
    agent.remove_hooks(&mut cleaned).map_err(|e| e.at(path))?;
    Ok(cleaned != settings)
}

/// What `uninstall` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uninstalled {
    /// No hook of liveness's was there.
    NotInstalled,
    /// The file is again, byte for byte, what it was before the install; the backup is gone.
    Restored,
    /// There was no file before the install, and nothing else is in it: it is gone.
    Removed,
    /// The file was edited since the install: only liveness's hooks were taken out, and the
    /// backup of the original is kept.
    HooksRemoved { backup: Option<PathBuf> },
}

/// Takes `agent`'s hooks out of the settings file `path`: restores the original file when
/// nothing else changed since the install. Through [`SettingsDir`], as [`install`].
pub fn uninstall(agent: &dyn Agent, path: &Path) -> Result<Uninstalled, HookError> {
    let (dir, name) = split(path)?;
    let Some(dir) = SettingsDir::open(dir, false)? else {
        return Ok(Uninstalled::NotInstalled);
    };
    let Some(current) = dir.read(name)? else {
        return Ok(Uninstalled::NotInstalled);
    };
    if agent.plugin(&HookCommand::default()).is_some() {
        if !is_our_plugin(&current.bytes) {
            return Err(not_our_plugin(path));
        }
        dir.remove(name)?;
        return Ok(Uninstalled::Removed);
    }
    let settings = parse_object(path, &current.bytes)?;
    let mut cleaned = settings.clone();
    agent.remove_hooks(&mut cleaned).map_err(|e| e.at(path))?;
    if agent.trust_in_config() {
        untrust(&dir)?;
    }
    if cleaned == settings {
        return Ok(Uninstalled::NotInstalled);
    }
    let backup = backup_name(name);
    match dir.read(&backup)? {
        Some(original) if parse_object(path, &original.bytes).ok().as_ref() == Some(&cleaned) => {
            dir.replace(name, &original.bytes, Some(&current))?;
            dir.remove(&backup)?;
            Ok(Uninstalled::Restored)
        }
        None if cleaned.is_empty() => {
            dir.remove(name)?;
            Ok(Uninstalled::Removed)
        }
        kept => {
            let bytes = Json::Object(cleaned).to_pretty();
            dir.replace(name, bytes.as_bytes(), Some(&current))?;
            Ok(Uninstalled::HooksRemoved {
                backup: kept.map(|_| backup_path(path)),
            })
        }
    }
}

/// The first line of every plugin file liveness writes: how `install` and `uninstall` tell
/// it from a plugin of the user's, which they never touch.
pub const PLUGIN_MARK: &str = "// Written by liveness";

fn is_our_plugin(bytes: &[u8]) -> bool {
    bytes.starts_with(PLUGIN_MARK.as_bytes())
}

fn not_our_plugin(path: &Path) -> HookError {
    HookError::Settings {
        path: path.to_owned(),
        what: "a plugin liveness did not write".into(),
    }
}

/// Writes the plugin file of liveness's own at `name` in `dir`, or refreshes it; a file
/// there that liveness did not write is refused.
fn install_plugin(
    dir: &SettingsDir,
    path: &Path,
    name: &OsStr,
    existing: Option<&files::Existing>,
    plugin: &str,
) -> Result<Installed, HookError> {
    match existing {
        Some(file) if file.bytes == plugin.as_bytes() => Ok(Installed::Unchanged),
        Some(file) if !is_our_plugin(&file.bytes) => Err(not_our_plugin(path)),
        _ => {
            dir.replace(name, plugin.as_bytes(), existing)?;
            Ok(Installed::Changed { backup: None })
        }
    }
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, HookError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HookError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn parse_object(path: &Path, bytes: &[u8]) -> Result<Object, HookError> {
    let what = |what: String| HookError::Settings {
        path: path.to_owned(),
        what,
    };
    match serde_json::from_slice::<Json>(bytes) {
        Ok(Json::Object(object)) => Ok(object),
        Ok(_) => Err(what("not a JSON object".into())),
        Err(e) => Err(what(format!("not valid JSON ({e})"))),
    }
}

/// The settings documents among `paths` that exist, for reading; one that cannot be read
/// or parsed is left out with a note, as an agent would not use it either.
pub fn read_settings(paths: &[PathBuf], notes: &mut Vec<String>) -> Vec<Value> {
    paths
        .iter()
        .filter_map(|path| match read_optional(path) {
            Ok(Some(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(value) => Some(value),
                Err(e) => {
                    notes.push(format!("{}: not valid JSON ({e}); skipped", path.display()));
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                notes.push(format!("{e}; skipped"));
                None
            }
        })
        .collect()
}

impl HookError {
    /// A settings shape error found by an agent, placed at the file it read.
    fn at(self, path: &Path) -> HookError {
        match self {
            HookError::Settings { what, .. } => HookError::Settings {
                path: path.to_owned(),
                what,
            },
            other => other,
        }
    }
}

/// The user's end command `argv`, with `input` (the agent's hook input) as its stdin: the
/// `end-hook` wrapper execs it, so the command's status is the action's. The input is an
/// anonymous file, which the command may read at its pace, or not at all.
pub fn end_hook_command(argv: &[String], input: &[u8]) -> io::Result<Command> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no end command to run"))?;
    let file = rustix::fs::memfd_create(c"liveness-hook-input", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut written = 0;
    while written < input.len() {
        written += rustix::io::write(&file, &input[written..])?;
    }
    rustix::fs::seek(&file, rustix::fs::SeekFrom::Start(0))?;
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::from(file));
    Ok(command)
}

/// The end facts of a session whose owner, `comm`, was SIGKILLed: what the adapters'
/// tests give their end input.
#[cfg(test)]
pub(crate) fn killed(session: &str, comm: &str) -> EndFacts {
    EndFacts {
        session: session.into(),
        uid: 1000,
        labels: Default::default(),
        owner: liveness_common::identity::Identity {
            pid: 4121,
            start_ticks: 9,
            boot_id: "b".into(),
            host: "h".into(),
            pidfs_ino: None,
            comm: comm.into(),
        },
        reason: liveness_common::session::EndReason::OwnerExited,
        exit: Some(liveness_common::exit::ExitStatus::Signaled {
            signal: 9,
            core_dumped: false,
        }),
        detected_by: None,
        ended_ms: 5,
        cause: None,
        usage: None,
        survivors: None,
        action: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_command_lines_quote_what_needs_it_and_are_recognized() {
        let plain = HookCommand {
            program: "/usr/bin/liveness".into(),
            socket: None,
            start: Vec::new(),
        };
        assert_eq!(
            plain.shell_line("claude-code", "session-start"),
            "/usr/bin/liveness hooks claude-code session-start"
        );
        let odd = HookCommand {
            program: "/home/a b/it's/liveness".into(),
            socket: Some("/run/x y.sock".into()),
            start: Vec::new(),
        };
        let line = odd.shell_line("claude-code", "session-end");
        assert_eq!(
            line,
            r#"'/home/a b/it'\''s/liveness' --socket '/run/x y.sock' hooks claude-code session-end"#
        );
        assert_eq!(shell_words(&line), odd.argv("claude-code", "session-end"));
        assert!(is_hook_command(&line, "claude-code", "session-end"));
        assert!(!is_hook_command(&line, "claude-code", "session-start"));
        assert!(!is_hook_command(
            "/usr/bin/other hooks claude-code session-end",
            "claude-code",
            "session-end"
        ));
        assert!(is_hook_command(
            "liveness hooks claude-code session-end",
            "claude-code",
            "session-end"
        ));
        // The cgroup's options follow session-start, and only it.
        let limited = HookCommand {
            start: ["--cgroup", "--memory-max", "2147483648"]
                .map(String::from)
                .to_vec(),
            ..plain
        };
        let start = limited.shell_line("claude-code", "session-start");
        assert_eq!(
            start,
            "/usr/bin/liveness hooks claude-code session-start --cgroup --memory-max 2147483648"
        );
        assert!(is_hook_command(&start, "claude-code", "session-start"));
        let end = limited.shell_line("claude-code", "session-end");
        assert_eq!(end, "/usr/bin/liveness hooks claude-code session-end");
        // A line that goes on with anything but options is not one of ours.
        assert!(!is_hook_command(
            "liveness hooks claude-code session-start; rm -rf ~",
            "claude-code",
            "session-start"
        ));
    }

    #[test]
    fn an_unknown_agent_names_the_known_ones() {
        assert_eq!(agent("claude-code").unwrap().name(), "claude-code");
        let error = agent("nope").unwrap_err().to_string();
        assert!(
            error.contains("\"nope\"") && error.contains("claude-code"),
            "{error}"
        );
    }

    #[test]
    fn settings_that_cannot_be_read_are_noted_and_missing_ones_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.json");
        let bad = dir.path().join("bad.json");
        std::fs::write(&good, r#"{"a": 1}"#).unwrap();
        std::fs::write(&bad, "{").unwrap();
        let mut notes = Vec::new();
        let read = read_settings(&[dir.path().join("missing.json"), bad, good], &mut notes);
        assert_eq!(read, [serde_json::json!({"a": 1})]);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("bad.json: not valid JSON"), "{notes:?}");
    }

    #[test]
    fn the_end_command_reads_the_input_on_stdin() {
        let input = br#"{"session_id":"s"}"#;
        let output = end_hook_command(&["cat".into()], input)
            .unwrap()
            .output()
            .unwrap();
        assert!(output.status.success());
        assert_eq!(output.stdout, input);
        assert!(end_hook_command(&[], input).is_err());
    }
}
