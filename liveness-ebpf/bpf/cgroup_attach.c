// SPDX-License-Identifier: GPL-2.0
/*
 * cgroup_attach_task: a tracked process or a member moved into another cgroup of the unified
 * hierarchy, which may be an escape from its session's cgroup.
 */
#include "maps.h"

/*
 * Not inlined so that struct move_record, as its parameter type, is in the object's BTF: the
 * daemon's tests compare that BTF with the Rust layout.
 */
static __noinline void fill_move(struct move_record *record, struct member_record *entry,
				 __u32 tgid, __u64 cgroup_id)
{
	record->start_ticks = entry->start_ticks;
	record->root_start_ticks = entry->root_start_ticks;
	record->cgroup_id = cgroup_id;
	record->tgid = tgid;
	record->root_tgid = entry->root_tgid;
}

/*
 * A write to a cgroup.procs (or cgroup.threads) file moved `task` (the process's leader, or
 * one thread) into `dst_cgrp`; `path` is the kernel's own formatting of it, unread here. The
 * same arguments since Linux 4.19. Moves into a cgroup-v1 hierarchy (a hybrid host's) are
 * not the sessions': they return after two loads. Any other move of a process with no entry
 * in the members map costs one hash lookup; a tracked process's or a member's, whether it is
 * an escape or not (the daemon knows the session's cgroup), is one record on the moves ring,
 * whose filling drops records but never takes a death's room on the exits ring.
 */
SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(liveness_move, struct cgroup *dst_cgrp, const char *path,
	     struct task_struct *task)
{
	/* The unified hierarchy is hierarchy 0 (as /proc/cgroups shows it). */
	if (dst_cgrp->root->hierarchy_id != 0)
		return 0;

	__u32 tgid = tgid_seen_by_daemon(task);
	struct member_record *entry = bpf_map_lookup_elem(&members, &tgid);

	/* None, or a stale one naming an earlier process with this pid. */
	if (!entry || entry->start_ticks != process_start_ticks(task))
		return 0;

	struct move_record *record = bpf_ringbuf_reserve(&moves, sizeof(*record), 0);

	if (!record)
		return 0;
	fill_move(record, entry, tgid, dst_cgrp->kn->id);
	bpf_ringbuf_submit(record, 0);
	return 0;
}
