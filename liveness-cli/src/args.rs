//! The command line: every subcommand, its options and its help, as clap types. What a
//! command does is the `execute` of its arguments' type, in the module named after it;
//! this module imports none of them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use liveness_client::Scope;
use liveness_common::cause::{Cause, CauseKind};
use liveness_common::duration::parse_duration;
use liveness_common::request::{CgroupLimits, parse_bytes};
use liveness_common::session::{OnEnd, OnOom, Until};

use crate::exit::{exit_codes_help, wait_codes_help};

/// Tell session tooling when the process that owns a session dies.
#[derive(Debug, Parser)]
#[command(name = "liveness", version, after_help = exit_codes_help())]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The options every command takes, before or after the subcommand's name.
#[derive(Debug, clap::Args)]
pub(crate) struct GlobalArgs {
    /// The daemon's socket [env: LIVENESS_SOCKET; default: the user's own daemon's socket
    /// if it exists, else /run/liveness/liveness.sock].
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    /// Print JSON instead of text: one document per answer (one line per event for
    /// `watch`), and failures as {"error":{"code","exit","message"}} on stderr.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Capture a process's identity (--pid), or check whether an identity is still alive (--identity).
    ///
    /// An identity is the fingerprint {pid, start_ticks, boot_id, host}: unlike a bare PID
    /// it cannot be confused with a later process that reuses the number.
    #[command(after_help = exit_codes_help())]
    Check(CheckArgs),
    /// Find the process that owns the caller: walk up from PID past shells, `env` and
    /// wrappers to the first real program, and print its identity.
    #[command(after_help = exit_codes_help())]
    ResolveOwner(ResolveOwnerArgs),
    /// Register a session and the process that owns it (or give an active session a new owner).
    Register(RegisterArgs),
    /// Give a pending session its real id.
    Rename(RenameArgs),
    /// Record activity (postpones the inactivity timeout of owners that cannot be watched).
    Touch(TouchArgs),
    /// End a session now (reason `stopped`).
    End(EndArgs),
    /// Show one session.
    Get(GetArgs),
    /// List sessions.
    List(ListArgs),
    /// Which session owns a process (itself or its nearest registered ancestor), or which
    /// ended session left it running?
    Whose(WhoseArgs),
    /// The live processes of a session's tree: its owner (starred) and every process it
    /// started since registration, orphans reparented to init included.
    Processes(ProcessesArgs),
    /// The daemon's state: exit sources, counters, versions.
    Status(StatusArgs),
    /// Follow the event stream.
    ///
    /// With --exec, runs CMD (through sh -c) for each session.ended event, with the event
    /// JSON on stdin and LIVENESS_SEQ, LIVENESS_SESSION, LIVENESS_REASON, LIVENESS_EXIT_CODE,
    /// LIVENESS_SIGNAL, LIVENESS_CAUSE, LIVENESS_DETECTED_BY in its environment. With --cursor, the seq of the
    /// last event handled and the daemon's store id are stored in FILE and a restarted
    /// watcher resumes after it. The cursor is written once CMD has succeeded, so a watcher
    /// killed in between runs CMD for that event again when it restarts: make CMD
    /// idempotent. If the daemon's database was replaced (deleted, restored, recreated), the
    /// watcher is told so and starts over with the new database's first event.
    ///
    /// If the daemon stops or restarts, the watcher reconnects and resumes after the last
    /// event it handled, retrying for up to 30 s (every 0.1 s, doubling to 2 s); then it
    /// gives up with exit code 69.
    Watch(WatchArgs),
    /// Block until a session ends; the exit code tells how (see below).
    ///
    /// If the daemon stops or restarts meanwhile, wait reconnects and goes on waiting,
    /// retrying for up to 30 s (every 0.1 s, doubling to 2 s); then it gives up with 69.
    #[command(after_help = wait_codes_help())]
    Wait(WaitArgs),
    /// Which exit sources the daemon runs and why the others are off (its self-test too),
    /// and, apart, which ones this process could start itself.
    #[command(after_help = DOCTOR_HELP)]
    Doctor(DoctorArgs),
    /// Print the shell completion script for SHELL, e.g.
    /// `liveness completions bash > /etc/bash_completion.d/liveness`.
    Completions(CompletionsArgs),
    /// Write the man pages (liveness.1 and one per subcommand, lock's too) into DIR.
    #[command(hide = true)]
    GenerateMan(GenerateManArgs),
    /// Locks held by sessions: acquire, release, list, and run a command holding one.
    Lock(LockArgs),
    /// The fleet's hosts, online or offline and since when, and their active sessions, as
    /// etcd holds them (a daemon started with --etcd answers; see docs/fleet.md).
    ///
    /// `liveness fleet watch` follows the changes: hosts going online and offline,
    /// sessions written, ended and gone, each with etcd's revision; `--since REV` resumes
    /// after one.
    Fleet(FleetArgs),
    /// Run CMD as the owner of a new session, registered before CMD starts; wait for it,
    /// and exit with its status once the session has ended.
    ///
    /// CMD finds its session's id in LIVENESS_SESSION. SIGINT and SIGTERM sent to liveness
    /// are passed on to CMD.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Agent adapters: make an agent's end hooks run exactly once per session, even when
    /// the agent crashes, is killed or skips them.
    ///
    /// `liveness hooks install claude-code` adds hooks to your Claude Code settings
    /// (keeping every hook you have, with a backup of the file): at SessionStart the
    /// session is registered with your SessionEnd commands as end actions, and at
    /// SessionEnd the daemon is told that Claude Code ran them. So they run once: by
    /// Claude Code when it manages to, by livenessd when it does not (a crash, a SIGKILL,
    /// the OOM killer). `liveness hooks uninstall claude-code` restores the file. Other
    /// agents alike; `liveness hooks status` lists them. The hooks themselves run
    /// `liveness hooks AGENT HOOK`.
    #[command(after_help = HOOKS_HELP)]
    Hooks(HooksArgs),
}

