//! `cargo xtask vm-test`: the test suite inside small virtual machines that boot other
//! kernels.
//!
//! Each kernel boots (QEMU) into a busybox initramfs that holds the test binaries and the
//! project's binaries (release builds, with their shared libraries), and nothing else: no
//! systemd, no network, no cargo.
//! The guest's `/init` runs every test binary as root with `LIVENESS_REQUIRE_EBPF=1` and
//! prints one `VMTEST result NAME STATUS` line per binary on the serial console, which is
//! read here, along with libtest's own `test NAME ... ok` lines, so the run ends with a
//! matrix of kernel × test binary (and each leg of the forced-fallback tests).
//!
//! Kernels are Debian's cloud kernels (virtio and BTF built in), fetched with
//! `apt-get download` and cached under `target/vm-test`. Those of older Debian releases
//! (5.10 is bullseye's) come through a private apt configuration under
//! `target/vm-test/apt`: its own sources list naming the system's Debian mirror with the
//! older suite, its own state and cache; the system's apt sources are never touched.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// The kernels tested when none is named: the oldest LTS line with BTF and the ring buffer
/// (5.10) and the two Debian LTS lines before the development machines' own. Those between
/// the first and the last run [`BETWEEN_SUITE`] unless `--full` is asked.
pub const DEFAULT_KERNELS: &[&str] = &["5.10", "6.1", "6.12"];

/// What a default kernel between the oldest and the newest runs: the binaries whose
/// outcome its verifier and its BTF decide (every program loads, and the fields it reads
/// give exact facts, causes, namespaces and fallbacks). The rest of the kernel suite
/// (lineage and sources, which read the same fields through the same programs, the reaper,
/// cgroups, namespaces, the daemon's and `/proc`'s unit tests) depends on features that the
/// oldest and the newest bound; `--kernel` or `--full` runs it there.
const BETWEEN_SUITE: &[&str] = &["exit_facts", "causes", "ebpf_namespaces", "fallbacks"];

/// Kernel lines of older Debian releases, by the suite that ships them.
const ARCHIVED_SUITES: &[(&str, &str)] = &[("5.10", "bullseye")];

/// The test binary whose tests are each a forced-fallback leg, shown one by one.
const LEGS_BINARY: &str = "fallbacks";

const TARGET: &str = "x86_64-unknown-linux-gnu";
/// Every crate whose tests run in the guests, and those that build the programs.
const PACKAGES: &[&str] = &[
    "liveness-common",
    "liveness-proc",
    "liveness-client",
    "liveness-cli",
    "liveness-daemon",
    "integration-tests",
];
/// The binaries the tests run, from `LIVENESS_BIN_DIR` (`/bin` in the guest).
/// The client crate's example is one of them: a test runs it against a restarted daemon.
const PROGRAMS: &[&str] = &[
    "livenessd",
    "liveness",
    "testproc",
    "seccomp-deny",
    "dying",
    "wait_for_exit",
];
/// The programs the guests' tests take from the release build, as they ship.
const SHIPPED: &[&str] = &["livenessd", "liveness"];
/// The benchmark harness, built (and put in `/bin`) for `--bench` alone.
pub(crate) const BENCH: &str = "liveness-bench";
const INSTALL_HINT: &str =
    "apt-get install -y qemu-system-x86 busybox-static bash-static cpio binutils";
/// util-linux tools the tests run, copied from the host with their shared libraries.
/// (`flock`: busybox has no such applet; the fault suite's end actions lock with it.)
const UTIL_LINUX: &[&str] = &["unshare", "nsenter", "prlimit", "flock"];
/// The modules that give sock_diag its TCP handler (liveness-proc's `sockets`), in load
/// order. Debian's kernels build them as modules, which the guest (no module tree, no
/// modprobe) would not load by itself: /init loads each kernel's copy.
const DIAG_MODULES: &[&str] = &["inet_diag", "tcp_diag"];

/// What `cargo xtask vm-test` was asked to do.
#[derive(Debug)]
pub struct Options {
    /// Debian kernel versions (`6.1`) or paths to kernel images.
    pub kernels: Vec<String>,
    /// Passed to every test binary: only tests whose name contains it run.
    pub filter: Option<String>,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// How long one kernel's whole run may take.
    pub timeout: Duration,
    /// QEMU accelerator: `tcg` (software; works everywhere) or `kvm`.
    pub accel: String,
    /// Every test binary, not only [`KERNEL_SUITE`].
    pub full: bool,
    /// The kernels are the default ones: those between the first and the last run
    /// [`BETWEEN_SUITE`] only, unless `full`.
    pub defaults: bool,
    /// Instead of the tests: this part of the benchmark harness (see [`bench`]).
    pub bench: Option<String>,
}

pub fn run(root: &Path, options: &Options) -> Result<()> {
    ensure!(
        std::env::consts::ARCH == "x86_64",
        "vm-test boots x86-64 guests; this is {}",
        std::env::consts::ARCH
    );
    let work = root.join("target/vm-test");
    std::fs::create_dir_all(&work)?;
    let busybox = static_tool("busybox")?;
    let bash = static_tool("bash-static")?;
    for tool in ["qemu-system-x86_64", "cpio"] {
        which(tool, INSTALL_HINT)?;
    }

    let built = build(root, &work, options)?;
    let images = options
        .kernels
        .iter()
        .map(|kernel| Ok((kernel, kernel_image(&work, kernel)?)))
        .collect::<Result<Vec<_>>>()?;
    let initrd = work.join("initrd.gz");
    make_initrd(&work, &built, &busybox, &bash, options, &images, &initrd)?;
    if let Some(part) = &options.bench {
        return bench(&work, part, &images, &initrd, options);
    }

    let mut failures = Vec::new();
    let mut columns = Vec::new();
    let count = images.len();
    for (i, (kernel, image)) in images.into_iter().enumerate() {
        let log = work.join(format!("{}.log", sanitize(kernel)));
        let started = Instant::now();
        let between = options.defaults && !options.full && i > 0 && i + 1 < count;
        let only: Vec<&str> = match between {
            true => (built.tests.iter())
                .map(|(name, _)| name.as_str())
                .filter(|name| BETWEEN_SUITE.contains(name))
                .collect(),
            false => built.tests.iter().map(|(name, _)| name.as_str()).collect(),
        };
        let only = between.then_some(&only[..]);
        let mut outcome = boot(&image, &initrd, &log, options, only)?;
        if outcome.trapped_on_code_patching() {
            println!(
                "--- {kernel}: the guest's kernel stopped on a breakpoint of its own code \
                 patching (QEMU's TCG, see Outcome::trapped_on_code_patching), in {}; \
                 booting it once more",
                outcome.running.as_deref().unwrap_or("its boot")
            );
            for line in outcome.kernel_report.iter().take(4) {
                println!("{line}");
            }
            outcome = boot(&image, &initrd, &log, options, only)?;
        }
        println!(
            "kernel {} ({}): {} test binaries in {:.0} s, log {}",
            outcome.kernel.as_deref().unwrap_or("?"),
            kernel,
            outcome.results.len(),
            started.elapsed().as_secs_f64(),
            log.display()
        );
        let mut slowest = outcome.elapsed.clone();
        slowest.sort_by_key(|(_, took)| std::cmp::Reverse(*took));
        let took: Vec<String> = slowest
            .iter()
            .map(|(name, took)| format!("{name} {:.0}", took.as_secs_f64()))
            .collect();
        println!("  seconds per binary: {}", took.join(", "));
        for (name, status) in &outcome.results {
            if *status != 0 {
                failures.push(format!("{kernel}: {name} (exit status {status})"));
            }
        }
        if !outcome.failure_text.is_empty() {
            println!("--- {kernel}: failed tests, as the guest printed them");
            for line in &outcome.failure_text {
                println!("{line}");
            }
        }
        if !outcome.finished {
            if let Some(binary) = &outcome.running {
                let test = outcome.unfinished.as_deref().unwrap_or("(not named yet)");
                println!("--- {kernel}: the guest stopped in {binary}, test {test}");
            }
            if !outcome.kernel_report.is_empty() {
                println!("--- {kernel}: the kernel's first report of trouble");
                for line in &outcome.kernel_report {
                    println!("{line}");
                }
            }
            println!("--- {kernel}: the guest's last console lines");
            for line in &outcome.tail {
                println!("{line}");
            }
            failures.push(format!(
                "{kernel}: the guest did not finish (timed out or crashed); see {}",
                log.display()
            ));
        } else if outcome.results.len() != only.map_or(built.tests.len(), <[_]>::len) {
            failures.push(format!(
                "{kernel}: {} of the test binaries reported",
                outcome.results.len(),
            ));
        }
        columns.push((kernel.clone(), outcome));
    }
    print!("{}", matrix(&built.tests, &columns));
    if failures.is_empty() {
        println!("vm-test: every test binary passed on every kernel");
        Ok(())
    } else {
        bail!("vm-test failed:\n  {}", failures.join("\n  "))
    }
}

