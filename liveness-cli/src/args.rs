//! The command line: subcommands, their options and their help.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use liveness_common::duration::parse_duration;
use liveness_common::session::OnEnd;

use crate::doctor::DOCTOR_HELP;
use crate::exit::exit_codes_help;
use crate::lock::LockCommand;
use crate::run::{RUN_HELP, RunArgs};
use crate::wait::WAIT_HELP;
use crate::watch::Watch;

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
    Check {
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
    },
    /// Find the process that owns the caller: walk up from PID past shells, `env` and
    /// wrappers to the first real program, and print its identity.
    #[command(after_help = exit_codes_help())]
    ResolveOwner {
        /// Start from this process (default: the parent of this command, e.g. the hook's shell).
        #[arg(long)]
        pid: Option<u32>,
        /// A further process name to skip as a wrapper (repeatable).
        #[arg(long = "wrapper", value_name = "COMM")]
        wrappers: Vec<String>,
    },
    /// Register a session and the process that owns it (or give an active session a new owner).
    Register {
        /// The session id; optional with --pending (the daemon then makes one up).
        #[arg(long, required_unless_present = "pending")]
        session: Option<String>,
        /// Root only: register in this user's namespace (ids are per user; see docs/protocol.md).
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        /// The real id is not known yet: `rename` the session later, or it expires.
        #[arg(long)]
        pending: bool,
        #[command(flatten)]
        owner: OwnerArgs,
        /// A label KEY=VALUE stored with the session and its events (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// With --owner auto: a further process name to skip as a wrapper, for this
        /// registration only (repeatable), e.g. `--wrapper timeout`.
        #[arg(long = "wrapper", value_name = "COMM", requires = "owner")]
        wrappers: Vec<String>,
        #[command(flatten)]
        cleanup: CleanupArgs,
    },
    /// Give a pending session its real id.
    Rename {
        /// The pending session's current id (as `register --pending` printed it).
        #[arg(long)]
        session: String,
        /// Its real id from now on.
        #[arg(long, value_name = "SESSION")]
        to: String,
        /// Root only: the session of this user (ids are per user; see docs/protocol.md).
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
    },
    /// Record activity (postpones the inactivity timeout of owners that cannot be watched).
    Touch(SessionArgs),
    /// End a session now (reason `stopped`).
    End {
        #[command(flatten)]
        session: SessionArgs,
        /// Also terminate the session's processes that are still running (SIGTERM, then
        /// SIGKILL after the session's grace), whatever its --on-end policy.
        #[arg(long)]
        terminate: bool,
    },
    /// Show one session.
    Get(SessionArgs),
    /// List sessions.
    List {
        /// Only sessions in this phase (default: all).
        #[arg(long, value_enum)]
        phase: Option<PhaseArg>,
        #[command(flatten)]
        labels: LabelFilter,
    },
    /// Which active session owns a process (itself or its nearest registered ancestor)?
    Whose {
        /// The process to look up, in this command's PID namespace.
        #[arg(long)]
        pid: u32,
    },
    /// The live processes of a session's tree: its owner (starred) and every process it
    /// started since registration, orphans reparented to init included.
    Processes(SessionArgs),
    /// The daemon's state: exit sources, counters, versions.
    Status,
    /// Follow the event stream.
    ///
    /// With --exec, runs CMD (through sh -c) for each session.ended event, with the event
    /// JSON on stdin and LIVENESS_SEQ, LIVENESS_SESSION, LIVENESS_REASON, LIVENESS_EXIT_CODE,
    /// LIVENESS_SIGNAL, LIVENESS_DETECTED_BY in its environment. With --cursor, the seq of the
    /// last event handled and the daemon's store id are stored in FILE and a restarted
    /// watcher resumes after it. The cursor is written once CMD has succeeded, so a watcher
    /// killed in between runs CMD for that event again when it restarts: make CMD
    /// idempotent. If the daemon's database was replaced (deleted, restored, recreated), the
    /// watcher is told so and starts over with the new database's first event.
    ///
    /// If the daemon stops or restarts, the watcher reconnects and resumes after the last
    /// event it handled, retrying for up to 30 s (every 0.1 s, doubling to 2 s); then it
    /// gives up with exit code 69.
    Watch(Watch),
    /// Block until a session ends; the exit code tells how (see below).
    ///
    /// If the daemon stops or restarts meanwhile, wait reconnects and goes on waiting,
    /// retrying for up to 30 s (every 0.1 s, doubling to 2 s); then it gives up with 69.
    #[command(after_help = WAIT_HELP)]
    Wait(SessionArgs),
    /// Which exit sources the daemon runs and why the others are off (its self-test too),
    /// and, apart, which ones this process could start itself.
    #[command(after_help = DOCTOR_HELP)]
    Doctor,
    /// Print the shell completion script for SHELL, e.g.
    /// `liveness completions bash > /etc/bash_completion.d/liveness`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (liveness.1 and one per subcommand) into DIR.
    #[command(hide = true)]
    GenerateMan {
        /// Where to write the pages.
        dir: PathBuf,
    },
    /// Locks held by sessions: acquire, release, list, and run a command holding one.
    Lock {
        #[command(subcommand)]
        command: LockCommand,
    },
    /// Run CMD as the owner of a new session, registered before CMD starts; wait for it,
    /// and exit with its status once the session has ended.
    ///
    /// CMD finds its session's id in LIVENESS_SESSION. SIGINT and SIGTERM sent to liveness
    /// are passed on to CMD.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct OwnerArgs {
    /// `auto`: the first ancestor of this command that is not a shell or wrapper
    /// (for a PID, use --owner-pid).
    #[arg(long, value_name = "auto", value_parser = parse_owner_keyword)]
    pub(crate) owner: Option<AutoOwner>,
    /// This process owns the session. PID is read in this command's PID namespace; where
    /// the kernel allows (Linux 5.3+) the daemon is given a pidfd for it, which names the
    /// process itself rather than a number that could be reused.
    #[arg(long, value_name = "PID")]
    pub(crate) owner_pid: Option<u32>,
    /// An identity captured earlier (`liveness check --pid PID --json`), possibly elsewhere.
    #[arg(long, value_name = "JSON")]
    pub(crate) owner_identity: Option<String>,
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
pub(crate) enum PhaseArg {
    /// Sessions whose owner is (believed) alive.
    Active,
    /// Finalized sessions, kept for the retention period.
    Ended,
}

/// `--label KEY=VALUE` filters: a session or event matches when it has every label given.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct LabelFilter {
    /// Only sessions with this label (repeatable: all must match), as `docker ps --filter label=`.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub(crate) labels: Vec<(String, String)>,
}

impl LabelFilter {
    pub(crate) fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    }
}

pub(crate) fn parse_label(text: &str) -> Result<(String, String), String> {
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

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
