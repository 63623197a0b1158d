// SPDX-License-Identifier: GPL-2.0
/*
 * sched_process_exit: a process's lineage is dropped; a member's usage goes to its tree; a
 * tracked process's death is reported on the ring buffer with its status, cause and usage.
 */
#include "maps.h"

/* A process is gone: its descendants keep their own copies of its lineage. liveness_exit
 * does the same when the lineage programs are not pinned. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(lineage_exit, struct task_struct *task)
{
	if (task->signal->live.counter != 0)
		return 0;

	__u32 tgid = tgid_seen_by_daemon(task);

	bpf_map_delete_elem(&lineages, &tgid);
	return 0;
}

/*
 * The CPU time and peak memory of the process whose last thread `task` is, at its exit: the
 * threads gone before it are in the signal struct, the leader's own time only once it is
 * reaped, so a leader that exited first is added here.
 */
static __always_inline void usage_at_exit(struct task_struct *task, struct task_struct *leader,
					  struct signal_struct *signal, struct usage *usage)
{
	usage->user_ns = signal->utime + task->utime;
	usage->system_ns = signal->stime + task->stime;
	usage->runtime_ns = signal->sum_sched_runtime + task->se.sum_exec_runtime;
	if (leader != task) {
		usage->user_ns += leader->utime;
		usage->system_ns += leader->stime;
		usage->runtime_ns += leader->se.sum_exec_runtime;
	}
	usage->peak_rss_pages = signal->maxrss;
}

/*
 * Adds the usage of a member that exited to its tree's root. Its first member makes the
 * entry; a root's entry from an earlier process with its pid starts again. Concurrent
 * exits add atomically; the largest peak is a plain compare and store (no fetching atomics
 * on Linux 5.10), which two members racing may leave at the smaller of their peaks.
 */
static __always_inline void add_to_tree(__u32 root_tgid, __u64 root_start_ticks,
					struct usage *usage)
{
	/* Only while the root is tracked: its exit record, or its untracking, removes the entry. */
	__u64 *root_tracked = bpf_map_lookup_elem(&tracked, &root_tgid);

	if (!root_tracked || *root_tracked != root_start_ticks)
		return;

	struct tree_usage *tree = bpf_map_lookup_elem(&tree_usages, &root_tgid);

	if (!tree || tree->root_start_ticks != root_start_ticks) {
		struct tree_usage fresh = {.root_start_ticks = root_start_ticks};

		if (bpf_map_update_elem(&tree_usages, &root_tgid, &fresh, BPF_ANY)) {
			bump(COUNTER_USAGE_LOST);
			return;
		}
		tree = bpf_map_lookup_elem(&tree_usages, &root_tgid);
		if (!tree)
			return;
	}
	__sync_fetch_and_add(&tree->total.user_ns, usage->user_ns);
	__sync_fetch_and_add(&tree->total.system_ns, usage->system_ns);
	__sync_fetch_and_add(&tree->total.runtime_ns, usage->runtime_ns);
	__sync_fetch_and_add(&tree->exited, 1);
	if (usage->peak_rss_pages > tree->total.peak_rss_pages)
		tree->total.peak_rss_pages = usage->peak_rss_pages;
}

/*
 * Not inlined so that struct exit_record, as its parameter type, is in the object's BTF: the
 * daemon's tests compare that BTF with the Rust layout. Runs only for reported deaths: it
 * takes the process's cause and its tree's usage out of their maps. The caller sets the
 * status and the flags (five arguments at most).
 */
static __noinline void fill_record(struct exit_record *record, __u64 start_ticks, __u32 tgid,
				   struct usage *usage)
{
	record->start_ticks = start_ticks;
	record->exit_monotonic_ns = bpf_ktime_get_ns();
	record->tgid = tgid;
	record->usage = *usage;

	struct signal_cause *cause = bpf_map_lookup_elem(&causes, &tgid);

	if (cause && cause->target_start_ticks == start_ticks) {
		record->cause = *cause;
		record->flags |= EXIT_HAS_CAUSE;
	} else {
		__builtin_memset(&record->cause, 0, sizeof(record->cause));
	}
	if (cause)
		bpf_map_delete_elem(&causes, &tgid);

	struct tree_usage *tree = bpf_map_lookup_elem(&tree_usages, &tgid);

	if (tree && tree->root_start_ticks == start_ticks) {
		record->members = *tree;
		record->flags |= EXIT_HAS_MEMBERS;
	} else {
		__builtin_memset(&record->members, 0, sizeof(record->members));
	}
	if (tree)
		bpf_map_delete_elem(&tree_usages, &tgid);
	record->pad = 0;
}

/*
 * Only the first argument (task) is read: the second (group_dead) exists only from Linux
 * 6.16, and a program touching it fails to load on older kernels.
 */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(liveness_exit, struct task_struct *task)
{
	__u32 tgid = tgid_seen_by_daemon(task);

	/* do_exit decrements live before this tracepoint: non-zero means other threads remain,
	 * which covers thread exits and the threads execve's de_thread kills. */
	struct signal_struct *signal = task->signal;

	if (signal->live.counter != 0)
		return 0;

	if (lineage_inline)
		bpf_map_delete_elem(&lineages, &tgid);

	struct member_record *entry = bpf_map_lookup_elem(&members, &tgid);

	/* Neither tracked nor a member: a tracked process always has an entry here. */
	if (!entry)
		return 0;

	/* The leader outlives its threads as a zombie, so it is valid even when a non-leader
	 * thread exits last; execve copies start_boottime to the thread that takes over. */
	struct task_struct *leader = task->group_leader;
	__u64 start_ticks = leader->start_boottime / NSEC_PER_CLOCK_TICK;

	/* A stale entry for an earlier process that had this PID. */
	if (start_ticks != entry->start_ticks)
		return 0;

	struct usage usage;
	__u32 root_tgid = entry->root_tgid;
	__u64 root_start_ticks = entry->root_start_ticks;

	usage_at_exit(task, leader, signal, &usage);
	/* The process leaves its tree, or its own tree's root entry goes. Two threads exiting
	 * together can both get here: deleting twice is harmless. */
	delete_entry(tgid, entry);

	/* A member: its usage goes to its tree's root. Its exit ends nothing, unless it is
	 * tracked too: the last members of a session that lasts until its tree does. */
	if (root_tgid != tgid)
		add_to_tree(root_tgid, root_start_ticks, &usage);

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
	/* Set by mark_oom_victim for the process the OOM killer chose, on every kernel. */
	__u32 flags = signal->oom_mm ? EXIT_OOM_VICTIM : 0;

	struct exit_record *record = bpf_ringbuf_reserve(&exits, sizeof(*record), 0);

	if (!record) {
		bump(COUNTER_LOST);
		bpf_map_delete_elem(&causes, &tgid);
		bpf_map_delete_elem(&tree_usages, &tgid);
		return 0;
	}
	record->wait_status = wait_status;
	record->flags = flags;
	fill_record(record, start_ticks, tgid, &usage);
	bpf_ringbuf_submit(record, 0);
	bump(COUNTER_EMITTED);
	return 0;
}
