//! A throwaway child process whose death the daemon decides: sources prove with it, at
//! start, that they really see deaths here and with which facts, rather than trusting that
//! a loaded program or an existing syscall means they work.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::pipe::PipeFlags;

use liveness_common::exit::ExitStatus;
use liveness_proc::pidref::UnreapedChild;

/// The code the child exits with: distinctive, so a status that reads it is no accident.
pub const EXIT_CODE: u8 = 42;

/// A forked child that blocks until [`ProbeChild::release`], then exits with [`EXIT_CODE`].
/// Dropping it releases and reaps it, so it never outlives its owner as a zombie.
#[derive(Debug)]
pub struct ProbeChild {
    child: UnreapedChild,
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
                child: UnreapedChild::new(pid.unsigned_abs())
                    .ok_or_else(|| io::Error::other("fork returned no pid"))?,
                release: Some(write),
                reaped: false,
            }),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Lets the child exit.
    pub fn release(&mut self) {
        self.release = None;
    }

    /// Releases the child, waits for it and returns how it ended.
    pub fn reap(&mut self) -> io::Result<ExitStatus> {
        self.release();
        let status = self.child.reap()?;
        self.reaped = true;
        Ok(status)
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
    use liveness_proc::identity::ProcRoot;

    #[test]
    fn lives_until_released_then_exits_with_its_code() {
        let mut child = ProbeChild::spawn().unwrap();
        let stat = ProcRoot::default().stat(child.pid()).unwrap();
        assert_ne!(stat.state, 'Z', "the child must wait for its release");
        assert_eq!(
            child.reap().unwrap(),
            ExitStatus::Exited { code: EXIT_CODE }
        );
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
