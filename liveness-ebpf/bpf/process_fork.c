// SPDX-License-Identifier: GPL-2.0
/*
 * sched_process_fork: every new process's lineage, and the members of tracked processes'
 * trees.
 */
#include "maps.h"

/*
 * Records the lineage of `child`, a new process: its parent, then its parent's ancestors as
 * the parent's own lineage has them (when that is the parent's, not an earlier process's
 * with its pid).
 */
static __always_inline void record_lineage(__u32 parent_tgid, __u64 parent_start,
					   __u32 child_tgid, __u64 child_start)
{
	struct lineage *from = bpf_map_lookup_elem(&lineages, &parent_tgid);
	struct lineage fresh = {
		.start_ticks = child_start,
		.ancestors[0] = { .start_ticks = parent_start, .tgid = parent_tgid },
	};

	if (from && from->start_ticks == parent_start) {
		for (int i = 1; i < LINEAGE_DEPTH; i++)
			fresh.ancestors[i] = from->ancestors[i - 1];
	}
	bpf_map_update_elem(&lineages, &child_tgid, &fresh, BPF_ANY);
}

/*
 * The start time of the process `task` (a typed argument of the hook) belongs to: loads
 * through its BTF pointers, where process_start_ticks's CO-RE reads are two helper calls.
 */
static __always_inline __u64 leader_start_ticks(struct task_struct *task)
{
	return task->group_leader->start_boottime / NSEC_PER_CLOCK_TICK;
}

/*
 * The lineage programs touch the lineages map only, so that they can outlive the daemon
 * (pinned with the map in bpffs) while every other program and map is the running daemon's
 * own: orphans made while no daemon runs still name who started them. Each costs one more
 * program run per fork and per process exit, so they run only when pinned: otherwise the
 * fork and exit programs keep the lineages (lineage_inline).
 */

/* Every new process gets its lineage; thread creation returns after one comparison. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(lineage_fork, struct task_struct *parent, struct task_struct *child)
{
	if (child->pid != child->tgid)
		return 0;

	__u32 child_tgid = tgid_seen_by_daemon(child);

	if (child_tgid)
		record_lineage(tgid_seen_by_daemon(parent), leader_start_ticks(parent), child_tgid,
			       child->start_boottime / NSEC_PER_CLOCK_TICK);
	return 0;
}

/*
 * A new process joins the tree of its parent when the parent has an entry: as a tracked
 * process (the root) or as a member. Thread creation returns after one comparison; any other
 * fork of a process with no entry costs one hash lookup (and, when the lineage programs are
 * not pinned, the lookup of its parent's lineage and the write of its own).
 */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(liveness_fork, struct task_struct *parent, struct task_struct *child)
{
	/* A thread joins its creator's thread group: not a new process. */
	if (child->pid != child->tgid)
		return 0;

	__u32 parent_tgid = tgid_seen_by_daemon(parent);
	__u32 child_tgid = tgid_seen_by_daemon(child);
	/* The child leads its own group, and copy_process set its start time already. */
	__u64 child_start = child->start_boottime / NSEC_PER_CLOCK_TICK;

	if (!child_tgid)
		return 0;

	__u64 parent_start = leader_start_ticks(parent);

	if (lineage_inline)
		record_lineage(parent_tgid, parent_start, child_tgid, child_start);

	struct member_record *parent_entry = bpf_map_lookup_elem(&members, &parent_tgid);

	/* A stale entry names an earlier process that had this pid. A tracked parent's entry
	 * names itself as the root, so its children join its tree even when it is a member of
	 * another tree as well (a nested session). */
	if (!parent_entry || parent_entry->start_ticks != parent_start)
		return 0;

	/* The parent forks: current is the parent, whose real uid the child has too. */
	struct member_record member = {
		.start_ticks = child_start,
		.root_start_ticks = parent_entry->root_start_ticks,
		.root_tgid = parent_entry->root_tgid,
		.flags = MEMBER_FLAG_COUNTED,
		.uid = (__u32)bpf_get_current_uid_gid(),
	};

	struct member_record *existing = bpf_map_lookup_elem(&members, &child_tgid);

	if (existing) {
		/* User space saw the child in /proc first and wrote its entry. */
		if (existing->start_ticks == member.start_ticks)
			return 0;
		/* An earlier process with this pid, gone. */
		delete_entry(child_tgid, existing);
	}
	if (!take_member_slot(member.uid)) {
		bump_in(&member_counters, MEMBER_COUNTER_FULL);
		return 0;
	}
	/* Never over an entry written meanwhile: it may be a tracked process's. */
	long error = bpf_map_update_elem(&members, &child_tgid, &member, BPF_NOEXIST);

	if (error) {
		release_member_slot(member.uid);
		/* Out of memory: the child is not followed here, so user space must scan. */
		if (error != -EEXIST)
			bump_in(&member_counters, MEMBER_COUNTER_FULL);
		return 0;
	}
	bump_in(&member_counters, MEMBER_COUNTER_ADDED);
	return 0;
}
