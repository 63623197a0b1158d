//! `cargo xtask vm-test --systemd`: the Debian package where users run it. A Debian
//! bookworm guest (its own cloud kernel and initramfs, systemd as PID 1) gets this tree's
//! .deb and the previous release's, and `systemd_checks.sh` runs in it as root: install,
//! the daemon in its sandbox, end actions as a user under it, session cgroups as
//! systemd scopes (a 64M hog OOM-killed in its scope), the journal, restarts and
//! crashes, removal, purge, a machine without systemd, and an upgrade from the previous
//! release. The run ends with a table check | result | seconds.
//!
//! The root file system is made by `mmdebstrap` from Debian's packages, on the mirror the
//! system's apt sources name (the system's apt configuration is neither used nor touched),
//! and cached under `target/vm-test/systemd` as an ext4 image, which the guest only reads
//! (`snapshot=on`): every run starts from the same fresh system. The packages come on a
//! second disk. The previous release is the newest before HEAD (`v*` tags, or
//! `dist/releases` in a clone without tags); its .deb is built
//! by its own `cargo xtask dist`, from `git archive`, once.
//!
//! With `--bench PART`, the guest runs that part of the benchmark harness (a static build,
//! as the kernel guests' is) against the daemon this tree's .deb installed instead of the
//! checks: the session cgroups then are systemd's transient scopes.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::dist;
use crate::vm::{self, Options, debian_mirror, run_to_end};

const SUITE: &str = "bookworm";
/// The guest's packages besides the minimal base: systemd as init, its bus, Debian's cloud
/// kernel (virtio and BTF built in) with its initramfs, and what the checks use: node is
/// what most Claude Code hooks run on, and its JIT needs memory both writable and
/// executable, so an end action runs it under the unit.
const GUEST_PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "linux-image-cloud-amd64",
    "jq",
    "procps",
    "nodejs",
];
/// Runs the checks once the guest has booted, then powers it off, whatever happened.
const CHECKS_UNIT: &str = "\
[Unit]
Description=The checks of cargo xtask vm-test --systemd

[Service]
Type=exec
ExecStartPre=/bin/mkdir -p /payload
ExecStartPre=/bin/mount -o ro /dev/vdb /payload
ExecStart=/bin/bash /payload/checks.sh
ExecStopPost=/bin/systemctl poweroff --force --force
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0

[Install]
WantedBy=multi-user.target
";
const CHECKS: &str = include_str!("systemd_checks.sh");
const INSTALL_DOC: &str = include_str!("../../docs/install.md");
/// The first line of the metrics drop-in's block in docs/install.md.
const METRICS_DROP_IN: &str = "# /etc/systemd/system/livenessd.service.d/metrics.conf";
/// `systemd-analyze security livenessd`'s overall exposure (0 safest, 10 least) with the
/// unit as verified in this guest, as docs/install.md states it: a unit change that makes
/// it worse fails the run.
pub const EXPOSURE: f64 = 2.9;
const INSTALL_HINT: &str = "apt-get install -y qemu-system-x86 mmdebstrap e2fsprogs";

pub fn run(root: &Path, options: &Options) -> Result<()> {
    let started = Instant::now();
    for tool in ["qemu-system-x86_64", "mmdebstrap", "mke2fs", "git"] {
        vm::which(tool, INSTALL_HINT)?;
    }
    let work = root.join("target/vm-test/systemd");
    std::fs::create_dir_all(&work)?;
    if let Some(part) = &options.bench {
        return bench(root, &work, part, options);
    }
    // The root file system downloads and unpacks while the packages build.
    let (guest, packages) = std::thread::scope(|scope| {
        let guest = scope.spawn(|| root_filesystem(&work));
        let packages = packages(root, &work);
        (guest.join(), packages)
    });
    let guest = guest.map_err(|_| anyhow::anyhow!("building the root file system panicked"))??;
    let packages = packages?;
    let payload = payload(
        &work,
        &[
            (packages.new.as_path(), "new.deb"),
            (&packages.previous, "previous.deb"),
        ],
        &[
            ("checks.sh", CHECKS.to_owned()),
            ("metrics.conf", metrics_drop_in(INSTALL_DOC)?),
        ],
    )?;

    let log = work.join("guest.log");
    let booted = Instant::now();
    let mut report = Report::default();
    vm::run_guest(
        qemu(&guest, &payload, options),
        &log,
        options.timeout,
        |line| report.record(line),
    )?;
    print!("{}", report.table());
    println!(
        "guest: {} ({}), systemd {}, PID 1 {}; {} upgraded to {}; {:.0} s in the guest, {:.0} s \
         in all; log {}",
        report.fact("kernel"),
        SUITE,
        report.fact("systemd"),
        report.fact("pid1"),
        report.fact("previous_version"),
        report.fact("upgraded_to"),
        booted.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64(),
        log.display()
    );
    report.verdict()
}

