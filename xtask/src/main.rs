//! Developer tasks: `cargo xtask <command>`.

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod agents;
mod baseline;
mod chaos;
mod clients;
mod dist;
mod gen_clients;
mod process;
mod systemd_vm;
mod vm;

#[derive(Debug, Parser)]
#[command(about = "Developer tasks for the liveness workspace")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compile the eBPF program (C, CO-RE) into the object the daemon embeds.
    BuildEbpf {
        /// Build into a temporary file and fail if it differs from the committed object.
        #[arg(long)]
        check: bool,
        /// The clang to compile with.
        #[arg(long, env = "CLANG", default_value = "clang")]
        clang: String,
    },
    /// Write the Go, TypeScript and Python clients' wire types from those of
    /// liveness-common (clients/go/types_gen.go, clients/typescript/src/types.gen.ts,
    /// clients/python/src/liveness/types_gen.py).
    GenClients {
        /// Write nothing; fail if a committed file differs from what would be written, or if
        /// the description of the types disagrees with liveness-common.
        #[arg(long)]
        check: bool,
    },
    /// Build livenessd and the harness in release mode and benchmark latency, scale,
    /// overhead and peers (see docs/benchmarks.md). Needs root for eBPF, pid_max and 100k
    /// processes; installs the peer tools with apt-get.
    Bench {
        /// Smaller sizes, under 2 minutes.
        #[arg(long, conflicts_with = "smoke")]
        quick: bool,
        /// Tiny sizes for CI: fails only if the harness breaks, never on timings. Takes the
        /// debug build (what the tests built), as it measures nothing.
        #[arg(long)]
        smoke: bool,
        /// Write the figures as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Run only these parts: latency, cpu, scale, peers, reap, trees, replay, activity,
        /// fleet, hooks, cgroups (comma-separated; default: all).
        #[arg(long, value_name = "PARTS")]
        part: Option<String>,
        /// Run only the peers part: liveness next to exitsnoop, bpftrace, the proc
        /// connector, pidfd and /proc polling (the same as --part peers).
        #[arg(long, conflicts_with = "part")]
        peers: bool,
        /// Also measure `livenessd` and `liveness` of this git revision (a commit, branch or
        /// tag) in the same run: every latency and CPU figure for both builds, alternately,
        /// with new/baseline ratios and their spread. Built in release mode once into
        /// target/bench-baseline/<commit>, and reused.
        #[arg(long, value_name = "REV")]
        baseline: Option<String>,
        /// The same with a directory holding a release `livenessd` and `liveness`.
        #[arg(long, value_name = "DIR", conflicts_with = "baseline")]
        baseline_bin: Option<PathBuf>,
        /// Seeds the order of the peers' blocks of one tool alone (the harness's default
        /// unless given): the seed a run printed repeats its order.
        #[arg(long, value_name = "N")]
        peers_seed: Option<u64>,
    },
    /// Check liveness's hooks against the real agents (docs/agents.md): each agent's npm
    /// package installed into target/agents, run offline against the loopback model
    /// stand-ins of the agents-offline kit with a temporary HOME and a private livenessd,
    /// to a clean exit and SIGKILLed mid-turn; a table of versions and outcomes. Needs root
    /// (eBPF), python3, npm and the registry; slow, so not part of `.ci/run`.
    Agents {
        /// The agents-offline kit's directory (fake_anthropic.py, fake_multi.py).
        #[arg(long, env = "LIVENESS_AGENTS_KIT", value_name = "DIR")]
        kit: PathBuf,
        /// Only these agents (comma-separated: claude-code, codex, gemini, copilot,
        /// opencode).
        #[arg(long, value_delimiter = ',', value_name = "AGENTS")]
        only: Vec<String>,
        /// Print the table as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Build the release artifacts into target/artifacts: stripped binaries, shell
    /// completions (bash, zsh, fish), man pages, a .deb with the binaries, the systemd
    /// unit, the completions, the man pages and the maintainer scripts, and the clients'
    /// packages (the npm tarball, the Python wheel and sdist). Reuses the release build
    /// (`cargo build --release`). Needs binutils (objcopy, objdump), dpkg-deb, npm and
    /// Python's setuptools and wheel.
    Dist {
        /// Build with full debug info instead (the `dist` profile: everything is compiled
        /// again) and keep it in target/artifacts/debug, linked from the binaries.
        #[arg(long)]
        debug_info: bool,
        /// Leave out the clients' packages (the .deb and the binaries alone).
        #[arg(long)]
        no_clients: bool,
    },
    /// Run the fault suite alone with more rounds and inputs: SIGKILLs mid-burst, ring-buffer
    /// overflow, full disk, replaced databases, the protocol fuzz, tokens past a restored
    /// state, and the stall tests (a second uid attacks while a victim's deaths are timed).
    /// Needs root and BTF.
    Chaos {
        /// Rounds of each repeated fault (SIGKILL mid-burst, ring-buffer overflow).
        #[arg(long, default_value_t = 20)]
        rounds: u32,
        /// Inputs per fuzz target (the parser, the line reader, a live daemon).
        #[arg(long, default_value_t = 100_000)]
        cases: u32,
        /// Only the tests whose size --rounds and --cases set (the protocol fuzz, the
        /// SIGKILLs mid-burst, the ring-buffer overflows, a live daemon's fuzzed lines):
        /// after `cargo test --workspace`, the others would run again unchanged (CI).
        #[arg(long)]
        sized: bool,
    },
    /// Run the test suite inside QEMU guests booting other kernels (busybox initramfs,
    /// release binaries with their shared libraries, no network, no systemd) and print a
    /// matrix kernel × test binary (each forced-fallback leg on its own row). Needs
    /// qemu-system-x86, busybox-static, bash-static, cpio and binutils; kernels are Debian's cloud kernels, fetched with apt-get (5.10
    /// through a private apt configuration for suite bullseye on the system's mirror).
    VmTest {
        /// Instead: install the .deb in a Debian bookworm guest booted with systemd as PID 1
        /// and check, as root and as a user, the unit in its sandbox, the journal, restarts,
        /// removal, purge and an upgrade from the previous release (the newest v* tag, or
        /// dist/releases in a clone without tags), in a table. Needs mmdebstrap and e2fsprogs besides QEMU; the guest's root file system
        /// is cached in target/vm-test/systemd.
        #[arg(long, conflicts_with_all = ["kernels", "filter"])]
        systemd: bool,
        /// A Debian kernel version (5.10, 6.1, 6.12) or the path of a kernel image
        /// (repeatable; default: 5.10, 6.1 and 6.12, where 6.1 runs only the binaries its
        /// verifier and BTF decide: exit facts, causes, sources, trees, fallbacks).
        #[arg(long = "kernel", value_name = "VERSION|PATH")]
        kernels: Vec<String>,
        /// Run only the tests whose names contain this.
        #[arg(long)]
        filter: Option<String>,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 2048)]
        memory: u32,
        /// Longest a kernel's whole run may take, in minutes.
        #[arg(long, default_value_t = 30)]
        timeout_minutes: u64,
        /// QEMU accelerator: tcg (software, works everywhere) or kvm.
        #[arg(long, default_value = "tcg")]
        accel: String,
        /// Every test binary in each guest; without it only the kernel suite runs (the
        /// binaries whose outcome depends on the kernel; the rest runs on the host), which
        /// is what CI runs.
        #[arg(long, conflicts_with = "systemd")]
        full: bool,
        /// Instead of the tests: run this part of the benchmark harness (`cgroups`) in each
        /// guest, against a daemon of its own, or with --systemd against the daemon the
        /// .deb installed; its table is printed and its JSON written to
        /// target/vm-test/bench-<kernel|systemd>-<part>.json. Times are emulated (TCG):
        /// compare the ratios.
        #[arg(long, value_name = "PART", conflicts_with_all = ["filter", "full"])]
        bench: Option<String>,
    },
}

