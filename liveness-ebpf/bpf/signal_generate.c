// SPDX-License-Identifier: GPL-2.0
/*
 * signal_generate: the sender of the last killing signal queued to a tracked process.
 */
#include "maps.h"

/* Signals whose default action is to ignore or to stop: they never kill by themselves. */
#define SPARED_BY_DEFAULT                                                                      \
	((1U << 17) | (1U << 18) | (1U << 19) | (1U << 20) | (1U << 21) | (1U << 22) |         \
	 (1U << 23) | (1U << 28))

/* include/trace/events/signal.h: the signal was queued, or queued without its siginfo. */
#define TRACE_SIGNAL_DELIVERED 0
#define TRACE_SIGNAL_LOSE_INFO 4

/* include/linux/sched/signal.h: the special siginfo pointers of in-kernel senders. */
#define SEND_SIG_NOINFO 0
#define SEND_SIG_PRIV 1

#define SIGKILL 9

/* include/linux/page_counter.h: the limit of a cgroup that has none, in pages. */
#define PAGE_COUNTER_MAX (0x7fffffffffffffffUL / 4096)
/* The largest charge that can fail: a huge page, 512 pages. */
#define LARGEST_CHARGE 512
/* Memory cgroups nest deeper than this only in contrived trees. */
#define MAX_CGROUP_DEPTH 16

/*
 * The kernfs id of the nearest memory cgroup of `task` (its own, or an ancestor) whose
 * usage is within one charge of its limit: where a charge fails and the OOM killer runs
 * for the cgroup, not for the machine. 0 when none is. Read when the kernel sends SIGKILL,
 * before the victim's memory is freed.
 */
static __always_inline __u64 cgroup_at_limit(struct task_struct *task)
{
	struct css_set *cgroups = BPF_CORE_READ(task, cgroups);
	int id = bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);
	struct cgroup_subsys_state *css = 0;
	__u64 slot = (__u64)cgroups + bpf_core_field_offset(struct css_set, subsys) +
		     id * sizeof(css);

	if (!cgroups || bpf_probe_read_kernel(&css, sizeof(css), (const void *)slot))
		return 0;
	for (int depth = 0; depth < MAX_CGROUP_DEPTH && css; depth++) {
		struct mem_cgroup *memcg =
			(struct mem_cgroup *)((__u64)css - bpf_core_field_offset(struct mem_cgroup, css));
		unsigned long max = BPF_CORE_READ(memcg, memory.max);
		long usage = BPF_CORE_READ(memcg, memory.usage.counter);

		if (max < PAGE_COUNTER_MAX && usage + LARGEST_CHARGE > (long)max)
			return BPF_CORE_READ(memcg, css.cgroup, kn, id);
		css = BPF_CORE_READ(css, parent);
	}
	return 0;
}

/* Frames enough to pass the tracepoint's and the signal code's own to the OOM killer's. */
#define OOM_STACK_DEPTH 16

/*
 * Whether the OOM killer is sending this SIGKILL: its victim's, or a process's that shares
 * the victim's memory (CLONE_VM), which mark_victim never marks. The mark comes after the
 * SIGKILL, and the victim may be gone by then.
 */
static __always_inline int sent_by_oom_killer(__u64 *ctx)
{
	__u64 frames[OOM_STACK_DEPTH] = {};
	long bytes = bpf_get_stack(ctx, frames, sizeof(frames), 0);

	for (int i = 0; i < OOM_STACK_DEPTH; i++) {
		if (i * (long)sizeof(frames[0]) >= bytes)
			break;
		if (frames[i] - oom_kill_start < oom_kill_end - oom_kill_start)
			return 1;
	}
	return 0;
}

/*
 * What tells the kernel's SIGHUPs apart: a dying parent's death signal, an orphaned process
 * group's, a terminal's hang-up. The first two come from an exiting task of the target's
 * session (kill_orphaned_pgrp); a session leader's exit hangs up its terminal while it
 * still holds it (disassociate_ctty), a pty's master side from outside the session.
 */
static __always_inline void sender_context(struct task_struct *sender, struct task_struct *target,
					   struct signal_cause *cause)
{
	struct signal_struct *signal = BPF_CORE_READ(sender, signal);
	struct pid *session = BPF_CORE_READ(signal, pids[PIDTYPE_SID]);

	if (BPF_CORE_READ(sender, flags) & PF_EXITING)
		cause->flags |= CAUSE_SENDER_EXITING;
	if (session == BPF_CORE_READ(target, signal, pids[PIDTYPE_SID]))
		cause->flags |= CAUSE_SAME_SESSION;
	if (session == BPF_CORE_READ(sender, group_leader, thread_pid) &&
	    (BPF_CORE_READ(signal, tty) || BPF_CORE_READ(signal, tty_old_pgrp)))
		cause->flags |= CAUSE_SENDER_TTY_LEADER;
}

