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

struct task_struct {
	int exit_code;
	int pid;
	int tgid;
	struct task_struct *group_leader;
	struct pid *thread_pid;
	__u64 start_boottime;
	struct signal_struct *signal;
};

#pragma clang attribute pop

/* include/linux/proc_ns.h: the initial PID namespace's inode number, fixed since Linux 3.8. */
#define PROC_PID_INIT_INO 0xEFFFFFFCU

/* include/linux/pid_namespace.h: namespaces nest at most this deep. */
#define MAX_PID_NS_LEVEL 32

/* include/linux/sched/signal.h: a macro, so not in BTF; unchanged since Linux 2.6. */
#define SIGNAL_GROUP_EXIT 0x00000004

/* /proc/<pid>/stat field 22 is nsec_to_clock_t(start_boottime) with USER_HZ = 100. */
#define NSEC_PER_CLOCK_TICK 10000000ULL

/* Mirrors liveness_common::COUNTER_*. */
#define COUNTER_EMITTED 0
#define COUNTER_LOST 1
#define COUNTER_SLOTS 2

/* Mirrors liveness_common::MEMBER_COUNTER_*. */
#define MEMBER_COUNTER_FULL 0
#define MEMBER_COUNTER_ADDED 1
#define MEMBER_COUNTER_SLOTS 2

/* Mirrors liveness_common::MEMBER_FLAG_*: the entry holds one of the max_members slots. */
#define MEMBER_FLAG_COUNTED 1

/*
 * Mirrors liveness_common::MemberRecord: a process of the tree rooted at a tracked process,
 * or a tracked process itself (root_tgid is then its own tgid).
 */
struct member_record {
	__u64 start_ticks;
	__u64 root_start_ticks;
	__u32 root_tgid;
	__u32 flags;
};

_Static_assert(sizeof(struct member_record) == 24, "member_record size");
_Static_assert(__builtin_offsetof(struct member_record, root_start_ticks) == 8,
	       "root_start_ticks offset");
_Static_assert(__builtin_offsetof(struct member_record, root_tgid) == 16, "root_tgid offset");
_Static_assert(__builtin_offsetof(struct member_record, flags) == 20, "flags offset");

/* Mirrors liveness_common::ExitRecord; the daemon's tests compare this type's BTF to it. */
struct exit_record {
	__u64 start_ticks;
	__u64 exit_monotonic_ns;
	__u32 tgid;
	__u32 wait_status;
};

_Static_assert(sizeof(struct exit_record) == 24, "exit_record size");
_Static_assert(__builtin_offsetof(struct exit_record, start_ticks) == 0, "start_ticks offset");
_Static_assert(__builtin_offsetof(struct exit_record, exit_monotonic_ns) == 8,
	       "exit_monotonic_ns offset");
_Static_assert(__builtin_offsetof(struct exit_record, tgid) == 16, "tgid offset");
_Static_assert(__builtin_offsetof(struct exit_record, wait_status) == 20, "wait_status offset");

#endif /* LIVENESS_H */
