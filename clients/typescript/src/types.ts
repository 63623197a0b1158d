// The protocol's objects (docs/protocol.md §2, §5, §12, §14). Their fields keep the wire's
// names, so that what this client gives is what the protocol document says.

import {
  type Codec,
  DecodeError,
  arrayOf,
  bool,
  defaulted,
  int,
  json,
  nullable,
  object,
  oneOf,
  optional,
  recordOf,
  required,
  str,
} from "./codec.js";

/** A process's fingerprint: a pid whose start time (or pidfs inode) differs is another
 * process. `host` and `comm` are labels, never compared. */
export interface Identity {
  pid: number;
  /** Start time in clock ticks after boot, as the initial time namespace counts it. */
  start_ticks: number;
  boot_id: string;
  host: string;
  /** The pidfs inode (Linux 6.9+), where known. */
  pidfs_ino?: number;
  comm: string;
}

export const identity: Codec<Identity> = object<Identity>(
  {
    pid: required(int),
    start_ticks: required(int),
    boot_id: required(str),
    host: required(str),
    pidfs_ino: optional(int),
    comm: defaulted(str, ""),
  },
  true,
);

/** Whether two identities name the same process: same boot, pid and start time, and the
 * same pidfs inode where both know it. */
export function sameProcess(a: Identity, b: Identity): boolean {
  return (
    a.pid === b.pid &&
    a.start_ticks === b.start_ticks &&
    a.boot_id === b.boot_id &&
    (a.pidfs_ino === undefined || b.pidfs_ino === undefined || a.pidfs_ino === b.pidfs_ino)
  );
}

/** How a process ended, as wait(2) would tell its parent. */
export type ExitStatus =
  | { kind: "exited"; code: number }
  | { kind: "signaled"; signal: number; core_dumped: boolean };

const exited = object<{ kind: "exited"; code: number }>({ kind: required(oneOf("exited")), code: required(int) });
const signaled = object<{ kind: "signaled"; signal: number; core_dumped: boolean }>({
  kind: required(oneOf("signaled")),
  signal: required(int),
  core_dumped: required(bool),
});

export const exitStatus: Codec<ExitStatus> = {
  decode: (v, path) => {
    const kind = (v as { kind?: unknown } | null)?.kind;
    if (kind === "exited") return exited.decode(v, path);
    if (kind === "signaled") return signaled.decode(v, path);
    throw new DecodeError(`${path}: an exit status of unknown kind ${JSON.stringify(kind)}`);
  },
  encode: (v) => (v.kind === "exited" ? exited.encode(v) : signaled.encode(v)),
};

/** The process that sent a killing signal, as it was when it sent it; `session` only where
 * every reader of the ending may see that session. */
export interface Sender {
  pid: number;
  start_ticks: number;
  comm: string;
  uid: number;
  session?: string;
}

/** Why a session ended, from its owner's side (docs/protocol.md §2 "Cause"): `kind` is
 * `exit` (`code`), `signal` (`signal`, and `sender` or `kernel`), `oom` (`scope`, `cgroup`),
 * `hangup`, `unknown` (`reason`) or `none` (the owner did not die). */
export interface Cause {
  kind: string;
  code?: number;
  signal?: number;
  sender?: Sender;
  kernel?: string;
  scope?: string;
  cgroup?: string;
  reason?: string;
}

export const cause = object<Cause>({
  kind: required(str),
  code: optional(int),
  signal: optional(int),
  sender: optional(
    object<Sender>({
      pid: required(int),
      start_ticks: required(int),
      comm: required(str),
      uid: required(int),
      session: optional(str),
    }),
  ),
  kernel: optional(str),
  scope: optional(str),
  cgroup: optional(str),
  reason: optional(str),
});

/** The members of a tree that exited while tracked: CPU summed, the largest peak. */
export interface MembersUsage {
  exited: number;
  cpu_user_us: number;
  cpu_system_us: number;
  peak_rss_bytes: number;
}

