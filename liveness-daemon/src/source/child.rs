//! A throwaway child process whose death the daemon decides: sources prove with it, at
//! start, that they really see deaths here and with which facts, rather than trusting that
//! a loaded program or an existing syscall means they work.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::pipe::PipeFlags;

/// The code the child exits with: distinctive, so a status that reads it is no accident.
pub const EXIT_CODE: u8 = 42;

/// A forked child that blocks until [`ProbeChild::release`], then exits with [`EXIT_CODE`].
/// Dropping it releases and reaps it, so it never outlives its owner as a zombie.
#[derive(Debug)]
pub struct ProbeChild {
    pid: u32,
    release: Option<OwnedFd>,
    reaped: bool,
}

impl ProbeChild {
    pub fn spawn() -> io::Result<ProbeChild> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
        let (read_fd, write_fd) = (read.as_raw_fd(), write.as_raw_fd());
        // SAFETY: between fork and _exit the child calls only async-signal-safe functions
        // (close, read, _exit) on descriptors it inherited, and touches no Rust state, so the
        // other threads of a multi-threaded parent cannot have left anything it needs locked.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            // SAFETY: the child runs only the async-signal-safe calls described above, on
            // `byte`, a local it owns, and descriptors it inherited.
            0 => unsafe {
                libc::close(write_fd);
                let mut byte = 0u8;
                while libc::read(read_fd, (&raw mut byte).cast(), 1) > 0 {}
                libc::_exit(i32::from(EXIT_CODE))
            },
            pid => Ok(ProbeChild {
                pid: pid as u32,
                release: Some(write),
                reaped: false,
            }),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the child exit.
    pub fn release(&mut self) {
        self.release = None;
    }

    /// Releases the child, waits for it and returns its raw `wait(2)` status.
    pub fn reap(&mut self) -> io::Result<u32> {
        self.release();
        let mut status = 0;
        // SAFETY: waits for our own child into a local.
        let reaped = unsafe { libc::waitpid(self.pid as i32, &raw mut status, 0) };
        if reaped == -1 {
            return Err(io::Error::last_os_error());
        }
        self.reaped = true;
        Ok(status as u32)
    }
}

impl Drop for ProbeChild {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.reap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use liveness_common::exit::ExitStatus;
    use liveness_proc::identity::ProcRoot;

    #[test]
    fn lives_until_released_then_exits_with_its_code() {
        let mut child = ProbeChild::spawn().unwrap();
        let stat = ProcRoot::default().stat(child.pid()).unwrap();
        assert_ne!(stat.state, 'Z', "the child must wait for its release");
        let status = ExitStatus::from_wait_status(child.reap().unwrap());
        assert_eq!(status, ExitStatus::Exited { code: EXIT_CODE });
    }

    #[test]
    fn dropping_reaps_it() {
        let pid = ProbeChild::spawn().unwrap().pid();
        assert!(
            ProcRoot::default().stat(pid).is_err(),
            "a dropped probe child must be gone, not a zombie"
        );
    }
}
