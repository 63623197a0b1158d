//! The `liveness` command-line client.
//!
//! Exit codes are part of the interface (documented in `--help` and README):
//! 0 alive / success, 1 dead, 2 unknown, and the sysexits(3) range for failures.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::client::{Client, ClientError, Cursor};
use crate::identity::{DeathReason, Identity, IdentityError, Liveness, ProcRoot};
use crate::paths::Env;
use crate::protocol::{
    AutoOwner, ErrorCode, OwnerSpec, PidOwner, PidfdOwner, Reply, Request, StreamMessage,
};
use crate::source::diagnose::Restrictions;
use crate::source::monitor::{MonitorConfig, probe};
use crate::source::{DetectedBy, ExitStatus};
use crate::store::{EndReason, Event, EventKind, Phase, Session};

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
pub fn main() -> ExitCode {
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
    let socket = &cli
        .socket
        .unwrap_or_else(|| Env::from_process().client_socket(|p| p.exists()));
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
            let (owner, pidfd) = match owner_spec(owner) {
                Ok(owner) => owner,
                Err(exit) => return exit,
            };
            let labels: BTreeMap<String, String> = labels.into_iter().collect();
            let fds: Vec<_> = pidfd.iter().map(AsFd::as_fd).collect();
            let request = Request::Register {
                session,
                uid,
                owner,
                pending,
                labels,
            };
            let reply = Client::connect(socket).and_then(|mut c| c.call_with_fds(&request, &fds));
            match reply {
                Ok(reply) if reply.ok => print_session(&reply, json),
                Ok(reply) => refused(&reply),
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
            let status = reply.status.unwrap_or_default();
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

/// The owner as the request names it, and the pidfd to pass with the request, if any.
///
/// `auto` stays a request to the daemon: it walks up from the caller's pid, which the
/// kernel translates into the daemon's namespace (`SO_PEERCRED`), so no number crosses a
/// namespace.
fn owner_spec(owner: OwnerArgs) -> Result<(OwnerSpec, Option<OwnedFd>), Exit> {
    match owner {
        OwnerArgs { owner: Some(_), .. } => Ok((OwnerSpec::Auto(AutoOwner::Auto), None)),
        OwnerArgs {
            owner_pid: Some(pid),
            ..
        } => match open_pidfd(pid) {
            Ok(Some(pidfd)) => Ok((OwnerSpec::Pidfd(PidfdOwner { pidfd: 0 }), Some(pidfd))),
            Ok(None) => Ok((OwnerSpec::Pid(PidOwner { pid }), None)),
            Err(e) => Err(identity_error(&e)),
        },
        OwnerArgs {
            owner_identity: Some(text),
            ..
        } => match serde_json::from_str(&text) {
            Ok(identity) => Ok((OwnerSpec::Identity(identity), None)),
            Err(e) => {
                eprintln!("liveness: invalid --owner-identity JSON: {e}");
                Err(Exit::DataErr)
            }
        },
        OwnerArgs { .. } => unreachable!("clap requires exactly one owner argument"),
    }
}

/// A pidfd for `pid` in this command's namespace; `None` where pidfds do not apply (a
/// kernel before 5.3, a seccomp filter, a thread id): the daemon is then given the number
/// and says what is wrong with it.
fn open_pidfd(pid: u32) -> Result<Option<OwnedFd>, IdentityError> {
    let Some(raw) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return Err(IdentityError::NoSuchProcess(pid));
    };
    match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
        Ok(pidfd) => Ok(Some(pidfd)),
        Err(rustix::io::Errno::SRCH) => Err(IdentityError::NoSuchProcess(pid)),
        Err(_) => Ok(None),
    }
}

fn client_error(e: &ClientError) -> Exit {
    eprintln!("liveness: {e}");
    match e {
        ClientError::Connect { .. } | ClientError::Closed => Exit::Unavailable,
        ClientError::Io(_) => Exit::IoErr,
        ClientError::Protocol(_) => Exit::Software,
    }
}