/** What an owner cost, from the kernel at its exit (docs/protocol.md §2 "Usage"). Members
 * still running at its end are not counted. */
export interface Usage {
  cpu_user_us: number;
  cpu_system_us: number;
  peak_rss_bytes: number;
  members: MembersUsage;
}

export const usage = object<Usage>({
  cpu_user_us: required(int),
  cpu_system_us: required(int),
  peak_rss_bytes: required(int),
  members: required(
    object<MembersUsage>({
      exited: required(int),
      cpu_user_us: required(int),
      cpu_system_us: required(int),
      peak_rss_bytes: required(int),
    }),
  ),
});

/** The members of a session's tree alive at its end: all counted, at most 1000 listed. */
export interface Survivors {
  total: number;
  members: Identity[];
}

export const survivors = object<Survivors>({ total: required(int), members: required(arrayOf(identity)) });

export type Phase = "active" | "ended";
/** A session's cleanup policy. */
export type OnEnd = "leave" | "terminate";
const phase = oneOf<Phase>("active", "ended");
const onEnd = oneOf<OnEnd>("leave", "terminate");

/** When a session ends by itself: at its owner's exit, or at the last exit of its tree. */
export type Until = "owner" | "tree";

const until = oneOf<Until>("owner", "tree");

/** One end action: a command the daemon runs, as the session's creator, when the session
 * ends, however it ends (docs/end-actions.md §1). Make it idempotent: a run cut short by a
 * stop or a crash of the daemon runs again. */
export interface ActionSpec {
  /** Program and arguments, run without a shell; a name without `/` is looked up in PATH. */
  argv: string[];
  /** `NAME=value` entries added to the action's clean environment. */
  env?: string[];
  /** How long it may run (the daemon's default: 60 s; at most an hour). */
  timeout_ms?: number;
  /** Absolute working directory (default: the user's home). */
  cwd?: string;
}

export const actionSpec = object<ActionSpec>(
  { argv: required(arrayOf(str)), env: optional(arrayOf(str)), timeout_ms: optional(int), cwd: optional(str) },
  true,
);

/** What one run of an end action did (`session.action` events, and `get`). */
export interface ActionOutcome {
  /** The action's place in the session's `on_end_run`. */
  index: number;
  started_ms: number;
  duration_ms: number;
  /** How its first process ended; absent when it never ran (`error` says why). */
  exit?: ExitStatus;
  /** It ran past its timeout and its process tree was ended. */
  timed_out: boolean;
  /** Processes of its tree that needed SIGKILL after the timeout. */
  killed: number;
  /** The last 4 KiB of its stderr; `stderr_bytes` counts all it wrote there. */
  stderr_tail: string;
  stderr_bytes: number;
  /** Why it could not be run (its working directory, its user, its program). */
  error?: string;
  /**
   * Its program never ran: a setup step or the program failed, or its process was
   * stopped before its exec past the start bound and killed (`error` says which).
   */
  failed_to_start: boolean;
  /** This run repeats one cut short by a stop or a crash of the daemon. */
  resumed: boolean;
  /** Why it was not run (`done_by_agent`: see `Client.actionsDone`). */
  skipped?: string;
}

export const actionOutcome = object<ActionOutcome>({
  index: required(int),
  started_ms: required(int),
  duration_ms: required(int),
  exit: optional(exitStatus),
  timed_out: defaulted(bool, false, true),
  killed: defaulted(int, 0, true),
  stderr_tail: defaulted(str, "", true),
  stderr_bytes: defaulted(int, 0, true),
  error: optional(str),
  failed_to_start: defaulted(bool, false, true),
  resumed: defaulted(bool, false, true),
  skipped: optional(str),
});

/** Whether an action ran, in time, and exited with status 0. */
export function succeeded(outcome: ActionOutcome): boolean {
  return !outcome.timed_out && outcome.exit?.kind === "exited" && outcome.exit.code === 0;
}