pub(crate) const HOOKS_HELP: &str = "\
Agents: claude-code, codex, gemini, copilot, cursor, kiro (3.x), opencode; Aider has no
hooks: run it under `liveness run` (docs/agents.md). Hooks (run by the agent, not by
hand): session-start and session-end read the agent's hook input on stdin; turn-start,
turn-end, tool-start and tool-end declare the agent's activity on its session (`touch`);
end-hook --input START -- ARGV... is the end action, which runs the user's command with
the agent's own hook input. A hook never fails the agent: it exits 0 and writes what went
wrong to stderr.";

// `hooks`
#[derive(Debug, clap::Args)]
pub(crate) struct HooksArgs {
    #[command(subcommand)]
    pub(crate) command: HooksCommand,
}

/// `liveness hooks ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum HooksCommand {
    /// Add liveness's hooks to the agent's user settings (or FILE). Installing again
    /// changes nothing; the file as it was is kept beside it (`.liveness-backup`).
    Install(HooksInstallArgs),
    /// Take liveness's hooks out again: the original file comes back when it was not
    /// edited since.
    Uninstall(HooksFileArgs),
    /// For each agent: whether liveness's hooks are installed, in which file, and whether
    /// the agent has an end hook of its own.
    Status(HooksStatusArgs),
    /// `AGENT HOOK [--input START] [-- ARGV...]`: a hook, as the agent runs it.
    #[command(external_subcommand)]
    Run(Vec<OsString>),
}

#[derive(Debug, clap::Args)]
pub(crate) struct HooksInstallArgs {
    #[command(flatten)]
    pub(crate) file: HooksFileArgs,
    /// Each agent session registers with a cgroup of its own, with these limits
    /// (docs/cgroups.md): the session-start hook is written with them.
    #[command(flatten)]
    pub(crate) cgroup: CgroupArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct HooksFileArgs {
    /// The agent: claude-code, codex, gemini, copilot, cursor, kiro or opencode.
    pub(crate) agent: String,
    /// The settings file to edit (default: the agent's user settings, e.g.
    /// ~/.claude/settings.json or $CLAUDE_CONFIG_DIR/settings.json).
    #[arg(long, value_name = "FILE")]
    pub(crate) settings: Option<PathBuf>,
    /// Kiro 2.x: the agent whose hooks to edit (~/.kiro/agents/NAME.json); without it,
    /// Kiro 3.x's hooks directory.
    #[arg(long = "agent", value_name = "NAME")]
    pub(crate) kiro_agent: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct HooksStatusArgs {
    /// Kiro 2.x: show the hooks of this agent (~/.kiro/agents/NAME.json) for kiro.
    #[arg(long = "agent", value_name = "NAME")]
    pub(crate) kiro_agent: Option<String>,
}

/// A hook as the agent runs it: `liveness hooks AGENT HOOK ...`.
#[derive(Debug, Parser)]
#[command(name = "liveness hooks", no_binary_name = true)]
pub(crate) struct HookRunArgs {
    pub(crate) agent: String,
    #[arg(value_enum)]
    pub(crate) hook: HookName,
    /// end-hook: the hook input the session started with (JSON).
    #[arg(long, value_name = "JSON")]
    pub(crate) input: Option<String>,
    /// session-start: the session's cgroup, as `install` was given it.
    #[command(flatten)]
    pub(crate) cgroup: CgroupArgs,
    /// end-hook: the user's command.
    #[arg(last = true)]
    pub(crate) argv: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum HookName {
    SessionStart,
    SessionEnd,
    EndHook,
    TurnStart,
    TurnEnd,
    ToolStart,
    ToolEnd,
}

// `check`
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    pub(crate) target: OneOf<CheckTarget>,
}

/// What `check` is about: a running process, or an identity captured earlier.
#[derive(Debug)]
pub(crate) enum CheckTarget {
    Pid(u32),
    Identity(String),
}

/// `check`'s options as clap reads them; exactly one is given.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckOptions {
    /// Capture the identity of this running process.
    #[arg(
        long,
        conflicts_with = "identity",
        required_unless_present = "identity"
    )]
    pid: Option<u32>,
    /// An identity as JSON (as printed by `check --pid --json`) to check for liveness.
    #[arg(long, value_name = "JSON")]
    identity: Option<String>,
}

