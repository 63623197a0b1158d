//! What the peer tools need from the machine, set up by the bench itself: Debian packages
//! (installed with apt-get when running as root), tracefs, and kernel headers for BCC.
//! Each step either succeeds or says why the tool that needs it is skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The path of `program` on PATH, if any.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

/// Makes sure `program` exists, installing `packages` with apt-get if it does not (as
/// root only; `apt-get update` once if the first attempt fails).
pub fn ensure_program(program: &str, packages: &[&str]) -> Result<PathBuf> {
    if let Some(path) = which(program) {
        return Ok(path);
    }
    install(packages)?;
    which(program).with_context(|| {
        format!(
            "{program} is still missing after installing {}",
            packages.join(" ")
        )
    })
}

/// `apt-get install -y --no-install-recommends PACKAGES`, with `apt-get update` and a second
/// attempt if the first fails (a stale package list).
pub fn install(packages: &[&str]) -> Result<()> {
    if !is_root() {
        bail!(
            "not root: cannot install {} (run the bench as root, or apt-get install them)",
            packages.join(" ")
        );
    }
    if which("apt-get").is_none() {
        bail!("no apt-get: install {} by hand", packages.join(" "));
    }
    let apt = |args: &[&str]| -> Result<bool> {
        eprintln!("bench: apt-get {}", args.join(" "));
        Ok(Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .context("running apt-get")?
            .success())
    };
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend_from_slice(packages);
    if apt(&install)? || (apt(&["update"])? && apt(&install)?) {
        return Ok(());
    }
    bail!("apt-get install {} failed", packages.join(" "))
}

/// tracefs at /sys/kernel/tracing, which the classic tracepoints of the peer tools need.
/// Mounted if it was not, and then unmounted when dropped.
#[derive(Debug)]
pub struct Tracefs {
    mounted_here: bool,
}

const TRACEFS: &str = "/sys/kernel/tracing";

impl Tracefs {
    pub fn ensure() -> Result<Tracefs> {
        if Path::new(TRACEFS).join("events").is_dir() {
            return Ok(Tracefs {
                mounted_here: false,
            });
        }
        let status = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", TRACEFS])
            .status()
            .context("running mount")?;
        if !status.success() {
            bail!("mount -t tracefs tracefs {TRACEFS} failed ({status})");
        }
        eprintln!("bench: mounted tracefs on {TRACEFS} (unmounted at the end)");
        Ok(Tracefs { mounted_here: true })
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.mounted_here {
            match Command::new("umount").arg(TRACEFS).status() {
                Ok(status) if status.success() => eprintln!("bench: unmounted {TRACEFS}"),
                other => eprintln!("bench: cannot unmount {TRACEFS}: {other:?}"),
            }
        }
    }
}

/// The `task_struct` members `exitsnoop-bpfcc` reads (its BPF program is compiled at start
/// from the kernel headers, so a header whose layout differs from the running kernel's
/// makes it read other fields).
const BCC_EXITSNOOP_READS: [&str; 5] = ["exit_code", "pid", "tgid", "real_parent", "start_time"];

/// Debian's kernel source the headers come from: the newest Debian 12 has.
const KERNEL_SOURCE_PACKAGE: &str = "linux-source-6.12";

/// Kernel headers for BCC on a kernel that ships none (no `/lib/modules/$(uname
/// -r)/build`, no `CONFIG_IKHEADERS`): Debian's kernel source, configured with the running
/// kernel's `/proc/config.gz` and prepared (`make olddefconfig prepare`), cached under
/// /var/cache/liveness-bench. Returns the directory to pass as `BCC_KERNEL_SOURCE`.
///
/// The source is of another kernel version, so the `task_struct` members exitsnoop reads
/// are checked against the running kernel's BTF (offsets computed by clang from both
/// sides). Where they all sit the same number of bytes later in the running kernel (members
/// that kernel added in front of them), the cached header gets that much padding before
/// `exit_state`, and the check runs again; any other difference is an error naming the
/// offsets.
pub fn bcc_kernel_headers() -> Result<PathBuf> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let root = Path::new("/var/cache/liveness-bench");
    let dir = root.join(format!("{KERNEL_SOURCE_PACKAGE}-for-{}", release.trim()));
    if dir.join(READY).is_file() {
        return Ok(dir);
    }
    let tarball = format!("/usr/src/{KERNEL_SOURCE_PACKAGE}.tar.xz");
    // What `make prepare` and the offset check need: a program on PATH or a file.
    let needs = [
        ("clang", "clang"),
        ("bpftool", "bpftool"),
        ("flex", "flex"),
        ("bison", "bison"),
        ("bc", "bc"),
        ("make", "make"),
        ("gcc", "gcc"),
        ("/usr/include/libelf.h", "libelf-dev"),
        ("/usr/include/openssl/ssl.h", "libssl-dev"),
        (tarball.as_str(), KERNEL_SOURCE_PACKAGE),
    ];
    let missing: Vec<&str> = needs
        .iter()
        .filter(|(what, _)| match what.strip_prefix('/') {
            Some(_) => !Path::new(what).exists(),
            None => which(what).is_none(),
        })
        .map(|&(_, package)| package)
        .collect();
    if !missing.is_empty() {
        install(&missing)?;
    }
    let tarball = PathBuf::from(tarball);
    let config = Path::new("/proc/config.gz");
    if !config.exists() {
        bail!("no /proc/config.gz: the running kernel's configuration is unknown");
    }
    let partial = root.join("partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial)?;
    eprintln!(
        "bench: preparing kernel headers for BCC in {} (about a minute)",
        dir.display()
    );
    run(Command::new("tar")
        .arg("-xJf")
        .arg(&tarball)
        .arg("-C")
        .arg(&partial))?;
    let source = partial.join(KERNEL_SOURCE_PACKAGE);
    run(Command::new("sh")
        .arg("-c")
        .arg("zcat /proc/config.gz > .config")
        .current_dir(&source))?;
    run(Command::new("make")
        .args(["olddefconfig"])
        .current_dir(&source))?;
    run(Command::new("make")
        .args(["-j2", "prepare"])
        .current_dir(&source))?;
    let vmlinux = source.join("liveness-bench-vmlinux.h");
    let dump = Command::new("bpftool")
        .args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "c",
        ])
        .output()
        .context("running bpftool")?;
    if !dump.status.success() {
        bail!(
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&dump.stderr)
        );
    }
    std::fs::write(&vmlinux, dump.stdout)?;
    let running = task_struct_offsets(&source, Side::RunningKernel)?;
    let mut headers = task_struct_offsets(&source, Side::Headers)?;
    if headers != running {
        let shift = running["exit_code"] as i64 - headers["exit_code"] as i64;
        if shift > 0
            && BCC_EXITSNOOP_READS
                .iter()
                .all(|f| running[*f] as i64 - headers[*f] as i64 == shift)
        {
            pad_before_exit_state(&source, shift as usize)?;
            headers = task_struct_offsets(&source, Side::Headers)?;
        }
    }
    if headers != running {
        bail!(
            "the task_struct members exitsnoop-bpfcc reads sit elsewhere in {KERNEL_SOURCE_PACKAGE}'s \
             headers than in the running kernel (headers {headers:?}, running kernel {running:?})"
        );
    }
    std::fs::write(source.join(READY), format!("{running:?}\n"))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&source, &dir)?;
    let _ = std::fs::remove_dir_all(&partial);
    Ok(dir)
}

