//! `liveness watch`: follow the event stream across daemon restarts, optionally running a
//! command per ended session (`--exec`) and saving a cursor.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use rustix::event::{PollFd, PollFlags};
use serde::Serialize;

use liveness_client::{Cursor, Filter, Item, Line};
use liveness_common::exit::ExitStatus;
use liveness_common::session::{Event, EventKind};
use liveness_common::wire::wire_name;

use crate::args::WatchArgs;
use crate::context::Context;
use crate::exit::{Exit, Failure};
use crate::output::{self, outln};
use crate::pids::Numbering;
use crate::render::describe_event;

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
        // As JSON, as end actions get it.
        .env(
            "LIVENESS_CAUSE",
            event
                .cause
                .as_ref()
                .and_then(|cause| serde_json::to_string(cause).ok())
                .unwrap_or_default(),
        )
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

impl WatchArgs {
    pub(crate) fn execute(&self, context: &Context) -> Result<ExitCode, Failure> {
        let json = context.json;
        // Problems the first event would otherwise reveal are refused now, before waiting.
        if let Some(command) = &self.exec {
            check_command(command)?;
        }
        let mut position = self.since.map(|seq| Cursor {
            seq,
            store_id: None,
        });
        if let Some(cursor) = &self.cursor {
            prepare_cursor_dir(cursor)?;
            if let Some(saved) = read_cursor(cursor).map_err(|e| Failure::new(Exit::IoErr, e))? {
                position = Some(saved);
            }
        }
        let save = |position: &Cursor| match &self.cursor {
            Some(file) => write_cursor(file, position).map_err(|e| {
                Failure::new(Exit::IoErr, format!("cannot write {}: {e}", file.display()))
            }),
            None => Ok(()),
        };
        let filter = Filter {
            session: self.session.clone(),
            uid: self.uid,
        };
        let client = context.connect()?;
        let pids = Numbering::of(&client);
        // Neither a saved cursor nor --since: the stream starts now, and that start is saved
        // at once. Saved only after the first handled event, a watcher stopped before then
        // would leave no cursor, and the next one would miss every end in between.
        let save_start = self.cursor.is_some() && position.is_none();
        let mut events = client.subscribe(position, filter)?;
        if save_start {
            events.cursor().map(save).transpose()?;
        }
        // Held while an event is handled, so that a closed stdout ends the watcher between
        // events, never halfway through a command or before its cursor is saved.
        let handling = Arc::new(Mutex::new(()));
        if json || self.exec.is_none() {
            exit_when_stdout_closes(Arc::clone(&handling));
        }
        // With nothing to read in an event (no command to run, no label or cause to filter
        // on), its line goes out as the daemon sent it: no parse, no second serialization,
        // one write.
        let filtered = !self.labels.labels.is_empty() || self.causes.is_set();
        let forward = json && self.exec.is_none() && !filtered;
        loop {
            let item = if forward {
                match events.next_line()? {
                    Line::Event { mut line, .. } => {
                        let _handling = handling.lock().unwrap_or_else(PoisonError::into_inner);
                        if !line.ends_with('\n') {
                            line.push('\n');
                        }
                        output::whole_json_line(&line);
                        events.cursor().map(save).transpose()?;
                        continue;
                    }
                    Line::Other(item) => item,
                }
            } else {
                events.next_item()?
            };
            let _handling = handling.lock().unwrap_or_else(PoisonError::into_inner);
            match item {
                Item::Reset { since, head, .. } => {
                    eprintln!(
                        "liveness: the daemon's database is not the one event {since} came from \
                     (it was replaced or recreated; its head is {head}): starting over with its first event"
                    );
                    events.cursor().map(save).transpose()?;
                }
                Item::Event(event) => {
                    // A cause filter keeps the endings of those causes and nothing else.
                    let cause_matches = !self.causes.is_set()
                        || (event.kind == EventKind::Ended
                            && self.causes.matches(event.cause.as_ref()));
                    if self.labels.matches(&event.labels)
                        && cause_matches
                        && self.handle(&event, json, &pids)?
                    {
                        events.cursor().map(save).transpose()?;
                    }
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
                // Only `fleet_watch` sends them, never a subscription.
                Item::FleetChange(_) => {}
                Item::Goodbye { reason } => {
                    eprintln!("liveness: the daemon stopped ({reason}); reconnecting (see --help)")
                }
            }
        }
    }

    /// Prints an event and runs `--exec` for it: whether it was handled (and is worth a
    /// cursor write). With --exec only session.ended events are handled; the others are
    /// skipped again after a restart.
    fn handle(&self, event: &Event, json: bool, pids: &Numbering) -> Result<bool, Failure> {
        let line = serde_json::to_string(&StreamLine { event }).map_err(|e| {
            Failure::new(
                Exit::Software,
                format!("cannot encode event {}: {e}", event.seq),
            )
        })?;
        if json {
            output::json_line(&line);
        } else if self.exec.is_none() {
            outln!("{}", describe_event(event, pids));
        }
        match (&self.exec, event.kind) {
            (None, _) => Ok(true),
            (Some(command), EventKind::Ended) => {
                let status = exec_for_event(command, &line, event).map_err(|e| {
                    Failure::new(Exit::TempFail, format!("cannot run {command:?}: {e}"))
                })?;
                if !status.success() {
                    return Err(Failure::new(
                        Exit::TempFail,
                        format!(
                            "{command:?} failed ({status}) for event {}; stopping before it",
                            event.seq
                        ),
                    ));
                }
                Ok(true)
            }
            (Some(_), _) => Ok(false),
        }
    }
}

/// Ends the watcher quietly once the reader of its stdout has gone (`watch | head -3`),
/// as a failed write would, without waiting for the next event to write: a pipe or a
/// socket whose reader closed polls POLLERR or POLLHUP. A file never does, and the thread
/// waits for nothing. It exits once `handling` is free: between events.
fn exit_when_stdout_closes(handling: Arc<Mutex<()>>) {
    std::thread::spawn(move || {
        let stdout = std::io::stdout();
        loop {
            let mut fds = [PollFd::new(&stdout, PollFlags::empty())];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) if fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP) => {
                    let _between_events = handling.lock();
                    std::process::exit(Exit::Ok as i32);
                }
                // POLLNVAL: no stdout at all; writing to it will say so.
                Ok(_) => return,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    });
}

