//! Processes of other users: a plain one, and `testproc` run as one.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::binary;

/// Longest [`TestprocAs::read_line`] waits for a line.
const LINE_WAIT: Duration = Duration::from_secs(120);

/// A process owned by `uid` (`sleep 300`) that lives until dropped.
#[derive(Debug)]
pub struct UserProcess(Child);

impl UserProcess {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for UserProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn process_of(uid: u32) -> UserProcess {
    let child = Command::new("sleep")
        .arg("300")
        .uid(uid)
        .gid(uid)
        .spawn()
        .expect("spawn a process as another user");
    UserProcess(child)
}

/// `testproc ARGS...` run as user `uid` (and its group of the same number), with stdin
/// and stdout piped; killed and waited for on drop.
#[derive(Debug)]
pub struct TestprocAs {
    child: Child,
    pub to: Option<ChildStdin>,
    from: BufReader<std::process::ChildStdout>,
}

impl TestprocAs {
    pub fn spawn(uid: u32, args: &[&str]) -> TestprocAs {
        TestprocAs::spawn_niced(uid, 0, args)
    }

    /// [`TestprocAs::spawn`] at niceness `nice`.
    pub fn spawn_niced(uid: u32, nice: i32, args: &[&str]) -> TestprocAs {
        let mut command = Command::new(binary("testproc"));
        // SAFETY: setpriority is async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                Ok(())
            });
        }
        let mut child = command
            .args(args)
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run testproc {args:?} as uid {uid}: {e}"));
        TestprocAs {
            to: child.stdin.take(),
            from: BufReader::new(child.stdout.take().expect("stdout")),
            child,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line it prints, or `None` once its stdout closed. Fails the test when none
    /// comes within [`LINE_WAIT`]: a test waiting on a process or a daemon that never
    /// answers fails and says so, rather than hanging its whole run.
    pub fn read_line(&mut self) -> Option<String> {
        self.read_line_within(LINE_WAIT)
    }

    fn read_line_within(&mut self, wait: Duration) -> Option<String> {
        let pid = self.child.id();
        let deadline = Instant::now() + wait;
        loop {
            if self.from.buffer().contains(&b'\n') {
                return self.read_line_blocking();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "testproc {pid} printed no line within {wait:?}; {}",
                blocked_in(pid)
            );
            let mut waiting = [PollFd::new(self.from.get_ref(), PollFlags::IN)];
            let timeout = Timespec::try_from(left).expect("a timeout");
            match poll(&mut waiting, Some(&timeout)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => panic!("poll testproc's stdout: {e}"),
            }
            // Readable: take what came (a line, part of one, or the end).
            if self.from.fill_buf().map_or(true, |taken| taken.is_empty()) {
                return None;
            }
            if !self.from.buffer().contains(&b'\n') {
                // Part of a line: the rest follows at once.
                return self.read_line_blocking();
            }
        }
    }

    fn read_line_blocking(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.from.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        }
    }

    /// The lines it prints from now on, read on a thread of their own, so that a test can
    /// wait for one with a deadline. The process is dropped once its stdout closes.
    pub fn into_lines(mut self) -> std::sync::mpsc::Receiver<String> {
        let (lines, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            while let Some(line) = self.read_line_blocking() {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        received
    }
}

/// Where a process that should have answered waits, for the failure's message: for each
/// of its threads, its system call by name with its arguments (`/proc/PID/task/TID/syscall`)
/// and its kernel stack (`stack`, which root can read), so that a hang names the call it
/// is in, on whichever thread.
fn blocked_in(pid: u32) -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map_or_else(|e| format!("({e})"), |text| text.trim().to_owned())
    };
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .filter_map(|task| task.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    if tids.is_empty() {
        return format!("its threads cannot be listed (is {pid} gone?)");
    }
    tids.iter()
        .map(|tid| {
            let task = format!("/proc/{pid}/task/{tid}");
            let syscall = read(&format!("{task}/syscall"));
            format!(
                "thread {tid} ({}) waits in {} with the kernel stack:\n{}",
                read(&format!("{task}/comm")),
                named_syscall(&syscall),
                read(&format!("{task}/stack"))
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A line of `/proc/PID/task/TID/syscall` (`NR ARGS... SP PC`, `running` or `-1 SP PC`) with
/// the names of the calls a test's process may wait in.
fn named_syscall(line: &str) -> String {
    let Some((number, rest)) = line.split_once(' ') else {
        return line.to_owned();
    };
    let name = match number.parse::<libc::c_long>() {
        Ok(libc::SYS_read) => "read",
        Ok(libc::SYS_write) => "write",
        Ok(libc::SYS_close) => "close",
        Ok(libc::SYS_ppoll) => "ppoll",
        Ok(libc::SYS_connect) => "connect",
        Ok(libc::SYS_accept4) => "accept4",
        Ok(libc::SYS_sendto) => "sendto",
        Ok(libc::SYS_recvfrom) => "recvfrom",
        Ok(libc::SYS_sendmsg) => "sendmsg",
        Ok(libc::SYS_recvmsg) => "recvmsg",
        Ok(libc::SYS_wait4) => "wait4",
        Ok(libc::SYS_futex) => "futex",
        Ok(libc::SYS_epoll_pwait) => "epoll_pwait",
        Ok(libc::SYS_clock_nanosleep) => "clock_nanosleep",
        Ok(-1) => "no system call",
        _ => return format!("system call {line}"),
    };
    format!("{name} (system call {number} {rest})")
}

impl Drop for TestprocAs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `testproc` that prints `ready` and then nothing until its stdin ends.
    fn quiet() -> TestprocAs {
        let uid = rustix::process::geteuid().as_raw();
        let mut quiet = TestprocAs::spawn(uid, &["tree", "1"]);
        assert_eq!(quiet.read_line().as_deref(), Some("ready\n"));
        quiet
    }

    /// On a thread of its own, so that a wait that never ends fails this test rather than
    /// hanging the run.
    #[test]
    fn a_process_that_prints_nothing_fails_the_wait() {
        let mut quiet = quiet();
        let (done, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                quiet.read_line_within(Duration::from_millis(200))
            }));
            let _ = done.send(
                read.map_err(|panic| panic.downcast_ref::<String>().cloned().unwrap_or_default()),
            );
        });
        let failure = outcome
            .recv_timeout(Duration::from_secs(30))
            .expect("the 200 ms wait still waiting after 30 s")
            .expect_err("a line where testproc printed none");
        assert!(
            failure.contains("printed no line within 200ms"),
            "{failure}"
        );
        // It waits for its stdin to end: in read(2), named.
        let read = format!("waits in read (system call {} ", libc::SYS_read);
        assert!(failure.contains(&read), "{failure}");
    }

    #[test]
    fn the_end_of_output_is_none_and_not_a_failure() {
        let mut quiet = quiet();
        drop(quiet.to.take());
        assert_eq!(quiet.read_line_within(Duration::from_secs(60)), None);
    }
}
