//! The clients' packages of `cargo xtask dist`, beside the .deb in `target/artifacts/`:
//!
//! - `clients/liveness-client-VERSION.tgz`: the TypeScript client as `npm pack` makes it,
//!   compiled, with its `.d.ts` types (`npm install` takes the file as it is);
//! - `clients/liveness_client-VERSION-py3-none-any.whl` and
//!   `clients/liveness-client-VERSION.tar.gz`: the Python client's wheel and sdist, built by
//!   setuptools' own backend without build isolation, so that Debian's `python3-setuptools`
//!   and `python3-wheel` suffice and nothing is fetched from PyPI.
//!
//! The Go module needs no archive: a program uses the source tree through `go.work` or a
//! `replace` line (clients/go/README.md). Every package carries the workspace's version, which
//! the clients' manifests must repeat: a difference is an error, not a silent mismatch.

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, Result, ensure};

use crate::process::output;

const TYPESCRIPT: &str = "clients/typescript";
const PYTHON: &str = "clients/python";
/// The distribution's name in both registries.
const NAME: &str = "liveness-client";

/// Builds the clients' packages into `out/clients`; returns their paths.
pub fn package(root: &Path, out: &Path, version: &str) -> Result<Vec<PathBuf>> {
    check_versions(root, version)?;
    let dir = out.join("clients");
    std::fs::create_dir_all(&dir)?;
    let mut built = vec![npm(root, &dir, version)?];
    built.extend(python(root, &dir, version)?);
    Ok(built)
}

/// The version in package.json and pyproject.toml, each of which must be the workspace's.
fn check_versions(root: &Path, version: &str) -> Result<()> {
    for (file, found) in manifest_versions(root)? {
        ensure!(
            found == version,
            "{file} says version {found}, the workspace {version}: give it the workspace's \
             version (Cargo.toml)"
        );
    }
    Ok(())
}

fn manifest_versions(root: &Path) -> Result<[(String, String); 2]> {
    let package_json = format!("{TYPESCRIPT}/package.json");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(&package_json))?)?;
    let npm_version = manifest["version"]
        .as_str()
        .context("a version in package.json")?
        .to_owned();
    let pyproject = format!("{PYTHON}/pyproject.toml");
    let py_version = toml_string(&std::fs::read_to_string(root.join(&pyproject))?, "version")
        .context("a version in pyproject.toml")?;
    Ok([(package_json, npm_version), (pyproject, py_version)])
}

/// The value of the first `key = "value"` line: enough for pyproject.toml's `[project]`,
/// whose `version` comes first.
fn toml_string(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// `npm ci`, then `npm pack`, whose `prepack` compiles the client afresh.
fn npm(root: &Path, dir: &Path, version: &str) -> Result<PathBuf> {
    let source = root.join(TYPESCRIPT);
    output(
        Process::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&source),
    )
    .context("npm ci in clients/typescript (the compiler comes from the npm registry)")?;
    output(
        Process::new("npm")
            .args(["pack", "--pack-destination"])
            .arg(dir)
            .current_dir(&source),
    )?;
    let tarball = dir.join(format!("{NAME}-{version}.tgz"));
    ensure!(tarball.exists(), "npm pack made no {}", tarball.display());
    Ok(tarball)
}

/// The sdist and the wheel, built from a copy of the client so that the checkout gets no
/// `build/` or `.egg-info`.
fn python(root: &Path, dir: &Path, version: &str) -> Result<Vec<PathBuf>> {
    let stage = tempfile::tempdir()?;
    let source = stage.path().join("python");
    output(
        Process::new("cp")
            .args(["-a", "--"])
            .arg(root.join(PYTHON))
            .arg(&source),
    )?;
    for leftover in ["build", "dist"] {
        let _ = std::fs::remove_dir_all(source.join(leftover));
    }
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    output(
        Process::new(python)
            .args([
                "-c",
                // The backend rewrites sys.argv for setup(): read it first.
                "import sys, setuptools.build_meta as backend\n\
                 out = sys.argv[1]\n\
                 backend.build_sdist(out)\n\
                 backend.build_wheel(out)",
            ])
            .arg(dir)
            .current_dir(&source),
    )
    .context("building the Python packages needs setuptools and wheel (python3-setuptools, python3-wheel)")?;
    // The wheel's name has `_` for `-` (PEP 427); setuptools 66 keeps the sdist's as it is.
    let built = [
        dir.join(format!("{NAME}-{version}.tar.gz")),
        dir.join(format!(
            "{}-{version}-py3-none-any.whl",
            NAME.replace('-', "_")
        )),
    ];
    for file in &built {
        ensure!(file.exists(), "setuptools made no {}", file.display());
    }
    Ok(built.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clients' manifests repeat the workspace's version, which `dist` checks: a release
    /// that raised one and not the others fails here first.
    #[test]
    fn the_clients_carry_the_workspace_version() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for (file, found) in manifest_versions(root).unwrap() {
            assert_eq!(found, env!("CARGO_PKG_VERSION"), "{file}");
        }
        assert_eq!(
            toml_string("[project]\nname = \"x\"\nversion = \"1.2.3\"\n", "version").as_deref(),
            Some("1.2.3")
        );
    }
}
