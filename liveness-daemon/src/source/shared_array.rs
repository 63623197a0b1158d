//! An eBPF array of `u64` slots mapped into the daemon's memory (`BPF_F_MMAPABLE`): the
//! kernel's programs and the daemon both read and change its slots with atomic
//! instructions, and a read costs no system call (a death is read with none but the ring
//! buffer's).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{MapData, MapError};
use aya::sys::SyscallError;

/// See the module.
#[derive(Debug)]
pub struct SharedArray {
    first: NonNull<AtomicU64>,
    slots: usize,
    len: usize,
}

// SAFETY: the mapping is shared memory reached only through atomics, which any thread may
// use; it stays mapped until the owner drops it.
unsafe impl Send for SharedArray {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for SharedArray {}

impl SharedArray {
    /// Maps the `slots` slots of the array `map` (created `BPF_F_MMAPABLE`). The mapping
    /// keeps the map alive without its descriptor.
    pub fn map(map: &MapData, slots: usize) -> Result<SharedArray, MapError> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = (slots * size_of::<u64>()).div_ceil(page).max(1) * page;
        // SAFETY: maps the array's pages shared; the kernel checked at creation that the map
        // allows it (BPF_F_MMAPABLE), and refuses a length beyond its values.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MapError::SyscallError(SyscallError {
                call: "mmap",
                io_error: io::Error::last_os_error(),
            }));
        }
        Ok(SharedArray {
            first: NonNull::new(ptr.cast()).expect("mmap succeeded"),
            slots,
            len,
        })
    }

    /// Slot `slot`, which the kernel changes too.
    pub fn slot(&self, slot: u32) -> &AtomicU64 {
        let slot = slot as usize;
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
        // SAFETY: the pages are mapped, writable and 8-aligned for as long as `self`
        // lives, and `slot` is within the array.
        unsafe { self.first.add(slot).as_ref() }
    }

    /// The value of slot `slot` now.
    pub fn get(&self, slot: u32) -> u64 {
        self.slot(slot).load(Ordering::SeqCst)
    }
}

impl Drop for SharedArray {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; no reference to it outlives `self`.
        unsafe { libc::munmap(self.first.as_ptr().cast(), self.len) };
    }
}