/** Where one end action stands: `pending` until the session ends and it starts, `running`,
 * then `done` with its outcome. */
export interface ActionState {
  index: number;
  state: "pending" | "running" | "done";
  outcome?: ActionOutcome;
}

const actionState = object<ActionState>({
  index: required(int),
  state: required(oneOf<ActionState["state"]>("pending", "running", "done")),
  outcome: optional(actionOutcome),
});

/** A session as the daemon stores it (docs/protocol.md §2 "Session"). */
export interface Session {
  id: string;
  owner: Identity;
  phase: Phase;
  pending: boolean;
  /** Why it ended (`owner_exited`, `owner_reused`, `reboot`, `stopped`, `timeout`,
   * `pending_expired`); null while active. */
  reason: string | null;
  exit: ExitStatus | null;
  /** Why it ended, from its owner's side; absent while active. */
  cause?: Cause;
  /** What the owner cost, where the kernel showed it (eBPF). */
  usage?: Usage;
  /** What noticed the owner's death (`ebpf`, `pidfd`, `procpoll`, `reconcile`). */
  detected_by: string | null;
  creator_uid: number;
  labels: Record<string, string>;
  created_ms: number;
  updated_ms: number;
  touched_ms: number;
  ended_ms: number | null;
  pending_expires_ms: number | null;
  survivors?: Survivors;
  on_end: OnEnd;
  grace_ms: number;
  /** When it ends by itself (`"owner"` unless registered otherwise). */
  until: Until;
  /** The end actions its creator registered. */
  on_end_run: ActionSpec[];
  /** Where each end action stands, in the order of `on_end_run` (`get` and
   * `actionsDone` only). */
  actions: ActionState[];
  /** When the last end action had its outcome; absent until then, and for a session
   * without end actions, whose end is final. */
  finalized_ms?: number;
}

/** Whether the session has ended and each of its end actions has its outcome (at once for
 * one without end actions). */
export function isFinalized(session: Session): boolean {
  return session.phase === "ended" && (session.on_end_run.length === 0 || session.finalized_ms !== undefined);
}

export const DEFAULT_GRACE_MS = 10_000;

export const session = object<Session>({
  id: required(str),
  owner: required(identity),
  phase: required(phase),
  pending: required(bool),
  reason: nullable(str),
  exit: nullable(exitStatus),
  cause: optional(cause),
  usage: optional(usage),
  detected_by: nullable(str),
  creator_uid: required(int),
  labels: required(recordOf(str)),
  created_ms: required(int),
  updated_ms: required(int),
  touched_ms: required(int),
  ended_ms: nullable(int),
  pending_expires_ms: nullable(int),
  survivors: optional(survivors),
  on_end: defaulted(onEnd, "leave"),
  grace_ms: defaulted(int, DEFAULT_GRACE_MS),
  until: defaulted(until, "owner", true),
  on_end_run: defaulted(arrayOf(actionSpec), [], true),
  actions: defaulted(arrayOf(actionState), [], true),
  finalized_ms: optional(int),
});

/** What terminating a session's surviving processes did, by pid. */
export interface Reaped {
  terminated: number[];
  killed: number[];
  exited: number[];
  failed: { pid: number; reason: string }[];
  resumed: boolean;
}

const reaped = object<Reaped>({
  terminated: required(arrayOf(int)),
  killed: required(arrayOf(int)),
  exited: required(arrayOf(int)),
  failed: required(arrayOf(object<{ pid: number; reason: string }>({ pid: required(int), reason: required(str) }))),
  resumed: defaulted(bool, false, true),
});

/** The lock of a `lock.acquired` or `lock.released` event. */
export interface LockChange {
  name: string;
  token: number;
  /** `released` or `session_ended`, on `lock.released` only. */
  reason?: string;
}

/** CLOCK_MONOTONIC nanoseconds of a death through a daemon run with --trace-hops. */
export interface Hops {
  died_ns?: number;
  read_ns: number;
  committed_ns: number;
  published_ns: number;
}