/// QEMU booting the guest with the payload as its second disk.
fn qemu(guest: &Guest, payload: &Path, options: &Options) -> Process {
    let mut qemu = vm::qemu(options);
    qemu.arg("-kernel")
        .arg(&guest.kernel)
        .arg("-initrd")
        .arg(&guest.initrd)
        .args([
            "-append",
            "root=/dev/vda rw console=ttyS0 panic=-1 quiet systemd.show_status=false",
        ])
        .arg("-drive")
        .arg(drive(&guest.image, "snapshot=on"))
        .arg("-drive")
        .arg(drive(payload, "readonly=on"))
        // No network card: the guest needs none.
        .args(["-nic", "none"]);
    qemu
}

/// What the guest runs instead of the checks with `--bench`: this tree's .deb installed,
/// then the part against its daemon, on the socket the unit listens on. The harness runs
/// as root without capabilities: the unit's daemon, root with five, may not read the
/// `/proc/<pid>/ns` of a process whose capabilities exceed its own (ptrace's rule), so it
/// could not register the harness's owners by pid; as a user, the sessions would be
/// another user's, unlike the kernel guests' (root's). Full sizes: 200 scope sessions
/// ending at once keep the daemon's bus connection within the calls dbus-daemon allows
/// one connection (docs/benchmarks.md).
fn bench_script(part: &str) -> String {
    format!(
        r#"#!/bin/bash
# `cargo xtask vm-test --systemd --bench`: the part against the daemon the package runs.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive
systemctl is-system-running --wait >/dev/null || true
echo "VMFACT kernel $(uname -r)"
{{
    dpkg -i /payload/new.deb
    for _ in $(seq 100); do liveness status >/dev/null 2>&1 && break; sleep 0.1; done
    liveness status
    LIVENESS_REQUIRE_CGROUP2=1 setpriv --bounding-set -all --inh-caps -all \
        /payload/{bench} --bin-dir /usr/bin --socket /run/liveness/liveness.sock --part '{part}' --json /tmp/bench.json
}} >/tmp/bench.out 2>&1
status=$?
{report}echo VMDONE
"#,
        bench = vm::BENCH,
        part = part.replace('\'', ""),
        report = vm::bench_report("/tmp"),
    )
}

/// `--bench PART`: this tree's .deb and the static harness on the payload, the part run
/// in the guest; its output printed, its JSON in target/vm-test/bench-systemd-PART.json.
fn bench(root: &Path, work: &Path, part: &str, options: &Options) -> Result<()> {
    let guest = root_filesystem(work)?;
    let deb = dist::run(root, &dist::Options::default())?;
    let vm_work = work.parent().context("target/vm-test")?;
    let built = vm::build(root, vm_work, options)?;
    let harness = built
        .programs
        .iter()
        .find(|(name, _)| name == vm::BENCH)
        .map(|(_, path)| path)
        .context("the static build made no liveness-bench")?;
    let payload = payload(
        work,
        &[(deb.as_path(), "new.deb"), (harness, vm::BENCH)],
        &[("checks.sh", bench_script(part))],
    )?;
    let log = work.join(format!("bench-{part}.log"));
    let mut output = vm::BenchOutput::default();
    vm::run_guest(
        qemu(&guest, &payload, options),
        &log,
        options.timeout,
        |line| output.record(line),
    )?;
    output
        .finish(
            "systemd guest",
            &vm_work.join(format!("bench-systemd-{part}.json")),
        )
        .with_context(|| format!("log {}", log.display()))
}

/// `-drive` for a raw image on virtio.
fn drive(image: &Path, mode: &str) -> String {
    format!("file={},format=raw,if=virtio,{mode}", image.display())
}

/// The guest's kernel, initramfs and root file system image.
#[derive(Debug)]
struct Guest {
    kernel: PathBuf,
    initrd: PathBuf,
    image: PathBuf,
}

