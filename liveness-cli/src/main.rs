//! `liveness`: the command-line client of livenessd, built on `liveness-client`.
//!
//! Exit codes are part of the interface (documented in `--help` and README):
//! 0 alive / success, 1 dead, 2 unknown, and the sysexits(3) range for failures.

mod args;
mod doctor;
mod exit;
mod lock;
mod render;
mod run;
mod wait;
mod watch;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use liveness_client::{Client, Owner, Registration};
use liveness_common::identity::Identity;
use liveness_common::protocol::{Reply, Request};
use liveness_common::session::Phase;
use liveness_proc::identity::{Liveness, ProcRoot};

use crate::args::{Cli, Command, OwnerArgs, PhaseArg, SessionArgs};
use crate::doctor::doctor;
use crate::exit::{Exit, client_error, identity_error};
use crate::render::{
    describe_session, print_identity, print_json, print_liveness, print_session, print_status,
};
use crate::wait::wait;
use crate::watch::watch;

/// Parses the command line and runs the command.
fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Help and version requests are successes; clap's own code for errors is 2,
            // which here means "unknown", so map usage errors to EX_USAGE.
            return if e.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Ok.into()
            };
        }
    };
    run(cli)
}

fn run(cli: Cli) -> ExitCode {
    let socket = &cli.socket.unwrap_or_else(liveness_client::default_socket);
    match cli.command {
        Command::Wait(SessionArgs { session, uid, json }) => wait(socket, &session, uid, json),
        Command::Lock { command } => lock::lock(socket, command),
        Command::Run(args) => run::run(socket, args),
        command => run_command(command, socket).into(),
    }
}

fn run_command(command: Command, socket: &Path) -> Exit {
    let proc = ProcRoot::default();
    match command {
        Command::Check {
            pid: Some(pid),
            json,
            ..
        } => match proc.capture(pid) {
            Ok(identity) => {
                print_identity(&identity, json);
                Exit::Ok
            }
            Err(e) => identity_error(&e),
        },
        Command::Check {
            identity: Some(text),
            json,
            ..
        } => {
            let identity: Identity = match serde_json::from_str(&text) {
                Ok(identity) => identity,
                Err(e) => {
                    eprintln!("liveness: invalid identity JSON: {e}");
                    return Exit::DataErr;
                }
            };
            let liveness = proc.check(&identity);
            print_liveness(&identity, &liveness, json);
            match liveness {
                Liveness::Alive => Exit::Ok,
                Liveness::Dead(_) => Exit::Dead,
                Liveness::Unknown(_) => Exit::Unknown,
            }
        }
        Command::Check { .. } => unreachable!("clap requires --pid or --identity"),
        Command::ResolveOwner {
            pid,
            wrappers,
            json,
        } => {
            let start = pid.unwrap_or_else(|| {
                rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
            });
            match proc.resolve_owner(start, &wrappers) {
                Ok(identity) => {
                    print_identity(&identity, json);
                    Exit::Ok
                }
                Err(e) => identity_error(&e),
            }
        }
        Command::Register {
            session,
            uid,
            pending,
            owner,
            labels,
            json,
        } => {
            let owner = match owner_of(owner) {
                Ok(owner) => owner,
                Err(exit) => return exit,
            };
            let registration = Registration {
                session,
                owner,
                pending,
                labels: labels.into_iter().collect(),
                uid,
            };
            match Client::connect(socket).and_then(|mut c| c.register(&registration)) {
                Ok(session) => print_session(&session, json),
                Err(e) => client_error(&e),
            }
        }
        Command::Rename {
            session,
            to,
            uid,
            json,
        } => session_call(socket, &Request::Rename { session, to, uid }, json),
        Command::Touch(SessionArgs { session, uid, json }) => {
            session_call(socket, &Request::Touch { session, uid }, json)
        }
        Command::End(SessionArgs { session, uid, json }) => {
            session_call(socket, &Request::End { session, uid }, json)
        }
        Command::Get(SessionArgs { session, uid, json }) => {
            session_call(socket, &Request::Get { session, uid }, json)
        }
        Command::List { phase, json } => {
            let phase = phase.map(|p| match p {
                PhaseArg::Active => Phase::Active,
                PhaseArg::Ended => Phase::Ended,
            });
            list(socket, phase, json)
        }
        Command::Whose { pid, json } => call(socket, &Request::Whose { pid }, |reply| {
            if json {
                print_json(
                    &serde_json::json!({ "session": reply.session, "owner_pid": reply.owner_pid }),
                );
            } else if let Some(session) = &reply.session {
                println!(
                    "{} (owner PID {})",
                    describe_session(session),
                    reply.owner_pid.unwrap_or(session.owner.pid)
                );
            }
            Exit::Ok
        }),
        Command::Status { json } => call(socket, &Request::Status {}, |reply| {
            let Some(status) = reply.status else {
                eprintln!("liveness: the daemon's reply to status has no status");
                return Exit::Software;
            };
            if json {
                print_json(&status);
            } else {
                print_status(&status);
            }
            Exit::Ok
        }),
        Command::Watch(options) => watch(socket, options),
        Command::Wait(_) | Command::Lock { .. } | Command::Run(_) => {
            unreachable!("handled by run")
        }
        Command::Doctor { json } => doctor(socket, json),
    }
}

/// The owner named on the command line. `auto` stays a request to the daemon: it walks up
/// from the caller's pid, which the kernel translates into the daemon's namespace
/// (`SO_PEERCRED`), so no number crosses a namespace.
fn owner_of(owner: OwnerArgs) -> Result<Owner, Exit> {
    match owner {
        OwnerArgs { owner: Some(_), .. } => Ok(Owner::Auto),
        OwnerArgs {
            owner_pid: Some(pid),
            ..
        } => Ok(Owner::Pid(pid)),
        OwnerArgs {
            owner_identity: Some(text),
            ..
        } => serde_json::from_str(&text)
            .map(Owner::Identity)
            .map_err(|e| {
                eprintln!("liveness: invalid --owner-identity JSON: {e}");
                Exit::DataErr
            }),
        OwnerArgs { .. } => unreachable!("clap requires exactly one owner argument"),
    }
}

/// Every page of `list`: text one session a line, JSON as one array.
fn list(socket: &Path, phase: Option<Phase>, json: bool) -> Exit {
    let sessions = match Client::connect(socket).and_then(|mut c| c.list(phase)) {
        Ok(sessions) => sessions,
        Err(e) => return client_error(&e),
    };
    if json {
        print_json(&sessions);
    } else {
        for session in &sessions {
            println!("{}", describe_session(session));
        }
    }
    Exit::Ok
}

/// One request; `on_ok` handles its reply.
fn call(socket: &Path, request: &Request, on_ok: impl FnOnce(Reply) -> Exit) -> Exit {
    match Client::connect(socket).and_then(|mut client| client.call(request)) {
        Ok(reply) => on_ok(reply),
        Err(e) => client_error(&e),
    }
}

/// A request whose reply is one session.
fn session_call(socket: &Path, request: &Request, json: bool) -> Exit {
    call(socket, request, |reply| match &reply.session {
        Some(session) => print_session(session, json),
        None => Exit::Ok,
    })
}
