//! `cargo xtask dist`: the release artifacts, in `target/artifacts/`:
//!
//! - `bin/liveness`, `bin/livenessd`: stripped, each with a `.gnu_debuglink` to its debug
//!   info in `debug/NAME.debug` (`gdb` and `eu-stack` find it there or in a debuginfod);
//! - `completions/`: bash, zsh and fish, and `man/`: liveness(1), one page per subcommand
//!   and livenessd(8), all generated from the binaries' clap definitions;
//! - `liveness_VERSION_ARCH.deb`: the binaries, the systemd unit, the completions and the
//!   man pages, built with `dpkg-deb` (see the README's Dependencies for why).

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, Result, bail, ensure};

/// The profile the artifacts are built with: release, with full debug info to split off.
const PROFILE: &str = "dist";
const BINARIES: [&str; 2] = ["liveness", "livenessd"];
const UNIT: &str = "dist/livenessd.service";
/// Where the package installs the binaries; the unit's `ExecStart` is rewritten to match.
const PACKAGE_BIN_DIR: &str = "/usr/bin";

pub fn run(root: &Path) -> Result<()> {
    let out = root.join("target/artifacts");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    build(root)?;
    let built = root.join("target").join(PROFILE);
    for dir in ["bin", "debug", "completions", "man"] {
        std::fs::create_dir_all(out.join(dir))?;
    }
    for name in BINARIES {
        split_debug_info(
            &built.join(name),
            &out.join("bin"),
            &out.join("debug"),
            name,
        )?;
    }
    let liveness = out.join("bin/liveness");
    for (shell, file) in [
        ("bash", "liveness.bash"),
        ("zsh", "_liveness"),
        ("fish", "liveness.fish"),
    ] {
        let script = output(Process::new(&liveness).args(["completions", shell]))?;
        std::fs::write(out.join("completions").join(file), script)?;
    }
    let man = out.join("man");
    output(Process::new(&liveness).arg("generate-man").arg(&man))?;
    output(
        Process::new(out.join("bin/livenessd"))
            .arg("--generate-man")
            .arg(&man),
    )?;
    let deb = package(root, &out)?;
    for file in [
        out.join("bin/liveness"),
        out.join("bin/livenessd"),
        out.join("debug/livenessd.debug"),
        deb,
    ] {
        let size = std::fs::metadata(&file)?.len();
        println!("{:>12} bytes  {}", size, file.display());
    }
    Ok(())
}

fn build(root: &Path) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Process::new(cargo)
        .current_dir(root)
        .args(["build", "--locked", "--profile", PROFILE])
        .args(["-p", "liveness-cli", "-p", "liveness-daemon", "--bins"])
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "cargo build --profile {PROFILE} failed");
    Ok(())
}

/// `bin_dir/NAME` without debug info or symbols, linked to `debug_dir/NAME.debug`.
fn split_debug_info(built: &Path, bin_dir: &Path, debug_dir: &Path, name: &str) -> Result<()> {
    let debug = debug_dir.join(format!("{name}.debug"));
    let stripped = bin_dir.join(name);
    output(
        Process::new("objcopy")
            .arg("--only-keep-debug")
            .arg(built)
            .arg(&debug),
    )?;
    output(
        Process::new("objcopy")
            .arg("--strip-all")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(built)
            .arg(&stripped),
    )?;
    Ok(())
}

