//! The project's programs, built fresh, and where other users can run them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Path of one of the project's programs, built fresh: the binaries, and the client
/// crate's examples (which cargo puts under `examples/`).
pub fn binary(name: &str) -> PathBuf {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = BIN_DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("LIVENESS_BIN_DIR") {
            return PathBuf::from(dir);
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "--quiet",
            "-p",
            "liveness-daemon",
            "-p",
            "liveness-cli",
            "-p",
            "liveness-client",
            "-p",
            "integration-tests",
            "--bins",
            "--examples",
        ]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        // The fleet tests need the daemon's etcd mirror, which is not in its default build.
        if cfg!(feature = "fleet") {
            build.args(["--features", "liveness-daemon/fleet"]);
        }
        let status = build
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo to build the binaries: {e}"));
        assert!(status.success(), "building the binaries failed: {status}");
        // target/<profile>/deps/<test> -> target/<profile>
        let exe = std::env::current_exe().expect("test executable path");
        exe.parent()
            .and_then(Path::parent)
            .expect("target/<profile> directory")
            .to_path_buf()
    });
    let path = dir.join(name);
    if path.exists() {
        return path;
    }
    let example = dir.join("examples").join(name);
    assert!(
        example.exists(),
        "{} is missing (nor is it an example)",
        path.display()
    );
    example
}

/// The project's binaries where another user can run them. A checkout under a private
/// directory (a 0700 home, say) keeps other users out, so the binaries are then hard-linked
/// (or copied) into an opened-up temporary directory, removed on drop.
#[derive(Debug)]
pub struct BinariesForAnyUser {
    dir: Option<tempfile::TempDir>,
}

impl BinariesForAnyUser {
    pub fn new() -> BinariesForAnyUser {
        let original = binary("liveness");
        let searchable = original
            .ancestors()
            .skip(1)
            .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
        if searchable {
            return BinariesForAnyUser { dir: None };
        }
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        for name in ["liveness", "livenessd"] {
            let (from, to) = (binary(name), dir.path().join(name));
            if std::fs::hard_link(&from, &to).is_err() {
                copy_executable(&from, &to);
            }
        }
        BinariesForAnyUser { dir: Some(dir) }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        match &self.dir {
            Some(dir) => dir.path().join(name),
            None => binary(name),
        }
    }
}

impl Default for BinariesForAnyUser {
    fn default() -> Self {
        Self::new()
    }
}

/// Copies an executable so that it can be run at once. `cp` writes it, not this process:
/// a process forked meanwhile by another test's thread would inherit a descriptor open for
/// writing the copy, and until that process execs, running the copy fails with ETXTBSY.
pub fn copy_executable(from: &Path, to: &Path) {
    let copied = Command::new("cp")
        .arg(from)
        .arg(to)
        .status()
        .unwrap_or_else(|e| panic!("run cp: {e}"));
    assert!(
        copied.success(),
        "cp {} {}: {copied}",
        from.display(),
        to.display()
    );
}
