//! A crafted `/proc` for tests, here and in the daemon's engine: this boot's id and host
//! name, and processes with a stat line, a status and a PID namespace, written into a
//! temporary directory that a [`ProcRoot`] reads as `/proc`.

use std::path::Path;

use crate::identity::ProcRoot;

/// The boot id a [`FakeProc`] reports.
pub const BOOT_ID: &str = "boot-a";
/// The host name a [`FakeProc`] reports.
pub const HOST: &str = "devbox";

/// A `stat` line of `pid` as proc(5) lays it out, with the fields liveness does not read
/// zeroed (utime and stime are 3 and 4, distinct so that a swapped or shifted field shows).
pub fn stat_line(pid: u32, comm: &str, state: char, ppid: u32, start: u64) -> String {
    stat_line_threads(pid, comm, state, ppid, start, 1)
}

/// A `stat` line of a process with `threads` threads.
pub fn stat_line_threads(
    pid: u32,
    comm: &str,
    state: char,
    ppid: u32,
    start: u64,
    threads: u32,
) -> String {
    // Fields 3..=22 as proc(5) numbers them.
    let mut fields = vec!["0".to_owned(); 20];
    fields[0] = state.to_string();
    fields[1] = ppid.to_string();
    fields[11] = "3".to_owned();
    fields[12] = "4".to_owned();
    fields[17] = threads.to_string();
    fields[19] = start.to_string();
    format!("{pid} ({comm}) {} 0 0 0\n", fields.join(" "))
}

/// A crafted proc tree in a temporary directory, gone with it.
#[derive(Debug)]
pub struct FakeProc {
    dir: tempfile::TempDir,
}

impl Default for FakeProc {
    fn default() -> FakeProc {
        FakeProc::new()
    }
}

impl FakeProc {
    /// This boot's id ([`BOOT_ID`]) and host name ([`HOST`]), and no process.
    pub fn new() -> FakeProc {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root = dir.path();
        write(
            &root.join("sys/kernel/random/boot_id"),
            &format!("{BOOT_ID}\n"),
        );
        write(&root.join("sys/kernel/hostname"), &format!("{HOST}\n"));
        FakeProc { dir }
    }

    /// The directory read as `/proc`.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A reader of this tree.
    pub fn root(&self) -> ProcRoot {
        ProcRoot::new(self.path())
    }

    /// Process `pid` with the stat line `stat`, of uid 1000.
    pub fn with_raw(self, pid: u32, stat: &[u8]) -> FakeProc {
        self.process(pid, stat, "x", 1000);
        self
    }

    /// Process `pid` named `comm`, a child of `ppid`, started at tick `1000 + pid`.
    pub fn with(self, pid: u32, comm: &str, ppid: u32) -> FakeProc {
        let line = stat_line(pid, comm, 'S', ppid, 1000 + u64::from(pid));
        self.with_raw(pid, line.as_bytes())
    }

    /// Starts process `pid` of user `uid`, `proc<pid>`, a child of init started at tick
    /// `1000 + pid`, in the reader's PID namespace (so pids need no translation).
    pub fn spawn(&self, pid: u32, uid: u32) {
        let comm = format!("proc{pid}");
        let line = stat_line(pid, &comm, 'S', 1, 1000 + u64::from(pid));
        self.process(pid, line.as_bytes(), &comm, uid);
        let own = self.path().join("self/ns/pid");
        if !own.exists() {
            write(&own, "");
        }
        let dir = self.path().join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).expect("a ns directory");
        std::os::unix::fs::symlink(own, dir.join("ns/pid")).expect("a PID namespace link");
    }

    /// Process `pid` exits: it is gone from the tree.
    pub fn kill(&self, pid: u32) {
        std::fs::remove_dir_all(self.path().join(pid.to_string())).expect("a process to kill");
    }

    fn process(&self, pid: u32, stat: &[u8], name: &str, uid: u32) {
        let dir = self.path().join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("a process directory");
        std::fs::write(dir.join("stat"), stat).expect("a stat file");
        let status = format!("Name:\t{name}\nTgid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
        write(&dir.join("status"), &status);
    }
}

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("a directory");
    }
    std::fs::write(path, text).expect("a file");
}
