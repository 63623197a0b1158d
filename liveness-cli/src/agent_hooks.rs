//! `liveness hooks`: installing an agent adapter ([`liveness_cli::hooks`]), and its hooks as
//! the agent runs them. A hook never fails the agent: it exits 0 whatever happens, says
//! what went wrong on stderr, and writes nothing on stdout (an agent may read a hook's
//! stdout as instructions).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};

use liveness_cli::hooks::{
    self, AGENTS, Activity, Agent, HookCommand, HookEnv, Installed, Uninstalled, end_hook_command,
    read_settings,
};
use liveness_client::{Client, ClientError, Owner, Registration};
use liveness_common::action::EndFacts;
use liveness_common::activity::MAX_TOOL_NAME;

use crate::agent_runs::{self, ThisAgent};
use crate::args::{
    CgroupArgs, HookName, HookRunArgs, HooksArgs, HooksCommand, HooksFileArgs, HooksInstallArgs,
};
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};

impl HooksArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        match &self.command {
            HooksCommand::Install(args) => args.install(context),
            HooksCommand::Uninstall(args) => args.uninstall(context),
            HooksCommand::Status(args) => status(args.kiro_agent.as_deref(), context),
            HooksCommand::Run(words) => {
                let args = HookRunArgs::try_parse_from(words).map_err(|e| {
                    Failure::new(Exit::Usage, e.render().to_string().trim().to_owned())
                })?;
                args.execute(context)
            }
        }
    }
}

fn agent(name: &str) -> Result<&'static dyn Agent, Failure> {
    hooks::agent(name).map_err(|e| Failure::new(Exit::Usage, e.to_string()))
}

fn hook_failure(e: hooks::HookError) -> Failure {
    let exit = match e {
        hooks::HookError::Usage(_) | hooks::HookError::UnknownAgent(_) => Exit::Usage,
        _ => Exit::IoErr,
    };
    Failure::new(exit, e.to_string())
}

/// This binary, and the socket named on its command line: what the hooks run. The binary
/// is named by the path the shell finds it at when that is this very file, so that hooks
/// installed from `/usr/local/bin/liveness` keep naming it, not the file it links to.
fn hook_command(context: &Context, start: Vec<String>) -> Result<HookCommand, Failure> {
    let program = std::env::current_exe().map_err(|e| {
        Failure::new(
            Exit::IoErr,
            format!("cannot tell where this liveness binary is: {e}"),
        )
    })?;
    Ok(HookCommand {
        program: on_path(&program).unwrap_or(program),
        socket: context.named_socket.clone(),
        start,
    })
}

/// The first `liveness` on `PATH`, when it is the file `exe`.
fn on_path(exe: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata(exe).ok()?;
    let first = std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("liveness"))
        .find(|file| file.is_absolute() && file.is_file())?;
    let found = std::fs::metadata(&first).ok()?;
    (found.dev() == me.dev() && found.ino() == me.ino()).then_some(first)
}

impl HooksFileArgs {
    fn settings(&self, agent: &dyn Agent) -> Result<PathBuf, Failure> {
        match &self.settings {
            Some(path) => Ok(path.clone()),
            None => agent
                .user_settings(&HookEnv::from_process(agent.env()))
                .map_err(hook_failure),
        }
    }

    fn adapter(&self) -> Result<hooks::Adapter, Failure> {
        hooks::adapter(&self.agent, self.kiro_agent.as_deref()).map_err(hook_failure)
    }
}

impl HooksInstallArgs {
    fn install(&self, context: &Context) -> Result<ExitCode, Failure> {
        let agent = self.file.adapter()?;
        let path = self.file.settings(&*agent)?;
        let command = hook_command(context, self.cgroup.words())?;
        let (result, backup, text) =
            match hooks::install(&*agent, &path, &command).map_err(hook_failure)? {
                Installed::Unchanged => (
                    "unchanged",
                    None,
                    "liveness's hooks are installed already".to_owned(),
                ),
                Installed::Changed {
                    backup: Some(backup),
                } => {
                    let text = format!(
                        "liveness's hooks installed; the file as it was is kept in {}",
                        backup.display()
                    );
                    ("installed", Some(backup), text)
                }
                Installed::Changed { backup: None } => {
                    ("created", None, "created with liveness's hooks".to_owned())
                }
            };
        report(context, &path, result, backup, &text);
        Ok(Exit::Ok.into())
    }
}