/// Kernel × test binary, pass or fail, with the forced-fallback tests one row each.
fn matrix(tests: &[(String, PathBuf)], columns: &[(String, Outcome)]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    for (name, _) in tests {
        let binary_cell = |outcome: &Outcome| {
            match outcome.results.iter().find(|(n, _)| n == name) {
                Some((_, 0)) => "ok",
                Some(_) => "FAILED",
                None => "-",
            }
            .to_owned()
        };
        rows.push((
            name.clone(),
            columns.iter().map(|(_, o)| binary_cell(o)).collect(),
        ));
        if name != LEGS_BINARY {
            continue;
        }
        let mut legs: Vec<&str> = columns
            .iter()
            .flat_map(|(_, o)| o.tests.iter())
            .filter(|(binary, _, _)| binary == LEGS_BINARY)
            .map(|(_, test, _)| test.as_str())
            .collect();
        legs.sort_unstable();
        legs.dedup();
        for leg in legs {
            let leg_cell = |outcome: &Outcome| {
                outcome
                    .tests
                    .iter()
                    .find(|(binary, test, _)| binary == LEGS_BINARY && test == leg)
                    .map_or_else(|| "-".to_owned(), |(_, _, verdict)| verdict.clone())
            };
            rows.push((
                format!("  {leg}"),
                columns.iter().map(|(_, o)| leg_cell(o)).collect(),
            ));
        }
    }
    const CORNER: &str = "test binary \\ kernel";
    let width = rows
        .iter()
        .map(|(name, _)| name.len())
        .chain([CORNER.len()])
        .max()
        .unwrap_or(0);
    let mut text = format!("{CORNER:<width$}");
    for (kernel, outcome) in columns {
        text += &format!(
            "  {:<10}",
            outcome
                .kernel
                .as_deref()
                .map_or(kernel.as_str(), |k| k.split('-').next().unwrap_or(k))
        );
    }
    text.push('\n');
    for (name, cells) in rows {
        text += &format!("{name:<width$}");
        for cell in cells {
            text += &format!("  {cell:<10}");
        }
        text.push('\n');
    }
    text
}

/// The test binaries and programs for the guest, by name.
#[derive(Debug)]
pub(crate) struct Built {
    tests: Vec<(String, PathBuf)>,
    pub programs: Vec<(String, PathBuf)>,
}

/// Test binaries that test nothing of the kernel and need what the busybox guest has
/// not: the repository's docs (`architecture`), python3 and node (`hooks_claude_code`,
/// `hooks_agents`), the user databases, a shell and coreutils for end actions run as a
/// user (`end_actions`). They run on the host, in `cargo test`.
const HOST_ONLY: &[&str] = &[
    "architecture",
    "hooks_claude_code",
    "hooks_agents",
    "end_actions",
];

/// The test binaries run in each guest unless `--full` is asked: those whose outcome
/// depends on the kernel (the eBPF programs and their verifier, pidfds, namespaces, process
/// trees and lineage, signals and their causes, the reaper, the forced fallbacks), each
/// with the test name filters it runs under (none: all its tests). The daemon's unit tests
/// are narrowed to its exit sources, reaper and process identity. The rest (the protocol,
/// the CLI, the store, locks, the fault and isolation suites) behaves alike on every
/// kernel; under emulation it would triple the time of each guest, so CI runs it on the
/// host only and `cargo xtask vm-test --full` runs it in the guests too.
const KERNEL_SUITE: &[(&str, &[&str])] = &[
    ("liveness_proc", &[]),
    ("liveness_daemon", &["source::", "reap::", "identity::"]),
    ("exit_facts", &[]),
    ("ebpf_namespaces", &[]),
    ("causes", &[]),
    ("fallbacks", &[]),
    ("namespaces", &[]),
    ("trees", &[]),
    ("reap", &[]),
    ("sources", &[]),
    ("cgroups", &[]),
];

/// The kernel suite's binaries that are crates' unit tests (built by `--lib`); the others
/// are integration tests (`--test NAME`).
const SUITE_LIBS: &[&str] = &["liveness_proc", "liveness_daemon"];

/// Tests left out in the guest, by binary and name (`--skip`), which run on the host in
/// `cargo test`: the daemon's end-action runner needs the user databases and coreutils
/// (see [`HOST_ONLY`]); a cleanup's stored outcome is read back with a survivor started
/// through a link with a terminal escape in its name, which busybox's multi-call `sleep`
/// takes for an applet name it does not know; and a pid taken again within its owner's or
/// member's clock tick needs a fork, a registration and another fork within one 10 ms
/// tick, which an emulated guest (QEMU without KVM) seldom fits in a few hundred tries.
const GUEST_SKIPS: &[(&str, &str)] = &[
    ("liveness_daemon", "action::"),
    (
        "reap",
        "get_says_what_a_cleanup_terminated_and_killed_also_after_a_restart",
    ),
    ("trees", "a_stranger_that_took_a_members_pid_in_its_tick"),
    ("namespaces", "a_same_tick_impostor"),
];

