//! The kernel's own view of pinned eBPF links, through bpf(2): whether a link (and the
//! program it attached) still exists, which a pin's path alone does not tell.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;

/// A link pinned somewhere, by the kernel's ids of it and of its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedLink {
    pub link_id: u32,
    pub prog_id: u32,
}

/// bpf(2) with an attribute of `N` 32-bit words; a descriptor (or 0) or the error.
fn bpf<const N: usize>(cmd: libc::c_long, attr: &mut [u32; N]) -> std::io::Result<i32> {
    // SAFETY: attr is a live, writable buffer of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as libc::c_uint,
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret as i32)
}

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: bpf(2) returned a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The link pinned at `path`, or `None` when the pin is no link (a map, say): a link's
/// fdinfo names its id and its program's.
fn link_at(path: &Path) -> Option<PinnedLink> {
    let name = CString::new(path.as_os_str().as_bytes()).ok()?;
    let address = name.as_ptr() as u64;
    let mut get = [address as u32, (address >> 32) as u32, 0, 0, 0];
    let fd = owned(bpf(BPF_OBJ_GET, &mut get).ok()?);
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
    };
    Some(PinnedLink {
        link_id: field("link_id:")?,
        prog_id: field("prog_id:")?,
    })
}

/// Every link pinned under `root`, at any depth.
pub fn pinned_links(root: &Path) -> Vec<PinnedLink> {
    let mut links = Vec::new();
    let mut dirs: Vec<PathBuf> = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                links.extend(link_at(&entry.path()));
            }
        }
    }
    links
}

/// Whether the kernel has let go of `link` and of its program: nothing runs it any more.
pub fn link_released(link: PinnedLink) -> bool {
    let gone = |cmd, id| {
        let mut attr = [id, 0, 0];
        match bpf(cmd, &mut attr) {
            Ok(fd) => {
                drop(owned(fd));
                false
            }
            Err(error) => error.raw_os_error() == Some(libc::ENOENT),
        }
    };
    gone(BPF_LINK_GET_FD_BY_ID, link.link_id) && gone(BPF_PROG_GET_FD_BY_ID, link.prog_id)
}
