//! A small file system to fill: how tests reach a full disk.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A small tmpfs, mounted for the test's life (root only), so the disk can be filled
/// without touching the host's.
#[derive(Debug)]
pub struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    pub fn mount(size: &str) -> SmallFs {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let options = CString::new(format!("size={size},mode=0700")).unwrap();
        // SAFETY: all pointers are NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        SmallFs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the file system is full; returns its path.
    pub fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).expect("create the filler");
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // Whatever is left is less than one page: nothing more fits.
        let _ = file.write_all(&[0u8; 4096]);
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: detaching the mount this struct made.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}
