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
 * exit costs one hash lookup, beside the write or delete of its lineage.
 *
 * Why a tracked process died, and what it cost: the last signal that kills by default sent
 * to it is kept with its sender (signal_generate), with the memory cgroup at its limit when
 * the kernel sends SIGKILL, the OOM killer's choice of it (mark_victim), and the CPU time of
 * its tree's members as they exit; its exit record carries all of it with its own usage. A
 * signal to any other process costs a comparison, or one lookup for the signals that kill.
 *
 * A tracked process or a member moved into another cgroup is reported on a ring of its own
 * (cgroup_attach_task): the daemon tells an escape from its session's cgroup.
 *
 * One file per kernel hook, built together as this one translation unit into one object
 * (the maps and helpers they share are in maps.h):
 */
#include "process_fork.c"
#include "process_exit.c"
#include "signal_generate.c"
#include "mark_victim.c"
#include "cgroup_attach.c"

char LICENSE[] SEC("license") = "GPL";
