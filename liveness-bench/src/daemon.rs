//! A real release `livenessd` and clients that speak its public socket protocol.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::procs::{monotonic_ns, wait_until};

#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    binary: PathBuf,
    args: Vec<String>,
    pub socket: PathBuf,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `livenessd --sources <sources> [extra]` on a fresh state directory.
    pub fn start(bin_dir: &Path, sources: &str, extra: &[&str]) -> Result<Daemon> {
        let dir = tempfile::Builder::new()
            .prefix("liveness-bench")
            .tempdir()?;
        let socket = dir.path().join("liveness.sock");
        let log = dir.path().join("livenessd.log");
        let mut args: Vec<String> = vec![
            "--socket".into(),
            socket.display().to_string(),
            "--state-dir".into(),
            dir.path().join("state").display().to_string(),
            "--log-file".into(),
            log.display().to_string(),
            "--sources".into(),
            sources.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut daemon = Daemon {
            child: None,
            binary: bin_dir.join("livenessd"),
            args,
            socket,
            log,
            _dir: dir,
        };
        daemon.spawn()?;
        Ok(daemon)
    }

    /// (Re)starts the process on the same state directory and waits until it answers:
    /// the engine answers only after it has reconciled every ACTIVE owner.
    pub fn spawn(&mut self) -> Result<()> {
        let child = Command::new(&self.binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let socket = self.socket.clone();
        if !wait_until(Duration::from_secs(30), || {
            UnixStream::connect(&socket).is_ok()
        }) {
            bail!(
                "livenessd did not listen within 30 s; log: {}",
                self.log_text()
            );
        }
        let status = Conn::connect(&self.socket)?.call(&json!({"op": "status"}))?;
        if status["ok"] != true {
            bail!("livenessd status failed: {status}");
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then SIGKILL if it has not stopped within 10 s.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("livenessd exited with {status}; log: {}", self.log_text());
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                child.kill()?;
                child.wait()?;
                bail!("livenessd did not stop within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One request/reply connection.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: BufWriter<UnixStream>,
}

impl Conn {
    pub fn connect(socket: &Path) -> Result<Conn> {
        let stream = UnixStream::connect(socket)
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(Conn {
            // Large reads: in a burst the harness must not be what holds up the stream.
            reader: BufReader::with_capacity(256 * 1024, stream.try_clone()?),
            writer: BufWriter::new(stream),
        })
    }

    pub fn call(&mut self, request: &Value) -> Result<Value> {
        self.send(request)?;
        self.writer.flush()?;
        self.read()
    }

    fn send(&mut self, request: &Value) -> Result<()> {
        serde_json::to_writer(&mut self.writer, request)?;
        self.writer.write_all(b"\n")?;
        Ok(())
    }

    /// A connection subscribed to the event stream (only new events).
    pub fn subscribe(socket: &Path) -> Result<Conn> {
        let mut conn = Conn::connect(socket)?;
        let ack = conn.call(&json!({"op": "subscribe"}))?;
        if ack["ok"] != true {
            bail!("subscribe failed: {ack}");
        }
        Ok(conn)
    }

    /// The socket and the bytes already read past the last reply (stream lines may follow
    /// the acknowledgement in the same read).
    pub fn into_parts(self) -> (UnixStream, Vec<u8>) {
        let buffered = self.reader.buffer().to_vec();
        (self.reader.into_inner(), buffered)
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("livenessd closed the connection");
        }
        Ok(serde_json::from_str(&line)?)
    }
}

/// Registers `session_of(pid)` for each PID, pipelined on `connections` connections (each
/// has a writer thread and reads replies as they come). Returns the wall time taken.
pub fn register_all(
    socket: &Path,
    pids: &[u32],
    session_of: impl Fn(u32) -> String + Sync,
    connections: usize,
) -> Result<Duration> {
    let started = Instant::now();
    let chunk = pids.len().div_ceil(connections.max(1)).max(1);
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = pids
            .chunks(chunk)
            .map(|part| {
                let session_of = &session_of;
                scope.spawn(move || -> Result<()> {
                    let mut conn = Conn::connect(socket)?;
                    let mut writer = BufWriter::new(conn.writer.get_ref().try_clone()?);
                    std::thread::scope(|inner| -> Result<()> {
                        let handle = inner.spawn(|| -> Result<()> {
                            for &pid in part {
                                let request = json!({
                                    "op": "register",
                                    "session": session_of(pid),
                                    "owner": {"pid": pid},
                                });
                                serde_json::to_writer(&mut writer, &request)?;
                                writer.write_all(b"\n")?;
                            }
                            writer.flush()?;
                            Ok(())
                        });
                        for &pid in part {
                            let reply = conn.read()?;
                            if reply["ok"] != true {
                                bail!("registering PID {pid} failed: {reply}");
                            }
                        }
                        handle
                            .join()
                            .map_err(|_| anyhow::anyhow!("writer panicked"))?
                    })
                })
            })
            .collect();
        for worker in workers {
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("registration thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(started.elapsed())
}

/// A `session.ended` event as the subscriber saw it.
#[derive(Debug, Clone)]
pub struct Ended {
    pub session: String,
    pub detected_by: String,
    /// CLOCK_MONOTONIC ns when the line was read off the socket.
    pub received_ns: u64,
    /// The event's `observed_ms` (when the daemon's source saw the death) and `at_ms` (when
    /// it was committed), both wall-clock milliseconds.
    pub observed_ms: i64,
    pub committed_ms: i64,
}

impl Ended {
    /// The `session.ended` event on a stream line (`liveness watch --json` prints the same
    /// lines), stamped `received_ns`; `None` for other events. A `lagged` notice is an
    /// error: the reader fell behind. Only the fields used are parsed, so that the reader
    /// is never what holds up the stream.
    pub fn parse(line: &str, received_ns: u64) -> Result<Option<Ended>> {
        let message: StreamLine<'_> = serde_json::from_str(line)
            .with_context(|| format!("unexpected stream line {line:?}"))?;
        if let Some(lagged) = message.lagged {
            bail!("the subscriber lagged: {lagged}");
        }
        Ok(message
            .event
            .filter(|e| e.kind == "session.ended")
            .map(|event| Ended {
                session: event.session.into_owned(),
                detected_by: event.detected_by.unwrap_or_default().into_owned(),
                received_ns,
                observed_ms: event.observed_ms.unwrap_or_default(),
                committed_ms: event.at_ms,
            }))
    }
}

/// The parts of a stream line the subscriber reads.
#[derive(Debug, serde::Deserialize)]
struct StreamLine<'a> {
    #[serde(borrow)]
    event: Option<EventFields<'a>>,
    lagged: Option<Value>,
}

#[derive(Debug, serde::Deserialize)]
struct EventFields<'a> {
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    session: Cow<'a, str>,
    #[serde(borrow)]
    detected_by: Option<Cow<'a, str>>,
    observed_ms: Option<i64>,
    at_ms: i64,
}

/// A subscriber on its own thread: every `session.ended` goes to `events`, stamped with
/// the time its line was read. Ends when the daemon closes the stream.
#[derive(Debug)]
pub struct Subscriber {
    pub events: mpsc::Receiver<Ended>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Subscriber {
    pub fn start(socket: &Path) -> Result<Subscriber> {
        let conn = Conn::subscribe(socket)?;
        let (tx, events) = mpsc::channel();
        // The reader keeps its buffer: lines may already follow the acknowledgement in it.
        let mut reader = conn.reader;
        let thread = std::thread::spawn(move || -> Result<()> {
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    return Ok(());
                }
                let received_ns = monotonic_ns();
                let Some(ended) = Ended::parse(&line, received_ns)? else {
                    continue;
                };
                if tx.send(ended).is_err() {
                    return Ok(());
                }
            }
        });
        Ok(Subscriber {
            events,
            thread: Some(thread),
        })
    }

    /// Waits for the `session.ended` of `session`; other sessions' events are kept in `seen`.
    pub fn wait_for(
        &self,
        session: &str,
        timeout: Duration,
        seen: &mut HashMap<String, Ended>,
    ) -> Option<Ended> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = seen.remove(session) {
                return Some(found);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.events.recv_timeout(left) {
                Ok(ended) if ended.session == session => return Some(ended),
                Ok(ended) => {
                    seen.insert(ended.session.clone(), ended);
                }
                Err(_) => return None,
            }
        }
    }

    /// The thread's error, if the stream broke (lagged, bad JSON). Call after the daemon stopped.
    pub fn finish(mut self) -> Result<()> {
        drop(self.events);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| anyhow::anyhow!("subscriber thread panicked"))?,
            None => Ok(()),
        }
    }
}
