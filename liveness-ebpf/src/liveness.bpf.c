// SPDX-License-Identifier: GPL-2.0
/*
 * Reports the death of tracked processes: one ring-buffer record per process, when its last
 * thread passes sched_process_exit. Exits of untracked processes cost two hash lookups
 * (tracked, members).
 *
 * Also keeps the process trees of tracked processes: every new process (not thread) forked
 * by a tracked process or by a member joins the members map, attributed to the same root,
 * and leaves it when its last thread exits. User space reads the map; a member's exit is
 * not reported on the ring, since it ends nothing.
 */
#include "liveness.h"

#include <linux/bpf.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/*
 * Inode number of the daemon's PID namespace, set by the loader. Tracked processes are keyed
 * by the pid the daemon sees, so outside the initial namespace an exiting process's tgid is
 * translated into the daemon's namespace before the lookup.
 */
const volatile __u32 daemon_pidns_inum = PROC_PID_INIT_INO;

/* tgid -> expected start_ticks. User space overrides max_entries at load time. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, __u32);
	__type(value, __u64);
} tracked SEC(".maps");

/* tgid -> the member's start time and its tree's root. User space overrides max_entries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct member_record);
} members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MEMBER_COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} member_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 2 * 1024 * 1024);
} exits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void bump_in(void *map, __u32 slot)
{
	__u64 *count = bpf_map_lookup_elem(map, &slot);

	/* Per-CPU slot, and a tracing program cannot nest with itself on one CPU. */
	if (count)
		*count += 1;
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
 * A new process joins the tree of its parent when the parent is tracked (a tree's root) or
 * a member. Thread creation returns after one comparison; an untracked fork costs two
 * hash lookups.
 */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(liveness_fork, struct task_struct *parent, struct task_struct *child)
{
	/* A thread joins its creator's thread group: not a new process. */
	if (child->pid != child->tgid)
		return 0;

	__u32 parent_tgid = tgid_seen_by_daemon(parent);
	__u64 parent_start = process_start_ticks(parent);
	struct member_record member = {};
	__u64 *root_start = bpf_map_lookup_elem(&tracked, &parent_tgid);

	if (root_start && *root_start == parent_start) {
		member.root_tgid = parent_tgid;
		member.root_start_ticks = parent_start;
	} else {
		struct member_record *parent_member = bpf_map_lookup_elem(&members, &parent_tgid);

		/* A stale entry names an earlier process that had this pid. */
		if (!parent_member || parent_member->start_ticks != parent_start)
			return 0;
		member.root_tgid = parent_member->root_tgid;
		member.root_start_ticks = parent_member->root_start_ticks;
	}

	__u32 child_tgid = tgid_seen_by_daemon(child);

	if (!child_tgid)
		return 0;
	/* The child leads its own group, and copy_process set its start time already. */
	member.start_ticks = child->start_boottime / NSEC_PER_CLOCK_TICK;
	if (bpf_map_update_elem(&members, &child_tgid, &member, BPF_ANY) != 0)
		bump_in(&member_counters, MEMBER_COUNTER_FULL);
	else
		bump_in(&member_counters, MEMBER_COUNTER_ADDED);
	return 0;
}

/* A member leaves its tree when its last thread exits (a tracked process may be a member
 * too). Two threads may both see live == 0: deleting twice is harmless. */
static __always_inline void leave_tree(struct task_struct *task, __u32 tgid,
				       struct member_record *member)
{
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return;
	if (process_start_ticks(task) == member->start_ticks)
		bpf_map_delete_elem(&members, &tgid);
}

/*
 * Only the first argument (task) is read: the second (group_dead) exists only from Linux
 * 6.16, and a program touching it fails to load on older kernels.
 */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(liveness_exit, struct task_struct *task)
{
	__u32 tgid = tgid_seen_by_daemon(task);
	struct member_record *member = bpf_map_lookup_elem(&members, &tgid);

	if (member)
		leave_tree(task, tgid, member);

	__u64 *expected_start = bpf_map_lookup_elem(&tracked, &tgid);

	if (!expected_start)
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
	if (start_ticks != *expected_start)
		return 0;

	/* Two threads exiting together can both see live == 0; only one deletion succeeds. */
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
