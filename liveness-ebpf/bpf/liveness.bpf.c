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
 *
 * Why a tracked process died, and what it cost: the last signal that kills by default sent
 * to it is kept with its sender (signal_generate), with the memory cgroup at its limit when
 * the kernel sends SIGKILL, the OOM killer's choice of it (mark_victim), and the CPU time of
 * its tree's members as they exit; its exit record carries all of it with its own usage. A
 * signal to any other process costs a comparison, or one lookup for the signals that kill.
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

/*
 * How many of the max_members slots the processes forked by one uid (other than root) may
 * hold, set by the loader: one user's storm of forks leaves the rest to root and the others.
 */
const volatile __u64 max_members_per_uid = 16384;

/*
 * tgid -> the process's lineage: its ancestors when it was forked, copied from its parent's,
 * so that a process orphaned before its tree was followed still names who started it. The
 * lineage programs write every new process's and delete it at its exit; least recently used
 * entries go first when it is full. The daemon may pin this map and those two programs, and
 * adopt them again when it restarts.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
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
 * The lineage programs touch the lineages map only, so that they can outlive the daemon
 * (pinned with the map in bpffs) while every other program and map is the running daemon's
 * own: orphans made while no daemon runs still name who started them. Each costs one more
 * program run per fork and per process exit.
 */

/* Every new process gets its lineage; thread creation returns after one comparison. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(lineage_fork, struct task_struct *parent, struct task_struct *child)
{
	if (child->pid != child->tgid)
		return 0;

	__u32 child_tgid = tgid_seen_by_daemon(child);

	if (child_tgid)
		record_lineage(tgid_seen_by_daemon(parent), process_start_ticks(parent), child_tgid,
			       child->start_boottime / NSEC_PER_CLOCK_TICK);
	return 0;
}

/* A process is gone: its descendants keep their own copies of its lineage. */
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
 * A new process joins the tree of its parent when the parent has an entry: as a tracked
 * process (the root) or as a member. Thread creation returns after one comparison; any other
 * fork of a process with no entry costs one hash lookup.
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

	struct member_record *parent_entry = bpf_map_lookup_elem(&members, &parent_tgid);

	/* A stale entry names an earlier process that had this pid. A tracked parent's entry
	 * names itself as the root, so its children join its tree even when it is a member of
	 * another tree as well (a nested session). */
	if (!parent_entry || parent_entry->start_ticks != process_start_ticks(parent))
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

	struct signal_cause cause = {
		.target_start_ticks = start_ticks,
		.signal = sig,
		.flags = CAUSE_SIGNAL,
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

	/* The OOM killer's SIGKILL comes before its victim's memory is freed: where a cgroup's
	 * limit stands, it is still at it. */
	if (sig == SIGKILL && cause.origin == ORIGIN_PRIV) {
		cause.oom_cgroup_id = cgroup_at_limit(task);
		cause.flags |= CAUSE_LIMITS_READ;
	}

	struct task_struct *sender = (struct task_struct *)bpf_get_current_task();

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

char LICENSE[] SEC("license") = "GPL";
