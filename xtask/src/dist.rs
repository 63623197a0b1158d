//! `cargo xtask dist`: the release artifacts, in `target/artifacts/`:
//!
//! - `bin/liveness`, `bin/livenessd`: stripped; with `--debug-info`, each has a
//!   `.gnu_debuglink` to its debug info in `debug/NAME.debug` (`gdb` and `eu-stack` find it
//!   there or in a debuginfod);
//! - `completions/`: bash, zsh and fish, and `man/`: liveness(1), one page per subcommand
//!   and livenessd(8), all generated from the binaries' clap definitions;
//! - `liveness_VERSION_ARCH.deb`: the binaries, the systemd unit, the completions, the man
//!   pages, the changelog, the copyright and the maintainer scripts of `dist/debian/`, built
//!   with `dpkg-deb` (see the README's Dependencies for why);
//! - `clients/`: the TypeScript client's npm tarball and the Python client's wheel and sdist
//!   (`crate::clients`), unless `--no-clients`.
//!
//! Without `--debug-info` the binaries are those of `cargo build --release --features
//! liveness-daemon/fleet` (the etcd mirror, docs/fleet.md), so a release build made before
//! with the same features is reused as it is: debug info in the release profile
//! would make `target/release/livenessd` 50 MB instead of 9, and a profile of its own means
//! building everything again (3 minutes on 2 cores).

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, Result, bail, ensure};

use crate::process::output;

pub const BINARIES: [&str; 2] = ["liveness", "livenessd"];
const UNIT: &str = "dist/livenessd.service";
/// The maintainer scripts, the changelog, the copyright and the lintian overrides.
const DEBIAN: &str = "dist/debian";
const MAINTAINER_SCRIPTS: [&str; 3] = ["postinst", "prerm", "postrm"];
/// Where the package installs the binaries; the unit's `ExecStart` says the same, which a
/// test checks.
const PACKAGE_BIN_DIR: &str = "/usr/bin";
const MAINTAINER: &str = "liveness developers <liveness@example.invalid>";
/// Release tags are `v` and the version: `v0.1.0`.
const TAG_PREFIX: &str = "v";
/// The releases' commits, for clones without tags.
const RELEASES: &str = "dist/releases";

/// What `cargo xtask dist` was asked to do.
#[derive(Debug, Default)]
pub struct Options {
    /// Build with the `dist` profile (release code with full debug info) and keep the debug
    /// info in `debug/`, instead of reusing the release build.
    pub debug_info: bool,
    /// Also package the TypeScript and Python clients.
    pub clients: bool,
}

/// Builds the artifacts; returns the path of the .deb.
pub fn run(root: &Path, options: &Options) -> Result<PathBuf> {
    let out = root.join("target/artifacts");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    let profile = if options.debug_info {
        "dist"
    } else {
        "release"
    };
    build(root, profile, SHIPPED_FEATURES, None)?;
    let built = crate::target_dir(root).join(profile);
    for dir in ["bin", "completions", "man"] {
        std::fs::create_dir_all(out.join(dir))?;
    }
    let debug_dir = options.debug_info.then(|| out.join("debug"));
    if let Some(dir) = &debug_dir {
        std::fs::create_dir_all(dir)?;
    }
    for name in BINARIES {
        strip(
            &built.join(name),
            &out.join("bin").join(name),
            debug_dir.as_deref(),
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
    let mut shown = vec![out.join("bin/liveness"), out.join("bin/livenessd")];
    shown.extend(debug_dir.map(|dir| dir.join("livenessd.debug")));
    shown.push(deb.clone());
    if options.clients {
        shown.extend(crate::clients::package(
            root,
            &out,
            env!("CARGO_PKG_VERSION"),
        )?);
    }
    for file in shown {
        let size = std::fs::metadata(&file)?.len();
        println!("{:>12} bytes  {}", size, file.display());
    }
    Ok(deb)
}

/// The cargo features the shipped binaries are built with: the daemon's etcd mirror
/// (docs/fleet.md), which the default build leaves out.
pub const SHIPPED_FEATURES: &[&str] = &["--features", "liveness-daemon/fleet"];

/// Builds the two binaries of the workspace at `root` with `profile` and the cargo
/// arguments `features`, into `target_dir` if given (else where cargo would:
/// `CARGO_TARGET_DIR`, or `root/target`).
pub fn build(
    root: &Path,
    profile: &str,
    features: &[&str],
    target_dir: Option<&Path>,
) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Process::new(cargo);
    if let Some(dir) = target_dir {
        command.env("CARGO_TARGET_DIR", dir);
    }
    let status = command
        .current_dir(root)
        .args(["build", "--locked", "--profile", profile])
        .args(["-p", "liveness-cli", "-p", "liveness-daemon", "--bins"])
        .args(features)
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "cargo build --profile {profile} failed");
    Ok(())
}