/// Reports an error reply and maps it to an exit code.
fn refused(reply: &Reply) -> Exit {
    let Some(error) = &reply.error else {
        eprintln!("liveness: the daemon refused without saying why");
        return Exit::Software;
    };
    eprintln!("liveness: {}", error.message);
    match error.code {
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

/// Every page of `list`, on one connection; text is printed page by page, JSON as one
/// array at the end.
fn list(socket: &Path, phase: Option<Phase>, json: bool) -> Exit {
    let mut client = match Client::connect(socket) {
        Ok(client) => client,
        Err(e) => return client_error(&e),
    };
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let request = Request::List {
            phase,
            limit: None,
            after: after.take(),
        };
        let reply = match client.call(&request) {
            Ok(reply) if reply.ok => reply,
            Ok(reply) => return refused(&reply),
            Err(e) => return client_error(&e),
        };
        let sessions = reply.sessions.unwrap_or_default();
        if json {
            all.extend(sessions);
        } else {
            for session in &sessions {
                println!("{}", describe_session(session));
            }
        }
        match reply.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if json {
        print_json(&all);
    }
    Exit::Ok
}

/// One request; `on_ok` handles a successful reply.
fn call(socket: &Path, request: &Request, on_ok: impl FnOnce(Reply) -> Exit) -> Exit {
    match Client::connect(socket).and_then(|mut client| client.call(request)) {
        Ok(reply) if reply.ok => on_ok(reply),
        Ok(reply) => refused(&reply),
        Err(e) => client_error(&e),
    }
}

/// A request whose reply is one session.
fn session_call(socket: &Path, request: &Request, json: bool) -> Exit {
    call(socket, request, |reply| print_session(&reply, json))
}

fn print_session(reply: &Reply, json: bool) -> Exit {
    if let Some(session) = &reply.session {
        if json {
            print_json(session);
        } else {
            println!("{}", describe_session(session));
        }
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

fn print_status(status: &serde_json::Value) {
    let text = json_text;
    let daemon = &status["daemon"];
    println!(
        "livenessd {} (protocol {}), pid {}",
        text(&daemon["version"]),
        daemon["protocol"],
        daemon["pid"]
    );
    println!(
        "socket {}  state {}",
        text(&daemon["socket"]),
        text(&daemon["state_dir"])
    );
    println!(
        "active sessions {}  head seq {}  subscribers {}",
        status["active_sessions"], status["head_seq"], status["subscribers"]
    );
    let monitor = &status["monitor"];
    println!(
        "tracked processes {} (without pidfd: {})",
        monitor["tracked"], monitor["without_pidfd"]
    );
    print_sources(&monitor["sources"]);
}

/// A JSON value as text: strings without their quotes, everything else as JSON.
fn json_text(value: &serde_json::Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

/// One line per exit source: name, state and reason, and the eBPF self-test where run.
fn print_sources(sources: &serde_json::Value) {
    for source in sources.as_array().into_iter().flatten() {
        let reason = source["reason"]
            .as_str()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        println!(
            "  {:<9} {}{reason}",
            json_text(&source["name"]),
            json_text(&source["state"])
        );
        if let Some(passed) = source["self_test"]["passed"].as_bool() {
            println!(
                "  {:<9} self-test {}: {}",
                "",
                if passed { "passed" } else { "FAILED" },
                json_text(&source["self_test"]["detail"])
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
    // A lagging watcher is disconnected by the daemon; it resumes after its last event.
    loop {
        let mut client = match Client::connect(socket) {
            Ok(client) => client,
            Err(e) => return client_error(&e),
        };
        let subscribed =
            match client.subscribe(position.as_ref(), options.session.clone(), options.uid) {
                Ok(Reply {
                    ok: true,
                    subscribed: Some(subscribed),
                    ..
                }) => subscribed,
                Ok(reply) => return refused(&reply),
                Err(e) => return client_error(&e),
            };
        // From here on the position is in the daemon's store: a cursor saved without a
        // store id (or a watcher started without one) learns it.
        let position = position.get_or_insert(Cursor {
            seq: subscribed.since,
            store_id: None,
        });
        position
            .store_id
            .get_or_insert_with(|| subscribed.store_id.clone());
        loop {
            let (line, message) = match client.next_message() {
                Ok(next) => next,
                Err(e) => return client_error(&e),
            };
            match &message {
                StreamMessage::Reset { since, head, .. } => {
                    eprintln!(
                        "liveness: the daemon's database is not the one event {since} came from \
                         (it was replaced or recreated; its head is {head}): starting over with its first event"
                    );
                    position.follow(&message);
                    if let Err(exit) = save(position) {
                        return exit;
                    }
                }
                StreamMessage::Event(event) => {
                    if options.json {
                        println!("{line}");
                    } else if options.exec.is_none() {
                        println!("{}", describe_event(event));
                    }
                    // With --exec only session.ended events are handled (and worth a
                    // cursor write); the others are skipped again after a restart.
                    let handled = match (&options.exec, event.kind) {
                        (None, _) => true,
                        (Some(command), EventKind::Ended) => {
                            match exec_for_event(command, &line, event) {
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
                    position.follow(&message);
                    if handled && let Err(exit) = save(position) {
                        return exit;
                    }
                    let _ = std::io::stdout().flush();
                }
                StreamMessage::Gap {
                    since: from,
                    pruned_through,
                } => {
                    eprintln!(
                        "liveness: events {}..={pruned_through} fell out of the daemon's retention and were missed",
                        from + 1
                    );
                }
                StreamMessage::Lagged { last_delivered } => {
                    eprintln!("liveness: fell behind; resuming after event {last_delivered}");
                    position.seq = *last_delivered;
                    break;
                }
                StreamMessage::Goodbye { reason } => {
                    eprintln!("liveness: the daemon closed the stream ({reason})");
                    return Exit::Unavailable;
                }
            }
        }
    }
}

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
    // Subscribe first, then look: an end between the two is still on the stream.
    let mut stream = match Client::connect(socket) {
        Ok(client) => client,
        Err(e) => return Err(client_error(&e)),
    };
    match stream.subscribe(None, Some(id.to_owned()), uid) {
        Ok(reply) if reply.ok => {}
        Ok(reply) => return Err(refused(&reply)),
        Err(e) => return Err(client_error(&e)),
    }
    let report = |session: &Session| {
        if json {
            print_json(session);
        } else {
            println!("{}", describe_session(session));
        }
        WaitOutcome::of(session)
    };
    let current = match Client::connect(socket).and_then(|mut client| {
        client.call(&Request::Get {
            session: id.to_owned(),
            uid,
        })
    }) {
        Ok(reply) if reply.ok => reply.session,
        Ok(reply) => return Err(refused(&reply)),
        Err(e) => return Err(client_error(&e)),
    };
    if let Some(session) = current.filter(|s| s.phase == Phase::Ended) {
        return Ok(report(&session));
    }
    loop {
        match stream.next_message() {
            Ok((_, StreamMessage::Event(event))) if event.kind == EventKind::Ended => {
                let session = match Client::connect(socket).and_then(|mut c| {
                    c.call(&Request::Get {
                        session: event.session.clone(),
                        uid: Some(event.creator_uid),
                    })
                }) {
                    Ok(reply) if reply.ok => reply.session,
                    Ok(reply) => return Err(refused(&reply)),
                    Err(e) => return Err(client_error(&e)),
                };
                return session.map(|s| report(&s)).ok_or(Exit::Software);
            }
            Ok((_, StreamMessage::Lagged { .. })) => return wait_for_end(socket, id, uid, json),
            Ok((_, StreamMessage::Goodbye { reason })) => {
                eprintln!("liveness: the daemon stopped ({reason}) before the session ended");
                return Err(Exit::Unavailable);
            }
            Ok(_) => {}
            Err(e) => return Err(client_error(&e)),
        }
    }
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("liveness: cannot start a runtime: {e}");
            return Exit::Software;
        }
    };
    let (daemon, daemon_error) =
        match Client::connect(socket).and_then(|mut client| client.call(&Request::Status {})) {
            Ok(Reply {
                ok: true,
                status: Some(status),
                ..
            }) => (Some(daemon_doctor(&status)), None),
            Ok(reply) => (
                None,
                Some(reply.error.map_or_else(
                    || "the daemon refused without saying why".to_owned(),
                    |e| e.message,
                )),
            ),
            Err(e) => (None, Some(e.to_string())),
        };
    let sources = runtime.block_on(probe(&MonitorConfig::default()));
    let restrictions = Restrictions::of_this_thread();
    let client = serde_json::json!({
        "pid": std::process::id(),
        "euid": rustix::process::geteuid().as_raw(),
        "kernel": rustix::system::uname().release().to_string_lossy(),
        "seccomp_mode": restrictions.seccomp_mode,
        "seccomp_filters": restrictions.seccomp_filters,
        "capabilities": restrictions.capabilities,
        "sources": sources,
    });
    if json {
        let mut report = serde_json::json!({ "daemon": daemon, "client": client });
        if let Some(error) = &daemon_error {
            report["daemon_error"] = error.as_str().into();
        }
        print_json(&report);
    } else {
        match (&daemon, &daemon_error) {
            (Some(daemon), _) => {
                println!(
                    "daemon: livenessd {}, pid {}, sources {}",
                    json_text(&daemon["version"]),
                    daemon["pid"],
                    json_text(&daemon["selection"])
                );
                print_sources(&daemon["sources"]);
            }
            (None, error) => println!(
                "daemon: not reachable: {}",
                error.as_deref().unwrap_or("no answer")
            ),
        }
        let capabilities = if restrictions.capabilities.is_empty() {
            "none".to_owned()
        } else {
            restrictions.capabilities.join(" ")
        };
        println!(
            "this client (pid {}, euid {}, kernel {}, seccomp mode {}, capabilities {capabilities}) could start:",
            client["pid"],
            client["euid"],
            json_text(&client["kernel"]),
            restrictions.seccomp_mode
        );
        print_sources(&client["sources"]);
    }
    let daemon_active = daemon.as_ref().is_some_and(|d| {
        d["sources"]
            .as_array()
            .is_some_and(|sources| sources.iter().any(|s| s["state"] == "active"))
    });
    if daemon_active {
        Exit::Ok
    } else {
        Exit::Unavailable
    }
}

/// The daemon part of `doctor`: who answered and its sources, as its status has them.
fn daemon_doctor(status: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "pid": status["daemon"]["pid"],
        "version": status["daemon"]["version"],
        "selection": status["monitor"]["selection"],
        "sources": status["monitor"]["sources"],
    })
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
