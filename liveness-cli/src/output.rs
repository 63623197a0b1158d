//! Writing to stdout. A reader that went away (`liveness list | head -1`) ends the command
//! quietly with success, as for any Unix filter; `println!` would panic instead.

use std::fmt;
use std::io::{ErrorKind, Write};

use serde::Serialize;

use crate::exit::Exit;

/// Writes one line to stdout and flushes it (a watcher's lines must not wait in a buffer).
pub(crate) fn line(args: fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| out.write_all(b"\n"));
    finish(written.and_then(|()| out.flush()));
}

/// Writes a line that ends in its newline with one `write(2)`: stdout's line buffer passes
/// it straight through when it holds nothing, so a reader never sees it in pieces.
pub(crate) fn whole_line(line: &[u8]) {
    let mut out = std::io::stdout().lock();
    finish(out.write_all(line).and_then(|()| out.flush()));
}

/// Writes `value` as one line of JSON.
pub(crate) fn json(value: &impl Serialize) {
    match serde_json::to_string(value) {
        Ok(text) => line(format_args!("{text}")),
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
        eprintln!(
            "{}",
            serde_json::json!({ "warning": { "message": message } })
        );
    } else {
        eprintln!("liveness: warning: {message}");
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