/// Copies `built` to `stripped` without symbols or debug info (Debian policy), moving the
/// debug info to `debug_dir/NAME.debug`, linked by `.gnu_debuglink`, when there is one.
fn strip(built: &Path, stripped: &Path, debug_dir: Option<&Path>) -> Result<()> {
    let mut strip = Process::new("objcopy");
    // As dh_strip does: the compiler's .comment and .note are of no use at run time.
    strip.args([
        "--strip-all",
        "--remove-section=.comment",
        "--remove-section=.note",
    ]);
    if let Some(dir) = debug_dir {
        let name = stripped.file_name().context("a binary's name")?;
        let debug = dir.join(format!("{}.debug", name.to_string_lossy()));
        output(
            Process::new("objcopy")
                .arg("--only-keep-debug")
                .arg(built)
                .arg(&debug),
        )?;
        strip.arg(format!("--add-gnu-debuglink={}", debug.display()));
    }
    output(strip.arg(built).arg(stripped))?;
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
    let version = package_version(&version, describe(root)?.as_ref())?;
    let arch = String::from_utf8(output(Process::new("dpkg").arg("--print-architecture"))?)?
        .trim()
        .to_owned();
    let tree = tempfile::tempdir()?;
    let stage = tree.path();
    // The staged path of `to`, its directory created.
    let place = |to: &str| -> Result<PathBuf> {
        let target = stage.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().context("a path with a parent")?)?;
        Ok(target)
    };
    let install = |from: &Path, to: &str, mode: u32| -> Result<()> {
        let target = place(to)?;
        std::fs::copy(from, &target)
            .with_context(|| format!("copying {} to {to}", from.display()))?;
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        Ok(())
    };
    let write = |to: &str, text: &str| -> Result<()> {
        let target = place(to)?;
        std::fs::write(&target, text)?;
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
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
    ensure!(
        unit.lines()
            .any(|l| l.starts_with(&format!("ExecStart={PACKAGE_BIN_DIR}/livenessd"))),
        "{UNIT} must start {PACKAGE_BIN_DIR}/livenessd, where the package installs it"
    );
    install(
        &root.join(UNIT),
        "/lib/systemd/system/livenessd.service",
        0o644,
    )?;
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
        gzip(&stage.join(&target[1..]))?;
    }
    let debian = root.join(DEBIAN);
    let doc = "/usr/share/doc/liveness";
    let copyright = std::fs::read_to_string(debian.join("copyright"))?;
    write(
        &format!("{doc}/copyright"),
        &with_crates(&copyright, &linked_crates(root)?)?,
    )?;
    let changelog = std::fs::read_to_string(debian.join("changelog"))?;
    write(
        &format!("{doc}/changelog.Debian"),
        &changelog_for(&changelog, &version, &commit_date(root)?)?,
    )?;
    gzip(&stage.join(&doc[1..]).join("changelog.Debian"))?;
    install(
        &debian.join("lintian-overrides"),
        "/usr/share/lintian/overrides/liveness",
        0o644,
    )?;
    let control_dir = stage.join("DEBIAN");
    std::fs::create_dir_all(&control_dir)?;
    for script in MAINTAINER_SCRIPTS {
        install(&debian.join(script), &format!("/DEBIAN/{script}"), 0o755)?;
    }
    // dpkg --verify and debsums check the installed files against these.
    let md5sums = output(
        Process::new("sh")
            .arg("-c")
            .arg("find . -path ./DEBIAN -prune -o -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0r md5sum")
            .current_dir(stage),
    )?;
    std::fs::write(control_dir.join("md5sums"), md5sums)?;
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
             Maintainer: {MAINTAINER}\n\
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
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(stage)
            .arg(&deb),
    )?;
    Ok(deb)
}

/// Debian policy: man pages and changelogs compressed, reproducibly (no name or time stamp).
fn gzip(file: &Path) -> Result<()> {
    output(Process::new("gzip").arg("-9n").arg(file))?;
    Ok(())
}

/// Where HEAD stands from the newest release before it.
#[derive(Debug, PartialEq)]
struct Describe {
    /// The release's version (`0.1.0` for `v0.1.0`).
    tag: String,
    /// Commits since the release.
    commits: u32,
    /// HEAD's abbreviated commit id.
    hash: String,
}

