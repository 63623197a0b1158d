// SPDX-License-Identifier: GPL-2.0
/*
 * Reports the death of tracked processes: one ring-buffer record per process, when its last
 * thread passes sched_process_exit.
 *
 * Also keeps the process trees of tracked processes: every new process (not thread) forked
 * by a tracked process or by a member joins the members map, attributed to the same root,
 * and leaves it when its last thread exits. User space reads the map; a member's exit is
 * not reported on the ring, since it ends nothing.
 *
 * Every tracked process has an entry in the members map too, naming itself as its tree's
 * root. So a process with no entry there is neither tracked nor a member, and its fork or
 * exit costs one hash lookup.
 */
#include "liveness.h"

#include <linux/bpf.h>
#include <linux/errno.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/*
 * Inode number of the daemon's PID namespace, set by the loader. Tracked processes are keyed
 * by the pid the daemon sees, so outside the initial namespace an exiting process's tgid is
 * translated into the daemon's namespace before the lookup.
 */
const volatile __u32 daemon_pidns_inum = PROC_PID_INIT_INO;

/*
 * How many entries of the members map the trees' members may hold, set by the loader. The
 * map has room for these plus one entry per tracked process, so members never take a
 * tracked process's room.
 */
const volatile __u64 max_members = 65536;

/* tgid -> expected start_ticks. User space overrides max_entries at load time. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, __u32);
	__type(value, __u64);
} tracked SEC(".maps");

/*
 * tgid -> the process's start time and its tree's root, for members and tracked processes.
 * User space sets max_entries to max_members plus the tracked map's size.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536 + 262144);
	__type(key, __u32);
	__type(value, struct member_record);
} members SEC(".maps");

/*
 * Entries of the members map flagged MEMBER_FLAG_COUNTED. Every writer, here or in user
 * space (which maps it), adds one before inserting and takes one after deleting, atomically,
 * so it never counts fewer than there are.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} member_slots SEC(".maps");

/*
 * The counters below are mapped by the daemon (BPF_F_MMAPABLE), which reads them without a
 * system call; every CPU adds to one shared slot, atomically.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MEMBER_COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} member_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 2 * 1024 * 1024);
} exits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void bump_in(void *map, __u32 slot)
{
	__u64 *count = bpf_map_lookup_elem(map, &slot);

	/* Its result unused, so a plain atomic add: Linux 5.10 has no fetching atomics. */
	if (count)
		__sync_fetch_and_add(count, 1);
}

static __always_inline void bump(__u32 slot)
{
	bump_in(&counters, slot);
}

/*
 * Not inlined so that struct exit_record, as its parameter type, is in the object's BTF: the
 * daemon's tests compare that BTF with the Rust layout. Runs only for reported deaths.
 */
static __noinline void fill_record(struct exit_record *record, __u64 start_ticks, __u32 tgid,
				   __u32 wait_status)
{
	record->start_ticks = start_ticks;
	record->exit_monotonic_ns = bpf_ktime_get_ns();
	record->tgid = tgid;
	record->wait_status = wait_status;
}

/*
 * The process's pid in the daemon's PID namespace, or 0 when the daemon cannot see it.
 * In the initial namespace (the usual case) that is task->tgid, and the verifier drops the
 * rest as dead code: only a daemon in a child namespace pays for the walk, and only there
 * do its field relocations have to resolve.
 */
static __always_inline __u32 tgid_seen_by_daemon(struct task_struct *task)
{
	if (daemon_pidns_inum == PROC_PID_INIT_INO)
		return task->tgid;

	/* The thread group's pid is the leader's, which stays attached until the group is reaped. */
	struct pid *pid = BPF_CORE_READ(task, group_leader, thread_pid);
	unsigned int level = BPF_CORE_READ(pid, level);
	__u64 numbers = (__u64)pid + bpf_core_field_offset(struct pid, numbers);

	for (unsigned int depth = 0; depth <= MAX_PID_NS_LEVEL; depth++) {
		struct upid upid = {};

		if (depth > level)
			break;
		if (bpf_probe_read_kernel(&upid, sizeof(upid),
					  (const void *)(numbers + depth * sizeof(struct upid))))
			break;
		if (BPF_CORE_READ(upid.ns, ns.inum) == daemon_pidns_inum)
			return upid.nr;
	}
	return 0;
}

/* The start time of the process a task belongs to, as /proc/<pid>/stat shows it. */
static __always_inline __u64 process_start_ticks(struct task_struct *task)
{
	return BPF_CORE_READ(task, group_leader, start_boottime) / NSEC_PER_CLOCK_TICK;
}

/*
 * Takes one of the max_members slots, or none when all are taken. The count read after the
 * atomic add includes this add and every one before it, so of any set of adds the last
 * sees them all: no more than max_members succeed at once. No fetching atomics: Linux 5.10
 * lacks them.
 */
static __always_inline int take_member_slot(void)
{
	__u32 zero = 0;
	__u64 *used = bpf_map_lookup_elem(&member_slots, &zero);

	if (!used)
		return 0;
	__sync_fetch_and_add(used, 1);
	if (*(volatile __u64 *)used <= max_members)
		return 1;
	__sync_fetch_and_add(used, -1);
	return 0;
}