impl Choice for CheckTarget {
    type Options = CheckOptions;

    fn choose(options: CheckOptions) -> Option<CheckTarget> {
        match options {
            CheckOptions { pid: Some(pid), .. } => Some(CheckTarget::Pid(pid)),
            CheckOptions {
                identity: Some(text),
                ..
            } => Some(CheckTarget::Identity(text)),
            CheckOptions { .. } => None,
        }
    }
}

// `resolve-owner`
#[derive(Debug, clap::Args)]
pub(crate) struct ResolveOwnerArgs {
    /// Start from this process (default: the parent of this command, e.g. the hook's shell).
    #[arg(long)]
    pub(crate) pid: Option<u32>,
    /// A further process name to skip as a wrapper (repeatable).
    #[arg(long = "wrapper", value_name = "COMM")]
    pub(crate) wrappers: Vec<String>,
}

// `register`
#[derive(Debug, clap::Args)]
pub(crate) struct RegisterArgs {
    /// The session id; optional with --pending (the daemon then makes one up).
    #[arg(long, required_unless_present = "pending")]
    pub(crate) session: Option<String>,
    /// Root only: register in this user's namespace (ids are per user; see docs/protocol.md).
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
    /// The real id is not known yet: `rename` the session later, or it expires.
    #[arg(long)]
    pub(crate) pending: bool,
    #[command(flatten)]
    pub(crate) owner: OneOf<OwnerArg>,
    /// A label KEY=VALUE stored with the session and its events (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub(crate) labels: Vec<(String, String)>,
    /// With --owner auto: a further process name to skip as a wrapper, for this
    /// registration only (repeatable), e.g. `--wrapper timeout`.
    #[arg(long = "wrapper", value_name = "COMM", requires = "owner")]
    pub(crate) wrappers: Vec<String>,
    #[command(flatten)]
    pub(crate) until: UntilArgs,
    #[command(flatten)]
    pub(crate) cleanup: CleanupArgs,
    #[command(flatten)]
    pub(crate) end_actions: EndActionArgs,
    #[command(flatten)]
    pub(crate) stall: StallArgs,
    #[command(flatten)]
    pub(crate) cgroup: CgroupArgs,
}

/// The owner named on the command line.
#[derive(Debug)]
pub(crate) enum OwnerArg {
    /// `--owner auto`.
    Auto,
    Pid(u32),
    /// `--owner-identity`, JSON still to be read.
    Identity(String),
}

/// The owner options as clap reads them; exactly one is given.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct OwnerOptions {
    /// `auto`: the first ancestor of this command that is not a shell or wrapper
    /// (for a PID, use --owner-pid).
    #[arg(long, value_name = "auto", value_parser = parse_owner_keyword)]
    owner: Option<AutoOwner>,
    /// This process owns the session. PID is read in this command's PID namespace; where
    /// the kernel allows (Linux 5.3+) the daemon is given a pidfd for it, which names the
    /// process itself rather than a number that could be reused.
    #[arg(long, value_name = "PID")]
    owner_pid: Option<u32>,
    /// An identity captured earlier (`liveness check --pid PID --json`), possibly elsewhere.
    #[arg(long, value_name = "JSON")]
    owner_identity: Option<String>,
}

impl Choice for OwnerArg {
    type Options = OwnerOptions;

    fn choose(options: OwnerOptions) -> Option<OwnerArg> {
        match options {
            OwnerOptions { owner: Some(_), .. } => Some(OwnerArg::Auto),
            OwnerOptions {
                owner_pid: Some(pid),
                ..
            } => Some(OwnerArg::Pid(pid)),
            OwnerOptions {
                owner_identity: Some(text),
                ..
            } => Some(OwnerArg::Identity(text)),
            OwnerOptions { .. } => None,
        }
    }
}

/// `--owner auto`, the one keyword `--owner` takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AutoOwner;

