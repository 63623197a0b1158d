// The event stream, followed across connections: the consumer's loop of
// docs/protocol.md §6, built in.

import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, type ForUser, defaultSocket } from "./client.js";
import { GaveUp, LivenessError, transient } from "./errors.js";
import {
  type LivenessEvent,
  type Message,
  SESSION_ENDED,
  SESSION_FINALIZED,
  type Session,
  isFinalized,
  message as messageCodec,
} from "./types.js";

/** Where a consumer stands: the last event it handled, and the store (database) that seq
 * belongs to (unknown for a bare seq). */
export interface Cursor {
  seq: number;
  store_id?: string;
}

/** Reads `SEQ STORE_ID`, or a bare `SEQ` (the format of `liveness watch --cursor`). */
export function parseCursor(text: string): Cursor {
  const words = text.trim().split(/\s+/);
  if (words.length > 2 || !/^\d+$/.test(words[0])) {
    throw new LivenessError(`${JSON.stringify(text)} is no cursor (want "SEQ STORE_ID")`);
  }
  return words.length === 2 ? { seq: Number(words[0]), store_id: words[1] } : { seq: Number(words[0]) };
}

export function formatCursor(cursor: Cursor): string {
  return cursor.store_id ? `${cursor.seq} ${cursor.store_id}` : `${cursor.seq}`;
}

/** The cursor saved in `file`; undefined when there is none yet (a first run). */
export function loadCursor(file: string): Cursor | undefined {
  try {
    return parseCursor(readFileSync(file, "utf8"));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw e;
  }
}

/** Writes `cursor` to `file` atomically (a temporary file renamed over it). */
export function saveCursor(file: string, cursor: Cursor): void {
  writeFileSync(`${file}.tmp`, `${formatCursor(cursor)}\n`, { mode: 0o600 });
  renameSync(`${file}.tmp`, file);
}

/** How a subscription reaches a daemon that went away: waits of `firstMs`, doubling up to
 * `maxMs`, for up to `giveUpAfterMs` (then GaveUp). */
export interface Retry {
  firstMs: number;
  maxMs: number;
  giveUpAfterMs: number;
}

/** 0.1 s doubling to 2 s, for up to 30 s: a daemon restarted by its service manager. */
export const DEFAULT_RETRY: Retry = { firstMs: 100, maxMs: 2000, giveUpAfterMs: 30_000 };

/** Calls `attempt` until it succeeds, fails for good, or time is up. */
export async function retrying<T>(retry: Retry, attempt: () => Promise<T>): Promise<T> {
  const start = Date.now();
  let delay = retry.firstMs;
  for (;;) {
    try {
      return await attempt();
    } catch (e) {
      if (!transient(e)) throw e;
      if (Date.now() - start + delay > retry.giveUpAfterMs) {
        throw new GaveUp(`livenessd did not come back within ${retry.giveUpAfterMs} ms: ${(e as Error).message}`);
      }
    }
    await sleep(delay);
    delay = Math.min(delay * 2, retry.maxMs);
  }
}

export interface SubscribeOptions extends ForUser {
  /** The daemon's socket (default: `defaultSocket()`). */
  socket?: string;
  /** Resume after this cursor; from now on without one. */
  cursor?: Cursor;
  /** Only this session's events. */
  session?: string;
  retry?: Retry;
}

/** The events after a cursor (from now on without one), delivered once each across daemon
 * restarts: an AsyncIterable of stream messages.
 *
 * When a connection ends (a `goodbye`, a `lagged`, a killed daemon) it subscribes again
 * after the last delivered event, retrying as its Retry says; the daemon replays what was
 * committed meanwhile, and events at or before the cursor are dropped. Besides events it
 * delivers `reset` (the cursor was of another database: resynchronize; every event of the
 * new one follows), `gap` (events were pruned before they were read: resynchronize),
 * `lagged` and `goodbye` (it resumes by itself). Save `cursor` after handling each event
 * to resume a later subscription. Leaving a `for await` loop closes it. */
export class Subscription implements AsyncIterable<Message> {
  private client: Client | undefined;
  private closed = false;
  private position: Cursor | undefined;
  readonly socket: string;
  readonly retry: Retry;

  private constructor(private readonly options: SubscribeOptions) {
    this.socket = options.socket ?? defaultSocket();
    this.retry = options.retry ?? DEFAULT_RETRY;
    this.position = options.cursor && { ...options.cursor };
  }

