package liveness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// Capture reads the identity of a running process from /proc, without a daemon: what
// `liveness check --pid PID --json` prints. Where the kernel allows, a pidfd is held
// across the reads, so the pid cannot change hands unseen, and its pidfs inode (Linux
// 6.9+) joins the fingerprint. A process that is gone, or a zombie, is ErrNoSuchProcess.
func Capture(pid int) (Identity, error) {
	pidfd, err := pidfdOpen(pid)
	if err != nil {
		return Identity{}, err
	}
	if pidfd >= 0 {
		defer closeFd(pidfd)
	}
	st, err := readStat(pid)
	if err != nil {
		return Identity{}, err
	}
	if st.exited() {
		return Identity{}, fmt.Errorf("%w: %d is a zombie", ErrNoSuchProcess, pid)
	}
	if st.flags&pfKthread != 0 {
		return Identity{}, fmt.Errorf("liveness: PID %d (%s) is a kernel thread, which never exits like a process", pid, st.comm)
	}
	if tgid, err := tgidOf(pid); err != nil {
		return Identity{}, err
	} else if tgid != pid {
		return Identity{}, fmt.Errorf("liveness: %d is a thread of process %d, not a process", pid, tgid)
	}
	id := Identity{PID: uint32(pid), StartTicks: st.startTicks, Comm: st.comm}
	if pidfd >= 0 {
		// Read after the stat: still running now, so the stat was this process's.
		if pidfdExited(pidfd) {
			return Identity{}, fmt.Errorf("%w: %d exited while it was read", ErrNoSuchProcess, pid)
		}
		id.PidfsIno = pidfsIno(pidfd)
	}
	if id.PidfsIno == nil && !timeOffset().wholeTicks() {
		return Identity{}, errAmbiguousStart()
	}
	if id.BootID, err = readTrimmed("/proc/sys/kernel/random/boot_id"); err != nil {
		return Identity{}, err
	}
	if id.Host, err = readTrimmed("/proc/sys/kernel/hostname"); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// State is the answer of Check: alive, dead, or unknown.
type State string

// The states of Check, as `liveness check --json` names them.
const (
	Alive   State = "alive"
	Dead    State = "dead"
	Unknown State = "unknown"
)

// The reasons of a Dead verdict, as `liveness check --json` names them.
const (
	ReasonExited   = "exited"
	ReasonReused   = "owner_reused"
	ReasonRebooted = "rebooted"
)

// Liveness is the verdict of Check.
type Liveness struct {
	State State
	// Reason says why a process is Dead: ReasonExited, ReasonReused or ReasonRebooted.
	Reason string
	// Detail says it in words, and why a verdict is Unknown.
	Detail string
}

// Check judges an identity against this machine, without a daemon, as `liveness check
// --identity` does: Dead needs proof (the pid is gone or a zombie, its start time or
// pidfs inode differs, or the boot is an earlier one of this host); a fact that cannot be
// read, or a boot of another machine, is Unknown.
func Check(id Identity) Liveness {
	boot, err := readTrimmed("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return Liveness{State: Unknown, Detail: err.Error()}
	}
	if boot == id.BootID {
		return checkProcess(int(id.PID), id.StartTicks, id.PidfsIno)
	}
	host, err := readTrimmed("/proc/sys/kernel/hostname")
	switch {
	case err != nil:
		return Liveness{State: Unknown, Detail: err.Error()}
	case host == id.Host:
		return dead(ReasonRebooted, "the machine rebooted since the identity was captured")
	}
	return Liveness{State: Unknown, Detail: fmt.Sprintf(
		"the identity is of another boot on host %q (this is %q): another machine, or this one before a reboot and a rename", id.Host, host)}
}

func dead(reason, detail string) Liveness {
	return Liveness{State: Dead, Reason: reason, Detail: detail}
}

func checkProcess(pid int, startTicks uint64, knownIno *uint64) Liveness {
	// Opened before the stat is read, for the same reason as in Capture.
	held := -1
	if knownIno != nil {
		if fd, err := pidfdOpen(pid); err == nil && fd >= 0 {
			held = fd
			defer closeFd(fd)
		}
	}
	st, err := readStat(pid)
	if errors.Is(err, ErrNoSuchProcess) {
		return dead(ReasonExited, "the process exited")
	}
	if err != nil {
		return Liveness{State: Unknown, Detail: err.Error()}
	}
	if st.startTicks != startTicks {
		// In a time namespace whose offset is not whole ticks, a reading may be one tick
		// off: then only the pidfs inode can decide.
		within := st.startTicks+1 >= startTicks && startTicks+1 >= st.startTicks
		if timeOffset().wholeTicks() || !within {
			return dead(ReasonReused, "the PID now belongs to a different process")
		}
		if held < 0 {
			return Liveness{State: Unknown, Detail: errAmbiguousStart().Error()}
		}
	}
	if st.exited() {
		return dead(ReasonExited, "the process exited")
	}
	if held >= 0 {
		if now := pidfsIno(held); now != nil && *now != *knownIno {
			return dead(ReasonReused, "the PID now belongs to a different process")
		}
	}
	return Liveness{State: Alive, Detail: "the process is running"}
}

const pfKthread = 0x00200000

// stat holds the fields of /proc/<pid>/stat that liveness uses.
type stat struct {
	comm       string
	state      byte
	flags      uint64
	numThreads uint64
	startTicks uint64
}

// exited: a zombie or dying leader whose process counts no other thread.
func (s stat) exited() bool {
	return (s.state == 'Z' || s.state == 'X') && s.numThreads <= 1
}

// readStat reads /proc/<pid>/stat, its start time normalised to the initial time
// namespace. A missing pid is ErrNoSuchProcess.
func readStat(pid int) (stat, error) {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return stat{}, fmt.Errorf("%w: %d", ErrNoSuchProcess, pid)
	}
	if err != nil {
		return stat{}, err
	}
	st, err := parseStat(data)
	if err != nil {
		return stat{}, fmt.Errorf("liveness: malformed %s: %w", path, err)
	}
	st.startTicks = timeOffset().normalize(st.startTicks)
	return st, nil
}

