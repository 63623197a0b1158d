/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Kernel types read by liveness.bpf.c, and the ring-buffer record shared with user space.
 *
 * Only the fields the program reads are declared. preserve_access_index makes clang emit
 * CO-RE relocations, so the loader patches every offset for the running kernel: these
 * declarations need not match any kernel's real layout, only its field names.
 */
#ifndef LIVENESS_H
#define LIVENESS_H

#include <linux/types.h>

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	/* Threads that have not yet passed do_exit's atomic_dec_and_test. */
	atomic_t live;
	unsigned int flags;
	int group_exit_code;
	/* CPU time of the threads already gone, in nanoseconds: sampled at ticks (utime,
	 * stime) and exact (sum_sched_runtime). */
	__u64 utime;
	__u64 stime;
	__u64 sum_sched_runtime;
	/* The process's peak resident set, in pages: do_exit raises it before the tracepoint. */
	unsigned long maxrss;
	/* Set by mark_oom_victim, once, when the OOM killer chose the process. */
	struct mm_struct *oom_mm;
	/* Indexed by enum pid_type: pids[PIDTYPE_SID] is the session's. */
	struct pid *pids[4];
	/* The controlling terminal, and the foreground group of the one that hung up. */
	struct tty_struct *tty;
	struct pid *tty_old_pgrp;
};

struct ns_common {
	unsigned int inum;
};

struct pid_namespace {
	struct ns_common ns;
};

/* A process's pid in one namespace. Unchanged since Linux 2.6.24, so its size is used as is. */
struct upid {
	int nr;
	struct pid_namespace *ns;
};

/* numbers[i] is the pid in the namespace at depth i, for i = 0 .. level. */
struct pid {
	unsigned int level;
	struct upid numbers[1];
};

struct sched_entity {
	__u64 sum_exec_runtime;
};

/* The signals 1 to 64 pending, bit n - 1 for signal n (x86-64 and arm64: one word). */
typedef struct {
	unsigned long sig[1];
} sigset_t;

struct sigpending {
	sigset_t signal;
};

struct task_struct {
	/* PF_* bits. */
	unsigned int flags;
	/* The task's kernel stack, THREAD_SIZE bytes. */
	void *stack;
	int exit_code;
	int pid;
	int tgid;
	struct task_struct *group_leader;
	struct pid *thread_pid;
	__u64 start_boottime;
	/* This thread's CPU time, in nanoseconds: sampled at ticks, and exact in se. */
	__u64 utime;
	__u64 stime;
	struct sched_entity se;
	char comm[16];
	struct signal_struct *signal;
	struct css_set *cgroups;
	/* The signals sent to this thread alone: dequeued before the process's. */
	struct sigpending pending;
};

/* Only its address is used: the siginfo layout read through it is user-space ABI. */
struct kernel_siginfo;

/* Only compared to NULL. */
struct tty_struct;

/* A cgroup's kernfs node: its id is the inode number of the cgroup's directory. */
struct kernfs_node {
	__u64 id;
};

/* A cgroup hierarchy: 0 is the unified (v2) one, any other a cgroup-v1 hierarchy. */
struct cgroup_root {
	int hierarchy_id;
};

struct cgroup {
	struct kernfs_node *kn;
	struct cgroup_root *root;
};

struct cgroup_subsys_state {
	struct cgroup *cgroup;
	struct cgroup_subsys_state *parent;
};

/* A task's cgroups, one per controller, indexed by enum cgroup_subsys_id. */
struct css_set {
	struct cgroup_subsys_state *subsys[1];
};

enum cgroup_subsys_id {
	memory_cgrp_id = 4,
};

typedef struct {
	long counter;
} atomic_long_t;

/* Memory charged to a cgroup, in pages, and its limit (memory.max, memory.limit_in_bytes). */
struct page_counter {
	atomic_long_t usage;
	unsigned long max;
};

struct mem_cgroup {
	struct cgroup_subsys_state css;
	struct page_counter memory;
};

/*
 * The mark_victim tracepoint's event: from Linux 6.8 its arguments are the victim's task and
 * uid (and the event records the uid), before only the victim's pid.
 */
struct trace_event_raw_mark_victim___task {
	unsigned int uid;
};

#pragma clang attribute pop

/* include/linux/proc_ns.h: the initial PID namespace's inode number, fixed since Linux 3.8. */
#define PROC_PID_INIT_INO 0xEFFFFFFCU

/* include/linux/pid_namespace.h: namespaces nest at most this deep. */
#define MAX_PID_NS_LEVEL 32

/* include/linux/sched/signal.h: a macro, so not in BTF; unchanged since Linux 2.6. */
#define SIGNAL_GROUP_EXIT 0x00000004

