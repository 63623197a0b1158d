//! Clients of a daemon: a raw protocol connection, one of another uid, and the CLI run as
//! another user.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use serde_json::Value;

use crate::{BinariesForAnyUser, Daemon, TestprocAs};

/// Runs the `liveness` CLI as user `uid` (and its group of the same number) against
/// `daemon`.
pub fn cli_as(binaries: &BinariesForAnyUser, daemon: &Daemon, uid: u32, args: &[&str]) -> Output {
    Command::new(binaries.path("liveness"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(args)
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run liveness as another user")
}

/// The JSON a command printed, failing the test with its output if it is none.
pub fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?} stderr {:?}",
            output.stdout,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// A raw protocol connection.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Conn {
    pub fn connect(socket: &Path) -> Conn {
        let stream = UnixStream::connect(socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let writer = stream.try_clone().expect("clone stream");
        Conn {
            // Large reads: in a burst the reader must not be what holds up the stream.
            reader: BufReader::with_capacity(256 * 1024, stream),
            writer,
        }
    }

    /// The reader, with the bytes already read past the last reply (stream lines may follow
    /// an acknowledgement in the same read), and the writer: for a caller that reads and
    /// writes on its own terms, such as a pipelining benchmark.
    pub fn into_parts(self) -> (BufReader<UnixStream>, UnixStream) {
        (self.reader, self.writer)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("write to livenessd");
    }

    pub fn request(&mut self, request: Value) -> Value {
        self.send_raw(format!("{request}\n").as_bytes());
        self.next_line()
            .unwrap_or_else(|| panic!("no reply to {request}"))
    }

    /// The next line, or `None` when the connection closed.
    pub fn next_line(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => None,
            Ok(_) => Some(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}")),
            ),
            Err(e) => panic!("reading from livenessd: {e}"),
        }
    }

    /// The next line within `timeout`, `None` if nothing arrives.
    pub fn next_within(&mut self, timeout: Duration) -> Option<Value> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout))
            .expect("read timeout");
        let mut line = String::new();
        let read = self.reader.read_line(&mut line);
        self.reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        match read {
            Ok(0) => None,
            Ok(_) => Some(
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}")),
            ),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("reading from livenessd: {e}"),
        }
    }

    /// Whether the daemon closed the connection within `wait`, found without reading from
    /// it: reading would make room for the daemon to write more.
    pub fn closed_by_daemon_within(&self, wait: Duration) -> bool {
        crate::eventually(wait, || {
            let mut socket = [PollFd::new(self.reader.get_ref(), PollFlags::RDHUP)];
            let ready = poll(&mut socket, Some(&Timespec::default())).expect("poll the socket");
            ready > 0 && socket[0].revents().contains(PollFlags::RDHUP)
        })
    }

    /// The next event of `kind` about `session`, skipping other lines; fails after `within`.
    pub fn next_event_of(&mut self, kind: &str, session: &str, within: Duration) -> Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Some(line) = self.next_within(left.max(Duration::from_millis(1))) else {
                panic!("no {kind} event for {session} within {within:?}");
            };
            let event = &line["event"];
            if event["kind"] == kind && event["session"] == session {
                return event.clone();
            }
        }
    }
}

/// A raw protocol connection of another uid (`testproc client`, run as that uid).
#[derive(Debug)]
pub struct ClientAs(pub TestprocAs);

impl ClientAs {
    pub fn connect(daemon: &Daemon, uid: u32) -> ClientAs {
        ClientAs(TestprocAs::spawn(
            uid,
            &["client", &daemon.socket.to_string_lossy()],
        ))
    }

    /// Sends a line; a connection the daemon already closed just does not take it.
    pub fn send(&mut self, request: &Value) {
        if let Some(to) = self.0.to.as_mut() {
            let _ = writeln!(to, "{request}");
        }
    }

    /// The next reply or stream line, or `None` once the connection closed.
    pub fn next_line(&mut self) -> Option<Value> {
        let line = self.0.read_line()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
    }

    pub fn request(&mut self, request: &Value) -> Option<Value> {
        self.send(request);
        self.next_line()
    }

    /// Waits until `processes` lists `count` processes in `session`'s tree (an owner's
    /// descendants join it off the engine, a slice at a time); fails the test with the
    /// last count otherwise.
    pub fn wait_for_tree(&mut self, session: &str, count: usize, within: Duration) {
        let mut listed = 0;
        let complete = crate::eventually(within, || {
            // One page of them all (at most 10,000).
            let request =
                serde_json::json!({"op": "processes", "session": session, "limit": 10_000});
            let reply = self.request(&request).expect("a reply to processes");
            listed = reply["processes"].as_array().map_or(0, Vec::len);
            listed == count
        });
        assert!(
            complete,
            "{listed} processes in the tree of {session}, not {count}"
        );
    }
}
