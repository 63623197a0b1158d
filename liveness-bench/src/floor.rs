//! The floor: what the kernel and the library's own exit source deliver with nothing else
//! around them. `EbpfSource` or `PidfdSource` runs alone in a process of its own (this binary
//! re-executed, see [`FLOOR_ARG`]) and stamps each `ExitObservation` the moment it leaves the
//! source's channel: no store, no engine, no stream.
//!
//! A process of its own, like the daemon, rather than a thread of the harness: the harness
//! forks the owners, and the same source inside it reported their exits about 0.3 ms later
//! than the daemon did (measured here, 200 interleaved samples each), a "floor" above what
//! it bounds.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use liveness_common::exit::DetectedBy;
use liveness_common::identity::ProcessKey;
use liveness_daemon::{Monitor, MonitorConfig, Selection};
use liveness_proc::identity::ProcRoot;

use crate::procs::monotonic_ns;

/// First argument that makes this binary a floor process: `FLOOR_ARG SOURCE`. It reads
/// batches of PIDs to track from stdin (a count, then the PIDs, all u32 LE) and writes
/// records to stdout: PID (u32 LE) and monotonic ns (u64 LE) per observed exit, [`ACK`] once
/// it started or tracked a whole batch, [`LOST`] if the kernel dropped exits.
pub const FLOOR_ARG: &str = "__floor";

const ACK: u32 = 0;
/// Stands for a death found by re-checking `/proc` after a kernel-side loss: no timing.
const LOST: u32 = u32::MAX;

/// A running floor process.
#[derive(Debug)]
pub struct Floor {
    child: Child,
    pids: ChildStdin,
    records: Receiver<(u32, u64)>,
}

impl Floor {
    /// Starts a floor process on the source `name` (`ebpf` or `pidfd`).
    pub fn start(name: &str) -> Result<Floor> {
        let mut child = Command::new(std::env::current_exe()?)
            .args([FLOOR_ARG, name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the floor process")?;
        let pids = child.stdin.take().context("the floor's stdin")?;
        let mut stdout = child.stdout.take().context("the floor's stdout")?;
        let (send, records) = std::sync::mpsc::channel();
        // Ends at the floor process's end of output.
        std::thread::spawn(move || {
            let mut record = [0u8; 12];
            while stdout.read_exact(&mut record).is_ok() {
                let pid = u32::from_le_bytes(record[..4].try_into().unwrap());
                let ns = u64::from_le_bytes(record[4..].try_into().unwrap());
                if send.send((pid, ns)).is_err() {
                    break;
                }
            }
        });
        let mut floor = Floor {
            child,
            pids,
            records,
        };
        floor.ack().context("the floor process did not start")?;
        Ok(floor)
    }

    /// Tracks these processes; returns once they all are.
    pub fn track(&mut self, pids: &[u32]) -> Result<()> {
        let count = u32::try_from(pids.len()).context("too many PIDs for one batch")?;
        let bytes: Vec<u8> = std::iter::once(count)
            .chain(pids.iter().copied())
            .flat_map(u32::to_le_bytes)
            .collect();
        self.pids.write_all(&bytes)?;
        self.pids.flush()?;
        self.ack()
            .context("the floor process did not track the owners")
    }

    fn ack(&mut self) -> Result<()> {
        match self.record(Duration::from_secs(10))? {
            (ACK, _) => Ok(()),
            (pid, _) => bail!("the exit of {pid} came before the acknowledgement"),
        }
    }

    /// The next exit: its PID and the monotonic ns at which it left the source.
    pub fn next(&mut self, timeout: Duration) -> Result<(u32, u64)> {
        match self.record(timeout)? {
            (ACK, _) => bail!("an acknowledgement came where an exit was due"),
            record => Ok(record),
        }
    }

    fn record(&mut self, timeout: Duration) -> Result<(u32, u64)> {
        match self.records.recv_timeout(timeout) {
            Ok((LOST, total)) => bail!("the floor's kernel source lost {total} exits"),
            Ok(record) => Ok(record),
            Err(RecvTimeoutError::Timeout) => {
                bail!("nothing reached the floor within {timeout:?}")
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait()?;
                bail!("the floor process ended ({status})")
            }
        }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor process: see [`FLOOR_ARG`]. The source runs inside the library's `Monitor`,
/// selected alone, which reads the eBPF ring buffer in its own task as the daemon's engine
/// does; the stamp is taken where the observation leaves it.
pub fn floor_main(name: &str) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let selection: Selection = name.parse().map_err(anyhow::Error::msg)?;
    let mut monitor = runtime.block_on(Monitor::start(MonitorConfig {
        selection,
        ..MonitorConfig::default()
    }))?;
    let output = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let write = |output: &std::sync::Mutex<std::io::Stdout>, pid: u32, value: u64| {
        let mut record = [0u8; 12];
        record[..4].copy_from_slice(&pid.to_le_bytes());
        record[4..].copy_from_slice(&value.to_le_bytes());
        let mut output = output.lock().unwrap_or_else(|p| p.into_inner());
        output.write_all(&record).and_then(|()| output.flush())
    };
    // Batches of keys to track, each acknowledged once tracked.
    let (batches, mut to_track) = tokio::sync::mpsc::channel::<Vec<ProcessKey>>(1);
    let stamps = std::sync::Arc::clone(&output);
    let watcher = runtime.spawn(async move {
        loop {
            tokio::select! {
                observation = monitor.next() => {
                    let record = match observation.detected_by {
                        DetectedBy::Reconcile => (LOST, 1),
                        _ => (observation.key.pid, monotonic_ns()),
                    };
                    if write(&stamps, record.0, record.1).is_err() {
                        return;
                    }
                }
                batch = to_track.recv() => {
                    let Some(batch) = batch else { return };
                    for key in batch {
                        // A process already dead is reported like any other exit.
                        if let Some(observation) = monitor.track(key)
                            && write(&stamps, observation.key.pid, monotonic_ns()).is_err()
                        {
                            return;
                        }
                    }
                    if write(&stamps, ACK, 0).is_err() {
                        return;
                    }
                }
            }
        }
    });
    write(&output, ACK, 0)?;
    let proc = ProcRoot::default();
    let mut input = std::io::stdin().lock();
    let mut count = [0u8; 4];
    loop {
        // A batch larger than a pipe's atomic write arrives in pieces: the count says when
        // it is whole, so the acknowledgement never comes early.
        match input.read_exact(&mut count) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e.into()),
        }
        let mut batch = vec![0u8; 4 * u32::from_le_bytes(count) as usize];
        input.read_exact(&mut batch)?;
        let keys = batch
            .chunks_exact(4)
            .map(|chunk| {
                let pid = u32::from_le_bytes(chunk.try_into().unwrap());
                Ok(ProcessKey {
                    pid,
                    start_ticks: proc.stat(pid)?.start_ticks,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if batches.blocking_send(keys).is_err() {
            break;
        }
    }
    drop(batches);
    runtime.block_on(watcher)?;
    Ok(())
}