/// `None` outside a git checkout (a source archive: its version is Cargo's) or before the
/// first release.
fn describe(root: &Path) -> Result<Option<Describe>> {
    if git(root, &["rev-parse", "HEAD"]).is_err() {
        return Ok(None);
    }
    let Some(release) = release_at_or_before(root, "HEAD")? else {
        return Ok(None);
    };
    Ok(Some(Describe {
        commits: git(
            root,
            &["rev-list", "--count", &format!("{}..HEAD", release.commit)],
        )?
        .parse()?,
        hash: git(root, &["rev-parse", "--short=7", "HEAD"])?,
        tag: release.version,
    }))
}

/// A release: its version (`0.1.0`) and its commit.
#[derive(Debug, PartialEq)]
pub struct Release {
    pub version: String,
    pub commit: String,
}

/// The newest release at `rev` or before it: by the `v*` tags, or, in a clone without
/// tags, by `dist/releases`.
pub fn release_at_or_before(root: &Path, rev: &str) -> Result<Option<Release>> {
    let tagged = git(root, &["tag", "--list", &format!("{TAG_PREFIX}[0-9]*")])?;
    if !tagged.is_empty() {
        let Ok(tag) = git(
            root,
            &[
                "describe",
                "--tags",
                "--abbrev=0",
                &format!("--match={TAG_PREFIX}[0-9]*"),
                rev,
            ],
        ) else {
            return Ok(None);
        };
        return Ok(Some(Release {
            commit: git(root, &["rev-parse", &format!("{tag}^{{commit}}")])?,
            version: tag
                .strip_prefix(TAG_PREFIX)
                .context("a release tag")?
                .to_owned(),
        }));
    }
    let mut newest: Option<Release> = None;
    for release in recorded_releases(&std::fs::read_to_string(root.join(RELEASES))?)? {
        let ancestor = Process::new("git")
            .current_dir(root)
            .args(["merge-base", "--is-ancestor", &release.commit, rev])
            .output()?;
        match ancestor.status.code() {
            Some(0) => {}
            Some(1) => continue,
            _ => bail!(
                "release {} ({}) is not in this clone: {} (a shallow clone? git fetch --unshallow)",
                release.version,
                release.commit,
                String::from_utf8_lossy(&ancestor.stderr).trim()
            ),
        }
        if newest
            .as_ref()
            .is_none_or(|n| version_key(&n.version) < version_key(&release.version))
        {
            newest = Some(release);
        }
    }
    Ok(newest)
}

/// The lines of `dist/releases`: `VERSION COMMIT`, `#` comments.
fn recorded_releases(text: &str) -> Result<Vec<Release>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (version, commit) = line
                .split_once(' ')
                .with_context(|| format!("{RELEASES}: `VERSION COMMIT`, not {line:?}"))?;
            ensure!(
                commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
                "{RELEASES}: a full commit id, not {commit:?}"
            );
            Ok(Release {
                version: version.to_owned(),
                commit: commit.to_owned(),
            })
        })
        .collect()
}

