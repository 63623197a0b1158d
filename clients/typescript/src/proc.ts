// A process's fingerprint from /proc, and the verdict on one, without a daemon: what
// `liveness check` does, read the same way (docs/protocol.md §2 "Identity").
//
// Node has no pidfd_open(2): a capture carries no pidfs inode, and a check compares start
// times alone (the daemon, which holds pidfds, tells apart two processes started in one
// 10 ms tick on the same pid; this cannot).

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";

import { LivenessError, NoSuchProcess } from "./errors.js";
import type { Identity } from "./types.js";

/** The verdict of `check`, as `liveness check --json` names it. */
export interface Liveness {
  state: "alive" | "dead" | "unknown";
  /** Why a process is dead. */
  reason?: "exited" | "owner_reused" | "rebooted";
  /** In words, and why a verdict is unknown. */
  detail: string;
}

const PF_KTHREAD = 0x00200000;
const NANOS_PER_TICK = 10_000_000n; // /proc start times count USER_HZ (100) ticks

interface Stat {
  comm: string;
  state: string;
  flags: number;
  numThreads: number;
  startTicks: number;
}

/** A zombie or dying leader whose process counts no other thread. */
const exited = (stat: Stat) => (stat.state === "Z" || stat.state === "X") && stat.numThreads <= 1;

function parseStat(data: Buffer): Stat {
  // The comm sits between the first '(' and the last ')': it may hold spaces and parens.
  const open = data.indexOf("("),
    close = data.lastIndexOf(")");
  if (open < 0 || close < open) throw new Error("no (comm)");
  const fields = data.subarray(close + 1).toString().trim().split(/\s+/); // proc(5) field n is fields[n - 3]
  if (fields.length < 20 || fields[0].length !== 1) throw new Error("too few fields");
  return {
    comm: data.subarray(open + 1, close).toString(),
    state: fields[0],
    flags: Number(fields[9 - 3]),
    numThreads: Number(fields[20 - 3]),
    startTicks: Number(fields[22 - 3]),
  };
}

function missing(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException).code;
  return code === "ENOENT" || code === "ESRCH";
}

/** /proc/<pid>/stat, its start time normalised to the initial time namespace. */
function readStat(pid: number): Stat {
  let data: Buffer;
  try {
    data = readFileSync(`/proc/${pid}/stat`);
  } catch (e) {
    if (missing(e)) throw new NoSuchProcess(`no process ${pid}`);
    throw e;
  }
  let stat: Stat;
  try {
    stat = parseStat(data);
  } catch (e) {
    throw new LivenessError(`malformed /proc/${pid}/stat: ${(e as Error).message}`);
  }
  return { ...stat, startTicks: Math.max(stat.startTicks - offsetTicks(), 0) };
}

function readTrimmed(path: string): string {
  const text = readFileSync(path, "utf8").trim();
  if (!text) throw new LivenessError(`${path} is empty`);
  return text;
}

let offset: bigint | undefined;

/** This reader's time namespace's boottime offset in nanoseconds, which /proc adds to
 * start times (unless this kernel shows them without it, as Linux 5.10 does). */
function offsetNanos(): bigint {
  if (offset !== undefined) return offset;
  offset = 0n;
  try {
    for (const line of readFileSync("/proc/self/timens_offsets", "utf8").split("\n")) {
      const words = line.trim().split(/\s+/);
      if (words.length === 3 && words[0] === "boottime") offset = BigInt(words[1]) * 1_000_000_000n + BigInt(words[2]);
    }
  } catch {
    return offset;
  }
  if (offset !== 0n && !startTimesInclude(offset)) offset = 0n;
  return offset;
}

/** Floor division, as the kernel's reading rounds down. */
function offsetTicks(): number {
  const o = offsetNanos();
  const q = o / NANOS_PER_TICK;
  return Number(o < 0n && o % NANOS_PER_TICK !== 0n ? q - 1n : q);
}

const wholeTicks = () => offsetNanos() % NANOS_PER_TICK === 0n;

/** Asks the kernel, not its version: a child started now has a start time close to this
 * namespace's boot time (/proc/uptime, which the namespace offsets) only when /proc adds
 * the offset. Offsets under a second count as included. */
