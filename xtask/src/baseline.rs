//! The baseline of `cargo xtask bench --baseline REV`: `livenessd` and `liveness` of another
//! git revision, built in release mode once and kept, so that the benchmark can measure
//! them next to the working tree's build in the same run.
//!
//! The revision's tree is exported with `git archive` (no worktree to register or clean
//! up) into `target/bench-baseline/<commit>/src` and built there with its own `Cargo.lock`
//! (`--locked`) into `target/bench-baseline/target`, which every baseline shares: the
//! dependencies are compiled once, and the working tree's `target/release` is never
//! overwritten by binaries of the same name. The two binaries are then copied to
//! `target/bench-baseline/<commit>/bin`, which later runs reuse as they are.

use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use anyhow::{Context, Result, ensure};

use crate::dist::{self, BINARIES};
use crate::process::output;

/// A baseline ready to run: the directory of its binaries and what to call it.
#[derive(Debug)]
pub struct Baseline {
    pub bin_dir: PathBuf,
    pub name: String,
}

/// The binaries of `rev` (anything `git rev-parse` takes), built unless they already are.
pub fn of_revision(root: &Path, rev: &str) -> Result<Baseline> {
    let commit = String::from_utf8(output(
        Process::new("git")
            .current_dir(root)
            .args(["rev-parse", "--verify", "--end-of-options"])
            .arg(format!("{rev}^{{commit}}")),
    )?)?
    .trim()
    .to_owned();
    let name = format!("{rev} ({})", &commit[..commit.len().min(12)]);
    let home = crate::target_dir(root).join("bench-baseline");
    let dir = home.join(&commit);
    let bin_dir = dir.join("bin");
    if BINARIES.iter().all(|b| bin_dir.join(b).is_file()) {
        eprintln!("bench: baseline {name}: reusing {}", bin_dir.display());
        return Ok(Baseline { bin_dir, name });
    }
    let source = dir.join("src");
    if source.exists() {
        std::fs::remove_dir_all(&source)
            .with_context(|| format!("clearing {}", source.display()))?;
    }
    std::fs::create_dir_all(&source)?;
    eprintln!("bench: baseline {name}: building in {}", source.display());
    export(root, &commit, &source)?;
    let target = home.join("target");
    // An older commit may lack the fleet feature: a baseline is its default build.
    dist::build(&source, "release", &[], Some(&target))?;
    // Copied into a fresh directory that takes the final name last: an interrupted copy
    // is never taken for a finished one.
    let partial = dir.join("bin.partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    for binary in BINARIES {
        let built = target.join("release").join(binary);
        std::fs::copy(&built, partial.join(binary))
            .with_context(|| format!("copying {}", built.display()))?;
    }
    std::fs::rename(&partial, &bin_dir)?;
    std::fs::remove_dir_all(&source)?;
    Ok(Baseline { bin_dir, name })
}

/// A directory that already holds a `livenessd` and a `liveness` to compare with.
pub fn of_directory(dir: &Path) -> Result<Baseline> {
    for binary in BINARIES {
        ensure!(
            dir.join(binary).is_file(),
            "--baseline-bin {}: no {binary} there",
            dir.display()
        );
    }
    let bin_dir = std::path::absolute(dir)?;
    Ok(Baseline {
        name: bin_dir.display().to_string(),
        bin_dir,
    })
}

/// `git archive COMMIT | tar -x -m -C into`. The files take the time of the export, not
/// the commit's: the baselines share a target directory, where cargo would take an older
/// baseline's build of a crate for this one's, its sources being older than that build.
fn export(root: &Path, commit: &str, into: &Path) -> Result<()> {
    let mut archive = Process::new("git")
        .current_dir(root)
        .args(["archive", "--format=tar", commit])
        .stdout(Stdio::piped())
        .spawn()
        .context("running git archive")?;
    let tar = Process::new("tar")
        .args(["-x", "-m", "-C"])
        .arg(into)
        .stdin(archive.stdout.take().context("git archive's output")?)
        .status()
        .context("running tar")?;
    let archived = archive.wait()?;
    ensure!(
        archived.success() && tar.success(),
        "exporting {commit} failed (git archive {archived}, tar {tar})"
    );
    Ok(())
}