/// Directory of the eBPF sources; clang runs here so the object only records relative paths.
const EBPF_DIR: &str = "liveness-ebpf";
const EBPF_SOURCE: &str = "bpf/liveness.bpf.c";
/// The committed object, relative to [`EBPF_DIR`]; the daemon embeds it with `include_bytes_aligned!`.
const EBPF_OBJECT: &str = "liveness.bpf.o";

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::BuildEbpf { check, clang } => build_ebpf(&clang, check),
        Command::Agents { kit, only, json } => {
            agents::run(&workspace_root(), &agents::Options { kit, only, json })
        }
        Command::GenClients { check } => gen_clients::run(&workspace_root(), check),
        Command::Bench {
            quick,
            smoke,
            json,
            part,
            peers,
            baseline,
            baseline_bin,
            peers_seed,
        } => bench(&BenchOptions {
            quick,
            smoke,
            json,
            peers_seed,
            part: if peers { Some("peers".into()) } else { part },
            baseline: match (baseline, baseline_bin) {
                (Some(rev), _) => Some(Baseline::Revision(rev)),
                (None, Some(dir)) => Some(Baseline::Directory(dir)),
                (None, None) => None,
            },
        }),
        Command::Dist {
            debug_info,
            no_clients,
        } => dist::run(
            &workspace_root(),
            &dist::Options {
                debug_info,
                clients: !no_clients,
            },
        )
        .map(drop),
        Command::Chaos {
            rounds,
            cases,
            sized,
        } => chaos::run(
            &workspace_root(),
            &chaos::Options {
                rounds,
                cases,
                sized,
            },
        ),
        Command::VmTest {
            systemd,
            kernels,
            filter,
            memory,
            timeout_minutes,
            accel,
            full,
            bench,
        } => {
            let defaults = kernels.is_empty();
            let options = vm::Options {
                kernels: if defaults {
                    vm::DEFAULT_KERNELS
                        .iter()
                        .map(|k| (*k).to_owned())
                        .collect()
                } else {
                    kernels
                },
                filter,
                memory_mib: memory,
                timeout: std::time::Duration::from_secs(timeout_minutes * 60),
                accel,
                full,
                defaults,
                bench,
            };
            if systemd {
                systemd_vm::run(&workspace_root(), &options)
            } else {
                vm::run(&workspace_root(), &options)
            }
        }
    }
}