fn git(root: &Path, args: &[&str]) -> Result<String> {
    let output = Process::new("git").current_dir(root).args(args).output()?;
    ensure!(
        output.status.success(),
        "git {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// The package's version: Cargo's at its release tag (or outside git), and a version that
/// sorts after the tag's and before the next release's anywhere else, so that every build
/// of a later commit upgrades every build of an earlier one:
/// `0.1.0+git12.abc1234` (12 commits after v0.1.0), `0.2.0~git3.abc1234` (3 commits after
/// v0.1.0, with Cargo already at 0.2.0). `-1` is the Debian revision.
fn package_version(cargo: &str, describe: Option<&Describe>) -> Result<String> {
    let upstream = match describe {
        None => cargo.to_owned(),
        Some(d) if d.tag == cargo && d.commits == 0 => cargo.to_owned(),
        Some(d) if d.tag == cargo => format!("{cargo}+git{}.{}", d.commits, d.hash),
        Some(d) if version_key(&d.tag) < version_key(cargo) => {
            format!("{cargo}~git{}.{}", d.commits, d.hash)
        }
        Some(d) => bail!(
            "the newest release tag {TAG_PREFIX}{} is newer than the workspace's version \
             {cargo}: raise the version in Cargo.toml",
            d.tag
        ),
    };
    Ok(format!("{upstream}-1"))
}

fn version_key(version: &str) -> Vec<u64> {
    version.split('.').filter_map(|n| n.parse().ok()).collect()
}

/// HEAD's commit date (RFC 2822), the date of a snapshot's changelog entry: the same
/// commit gives the same package. Without git, the time of the build.
fn commit_date(root: &Path) -> Result<String> {
    let git = Process::new("git")
        .current_dir(root)
        .args(["log", "-1", "--format=%aD"])
        .output();
    if let Ok(result) = git
        && result.status.success()
    {
        return Ok(String::from_utf8(result.stdout)?.trim().to_owned());
    }
    Ok(String::from_utf8(output(Process::new("date").arg("-R"))?)?
        .trim()
        .to_owned())
}

/// `dist/debian/changelog` as shipped: its newest entry must be the package's version at a
/// release; a snapshot gets an entry of its own on top, saying what it was built from.
fn changelog_for(changelog: &str, version: &str, date: &str) -> Result<String> {
    let newest = changelog
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("liveness ("))
        .and_then(|rest| rest.split_once(')'))
        .map(|(v, _)| v)
        .with_context(|| format!("{DEBIAN}/changelog does not start with `liveness (VERSION)`"))?;
    if newest == version {
        return Ok(changelog.to_owned());
    }
    let snapshot = version.contains("~git") || version.contains("+git");
    ensure!(
        snapshot,
        "{DEBIAN}/changelog's newest entry is {newest}, the package is {version}: add an \
         entry for the release"
    );
    Ok(format!(
        "liveness ({version}) UNRELEASED; urgency=medium\n\n  \
         * Development snapshot, built from the source tree after {newest}.\n\n \
         -- {MAINTAINER}  {date}\n\n{changelog}"
    ))
}

/// The crates compiled into the binaries, `name version: license` (SPDX, as the crates
/// declare them), by `cargo tree` over the normal dependencies of the shipped packages.
fn linked_crates(root: &Path) -> Result<Vec<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let tree = String::from_utf8(output(
        Process::new(cargo)
            .current_dir(root)
            .args(["tree", "--locked", "-e", "normal", "--prefix", "none"])
            .args(["-p", "liveness-cli", "-p", "liveness-daemon"])
            .args(SHIPPED_FEATURES)
            .args(["-f", "{p}|{l}"]),
    )?)?;
    let mut crates: Vec<String> = tree
        .lines()
        // Proc macros run in the compiler; nothing of them is linked.
        .filter(|line| !line.contains("(proc-macro)") && !line.contains("(*)"))
        .filter_map(|line| {
            let (package, license) = line.split_once('|')?;
            let mut words = package.split_whitespace();
            let (name, version) = (words.next()?, words.next()?);
            if name.starts_with("liveness-") {
                return None;
            }
            Some(format!(
                "{name} {}: {}",
                version.trim_start_matches('v'),
                license.trim()
            ))
        })
        .collect();
    crates.sort();
    crates.dedup();
    ensure!(!crates.is_empty(), "cargo tree listed no crates");
    Ok(crates)
}