/// Accepts `auto`, and points the usual mistakes at the right option.
fn parse_owner_keyword(text: &str) -> Result<AutoOwner, String> {
    if text == "auto" {
        Ok(AutoOwner)
    } else if text.parse::<u32>().is_ok() {
        Err(format!(
            "--owner takes only `auto`; to name process {text}, use `--owner-pid {text}`"
        ))
    } else if text.trim_start().starts_with('{') {
        Err("--owner takes only `auto`; for an identity JSON, use `--owner-identity JSON`".into())
    } else {
        Err(format!(
            "--owner takes only `auto` (not {text:?}); or use --owner-pid PID or --owner-identity JSON"
        ))
    }
}

/// What happens to a session's surviving processes when it ends.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct CleanupArgs {
    /// What happens to the session's surviving processes when it ends: `terminate`
    /// sends them SIGTERM, then SIGKILL after --grace (default: leave them running).
    #[arg(long, value_enum, value_name = "POLICY")]
    pub(crate) on_end: Option<OnEndArg>,
    /// How long terminated processes have between SIGTERM and SIGKILL, e.g. 1s
    /// (default 10s, at most 1h).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) grace: Option<Duration>,
}

/// Commands run when a session ends.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EndActionArgs {
    /// Run CMD (through `sh -c`, as you, in the current directory) once when the session
    /// ends, however it ends: its owner's exit or crash, `end`, a timeout, a reboot, or a
    /// death the daemon found after a restart. Repeatable. CMD reads the end facts as JSON
    /// on stdin and in LIVENESS_* variables. Make it idempotent: a run cut short by a
    /// crash of the daemon runs again. On an active session, replaces its commands.
    #[arg(long = "on-end-run", value_name = "CMD")]
    pub(crate) on_end_run: Vec<String>,
    /// How long each --on-end-run command may run before its whole process tree is ended
    /// (default 60s, at most 1h).
    #[arg(long, requires = "on_end_run", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) on_end_timeout: Option<Duration>,
}

/// How the session's stalls are judged and what they do (docs/activity.md); what is not
/// given is the daemon's (`livenessd --stall-after` ... `--on-stall`).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct StallArgs {
    /// With a turn in flight, no progress for this long is a stall, e.g. 5m (at least 1s).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) stall_after: Option<Duration>,
    /// Most of a core with no I/O and no new process for this long is `spinning`.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) spin_after: Option<Duration>,
    /// A declared tool in flight is never a stall before this long.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) tool_stall_after: Option<Duration>,
    /// What a stall does besides its `session.stalled` event, once per episode: `notify`
    /// (the event only), `run:CMD` (CMD through `sh -c`, as you, in the current directory,
    /// the judgement as JSON on stdin), `signal:SIG` (to the owner, e.g. signal:INT) or
    /// `terminate` (SIGTERM to the session's tree, SIGKILL after --grace).
    #[arg(long, value_name = "ACTION")]
    pub(crate) on_stall: Option<String>,
}

/// A cgroup of the session's own (docs/cgroups.md).
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct CgroupArgs {
    /// Put the owner and everything it forks from then on in a cgroup of the session's
    /// own, with the limits below. Without usable cgroup2 on the host (`liveness doctor`
    /// says why) the session is registered without one, with a warning.
    #[arg(long)]
    pub(crate) cgroup: bool,
    /// No cgroup for this session, where livenessd gives every session one by default
    /// (its `--session-cgroup`).
    #[arg(long, conflicts_with = "cgroup")]
    pub(crate) no_cgroup: bool,
    /// The session's memory limit (`memory.max`), e.g. 512M or 2G: beyond it the kernel
    /// OOM-kills inside the session only.
    #[arg(long, requires = "cgroup", value_parser = parse_bytes, value_name = "SIZE")]
    pub(crate) memory_max: Option<u64>,
    /// At most this many processes and threads in the session (`pids.max`): forks beyond
    /// fail.
    #[arg(long, requires = "cgroup", value_parser = clap::value_parser!(u64).range(1..), value_name = "N")]
    pub(crate) tasks_max: Option<u64>,
    /// The session's memory throttle (`memory.high`), e.g. 384M: beyond it the kernel
    /// slows the session down and reclaims its memory hard, but kills nothing for it.
    #[arg(long, requires = "cgroup", value_parser = parse_bytes, value_name = "SIZE")]
    pub(crate) memory_high: Option<u64>,
    /// The session's share of contended CPU time (`cpu.weight`), 1 to 10000; every
    /// cgroup has 100 by default.
    #[arg(long, requires = "cgroup", value_parser = clap::value_parser!(u64).range(1..=10_000), value_name = "N")]
    pub(crate) cpu_weight: Option<u64>,
    /// What an OOM kill inside the session does: `continue` (the kernel's victim dies,
    /// the session goes on; the default) or `end` (every process of the session is
    /// killed with it, the owner included, which ends the session).
    #[arg(long, requires = "cgroup", value_name = "POLICY")]
    pub(crate) on_oom: Option<OnOomArg>,
}