/// Stages the package's tree and builds the .deb; returns its path.
fn package(root: &Path, out: &Path) -> Result<PathBuf> {
    // `liveness --version` prints "liveness VERSION".
    let version = String::from_utf8(output(
        Process::new(out.join("bin/liveness")).arg("--version"),
    )?)?;
    let version = version
        .split_whitespace()
        .nth(1)
        .context("a version in `liveness --version`")?
        .to_owned();
    let arch = String::from_utf8(output(Process::new("dpkg").arg("--print-architecture"))?)?
        .trim()
        .to_owned();
    let tree = tempfile::tempdir()?;
    let stage = tree.path();
    let install = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let target = stage.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().context("a path with a parent")?)?;
        std::fs::copy(from, &target)
            .with_context(|| format!("copying {} to {to}", from.display()))?;
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        Ok(())
    };
    for name in BINARIES {
        install(
            &out.join("bin").join(name),
            &format!("{PACKAGE_BIN_DIR}/{name}"),
            0o755,
        )?;
    }
    let unit = std::fs::read_to_string(root.join(UNIT))?;
    let unit = packaged_unit(&unit)?;
    let unit_path = out.join("livenessd.service");
    std::fs::write(&unit_path, unit)?;
    install(&unit_path, "/lib/systemd/system/livenessd.service", 0o644)?;
    let completions = out.join("completions");
    install(
        &completions.join("liveness.bash"),
        "/usr/share/bash-completion/completions/liveness",
        0o644,
    )?;
    install(
        &completions.join("_liveness"),
        "/usr/share/zsh/vendor-completions/_liveness",
        0o644,
    )?;
    install(
        &completions.join("liveness.fish"),
        "/usr/share/fish/vendor_completions.d/liveness.fish",
        0o644,
    )?;
    for page in std::fs::read_dir(out.join("man"))? {
        let page = page?.path();
        let section = page
            .extension()
            .and_then(|e| e.to_str())
            .context("a man page's section")?
            .to_owned();
        let name = page
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let target = format!("/usr/share/man/man{section}/{name}");
        install(&page, &target, 0o644)?;
        // Debian policy: man pages compressed, reproducibly (no name or time stamp).
        output(
            Process::new("gzip")
                .args(["-9n"])
                .arg(stage.join(&target[1..])),
        )?;
    }
    let copyright = stage.join("usr/share/doc/liveness/copyright");
    std::fs::create_dir_all(copyright.parent().context("doc dir")?)?;
    std::fs::write(
        &copyright,
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: liveness\n\nFiles: *\nLicense: MIT or Apache-2.0\n",
    )?;
    let control_dir = stage.join("DEBIAN");
    std::fs::create_dir_all(&control_dir)?;
    let installed_kib = String::from_utf8(output(
        Process::new("du")
            .args(["-sk", "--exclude=DEBIAN"])
            .arg(stage),
    )?)?
    .split_whitespace()
    .next()
    .unwrap_or("0")
    .to_owned();
    let glibc = glibc_needed(&BINARIES.map(|name| out.join("bin").join(name)))?;
    std::fs::write(
        control_dir.join("control"),
        format!(
            "Package: liveness\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: liveness developers <liveness@example.invalid>\n\
             Installed-Size: {installed_kib}\n\
             Depends: libc6 (>= {glibc})\n\
             Section: admin\n\
             Priority: optional\n\
             Homepage: https://example.invalid/liveness\n\
             Description: notifies session tools when the process owning a session dies\n \
             livenessd learns from the kernel (eBPF, pidfds, /proc) when the process that\n \
             owns a session exits, finalizes the session in SQLite and publishes the event\n \
             on a resumable stream over a Unix socket. `liveness` is its command line.\n"
        ),
    )?;
    let deb = out.join(format!("liveness_{version}_{arch}.deb"));
    output(
        Process::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(stage)
            .arg(&deb),
    )?;
    Ok(deb)
}

/// The unit as packaged: `ExecStart` names the packaged binary.
fn packaged_unit(unit: &str) -> Result<String> {
    let mut found = false;
    let lines: Vec<String> = unit
        .lines()
        .map(|line| match line.strip_prefix("ExecStart=") {
            Some(command) => {
                found = true;
                let args = command.split_once(' ').map_or("", |(_, rest)| rest);
                format!("ExecStart={PACKAGE_BIN_DIR}/livenessd {args}")
                    .trim_end()
                    .to_owned()
            }
            None => line.to_owned(),
        })
        .collect();
    ensure!(found, "{UNIT} has no ExecStart line");
    Ok(lines.join("\n") + "\n")
}

/// The newest glibc symbol version the binaries use: the package's libc6 dependency.
fn glibc_needed(binaries: &[PathBuf]) -> Result<String> {
    let mut newest: Vec<u32> = Vec::new();
    for binary in binaries {
        let symbols = String::from_utf8(output(Process::new("objdump").arg("-T").arg(binary))?)?;
        for version in symbols.split_whitespace().filter_map(|w| {
            w.trim_start_matches('(')
                .trim_end_matches(')')
                .strip_prefix("GLIBC_")
        }) {
            let parts: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
            if parts > newest {
                newest = parts;
            }
        }
    }
    if newest.is_empty() {
        bail!("no glibc symbol versions in the binaries (objdump -T)");
    }
    Ok(newest
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("."))
}

/// Runs a command, failing with its stderr unless it succeeds; returns its stdout.
fn output(command: &mut Process) -> Result<Vec<u8>> {
    let shown = format!("{command:?}");
    let result = command
        .output()
        .with_context(|| format!("running {shown}"))?;
    ensure!(
        result.status.success(),
        "{shown} failed ({}): {}",
        result.status,
        String::from_utf8_lossy(&result.stderr)
    );
    Ok(result.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packaged_unit_starts_the_packaged_binary() {
        let unit =
            "[Service]\nExecStart=/usr/local/bin/livenessd --wrapper npx\nRestart=on-failure\n";
        assert_eq!(
            packaged_unit(unit).unwrap(),
            "[Service]\nExecStart=/usr/bin/livenessd --wrapper npx\nRestart=on-failure\n"
        );
        assert!(packaged_unit("[Service]\n").is_err());
    }

    /// Binaries built with `cargo build --release` carry no debug info (it made them 50 MB);
    /// `dist` keeps it, to split it off.
    #[test]
    fn the_release_profile_ships_no_debug_info() {
        let manifest = include_str!("../../Cargo.toml");
        let section = |name: &str| {
            let start = manifest
                .find(&format!("[profile.{name}]"))
                .unwrap_or_else(|| panic!("no [profile.{name}]"));
            let rest = &manifest[start + 1..];
            rest[..rest.find("\n[").unwrap_or(rest.len())].to_owned()
        };
        let release = section("release");
        assert!(release.contains("debug = false"), "{release}");
        assert!(release.contains("strip = \"debuginfo\""), "{release}");
        assert!(section("dist").contains("debug = true"));
    }
}