/// The test binaries and programs for the guest, in release: under emulation, debug code
/// made the kernel suite's in-process tests (the eBPF reader's, `sources`) more than twice
/// as slow.
///
/// For the tests, they are built in the workspace's own target directory and linked
/// dynamically (the guest gets their shared libraries, see [`make_initrd`]), so that they
/// share what they can with the other release builds; the daemon and the CLI are those
/// that ship, from the release build `cargo xtask dist` makes (in CI, already made).
/// `--full` builds everything with debug assertions, which the fault suite's kill points
/// need, the daemon included.
///
/// For `--bench`: the harness and the programs linked statically, in a target directory
/// of their own, as the systemd guest (another glibc) runs them too.
pub(crate) fn build(root: &Path, work: &Path, options: &Options) -> Result<Built> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let bench = options.bench.is_some();
    let (packages, programs) = match bench {
        true => ([PACKAGES, &[BENCH]].concat(), [PROGRAMS, &[BENCH]].concat()),
        false => (PACKAGES.to_vec(), PROGRAMS.to_vec()),
    };
    let artifacts = |args: &[&str], packages: &[&str]| -> Result<Vec<serde_json::Value>> {
        let mut command = Process::new(&cargo);
        command
            .current_dir(root)
            .args(args)
            .arg("--message-format=json-render-diagnostics")
            .args(packages.iter().flat_map(|package| ["-p", package]))
            .stderr(Stdio::inherit())
            .arg("--release");
        if bench {
            command
                .args(["--target", TARGET])
                .env("RUSTFLAGS", "-C target-feature=+crt-static")
                .env("CARGO_TARGET_DIR", work.join("build"))
                .env("CARGO_PROFILE_RELEASE_DEBUG", "false");
        } else if options.full {
            command.env("CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS", "true");
        }
        let output = command.output().context("running cargo")?;
        ensure!(output.status.success(), "cargo {} failed", args.join(" "));
        Ok(output
            .stdout
            .split(|&b| b == b'\n')
            .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["executable"].is_string())
            .collect())
    };
    let kind = |m: &serde_json::Value| m["target"]["kind"][0].as_str().unwrap_or("").to_owned();
    let named = |m: &serde_json::Value| {
        (
            m["target"]["name"].as_str().unwrap_or("").to_owned(),
            PathBuf::from(m["executable"].as_str().unwrap_or("")),
        )
    };
    let program = |m: &&serde_json::Value| {
        m["profile"]["test"] == false
            && matches!(kind(m).as_str(), "bin" | "example")
            && programs.contains(&m["target"]["name"].as_str().unwrap_or(""))
    };
    // Each test binary is a release build and link of its own: without `--full`, only the
    // kernel suite's are built. The test helpers (`testproc`, ...) come with them.
    let mut test_args = vec!["test", "--no-run"];
    if !options.full {
        test_args.push("--lib");
        for (name, _) in KERNEL_SUITE.iter().filter(|(n, _)| !SUITE_LIBS.contains(n)) {
            test_args.extend(["--test", name]);
        }
    }
    let (tests, mut built) = if bench {
        (Vec::new(), Vec::new())
    } else {
        let made = artifacts(&test_args, &packages)?;
        let tests = (made.iter())
            .filter(|m| m["profile"]["test"] == true && matches!(kind(m).as_str(), "lib" | "test"))
            .map(named)
            .filter(|(name, _)| !HOST_ONLY.contains(&name.as_str()))
            .filter(|(name, _)| options.full || KERNEL_SUITE.iter().any(|(suite, _)| suite == name))
            .collect::<Vec<_>>();
        (tests, made.iter().filter(program).map(named).collect())
    };
    if bench || options.full {
        let made = artifacts(&["build", "--bins", "--examples"], &packages)?;
        built.extend(made.iter().filter(program).map(named));
    } else {
        // The client's example alone: its small crate builds in seconds.
        let made = artifacts(&["build", "--examples"], &["liveness-client"])?;
        built.extend(made.iter().filter(program).map(named));
        crate::dist::build(root, "release", crate::dist::SHIPPED_FEATURES, None)?;
        let release = crate::target_dir(root).join("release");
        built.extend(
            SHIPPED
                .iter()
                .map(|name| (name.to_string(), release.join(name))),
        );
    }
    built.sort();
    built.dedup_by(|a, b| a.0 == b.0);
    ensure!(
        built.len() == programs.len(),
        "built {} of the programs {programs:?}",
        built.len()
    );
    ensure!(!tests.is_empty() || bench, "cargo built no test binaries");
    Ok(Built {
        tests,
        programs: built,
    })
}

/// The guest's `/init`: mounts what the tests need, runs each test binary (or the bench),
/// powers off.
fn init_script(tests: &[(String, PathBuf)], options: &Options) -> String {
    let run = match &options.bench {
        Some(part) => bench_run(part),
        None => tests_run(tests, options),
    };
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# Pseudo-terminals, for the hang-up test.
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
hostname liveness-vm
# A full cgroup2 hierarchy, away from /sys/fs/cgroup: the daemon must find it in mountinfo.
mkdir -p /run/cgroup2
mount -t cgroup2 none /run/cgroup2
# Loopback, for the metrics listener's test.
ip link set lo up
# sock_diag's TCP handler, where the kernel has it as modules (see DIAG_MODULES in vm.rs).
for module in {modules}; do
    if [ -f /lib/modules/$(uname -r)/$module.ko ]; then
        insmod /lib/modules/$(uname -r)/$module.ko
    fi
done
echo "VMTEST kernel $(uname -r)"
{run}echo "VMTEST done"
poweroff -f
"#,
        modules = DIAG_MODULES.join(" "),
    )
}

/// The part of the guest's `/init` that runs each test binary.
fn tests_run(tests: &[(String, PathBuf)], options: &Options) -> String {
    let filter = options
        .filter
        .as_deref()
        .map(|f| format!(" '{}'", f.replace('\'', "")))
        .unwrap_or_default();
    let names: Vec<&str> = tests.iter().map(|(name, _)| name.as_str()).collect();
    let skips: String = GUEST_SKIPS
        .iter()
        .map(|(name, test)| format!("        {name}) skip=\"--skip {test}\" ;;\n"))
        .collect();
    // A filter asked for replaces the suite's own.
    let narrowed: String = if options.filter.is_some() {
        String::new()
    } else {
        KERNEL_SUITE
            .iter()
            .filter(|(_, filters)| !filters.is_empty())
            .map(|(name, filters)| format!("        {name}) only=\"{}\" ;;\n", filters.join(" ")))
            .collect()
    };
    format!(
        r#"names="{names}"
# The binaries the host asked for on the command line, if it did (see BETWEEN_SUITE).
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        vmtest.only=*) names=$(echo "${{arg#vmtest.only=}}" | tr , ' ') ;;
    esac
done
for name in $names; do
    echo "VMTEST start $name"
    # Tests that run on the host only (see GUEST_SKIPS in vm.rs).
    skip=
    case "$name" in
{skips}    esac
    # The tests of the binary the kernel suite narrows it to (see KERNEL_SUITE).
    only=
    case "$name" in
{narrowed}    esac
    # A binary that hangs is killed, so the others still run and the hung test is named
    # (the echo ends libtest's unfinished `test NAME ... ` line).
    LIVENESS_BIN_DIR=/bin LIVENESS_REQUIRE_EBPF=1 LIVENESS_REQUIRE_CGROUP2=1 RUST_BACKTRACE=1 \
        timeout -s KILL {binary_timeout} /tests/$name --test-threads=1 $skip $only{filter} 2>&1
    status=$?
    echo
    echo "VMTEST result $name $status"
done
"#,
        names = names.join(" "),
        binary_timeout = BINARY_TIMEOUT.as_secs(),
    )
}