impl CgroupArgs {
    /// The options again, as words of a command line (sizes in bytes): what a hook
    /// installed with them is run with. Parsed already, so nothing but numbers and the
    /// policy's name reaches the hook's line.
    pub(crate) fn words(&self) -> Vec<String> {
        if self.no_cgroup {
            return vec!["--no-cgroup".to_owned()];
        }
        if !self.cgroup {
            return Vec::new();
        }
        let mut words = vec!["--cgroup".to_owned()];
        for (key, value) in self.limits().unwrap_or_default().pairs() {
            words.extend([format!("--{key}"), value]);
        }
        words
    }

    /// The request's `cgroup`, if asked for.
    pub(crate) fn limits(&self) -> Option<CgroupLimits> {
        self.cgroup.then_some(CgroupLimits {
            memory_max: self.memory_max,
            tasks_max: self.tasks_max,
            memory_high: self.memory_high,
            cpu_weight: self.cpu_weight,
            on_oom: self.on_oom.map(OnOom::from),
        })
    }
}

/// When a session ends by itself.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct UntilArgs {
    /// `owner`: the session ends when its owner exits (the default). `tree`: when the last
    /// process of its tree exits (the owner and everything it started since registration,
    /// orphans included), for a launcher that forks, execs and exits (`npm start`, `make`,
    /// a wrapper script); the end carries that last process's exit status and reason
    /// `tree_exited`. With `run`, liveness waits for the whole tree and exits with the last
    /// process's status.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub(crate) until: Option<UntilArg>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum UntilArg {
    Owner,
    Tree,
}

