//! `cargo xtask chaos`: the fault suite on its own, with more rounds and inputs than an
//! ordinary test run. It needs root and a kernel with BTF, as the eBPF tests do.
//!
//! The tests read their sizes from the environment: `LIVENESS_FAULT_ROUNDS` (SIGKILLs
//! mid-burst, ring-buffer overflows) and `PROPTEST_CASES` (protocol fuzz inputs, for the
//! parser, the line reader and a live daemon alike).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

#[derive(Debug)]
pub struct Options {
    pub rounds: u32,
    pub cases: u32,
}

/// What runs, in order: the property tests of the parser and the line reader, the
/// integration tests that break things around a real daemon, then the stall tests: a
/// second uid attacks while a victim's deaths are timed and root's `status` asked.
const STEPS: &[(&str, &[&str])] = &[
    (
        "protocol fuzz: parser and line reader",
        &[
            "-p",
            "liveness-common",
            "-p",
            "liveness-daemon",
            "--lib",
            "--",
            "protocol::",
            "server::",
        ],
    ),
    (
        "faults around a real daemon",
        &[
            "-p",
            "integration-tests",
            "--test",
            "faults",
            "--test",
            "cursor_reset",
            "--",
            "--nocapture",
        ],
    ),
    (
        "SIGKILL at each point of the death path: after the append, after the publish, mid-replay",
        &[
            "-p",
            "integration-tests",
            "--test",
            "journal",
            "--",
            "--nocapture",
        ],
    ),
    (
        "fencing tokens past a restored or deleted state",
        &[
            "-p",
            "integration-tests",
            "--test",
            "locks",
            "--",
            "--nocapture",
            "tokens_grow_past_a_restored_or_deleted_state",
        ],
    ),
    (
        "no user stalls another's deaths",
        &[
            "-p",
            "integration-tests",
            "--test",
            "isolation",
            "--",
            "--nocapture",
        ],
    ),
];

pub fn run(root: &Path, options: &Options) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    for (what, args) in STEPS {
        println!(
            "== chaos: {what} ({} rounds, {} inputs per fuzz target)",
            options.rounds, options.cases
        );
        let mut command = Command::new(&cargo);
        command
            .current_dir(root)
            .arg("test")
            .args(*args)
            .env("LIVENESS_FAULT_ROUNDS", options.rounds.to_string())
            .env("PROPTEST_CASES", options.cases.to_string());
        // A fault test that skips proves nothing: here skipping is a failure.
        if std::env::var_os("LIVENESS_REQUIRE_EBPF").is_none() {
            command.env("LIVENESS_REQUIRE_EBPF", "1");
        }
        let status = command.status().context("running cargo test")?;
        if !status.success() {
            bail!("chaos: {what} failed ({status})");
        }
    }
    Ok(())
}
