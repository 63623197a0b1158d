//! What a live process is doing now, for the daemon's activity sampler: its I/O counters
//! and the states of its threads (and where the blocked ones wait).

use crate::identity::{IdentityError, ProcRoot, Stat};

/// A process's I/O counters (`/proc/PID/io`): bytes passed to `read`- and `write`-like
/// calls, whatever the file (disk, pipe, socket, terminal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Io {
    pub rchar: u64,
    pub wchar: u64,
}

impl Io {
    /// Parses the `rchar:` and `wchar:` lines of `/proc/PID/io`.
    pub fn parse(text: &str) -> Option<Io> {
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
                .trim()
                .parse()
                .ok()
        };
        Some(Io {
            rchar: field("rchar")?,
            wchar: field("wchar")?,
        })
    }
}

/// How long a task has run, how long it waited, runnable, for a CPU, and how many times it
/// was put on one (`/proc/PID/schedstat`): the same at two reads, and the task not running
/// at the second, it did not run between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ran {
    pub runtime_ns: u64,
    pub wait_ns: u64,
    pub slices: u64,
}

impl Ran {
    /// Parses `runtime wait slices`; `None` for a kernel that keeps no scheduler
    /// statistics (it says `0 0 0`) or a line that does not read.
    pub fn parse(text: &str) -> Option<Ran> {
        let mut fields = text.split_ascii_whitespace();
        let runtime_ns = fields.next()?.parse().ok()?;
        let wait_ns = fields.next()?.parse().ok()?;
        let slices = fields.next()?.parse().ok()?;
        (slices > 0).then_some(Ran {
            runtime_ns,
            wait_ns,
            slices,
        })
    }
}

/// One thread of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    /// `R`, `S`, `D`, `T`, ... as in `/proc/PID/task/TID/stat`.
    pub state: char,
    /// Where a thread in uninterruptible sleep (`D`) waits (`wchan`), when the kernel says.
    pub wchan: Option<String>,
}

impl ProcRoot {
    /// The I/O counters of `pid`. Reading them takes the rights to ptrace the process.
    pub fn io(&self, pid: u32) -> Result<Io, IdentityError> {
        let rel = format!("{pid}/io");
        let bytes = self.read(&rel)?;
        Io::parse(&String::from_utf8_lossy(&bytes)).ok_or_else(|| IdentityError::Malformed {
            path: self.path().join(rel),
            what: "no rchar and wchar",
        })
    }

    /// How much `pid`'s main thread has run; `None` where the kernel does not say.
    pub fn ran(&self, pid: u32) -> Result<Option<Ran>, IdentityError> {
        self.schedstat(&pid.to_string())
    }

    /// The `schedstat` of the task whose directory is `rel`.
    fn schedstat(&self, rel: &str) -> Result<Option<Ran>, IdentityError> {
        let bytes = self.read(&format!("{rel}/schedstat"))?;
        Ok(Ran::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// How long the threads of `pid` have waited, runnable, for a CPU, summed over its
    /// threads alive now (one that exited takes its wait with it); `None` where the kernel
    /// does not say.
    pub fn waited_ns(&self, pid: u32) -> Result<Option<u64>, IdentityError> {
        let mut waited = None;
        for tid in self.tids(pid)? {
            if let Ok(Some(ran)) = self.schedstat(&format!("{pid}/task/{tid}")) {
                *waited.get_or_insert(0u64) += ran.wait_ns;
            }
        }
        Ok(waited)
    }

    /// The ids of the threads of `pid`.
    fn tids(&self, pid: u32) -> Result<Vec<String>, IdentityError> {
        let dir = self.path().join(format!("{pid}/task"));
        let entries = std::fs::read_dir(&dir).map_err(|source| match source.raw_os_error() {
            Some(libc::ENOENT | libc::ESRCH) => IdentityError::NoSuchProcess(pid),
            _ => IdentityError::Read { path: dir, source },
        })?;
        Ok(entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
            .collect())
    }

    /// The threads of `pid`, each with its state; a blocked one also with its `wchan`.
    /// Threads that exit meanwhile are left out.
    pub fn threads(&self, pid: u32) -> Result<Vec<Thread>, IdentityError> {
        let mut threads = Vec::new();
        for tid in self.tids(pid)? {
            let Ok(stat) = self.read(&format!("{pid}/task/{tid}/stat")) else {
                continue;
            };
            let Ok(stat) = Stat::parse(&stat) else {
                continue;
            };
            threads.push(self.thread(&stat, &format!("{pid}/task/{tid}")));
        }
        Ok(threads)
    }

    /// The threads of the process whose `stat` was just read: its own state stands for
    /// its one thread's, which spares reading its threads' directory.
    pub fn threads_of(&self, stat: &Stat) -> Result<Vec<Thread>, IdentityError> {
        if stat.num_threads == 1 {
            Ok(vec![self.thread(stat, &stat.pid.to_string())])
        } else {
            self.threads(stat.pid)
        }
    }

    /// The thread whose `stat` was read in the directory `rel`: a blocked one with its
    /// `wchan`.
    fn thread(&self, stat: &Stat, rel: &str) -> Thread {
        let wchan = (stat.state == 'D')
            .then(|| self.read(&format!("{rel}/wchan")).ok())
            .flatten()
            .map(|name| String::from_utf8_lossy(&name).trim().to_owned())
            .filter(|name| !name.is_empty() && name != "0");
        Thread {
            state: stat.state,
            wchan,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_counters_are_read_and_a_damaged_file_is_refused() {
        let text = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 0\n";
        assert_eq!(
            Io::parse(text),
            Some(Io {
                rchar: 10,
                wchar: 20
            })
        );
        assert_eq!(Io::parse("rchar: 10\n"), None);
        assert_eq!(Io::parse("rchar: x\nwchar: 1\n"), None);
    }

    #[test]
    fn this_process_has_its_io_and_threads_read() {
        let proc = ProcRoot::default();
        let pid = std::process::id();
        let before = proc.io(pid).expect("own io");
        std::fs::write(std::env::temp_dir().join(format!("io-{pid}")), [0u8; 4096]).unwrap();
        let after = proc.io(pid).expect("own io");
        assert!(after.wchar >= before.wchar + 4096, "{before:?} {after:?}");
        let threads = proc.threads(pid).expect("own threads");
        assert!(threads.iter().any(|t| t.state == 'R'), "{threads:?}");
        assert!(matches!(
            proc.threads(u32::MAX / 2),
            Err(IdentityError::NoSuchProcess(_))
        ));
        assert!(proc.waited_ns(pid).expect("own waits").is_some());
        assert!(matches!(
            proc.waited_ns(u32::MAX / 2),
            Err(IdentityError::NoSuchProcess(_))
        ));
        let _ = std::fs::remove_file(std::env::temp_dir().join(format!("io-{pid}")));
    }

    #[test]
    fn a_sleeping_process_shows_it_did_not_run_and_a_kernel_without_statistics_says_nothing() {
        let proc = ProcRoot::default();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let first = proc.ran(child.id()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let second = proc.ran(child.id()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(first.is_some() && first == second, "{first:?} {second:?}");
        let own = proc.ran(std::process::id()).unwrap().unwrap();
        assert!(own.slices >= 1);
        assert_eq!(Ran::parse("0 0 0\n"), None);
        assert_eq!(
            Ran::parse("12 5 3\n"),
            Some(Ran {
                runtime_ns: 12,
                wait_ns: 5,
                slices: 3
            })
        );
    }
}
