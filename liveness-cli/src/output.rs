//! Writing to stdout. A reader that went away (`liveness list | head -1`) ends the command
//! quietly with success, as for any Unix filter; `println!` would panic instead.
//!
//! Text is for a terminal, often root's, and much of it is other users' words: session
//! ids, labels, process names and command lines, action stderr. Every text line goes
//! through [`for_terminal`](crate::escape::for_terminal) here, so that none of it can drive the terminal (clear it, set
//! its title, write the clipboard with OSC 52); JSON lines through
//! [`json_text`](crate::escape::json_text).

use std::borrow::Cow;
use std::fmt;
use std::io::{ErrorKind, Write};

use serde::Serialize;

use crate::escape::{for_terminal, json_text};
use crate::exit::Exit;

/// Writes one line of text to stdout, escaped by [`for_terminal`], and flushes it (a
/// watcher's lines must not wait in a buffer).
pub(crate) fn line(args: fmt::Arguments<'_>) {
    let text = match args.as_str() {
        Some(text) => Cow::Borrowed(text),
        None => Cow::Owned(args.to_string()),
    };
    write_line(&for_terminal(&text));
}

/// Writes a line of JSON (see [`json_text`]) and flushes it.
pub(crate) fn json_line(line: &str) {
    write_line(&json_text(line));
}

fn write_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"));
    finish(written.and_then(|()| out.flush()));
}

/// Writes a line of JSON that ends in its newline (see [`json_text`]) with one `write(2)`:
/// stdout's line buffer passes it straight through when it holds nothing, so a reader
/// never sees it in pieces.
pub(crate) fn whole_json_line(line: &str) {
    let line = json_text(line);
    let mut out = std::io::stdout().lock();
    finish(out.write_all(line.as_bytes()).and_then(|()| out.flush()));
}

/// Writes `value` as one line of JSON.
pub(crate) fn json(value: &impl Serialize) {
    match serde_json::to_string(value) {
        Ok(text) => json_line(&text),
        Err(e) => {
            eprintln!("liveness: cannot encode the answer as JSON: {e}");
            std::process::exit(Exit::Software as i32);
        }
    }
}

/// A warning on stderr: something succeeded but looks wrong. With `--json`, one object
/// `{"warning":{"message":...}}`.
pub(crate) fn warn(message: &str, json: bool) {
    if json {
        let warning = serde_json::json!({ "warning": { "message": message } });
        eprintln!("{}", json_text(&warning.to_string()));
    } else {
        eprintln!("liveness: warning: {}", for_terminal(message));
    }
}

fn finish(written: std::io::Result<()>) {
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::BrokenPipe => std::process::exit(Exit::Ok as i32),
        Err(e) => {
            eprintln!("liveness: cannot write to stdout: {e}");
            std::process::exit(Exit::IoErr as i32);
        }
    }
}

/// `println!` for the CLI's stdout: see the module's comment.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;