/// The part of the guest's `/init` that runs one part of the benchmark harness against a
/// daemon of its own, its output and JSON on the console line by line (`VMOUT`,
/// `VMBENCH`), then its exit status (`VMTEST bench STATUS`); see [`BenchOutput`].
fn bench_run(part: &str) -> String {
    let part = part.replace('\'', "");
    format!(
        r#"LIVENESS_REQUIRE_CGROUP2=1 {BENCH} --bin-dir /bin --part '{part}' --json /tmp/bench.json \
    >/tmp/bench.out 2>&1
status=$?
{}"#,
        bench_report("/tmp")
    )
}

/// Shell lines that print a bench's output and JSON (left in `dir`) and its `$status` on
/// the console, as [`BenchOutput`] reads them.
pub(crate) fn bench_report(dir: &str) -> String {
    format!(
        "sed 's/^/VMOUT /' {dir}/bench.out\n\
         [ -f {dir}/bench.json ] && sed 's/^/VMBENCH /' {dir}/bench.json\n\
         echo \"VMTEST bench $status\"\n"
    )
}

/// What a guest that ran a bench printed: its output, its JSON, its exit status.
#[derive(Debug, Default)]
pub(crate) struct BenchOutput {
    pub output: Vec<String>,
    pub json: String,
    pub status: Option<i32>,
}

impl BenchOutput {
    pub fn record(&mut self, line: &str) {
        if let Some(at) = line.find("VMOUT ") {
            self.output.push(line[at + 6..].to_owned());
        } else if let Some(at) = line.find("VMBENCH ") {
            self.json += &line[at + 8..];
            self.json.push('\n');
        } else if let Some(at) = line.find("VMTEST bench ") {
            self.status = line[at + 13..].trim().parse().ok();
        }
    }

    /// Prints the output, writes the JSON to `json`; fails unless the bench exited 0.
    pub fn finish(&self, what: &str, json: &Path) -> Result<()> {
        println!("--- {what}: the bench's output");
        for line in &self.output {
            println!("{line}");
        }
        if !self.json.is_empty() {
            std::fs::write(json, &self.json)
                .with_context(|| format!("writing {}", json.display()))?;
            println!("--- {what}: JSON written to {}", json.display());
        }
        match self.status {
            Some(0) => Ok(()),
            Some(status) => bail!("{what}: the bench failed (exit status {status})"),
            None => bail!("{what}: the bench did not finish (timed out or crashed)"),
        }
    }
}

/// `--bench PART`: each kernel boots and runs the part instead of the tests.
fn bench(
    work: &Path,
    part: &str,
    images: &[(&String, PathBuf)],
    initrd: &Path,
    options: &Options,
) -> Result<()> {
    let mut failures = Vec::new();
    for (kernel, image) in images {
        let log = work.join(format!("bench-{}.log", sanitize(kernel)));
        let mut qemu = qemu(options);
        qemu.arg("-kernel")
            .arg(image)
            .arg("-initrd")
            .arg(initrd)
            .args(["-append", "console=ttyS0 panic=-1 quiet"]);
        let mut output = BenchOutput::default();
        run_guest(qemu, &log, options.timeout, |line| output.record(line))?;
        let json = work.join(format!(
            "bench-{}-{}.json",
            sanitize(kernel),
            sanitize(part)
        ));
        if let Err(e) = output.finish(&format!("kernel {kernel}"), &json) {
            failures.push(format!("{e:#}; log {}", log.display()));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("vm-test --bench failed:\n  {}", failures.join("\n  "))
    }
}

fn make_initrd(
    work: &Path,
    built: &Built,
    busybox: &Path,
    bash: &Path,
    options: &Options,
    images: &[(&String, PathBuf)],
    initrd: &Path,
) -> Result<()> {
    let staging = work.join("initramfs");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    for dir in ["bin", "tests", "proc", "sys", "dev", "tmp", "run"] {
        std::fs::create_dir_all(staging.join(dir))?;
    }
    let copy = |from: &Path, to: PathBuf| {
        std::fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))
    };
    copy(busybox, staging.join("bin/busybox"))?;
    // Tests run hooks through `bash -c`; busybox has no bash.
    copy(bash, staging.join("bin/bash"))?;
    // A dynamically linked program's libraries come along, at the paths the loader looks
    // in; debug info is left behind (it would triple the initramfs; backtraces keep their
    // symbols).
    let install = |from: &Path, to: PathBuf| -> Result<()> {
        run_to_end(
            Process::new("objcopy")
                .arg("--strip-debug")
                .arg(from)
                .arg(&to),
        )?;
        for library in shared_libraries(from)? {
            let to = staging.join(library.strip_prefix("/").unwrap_or(&library));
            if !to.exists() {
                std::fs::create_dir_all(to.parent().context("a library path has a parent")?)?;
                copy(&library, to)?;
            }
        }
        Ok(())
    };
    // Namespace tests need util-linux's options (`--time`, `--kill-child`) that busybox's
    // applets lack. Installed first, busybox's same-named links do not replace them.
    for tool in UTIL_LINUX {
        install(&which(tool, INSTALL_HINT)?, staging.join("bin").join(tool))?;
    }
    for (name, path) in &built.programs {
        install(path, staging.join("bin").join(name))?;
    }
    for (name, path) in &built.tests {
        install(path, staging.join("tests").join(name))?;
    }
    for (_, image) in images {
        copy_diag_modules(image, &staging)?;
    }
    let init = staging.join("init");
    std::fs::write(&init, init_script(&built.tests, options))?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    run_to_end(
        Process::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(initrd)
            .current_dir(&staging),
    )
}