impl HooksFileArgs {
    fn uninstall(&self, context: &Context) -> Result<ExitCode, Failure> {
        let agent = self.adapter()?;
        let path = self.settings(&*agent)?;
        let (result, backup, text) = match hooks::uninstall(&*agent, &path).map_err(hook_failure)? {
            Uninstalled::NotInstalled => {
                ("not_installed", None, "no hook of liveness's".to_owned())
            }
            Uninstalled::Restored => ("restored", None, "restored as it was".to_owned()),
            Uninstalled::Removed => (
                "removed",
                None,
                "removed (liveness had created it)".to_owned(),
            ),
            Uninstalled::HooksRemoved { backup } => {
                let text = format!(
                    "liveness's hooks removed; it was edited since the install, so the rest stays{}",
                    backup
                        .as_ref()
                        .map(|b| format!(" (the original is in {})", b.display()))
                        .unwrap_or_default()
                );
                ("hooks_removed", backup, text)
            }
        };
        report(context, &path, result, backup, &text);
        Ok(Exit::Ok.into())
    }
}

/// What `install` or `uninstall` did to the settings file.
fn report(context: &Context, path: &Path, result: &str, backup: Option<PathBuf>, text: &str) {
    if context.json {
        output::json(&json!({"settings": path, "result": result, "backup": backup}));
    } else {
        outln!("{}: {text}", path.display());
    }
}

impl HookRunArgs {
    fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let agent = agent(&self.agent)?;
        let outcome = match self.hook {
            HookName::SessionStart => session_start(agent, &self.cgroup, context),
            HookName::SessionEnd => session_end(agent, context),
            HookName::TurnStart => declare(agent, Activity::TurnStart, context),
            HookName::TurnEnd => declare(agent, Activity::TurnEnd, context),
            HookName::ToolStart => declare(agent, Activity::ToolStart, context),
            HookName::ToolEnd => declare(agent, Activity::ToolEnd, context),
            // Replaces this process with the user's command on success.
            HookName::EndHook => return self.end_hook(agent),
        };
        if let Err(message) = outcome {
            eprintln!("liveness hooks {} {:?}: {message}", self.agent, self.hook);
        }
        Ok(Exit::Ok.into())
    }

    /// The end action: the end facts on stdin become the agent's own hook input, with
    /// which the user's command is run in this process's place.
    fn end_hook(&self, agent: &dyn Agent) -> Result<ExitCode, Failure> {
        let start: Value = match &self.input {
            Some(input) => serde_json::from_str(input)
                .map_err(|e| Failure::new(Exit::DataErr, format!("--input is not JSON: {e}")))?,
            None => Value::Object(Default::default()),
        };
        let facts: EndFacts = serde_json::from_value(read_stdin()?)
            .map_err(|e| Failure::new(Exit::DataErr, format!("stdin holds no end facts: {e}")))?;
        let input = agent.end_input(&start, &facts).to_string();
        let mut command = end_hook_command(&self.argv, input.as_bytes())
            .map_err(|e| Failure::new(Exit::Usage, format!("cannot run the end command: {e}")))?;
        let error = command.exec();
        Err(Failure::new(
            Exit::Unavailable,
            format!("cannot run {:?}: {error}", self.argv),
        ))
    }
}

/// The agent's hook input on stdin, with the session id made from the agent process where
/// the agent gives none ([`Agent::session_from_process`]).
fn hook_input(agent: &dyn Agent, this: &ThisAgent) -> Result<Value, String> {
    let mut input = read_stdin().map_err(|f| f.message)?;
    if let Some(key) = agent.session_from_process(&input) {
        let id = this
            .process_session(agent.name())
            .ok_or("the agent process was not found: no session to name after it")?;
        input[key] = json!(id);
    }
    Ok(input)
}