/// The cached guest, made first if the recipe changed (suite, packages, checks unit).
fn root_filesystem(work: &Path) -> Result<Guest> {
    let mut recipe = std::collections::hash_map::DefaultHasher::new();
    (SUITE, GUEST_PACKAGES, CHECKS_UNIT).hash(&mut recipe);
    let dir = work.join(format!("rootfs-{:016x}", recipe.finish()));
    let guest = Guest {
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
        image: dir.join("rootfs.img"),
    };
    if guest.image.is_file() {
        return Ok(guest);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let tree = dir.join("tree");
    std::fs::create_dir_all(&dir)?;
    let mirror = debian_mirror(Path::new("/etc/apt"))?;
    let log = dir.join("mmdebstrap.log");
    eprintln!(
        "vm-test: making the {SUITE} root file system from {mirror} (log {})",
        log.display()
    );
    let log_file = std::fs::File::create(&log)?;
    run_to_end(
        Process::new("mmdebstrap")
            .args(["--mode=root", "--variant=minbase"])
            .arg(format!("--include={}", GUEST_PACKAGES.join(",")))
            .args(["--aptopt", "Acquire::Languages \"none\""])
            .arg(SUITE)
            .arg(&tree)
            .arg(format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {SUITE} main"
            ))
            .stdout(log_file.try_clone()?)
            .stderr(log_file),
    )
    .with_context(|| format!("mmdebstrap failed; see {}", log.display()))?;
    let etc = tree.join("etc");
    std::fs::write(etc.join("hostname"), "liveness-vm\n")?;
    let units = etc.join("systemd/system");
    std::fs::write(units.join("vm-checks.service"), CHECKS_UNIT)?;
    std::os::unix::fs::symlink(
        "/etc/systemd/system/vm-checks.service",
        units.join("multi-user.target.wants/vm-checks.service"),
    )?;
    // The checks own the serial console; no login prompts.
    for unit in ["serial-getty@ttyS0.service", "getty@tty1.service"] {
        let _ = std::fs::remove_file(units.join("getty.target.wants").join(unit));
        std::os::unix::fs::symlink("/dev/null", units.join(unit))?;
    }
    run_to_end(
        Process::new("chroot")
            .arg(&tree)
            .args(["useradd", "--create-home", "alice"]),
    )?;
    for (prefix, to) in [("vmlinuz-", &guest.kernel), ("initrd.img-", &guest.initrd)] {
        let from = std::fs::read_dir(tree.join("boot"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .with_context(|| format!("no /boot/{prefix}* in the root file system"))?;
        std::fs::copy(from, to)?;
    }
    let partial = dir.join("rootfs.img.partial");
    ext4_image(&tree, &partial, "2G")?;
    std::fs::rename(&partial, &guest.image)?;
    std::fs::remove_dir_all(&tree)?;
    Ok(guest)
}

/// An ext4 file system image of `size` holding `tree` (`mke2fs -d`: no mount needed).
fn ext4_image(tree: &Path, image: &Path, size: &str) -> Result<()> {
    let _ = std::fs::remove_file(image);
    run_to_end(
        Process::new("mke2fs")
            .args(["-q", "-t", "ext4", "-d"])
            .arg(tree)
            .arg(image)
            .arg(size)
            .stdout(Stdio::null()),
    )
}

/// This tree's .deb and the previous release's.
#[derive(Debug)]
struct Packages {
    new: PathBuf,
    previous: PathBuf,
}

fn packages(root: &Path, work: &Path) -> Result<Packages> {
    let new = dist::run(root, &dist::Options::default())?;
    let release = dist::release_at_or_before(root, "HEAD^")?.context(
        "no release before HEAD (neither a v* tag nor a line of dist/releases): the upgrade \
         check installs the previous release first",
    )?;
    let (tag, commit) = (format!("v{}", release.version), release.commit);
    let dir = work.join("previous").join(&commit);
    let previous = dir.join("liveness.deb");
    if previous.is_file() {
        return Ok(Packages { new, previous });
    }
    let source = dir.join("source");
    if source.exists() {
        std::fs::remove_dir_all(&source)?;
    }
    std::fs::create_dir_all(&source)?;
    eprintln!("vm-test: building the package of {tag} ({commit}) with its own `cargo xtask dist`");
    run_to_end(
        Process::new("sh")
            .arg("-c")
            .arg("git archive --format=tar \"$1\" | tar -x -C \"$2\"")
            .arg("sh")
            .arg(&commit)
            .arg(&source)
            .current_dir(root),
    )?;
    let started = Instant::now();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run_to_end(
        Process::new(cargo)
            .args(["xtask", "dist"])
            .current_dir(&source)
            // That tree's dist finds its build in its own target/.
            .env_remove("CARGO_TARGET_DIR")
            // Unoptimized and without debug info, built in under half the time: the
            // upgrade check needs that release's behaviour and files, not its speed.
            .env("CARGO_PROFILE_DIST_OPT_LEVEL", "0")
            .env("CARGO_PROFILE_DIST_DEBUG", "false"),
    )?;
    let artifacts = source.join("target/artifacts");
    let deb = std::fs::read_dir(&artifacts)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("{tag}'s dist made no .deb in {}", artifacts.display()))?;
    std::fs::copy(deb, &previous)?;
    eprintln!(
        "vm-test: built the package of {tag} in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    // Gigabytes of build; the package is what is kept.
    std::fs::remove_dir_all(&source)?;
    Ok(Packages { new, previous })
}

/// The second disk: the packages and the checks (`files` copied, `texts` written, each
/// under its name).
fn payload(work: &Path, files: &[(&Path, &str)], texts: &[(&str, String)]) -> Result<PathBuf> {
    let dir = work.join("payload");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    for (from, name) in files {
        std::fs::copy(from, dir.join(name))
            .with_context(|| format!("copying {} to the payload", from.display()))?;
    }
    for (name, text) in texts {
        std::fs::write(dir.join(name), text)?;
    }
    let image = work.join("payload.img");
    // Room for the static benchmark harness too.
    ext4_image(&dir, &image, "128M")?;
    Ok(image)
}

/// The metrics drop-in as docs/install.md shows it: the block that starts with its path.
fn metrics_drop_in(docs: &str) -> Result<String> {
    let start = docs
        .find(METRICS_DROP_IN)
        .with_context(|| format!("docs/install.md shows no {METRICS_DROP_IN}"))?;
    let block = &docs[start..];
    let end = block
        .find("```")
        .context("the drop-in's block does not end")?;
    Ok(block[..end].to_owned())
}

/// What the guest reported.
#[derive(Debug, Default)]
struct Report {
    /// In the order they ran.
    checks: Vec<Check>,
    facts: BTreeMap<String, String>,
    done: bool,
    /// The running check's output (`VMLOG`) so far.
    output: Vec<String>,
}

#[derive(Debug)]
struct Check {
    name: String,
    ok: bool,
    millis: u64,
    /// A failed check's last lines of output, where it says why: the verdict shows them,
    /// since the guest's log may not outlive a CI machine.
    said: Vec<String>,
}

/// How many of a failed check's last lines its verdict shows.
const FAILED_OUTPUT_LINES: usize = 40;

impl Report {
    fn record(&mut self, line: &str) {
        if let Some(at) = line.find("VMCHECK ") {
            let mut words = line[at + 8..].splitn(3, ' ');
            if let (Some(result), Some(millis), Some(name)) =
                (words.next(), words.next(), words.next())
            {
                let ok = result == "ok";
                eprintln!("vm-test: {} {name}", if ok { "ok    " } else { "FAILED" });
                let mut said = std::mem::take(&mut self.output);
                if ok {
                    said.clear();
                } else {
                    said.drain(..said.len().saturating_sub(FAILED_OUTPUT_LINES));
                }
                self.checks.push(Check {
                    name: name.to_owned(),
                    ok,
                    millis: millis.parse().unwrap_or(0),
                    said,
                });
            }
        } else if let Some(at) = line.find("VMLOG ") {
            self.output.push(line[at + 6..].to_owned());
        } else if let Some(at) = line.find("VMFACT ") {
            if let Some((key, value)) = line[at + 7..].split_once(' ') {
                self.facts.insert(key.to_owned(), value.trim().to_owned());
            }
        } else if line.contains("VMDONE") {
            self.done = true;
        }
    }

    fn fact(&self, key: &str) -> &str {
        self.facts.get(key).map_or("?", String::as_str)
    }

    fn table(&self) -> String {
        const HEADER: &str = "check";
        let width = self
            .checks
            .iter()
            .map(|check| check.name.len())
            .chain([HEADER.len()])
            .max()
            .unwrap_or(0);
        let mut text = format!("{HEADER:<width$} | result | seconds\n");
        text += &format!("{}-|--------|--------\n", "-".repeat(width));
        for check in &self.checks {
            text += &format!(
                "{:<width$} | {:<6} | {:>7.1}\n",
                check.name,
                if check.ok { "ok" } else { "FAILED" },
                check.millis as f64 / 1000.0
            );
        }
        text
    }

    /// Every check passed, the run finished, and the unit is no more exposed than recorded.
    fn verdict(&self) -> Result<()> {
        let mut failures: Vec<String> = self
            .checks
            .iter()
            .filter(|check| !check.ok)
            .map(|check| {
                let mut failure = format!("failed: {}", check.name);
                for line in &check.said {
                    failure += &format!("\n    | {line}");
                }
                failure
            })
            .collect();
        if !self.done {
            failures.push("the checks did not finish (timed out or crashed)".into());
        }
        if self.checks.is_empty() {
            failures.push("no check reported".into());
        }
        match self.fact("exposure").parse::<f64>() {
            Ok(score) if score > EXPOSURE => failures.push(format!(
                "systemd-analyze security livenessd: {score}, worse than the {EXPOSURE} recorded \
                 in docs/install.md"
            )),
            Ok(score) => println!(
                "systemd-analyze security livenessd: {score} (recorded: {EXPOSURE}, 0 is safest)"
            ),
            Err(_) => failures.push("no systemd-analyze security score".into()),
        }
        if failures.is_empty() {
            println!("vm-test --systemd: every check passed");
            Ok(())
        } else {
            bail!("vm-test --systemd failed:\n  {}", failures.join("\n  "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_reads_checks_and_facts_among_console_noise() {
        let mut report = Report::default();
        for line in [
            "[   3.1] systemd[1]: Started something.",
            "VMFACT kernel 6.1.0-50-cloud-amd64",
            "VMLOG some output",
            "VMCHECK ok 4200 fresh install: the package enables and starts livenessd",
            "VMLOG expected: eBPF active",
            "[   4.0] kernel noise between a check's lines",
            "VMCHECK FAILED 150 status as root",
            "VMFACT exposure 1.0",
        ] {
            report.record(line);
        }
        assert_eq!(report.fact("kernel"), "6.1.0-50-cloud-amd64");
        assert_eq!(report.checks.len(), 2);
        let table = report.table();
        assert!(
            table.contains(
                "fresh install: the package enables and starts livenessd | ok     |     4.2"
            ),
            "{table}"
        );
        let error = report.verdict().unwrap_err().to_string();
        assert!(
            error.contains("failed: status as root\n    | expected: eBPF active\n"),
            "{error}"
        );
        assert!(
            !error.contains("some output"),
            "a passed check's output: {error}"
        );
        assert!(!error.contains("noise"), "{error}");
        assert!(error.contains("did not finish"), "{error}");
        report.checks.remove(1);
        report.record("VMDONE");
        report.verdict().unwrap();
        report.record("VMFACT exposure 9.6");
        assert!(report.verdict().unwrap_err().to_string().contains("worse"));
    }

    #[test]
    fn the_bench_script_runs_the_part_against_the_units_socket() {
        let script = bench_script("cgroups'$(reboot)");
        assert!(
            script.contains("--socket /run/liveness/liveness.sock --part 'cgroups$(reboot)'"),
            "{script}"
        );
        assert!(script.contains("dpkg -i /payload/new.deb"), "{script}");
        assert!(
            script.contains("setpriv --bounding-set -all --inh-caps -all"),
            "{script}"
        );
        assert!(script.contains("echo \"VMTEST bench $status\""), "{script}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bench.sh");
        std::fs::write(&path, &script).unwrap();
        let checked = Process::new("bash").arg("-n").arg(&path).status().unwrap();
        assert!(checked.success(), "{script}");
    }

    #[test]
    fn the_recorded_exposure_is_the_one_the_docs_state() {
        assert!(
            INSTALL_DOC.contains(&format!("exposure level {EXPOSURE}")),
            "docs/install.md must state `exposure level {EXPOSURE}`"
        );
    }

    #[test]
    fn the_metrics_drop_in_is_read_from_the_docs() {
        let drop_in = metrics_drop_in(INSTALL_DOC).unwrap();
        assert!(drop_in.starts_with(METRICS_DROP_IN), "{drop_in}");
        assert!(drop_in.contains("\n[Service]\n"), "{drop_in}");
        assert!(
            drop_in.ends_with("--metrics-listen 127.0.0.1:9464\n"),
            "{drop_in}"
        );
    }
}
