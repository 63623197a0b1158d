/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The loader's settings, the maps and the helpers every hook's program shares. Included once,
 * by liveness.bpf.c, before the hooks' files: the programs are built as one translation unit
 * into one object, so each map exists once and the daemon loads them together.
 */
#ifndef LIVENESS_MAPS_H
#define LIVENESS_MAPS_H

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
 * The kernel text of the OOM killer's __oom_kill_process, [start, end), set by the loader
 * from /proc/kallsyms; both 0 when it could not be read.
 */
const volatile __u64 oom_kill_start = 0;
const volatile __u64 oom_kill_end = 0;

/*
 * How many entries of the members map the trees' members may hold, set by the loader. The
 * map has room for these plus one entry per tracked process, so members never take a
 * tracked process's room.
 */
const volatile __u64 max_members = 65536;

/*
 * How many of the max_members slots the processes forked by one uid (other than root) may
 * hold, set by the loader: one user's storm of forks leaves the rest to root and the others.
 */
const volatile __u64 max_members_per_uid = 16384;

/*
 * Set by the loader when the lineage programs are not pinned (the default): the fork and exit
 * programs then keep the lineages themselves, one program run per event instead of two.
 * Pinned, the lineage programs keep them and the fork and exit programs leave them alone.
 */
const volatile __u32 lineage_inline = 0;

/*
 * tgid -> the process's lineage: its ancestors when it was forked, copied from its parent's,
 * so that a process orphaned before its tree was followed still names who started it. Every
 * new process's is written at its fork and deleted at its exit, so the map holds the live
 * processes' only; when more live processes than it has room for have theirs, a new process
 * gets none. A plain preallocated hash, not an LRU one: an LRU map's pop and push of its
 * nodes, on every fork and exit of the machine, cost more than a hash's free list, and
 * evicting a live process's lineage for a new one's is no better than refusing the new one.
 * The daemon may pin this map and the lineage programs, and adopt them again when it
 * restarts.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, struct lineage);
} lineages SEC(".maps");

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

/* Per uid bucket (uid % UID_BUCKETS): its share of the member slots. Mapped by the daemon,
 * which keeps `used` like member_slots, and says in its status who is over budget. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, UID_BUCKETS);
	__type(key, __u32);
	__type(value, struct uid_share);
} uid_shares SEC(".maps");

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

/*
 * tgid -> the last killing signal sent to a tracked process, until its exit record takes it.
 * User space sets max_entries to the tracked map's.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, __u32);
	__type(value, struct signal_cause);
} causes SEC(".maps");

/*
 * root tgid -> the usage of the members of its tree that exited, until the root's exit record
 * takes it. User space sets max_entries to the tracked map's.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, __u32);
	__type(value, struct tree_usage);
} tree_usages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} exits SEC(".maps");

/*
 * The cgroup moves of tracked processes and members: a ring of its own, so that a storm of
 * moves (a user moving her process among her cgroups) fills it, never the exits ring.
 * 64 KiB: about 1,600 records.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} moves SEC(".maps");

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
 * The process's pid in the daemon's PID namespace, or 0 when the daemon cannot see it.
 * In the initial namespace (the usual case) that is task->tgid, and the verifier drops the
 * rest as dead code: only a daemon in a child namespace pays for the walk, and only there
 * do its field relocations have to resolve.
 */
static __always_inline __u32 tgid_in_daemon_pidns(struct task_struct *task);

static __always_inline __u32 tgid_seen_by_daemon(struct task_struct *task)
{
	if (daemon_pidns_inum == PROC_PID_INIT_INO)
		return task->tgid;
	return tgid_in_daemon_pidns(task);
}

/* The same for the current task, which only a helper gives, as an untyped pointer. */
static __always_inline __u32 current_tgid_seen_by_daemon(void)
{
	if (daemon_pidns_inum == PROC_PID_INIT_INO)
		return bpf_get_current_pid_tgid() >> 32;
	return tgid_in_daemon_pidns((struct task_struct *)bpf_get_current_task());
}

/* The walk of tgid_seen_by_daemon outside the initial namespace, through probe reads. */
static __always_inline __u32 tgid_in_daemon_pidns(struct task_struct *task)
{
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
 * Adds one to *used unless that makes it more than max, atomically. The count read after the
 * atomic add includes this add and every one before it, so of any set of adds the last sees
 * them all: no more than max succeed at once. No fetching atomics: Linux 5.10 lacks them.
 */
static __always_inline int take_within(__u64 *used, __u64 max)
{
	__sync_fetch_and_add(used, 1);
	if (*(volatile __u64 *)used <= max)
		return 1;
	__sync_fetch_and_add(used, -1);
	return 0;
}

/*
 * Takes one of the max_members slots and one of uid's share (root has no share of its own:
 * its processes are the administrator's), or none of either; a refusal for the share is
 * counted in the uid's bucket.
 */
static __always_inline int take_member_slot(__u32 uid)
{
	__u32 zero = 0, bucket = uid % UID_BUCKETS;
	__u64 *used = bpf_map_lookup_elem(&member_slots, &zero);
	struct uid_share *share = bpf_map_lookup_elem(&uid_shares, &bucket);

	if (!used || !share)
		return 0;
	if (!take_within(&share->used, uid ? max_members_per_uid : max_members)) {
		__sync_fetch_and_add(&share->refused, 1);
		share->last_refused_uid = uid;
		return 0;
	}
	if (take_within(used, max_members))
		return 1;
	__sync_fetch_and_add(&share->used, -1);
	return 0;
}

static __always_inline void release_member_slot(__u32 uid)
{
	__u32 zero = 0, bucket = uid % UID_BUCKETS;
	__u64 *used = bpf_map_lookup_elem(&member_slots, &zero);
	struct uid_share *share = bpf_map_lookup_elem(&uid_shares, &bucket);

	if (used)
		__sync_fetch_and_add(used, -1);
	if (share)
		__sync_fetch_and_add(&share->used, -1);
}

/*
 * Deletes tgid's entry, read as `entry` just before, and gives back its slot. Only the
 * deletion that succeeds gives it back: two threads, or user space, may race for it.
 */
static __always_inline void delete_entry(__u32 tgid, struct member_record *entry)
{
	__u32 flags = entry->flags, uid = entry->uid;

	if (bpf_map_delete_elem(&members, &tgid) == 0 && (flags & MEMBER_FLAG_COUNTED))
		release_member_slot(uid);
}

#endif /* LIVENESS_MAPS_H */