fn read_stdin() -> Result<Value, Failure> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::new(Exit::IoErr, format!("cannot read stdin: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Failure::new(Exit::DataErr, format!("stdin is not JSON: {e}")))
}

/// Registers the agent's run of its session, owned by the agent, with the user's end
/// commands as its end actions: under the agent's session id for its first run, under a
/// run id of its own for a resume of an ended run or a fork of a live one
/// ([`agent_runs`]).
fn session_start(agent: &dyn Agent, cgroup: &CgroupArgs, context: &Context) -> Result<(), String> {
    let this = ThisAgent::find();
    let input = hook_input(agent, &this)?;
    let env = HookEnv::from_process(agent.env());
    let mut notes = Vec::new();
    let settings = read_settings(&agent.settings_files(&input, &env), &mut notes);
    let command = hook_command(context, cgroup.words()).map_err(|f| f.message)?;
    let mut plan = agent
        .session_start(&input, &settings, &env, &command)
        .map_err(|e| e.to_string())?;
    for note in plan.notes.iter().chain(&notes) {
        eprintln!("liveness hooks {}: {note}", agent.name());
    }
    plan.labels
        .insert(hooks::SESSION_LABEL.to_owned(), plan.session.clone());
    let mut registration = Registration {
        labels: plan.labels,
        on_end_run: Some(plan.actions),
        cgroup: cgroup.limits(),
        ..Registration::new(plan.session.clone(), Owner::Auto)
    };
    let mut client = connect(context)?;
    let at = agent_runs::start_at(&mut client, &this, &plan.session)
        .map_err(|e| daemon_error(e, UNTRACKED))?;
    registration.session = Some(at.id(&plan.session).to_owned());
    let registered = match client.register_with_warnings(&registration) {
        Ok(registered) => registered,
        Err(e) => {
            // The agent's session id is an ended run's: this is a resume of it.
            registration.session = Some(
                at.after_ended(&e)
                    .ok_or_else(|| daemon_error(e, UNTRACKED))?,
            );
            client
                .register_with_warnings(&registration)
                .map_err(|e| daemon_error(e, UNTRACKED))?
        }
    };
    // Asked for a cgroup, what succeeded but looks wrong (none on this host) is said on
    // stderr, never stdout.
    for warning in registered.warnings.iter().filter(|_| cgroup.cgroup) {
        eprintln!("liveness hooks {}: {warning}", agent.name());
    }
    Ok(())
}

/// A failed connection or request, saying so plainly when the daemon took longer than
/// the budget.
fn daemon_error(e: ClientError, so: &str) -> String {
    let late = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    match e {
        ClientError::Io(e) | ClientError::Connect { source: e, .. } if late(&e) => format!(
            "livenessd did not answer in time ({} ms for its first answer, {} ms for each after): {so}",
            DAEMON_BUDGET.as_millis(),
            ANSWERED_BUDGET.as_millis()
        ),
        e => e.to_string(),
    }
}

/// What a session hook's failure leaves.
const UNTRACKED: &str = "the agent goes on untracked";

/// How long a hook waits for the daemon's first answer, its connection and first request
/// together, so that a down or frozen daemon never holds up the agent's start, exit,
/// prompts or tools for longer: with the hook's own start it stays within 200 ms.
/// Registration resolves the owner from the hook's ancestry, so the hook must outlive the
/// request: a budget shorter than a loaded daemon's commit would lose sessions (`cargo
/// xtask bench --part hooks` measures both).
const DAEMON_BUDGET: Duration = Duration::from_millis(150);

/// Once the daemon has answered, how long each later request of the hook may take: a
/// sequence cut short halfway could leave a session registered but not known as the
/// agent's, or an end command that the agent ran to be run again by the daemon.
const ANSWERED_BUDGET: Duration = Duration::from_secs(1);

/// A connection to the daemon that gives up [`DAEMON_BUDGET`] after it was begun unless the
/// daemon answers by then; after an answer, each request has [`ANSWERED_BUDGET`].
fn connect(context: &Context) -> Result<Client, String> {
    Client::connect_until(&context.socket, Instant::now() + DAEMON_BUDGET)
        .map(|client| client.once_answered(ANSWERED_BUDGET))
        .map_err(|e| daemon_error(e, UNTRACKED))
}

/// What an activity hook's failure leaves.
const LOST: &str = "the declaration is lost";

/// Declares the agent's turn or tool on its run of its session: which run (a `get`, and a
/// `list` for a later run), then the declaration (see [`connect`] for how long each may
/// take): the agent may wait for the hook at every prompt and tool call, and a lost
/// declaration costs little (the next one, or the daemon's own sampling, makes up for it).
fn declare(agent: &dyn Agent, activity: Activity, context: &Context) -> Result<(), String> {
    let this = ThisAgent::find();
    let input = hook_input(agent, &this)?;
    let mut touch = agent
        .declaration(activity, &input)
        .map_err(|e| e.to_string())?;
    touch.tool = touch.tool.as_deref().map(tool_name);
    let mut client = connect(context)?;
    touch.session = agent_runs::ours(&mut client, &this, &touch.session)
        .map_err(|e| daemon_error(e, LOST))?
        .ok_or_else(|| no_run(&touch.session))?;
    client.declare(&touch).map_err(|e| daemon_error(e, LOST))?;
    Ok(())
}

/// A tool name as the protocol takes it (shown to people): control characters escaped,
/// cut to [`MAX_TOOL_NAME`] bytes at a character's end, never empty.
fn tool_name(name: &str) -> String {
    let escaped = crate::escape::for_terminal(name);
    let mut end = escaped.len().min(MAX_TOOL_NAME);
    while !escaped.is_char_boundary(end) {
        end -= 1;
    }
    match &escaped[..end] {
        "" => "unnamed".to_owned(),
        cut => cut.to_owned(),
    }
}

/// The agent runs its end commands itself: the daemon is told so, then its run ends. The
/// runs of the session that other agent processes own (the run a fork came from, a fork
/// of this one) are left to end there.
fn session_end(agent: &dyn Agent, context: &Context) -> Result<(), String> {
    let input = read_stdin().map_err(|f| f.message)?;
    let session = agent.session_end(&input).map_err(|e| e.to_string())?;
    let mut client = connect(context)?;
    let run = our_run(&mut client, &session)?;
    client
        .actions_done(&run, None)
        .map_err(|e| daemon_error(e, UNTRACKED))?;
    client
        .end(&run, None)
        .map_err(|e| daemon_error(e, UNTRACKED))?;
    Ok(())
}

/// The live run of `session` that the agent this hook runs under owns.
fn our_run(client: &mut Client, session: &str) -> Result<String, String> {
    agent_runs::ours(client, &ThisAgent::find(), session)
        .map_err(|e| daemon_error(e, UNTRACKED))?
        .ok_or_else(|| no_run(session))
}

fn no_run(session: &str) -> String {
    format!("no live run of session {session:?} is this agent's: nothing is done")
}

/// Per agent: whether liveness's hooks are in its user settings (and, for Codex, whether
/// their trust is recorded: installed hooks Codex does not trust are "not trusted"), which
/// file, the version
/// of the agent found on PATH when npm installed it, and whether it has an end hook of its
/// own (without one, livenessd runs nothing the agent
/// would have: it tracks the session to its end).
fn status(kiro_agent: Option<&str>, context: &Context) -> Result<ExitCode, Failure> {
    // With --agent, Kiro's row is that Kiro 2.x agent's.
    let kiro = kiro_agent
        .map(|name| hooks::adapter("kiro", Some(name)))
        .transpose()
        .map_err(hook_failure)?;
    let rows: Vec<Value> = AGENTS
        .iter()
        .map(|shared| {
            let agent: &dyn Agent = match &kiro {
                Some(kiro) if kiro.name() == shared.name() => &**kiro,
                _ => *shared,
            };
            let env = HookEnv::from_process(agent.env());
            let (file, installed, trusted) = match agent.user_settings(&env) {
                Ok(path) => {
                    let installed = hooks::installed(agent, &path);
                    let trusted = hooks::trusted(agent, &path).ok().flatten();
                    (Some(path), installed, trusted)
                }
                Err(e) => (None, Err(e), None),
            };
            let (installed, error) = match installed {
                Ok(installed) => (Some(installed), None),
                Err(e) => (None, Some(e.to_string())),
            };
            let path = std::env::var_os("PATH").unwrap_or_default();
            let version = agent
                .npm()
                .and_then(|(command, package)| hooks::npm_version(command, package, &path));
            json!({
                "agent": agent.name(),
                "file": file,
                "installed": installed,
                "trusted": trusted,
                "error": error,
                "version": version,
                "end_hook": agent.has_end_hook(),
            })
        })
        .collect();
    if context.json {
        output::json(&json!({ "agents": rows }));
        return Ok(Exit::Ok.into());
    }
    for row in &rows {
        let state = match (&row["installed"], &row["error"]) {
            (Value::Bool(true), _) if row["trusted"] == false => "not trusted".to_owned(),
            (Value::Bool(true), _) => "installed".to_owned(),
            (Value::Bool(false), _) => "not installed".to_owned(),
            (_, error) => format!("unknown ({})", error.as_str().unwrap_or_default()),
        };
        let end = if row["end_hook"] == true {
            "has an end hook"
        } else {
            "no end hook: tracked to its exit"
        };
        outln!(
            "{:<12} {:<10} {state:<14} {end:<32} {}",
            row["agent"].as_str().unwrap_or_default(),
            row["version"].as_str().unwrap_or("-"),
            row["file"].as_str().unwrap_or("-"),
        );
    }
    Ok(Exit::Ok.into())
}