impl From<UntilArg> for Until {
    fn from(arg: UntilArg) -> Until {
        match arg {
            UntilArg::Owner => Until::Owner,
            UntilArg::Tree => Until::Tree,
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum OnEndArg {
    Leave,
    Terminate,
}

impl From<OnEndArg> for OnEnd {
    fn from(arg: OnEndArg) -> OnEnd {
        match arg {
            OnEndArg::Leave => OnEnd::Leave,
            OnEndArg::Terminate => OnEnd::Terminate,
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum OnOomArg {
    Continue,
    End,
}

impl From<OnOomArg> for OnOom {
    fn from(arg: OnOomArg) -> OnOom {
        match arg {
            OnOomArg::Continue => OnOom::Continue,
            OnOomArg::End => OnOom::End,
        }
    }
}

// `rename`
#[derive(Debug, clap::Args)]
pub(crate) struct RenameArgs {
    /// The pending session's current id (as `register --pending` printed it).
    #[arg(long)]
    pub(crate) session: String,
    /// Its real id from now on.
    #[arg(long, value_name = "SESSION")]
    pub(crate) to: String,
    /// Root only: the session of this user (ids are per user; see docs/protocol.md).
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
}

// `touch`
#[derive(Debug, clap::Args)]
pub(crate) struct TouchArgs {
    #[command(flatten)]
    pub(crate) session: SessionArgs,
    /// The agent's turn starts (its user sent a prompt) or ends (it answered): a stall is
    /// judged only while a turn is in flight (see docs/activity.md).
    #[arg(long, value_enum)]
    pub(crate) turn: Option<TurnArg>,
    /// A tool starts, by its name: while it runs the session is `tool`, never stalled
    /// before the daemon's --tool-stall-after.
    #[arg(long, value_name = "NAME", conflicts_with = "tool_end")]
    pub(crate) tool: Option<String>,
    /// The tool in flight ended.
    #[arg(long)]
    pub(crate) tool_end: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum TurnArg {
    Start,
    End,
}

// `end`
#[derive(Debug, clap::Args)]
pub(crate) struct EndArgs {
    #[command(flatten)]
    pub(crate) session: SessionArgs,
    /// Also terminate the session's processes that are still running (SIGTERM, then
    /// SIGKILL after the session's grace), whatever its --on-end policy.
    #[arg(long)]
    pub(crate) terminate: bool,
}

// `get`
#[derive(Debug, clap::Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    pub(crate) session: SessionArgs,
}

// `list`
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only sessions in this phase (default: all).
    #[arg(long, value_enum)]
    pub(crate) phase: Option<PhaseArg>,
    #[command(flatten)]
    pub(crate) labels: LabelFilter,
    #[command(flatten)]
    pub(crate) causes: CauseFilter,
    /// Only live sessions in this activity state (see docs/activity.md).
    #[arg(long, value_enum)]
    pub(crate) state: Option<StateArg>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum StateArg {
    /// Progress within the threshold.
    Working,
    /// A declared tool in flight.
    Tool,
    /// No turn in flight: waiting for its user.
    Idle,
    /// A turn in flight, no progress, below the stall threshold.
    Quiet,
    /// A turn in flight and no progress for the stall threshold.
    Stalled,
    /// Burning the CPU with no I/O.
    Spinning,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum PhaseArg {
    /// Sessions whose owner is (believed) alive.
    Active,
    /// Finalized sessions, kept for the retention period.
    Ended,
}

// `whose`
#[derive(Debug, clap::Args)]
pub(crate) struct WhoseArgs {
    /// The process to look up, in this command's PID namespace.
    #[arg(long)]
    pub(crate) pid: u32,
}

// `processes`
#[derive(Debug, clap::Args)]
pub(crate) struct ProcessesArgs {
    #[command(flatten)]
    pub(crate) session: SessionArgs,
}

// `status`
#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {}

// `watch`
#[derive(Debug, clap::Args)]
pub(crate) struct WatchArgs {
    /// Replay events after this seq first (default: only new events).
    #[arg(long, value_name = "SEQ")]
    pub(crate) since: Option<u64>,
    /// Only events of this session.
    #[arg(long)]
    pub(crate) session: Option<String>,
    #[command(flatten)]
    pub(crate) labels: LabelFilter,
    #[command(flatten)]
    pub(crate) causes: CauseFilter,
    /// Root only: only events of this user's sessions.
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
    /// Run this command for each session.ended event.
    #[arg(long, value_name = "CMD")]
    pub(crate) exec: Option<String>,
    /// Cursor file ("SEQ STORE_ID", or a bare SEQ): read at start (it wins over --since),
    /// written after each handled event; a new one is written at once with where the stream
    /// starts, so that a restart handles every end since the first start.
    #[arg(long, value_name = "FILE")]
    pub(crate) cursor: Option<PathBuf>,
}

// `wait`
#[derive(Debug, clap::Args)]
pub(crate) struct WaitArgs {
    #[command(flatten)]
    pub(crate) session: SessionArgs,
    /// Wait until the session is finalized: ended, and each of its end actions has its
    /// outcome (the same as ended for a session without end actions).
    #[arg(long)]
    pub(crate) finalized: bool,
}

// `doctor`
#[derive(Debug, clap::Args)]
pub(crate) struct DoctorArgs {}

pub(crate) const DOCTOR_HELP: &str = "\
The daemon part is the daemon's own view (its status: each source's state and reason, the
eBPF self-test); the client part is what this process, with its own privileges and seccomp
filters, could start. They differ when the two run with different rights.
Exit codes: 0 the daemon answered and has an active source, 69 the daemon cannot be
reached (the client part is still printed) or has no active source, 70 internal error.";

// `completions`
#[derive(Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

// `generate-man`
#[derive(Debug, clap::Args)]
pub(crate) struct GenerateManArgs {
    /// Where to write the pages.
    pub(crate) dir: PathBuf,
}

// `fleet`
#[derive(Debug, clap::Args)]
pub(crate) struct FleetArgs {
    #[command(subcommand)]
    pub(crate) command: Option<FleetCommand>,
    #[command(flatten)]
    pub(crate) labels: LabelFilter,
}

/// `liveness fleet ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum FleetCommand {
    /// Follow the fleet's changes, one line each (JSON lines with --json).
    Watch(FleetWatchArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct FleetWatchArgs {
    /// Only the changes after etcd's revision REV (a view's or an earlier change's),
    /// without the present view first.
    #[arg(long, value_name = "REV")]
    pub(crate) since: Option<i64>,
    #[command(flatten)]
    pub(crate) labels: LabelFilter,
}

// `lock`
#[derive(Debug, clap::Args)]
pub(crate) struct LockArgs {
    #[command(subcommand)]
    pub(crate) command: LockCommand,
}

/// `liveness lock ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LockCommand {
    /// Take lock NAME for a session and print its fencing token.
    ///
    /// The lock is the session's until it is released or the session ends, whatever ends
    /// it: its owner's death, `end`, expiry. Each grant's token is greater than every
    /// earlier one of the lock: pass it to what the lock guards, to refuse older holders.
    #[command(after_help = LOCK_HELP)]
    Acquire(LockAcquireArgs),
    /// Release lock NAME, held by the session.
    Release(LockReleaseArgs),
    /// List the held locks you may see: name, holder session, token, since, waiters.
    List(LockListArgs),
    /// Run CMD as the owner of a new session that holds lock NAME for CMD's lifetime.
    ///
    /// CMD gets the token in LIVENESS_LOCK_TOKEN (and the lock's name in
    /// LIVENESS_LOCK_NAME, its session in LIVENESS_SESSION). The lock is released when CMD
    /// exits, however it exits.
    /// Boxed: it holds all of `run`'s options, the other commands a few.
    #[command(after_help = LOCK_HELP)]
    Run(Box<LockRunArgs>),
}

pub(crate) const LOCK_HELP: &str = "\
Exit codes of lock acquire (and of lock run before CMD starts):
  0   granted: the token is printed
  3   held by another session (without --wait), or still held after --timeout
  64+ as for the other commands (see `liveness --help`)
lock run otherwise exits with CMD's status (128+N when a signal N killed it).";

// `lock acquire`
#[derive(Debug, clap::Args)]
pub(crate) struct LockAcquireArgs {
    /// The lock's name (per user, like session ids).
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) holder: Holder,
    #[command(flatten)]
    pub(crate) wait: LockWait,
    #[command(flatten)]
    pub(crate) scope: LockScope,
}

// `lock release`
#[derive(Debug, clap::Args)]
pub(crate) struct LockReleaseArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) holder: Holder,
    #[command(flatten)]
    pub(crate) scope: LockScope,
}

// `lock list`
#[derive(Debug, clap::Args)]
pub(crate) struct LockListArgs {
    /// Root only: only this user's locks.
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
}

// `lock run`
#[derive(Debug, clap::Args)]
pub(crate) struct LockRunArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) wait: LockWait,
    #[command(flatten)]
    pub(crate) scope: LockScope,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// The session a lock is taken or released for.
#[derive(Debug, clap::Args)]
pub(crate) struct Holder {
    /// The session that holds (or takes) the lock.
    #[arg(long)]
    pub(crate) session: String,
    /// Root only: the session of this user (lock names are per user, like session ids).
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
}

/// Whether the lock is this host's or the fleet's.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct LockScope {
    /// A fleet lock, held in etcd for every host of the fleet (the daemon runs with
    /// --etcd): one name for all users and hosts; its token is etcd's revision. It is
    /// freed a round trip after its session ends here, or after the TTL if this host's
    /// daemon dies.
    #[arg(long)]
    pub(crate) cluster: bool,
}

impl LockScope {
    pub(crate) fn scope(self) -> Scope {
        if self.cluster {
            Scope::Cluster
        } else {
            Scope::Host
        }
    }
}

/// Whether to wait for a held lock, and how long.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct LockWait {
    /// Wait in line for the lock if another session holds it.
    #[arg(long)]
    pub(crate) wait: bool,
    /// With --wait: give up after this long (500ms, 30s, 2m, ...).
    #[arg(long, requires = "wait", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) timeout: Option<Duration>,
}

