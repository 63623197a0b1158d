// SPDX-License-Identifier: GPL-2.0
/*
 * mark_victim: the OOM killer's choice of a tracked process.
 */
#include "maps.h"

/*
 * The OOM killer chose a process: if it is tracked, its cause says so. Its SIGKILL was
 * queued just before, in this same task, with the cgroup at its limit.
 */
SEC("tp_btf/mark_victim")
int liveness_oom(__u64 *ctx)
{
	__u32 tgid;
	__u64 start_ticks;

	if (bpf_core_field_exists(((struct trace_event_raw_mark_victim___task *)0)->uid)) {
		struct task_struct *victim = (struct task_struct *)ctx[0];

		tgid = tgid_seen_by_daemon(victim);
		start_ticks = process_start_ticks(victim);
	} else {
		/* Before Linux 6.8 only the victim's pid, in the initial namespace: the thread
		 * the killer found with memory, which is the leader unless the leader exited. */
		if (daemon_pidns_inum != PROC_PID_INIT_INO)
			return 0;
		tgid = (__u32)ctx[0];
		start_ticks = 0;
	}

	__u64 *expected_start = bpf_map_lookup_elem(&tracked, &tgid);

	if (!expected_start || (start_ticks && start_ticks != *expected_start))
		return 0;

	struct signal_cause *cause = bpf_map_lookup_elem(&causes, &tgid);

	if (cause && cause->target_start_ticks == *expected_start)
		cause->flags |= CAUSE_OOM_MARKED;
	return 0;
}
