//! A real release `livenessd` (the test kit's [`Daemon`]) and clients that speak its
//! public socket protocol.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
pub use integration_tests::{Conn, Daemon};
use serde_json::{Value, json};

use liveness_ebpf::record::FORK_PROGRAM_NAME;

use crate::bpf_stats;
use crate::procs::monotonic_ns;

/// One build of `livenessd` and `liveness` that a run measures: the one under test, and,
/// with `--baseline-bin-dir`, the baseline it is compared with.
#[derive(Debug, Clone)]
pub struct Build {
    pub bin_dir: PathBuf,
    /// Whether it is the baseline.
    pub baseline: bool,
}

impl Build {
    /// What the report calls it.
    pub fn name(&self) -> &'static str {
        if self.baseline { "base" } else { "new" }
    }

    /// Appended to a row's name for the baseline's figures.
    pub fn suffix(&self) -> &'static str {
        if self.baseline { "@base" } else { "" }
    }

    /// `livenessd`, as [`start`] does.
    pub fn start(&self, sources: &str, extra: &[&str]) -> Result<Daemon> {
        start(&self.bin_dir, sources, extra)
    }

    /// `liveness --socket SOCKET watch --json`, its output piped, its errors to `log`.
    pub fn watch(&self, socket: &Path, log: &Path) -> Result<std::process::Child> {
        std::process::Command::new(self.bin_dir.join("liveness"))
            .arg("--socket")
            .arg(socket)
            .args(["watch", "--json"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("starting liveness watch --json")
    }
}

/// Starts `livenessd --sources <sources> [extra]` from `bin_dir` on a fresh state
/// directory, logging at `info`, and waits until it answers.
pub fn start(bin_dir: &Path, sources: &str, extra: &[&str]) -> Result<Daemon> {
    let mut args = vec!["--sources", sources];
    args.extend(extra);
    let daemon = Daemon::start_release(&bin_dir.join("livenessd"), "info", &args);
    ready(&daemon)?;
    Ok(daemon)
}

/// Waits for a `status` reply: the engine answers only after it has reconciled every
/// ACTIVE owner.
pub fn ready(daemon: &Daemon) -> Result<()> {
    let status = daemon.request(json!({"op": "status"}));
    if status["ok"] != true {
        bail!("livenessd status failed: {status}");
    }
    Ok(())
}

/// Fails unless the daemon follows process trees in the kernel: its status says so and it
/// holds the fork program. Figures of a run without it would measure something else.
pub fn require_fork_tracking(daemon: &Daemon) -> Result<()> {
    let status = daemon.request(json!({"op": "status"}));
    let mode = &status["status"]["membership"]["mode"];
    if mode != "kernel" {
        bail!(
            "livenessd does not follow process trees in the kernel (membership mode {mode}); log: {}",
            daemon.log()
        );
    }
    if !bpf_stats::holds_program(daemon.pid(), FORK_PROGRAM_NAME)? {
        bail!("livenessd holds no {FORK_PROGRAM_NAME} eBPF program");
    }
    Ok(())
}

/// SIGTERM; an unclean exit is an error.
pub fn stop(daemon: &mut Daemon) -> Result<()> {
    let status = daemon.stop();
    if !status.success() {
        bail!("livenessd exited with {status}; log: {}", daemon.log());
    }
    Ok(())
}

/// A connection subscribed to the event stream (only new events), without a read timeout:
/// the reader, holding any lines that followed the acknowledgement in the same read.
pub fn subscribe(socket: &Path) -> Result<BufReader<UnixStream>> {
    let mut conn = Conn::connect(socket);
    let ack = conn.request(json!({"op": "subscribe"}));
    if ack["ok"] != true {
        bail!("subscribe failed: {ack}");
    }
    let (reader, _writer) = conn.into_parts();
    reader.get_ref().set_read_timeout(None)?;
    Ok(reader)
}

/// The next reply line.
fn read_reply(reader: &mut BufReader<UnixStream>) -> Result<Value> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        bail!("livenessd closed the connection");
    }
    Ok(serde_json::from_str(&line)?)
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
                    let (mut reader, writer) = Conn::connect(socket).into_parts();
                    reader.get_ref().set_read_timeout(None)?;
                    let mut writer = BufWriter::new(writer);
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
                            let reply = read_reply(&mut reader)?;
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
    /// With `livenessd --trace-hops`: the daemon's monotonic stamps of this death.
    pub hops: Option<Hops>,
}

/// The `hops` of an event (`livenessd --trace-hops`), CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
pub struct Hops {
    pub died_ns: Option<u64>,
    pub read_ns: u64,
    pub committed_ns: u64,
    pub published_ns: u64,
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
                hops: event.hops,
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
    hops: Option<Hops>,
}

/// A subscriber on its own thread: every `session.ended` goes to `events`, stamped with
/// the time its line was read. Ends when the daemon closes the stream.
#[derive(Debug)]
pub struct Subscriber {
    pub events: mpsc::Receiver<Ended>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Subscriber {
    /// A subscriber on the daemon's socket.
    pub fn start(socket: &Path) -> Result<Subscriber> {
        Ok(Subscriber::reading(subscribe(socket)?))
    }

    /// Reads stream lines from `reader`: a socket, or `liveness watch --json`'s output.
    pub fn reading(mut reader: impl BufRead + Send + 'static) -> Subscriber {
        let (tx, events) = mpsc::channel();
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
        Subscriber {
            events,
            thread: Some(thread),
        }
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