// `run`, and the command part of `lock run`
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The session id (default: a new `run-<random hex>`). An active session of this id
    /// gets CMD as its new owner.
    #[arg(long)]
    pub(crate) session: Option<String>,
    /// A label KEY=VALUE stored with the session and its events (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub(crate) labels: Vec<(String, String)>,
    #[command(flatten)]
    pub(crate) until: UntilArgs,
    #[command(flatten)]
    pub(crate) cleanup: CleanupArgs,
    #[command(flatten)]
    pub(crate) end_actions: EndActionArgs,
    #[command(flatten)]
    pub(crate) stall: StallArgs,
    #[command(flatten)]
    pub(crate) cgroup: CgroupArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

pub(crate) const RUN_HELP: &str = "\
Exit codes of run:
  CMD's own exit code; 128+N when signal N killed it (with --until tree, those of the
  last process of CMD's tree, said on stderr when CMD's own differ)
  126 CMD cannot be executed      127 CMD was not found
  Before CMD starts, those of every command (see `liveness --help`): for lock run,
  3 (lock_held) when the lock is held (without --wait, or after --timeout).";

/// `--label KEY=VALUE` filters: a session or event matches when it has every label given.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct LabelFilter {
    /// Only sessions with this label (repeatable: all must match), as `docker ps --filter label=`.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub(crate) labels: Vec<(String, String)>,
}

impl LabelFilter {
    /// The labels as a request names them.
    pub(crate) fn to_map(&self) -> BTreeMap<String, String> {
        self.labels.iter().cloned().collect()
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    }
}

/// Ended sessions by why they ended.
#[derive(Debug, clap::Args)]
pub(crate) struct CauseFilter {
    /// Only ended sessions whose cause is of this kind: exit, signal, oom, hangup, unknown
    /// or none (the owner did not die). Repeatable: any may match.
    #[arg(long = "cause", value_name = "KIND", value_parser = parse_cause)]
    pub(crate) kinds: Vec<CauseKind>,
}

impl CauseFilter {
    /// Whether the filter asks for anything.
    pub(crate) fn is_set(&self) -> bool {
        !self.kinds.is_empty()
    }

    /// Whether an ending with this cause passes; without a filter, everything does.
    pub(crate) fn matches(&self, cause: Option<&Cause>) -> bool {
        !self.is_set() || cause.is_some_and(|cause| self.kinds.contains(&cause.kind()))
    }
}