/* include/linux/sched.h: the task is exiting; it was killed by a signal it dequeued.
 * Macros, unchanged since Linux 2.6. */
#define PF_EXITING 0x00000004
#define PF_SIGNALED 0x00000400

/* include/linux/pid.h: the session's entry of signal_struct.pids, since Linux 4.19. */
#define PIDTYPE_SID 3

/* The kernel stack of x86-64 and arm64 (without KASAN, which doubles it). */
#define THREAD_SIZE 16384

/* /proc/<pid>/stat field 22 is nsec_to_clock_t(start_boottime) with USER_HZ = 100. */
#define NSEC_PER_CLOCK_TICK 10000000ULL

/* Mirrors liveness_common::COUNTER_*. */
#define COUNTER_EMITTED 0
#define COUNTER_LOST 1
#define COUNTER_CAUSES_LOST 2
#define COUNTER_USAGE_LOST 3
#define COUNTER_SLOTS 4

/* Mirrors liveness_common::MEMBER_COUNTER_*. */
#define MEMBER_COUNTER_FULL 0
#define MEMBER_COUNTER_ADDED 1
#define MEMBER_COUNTER_SLOTS 2

/* Mirrors liveness_common::MEMBER_FLAG_*: the entry holds one of the max_members slots, and
 * one of its uid's share. */
#define MEMBER_FLAG_COUNTED 1

/* Mirrors liveness_common::UID_BUCKETS: uids share a budget when equal modulo this. */
#define UID_BUCKETS 4096

/*
 * Mirrors liveness_common::MemberRecord: a process of the tree rooted at a tracked process,
 * or a tracked process itself (root_tgid is then its own tgid).
 */
struct member_record {
	__u64 start_ticks;
	__u64 root_start_ticks;
	__u32 root_tgid;
	__u32 flags;
	/* The uid whose share a counted entry holds: its forker's real uid. */
	__u32 uid;
	__u32 pad;
};

_Static_assert(sizeof(struct member_record) == 32, "member_record size");
_Static_assert(__builtin_offsetof(struct member_record, root_start_ticks) == 8,
	       "root_start_ticks offset");
_Static_assert(__builtin_offsetof(struct member_record, root_tgid) == 16, "root_tgid offset");
_Static_assert(__builtin_offsetof(struct member_record, flags) == 20, "flags offset");
_Static_assert(__builtin_offsetof(struct member_record, uid) == 24, "uid offset");

/* Mirrors liveness_common::UID_SHARE_*: a bucket of uids' share of the member slots. */
struct uid_share {
	/* Counted entries whose uid falls in the bucket. */
	__u64 used;
	/* Forks refused because the share was taken, and the uid last refused. */
	__u64 refused;
	__u64 last_refused_uid;
};

_Static_assert(sizeof(struct uid_share) == 24, "uid_share size");

/* Mirrors liveness_common::LINEAGE_DEPTH: the ancestors a lineage keeps, nearest first. */
#define LINEAGE_DEPTH 8

/* Mirrors liveness_common::Ancestor. */
struct ancestor {
	__u64 start_ticks;
	__u32 tgid;
	__u32 pad;
};

/* Mirrors liveness_common::Lineage: a process's start time and its ancestors when it was
 * forked, nearest first (a tgid of 0 ends the list), whatever they became since. */
struct lineage {
	__u64 start_ticks;
	struct ancestor ancestors[LINEAGE_DEPTH];
};

_Static_assert(sizeof(struct lineage) == 8 + 16 * LINEAGE_DEPTH, "lineage size");

/* Mirrors liveness_common::CAUSE_*: what a signal_cause holds. */
#define CAUSE_SIGNAL 1
#define CAUSE_SENDER_IN_TREE 2
#define CAUSE_OOM_MARKED 4
#define CAUSE_LIMITS_READ 8
#define CAUSE_SENDER_EXITING 16
#define CAUSE_SENDER_TTY_LEADER 32
#define CAUSE_SAME_SESSION 64
#define CAUSE_INFO_ON_STACK 128
#define CAUSE_OOM_KILLER 256
#define CAUSE_THREAD_DIRECTED 512

/* Mirrors liveness_common::ORIGIN_*: how the signal's siginfo came to be. */
#define ORIGIN_SIGINFO 0
#define ORIGIN_NOINFO 1
#define ORIGIN_PRIV 2

/* Mirrors liveness_common::EXIT_*: what an exit_record holds besides the death. */
#define EXIT_HAS_CAUSE 1
#define EXIT_HAS_MEMBERS 2
#define EXIT_OOM_VICTIM 4