/// Where cargo builds: `CARGO_TARGET_DIR`, else `target/` in the workspace.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn build_ebpf(clang: &str, check: bool) -> Result<()> {
    let dir = workspace_root().join(EBPF_DIR);
    let committed = dir.join(EBPF_OBJECT);
    if !check {
        compile(clang, &dir, &committed)?;
        println!("wrote {}", committed.display());
        return Ok(());
    }

    let scratch = tempfile::tempdir().context("creating a temporary directory")?;
    let first = scratch.path().join("first.o");
    let second = scratch.path().join("second.o");
    compile(clang, &dir, &first)?;
    compile(clang, &dir, &second)?;
    let first = read(&first)?;
    if first != read(&second)? {
        bail!("two builds of {EBPF_DIR}/{EBPF_SOURCE} differ: the build is not reproducible");
    }
    if first != read(&committed)? {
        bail!(
            "{EBPF_DIR}/{EBPF_OBJECT} is stale: it differs from a fresh build of \
             {EBPF_DIR}/{EBPF_SOURCE}. Run `cargo xtask build-ebpf` and commit the object \
             (a clang other than the one that built it also produces different bytes)."
        );
    }
    println!("{EBPF_DIR}/{EBPF_OBJECT} is up to date");
    Ok(())
}

fn compile(clang: &str, dir: &Path, output: &Path) -> Result<()> {
    let mut command = Process::new(clang);
    command
        .current_dir(dir)
        .args(["-target", "bpf", "-O2", "-g", "-D__TARGET_ARCH_x86"])
        .arg("-I/usr/include/x86_64-linux-gnu")
        // Without this the DWARF records the absolute checkout path as the compile directory.
        .arg(format!("-fdebug-prefix-map={}=.", dir.display()))
        .args(["-c", EBPF_SOURCE, "-o"])
        .arg(output);
    let status = command
        .status()
        .with_context(|| format!("running {clang} (install clang and libbpf-dev)"))?;
    if !status.success() {
        bail!("{clang} failed ({status}) compiling {EBPF_DIR}/{EBPF_SOURCE}");
    }
    Ok(())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// What `cargo xtask bench` was asked to do.
#[derive(Debug)]
struct BenchOptions {
    quick: bool,
    smoke: bool,
    json: Option<PathBuf>,
    part: Option<String>,
    baseline: Option<Baseline>,
    peers_seed: Option<u64>,
}

/// Where the baseline's binaries come from.
#[derive(Debug)]
enum Baseline {
    Revision(String),
    Directory(PathBuf),
}

/// The harness is a release binary of its own (`liveness-bench`), not code in xtask: what
/// measures latency must be optimized like what is measured, and xtask stays a debug build
/// that starts fast. A smoke run measures nothing: it takes the debug build the tests made.
fn bench(options: &BenchOptions) -> Result<()> {
    let root = workspace_root();
    // The baseline first: building it is the long step, and a revision that does not
    // build should stop the run before the working tree's build.
    let baseline = match &options.baseline {
        Some(Baseline::Revision(rev)) => Some(baseline::of_revision(&root, rev)?),
        Some(Baseline::Directory(dir)) => Some(baseline::of_directory(dir)?),
        None => None,
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The profile, and the directory cargo names after it.
    let (profile, dir) = match options.smoke {
        true => ("dev", "debug"),
        false => ("release", "release"),
    };
    let status = Process::new(cargo)
        .current_dir(&root)
        .args(["build", "--profile", profile])
        .args([
            "-p",
            "liveness-daemon",
            "-p",
            "liveness-cli",
            "-p",
            "liveness-bench",
            "--bins",
        ])
        // What ships is measured, and the release build `dist` made is reused.
        .args(dist::SHIPPED_FEATURES)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building the {profile} binaries failed ({status})");
    }
    let bin_dir = target_dir(&root).join(dir);
    let mut harness = Process::new(bin_dir.join("liveness-bench"));
    harness.arg("--bin-dir").arg(&bin_dir);
    if options.quick {
        harness.arg("--quick");
    }
    if options.smoke {
        harness.arg("--smoke");
    }
    if let Some(part) = &options.part {
        harness.arg("--part").arg(part);
    }
    if let Some(baseline) = &baseline {
        harness
            .arg("--baseline-bin-dir")
            .arg(&baseline.bin_dir)
            .arg("--baseline-name")
            .arg(&baseline.name);
    }
    if let Some(seed) = options.peers_seed {
        harness.arg("--peers-seed").arg(seed.to_string());
    }
    if let Some(json) = &options.json {
        // The harness runs in the workspace root; keep a relative path relative to the caller.
        let json = std::env::current_dir()?.join(json);
        harness.arg("--json").arg(json);
    }
    let status = harness
        .current_dir(&root)
        .status()
        .context("running liveness-bench")?;
    if !status.success() {
        bail!("the benchmark failed ({status})");
    }
    Ok(())
}
