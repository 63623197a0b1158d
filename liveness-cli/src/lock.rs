//! `liveness lock`: take, release and list locks held by sessions, and `lock run`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;

use liveness_client::Client;
use liveness_common::duration::parse_duration;

use crate::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};
use crate::render::print_lock_table;
use crate::run::{RunArgs, run_holding};

pub(crate) const LOCK_HELP: &str = "\
Exit codes of lock acquire (and of lock run before CMD starts):
  0   granted: the token is printed
  3   held by another session (without --wait), or still held after --timeout
  64+ as for the other commands (see `liveness --help`)
lock run otherwise exits with CMD's status (128+N when a signal N killed it).";

/// `liveness lock ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum LockCommand {
    /// Take lock NAME for a session and print its fencing token.
    ///
    /// The lock is the session's until it is released or the session ends, whatever ends
    /// it: its owner's death, `end`, expiry. Each grant's token is greater than every
    /// earlier one of the lock: pass it to what the lock guards, to refuse older holders.
    #[command(after_help = LOCK_HELP)]
    Acquire {
        /// The lock's name (per user, like session ids).
        name: String,
        #[command(flatten)]
        holder: Holder,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Release lock NAME, held by the session.
    Release {
        /// The lock's name.
        name: String,
        #[command(flatten)]
        holder: Holder,
    },
    /// List the held locks you may see: name, holder session, token, since, waiters.
    List {
        /// Root only: only this user's locks.
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
    },
    /// Run CMD as the owner of a new session that holds lock NAME for CMD's lifetime.
    ///
    /// CMD gets the token in LIVENESS_LOCK_TOKEN (and the lock's name in
    /// LIVENESS_LOCK_NAME, its session in LIVENESS_SESSION). The lock is released when CMD
    /// exits, however it exits.
    #[command(after_help = LOCK_HELP)]
    Run {
        /// The lock's name.
        name: String,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        run: RunArgs,
    },
}

/// The session a lock is taken or released for.
#[derive(Debug, clap::Args)]
pub(crate) struct Holder {
    /// The session that holds (or takes) the lock.
    #[arg(long)]
    session: String,
    /// Root only: the session of this user (lock names are per user, like session ids).
    #[arg(long, value_name = "UID")]
    uid: Option<u32>,
}

/// Whether to wait for a held lock, and how long.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct WaitArgs {
    /// Wait in line for the lock if another session holds it.
    #[arg(long)]
    pub(crate) wait: bool,
    /// With --wait: give up after this long (500ms, 30s, 2m, ...).
    #[arg(long, requires = "wait", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) timeout: Option<Duration>,
}

pub(crate) fn lock(context: &Context, command: LockCommand) -> Result<ExitCode, Failure> {
    let socket = context.socket.as_path();
    match command {
        LockCommand::Acquire { name, holder, wait } => {
            let lock = Client::connect(socket).and_then(|mut client| {
                client.lock_acquire(&name, &holder.session, holder.uid, wait.wait, wait.timeout)
            })?;
            if context.json {
                output::json(&lock);
            } else {
                outln!("{}", lock.token);
            }
        }
        LockCommand::Release { name, holder } => {
            let lock = Client::connect(socket)
                .and_then(|mut client| client.lock_release(&name, &holder.session, holder.uid))?;
            if context.json {
                output::json(&lock);
            } else {
                outln!("released {} (token {})", lock.name, lock.token);
            }
        }
        LockCommand::List { uid } => {
            let locks = Client::connect(socket).and_then(|mut client| client.lock_list(uid))?;
            if context.json {
                output::json(&locks);
            } else {
                print_lock_table(&locks);
            }
        }
        LockCommand::Run { name, wait, run } => return run_holding(context, &name, wait, run),
    }
    Ok(Exit::Ok.into())
}
