// A connection to livenessd: one request, one reply, in order.

import { existsSync } from "node:fs";
import * as path from "node:path";

import { LineSocket } from "./connection.js";
import { ConnectionLost, DaemonError } from "./errors.js";
import { capture } from "./proc.js";
import {
  type ActionSpec,
  type Identity,
  type Lock,
  type OnEnd,
  type Until,
  type OwnerSpec,
  type Phase,
  type Process,
  type Reply,
  type Request,
  type Session,
  reply as replyCodec,
  request as requestCodec,
} from "./types.js";

export const PROTOCOL_VERSION = 1;
/** Where the system daemon (the systemd unit, run as root) listens. */
export const SYSTEM_SOCKET = "/run/liveness/liveness.sock";

/** The socket a client talks to when none is named, by the liveness CLI's rules:
 * `$LIVENESS_SOCKET`; for root, the system socket; for another user, the user's own
 * daemon's socket (`$XDG_RUNTIME_DIR/liveness.sock`, or `liveness.sock` in the user's
 * state directory) if it exists, else the system socket. */
export function defaultSocket(): string {
  const env = process.env;
  if (env.LIVENESS_SOCKET) return env.LIVENESS_SOCKET;
  if (process.getuid?.() === 0) return SYSTEM_SOCKET;
  let own: string | undefined;
  if (env.XDG_RUNTIME_DIR) own = path.join(env.XDG_RUNTIME_DIR, "liveness.sock");
  else if (env.LIVENESS_STATE_DIR) own = path.join(env.LIVENESS_STATE_DIR, "liveness.sock");
  else if (env.XDG_STATE_HOME) own = path.join(env.XDG_STATE_HOME, "liveness", "liveness.sock");
  else if (env.HOME) own = path.join(env.HOME, ".local/state/liveness", "liveness.sock");
  return own && existsSync(own) ? own : SYSTEM_SOCKET;
}

/** Who owns a session being registered: `"auto"`, a pid, or an identity captured earlier. */
export type Owner = "auto" | { pid: number } | Identity;

/** What `touch` declares of the agent's phase, as its hooks see it (docs/activity.md): a
 * turn's start or end, a tool's start (`tool`) or end (`toolEnd`). */
export interface Declaration {
  turn?: "start" | "end";
  tool?: string;
  toolEnd?: boolean;
}

/** A `register` request: which session, owned by whom. */
export interface Registration {
  /** The session id; with `pending` it may be left out and the daemon makes one up. */
  session?: string;
  /** `"auto"`: the daemon walks up from the connecting process (a Node program that
   * connects is that process). `{pid}`: captured here from /proc and sent as an identity
   * (Node cannot pass a pidfd). An identity: used as given. */
  owner: Owner;
  /** The real id is not known yet: `rename` it later, or it expires. */
  pending?: boolean;
  labels?: Record<string, string>;
  /** Root only: register in this user's namespace of ids. */
  uid?: number;
  /** The cleanup policy (the daemon's default: `leave`). */
  onEnd?: OnEnd;
  /** Between SIGTERM and SIGKILL when survivors are terminated (the daemon's: 10 s). */
  graceMs?: number;
  /** `"tree"`: the session ends at the last exit of its tree, not its owner's. */
  until?: Until;
  /** With `"auto"`: further process names to skip, for this registration only. */
  wrappers?: string[];
  /** Commands the daemon runs, as the caller, once the session ends, however it ends
   * (docs/end-actions.md). On an active session a list (empty too) replaces the one it
   * had; left out, it is kept. */
  onEndRun?: ActionSpec[];
}

/** The answer to `register`. */
export interface Registered {
  session: Session;
  /** What succeeded but looks wrong (a launcher as owner, an owner already gone). */
  warnings: string[];
}

/** The answer to `whose`. */
export interface Whose {
  session: Session;
  /** The owner's pid in the caller's PID namespace (0 when it is outside it). */
  owner_pid: number;
}