/*
 * Keeps the sender of every signal that kills by default queued to a tracked process: the
 * last one before its death is the one that killed it (its exit record checks the number).
 * SIGCHLD, raised at every exit of the machine, returns after one comparison; a killing
 * signal to a process that is not tracked after one lookup.
 */
SEC("tp_btf/signal_generate")
int BPF_PROG(liveness_signal, int sig, struct kernel_siginfo *info, struct task_struct *task,
	     int group, int result)
{
	if (sig <= 0 || sig > 64 || (sig < 32 && ((1U << sig) & SPARED_BY_DEFAULT)))
		return 0;
	if (result != TRACE_SIGNAL_DELIVERED && result != TRACE_SIGNAL_LOSE_INFO)
		return 0;

	__u32 tgid = tgid_seen_by_daemon(task);
	__u64 *expected_start = bpf_map_lookup_elem(&tracked, &tgid);

	if (!expected_start)
		return 0;

	__u64 start_ticks = process_start_ticks(task);

	if (start_ticks != *expected_start)
		return 0;
	/* Already dying of a signal it dequeued (a core dump takes its time): a later one is
	 * not what killed it, but for SIGKILL, which ends the dump and, from Linux 5.17, takes
	 * over the exit status. */
	if (sig != SIGKILL && (BPF_CORE_READ(task, flags) & PF_SIGNALED))
		return 0;

	/* The kernel dequeues a thread's own signals before the process's: a classic signal
	 * sent to the thread (tgkill, abort, a fault) and still pending there is delivered
	 * before this same signal sent to the process, whose sender is not the killer. */
	struct signal_cause *kept = bpf_map_lookup_elem(&causes, &tgid);

	if (group && sig < 32 && kept && kept->target_start_ticks == start_ticks &&
	    kept->signal == sig && (kept->flags & CAUSE_THREAD_DIRECTED) &&
	    (BPF_CORE_READ(task, pending.signal.sig[0]) & (1UL << (sig - 1))))
		return 0;

	struct signal_cause cause = {
		.target_start_ticks = start_ticks,
		.signal = sig,
		.flags = group ? CAUSE_SIGNAL : CAUSE_SIGNAL | CAUSE_THREAD_DIRECTED,
	};
	__u64 special = (__u64)info;

	if (special == SEND_SIG_NOINFO) {
		cause.origin = ORIGIN_NOINFO;
	} else if (special == SEND_SIG_PRIV) {
		cause.origin = ORIGIN_PRIV;
	} else {
		cause.origin = ORIGIN_SIGINFO;
		/* si_code follows si_signo and si_errno: the layout is user-space ABI. */
		bpf_probe_read_kernel(&cause.code, sizeof(cause.code), (void *)info + 8);
	}

	struct task_struct *sender = (struct task_struct *)bpf_get_current_task();

	/* A system call's siginfo is a local of the sender's, on its stack; a POSIX timer's
	 * is queued from the timer, never there: both say SI_TIMER. */
	if (special > SEND_SIG_PRIV) {
		__u64 address = 0;

		/* Its address as a number: Linux 5.10 refuses arithmetic on a BTF pointer. */
		bpf_probe_read_kernel(&address, sizeof(address), &ctx[1]);
		if (address - (__u64)BPF_CORE_READ(sender, stack) < THREAD_SIZE)
			cause.flags |= CAUSE_INFO_ON_STACK;
	}
	sender_context(sender, task, &cause);

	/* The OOM killer's SIGKILL comes before its victim's memory is freed: where a cgroup's
	 * limit stands, it is still at it. */
	if (sig == SIGKILL && cause.origin == ORIGIN_PRIV) {
		cause.oom_cgroup_id = cgroup_at_limit(task);
		cause.flags |= CAUSE_LIMITS_READ;
		if (oom_kill_end && sent_by_oom_killer(ctx))
			cause.flags |= CAUSE_OOM_KILLER;
	}

	struct task_struct *sender_leader = BPF_CORE_READ(sender, group_leader);

	cause.sender_tgid = current_tgid_seen_by_daemon();
	cause.sender_start_ticks =
		BPF_CORE_READ(sender_leader, start_boottime) / NSEC_PER_CLOCK_TICK;
	cause.sender_uid = (__u32)bpf_get_current_uid_gid();
	/* The process's command, as ps shows it, not the sending thread's name. */
	BPF_CORE_READ_STR_INTO(&cause.sender_comm, sender_leader, comm);

	/* The sender's tree, looked up now: a `kill` is gone long before user space reads this. */
	struct member_record *tree = bpf_map_lookup_elem(&members, &cause.sender_tgid);

	if (tree && tree->start_ticks == cause.sender_start_ticks) {
		cause.sender_root_tgid = tree->root_tgid;
		cause.sender_root_start_ticks = tree->root_start_ticks;
		cause.flags |= CAUSE_SENDER_IN_TREE;
	}
	if (bpf_map_update_elem(&causes, &tgid, &cause, BPF_ANY))
		bump(COUNTER_CAUSES_LOST);
	return 0;
}
