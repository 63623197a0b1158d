//! `liveness`: the command-line client of livenessd, built on `liveness-client`.
//!
//! Exit codes are part of the interface: one per meaning, whatever the command (the table
//! is `exit::EXIT_CODES`, printed by `--help` and copied in the README).

mod args;
mod clock;
mod doctor;
mod exit;
mod generate;
mod lock;
mod output;
mod processes;
mod render;
mod run;
mod wait;
mod watch;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

use liveness_client::{Client, Owner, Registration};
use liveness_common::identity::Identity;
use liveness_common::protocol::{Reply, Request};
use liveness_common::session::{OnEnd, Phase};
use liveness_proc::identity::{IdentityError, Liveness, ProcRoot};

use crate::args::{Cli, Command, LabelFilter, OwnerArgs, PhaseArg, SessionArgs};
use crate::doctor::doctor;
use crate::exit::{Exit, Failure};
use crate::output::outln;
use crate::render::{
    describe_session, print_identity, print_liveness, print_session, print_session_table,
    print_status,
};
use crate::wait::wait;
use crate::watch::watch;

/// What every command is given besides its own arguments.
pub(crate) struct Context {
    /// The daemon's socket, resolved.
    pub(crate) socket: PathBuf,
    /// `--json`: answers and failures as JSON.
    pub(crate) json: bool,
}

/// Parses the command line and runs the command.
fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let context = Context {
        socket: cli
            .global
            .socket
            .unwrap_or_else(liveness_client::default_socket),
        json: cli.global.json,
    };
    let result = match cli.command {
        Command::Wait(args) => wait(&context, &args),
        Command::Lock { command } => lock::lock(&context, command),
        Command::Run(args) => run::run(&context, args),
        command => run_command(command, &context).map(ExitCode::from),
    };
    result.unwrap_or_else(|failure| {
        failure.report(context.json);
        failure.exit.into()
    })
}

/// Help and version requests are successes; clap's own code for errors is 2, which here
/// means "unknown", so usage errors exit with EX_USAGE (as a JSON error under `--json`).
fn usage_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return Exit::Ok.into();
    }
    // The parse failed, so whether --json was given is read from the raw arguments.
    let json = std::env::args_os().skip(1).any(|arg| arg == "--json");
    if json {
        let text = e.render().to_string();
        // The error and its tip, without the usage synopsis that follows.
        let message = text.split("\n\nUsage:").next().unwrap_or(&text);
        Failure::new(Exit::Usage, message.trim().trim_start_matches("error: ")).report(true);
    } else {
        let _ = e.print();
    }
    Exit::Usage.into()
}

