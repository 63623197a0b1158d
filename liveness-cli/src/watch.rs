//! `liveness watch`: follow the event stream across daemon restarts, optionally running a
//! command per ended session (`--exec`) and saving a cursor.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use liveness_client::{Client, Cursor, Filter, Item};
use liveness_common::exit::ExitStatus;
use liveness_common::session::{Event, EventKind};

use crate::exit::{Exit, client_error};
use crate::render::{describe_event, wire_name};

/// `liveness watch`: what to follow and what to do with each event.
#[derive(Debug, clap::Args)]
pub(crate) struct Watch {
    /// Replay events after this seq first (default: only new events).
    #[arg(long, value_name = "SEQ")]
    pub(crate) since: Option<u64>,
    /// Only events of this session.
    #[arg(long)]
    pub(crate) session: Option<String>,
    /// Root only: only events of this user's sessions.
    #[arg(long, value_name = "UID")]
    pub(crate) uid: Option<u32>,
    /// Run this command for each session.ended event.
    #[arg(long, value_name = "CMD")]
    pub(crate) exec: Option<String>,
    /// Cursor file ("SEQ STORE_ID", or a bare SEQ): read at start (it wins over --since),
    /// written after each handled event.
    #[arg(long, value_name = "FILE")]
    pub(crate) cursor: Option<PathBuf>,
    /// Print each event as one JSON line.
    #[arg(long)]
    pub(crate) json: bool,
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

pub(crate) fn watch(socket: &Path, options: Watch) -> Exit {
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
            Item::Goodbye { reason } => {
                eprintln!("liveness: the daemon stopped ({reason}); reconnecting (see --help)")
            }
        }
    }
}

/// An event line as the daemon sends it (`{"event": {...}}`), for `--json` and `--exec`.
#[derive(Serialize)]
struct StreamLine<'a> {
    event: &'a Event,
}
