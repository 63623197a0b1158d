package liveness

import (
	"fmt"
	"syscall"
	"unsafe"
)

// sysPidfdOpen is pidfd_open(2)'s number, the same on every architecture (Linux 5.3+);
// Go 1.19's syscall package does not name it.
const sysPidfdOpen = 434

// pidfdOpen opens a pidfd for pid: -1 where pidfds do not apply (a kernel before 5.3, a
// seccomp filter, a thread id), so that the daemon is given the number and says what is
// wrong with it; ErrNoSuchProcess when there is no such process.
func pidfdOpen(pid int) (int, error) {
	if pid <= 0 {
		return -1, fmt.Errorf("%w: %d", ErrNoSuchProcess, pid)
	}
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	switch errno {
	case 0:
		syscall.CloseOnExec(int(fd))
		return int(fd), nil
	case syscall.ESRCH:
		return -1, fmt.Errorf("%w: %d (it has exited, or is not in this PID namespace)", ErrNoSuchProcess, pid)
	}
	return -1, nil
}

func closeFd(fd int) { syscall.Close(fd) }

func unixRights(fds []int) []byte { return syscall.UnixRights(fds...) }

// pidfdExited reports whether the process behind pidfd has exited (its pidfd is readable),
// or cannot be told: then it is treated as gone rather than bound.
func pidfdExited(pidfd int) bool {
	fds := []struct {
		fd      int32
		events  int16
		revents int16
	}{{int32(pidfd), 0x1 /* POLLIN */, 0}}
	n, _, errno := syscall.Syscall(syscall.SYS_POLL, uintptr(unsafe.Pointer(&fds[0])), 1, 0)
	return errno != 0 || n != 0
}

// pidfsMagic is PIDFS_MAGIC: pidfds live in pidfs from Linux 6.9, where their inode
// numbers name processes.
const pidfsMagic = 0x50494446

// pidfsIno is the pidfs inode of a pidfd, nil before Linux 6.9.
func pidfsIno(pidfd int) *uint64 {
	var fs syscall.Statfs_t
	if syscall.Fstatfs(pidfd, &fs) != nil || uint64(fs.Type) != pidfsMagic {
		return nil
	}
	var st syscall.Stat_t
	if syscall.Fstat(pidfd, &st) != nil {
		return nil
	}
	ino := st.Ino
	return &ino
}