static __always_inline void release_member_slot(void)
{
	__u32 zero = 0;
	__u64 *used = bpf_map_lookup_elem(&member_slots, &zero);

	if (used)
		__sync_fetch_and_add(used, -1);
}

/*
 * Deletes tgid's entry, read as `entry` just before, and gives back its slot. Only the
 * deletion that succeeds gives it back: two threads, or user space, may race for it.
 */
static __always_inline void delete_entry(__u32 tgid, struct member_record *entry)
{
	__u32 flags = entry->flags;

	if (bpf_map_delete_elem(&members, &tgid) == 0 && (flags & MEMBER_FLAG_COUNTED))
		release_member_slot();
}

/*
 * A new process joins the tree of its parent when the parent has an entry: as a tracked
 * process (the root) or as a member. Thread creation returns after one comparison; any
 * other fork of a process with no entry costs one hash lookup.
 */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(liveness_fork, struct task_struct *parent, struct task_struct *child)
{
	/* A thread joins its creator's thread group: not a new process. */
	if (child->pid != child->tgid)
		return 0;

	__u32 parent_tgid = tgid_seen_by_daemon(parent);
	struct member_record *parent_entry = bpf_map_lookup_elem(&members, &parent_tgid);

	/* A stale entry names an earlier process that had this pid. A tracked parent's entry
	 * names itself as the root, so its children join its tree even when it is a member of
	 * another tree as well (a nested session). */
	if (!parent_entry || parent_entry->start_ticks != process_start_ticks(parent))
		return 0;

	struct member_record member = {
		.root_start_ticks = parent_entry->root_start_ticks,
		.root_tgid = parent_entry->root_tgid,
		.flags = MEMBER_FLAG_COUNTED,
	};
	__u32 child_tgid = tgid_seen_by_daemon(child);

	if (!child_tgid)
		return 0;
	/* The child leads its own group, and copy_process set its start time already. */
	member.start_ticks = child->start_boottime / NSEC_PER_CLOCK_TICK;

	struct member_record *existing = bpf_map_lookup_elem(&members, &child_tgid);

	if (existing) {
		/* User space saw the child in /proc first and wrote its entry. */
		if (existing->start_ticks == member.start_ticks)
			return 0;
		/* An earlier process with this pid, gone. */
		delete_entry(child_tgid, existing);
	}
	if (!take_member_slot()) {
		bump_in(&member_counters, MEMBER_COUNTER_FULL);
		return 0;
	}
	/* Never over an entry written meanwhile: it may be a tracked process's. */
	long error = bpf_map_update_elem(&members, &child_tgid, &member, BPF_NOEXIST);

	if (error) {
		release_member_slot();
		/* Out of memory: the child is not followed here, so user space must scan. */
		if (error != -EEXIST)
			bump_in(&member_counters, MEMBER_COUNTER_FULL);
		return 0;
	}
	bump_in(&member_counters, MEMBER_COUNTER_ADDED);
	return 0;
}

/*
 * Only the first argument (task) is read: the second (group_dead) exists only from Linux
 * 6.16, and a program touching it fails to load on older kernels.
 */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(liveness_exit, struct task_struct *task)
{
	__u32 tgid = tgid_seen_by_daemon(task);
	struct member_record *entry = bpf_map_lookup_elem(&members, &tgid);

	/* Neither tracked nor a member: a tracked process always has an entry here. */
	if (!entry)
		return 0;

	/* do_exit decrements live before this tracepoint: non-zero means other threads remain,
	 * which covers thread exits and the threads execve's de_thread kills. */
	struct signal_struct *signal = task->signal;

	if (signal->live.counter != 0)
		return 0;

	/* The leader outlives its threads as a zombie, so it is valid even when a non-leader
	 * thread exits last; execve copies start_boottime to the thread that takes over. */
	struct task_struct *leader = task->group_leader;
	__u64 start_ticks = leader->start_boottime / NSEC_PER_CLOCK_TICK;

	/* A stale entry for an earlier process that had this PID. */
	if (start_ticks != entry->start_ticks)
		return 0;

	/* The process leaves its tree, or its own tree's root entry goes. Two threads exiting
	 * together can both get here: deleting twice is harmless. */
	delete_entry(tgid, entry);

	__u64 *expected_start = bpf_map_lookup_elem(&tracked, &tgid);

	if (!expected_start || start_ticks != *expected_start)
		return 0;

	/* Only one of two threads exiting together deletes it. */
	if (bpf_map_delete_elem(&tracked, &tgid) != 0)
		return 0;

	/* wait_task_zombie's rule. Both fields are set before this tracepoint: group_exit_code by
	 * do_group_exit or do_exit's synchronize_group_exit, exit_code by do_exit just above it
	 * (or earlier, when the leader exited before the last thread). */
	__u32 wait_status = (signal->flags & SIGNAL_GROUP_EXIT) ? signal->group_exit_code
								 : leader->exit_code;

	struct exit_record *record = bpf_ringbuf_reserve(&exits, sizeof(*record), 0);

	if (!record) {
		bump(COUNTER_LOST);
		return 0;
	}
	fill_record(record, start_ticks, tgid, wait_status);
	bpf_ringbuf_submit(record, 0);
	bump(COUNTER_EMITTED);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
