//! The test kit of the integration tests and the benchmark harness (`liveness-bench`), by
//! job: the real binaries ([`binary`]), real processes whose death the caller decides
//! ([`spawn_orphan`], [`Orphan`]) with `/proc` read by the daemon's own parser
//! ([`proc_root`]), a real daemon on a private socket and state directory ([`Daemon`]),
//! its clients ([`Conn`], [`ClientAs`]), other users' processes ([`TestprocAs`]), and a real
//! etcd on loopback ([`Etcd`]). It
//! depends on nothing test-only, so the benchmark can link it.
//!
//! Binaries: `LIVENESS_BIN_DIR` names a directory holding `livenessd`, `liveness` and
//! `testproc` (for VMs, where there is no cargo); otherwise they are built once per test
//! binary with the cargo that runs the tests, so a stale binary is never tested.

use std::path::Path;
use std::time::{Duration, Instant};

mod binaries;
mod bpf;
mod clients;
mod daemon;
mod etcd;
mod processes;
mod smallfs;
mod users;

pub use binaries::*;
pub use bpf::*;
pub use clients::*;
pub use daemon::*;
pub use etcd::*;
pub use processes::*;
pub use smallfs::*;
pub use users::*;

/// How many rounds a fault test repeats: `normal` in an ordinary test run, or
/// `LIVENESS_FAULT_ROUNDS` (which `cargo xtask chaos` sets higher).
pub fn fault_rounds(normal: usize) -> usize {
    match std::env::var("LIVENESS_FAULT_ROUNDS") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("LIVENESS_FAULT_ROUNDS={text:?} is not a number of rounds")),
        Err(_) => normal,
    }
}

/// Whether privileged tests can run here (root, BTF). When they cannot, prints why and
/// returns false — unless `LIVENESS_REQUIRE_EBPF=1`, where skipping is a failure.
pub fn privileged(test: &str) -> bool {
    let why = if !rustix::process::geteuid().is_root() {
        Some("not running as root")
    } else if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("the kernel has no BTF (/sys/kernel/btf/vmlinux)")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var("LIVENESS_REQUIRE_EBPF").as_deref() == Ok("1") => {
            panic!("{test}: LIVENESS_REQUIRE_EBPF=1 but {why}")
        }
        Some(why) => {
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
