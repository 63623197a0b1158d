// The protocol's objects: generated into types.gen.ts from the daemon's own types (cargo
// xtask gen-clients); this file adds what TypeScript makes of them, and the stream lines,
// replies and requests as this client reads and writes them.

import { type Codec, arrayOf, bool, int, json, object, oneOf, optional, recordOf, required, str, defaulted } from "./codec.js";
import {
  type ActionOutcome,
  type ActionSpec,
  type FleetChange,
  type FleetView,
  type Gap,
  type Goodbye,
  type Identity,
  type Lagged,
  type LivenessEvent,
  type Lock,
  type OnEnd,
  type Phase,
  type Process,
  type Session,
  type Subscribed,
  type Until,
  actionSpec,
  event,
  fleetChange,
  fleetView,
  gap,
  goodbye,
  identity,
  lagged,
  lock,
  onEnd,
  phase,
  process_,
  session,
  subscribed,
  until,
} from "./types.gen.js";

export * from "./types.gen.js";

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

/** Whether an action ran, in time, and exited with status 0. */
export function succeeded(outcome: ActionOutcome): boolean {
  return !outcome.timed_out && outcome.exit?.kind === "exited" && outcome.exit.code === 0;
}

/** Whether the session has ended and each of its end actions has its outcome (at once for
 * one without end actions). */
export function isFinalized(session: Session): boolean {
  return session.phase === "ended" && (session.on_end_run.length === 0 || session.finalized_ms !== undefined);
}

export const DEFAULT_GRACE_MS = 10_000;

/** A line of the event stream. `reset`: the cursor was of another database, every event
 * of this one follows; `gap`: events were pruned before they were read; `lagged` and
 * `goodbye`: the daemon closed the stream; `fleet_change`: a line of `fleet_watch`. */
export type Message =
  | { event: LivenessEvent }
  | { reset: Subscribed }
  | { gap: Gap }
  | { lagged: Lagged }
  | { goodbye: Goodbye }
  | { fleet_change: FleetChange };

const messages: Record<string, Codec<unknown>> = {
  event: event as Codec<unknown>,
  reset: subscribed as Codec<unknown>,
  gap: gap as Codec<unknown>,
  lagged: lagged as Codec<unknown>,
  goodbye: goodbye as Codec<unknown>,
  fleet_change: fleetChange as Codec<unknown>,
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
  fleet?: FleetView;
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
  fleet: optional(fleetView),
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
  turn?: "start" | "end";
  tool?: string;
  tool_end?: boolean;
  cluster?: boolean;
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
    turn: optional(oneOf("start", "end")),
    tool: optional(str),
    tool_end: optional(bool),
    cluster: optional(bool),
  },
  true,
);