/** Root only: the session (or locks) of this user. */
export interface ForUser {
  uid?: number;
}

/** A fleet lock, one for every host whose daemon runs with `--etcd` (docs/fleet.md),
 * instead of this host's. */
export interface Fleet {
  cluster?: boolean;
}

/** How `acquireLock` waits for a lock another session holds. */
export interface AcquireOptions extends ForUser, Fleet {
  /** Wait in line instead of failing with `lock_held` at once. */
  wait?: boolean;
  /** With `wait`: give up after this long (`lock_held`). */
  timeoutMs?: number;
}

/** A connection to livenessd. Calls are served one at a time, in order; a call that fails
 * on the connection drops it, and the next one connects again. */
export class Client {
  private line: LineSocket | undefined;
  private queue: Promise<unknown> = Promise.resolve();

  private constructor(readonly socket: string) {}

  /** Connects to the daemon at `socket`, or at `defaultSocket()`. */
  static async connect(socket: string = defaultSocket()): Promise<Client> {
    const client = new Client(socket);
    client.line = await LineSocket.connect(socket);
    return client;
  }

  close(): void {
    this.line?.close();
    this.line = undefined;
  }

  /** Sends one request and returns its reply; a refusal throws a DaemonError. */
  call(request: Request): Promise<Reply> {
    const next = this.queue.then(() => this.callNow(request));
    this.queue = next.catch(() => undefined);
    return next;
  }

  private async callNow(request: Request): Promise<Reply> {
    this.line ??= await LineSocket.connect(this.socket);
    const line = this.line;
    let text: string;
    try {
      line.write(JSON.stringify({ ...(requestCodec.encode(request) as object), v: PROTOCOL_VERSION }) + "\n");
      text = await line.readLine();
    } catch (e) {
      this.close();
      throw e;
    }
    const value = JSON.parse(text) as Record<string, unknown>;
    if (!("ok" in value)) {
      this.close(); // a goodbye: the daemon is stopping
      throw new ConnectionLost("livenessd is stopping");
    }
    const reply = replyCodec.decode(value, "reply");
    if (!reply.ok) throw new DaemonError(reply.error?.code ?? "", reply.error?.message ?? "");
    return reply;
  }

  /** The next line after a subscribe reply (the connection is then a stream). */
  readLine(): Promise<string> {
    if (!this.line) throw new ConnectionLost("not connected");
    return this.line.readLine();
  }

  private async session(request: Request): Promise<Session> {
    const reply = await this.call(request);
    if (!reply.session) throw new ConnectionLost(`the reply to ${request.op} has no session`);
    return reply.session;
  }

  /** Creates a session, or gives an active one a new owner (a new turn). An owner that had
   * already died ends the session at once: check `session.phase`. */
  async register(registration: Registration): Promise<Registered> {
    const { owner } = registration;
    const spec: OwnerSpec = owner === "auto" || "start_ticks" in owner ? owner : capture(owner.pid);
    const reply = await this.call({
      op: "register",
      session: registration.session,
      uid: registration.uid,
      owner: spec,
      pending: registration.pending || undefined,
      labels: registration.labels,
      on_end: registration.onEnd,
      grace_ms: registration.graceMs,
      until: registration.until,
      wrappers: registration.wrappers,
      on_end_run: registration.onEndRun,
    });
    return { session: reply.session!, warnings: reply.warnings };
  }

  /** The session's end commands were run by the caller itself (an agent whose own end hook
   * ran): each end action that has not started is recorded as skipped (`done_by_agent`)
   * and never runs; those that had started run to their end, and `warnings` says so. The
   * session comes back with `actions` set. */
  async actionsDone(session: string, options: ForUser = {}): Promise<Registered> {
    const reply = await this.call({ op: "actions_done", session, uid: options.uid });
    if (!reply.session) throw new ConnectionLost("the reply to actions_done has no session");
    return { session: reply.session, warnings: reply.warnings };
  }