/// `dist/debian/copyright` with a comment in its header naming what the binaries contain
/// besides the project's own code.
fn with_crates(copyright: &str, crates: &[String]) -> Result<String> {
    let (header, rest) = copyright
        .split_once("\n\n")
        .context("a copyright file with a header paragraph")?;
    let mut comment = String::from(
        "Comment: The binaries are statically linked with the Rust crates below, from\n \
         crates.io, each under the license it declares; livenessd also contains SQLite\n \
         (public domain), compiled from the copy that libsqlite3-sys bundles.\n .\n",
    );
    for line in crates {
        comment += &format!(" {line}\n");
    }
    Ok(format!("{header}\n{}\n\n{rest}", comment.trim_end()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_owned()
    }

    /// A clone without tags (as CI's) builds the same package version as this checkout,
    /// and every v* tag is in dist/releases with its commit.
    #[test]
    fn a_clone_without_tags_finds_the_same_release() {
        let root = workspace();
        if git(&root, &["rev-parse", "HEAD"]).is_err() {
            return; // A source archive: no git, the version is Cargo's.
        }
        let recorded =
            recorded_releases(&std::fs::read_to_string(root.join(RELEASES)).unwrap()).unwrap();
        for tag in git(&root, &["tag", "--list", "v[0-9]*"]).unwrap().lines() {
            let commit = git(&root, &["rev-parse", &format!("{tag}^{{commit}}")]).unwrap();
            assert!(
                recorded.contains(&Release {
                    version: tag[1..].to_owned(),
                    commit
                }),
                "{tag} is missing from {RELEASES}"
            );
        }
        let clone = tempfile::tempdir().unwrap();
        let status = Process::new("git")
            .args(["clone", "-q", "--no-tags", "--no-checkout"])
            .arg(&root)
            .arg(clone.path())
            .status()
            .unwrap();
        assert!(status.success());
        // The clone describes this checkout's commit with this checkout's release list.
        let head = git(&root, &["rev-parse", "HEAD"]).unwrap();
        std::fs::create_dir_all(clone.path().join("dist")).unwrap();
        std::fs::copy(root.join(RELEASES), clone.path().join(RELEASES)).unwrap();
        git(clone.path(), &["update-ref", "--no-deref", "HEAD", &head]).unwrap();
        assert!(git(clone.path(), &["tag", "--list"]).unwrap().is_empty());
        let here = describe(&root).unwrap();
        assert_eq!(describe(clone.path()).unwrap(), here);
        assert_eq!(
            release_at_or_before(clone.path(), "HEAD^").unwrap(),
            release_at_or_before(&root, "HEAD^").unwrap()
        );
    }

    #[test]
    fn the_unit_starts_the_binary_where_the_package_installs_it() {
        let unit = include_str!("../../dist/livenessd.service");
        let exec: Vec<&str> = unit
            .lines()
            .filter_map(|l| l.strip_prefix("ExecStart="))
            .collect();
        assert_eq!(exec.len(), 1, "{exec:?}");
        assert!(
            exec[0].starts_with(&format!("{PACKAGE_BIN_DIR}/livenessd")),
            "{exec:?}"
        );
    }

    fn tagged(tag: &str, commits: u32) -> Describe {
        Describe {
            tag: tag.into(),
            commits,
            hash: "abc1234".into(),
        }
    }

    /// Every later build must upgrade an earlier one: dpkg compares these versions.
    #[test]
    fn each_build_sorts_after_the_builds_and_releases_before_it() {
        let versions = [
            package_version("0.1.0", Some(&tagged("0.1.0", 0))).unwrap(),
            package_version("0.1.0", Some(&tagged("0.1.0", 9))).unwrap(),
            package_version("0.1.0", Some(&tagged("0.1.0", 12))).unwrap(),
            package_version("0.2.0", Some(&tagged("0.1.0", 13))).unwrap(),
            package_version("0.2.0", Some(&tagged("0.2.0", 0))).unwrap(),
        ];
        assert_eq!(versions[0], "0.1.0-1");
        assert_eq!(versions[2], "0.1.0+git12.abc1234-1");
        assert_eq!(versions[3], "0.2.0~git13.abc1234-1");
        // The v0.1.0 tag's own package, built before there was a revision.
        let mut earlier = "0.1.0".to_owned();
        for later in versions {
            let status = Process::new("dpkg")
                .args(["--compare-versions", &earlier, "lt", &later])
                .status()
                .expect("dpkg");
            assert!(status.success(), "{earlier} < {later}");
            earlier = later;
        }
        assert_eq!(package_version("0.3.0", None).unwrap(), "0.3.0-1");
        assert!(package_version("0.1.0", Some(&tagged("0.2.0", 1))).is_err());
    }

    #[test]
    fn a_snapshot_gets_a_changelog_entry_and_a_release_needs_one() {
        let changelog = include_str!("../../dist/debian/changelog");
        assert_eq!(
            changelog_for(changelog, "0.1.0-1", "now").unwrap(),
            changelog
        );
        let snapshot =
            changelog_for(changelog, "0.1.0+git3.abc1234-1", "Thu, 26 Nov 2026").unwrap();
        assert!(
            snapshot.starts_with("liveness (0.1.0+git3.abc1234-1) UNRELEASED;"),
            "{snapshot}"
        );
        assert!(snapshot.ends_with(changelog));
        assert!(snapshot.contains("  Thu, 26 Nov 2026\n\nliveness (0.1.0-1)"));
        let error = changelog_for(changelog, "0.2.0-1", "now").unwrap_err();
        assert!(error.to_string().contains("add an entry"), "{error}");
    }

    #[test]
    fn the_linked_crates_go_into_the_copyright_header() {
        let copyright = include_str!("../../dist/debian/copyright");
        let text = with_crates(copyright, &["tokio 1.0.0: MIT".into()]).unwrap();
        let (header, rest) = text.split_once("\n\n").unwrap();
        assert!(header.starts_with("Format: "), "{header}");
        assert!(header.ends_with("\n tokio 1.0.0: MIT"), "{header}");
        assert!(rest.starts_with("Files: *"), "{rest}");
    }

    /// Binaries built with `cargo build --release` carry no debug info (it made them 50 MB);
    /// `dist --debug-info` keeps it, to split it off.
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