/// Copies the [`DIAG_MODULES`] unpacked beside the kernel `image` (`boot/vmlinuz-VERSION`,
/// modules under `lib/modules/VERSION/`) into the initramfs at `lib/modules/VERSION/`,
/// decompressed here (6.12's come as `.ko.xz`) so that the guest's `insmod` needs no
/// decompressor. A kernel given as a bare file has none beside it: its own must be built in.
fn copy_diag_modules(image: &Path, staging: &Path) -> Result<()> {
    let Some(version) = image
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix("vmlinuz-"))
    else {
        return Ok(());
    };
    let Some(unpacked) = image.parent().and_then(Path::parent) else {
        return Ok(());
    };
    let from = unpacked
        .join("lib/modules")
        .join(version)
        .join("kernel/net/ipv4");
    let to = staging.join("lib/modules").join(version);
    for module in DIAG_MODULES {
        let plain = from.join(format!("{module}.ko"));
        let packed = from.join(format!("{module}.ko.xz"));
        let target = to.join(format!("{module}.ko"));
        if plain.is_file() {
            std::fs::create_dir_all(&to)?;
            std::fs::copy(&plain, &target)
                .with_context(|| format!("copying {}", plain.display()))?;
        } else if packed.is_file() {
            std::fs::create_dir_all(&to)?;
            let out = std::fs::File::create(&target)
                .with_context(|| format!("creating {}", target.display()))?;
            run_to_end(Process::new("xz").arg("-dc").arg(&packed).stdout(out))?;
        }
    }
    Ok(())
}

/// A kernel image: `spec` itself when it is a file, else the newest Debian cloud kernel of
/// that version, downloaded once.
fn kernel_image(work: &Path, spec: &str) -> Result<PathBuf> {
    if Path::new(spec).is_file() {
        return Ok(PathBuf::from(spec));
    }
    let apt = match ARCHIVED_SUITES.iter().find(|(version, _)| *version == spec) {
        Some((_, suite)) => private_apt(work, suite)?,
        None => Vec::new(),
    };
    let package = newest_cloud_kernel(spec, &apt)?;
    let unpacked = work.join("kernels").join(&package);
    if !unpacked.join("boot").is_dir() {
        let debs = work.join("debs");
        std::fs::create_dir_all(&debs)?;
        run_to_end(
            Process::new("apt-get")
                .args(&apt)
                // As root, apt would try (and fail) to drop to its sandbox user to write here.
                .args(["download", "-q", "-o", "APT::Sandbox::User=root", &package])
                .current_dir(&debs),
        )?;
        let deb = file_in(&debs, |n| {
            n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
        })?
        .with_context(|| format!("apt-get download left no .deb for {package}"))?;
        std::fs::create_dir_all(&unpacked)?;
        run_to_end(Process::new("dpkg").arg("-x").arg(&deb).arg(&unpacked))?;
    }
    file_in(&unpacked.join("boot"), |n| n.starts_with("vmlinuz-"))?
        .with_context(|| format!("{package} holds no vmlinuz"))
}

/// Options that point apt at a configuration of vm-test's own for `suite`: a sources list
/// naming the system's Debian mirror with that suite, and state and cache directories
/// under `work`. Its package lists are fetched once, then reused.
fn private_apt(work: &Path, suite: &str) -> Result<Vec<String>> {
    let root = work.join("apt").join(suite);
    let sources = root.join("sources.list");
    let state = root.join("state");
    let cache = root.join("cache");
    for dir in [state.join("lists/partial"), cache.join("archives/partial")] {
        std::fs::create_dir_all(dir)?;
    }
    let mirror = debian_mirror(Path::new("/etc/apt"))?;
    std::fs::write(
        &sources,
        format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {suite} main\n"
        ),
    )?;
    let path = |p: &Path| p.display().to_string();
    let options: Vec<String> = [
        format!("Dir::Etc::sourcelist={}", path(&sources)),
        // An empty value: no sources.list.d at all, so the system's suites stay out.
        "Dir::Etc::sourceparts=".to_owned(),
        format!("Dir::State={}", path(&state)),
        // Which packages are installed is still the system's; apt only reads it.
        "Dir::State::status=/var/lib/dpkg/status".to_owned(),
        format!("Dir::Cache={}", path(&cache)),
    ]
    .into_iter()
    .flat_map(|option| ["-o".to_owned(), option])
    .collect();
    let fetched = std::fs::read_dir(state.join("lists"))?
        .filter_map(|e| e.ok())
        // Stored compressed: `..._Packages.lz4`.
        .any(|e| e.file_name().to_string_lossy().contains("_Packages"));
    if !fetched {
        run_to_end(Process::new("apt-get").args(&options).args([
            "update",
            "-q",
            "-o",
            "APT::Sandbox::User=root",
        ]))
        .with_context(|| format!("fetching the {suite} package lists from {mirror}"))?;
    }
    Ok(options)
}

/// The Debian mirror the system's apt sources use (`URIs:` of a deb822 `.sources` file or
/// the URI of a one-line `deb` entry), leaving the security archive aside.
pub(crate) fn debian_mirror(etc_apt: &Path) -> Result<String> {
    let mut files = vec![etc_apt.join("sources.list")];
    if let Ok(entries) = std::fs::read_dir(etc_apt.join("sources.list.d")) {
        let mut parts: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        parts.sort();
        files.extend(parts);
    }
    let uris = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "list" || e == "sources"))
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|line| {
                    let line = line.trim();
                    if let Some(uris) = line.strip_prefix("URIs:") {
                        return Some(uris.split_whitespace().next()?.to_owned());
                    }
                    let rest = line.strip_prefix("deb ")?;
                    // `deb [options] URI suite...`
                    let rest = match rest.trim_start().strip_prefix('[') {
                        Some(options) => options.split_once(']')?.1,
                        None => rest,
                    };
                    Some(rest.split_whitespace().next()?.to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    uris.into_iter()
        .find(|uri| uri.contains("debian") && !uri.contains("security"))
        .with_context(|| {
            format!(
                "no Debian mirror in {}/sources.list{{,.d/*}}: vm-test fetches older kernels \
                 from the mirror the system uses",
                etc_apt.display()
            )
        })
}

/// The first file in `dir` whose name satisfies `wanted`.
fn file_in(dir: &Path, wanted: impl Fn(&str) -> bool) -> Result<Option<PathBuf>> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&wanted)))
}

/// Runs a command to its end; failing to start or a failure status is an error.
pub(crate) fn run_to_end(command: &mut Process) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(status.success(), "{command:?} failed ({status})");
    Ok(())
}