/// Creates the cursor file's directory (`~/.local/state` may not exist yet), so that the
/// first write after the first event does not fail.
fn prepare_cursor_dir(cursor: &Path) -> Result<(), Failure> {
    match cursor.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir).map_err(|e| {
            Failure::new(
                Exit::IoErr,
                format!(
                    "cannot create the cursor's directory {}: {e}",
                    dir.display()
                ),
            )
        }),
        _ => Ok(()),
    }
}

/// Checks `--exec`'s command line as far as it can be checked before it runs: its shell
/// syntax, and that the program it starts with exists and is executable. A command that
/// starts with an expansion (`$HANDLER ...`) is checked for syntax only.
fn check_command(command: &str) -> Result<(), Failure> {
    let refuse = |why: String| Failure::new(Exit::Usage, format!("--exec {command:?}: {why}"));
    let syntax = std::process::Command::new("/bin/sh")
        .args(["-n", "-c", command])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Failure::new(Exit::Software, format!("cannot run /bin/sh: {e}")))?;
    if !syntax.status.success() {
        return Err(refuse(format!(
            "not a valid shell command: {}",
            String::from_utf8_lossy(&syntax.stderr).trim()
        )));
    }
    let Some(program) = command.split_whitespace().next() else {
        return Err(refuse("the command is empty".into()));
    };
    if program.contains([
        '$', '`', '"', '\'', '\\', '=', '(', ')', '{', '}', ';', '&', '|', '<', '>',
    ]) {
        return Ok(());
    }
    if program.contains('/') {
        let metadata = std::fs::metadata(program).map_err(|e| {
            refuse(format!(
                "{program}: {e} (relative paths are taken from the current directory)"
            ))
        })?;
        if !metadata.is_file() || metadata.permissions().mode() & 0o111 == 0 {
            return Err(refuse(format!(
                "{program} is not an executable file (chmod +x {program}?)"
            )));
        }
        return Ok(());
    }
    // A name: a shell builtin or a program on PATH, as sh itself will look it up.
    let found = std::process::Command::new("/bin/sh")
        .args(["-c", "command -v -- \"$1\" >/dev/null", "sh", program])
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| Failure::new(Exit::Software, format!("cannot run /bin/sh: {e}")))?;
    if found.success() {
        Ok(())
    } else {
        Err(refuse(format!("{program}: command not found on PATH")))
    }
}

/// An event line as the daemon sends it (`{"event": {...}}`), for `--json` and `--exec`.
#[derive(Serialize)]
struct StreamLine<'a> {
    event: &'a Event,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_commands_are_checked_before_the_first_event() {
        assert!(check_command("true").is_ok(), "a builtin");
        assert!(check_command("cat >/dev/null").is_ok(), "a program on PATH");
        assert!(check_command("/bin/sh -c true").is_ok(), "a path");
        assert!(
            check_command("$HANDLER arg").is_ok(),
            "an expansion: syntax only"
        );
        for bad in [
            "./does-not-exist.sh",
            "/nonexistent/handler",
            "no-such-program-anywhere",
            "if then",
            "",
        ] {
            let failure = check_command(bad).expect_err(bad);
            assert_eq!(failure.exit, Exit::Usage, "{bad:?}: {}", failure.message);
        }
        let plain = std::env::temp_dir().join(format!("liveness-not-exec-{}", std::process::id()));
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let failure = check_command(&plain.display().to_string()).expect_err("not executable");
        std::fs::remove_file(&plain).unwrap();
        assert!(failure.message.contains("chmod +x"), "{}", failure.message);
    }

    #[test]
    fn the_cursor_directory_is_created() {
        let dir = std::env::temp_dir().join(format!("liveness-cursor-{}", std::process::id()));
        let cursor = dir.join("a/b/cursor");
        prepare_cursor_dir(&cursor).expect("created");
        assert!(dir.join("a/b").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