// parseStat parses a stat line. The comm sits between the first '(' and the last ')': it
// may itself hold spaces and parentheses.
func parseStat(data []byte) (stat, error) {
	open, close := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || close < open {
		return stat{}, errors.New("no (comm)")
	}
	// Fields after the comm, numbered as in proc(5): 3 = state, 9 = flags,
	// 20 = num_threads, 22 = starttime.
	fields := strings.Fields(string(data[close+1:]))
	if len(fields) < 22-2 {
		return stat{}, errors.New("too few fields")
	}
	field := func(n int) (uint64, error) { return strconv.ParseUint(fields[n-3], 10, 64) }
	st := stat{comm: string(data[open+1 : close])}
	if len(fields[0]) != 1 {
		return stat{}, errors.New("state is not one character")
	}
	st.state = fields[0][0]
	var err error
	if st.flags, err = field(9); err != nil {
		return stat{}, err
	}
	if st.numThreads, err = field(20); err != nil {
		return stat{}, err
	}
	st.startTicks, err = field(22)
	return st, err
}

func tgidOf(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return 0, fmt.Errorf("%w: %d", ErrNoSuchProcess, pid)
	}
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "Tgid:") {
			return strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "Tgid:")))
		}
	}
	return 0, fmt.Errorf("liveness: /proc/%d/status has no Tgid", pid)
}

func readTrimmed(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	text := strings.TrimSpace(string(data))
	if text == "" {
		return "", fmt.Errorf("liveness: %s is empty", path)
	}
	return text, nil
}

// nanosPerTick: /proc start times count USER_HZ (100) ticks.
const nanosPerTick = 10_000_000

// boottimeOffset is this reader's time namespace's boottime offset, which /proc adds to
// the start times it shows.
type boottimeOffset int64

func (o boottimeOffset) wholeTicks() bool { return int64(o)%nanosPerTick == 0 }

// normalize turns a start time read here into the kernel's own count.
func (o boottimeOffset) normalize(ticks uint64) uint64 {
	offset := int64(o) / nanosPerTick
	if int64(o) < 0 && int64(o)%nanosPerTick != 0 {
		offset-- // floor, as the kernel's reading rounds down
	}
	n := int64(ticks) - offset
	if n < 0 {
		return 0
	}
	return uint64(n)
}

func errAmbiguousStart() error {
	return fmt.Errorf("liveness: start times read in this time namespace are ambiguous by one tick (its boottime offset, %d ns, is not a multiple of 10 ms) and this kernel has no pidfs inode to decide: capture identities outside this time namespace, or register the owner by pid", int64(timeOffset()))
}

var (
	offsetOnce sync.Once
	offset     boottimeOffset
)

// timeOffset is read once: /proc/self/timens_offsets, unless this kernel's /proc shows
// start times without it (Linux 5.10 does).
func timeOffset() boottimeOffset {
	offsetOnce.Do(func() {
		data, err := os.ReadFile("/proc/self/timens_offsets")
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "boottime" {
				secs, err1 := strconv.ParseInt(f[1], 10, 64)
				nanos, err2 := strconv.ParseInt(f[2], 10, 64)
				if err1 == nil && err2 == nil {
					offset = boottimeOffset(secs*1_000_000_000 + nanos)
				}
			}
		}
		if offset != 0 && !startTimesIncludeOffset(offset) {
			offset = 0
		}
	})
	return offset
}

// startTimesIncludeOffset asks the kernel, not its version: a child started now has a
// start time close to this namespace's CLOCK_BOOTTIME only when /proc adds the offset.
// Offsets under a second count as included: a probe cannot tell them from its own delay.
func startTimesIncludeOffset(o boottimeOffset) bool {
	child := exec.Command("/bin/true")
	if child.Start() != nil {
		return true // cannot tell: assume so, as the daemon does
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child.Process.Pid))
	var now syscall.Timespec
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 7 /* CLOCK_BOOTTIME */, uintptr(unsafe.Pointer(&now)), 0)
	child.Wait()
	st, perr := parseStat(data)
	if err != nil || perr != nil || errno != 0 {
		return true
	}
	nowTicks := now.Sec*(1_000_000_000/nanosPerTick) + now.Nsec/nanosPerTick
	lag := nowTicks - int64(st.startTicks)
	if lag < 0 {
		lag = -lag
	}
	limit := int64(o) / nanosPerTick / 2
	if limit < 0 {
		limit = -limit
	}
	if limit < 100 {
		limit = 100
	}
	return lag < limit
}
