//! `liveness`: the command-line client of livenessd, built on `liveness-client`.
//!
//! Exit codes are part of the interface (documented in `--help` and README):
//! 0 alive / success, 1 dead, 2 unknown, and the sysexits(3) range for failures.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;

use std::path::{Path, PathBuf};

use liveness_client::{Client, ClientError, Cursor, Filter, Item, Owner, Registration};
use liveness_common::exit::{DetectedBy, ExitStatus};
use liveness_common::identity::{DeathReason, Identity};
use liveness_common::protocol::{ErrorCode, Reply, Request};
use liveness_common::session::{EndReason, Event, EventKind, Phase, Session};
use liveness_common::status::{SourceName, SourceReport, SourceState, Status};
use liveness_proc::diagnose::{self, Restrictions};
use liveness_proc::identity::{IdentityError, Liveness, ProcRoot};

/// Process exit codes of the `liveness` CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Alive, or the command succeeded.
    Ok = 0,
    Dead = 1,
    Unknown = 2,
    /// Bad command line (EX_USAGE).
    Usage = 64,
    /// Bad input data, or a request the daemon refused as invalid (EX_DATAERR).
    DataErr = 65,
    /// No such session or process (EX_NOINPUT).
    NotFound = 66,
    /// The daemon cannot be reached or is stopping (EX_UNAVAILABLE).
    Unavailable = 69,
    /// Something went wrong inside liveness (EX_SOFTWARE).
    Software = 70,
    /// A file or `/proc` entry could not be read or written (EX_IOERR).
    IoErr = 74,
    /// `watch --exec`: the command failed; the cursor stays before its event. Or a limit of
    /// the daemon refused the request: try again later (EX_TEMPFAIL).
    TempFail = 75,
    /// The daemon refused: the session or process belongs to another user (EX_NOPERM).
    NoPerm = 77,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   alive (check) or success
  1   dead: the process exited, its PID was reused, or the machine rebooted
  2   unknown: cannot be decided here (another host, unreadable /proc)
  64  usage error                 65  invalid input, or refused as invalid
  66  no such session or process  69  daemon unreachable or stopping
  70  internal error              74  I/O error
  75  watch --exec command failed, or a limit was reached (try again later)
  77  permission denied (another user's)";

const WAIT_HELP: &str = "\
Exit codes of wait:
  0   the owner exited with code 0, or the session was ended with `end`
  1   the owner exited with a non-zero code
  2   the owner was killed by a signal
  3   ended otherwise: PID reused, reboot, timeout, pending expired, or status unknown
  64+ the wait itself failed, as for the other commands (66: no such session)";

/// Tell session tooling when the process that owns a session dies.
#[derive(Debug, Parser)]
#[command(name = "liveness", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// The daemon's socket [env: LIVENESS_SOCKET; default: the user's own daemon's socket
    /// if it exists, else /run/liveness/liveness.sock].
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Capture a process's identity (--pid), or check whether an identity is still alive (--identity).
    ///
    /// An identity is the fingerprint {pid, start_ticks, boot_id, host}: unlike a bare PID
    /// it cannot be confused with a later process that reuses the number.
    #[command(after_help = EXIT_CODES_HELP)]
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Find the process that owns the caller: walk up from PID past shells, `env` and
    /// wrappers to the first real program, and print its identity.
    #[command(after_help = EXIT_CODES_HELP)]
    ResolveOwner {
        /// Start from this process (default: the parent of this command, e.g. the hook's shell).
        #[arg(long)]
        pid: Option<u32>,
        /// A further process name to skip as a wrapper (repeatable).
        #[arg(long = "wrapper", value_name = "COMM")]
        wrappers: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
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
        #[arg(long)]
        json: bool,
    },
    /// Give a pending session its real id.
    Rename {
        #[arg(long)]
        session: String,
        #[arg(long)]
        to: String,
        /// Root only: the session of this user (ids are per user; see docs/protocol.md).
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Record activity (postpones the inactivity timeout of owners that cannot be watched).
    Touch {
        #[arg(long)]
        session: String,
        /// Root only: the session of this user (ids are per user; see docs/protocol.md).
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// End a session now (reason `stopped`).
    End {
        #[arg(long)]
        session: String,
        /// Root only: the session of this user (ids are per user; see docs/protocol.md).
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Show one session.
    Get {
        #[arg(long)]
        session: String,
        /// Root only: the session of this user (ids are per user; see docs/protocol.md).
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// List sessions.
    List {
        #[arg(long, value_enum)]
        phase: Option<PhaseArg>,
        #[arg(long)]
        json: bool,
    },
    /// Which active session owns a process (itself or its nearest registered ancestor)?
    Whose {
        #[arg(long)]
        pid: u32,
        #[arg(long)]
        json: bool,
    },
    /// The daemon's state: exit sources, counters, versions.
    Status {
        #[arg(long)]
        json: bool,
    },
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
    Watch {
        /// Replay events after this seq first (default: only new events).
        #[arg(long, value_name = "SEQ")]
        since: Option<u64>,
        /// Only events of this session.
        #[arg(long)]
        session: Option<String>,
        /// Root only: only events of this user's sessions.
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        /// Run this command for each session.ended event.
        #[arg(long, value_name = "CMD")]
        exec: Option<String>,
        /// Cursor file ("SEQ STORE_ID", or a bare SEQ): read at start (it wins over --since),
        /// written after each handled event.
        #[arg(long, value_name = "FILE")]
        cursor: Option<PathBuf>,
        /// Print each event as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Block until a session ends; the exit code tells how (see below).
    ///
    /// If the daemon stops or restarts meanwhile, wait reconnects and goes on waiting,
    /// retrying for up to 30 s (every 0.1 s, doubling to 2 s); then it gives up with 69.
    #[command(after_help = WAIT_HELP)]
    Wait {
        #[arg(long)]
        session: String,
        /// Root only: the session of this user (ids are per user; see docs/protocol.md).
        #[arg(long, value_name = "UID")]
        uid: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Which exit sources the daemon runs and why the others are off (its self-test too),
    /// and, apart, which ones this process could start itself.
    #[command(after_help = DOCTOR_HELP)]
    Doctor {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct OwnerArgs {
    /// `auto`: the first ancestor of this command that is not a shell or wrapper.
    #[arg(long, value_parser = ["auto"])]
    owner: Option<String>,
    /// This process owns the session. PID is read in this command's PID namespace; where
    /// the kernel allows (Linux 5.3+) the daemon is given a pidfd for it, which names the
    /// process itself rather than a number that could be reused.
    #[arg(long, value_name = "PID")]
    owner_pid: Option<u32>,
    /// An identity captured earlier (`liveness check --pid PID --json`), possibly elsewhere.
    #[arg(long, value_name = "JSON")]
    owner_identity: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PhaseArg {
    Active,
    Ended,
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

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
        Command::Wait { session, uid, json } => wait(socket, &session, uid, json),
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
        Command::Touch { session, uid, json } => {
            session_call(socket, &Request::Touch { session, uid }, json)
        }
        Command::End { session, uid, json } => {
            session_call(socket, &Request::End { session, uid }, json)
        }
        Command::Get { session, uid, json } => {
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
        Command::Watch {
            since,
            session,
            uid,
            exec,
            cursor,
            json,
        } => watch(
            socket,
            Watch {
                since,
                session,
                uid,
                exec,
                cursor,
                json,
            },
        ),
        Command::Wait { .. } => unreachable!("handled by run"),
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

fn client_error(e: &ClientError) -> Exit {
    eprintln!("liveness: {e}");
    match e {
        ClientError::Connect { .. } | ClientError::Closed | ClientError::GaveUp { .. } => {
            Exit::Unavailable
        }
        ClientError::Io(_) => Exit::IoErr,
        ClientError::Protocol(_) => Exit::Software,
        ClientError::NoSuchProcess(_) => Exit::Dead,
        ClientError::Daemon { code, .. } => refusal_exit(*code),
    }
}

/// The exit code for a refusal by the daemon.
fn refusal_exit(code: ErrorCode) -> Exit {
    match code {
        ErrorCode::NotFound => Exit::NotFound,
        ErrorCode::Forbidden => Exit::NoPerm,
        ErrorCode::ShuttingDown => Exit::Unavailable,
        ErrorCode::Internal => Exit::Software,
        ErrorCode::TooManyConnections | ErrorCode::LimitReached => Exit::TempFail,
        ErrorCode::InvalidJson
        | ErrorCode::InvalidRequest
        | ErrorCode::LineTooLong
        | ErrorCode::UnsupportedVersion
        | ErrorCode::AlreadyEnded
        | ErrorCode::AlreadyExists
        | ErrorCode::NotPending
        | ErrorCode::Ambiguous
        | ErrorCode::NoOwner
        | ErrorCode::InvalidOwner => Exit::DataErr,
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

fn print_session(session: &Session, json: bool) -> Exit {
    if json {
        print_json(session);
    } else {
        println!("{}", describe_session(session));
    }
    Exit::Ok
}

/// The name a value has on the wire (`"active"`, `"owner_exited"`, ...); empty for none.
fn wire_name(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

/// How something ended, for the one-line descriptions.
fn describe_end(
    reason: Option<EndReason>,
    exit: Option<ExitStatus>,
    detected_by: Option<DetectedBy>,
) -> String {
    let mut text = String::new();
    if let Some(reason) = reason {
        text.push_str(&format!(" ended: {}", wire_name(reason)));
    }
    if let Some(exit) = exit {
        text.push_str(&format!(", {exit}"));
    }
    if let Some(by) = detected_by {
        text.push_str(&format!(" (detected by {by})"));
    }
    text
}

fn describe_session(session: &Session) -> String {
    let pending = if session.pending { " (pending)" } else { "" };
    format!(
        "{} {} owner {}{pending}{}",
        session.id,
        wire_name(session.phase),
        session.owner,
        describe_end(session.reason, session.exit, session.detected_by)
    )
}

fn describe_event(event: &Event) -> String {
    format!(
        "#{} {} {} owner {}{}",
        event.seq,
        wire_name(event.kind),
        event.session,
        event.owner,
        describe_end(event.reason, event.exit, event.detected_by)
    )
}

fn print_status(status: &Status) {
    let daemon = &status.daemon;
    println!(
        "livenessd {} (protocol {}), pid {}",
        daemon.version, daemon.protocol, daemon.pid
    );
    println!("socket {}  state {}", daemon.socket, daemon.state_dir);
    println!(
        "active sessions {}  head seq {}  subscribers {}",
        status.active_sessions, status.head_seq, status.subscribers
    );
    let monitor = &status.monitor;
    println!(
        "tracked processes {} (without pidfd: {})",
        monitor.tracked, monitor.without_pidfd
    );
    print_sources(&monitor.sources);
}

/// One line per exit source: name, state and reason, and the eBPF self-test where run.
fn print_sources(sources: &[SourceReport]) {
    for source in sources {
        let reason = source
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        println!(
            "  {:<9} {}{reason}",
            source.name.to_string(),
            wire_name(source.state)
        );
        if let Some(test) = &source.self_test {
            println!(
                "  {:<9} self-test {}: {}",
                "",
                if test.passed { "passed" } else { "FAILED" },
                test.detail
            );
        }
    }
}

#[derive(Debug)]
struct Watch {
    since: Option<u64>,
    session: Option<String>,
    uid: Option<u32>,
    exec: Option<String>,
    cursor: Option<PathBuf>,
    json: bool,
}

fn read_cursor(path: &Path) -> Result<Option<Cursor>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Cursor::parse(&text).map(Some).ok_or_else(|| {
            format!(
                "{} does not hold a cursor (SEQ or SEQ STORE_ID): {text:?}",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Replaces the cursor atomically and durably: a crash leaves the old or the new value.
fn write_cursor(path: &Path, cursor: &Cursor) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{cursor}")?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn exec_for_event(
    command: &str,
    line: &str,
    event: &Event,
) -> std::io::Result<std::process::ExitStatus> {
    let (code, signal) = match event.exit {
        Some(ExitStatus::Exited { code }) => (code.to_string(), String::new()),
        Some(ExitStatus::Signaled { signal, .. }) => (String::new(), signal.to_string()),
        None => (String::new(), String::new()),
    };
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .env("LIVENESS_SEQ", event.seq.to_string())
        .env("LIVENESS_SESSION", &event.session)
        .env("LIVENESS_REASON", wire_name(event.reason))
        .env("LIVENESS_EXIT_CODE", code)
        .env("LIVENESS_SIGNAL", signal)
        .env("LIVENESS_DETECTED_BY", wire_name(event.detected_by))
        .env("LIVENESS_OWNER_PID", event.owner.pid.to_string())
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that ignores its stdin may close it early; that is its business.
        let _ = writeln!(stdin, "{line}");
    }
    child.wait()
}

fn watch(socket: &Path, options: Watch) -> Exit {
    let mut position = options.since.map(|seq| Cursor {
        seq,
        store_id: None,
    });
    if let Some(cursor) = &options.cursor {
        match read_cursor(cursor) {
            Ok(Some(saved)) => position = Some(saved),
            Ok(None) => {}
            Err(e) => {
                eprintln!("liveness: {e}");
                return Exit::IoErr;
            }
        }
    }
    let save = |position: &Cursor| match &options.cursor {
        Some(file) => write_cursor(file, position).map_err(|e| {
            eprintln!("liveness: cannot write {}: {e}", file.display());
            Exit::IoErr
        }),
        None => Ok(()),
    };
    let filter = Filter {
        session: options.session.clone(),
        uid: options.uid,
    };
    let mut events = match Client::connect(socket).and_then(|c| c.subscribe(position, filter)) {
        Ok(events) => events,
        Err(e) => return client_error(&e),
    };
    loop {
        let item = match events.next_item() {
            Ok(item) => item,
            Err(e) => return client_error(&e),
        };
        match item {
            Item::Reset { since, head, .. } => {
                eprintln!(
                    "liveness: the daemon's database is not the one event {since} came from \
                     (it was replaced or recreated; its head is {head}): starting over with its first event"
                );
                if let Some(Err(exit)) = events.cursor().map(save) {
                    return exit;
                }
            }
            Item::Event(event) => {
                let line = match serde_json::to_string(&StreamLine { event: &event }) {
                    Ok(line) => line,
                    Err(e) => {
                        eprintln!("liveness: cannot encode event {}: {e}", event.seq);
                        return Exit::Software;
                    }
                };
                if options.json {
                    println!("{line}");
                } else if options.exec.is_none() {
                    println!("{}", describe_event(&event));
                }
                // With --exec only session.ended events are handled (and worth a cursor
                // write); the others are skipped again after a restart.
                let handled = match (&options.exec, event.kind) {
                    (None, _) => true,
                    (Some(command), EventKind::Ended) => {
                        match exec_for_event(command, &line, &event) {
                            Ok(status) if status.success() => true,
                            Ok(status) => {
                                eprintln!(
                                    "liveness: {command:?} failed ({status}) for event {}; stopping before it",
                                    event.seq
                                );
                                return Exit::TempFail;
                            }
                            Err(e) => {
                                eprintln!("liveness: cannot run {command:?}: {e}");
                                return Exit::TempFail;
                            }
                        }
                    }
                    (Some(_), _) => false,
                };
                if handled && let Some(Err(exit)) = events.cursor().map(save) {
                    return exit;
                }
                let _ = std::io::stdout().flush();
            }
            Item::Gap {
                since: from,
                pruned_through,
            } => eprintln!(
                "liveness: events {}..={pruned_through} fell out of the daemon's retention and were missed",
                from + 1
            ),
            Item::Lagged { last_delivered } => {
                eprintln!("liveness: fell behind; resuming after event {last_delivered}");
            }
            Item::Goodbye { reason } => eprintln!(
                "liveness: the daemon stopped ({reason}); reconnecting {RECONNECT_HELP_SHORT}"
            ),
        }
    }
}

/// An event line as the daemon sends it (`{"event": {...}}`), for `--json` and `--exec`.
#[derive(Serialize)]
struct StreamLine<'a> {
    event: &'a Event,
}

/// How long `wait` and `watch` try to reach a restarted daemon ([`liveness_client::Retry`]'s
/// default).
const RECONNECT_HELP_SHORT: &str = "(retrying for up to 30 s, every 0.1 s doubling to 2 s)";

/// How `wait` reports the end of a session (see `WAIT_HELP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum WaitOutcome {
    Clean = 0,
    Failed = 1,
    Killed = 2,
    Otherwise = 3,
}

impl WaitOutcome {
    fn of(session: &Session) -> WaitOutcome {
        match (session.reason, session.exit) {
            (Some(EndReason::Stopped), _) | (_, Some(ExitStatus::Exited { code: 0 })) => {
                WaitOutcome::Clean
            }
            (_, Some(ExitStatus::Exited { .. })) => WaitOutcome::Failed,
            (_, Some(ExitStatus::Signaled { .. })) => WaitOutcome::Killed,
            _ => WaitOutcome::Otherwise,
        }
    }
}

fn wait(socket: &Path, id: &str, uid: Option<u32>, json: bool) -> ExitCode {
    match wait_for_end(socket, id, uid, json) {
        Ok(outcome) => ExitCode::from(outcome as u8),
        Err(exit) => exit.into(),
    }
}

fn wait_for_end(
    socket: &Path,
    id: &str,
    uid: Option<u32>,
    json: bool,
) -> Result<WaitOutcome, Exit> {
    let session = Client::connect(socket)
        .and_then(|client| client.wait_for_end(id, uid))
        .map_err(|e| client_error(&e))?;
    if json {
        print_json(&session);
    } else {
        println!("{}", describe_session(&session));
    }
    Ok(WaitOutcome::of(&session))
}

const DOCTOR_HELP: &str = "\
The daemon part is the daemon's own view (its status: each source's state and reason, the
eBPF self-test); the client part is what this process, with its own privileges and seccomp
filters, could start. They differ when the two run with different rights.
Exit codes: 0 the daemon answered and has an active source, 69 the daemon cannot be
reached (the client part is still printed) or has no active source, 70 internal error.";

/// `liveness doctor`: the daemon's own account of its sources, and apart from it what this
/// process could start (a daemon without CAP_BPF must not look able to run eBPF because
/// the client has it).
fn doctor(socket: &Path, json: bool) -> Exit {
    let (daemon, daemon_error) =
        match Client::connect(socket).and_then(|mut client| client.status()) {
            Ok(status) => (Some(DaemonDoctor::of(status)), None),
            Err(e) => (None, Some(e.to_string())),
        };
    let restrictions = Restrictions::of_this_thread();
    let client = ClientDoctor {
        pid: std::process::id(),
        euid: rustix::process::geteuid().as_raw(),
        kernel: rustix::system::uname()
            .release()
            .to_string_lossy()
            .into_owned(),
        sources: client_sources(),
        restrictions,
    };
    let daemon_active = daemon.as_ref().is_some_and(|d| {
        d.sources
            .iter()
            .any(|s| matches!(s.state, SourceState::Active | SourceState::Degraded))
    });
    if json {
        print_json(&Doctor {
            daemon,
            daemon_error,
            client,
        });
    } else {
        match (&daemon, &daemon_error) {
            (Some(daemon), _) => {
                println!(
                    "daemon: livenessd {}, pid {}, sources {}",
                    daemon.version, daemon.pid, daemon.selection
                );
                print_sources(&daemon.sources);
            }
            (None, error) => println!(
                "daemon: not reachable: {}",
                error.as_deref().unwrap_or("no answer")
            ),
        }
        let restrictions = &client.restrictions;
        let capabilities = if restrictions.capabilities.is_empty() {
            "none".to_owned()
        } else {
            restrictions.capabilities.join(" ")
        };
        println!(
            "this client (pid {}, euid {}, kernel {}, seccomp mode {}, capabilities {capabilities}) could start:",
            client.pid, client.euid, client.kernel, restrictions.seccomp_mode
        );
        print_sources(&client.sources);
    }
    if daemon_active {
        Exit::Ok
    } else {
        Exit::Unavailable
    }
}

/// `liveness doctor --json`.
#[derive(Debug, Serialize)]
struct Doctor {
    /// The daemon's own account of its sources; `null` when it cannot be reached.
    daemon: Option<DaemonDoctor>,
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_error: Option<String>,
    /// What this process could start.
    client: ClientDoctor,
}

/// The daemon part of `doctor`: who answered and its sources, as its status has them.
#[derive(Debug, Serialize)]
struct DaemonDoctor {
    pid: u32,
    version: String,
    selection: String,
    sources: Vec<SourceReport>,
}

impl DaemonDoctor {
    fn of(status: Status) -> DaemonDoctor {
        DaemonDoctor {
            pid: status.daemon.pid,
            version: status.daemon.version,
            selection: status.monitor.selection,
            sources: status.monitor.sources,
        }
    }
}

#[derive(Debug, Serialize)]
struct ClientDoctor {
    pid: u32,
    euid: u32,
    kernel: String,
    /// `seccomp_mode`, `seccomp_filters`, `capabilities`.
    #[serde(flatten)]
    restrictions: Restrictions,
    sources: Vec<SourceReport>,
}

/// What this process could start, by probing the syscalls each source needs (harmlessly:
/// nothing is loaded, so the CLI needs no eBPF loader).
fn client_sources() -> Vec<SourceReport> {
    let source = |name, denial: Option<String>| SourceReport {
        name,
        state: if denial.is_some() {
            SourceState::Off
        } else {
            SourceState::Available
        },
        reason: denial,
        exit_status: None,
        self_test: None,
        stats: None,
    };
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    let ebpf = diagnose::availability(&diagnose::BPF)
        .map(|denial| denial.to_string())
        .or_else(|| {
            (!btf.exists()).then(|| {
                format!(
                    "the kernel lacks BTF ({}): it needs CONFIG_DEBUG_INFO_BTF=y",
                    btf.display()
                )
            })
        });
    let pidfd = diagnose::availability(&diagnose::PIDFD_OPEN).map(|denial| denial.to_string());
    vec![
        source(SourceName::Ebpf, ebpf),
        source(SourceName::Pidfd, pidfd),
        source(SourceName::Procpoll, None),
    ]
}

fn identity_error(e: &IdentityError) -> Exit {
    eprintln!("liveness: {e}");
    match e {
        IdentityError::NoSuchProcess(_) => Exit::Dead,
        IdentityError::Read { .. } => Exit::IoErr,
        IdentityError::Malformed { .. } => Exit::Unknown,
        IdentityError::NoOwner { .. }
        | IdentityError::Thread { .. }
        | IdentityError::KernelThread { .. }
        | IdentityError::NotPidfd(_) => Exit::DataErr,
        IdentityError::NotVisible | IdentityError::NotInCallerNamespace { .. } => Exit::NotFound,
        IdentityError::AmbiguousStartTime { .. } => Exit::Unknown,
    }
}

fn print_json(value: &impl Serialize) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (e.g. `| head`) is not worth a panic.
    let _ = serde_json::to_writer(&mut out, value).map(|()| writeln!(out));
}

fn print_identity(identity: &Identity, json: bool) {
    if json {
        print_json(identity);
    } else {
        println!(
            "pid {} ({}) start_ticks {} boot_id {} host {}",
            identity.pid, identity.comm, identity.start_ticks, identity.boot_id, identity.host
        );
    }
}

/// The JSON shape of a liveness verdict.
#[derive(Debug, Serialize)]
struct Verdict<'a> {
    identity: &'a Identity,
    liveness: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<DeathReason>,
    detail: String,
}

fn print_liveness(identity: &Identity, liveness: &Liveness, json: bool) {
    let (word, reason, detail) = match liveness {
        Liveness::Alive => ("alive", None, "the process is running".to_owned()),
        Liveness::Dead(reason) => ("dead", Some(*reason), reason.to_string()),
        Liveness::Unknown(why) => ("unknown", None, why.clone()),
    };
    if json {
        print_json(&Verdict {
            identity,
            liveness: word,
            reason,
            detail,
        });
    } else {
        println!("{word}: {detail} ({identity})");
    }
}