  /** Subscribes, waiting for a daemon that may be restarting. */
  static async open(options: SubscribeOptions = {}): Promise<Subscription> {
    const subscription = new Subscription(options);
    await subscription.reconnect();
    return subscription;
  }

  /** The last delivered event and its store. */
  get cursor(): Cursor | undefined {
    return this.position && { ...this.position };
  }

  close(): void {
    this.closed = true;
    this.drop();
  }

  private drop(): void {
    this.client?.close();
    this.client = undefined;
  }

  private async subscribeOnce(): Promise<void> {
    const client = await Client.connect(this.socket);
    try {
      const reply = await client.call({
        op: "subscribe",
        since: this.position?.seq,
        store_id: this.position?.store_id,
        session: this.options.session,
        uid: this.options.uid,
      });
      this.position ??= { seq: reply.subscribed!.since };
      // The store id names the daemon's current run: a cursor it kept is valid in it, and a
      // state restored from a copy made before this run voids it.
      this.position.store_id = reply.subscribed!.store_id;
    } catch (e) {
      client.close();
      throw e;
    }
    this.client = client;
  }

  private reconnect(): Promise<void> {
    return retrying(this.retry, () => this.subscribeOnce());
  }

  /** The next message to deliver, reconnecting as needed; undefined once closed. */
  async next(): Promise<Message | undefined> {
    while (!this.closed) {
      if (!this.client) await this.reconnect();
      let line: string;
      try {
        line = await this.client!.readLine();
      } catch (e) {
        this.drop();
        if (this.closed) return undefined;
        if (transient(e)) continue; // a daemon killed without a goodbye: resume after the cursor
        throw e;
      }
      const message = messageCodec.decode(JSON.parse(line), "line");
      const position = this.position!;
      if (message === undefined) continue; // a line of a newer protocol
      if ("event" in message) {
        if (message.event.seq <= position.seq) continue; // delivered before this connection
        position.seq = message.event.seq;
      } else if ("reset" in message) {
        this.position = { seq: 0, store_id: message.reset.store_id };
      } else if ("gap" in message) {
        position.seq = Math.max(position.seq, message.gap.pruned_through);
      } else {
        this.drop(); // lagged, goodbye: the daemon closes the stream; the next read resumes
      }
      return message;
    }
    return undefined;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Message> {
    try {
      for (;;) {
        const message = await this.next();
        if (message === undefined) return;
        yield message;
      }
    } finally {
      this.close();
    }
  }

  /** The events alone (the other messages are followed, not delivered). */
  async *events(): AsyncGenerator<LivenessEvent> {
    for await (const message of this) {
      if ("event" in message) yield message.event;
    }
  }
}

/** A Subscription to the daemon. */
export function subscribe(options: SubscribeOptions = {}): Promise<Subscription> {
  return Subscription.open(options);
}

/** Resolves once `session` has ended, with the ended session, across daemon restarts. It
 * subscribes first and then looks the session up, so an end in between is still seen. */
export function waitForEnd(session: string, options: ForUser & { socket?: string } = {}): Promise<Session> {
  return waitFor(
    session,
    options,
    (s) => s.phase === "ended",
    (e) => e.kind === SESSION_ENDED,
  );
}

/** Resolves once `session` has ended and each of its end actions has its outcome (at once
 * after the end for a session without end actions), with the session and its `actions`,
 * across daemon restarts. */
export function waitForFinalized(session: string, options: ForUser & { socket?: string } = {}): Promise<Session> {
  return waitFor(session, options, isFinalized, (e) =>
    e.kind === SESSION_FINALIZED || (e.kind === SESSION_ENDED && e.actions === 0),
  );
}

/** Subscribes to `session`'s events, then gets it: until it is `done`, the first event that
 * is `last` makes it get the session again. */
async function waitFor(
  session: string,
  options: ForUser & { socket?: string },
  done: (s: Session) => boolean,
  last: (e: LivenessEvent) => boolean,
): Promise<Session> {
  const events = await Subscription.open({ socket: options.socket, session, uid: options.uid });
  const get = (id: string, uid?: number) =>
    retrying(events.retry, async () => {
      const client = await Client.connect(events.socket);
      try {
        return await client.get(id, { uid });
      } finally {
        client.close();
      }
    });
  try {
    const current = await get(session, options.uid);
    if (done(current)) return current;
    for await (const event of events.events()) {
      if (last(event)) return await get(event.session, event.creator_uid);
    }
    throw new LivenessError("the subscription was closed");
  } finally {
    events.close();
  }
}