/** The kinds of events; a newer daemon may send others: ignore kinds you do not know. */
export const SESSION_REGISTERED = "session.registered";
export const SESSION_OWNER_CHANGED = "session.owner_changed";
export const SESSION_RENAMED = "session.renamed";
export const SESSION_ENDED = "session.ended";
export const SESSION_REAPED = "session.reaped";
/** One end action of the ended session has its outcome (`action`). */
export const SESSION_ACTION = "session.action";
/** Every end action of the ended session has its outcome. */
export const SESSION_FINALIZED = "session.finalized";
export const LOCK_ACQUIRED = "lock.acquired";
export const LOCK_RELEASED = "lock.released";

/** One entry of the event stream (docs/protocol.md §5). */
export interface LivenessEvent {
  seq: number;
  kind: string;
  at_ms: number;
  session: string;
  owner: Identity;
  previous_owner?: Identity;
  previous_session?: string;
  reason?: string;
  exit?: ExitStatus;
  cause?: Cause;
  usage?: Usage;
  detected_by?: string;
  observed_ms?: number;
  died_ms?: number;
  labels: Record<string, string>;
  creator_uid: number;
  survivors?: Survivors;
  on_end: OnEnd;
  reaped?: Reaped;
  /** How many end actions the session has: when not 0, a `session.finalized` follows its
   * `session.ended`. */
  actions: number;
  /** `session.action`: what one end action did. */
  action?: ActionOutcome;
  lock?: LockChange;
  hops?: Hops;
}

export const event = object<LivenessEvent>({
  seq: required(int),
  kind: required(str),
  at_ms: required(int),
  session: required(str),
  owner: required(identity),
  previous_owner: optional(identity),
  previous_session: optional(str),
  reason: optional(str),
  exit: optional(exitStatus),
  cause: optional(cause),
  usage: optional(usage),
  detected_by: optional(str),
  observed_ms: optional(int),
  died_ms: optional(int),
  labels: defaulted(recordOf(str), {}),
  creator_uid: required(int),
  survivors: optional(survivors),
  on_end: defaulted(onEnd, "leave", true),
  reaped: optional(reaped),
  actions: defaulted(int, 0, true),
  action: optional(actionOutcome),
  lock: optional(object<LockChange>({ name: required(str), token: required(int), reason: optional(str) })),
  hops: optional(
    object<Hops>({
      died_ns: optional(int),
      read_ns: required(int),
      committed_ns: required(int),
      published_ns: required(int),
    }),
  ),
});

/** A held lock; `token` only grows: pass it on, and refuse lower ones. */
export interface Lock {
  name: string;
  uid: number;
  session: string;
  token: number;
  since_ms: number;
  waiters: number;
}

export const lock = object<Lock>({
  name: required(str),
  uid: required(int),
  session: required(str),
  token: required(int),
  since_ms: required(int),
  waiters: defaulted(int, 0),
});

/** A live process of a session's tree, as `processes` lists it. */
export interface Process {
  identity: Identity;
  owner: boolean;
  ppid: number;
  cmdline: string[];
  age_ms: number;
}

const process_ = object<Process>({
  identity: required(identity),
  owner: required(bool),
  ppid: required(int),
  cmdline: required(arrayOf(str)),
  age_ms: required(int),
});

/** A subscription's acknowledgement, and the body of a `reset`. */
export interface Subscribed {
  since: number;
  head: number;
  store_id: string;
}

const subscribed = object<Subscribed>({ since: required(int), head: required(int), store_id: required(str) });

/** A line of the event stream. `reset`: the cursor was of another database, every event
 * of this one follows; `gap`: events were pruned before they were read; `lagged` and
 * `goodbye`: the daemon closed the stream. */
export type Message =
  | { event: LivenessEvent }
  | { reset: Subscribed }
  | { gap: { since: number; pruned_through: number } }
  | { lagged: { last_delivered: number } }
  | { goodbye: { reason: string } };