/// The newest `linux-image-<version>...-cloud-amd64` package Debian offers.
fn newest_cloud_kernel(version: &str, apt: &[String]) -> Result<String> {
    ensure!(
        !version.is_empty() && version.chars().all(|c| c.is_ascii_digit() || c == '.'),
        "{version:?} is neither a kernel image file nor a version such as 6.1"
    );
    let output = Process::new("apt-cache")
        .args(apt)
        .args(["search", "--names-only", &format!("^linux-image-{version}")])
        .output()
        .context("running apt-cache search")?;
    let prefix = format!("linux-image-{version}");
    let mut packages: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| {
            // `6.1.0-56-...` or `6.12.117+deb12-...`, not `6.12-cloud-amd64` (a metapackage)
            // nor `6.12...` when 6.1 was asked for.
            name.ends_with("-cloud-amd64")
                && name
                    .strip_prefix(&prefix)
                    .and_then(|rest| rest.strip_prefix(['.', '-']))
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(str::to_owned)
        .collect();
    packages.sort_by_key(|name| version_key(name));
    packages.pop().with_context(|| {
        format!("no Debian cloud kernel {version} found (apt-get update? a Debian 12 machine?)")
    })
}

/// Numbers in a package name, for ordering versions.
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// Longest one test binary may run in a guest before it is killed (the slowest take about
/// 100 s under TCG).
const BINARY_TIMEOUT: Duration = Duration::from_secs(600);

/// Console lines kept to show how a guest that never finished ended.
const TAIL_LINES: usize = 40;
/// Lines kept from the kernel's first report of trouble on.
const KERNEL_REPORT_LINES: usize = 120;
/// How the kernel's reports of trouble begin.
const KERNEL_TROUBLE: [&str; 4] = [
    "BUG: soft lockup",
    "rcu_preempt detected stalls",
    "blocked for more than",
    "Oops:",
];

/// Most lines of failure output one kernel's run prints (a panic with its backtrace is
/// about 40).
const MAX_FAILURE_LINES: usize = 400;

/// What one guest reported.
#[derive(Debug, Default)]
struct Outcome {
    kernel: Option<String>,
    /// Exit status of each test binary.
    results: Vec<(String, i32)>,
    /// How long each test binary ran, seen from the host: what to weigh when choosing
    /// what a kernel's run may hold.
    elapsed: Vec<(String, Duration)>,
    /// When the running binary started.
    started: Option<Instant>,
    /// `(binary, test, ok|FAILED|ignored)` from libtest's own lines.
    tests: Vec<(String, String, String)>,
    /// What libtest printed about each failed test (`---- name stdout ----` up to its
    /// closing `failures:` list), so CI's output says why without the guest's log.
    failure_text: Vec<String>,
    /// Inside such a block of the running binary.
    in_failure: bool,
    finished: bool,
    /// The test binary the guest is running now.
    running: Option<String>,
    /// The test libtest started and gave no verdict for yet.
    unfinished: Option<String>,
    /// The console's last lines.
    tail: std::collections::VecDeque<String>,
    /// The kernel's first report of a lockup, a stall or an oops, with the backtraces
    /// that follow it: what the tail of a guest that hung for minutes no longer shows.
    kernel_report: Vec<String>,
}

impl Outcome {
    /// Whether the guest stopped on an `int3` that its kernel's own code patching left
    /// (`text_poke_bp`, as a static key or a tracepoint is switched): under QEMU's
    /// multi-threaded TCG another vCPU can still run the breakpoint byte after the patch
    /// is over. Seen on 6.12 with QEMU 7.2 at boot, before the first test binary ran, as
    /// readily as in a test that attaches programs: the emulator's fault, not a test's.
    fn trapped_on_code_patching(&self) -> bool {
        !self.finished
            && (self.kernel_report.first()).is_some_and(|line| line.contains("Oops: int3"))
    }

    /// Takes in one line of the guest's console.
    fn record(&mut self, line: &str) {
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_owned());
        let reporting = !self.kernel_report.is_empty();
        if (reporting && self.kernel_report.len() < KERNEL_REPORT_LINES)
            || (!reporting && KERNEL_TROUBLE.iter().any(|trouble| line.contains(trouble)))
        {
            self.kernel_report.push(line.to_owned());
        }
        let Some(report) = line.find("VMTEST ").map(|at| &line[at + 7..]) else {
            if line.starts_with("---- ") {
                self.in_failure = true;
            } else if line.trim_end() == "failures:" {
                self.in_failure = false;
            }
            if self.in_failure && self.failure_text.len() < MAX_FAILURE_LINES {
                let binary = self.running.as_deref().unwrap_or("?");
                self.failure_text.push(format!("{binary}: {line}"));
            }
            // `test NAME ... ok`, as libtest prints it for each test; `test NAME ...` alone
            // when the binary was killed in it.
            match (
                &self.running,
                line.split_whitespace().collect::<Vec<_>>().as_slice(),
            ) {
                (Some(binary), ["test", test, "...", verdict]) => {
                    self.tests
                        .push((binary.clone(), (*test).to_owned(), (*verdict).to_owned()));
                    self.unfinished = None;
                }
                (Some(_), ["test", test, "..."]) => self.unfinished = Some((*test).to_owned()),
                _ => {}
            }
            return;
        };
        match report.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["kernel", release] => self.kernel = Some((*release).to_owned()),
            ["start", name] => {
                eprintln!("vm-test: {name}");
                self.running = Some((*name).to_owned());
                self.started = Some(Instant::now());
                self.in_failure = false;
            }
            ["result", name, status] => {
                if let (Some(test), false) = (self.unfinished.take(), *status == "0") {
                    self.failure_text.push(format!(
                        "{name}: killed in {test} (no verdict; exit status {status}, the \
                         binary's limit is {} s)",
                        BINARY_TIMEOUT.as_secs()
                    ));
                }
                self.results
                    .push(((*name).to_owned(), status.parse().unwrap_or(-1)));
                if let Some(started) = self.started.take() {
                    self.elapsed.push(((*name).to_owned(), started.elapsed()));
                }
            }
            ["done"] => self.finished = true,
            _ => {}
        }
    }
}

/// Boots `image` with the tests, which run the binaries `only` names if given (on the
/// kernel's command line, which `/init` reads), else every one.
fn boot(
    image: &Path,
    initrd: &Path,
    log: &Path,
    options: &Options,
    only: Option<&[&str]>,
) -> Result<Outcome> {
    let mut qemu = qemu(options);
    // A soft lockup prints every CPU's stack, so a hung guest says where it hung.
    let mut cmdline =
        "console=ttyS0 panic=-1 quiet softlockup_all_cpu_backtrace=1 softlockup_panic=1".to_owned();
    if let Some(only) = only {
        cmdline += &format!(" vmtest.only={}", only.join(","));
    }
    qemu.arg("-kernel")
        .arg(image)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(cmdline);
    let mut outcome = Outcome::default();
    run_guest(qemu, log, options.timeout, |line| outcome.record(line))?;
    Ok(outcome)
}

/// QEMU for an x86-64 guest with 2 vCPUs, its serial console on stdout, and no reboot: the
/// guest's power-off (or a panic, with `panic=-1`) ends QEMU.
pub(crate) fn qemu(options: &Options) -> Process {
    let mut qemu = Process::new("qemu-system-x86_64");
    qemu.args(["-accel", &options.accel, "-cpu", "max", "-smp", "2"])
        .args(["-m", &options.memory_mib.to_string()])
        .args(["-nographic", "-no-reboot"]);
    qemu
}