/*
 * Mirrors liveness_common::Usage: CPU time in nanoseconds and the peak resident set in
 * pages, of one process or summed over the members of a tree that exited. The user and
 * system times are samples taken at ticks; the runtime is exact, and user space splits it
 * in their proportion, as getrusage does.
 */
struct usage {
	__u64 user_ns;
	__u64 system_ns;
	__u64 runtime_ns;
	/* Of one process; over a tree's members, the largest member's. */
	__u64 peak_rss_pages;
};

_Static_assert(sizeof(struct usage) == 32, "usage size");

/* Mirrors liveness_common::TreeUsage: the members of a tracked process's tree that exited. */
struct tree_usage {
	__u64 root_start_ticks;
	struct usage total;
	__u32 exited;
	__u32 pad;
};

_Static_assert(sizeof(struct tree_usage) == 48, "tree_usage size");
_Static_assert(__builtin_offsetof(struct tree_usage, total) == 8, "total offset");
_Static_assert(__builtin_offsetof(struct tree_usage, exited) == 40, "exited offset");

/*
 * Mirrors liveness_common::SignalCause: the last signal that kills by default sent to a
 * tracked process, with its sender (current when it was sent), and the OOM kill if the
 * OOM killer chose the process.
 */
struct signal_cause {
	__u64 target_start_ticks;
	__u64 sender_start_ticks;
	/* The root of the tree the sender belongs to, when CAUSE_SENDER_IN_TREE. */
	__u64 sender_root_start_ticks;
	/* With CAUSE_LIMITS_READ: the kernfs id of the nearest memory cgroup of the target at
	 * its limit when the kernel sent SIGKILL, or 0 when none was. */
	__u64 oom_cgroup_id;
	__u32 sender_tgid;
	__u32 sender_uid;
	__u32 sender_root_tgid;
	/* si_code as the kernel set it, when origin is ORIGIN_SIGINFO. */
	__s32 code;
	__u32 signal;
	__u16 origin;
	__u16 flags;
	char sender_comm[16];
};

_Static_assert(sizeof(struct signal_cause) == 72, "signal_cause size");
_Static_assert(__builtin_offsetof(struct signal_cause, sender_tgid) == 32, "sender_tgid offset");
_Static_assert(__builtin_offsetof(struct signal_cause, signal) == 48, "signal offset");
_Static_assert(__builtin_offsetof(struct signal_cause, origin) == 52, "origin offset");
_Static_assert(__builtin_offsetof(struct signal_cause, sender_comm) == 56, "sender_comm offset");

/* Mirrors liveness_common::ExitRecord; the daemon's tests compare this type's BTF to it. */
struct exit_record {
	__u64 start_ticks;
	__u64 exit_monotonic_ns;
	__u32 tgid;
	__u32 wait_status;
	struct usage usage;
	struct tree_usage members;
	struct signal_cause cause;
	__u32 flags;
	__u32 pad;
};

_Static_assert(sizeof(struct exit_record) == 184, "exit_record size");
_Static_assert(__builtin_offsetof(struct exit_record, start_ticks) == 0, "start_ticks offset");
_Static_assert(__builtin_offsetof(struct exit_record, exit_monotonic_ns) == 8,
	       "exit_monotonic_ns offset");
_Static_assert(__builtin_offsetof(struct exit_record, tgid) == 16, "tgid offset");
_Static_assert(__builtin_offsetof(struct exit_record, wait_status) == 20, "wait_status offset");
_Static_assert(__builtin_offsetof(struct exit_record, usage) == 24, "usage offset");
_Static_assert(__builtin_offsetof(struct exit_record, members) == 56, "members offset");
_Static_assert(__builtin_offsetof(struct exit_record, cause) == 104, "cause offset");
_Static_assert(__builtin_offsetof(struct exit_record, flags) == 176, "flags offset");

/*
 * Mirrors liveness_common::MoveRecord: a tracked process or a member (of the tree rooted at
 * root_tgid) moved into the cgroup whose kernfs id is cgroup_id, in the unified hierarchy.
 */
struct move_record {
	__u64 start_ticks;
	__u64 root_start_ticks;
	__u64 cgroup_id;
	__u32 tgid;
	__u32 root_tgid;
};

_Static_assert(sizeof(struct move_record) == 32, "move_record size");
_Static_assert(__builtin_offsetof(struct move_record, cgroup_id) == 16, "cgroup_id offset");
_Static_assert(__builtin_offsetof(struct move_record, tgid) == 24, "tgid offset");
_Static_assert(__builtin_offsetof(struct move_record, root_tgid) == 28, "root_tgid offset");

#endif /* LIVENESS_H */