const messages: Record<string, Codec<unknown>> = {
  event: event as Codec<unknown>,
  reset: subscribed as Codec<unknown>,
  gap: object<{ since: number; pruned_through: number }>({ since: required(int), pruned_through: required(int) }) as Codec<unknown>,
  lagged: object<{ last_delivered: number }>({ last_delivered: required(int) }) as Codec<unknown>,
  goodbye: object<{ reason: string }>({ reason: required(str) }) as Codec<unknown>,
};

/** A stream line; undefined for a line of a newer protocol, to be ignored. */
export const message: Codec<Message | undefined> = {
  decode: (v, path) => {
    for (const [key, codec] of Object.entries(messages)) {
      if (typeof v === "object" && v !== null && key in v) {
        return { [key]: codec.decode((v as Record<string, unknown>)[key], `${path}.${key}`) } as Message;
      }
    }
    return undefined;
  },
  encode: (v) => {
    const [key, body] = Object.entries(v as object)[0];
    return { [key]: messages[key].encode(body) };
  },
};

/** One reply; which keys are set depends on the request. */
export interface Reply {
  ok: boolean;
  id?: unknown;
  error?: { code: string; message: string };
  session?: Session;
  sessions?: Session[];
  next?: string;
  owner_pid?: number;
  status?: Record<string, unknown>;
  subscribed?: Subscribed;
  warnings: string[];
  lock?: Lock;
  locks?: Lock[];
  processes?: Process[];
}

export const reply = object<Reply>({
  ok: required(bool),
  id: optional(json),
  error: optional(object<{ code: string; message: string }>({ code: required(str), message: required(str) })),
  session: optional(session),
  sessions: optional(arrayOf(session)),
  next: optional(str),
  owner_pid: optional(int),
  status: optional(recordOf(json)),
  subscribed: optional(subscribed),
  warnings: defaulted(arrayOf(str), [], true),
  lock: optional(lock),
  locks: optional(arrayOf(lock)),
  processes: optional(arrayOf(process_)),
});

/** An owner as the wire spells it. */
export type OwnerSpec = "auto" | { pid: number } | { pidfd: number } | Identity;

const ownerSpec: Codec<OwnerSpec> = {
  decode: (v, path) => {
    if (v === "auto") return "auto";
    if (typeof v === "object" && v !== null && "start_ticks" in v) return identity.decode(v, path);
    return object<{ pid: number }>({ pid: required(int) }, true).decode(v, path);
  },
  encode: (v) => (typeof v === "object" && "start_ticks" in v ? identity.encode(v) : v),
};

/** One request; which fields are set depends on `op`. */
export interface Request {
  op: string;
  v?: number;
  id?: unknown;
  session?: string;
  uid?: number;
  owner?: OwnerSpec;
  pending?: boolean;
  labels?: Record<string, string>;
  on_end?: OnEnd;
  grace_ms?: number;
  until?: Until;
  wrappers?: string[];
  to?: string;
  terminate?: boolean;
  phase?: Phase;
  limit?: number;
  after?: string;
  pid?: number;
  since?: number;
  store_id?: string;
  name?: string;
  wait?: boolean;
  timeout_ms?: number;
  on_end_run?: ActionSpec[];
}

export const request = object<Request>(
  {
    op: required(str),
    v: optional(int),
    id: optional(json),
    session: optional(str),
    uid: optional(int),
    owner: optional(ownerSpec),
    pending: optional(bool),
    labels: optional(recordOf(str)),
    on_end: optional(onEnd),
    grace_ms: optional(int),
    until: optional(until),
    wrappers: optional(arrayOf(str)),
    to: optional(str),
    terminate: optional(bool),
    phase: optional(phase),
    limit: optional(int),
    after: optional(str),
    pid: optional(int),
    since: optional(int),
    store_id: optional(str),
    name: optional(str),
    wait: optional(bool),
    timeout_ms: optional(int),
    on_end_run: optional(arrayOf(actionSpec)),
  },
  true,
);