/// Marks a finished, checked header directory.
const READY: &str = "liveness-bench-ready";

fn run(command: &mut Command) -> Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!("{command:?} failed ({}): {:?}", output.status, tail);
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Side {
    /// The prepared kernel source, as BCC compiles against it.
    Headers,
    /// The running kernel's BTF, dumped as C by bpftool.
    RunningKernel,
}

/// Offsets of [`BCC_EXITSNOOP_READS`] in `struct task_struct`, as clang lays it out from
/// one side's headers (x86-64 layout: BCC parses the headers for the host first).
fn task_struct_offsets(
    source: &Path,
    side: Side,
) -> Result<std::collections::BTreeMap<String, u64>> {
    let include = match side {
        Side::Headers => "#include <linux/sched.h>",
        Side::RunningKernel => "#include \"liveness-bench-vmlinux.h\"",
    };
    let mut program = format!("{include}\n");
    for field in BCC_EXITSNOOP_READS {
        program.push_str(&format!(
            "const unsigned long off_{field} = __builtin_offsetof(struct task_struct, {field});\n"
        ));
    }
    let file = source.join("liveness-bench-offsets.c");
    std::fs::write(&file, program)?;
    let mut clang = Command::new("clang");
    clang
        .current_dir(source)
        .args(["-S", "-emit-llvm", "-o", "-", "-w"]);
    if let Side::Headers = side {
        let resource = Command::new("clang").arg("-print-resource-dir").output()?;
        let resource = String::from_utf8(resource.stdout)?;
        clang
            .arg("-nostdinc")
            .arg("-isystem")
            .arg(format!("{}/include", resource.trim()));
        for dir in [
            "arch/x86/include",
            "arch/x86/include/generated",
            "include",
            "arch/x86/include/uapi",
            "arch/x86/include/generated/uapi",
            "include/uapi",
            "include/generated/uapi",
        ] {
            clang.arg(format!("-I{dir}"));
        }
        clang.args(["-include", "include/linux/kconfig.h", "-D__KERNEL__"]);
    }
    let output = clang.arg(&file).output().context("running clang")?;
    if !output.status.success() {
        bail!(
            "clang could not compute task_struct offsets from {side:?}: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .find(|l| l.contains("error"))
                .unwrap_or("")
        );
    }
    // Lines such as `@off_pid = dso_local constant i64 1264, align 8`.
    let ir = String::from_utf8(output.stdout)?;
    let offsets: std::collections::BTreeMap<String, u64> = ir
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("@off_")?.split_once(" = ")?;
            let value = rest
                .split(" i64 ")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), value))
        })
        .collect();
    if offsets.len() != BCC_EXITSNOOP_READS.len() {
        bail!("clang gave {offsets:?} for {side:?}, not every member exitsnoop reads");
    }
    Ok(offsets)
}

/// Inserts `shift` bytes of padding before `exit_state` in the source's `task_struct`.
fn pad_before_exit_state(source: &Path, shift: usize) -> Result<()> {
    let path = source.join("include/linux/sched.h");
    let text = std::fs::read_to_string(&path)?;
    let member = text
        .lines()
        .find(|l| l.split_whitespace().collect::<Vec<_>>() == ["int", "exit_state;"])
        .context("no `int exit_state;` in include/linux/sched.h")?;
    let padded = text.replacen(
        member,
        &format!("\tchar liveness_bench_pad[{shift}];\n{member}"),
        1,
    );
    std::fs::write(&path, padded)?;
    eprintln!(
        "bench: the running kernel has {shift} more bytes before task_struct.exit_state than \
         {KERNEL_SOURCE_PACKAGE}: padded the cached header"
    );
    Ok(())
}