fn parse_cause(text: &str) -> Result<CauseKind, String> {
    text.parse()
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// The session a command is about.
#[derive(Debug, clap::Args)]
pub(crate) struct SessionArgs {
    /// The session's id.
    #[arg(long)]
    pub(crate) session: String,
    /// Root only: the session of this user (ids are per user; see docs/protocol.md).
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
}

/// Options of which exactly one is given (clap checks that), read as the enum they mean:
/// commands get the enum, so none of them has a case for "none of them".
pub(crate) trait Choice: Sized {
    /// The options as clap declares and parses them.
    type Options: clap::Args + clap::FromArgMatches;
    /// The one option given; `None` only if clap let a command line through without one.
    fn choose(options: Self::Options) -> Option<Self>;
}

/// A [`Choice`], flattened into a command's arguments like its options would be.
#[derive(Debug)]
pub(crate) struct OneOf<T>(pub(crate) T);

impl<T: Choice> clap::FromArgMatches for OneOf<T> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<OneOf<T>, clap::Error> {
        let options = T::Options::from_arg_matches(matches)?;
        T::choose(options).map(OneOf).ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::MissingRequiredArgument,
                "one of the options is required",
            )
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = OneOf::from_arg_matches(matches)?;
        Ok(())
    }
}

impl<T: Choice> clap::Args for OneOf<T> {
    fn group_id() -> Option<clap::Id> {
        T::Options::group_id()
    }

    fn augment_args(command: clap::Command) -> clap::Command {
        T::Options::augment_args(command)
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        T::Options::augment_args_for_update(command)
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cgroup_options_are_written_back_as_numbers_for_the_hooks() {
        #[derive(Debug, Parser)]
        struct Options {
            #[command(flatten)]
            cgroup: CgroupArgs,
        }
        let words = |args: &[&str]| {
            let parsed = Options::try_parse_from([&["x"][..], args].concat()).unwrap();
            parsed.cgroup.words()
        };
        assert_eq!(words(&[]), Vec::<String>::new());
        assert_eq!(words(&["--no-cgroup"]), ["--no-cgroup"]);
        assert_eq!(
            words(&[
                "--cgroup",
                "--on-oom",
                "end",
                "--memory-max",
                "1k",
                "--cpu-weight",
                "7"
            ]),
            [
                "--cgroup",
                "--memory-max",
                "1024",
                "--cpu-weight",
                "7",
                "--on-oom",
                "end"
            ]
        );
        assert!(Options::try_parse_from(["x", "--cgroup", "--no-cgroup"]).is_err());
    }

    /// Every option of every subcommand, nested ones too, explains itself in `--help`.
    #[test]
    fn every_flag_has_help_text() {
        fn check(command: &clap::Command, path: &str) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some() || arg.get_long_help().is_some(),
                    "`{path}` option {id:?} has no help text"
                );
            }
            for sub in command.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        let cli = Cli::command();
        cli.clone().debug_assert();
        check(&cli, "liveness");
    }

    #[test]
    fn owner_with_a_number_points_at_owner_pid() {
        let error =
            Cli::try_parse_from(["liveness", "register", "--session", "s", "--owner", "1234"])
                .expect_err("--owner 1234 is refused");
        let text = error.to_string();
        assert!(text.contains("--owner-pid 1234"), "{text}");
    }

    #[test]
    fn the_one_option_given_is_the_one_chosen() {
        let owner = |args: &[&str]| match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Command::Register(register)) => register.owner.0,
            other => panic!("{args:?}: {other:?}"),
        };
        let register = ["liveness", "register", "--session", "s"];
        assert!(matches!(
            owner(&[&register[..], &["--owner", "auto"]].concat()),
            OwnerArg::Auto
        ));
        assert!(matches!(
            owner(&[&register[..], &["--owner-pid", "7"]].concat()),
            OwnerArg::Pid(7)
        ));
        assert!(matches!(
            owner(&[&register[..], &["--owner-identity", "{}"]].concat()),
            OwnerArg::Identity(text) if text == "{}"
        ));
        for refused in [
            &register[..],
            &[&register[..], &["--owner", "auto", "--owner-pid", "7"]].concat(),
            &["liveness", "check"],
            &["liveness", "check", "--pid", "1", "--identity", "{}"],
        ] {
            assert!(Cli::try_parse_from(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn json_and_socket_go_before_or_after_the_subcommand() {
        for args in [
            &["liveness", "--json", "--socket", "/s", "status"][..],
            &["liveness", "status", "--json", "--socket", "/s"][..],
        ] {
            let cli = Cli::try_parse_from(args).expect("parses");
            assert!(cli.global.json, "{args:?}");
            assert_eq!(cli.global.socket, Some(PathBuf::from("/s")), "{args:?}");
        }
    }
}