function startTimesInclude(nanos: bigint): boolean {
  try {
    const child = spawn("/bin/true", { stdio: "ignore" });
    if (child.pid === undefined) return true;
    const started = parseStat(readFileSync(`/proc/${child.pid}/stat`)).startTicks;
    const now = Math.round(Number(readFileSync("/proc/uptime", "utf8").split(" ")[0]) * 100);
    const limit = Math.max(Math.abs(Number(nanos / NANOS_PER_TICK)) / 2, 100);
    return Math.abs(now - started) < limit;
  } catch {
    return true; // cannot tell: assume so, as the daemon does
  }
}

const ambiguous = () =>
  `start times read in this time namespace are ambiguous by one tick (its boottime offset, ${offsetNanos()} ns, ` +
  "is not a multiple of 10 ms) and this client has no pidfs inode to decide: capture identities outside this time namespace";

/** The identity of a running process: what `liveness check --pid PID --json` prints, but
 * for the pidfs inode, which Node cannot read. A process that is gone, or a zombie, throws
 * NoSuchProcess. */
export function capture(pid: number): Identity {
  if (!Number.isSafeInteger(pid) || pid <= 0) throw new NoSuchProcess(`no process ${pid}`);
  const stat = readStat(pid);
  if (exited(stat)) throw new NoSuchProcess(`no process ${pid}: it is a zombie`);
  if (stat.flags & PF_KTHREAD) {
    throw new LivenessError(`PID ${pid} (${stat.comm}) is a kernel thread, which never exits like a process`);
  }
  let status: string;
  try {
    status = readFileSync(`/proc/${pid}/status`, "utf8");
  } catch (e) {
    if (missing(e)) throw new NoSuchProcess(`no process ${pid}`);
    throw e;
  }
  const tgid = Number(/^Tgid:\s*(\d+)/m.exec(status)?.[1]);
  if (tgid !== pid) throw new LivenessError(`${pid} is a thread of process ${tgid}, not a process`);
  if (!wholeTicks()) throw new LivenessError(ambiguous());
  return {
    pid,
    start_ticks: stat.startTicks,
    boot_id: readTrimmed("/proc/sys/kernel/random/boot_id"),
    host: readTrimmed("/proc/sys/kernel/hostname"),
    comm: stat.comm,
  };
}

/** Judges an identity against this machine, as `liveness check --identity` does: dead
 * needs proof (the pid is gone or a zombie, its start time differs, or the boot is an
 * earlier one of this host); a fact that cannot be read, or a boot of another machine, is
 * unknown. */
export function check(identity: Identity): Liveness {
  let boot: string, host: string;
  try {
    boot = readTrimmed("/proc/sys/kernel/random/boot_id");
    if (boot === identity.boot_id) return checkProcess(identity);
    host = readTrimmed("/proc/sys/kernel/hostname");
  } catch (e) {
    return { state: "unknown", detail: (e as Error).message };
  }
  if (host === identity.host) {
    return { state: "dead", reason: "rebooted", detail: "the machine rebooted since the identity was captured" };
  }
  return {
    state: "unknown",
    detail: `the identity is of another boot on host ${JSON.stringify(identity.host)} (this is ${JSON.stringify(host)}): another machine, or this one before a reboot and a rename`,
  };
}

function checkProcess(identity: Identity): Liveness {
  let stat: Stat;
  try {
    stat = readStat(identity.pid);
  } catch (e) {
    if (e instanceof NoSuchProcess) return { state: "dead", reason: "exited", detail: "the process exited" };
    return { state: "unknown", detail: (e as Error).message };
  }
  if (stat.startTicks !== identity.start_ticks) {
    // In a time namespace whose offset is not whole ticks, a reading may be one tick off,
    // and only a pidfs inode could decide.
    if (wholeTicks() || Math.abs(stat.startTicks - identity.start_ticks) > 1) {
      return { state: "dead", reason: "owner_reused", detail: "the PID now belongs to a different process" };
    }
    return { state: "unknown", detail: ambiguous() };
  }
  if (exited(stat)) return { state: "dead", reason: "exited", detail: "the process exited" };
  return { state: "alive", detail: "the process is running" };
}
