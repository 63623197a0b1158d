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
    /// Only the tests whose size `rounds` and `cases` set ([`SIZED`]): the rest is the
    /// test suite's own run, done again.
    pub sized: bool,
}

/// The tests of [`STEPS`] whose size the environment sets: the protocol fuzz (every test
/// of its step), the SIGKILLs mid-burst, the ring-buffer overflows and the live daemon's
/// fuzzed lines. A step none of whose tests is sized does not run.
const SIZED: &[(&str, &[&str])] = &[
    ("protocol fuzz: parser and line reader", &[]),
    (
        "faults around a real daemon",
        &[
            "sigkill_in_the_middle_of_a_burst_loses_and_repeats_nothing",
            "deaths_dropped_by_a_full_ring_buffer_end_once_by_reconcile",
            "garbage_lines_get_json_errors_and_change_nothing",
        ],
    ),
];

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
        let only = SIZED
            .iter()
            .find(|(step, _)| step == what)
            .map(|(_, tests)| *tests);
        if options.sized && only.is_none() {
            continue;
        }
        println!(
            "== chaos: {what} ({} rounds, {} inputs per fuzz target)",
            options.rounds, options.cases
        );
        let mut command = Command::new(&cargo);
        command
            .current_dir(root)
            .arg("test")
            .args(*args)
            // libtest runs the tests that match any of its filters.
            .args(only.filter(|_| options.sized).unwrap_or_default())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each sized step is a step, and each sized test is a test of its step: a renamed test
    /// would otherwise leave CI's chaos run filtering out everything, silently.
    #[test]
    fn every_sized_test_exists_in_its_step() {
        let root = crate::workspace_root();
        for (step, tests) in SIZED {
            let (_, args) = (STEPS.iter().find(|(what, _)| what == step))
                .unwrap_or_else(|| panic!("no step {step:?}"));
            let files: Vec<String> = (args.windows(2))
                .filter(|pair| pair[0] == "--test")
                .map(|pair| {
                    std::fs::read_to_string(
                        root.join("tests/tests").join(format!("{}.rs", pair[1])),
                    )
                    .unwrap()
                })
                .collect();
            for test in *tests {
                assert!(
                    files.iter().any(|f| f.contains(&format!("fn {test}()"))),
                    "{test} is no test of the step {step:?}"
                );
            }
        }
    }
}