/// Runs `qemu` until the guest powers off, or kills it at `timeout`: every line of its
/// console goes to `log` and to `record`.
pub(crate) fn run_guest(
    mut qemu: Process,
    log: &Path,
    timeout: Duration,
    mut record: impl FnMut(&str),
) -> Result<()> {
    let log_file = std::fs::File::create(log)?;
    let mut qemu = qemu
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file.try_clone()?)
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let stdout = qemu.stdout.take().context("qemu's stdout")?;
    // Lines come through a channel, so a guest that hangs is noticed at the deadline.
    let (send, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + timeout;
    let mut log = std::io::BufWriter::new(log_file);
    loop {
        let line = match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => String::from_utf8_lossy(&line).trim_end().to_owned(),
            // QEMU exited: the guest powered off, or crashed.
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                writeln!(log, "vm-test: no power-off within {timeout:?}; killed")?;
                qemu.kill()?;
                break;
            }
        };
        writeln!(log, "{line}")?;
        record(&line);
    }
    qemu.wait()?;
    let _ = reader.join();
    Ok(())
}

/// Path of a tool on PATH, or an error that says how to install it.
pub(crate) fn which(tool: &str, install_hint: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{tool} is not installed; on Debian: {install_hint}"))
}

/// The shared libraries (and the loader) a program needs, by `ldd`: none for a static one.
fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>> {
    let output = Process::new("ldd")
        .arg(program)
        .output()
        .with_context(|| format!("running ldd {}", program.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && stderr.contains("not a dynamic executable") {
        return Ok(Vec::new());
    }
    ensure!(
        output.status.success(),
        "ldd {} failed: {stderr}",
        program.display()
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`
    Ok(stdout
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}

/// The distribution's static build of a tool (busybox-static, bash-static), copied alone.
fn static_tool(tool: &str) -> Result<PathBuf> {
    let path = which(tool, INSTALL_HINT)?;
    // `ldd` fails on a static executable.
    let dynamic = Process::new("ldd")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ensure!(
        !dynamic,
        "{} is dynamically linked; the guest needs a static one: {INSTALL_HINT}",
        path.display()
    );
    Ok(path)
}

fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options as `vm-test` gets them, with `--bench` or not.
    fn options(bench: Option<&str>) -> Options {
        Options {
            kernels: Vec::new(),
            filter: None,
            memory_mib: 0,
            timeout: Duration::ZERO,
            accel: String::new(),
            full: false,
            defaults: false,
            bench: bench.map(str::to_owned),
        }
    }

    /// The guest's init is valid shell, leaves out exactly the tests of [`GUEST_SKIPS`]
    /// of the binaries they belong to, and narrows those of [`KERNEL_SUITE`] to their
    /// filters unless a filter is asked for.
    #[test]
    fn the_guest_init_skips_host_only_tests() {
        let tests = ["trees", "namespaces", "liveness_daemon", "stream"]
            .map(|name| (name.to_owned(), PathBuf::from(format!("/tests/{name}"))));
        let mut options = options(None);
        let script = init_script(&tests, &options);
        assert!(
            script.contains("liveness_daemon) only=\"source:: reap:: identity::\" ;;"),
            "{script}"
        );
        options.filter = Some("cause_".into());
        assert!(!init_script(&tests, &options).contains("only=\""));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("init");
        std::fs::write(&path, &script).unwrap();
        let checked = Process::new("sh").arg("-n").arg(&path).status().unwrap();
        assert!(checked.success(), "{script}");
        for (name, test) in GUEST_SKIPS {
            assert!(
                script.contains(&format!("{name}) skip=\"--skip {test}\" ;;")),
                "{script}"
            );
        }
        assert!(!script.contains("stream)"), "{script}");
        assert!(
            script.contains("for module in inet_diag tcp_diag; do"),
            "{script}"
        );
        assert!(!script.contains(BENCH), "{script}");
    }

    /// With `--bench`, the guest's init runs the part instead of the tests, with cgroup2
    /// required, and prints what [`BenchOutput`] reads back among console noise.
    #[test]
    fn a_bench_guest_runs_the_part_and_its_output_is_read_back() {
        let script = init_script(&[], &options(Some("cgroups'; reboot")));
        assert!(
            script.contains(
                "LIVENESS_REQUIRE_CGROUP2=1 liveness-bench --bin-dir /bin --part 'cgroups; reboot'"
            ),
            "{script}"
        );
        assert!(!script.contains("/tests/"), "{script}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("init");
        std::fs::write(&path, &script).unwrap();
        let checked = Process::new("sh").arg("-n").arg(&path).status().unwrap();
        assert!(checked.success(), "{script}");

        let mut output = BenchOutput::default();
        for line in [
            "[    3.2] random: crng init done",
            "VMOUT cgroups register (cgroupfs): 200 each",
            "VMBENCH {",
            "VMBENCH   \"cgroups\": {}",
            "VMBENCH }",
            "VMTEST bench 0",
        ] {
            output.record(line);
        }
        assert_eq!(output.output, ["cgroups register (cgroupfs): 200 each"]);
        assert_eq!(output.json, "{\n  \"cgroups\": {}\n}\n");
        let json = dir.path().join("bench.json");
        output.finish("kernel 6.12", &json).unwrap();
        assert!(std::fs::read_to_string(&json).unwrap().contains("cgroups"));
        output.record("VMTEST bench 1");
        assert!(output.finish("kernel 6.12", &json).is_err());
        let unfinished = BenchOutput::default().finish("kernel 6.12", &json);
        assert!(
            unfinished
                .unwrap_err()
                .to_string()
                .contains("did not finish")
        );
    }

    /// The sock_diag modules unpacked beside a kernel land in the initramfs under its
    /// version, plain whether they came plain or xz-packed; a bare kernel file brings none.
    #[test]
    fn a_kernels_diag_modules_come_along_decompressed() {
        let dir = tempfile::tempdir().unwrap();
        let unpacked = dir.path().join("linux-image-9.9.9-test");
        let ipv4 = unpacked.join("lib/modules/9.9.9-test/kernel/net/ipv4");
        std::fs::create_dir_all(&ipv4).unwrap();
        std::fs::create_dir_all(unpacked.join("boot")).unwrap();
        let image = unpacked.join("boot/vmlinuz-9.9.9-test");
        std::fs::write(&image, "kernel").unwrap();
        std::fs::write(ipv4.join("inet_diag.ko"), "plain module").unwrap();
        std::fs::write(ipv4.join("tcp_diag.ko"), "packed module").unwrap();
        run_to_end(Process::new("xz").arg(ipv4.join("tcp_diag.ko"))).unwrap();
        assert!(ipv4.join("tcp_diag.ko.xz").is_file());

        let staging = dir.path().join("initramfs");
        copy_diag_modules(&image, &staging).unwrap();
        let modules = staging.join("lib/modules/9.9.9-test");
        let read = |name: &str| std::fs::read_to_string(modules.join(name)).unwrap();
        assert_eq!(read("inet_diag.ko"), "plain module");
        assert_eq!(read("tcp_diag.ko"), "packed module");

        let bare = dir.path().join("bzImage");
        std::fs::write(&bare, "kernel").unwrap();
        let elsewhere = dir.path().join("other");
        copy_diag_modules(&bare, &elsewhere).unwrap();
        assert!(!elsewhere.exists());
    }

    /// A guest that hung: its first lockup report is kept whole, past the console lines a
    /// long hang pushes out of the tail, along with where the guest stopped.
    #[test]
    fn only_an_unfinished_guest_stopped_on_an_int3_trapped_on_code_patching() {
        let guest = |lines: &[&str]| {
            let mut outcome = Outcome::default();
            for line in lines {
                outcome.record(line);
            }
            outcome.trapped_on_code_patching()
        };
        let trap = "[   14.709478] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI";
        assert!(guest(&["VMTEST kernel 6.12", trap]));
        assert!(guest(&[trap]), "at boot, before any binary");
        assert!(!guest(&[trap, "VMTEST done"]), "a guest that finished");
        let other =
            "[   14.709478] Oops: general protection fault, probably for non-canonical address";
        assert!(!guest(&[other]));
        assert!(!guest(&["VMTEST kernel 6.12"]));
    }

    #[test]
    fn the_first_kernel_report_is_kept_past_the_tail() {
        let mut outcome = Outcome::default();
        outcome.record("VMTEST start isolation");
        outcome.record("test whose_of_a_deep_chain_stalls_nobody ...");
        outcome.record("[  692.1] watchdog: BUG: soft lockup - CPU#0 stuck for 23s! [x:1]");
        outcome.record("[  692.1] Call Trace:");
        for n in 0..KERNEL_REPORT_LINES + TAIL_LINES {
            outcome.record(&format!("[  700.{n}] later"));
        }
        assert_eq!(outcome.kernel_report.len(), KERNEL_REPORT_LINES);
        assert!(outcome.kernel_report[0].contains("soft lockup"));
        assert_eq!(outcome.kernel_report[1], "[  692.1] Call Trace:");
        assert!(!outcome.tail.iter().any(|line| line.contains("soft lockup")));
        assert_eq!(outcome.running.as_deref(), Some("isolation"));
        assert_eq!(
            outcome.unfinished.as_deref(),
            Some("whose_of_a_deep_chain_stalls_nobody")
        );
    }

    #[test]
    fn the_mirror_is_read_from_either_sources_format_leaving_security_aside() {
        let etc = tempfile::tempdir().unwrap();
        std::fs::create_dir(etc.path().join("sources.list.d")).unwrap();
        std::fs::write(
            etc.path().join("sources.list.d/debian.sources"),
            "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\n\
             Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n",
        )
        .unwrap();
        assert_eq!(
            debian_mirror(etc.path()).unwrap(),
            "http://mirror.example/debian"
        );

        let etc = tempfile::tempdir().unwrap();
        std::fs::write(
            etc.path().join("sources.list"),
            "# comment\ndeb [signed-by=/k.gpg] http://other.example/debian bookworm main\n",
        )
        .unwrap();
        assert_eq!(
            debian_mirror(etc.path()).unwrap(),
            "http://other.example/debian"
        );

        let empty = tempfile::tempdir().unwrap();
        let error = debian_mirror(empty.path()).unwrap_err().to_string();
        assert!(error.contains("no Debian mirror"), "{error}");
    }

    fn guest(release: &str, lines: &[&str]) -> Outcome {
        let mut outcome = Outcome::default();
        outcome.record(&format!("VMTEST kernel {release}"));
        for line in lines {
            outcome.record(line);
        }
        outcome
    }

    #[test]
    fn the_matrix_shows_each_binary_and_each_fallback_leg_per_kernel() {
        let old = guest(
            "5.10.0-46-cloud-amd64",
            &[
                "VMTEST start daemon",
                "test owner_exit ... ok",
                "VMTEST result daemon 0",
                "VMTEST start fallbacks",
                "test bpf_denied_falls_back_to_pidfd ... ok",
                "test both_denied_fall_back_to_procpoll ... FAILED",
                "",
                "failures:",
                "",
                "---- both_denied_fall_back_to_procpoll stdout ----",
                "thread 'both_denied_fall_back_to_procpoll' panicked at tests/fallbacks.rs:9:5:",
                "",
                "failures:",
                "    both_denied_fall_back_to_procpoll",
                "VMTEST result fallbacks 101",
                "VMTEST done",
            ],
        );
        assert_eq!(
            old.failure_text,
            [
                "fallbacks: ---- both_denied_fall_back_to_procpoll stdout ----",
                "fallbacks: thread 'both_denied_fall_back_to_procpoll' panicked at tests/fallbacks.rs:9:5:",
                "fallbacks: ",
            ]
        );
        let new = guest(
            "6.12.117+deb12-cloud-amd64",
            &[
                "VMTEST start daemon",
                "VMTEST result daemon 0",
                "VMTEST start fallbacks",
                "test bpf_denied_falls_back_to_pidfd ... ok",
                "test both_denied_fall_back_to_procpoll ... ok",
                "VMTEST result fallbacks 0",
                "VMTEST done",
            ],
        );
        assert!(old.finished && new.finished);
        let hung = guest(
            "5.10.0-46-cloud-amd64",
            &[
                "VMTEST start isolation",
                "test a_quick_one ... ok",
                "test a_hanging_one ...",
                "VMTEST result isolation 137",
                "VMTEST start stream",
            ],
        );
        assert!(!hung.finished);
        assert_eq!(
            hung.failure_text,
            [
                "isolation: killed in a_hanging_one (no verdict; exit status 137, the binary's \
              limit is 600 s)"
            ]
        );
        assert_eq!(
            hung.tail.back().map(String::as_str),
            Some("VMTEST start stream")
        );
        assert_eq!(old.tests.len(), 3, "{:?}", old.tests);
        let tests = [
            ("daemon".to_owned(), PathBuf::new()),
            ("fallbacks".to_owned(), PathBuf::new()),
            ("stream".to_owned(), PathBuf::new()),
        ];
        let text = matrix(&tests, &[("5.10".into(), old), ("6.12".into(), new)]);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0][rows[0].len() - 2..],
            ["5.10.0", "6.12.117+deb12"],
            "{text}"
        );
        assert_eq!(rows[1], ["daemon", "ok", "ok"], "{text}");
        assert_eq!(rows[2], ["fallbacks", "FAILED", "ok"], "{text}");
        assert_eq!(
            rows[3],
            ["both_denied_fall_back_to_procpoll", "FAILED", "ok"],
            "{text}"
        );
        assert_eq!(
            rows[4],
            ["bpf_denied_falls_back_to_pidfd", "ok", "ok"],
            "{text}"
        );
        assert_eq!(
            rows[5],
            ["stream", "-", "-"],
            "a binary that never reported: {text}"
        );
    }
}