fn run_command(command: Command, context: &Context) -> Result<Exit, Failure> {
    let proc = ProcRoot::default();
    let socket = context.socket.as_path();
    let json = context.json;
    match command {
        Command::Check { pid: Some(pid), .. } => match proc.capture(pid) {
            Ok(identity) => {
                print_identity(&identity, json);
                Ok(Exit::Ok)
            }
            // For check, a process that is gone is an answer: dead.
            Err(IdentityError::NoSuchProcess(_)) => Err(Failure::new(
                Exit::Dead,
                format!("no process {pid}: it has exited (or is not in this PID namespace)"),
            )),
            Err(e) => Err(e.into()),
        },
        Command::Check {
            identity: Some(text),
            ..
        } => {
            let identity: Identity = serde_json::from_str(&text)
                .map_err(|e| Failure::new(Exit::DataErr, format!("invalid identity JSON: {e}")))?;
            let liveness = proc.check(&identity);
            print_liveness(&identity, &liveness, json);
            Ok(match liveness {
                Liveness::Alive => Exit::Ok,
                Liveness::Dead(_) => Exit::Dead,
                Liveness::Unknown(_) => Exit::Unknown,
            })
        }
        Command::Check { .. } => unreachable!("clap requires --pid or --identity"),
        Command::ResolveOwner { pid, wrappers } => {
            let start = pid.unwrap_or_else(|| {
                rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
            });
            let identity = proc.resolve_owner(start, &wrappers)?;
            print_identity(&identity, json);
            Ok(Exit::Ok)
        }
        Command::Register {
            session,
            uid,
            pending,
            owner,
            labels,
            wrappers,
            cleanup,
        } => {
            let registration = Registration {
                session,
                owner: owner_of(owner)?,
                pending,
                labels: labels.into_iter().collect(),
                uid,
                wrappers,
                on_end: cleanup.on_end.map(OnEnd::from),
                grace: cleanup.grace,
            };
            let registered = Client::connect(socket)
                .and_then(|mut c| c.register_with_warnings(&registration))?;
            for warning in &registered.warnings {
                output::warn(warning, json);
            }
            print_session(&registered.session, json);
            Ok(Exit::Ok)
        }
        Command::Rename { session, to, uid } => {
            session_call(socket, &Request::Rename { session, to, uid }, json)
        }
        Command::Touch(SessionArgs { session, uid }) => {
            session_call(socket, &Request::Touch { session, uid }, json)
        }
        Command::End {
            session: SessionArgs { session, uid },
            terminate,
        } => session_call(
            socket,
            &Request::End {
                session,
                uid,
                terminate,
            },
            json,
        ),
        Command::Get(SessionArgs { session, uid }) => {
            session_call(socket, &Request::Get { session, uid }, json)
        }
        Command::List { phase, labels } => {
            let phase = phase.map(|p| match p {
                PhaseArg::Active => Phase::Active,
                PhaseArg::Ended => Phase::Ended,
            });
            list(socket, phase, &labels, json)
        }
        Command::Whose { pid } => {
            let reply = call(socket, &Request::Whose { pid })?;
            if json {
                output::json(
                    &serde_json::json!({ "session": reply.session, "owner_pid": reply.owner_pid }),
                );
            } else if let Some(session) = &reply.session {
                let via = match reply.owner_pid {
                    Some(owner) if owner != pid => {
                        format!(", in the process tree of its owner {owner}")
                    }
                    _ => String::new(),
                };
                outln!("{}{via}", describe_session(session));
            }
            Ok(Exit::Ok)
        }
        Command::Status => {
            let status = call(socket, &Request::Status {})?.status.ok_or_else(|| {
                Failure::new(Exit::Software, "the daemon's reply to status has no status")
            })?;
            if json {
                output::json(&status);
            } else {
                print_status(&status);
            }
            Ok(Exit::Ok)
        }
        Command::Processes(args) => processes::processes(socket, args, json),
        Command::Watch(options) => watch(socket, options, json),
        Command::Wait(_) | Command::Lock { .. } | Command::Run(_) => {
            unreachable!("handled by main")
        }
        Command::Doctor => Ok(doctor(socket, json)),
        Command::Completions { shell } => generate::completions(shell),
        Command::GenerateMan { dir } => generate::man_pages(&dir),
    }
}

/// The owner named on the command line. `auto` stays a request to the daemon: it walks up
/// from the caller's pid, which the kernel translates into the daemon's namespace
/// (`SO_PEERCRED`), so no number crosses a namespace.
fn owner_of(owner: OwnerArgs) -> Result<Owner, Failure> {
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
                Failure::new(Exit::DataErr, format!("invalid --owner-identity JSON: {e}"))
            }),
        OwnerArgs { .. } => unreachable!("clap requires exactly one owner argument"),
    }
}

/// Every page of `list`: text one session a line, JSON as one array.
fn list(
    socket: &Path,
    phase: Option<Phase>,
    labels: &LabelFilter,
    json: bool,
) -> Result<Exit, Failure> {
    let mut sessions = Client::connect(socket).and_then(|mut c| c.list(phase))?;
    sessions.retain(|session| labels.matches(&session.labels));
    if json {
        output::json(&sessions);
    } else {
        print_session_table(&sessions, phase.is_some() || !labels.labels.is_empty());
    }
    Ok(Exit::Ok)
}

/// One request and its reply.
fn call(socket: &Path, request: &Request) -> Result<Reply, Failure> {
    Ok(Client::connect(socket).and_then(|mut client| client.call(request))?)
}

/// A request whose reply is one session.
fn session_call(socket: &Path, request: &Request, json: bool) -> Result<Exit, Failure> {
    if let Some(session) = &call(socket, request)?.session {
        print_session(session, json);
    }
    Ok(Exit::Ok)
}