  /** Gives the pending session `session` its real id `to`. */
  rename(session: string, to: string, options: ForUser = {}): Promise<Session> {
    return this.session({ op: "rename", session, to, uid: options.uid });
  }

  /** Records activity: postpones the inactivity timeout of an owner of another host. */
  touch(session: string, options: ForUser & Declaration = {}): Promise<Session> {
    return this.session({
      op: "touch",
      session,
      uid: options.uid,
      turn: options.turn,
      tool: options.tool,
      tool_end: options.toolEnd || undefined,
    });
  }

  /** Ends a session now (reason `stopped`); `terminate` also terminates its surviving
   * processes, whatever its cleanup policy. */
  end(session: string, options: ForUser & { terminate?: boolean } = {}): Promise<Session> {
    return this.session({ op: "end", session, uid: options.uid, terminate: options.terminate || undefined });
  }

  get(session: string, options: ForUser = {}): Promise<Session> {
    return this.session({ op: "get", session, uid: options.uid });
  }

  /** Every session the caller may see (in `phase`, or both), oldest first, following the
   * daemon's pages. */
  async list(phase?: Phase): Promise<Session[]> {
    return (await this.pages({ op: "list", phase })).flatMap((reply) => reply.sessions ?? []);
  }

  /** The replies to `request` and to the same for each next page. */
  private async pages(request: Request): Promise<Reply[]> {
    const replies = [await this.call(request)];
    while (replies[replies.length - 1].next !== undefined) {
      replies.push(await this.call({ ...request, after: replies[replies.length - 1].next }));
    }
    return replies;
  }

  /** The active session that owns process `pid` (in the caller's PID namespace) or its
   * nearest ancestor that owns one; `not_found` if none does. */
  async whose(pid: number): Promise<Whose> {
    const reply = await this.call({ op: "whose", pid });
    return { session: reply.session!, owner_pid: reply.owner_pid ?? reply.session!.owner.pid };
  }

  /** The live processes of an active session's tree, the owner included, following the
   * daemon's pages. */
  async processes(session: string, options: ForUser = {}): Promise<Process[]> {
    const replies = await this.pages({ op: "processes", session, uid: options.uid });
    return replies.flatMap((reply) => reply.processes ?? []);
  }

  /** What the daemon says about itself; informational, and its shape may grow. */
  async status(): Promise<Record<string, unknown>> {
    return (await this.call({ op: "status" })).status ?? {};
  }

  /** Takes lock `name` for `session` and returns it with its fencing token. Held by
   * another session: `lock_held` at once, or with `wait` after waiting in line until it
   * is granted or `timeoutMs` passes. A waiting acquire has a connection of its own, so
   * that other calls go on meanwhile. */
  async acquireLock(name: string, session: string, options: AcquireOptions = {}): Promise<Lock> {
    const request: Request = {
      op: "lock_acquire",
      name,
      session,
      uid: options.uid,
      wait: options.wait || undefined,
      timeout_ms: options.timeoutMs,
      cluster: options.cluster || undefined,
    };
    if (!options.wait) return (await this.call(request)).lock!;
    const waiter = await Client.connect(this.socket);
    try {
      return (await waiter.call(request)).lock!;
    } finally {
      waiter.close();
    }
  }

  /** Releases lock `name`, which `session` holds; `not_held` otherwise. With `cluster`,
   * the fleet lock of that name. */
  async releaseLock(name: string, session: string, options: ForUser & Fleet = {}): Promise<Lock> {
    return (
      await this.call({ op: "lock_release", name, session, uid: options.uid, cluster: options.cluster || undefined })
    ).lock!;
  }

  /** The held locks the caller may see, by uid then name, following the daemon's pages. */
  async locks(options: ForUser = {}): Promise<Lock[]> {
    return (await this.pages({ op: "lock_list", uid: options.uid })).flatMap((reply) => reply.locks ?? []);
  }
}
