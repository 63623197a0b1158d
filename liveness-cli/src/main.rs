//! `liveness`: the command-line client of livenessd, built on `liveness-client`.
//!
//! Exit codes are part of the interface: one per meaning, whatever the command (the table
//! is `exit::EXIT_CODES`, printed by `--help` and copied in docs/cli.md).

mod agent_hooks;
mod agent_runs;
mod args;
mod check;
mod clock;
mod context;
mod doctor;
mod escape;
mod exit;
mod fleet;
mod generate;
mod lock;
mod output;
mod pids;
mod processes;
mod render;
mod run;
mod sessions;
mod status;
mod wait;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::context::Context;
use crate::exit::{Exit, Failure};

/// Parses the command line and runs the command.
fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let context = Context {
        named_socket: cli.global.socket.clone(),
        socket: cli
            .global
            .socket
            .unwrap_or_else(liveness_client::default_socket),
        json: cli.global.json,
    };
    cli.command.execute(&context).unwrap_or_else(|failure| {
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

impl Command {
    /// Runs the command: its exit code, or the failure to report.
    fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        match self {
            Command::Check(args) => args.execute(context),
            Command::ResolveOwner(args) => args.execute(context),
            Command::Register(args) => args.execute(context),
            Command::Rename(args) => args.execute(context),
            Command::Touch(args) => args.execute(context),
            Command::End(args) => args.execute(context),
            Command::Get(args) => args.execute(context),
            Command::List(args) => args.execute(context),
            Command::Whose(args) => args.execute(context),
            Command::Processes(args) => args.execute(context),
            Command::Status(args) => args.execute(context),
            Command::Watch(args) => args.execute(context),
            Command::Wait(args) => args.execute(context),
            Command::Doctor(args) => args.execute(context),
            Command::Completions(args) => args.execute(context),
            Command::GenerateMan(args) => args.execute(context),
            Command::Lock(args) => args.execute(context),
            Command::Fleet(args) => args.execute(context),
            Command::Run(args) => args.execute(context),
            Command::Hooks(args) => args.execute(context),
        }
    }
}
