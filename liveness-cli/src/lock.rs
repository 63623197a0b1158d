//! `liveness lock`: take, release and list locks held by sessions, and `lock run`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;

use liveness_client::{Client, ErrorCode};
use liveness_common::duration::parse_duration;
use liveness_common::lock::Lock;

use crate::exit::{Exit, client_error};
use crate::render::print_json;
use crate::run::{RunArgs, run_holding};

pub(crate) const LOCK_HELP: &str = "\
Exit codes of lock acquire (and of lock run before CMD starts):
  0   granted: the token is printed
  3   held by another session (without --wait), or still held after --timeout
  64+ as for the other commands (66: no such session)
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
        name: String,
        #[command(flatten)]
        holder: Holder,
        #[command(flatten)]
        wait: WaitArgs,
        #[arg(long)]
        json: bool,
    },
    /// Release lock NAME, held by the session.
    Release {
        name: String,
        #[command(flatten)]
        holder: Holder,
        #[arg(long)]
        json: bool,
    },
    /// List the held locks you may see: name, holder session, token, since, waiters.
    List {
        /// Root only: only this user's locks.
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Run CMD as the owner of a new session that holds lock NAME for CMD's lifetime.
    ///
    /// CMD gets the token in LIVENESS_LOCK_TOKEN (and the lock's name in
    /// LIVENESS_LOCK_NAME, its session in LIVENESS_SESSION). The lock is released when CMD
    /// exits, however it exits.
    #[command(after_help = LOCK_HELP)]
    Run {
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

pub(crate) fn lock(socket: &Path, command: LockCommand) -> ExitCode {
    let exit = match command {
        LockCommand::Acquire {
            name,
            holder,
            wait,
            json,
        } => {
            let acquired = Client::connect(socket).and_then(|mut client| {
                client.lock_acquire(&name, &holder.session, holder.uid, wait.wait, wait.timeout)
            });
            match acquired {
                Ok(lock) if json => print_lock_json(&lock),
                Ok(lock) => {
                    println!("{}", lock.token);
                    Exit::Ok
                }
                Err(e) => lock_error(&e),
            }
        }
        LockCommand::Release { name, holder, json } => {
            let released = Client::connect(socket)
                .and_then(|mut client| client.lock_release(&name, &holder.session, holder.uid));
            match released {
                Ok(lock) if json => print_lock_json(&lock),
                Ok(lock) => {
                    println!("released {} (token {})", lock.name, lock.token);
                    Exit::Ok
                }
                Err(e) => client_error(&e),
            }
        }
        LockCommand::List { uid, json } => {
            let locks = match Client::connect(socket).and_then(|mut client| client.lock_list(uid)) {
                Ok(locks) => locks,
                Err(e) => return client_error(&e).into(),
            };
            if json {
                print_json(&locks);
            } else {
                for lock in &locks {
                    println!("{}", describe_lock(lock));
                }
            }
            Exit::Ok
        }
        LockCommand::Run { name, wait, run } => return run_holding(socket, &name, wait, run),
    };
    exit.into()
}

fn print_lock_json(lock: &Lock) -> Exit {
    print_json(lock);
    Exit::Ok
}

/// A failed acquire: a held lock has its own exit code, the rest as for every command.
pub(crate) fn lock_error(e: &liveness_client::ClientError) -> Exit {
    if e.code() == Some(ErrorCode::LockHeld) {
        eprintln!("liveness: {e}");
        return Exit::LockHeld;
    }
    client_error(e)
}

/// One line of `lock list`.
fn describe_lock(lock: &Lock) -> String {
    format!(
        "{} held by {} (uid {}) token {} since {} waiters {}",
        lock.name,
        lock.session,
        lock.uid,
        lock.token,
        crate::render::describe_ms(lock.since_ms),
        lock.waiters
    )
}
