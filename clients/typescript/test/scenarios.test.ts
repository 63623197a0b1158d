// The scenarios of clients/contract/scenarios.md, against the real daemon.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  Client,
  DaemonError,
  type Identity,
  type LivenessEvent,
  NoSuchProcess,
  SESSION_ACTION,
  SESSION_ENDED,
  SESSION_FINALIZED,
  SESSION_REGISTERED,
  SYSTEM_SOCKET,
  type Subscription,
  capture,
  check,
  defaultSocket,
  isFinalized,
  sameProcess,
  subscribe,
  succeeded,
  waitForEnd,
  waitForFinalized,
} from "../src/index.js";
import { session as sessionCodec, identity as identityCodec } from "../src/types.js";
import { Daemon, REPO, child, differs, kill, requireEbpf, tempDir } from "./daemon.js";

/** Reads until an event of `kind` for `session`, noting every seq delivered. */
async function until(events: Subscription, kind: string, session: string, seen?: number[]): Promise<LivenessEvent> {
  for (;;) {
    const message = await events.next();
    assert.ok(message, "the subscription ended");
    if ("event" in message) {
      seen?.push(message.event.seq);
      if (message.event.kind === kind && message.event.session === session) return message.event;
    }
  }
}

async function refused(call: Promise<unknown>, code: string): Promise<void> {
  await assert.rejects(call, (e: unknown) => DaemonError.is(e, code) && (e as DaemonError).message.length > 0);
}

test("owner-killed", async (t) => {
  const d = await Daemon.start(t);
  const events = await subscribe({ socket: d.socket });
  const client = await Client.connect(d.socket);
  t.after(() => (events.close(), client.close()));
  const owner = child(t);
  const { session: registered } = await client.register({ session: "killed", owner: { pid: owner.pid }, labels: { tool: "ts" } });
  assert.equal(registered.phase, "active");
  assert.equal(registered.owner.pid, owner.pid);
  await until(events, SESSION_REGISTERED, "killed");
  await kill(owner);
  const ended = await until(events, SESSION_ENDED, "killed");
  assert.equal(ended.reason, "owner_exited");
  assert.deepEqual(ended.labels, { tool: "ts" });
  if (requireEbpf() || ended.detected_by === "ebpf") {
    assert.equal(ended.detected_by, "ebpf");
    assert.deepEqual(ended.exit, { kind: "signaled", signal: 9, core_dumped: false });
  }
  const session = await client.get("killed");
  assert.deepEqual([session.reason, session.exit, session.detected_by], [ended.reason, ended.exit, ended.detected_by]);
  assert.ok(sameProcess(session.owner, ended.owner));
  assert.equal(differs(d.cli("get", "--session", "killed"), sessionCodec.encode(session)), undefined);
});

test("operations", async (t) => {
  const d = await Daemon.start(t);
  const client = await Client.connect(d.socket);
  t.after(() => client.close());
  const owner = child(t);
  const { session: pending } = await client.register({ pending: true, owner: { pid: owner.pid } });
  assert.match(pending.id, /^pending-[0-9a-f]{16}$/);
  assert.ok(pending.pending && pending.pending_expires_ms);
  const renamed = await client.rename(pending.id, "conv-1");
  assert.deepEqual([renamed.id, renamed.pending, renamed.pending_expires_ms], ["conv-1", false, null]);
  assert.equal((await client.touch("conv-1")).id, "conv-1");
  const declared = (await client.touch("conv-1", { turn: "start", tool: "Bash" })).declared;
  assert.equal(declared?.tool, "Bash");
  assert.ok(declared?.turn_since_ms);
  const whose = await client.whose(owner.pid);
  assert.deepEqual([whose.session.id, whose.owner_pid], ["conv-1", owner.pid]);
  const processes = await client.processes("conv-1");
  assert.deepEqual(processes.map((p) => [p.identity.pid, p.owner]), [[owner.pid, true]]);
  await client.register({ session: "plain", owner: { pid: owner.pid } });
  assert.deepEqual((await client.list()).map((s) => s.id), ["conv-1", "plain"]);
  const ended = await client.end("conv-1");
  assert.deepEqual([ended.phase, ended.reason], ["ended", "stopped"]);
  assert.ok(ended.ended_ms);
  assert.deepEqual((await client.list("active")).map((s) => s.id), ["plain"]);
  await refused(client.end("conv-1"), "already_ended");
  await refused(client.get("nobody"), "not_found");
  await refused(client.rename("plain", "other"), "not_pending");
  await refused(client.register({ session: "plain", owner: { pid: owner.pid }, onEnd: "terminate" }), "invalid_request");
  await assert.rejects(client.register({ session: "gone", owner: { pid: 2 ** 30 } }), NoSuchProcess);
  assert.ok((await client.status()).store_id);
});

test("restart-resume", async (t) => {
  const d = await Daemon.start(t);
  const events = await subscribe({ socket: d.socket, retry: { firstMs: 50, maxMs: 500, giveUpAfterMs: 60_000 } });
  t.after(() => events.close());
  const seen: number[] = [];
  const register = async (session: string) => {
    const owner = child(t);
    const client = await Client.connect(d.socket);
    await client.register({ session, owner: { pid: owner.pid } });
    client.close();
    await until(events, SESSION_REGISTERED, session, seen);
    return owner;
  };
  const a = await register("a");
  const first = events.cursor!;
  const b = await register("b");

  await d.stop();
  await kill(a);
  await d.start();
  assert.equal((await until(events, SESSION_ENDED, "a", seen)).detected_by, "reconcile");

  await d.kill9();
  await d.start();
  await kill(b);
  await until(events, SESSION_ENDED, "b", seen);

  assert.deepEqual(seen, [...new Set(seen)].sort((x, y) => x - y), "seqs out of order or twice");
  const replayed: number[] = [];
  const replay = await subscribe({ socket: d.socket, cursor: first });
  for await (const event of replay.events()) {
    replayed.push(event.seq);
    if (event.seq >= seen[seen.length - 1]) break;
  }
  assert.deepEqual(replayed, seen.slice(1));
});

test("lagged", async (t) => {
  const d = await Daemon.start(t, "--subscriber-queue", "8");
  const owner = capture(child(t).pid);
  const events = await subscribe({ socket: d.socket });
  const client = await Client.connect(d.socket);
  t.after(() => (events.close(), client.close()));
  // Far more events than the socket's buffers and the queue of 8 hold, while the
  // subscriber reads nothing: the daemon drops it with lagged.
  const sessions = Array.from({ length: 2000 }, (_, i) => `s${String(i).padStart(4, "0")}`);
  for (const session of sessions) await client.register({ session, owner });
  const delivered: string[] = [];
  let lagged = false;
  for await (const message of events) {
    if ("lagged" in message) lagged = true;
    if ("event" in message && delivered.push(message.event.session) === sessions.length) break;
  }
  assert.ok(lagged, "the subscriber was never told it lagged: the test proves nothing");
  assert.deepEqual(delivered, sessions, "missed or twice");
});

test("pages", async (t) => {
  const d = await Daemon.start(t);
  const owner = capture(child(t).pid);
  const client = await Client.connect(d.socket);
  t.after(() => client.close());
  const names = Array.from({ length: 1001 }, (_, i) => `s${String(i).padStart(4, "0")}`); // pages hold 1000
  for (const name of names) {
    await client.register({ session: name, owner });
    await client.acquireLock(`lock-${name}`, name);
  }
  assert.deepEqual((await client.list()).map((s) => s.id), names);
  assert.deepEqual((await client.locks()).map((l) => [l.name, l.session]), names.map((n) => [`lock-${n}`, n]));
});

test("reset", async (t) => {
  const d = await Daemon.start(t);
  const owner = child(t);
  const events = await subscribe({ socket: d.socket });
  t.after(() => events.close());
  const register = async (session: string) => {
    const client = await Client.connect(d.socket);
    await client.register({ session, owner: { pid: owner.pid } });
    client.close();
  };
  await register("x");
  await until(events, SESSION_REGISTERED, "x");
  const storeA = events.cursor!.store_id;

  await d.stop();
  rmSync(d.state, { recursive: true });
  await d.start();
  await register("y");
  let reset: string | undefined;
  for (;;) {
    const message = await events.next();
    assert.ok(message);
    if ("reset" in message) reset = message.reset.store_id;
    if ("event" in message) {
      assert.ok(reset && reset !== storeA, "a new store's event came without a reset");
      assert.deepEqual([message.event.seq, message.event.session], [1, "y"]);
      break;
    }
  }
  assert.deepEqual(events.cursor, { seq: 1, store_id: reset });
});

test("locks", async (t) => {
  const d = await Daemon.start(t);
  let client = await Client.connect(d.socket);
  t.after(() => client.close());
  const owners = { s1: child(t), s2: child(t) };
  for (const [session, owner] of Object.entries(owners)) await client.register({ session, owner: { pid: owner.pid } });
  const first = await client.acquireLock("build", "s1");
  assert.equal(first.session, "s1");
  assert.ok(first.token > 0);
  assert.equal((await client.acquireLock("build", "s1")).token, first.token);
  await refused(client.acquireLock("build", "s1", { cluster: true }), "invalid_request");
  await refused(client.acquireLock("build", "s2"), "lock_held");
  const start = Date.now();
  await refused(client.acquireLock("build", "s2", { wait: true, timeoutMs: 300 }), "lock_held");
  assert.ok(Date.now() - start >= 300);

  const granted = client.acquireLock("build", "s2", { wait: true });
  for (;;) {
    const locks = await client.locks();
    assert.equal(locks.length, 1);
    assert.equal(locks[0].session, "s1");
    if (locks[0].waiters === 1) break;
    await sleep(10);
  }
  await kill(owners.s1);
  const second = await granted;
  assert.equal(second.session, "s2");
  assert.ok(second.token > first.token);
  assert.equal((await client.releaseLock("build", "s2")).token, second.token);
  await refused(client.releaseLock("build", "s2"), "not_held");

  await d.stop();
  await d.start();
  client = await Client.connect(d.socket);
  const after = await client.acquireLock("build", "s2");
  assert.ok(after.token > second.token, "tokens grow across a restart");
});

test("wait", async (t) => {
  const d = await Daemon.start(t);
  const owner = child(t);
  const client = await Client.connect(d.socket);
  await client.register({ session: "w", owner: { pid: owner.pid } });
  client.close();
  setTimeout(() => kill(owner), 200);
  const ended = await waitForEnd("w", { socket: d.socket });
  assert.deepEqual([ended.phase, ended.reason], ["ended", "owner_exited"]);
});

test("end-actions", async (t) => {
  const d = await Daemon.start(t);
  const events = await subscribe({ socket: d.socket });
  const client = await Client.connect(d.socket);
  t.after(() => (events.close(), client.close()));
  const ran = path.join(tempDir(t), "ran");
  const owner = child(t);
  const { session: registered } = await client.register({
    session: "acted",
    owner: { pid: owner.pid },
    onEndRun: [{ argv: ["sh", "-c", 'echo "$LIVENESS_SESSION" >>"$RAN"; echo failing >&2; exit 3'], env: [`RAN=${ran}`] }],
  });
  assert.equal(registered.on_end_run.length, 1);
  const finalized = waitForFinalized("acted", { socket: d.socket });
  await sleep(200);
  await kill(owner);
  assert.equal((await until(events, SESSION_ENDED, "acted")).actions, 1);
  const event = await until(events, SESSION_ACTION, "acted");
  await until(events, SESSION_FINALIZED, "acted");
  const session = await finalized;
  assert.ok(isFinalized(session) && session.finalized_ms !== undefined, JSON.stringify(session));
  assert.equal(session.actions.length, 1);
  assert.equal(session.actions[0].state, "done");
  const outcome = session.actions[0].outcome!;
  assert.deepEqual([outcome.exit, outcome.stderr_tail, succeeded(outcome)], [{ kind: "exited", code: 3 }, "failing\n", false]);
  assert.deepEqual(event.action, outcome);
  assert.equal(readFileSync(ran, "utf8"), "acted\n", "the action ran once");
  assert.equal(differs(d.cli("get", "--session", "acted"), sessionCodec.encode(session)), undefined);

  // An agent that ran its end commands itself: the daemon never runs them.
  const skipped = path.join(tempDir(t), "skipped");
  const agent = child(t);
  await client.register({ session: "agent-ran", owner: { pid: agent.pid }, onEndRun: [{ argv: ["touch", skipped] }] });
  const done = await client.actionsDone("agent-ran");
  assert.equal(done.session.actions[0].outcome?.skipped, "done_by_agent");
  await kill(agent);
  const after = await waitForFinalized("agent-ran", { socket: d.socket });
  assert.ok(isFinalized(after));
  assert.equal(after.actions[0].outcome?.skipped, "done_by_agent");
  assert.equal(existsSync(skipped), false, "the skipped action ran");
  await refused(client.actionsDone("nobody"), "not_found");
});

test("check", async (t) => {
  const d = await Daemon.start(t); // only its CLI is used
  const strange = path.join(tempDir(t), "a) (b c");
  copyFileSync(spawnSync("sh", ["-c", "command -v sleep"], { encoding: "utf8" }).stdout.trim(), strange);
  spawnSync("chmod", ["755", strange]);
  const process = child(t, strange, "300");
  const captured = capture(process.pid);
  assert.equal(captured.comm, "a) (b c");
  // Node reads no pidfs inode: the CLI's identity has one more key.
  const { pidfs_ino: _, ...cli } = d.cli("check", "--pid", String(process.pid));
  assert.deepEqual(identityCodec.encode(captured), cli);

  const agree = (what: string, identity: Identity, state: string, reason?: string) => {
    const verdict = check(identity);
    const cli = d.cli("check", "--identity", JSON.stringify(identityCodec.encode(identity)));
    assert.deepEqual([verdict.state, verdict.reason], [state, reason], what);
    assert.deepEqual([cli.liveness, cli.reason], [state, reason], what);
  };
  agree("a live process", captured, "alive");
  agree("its pid with another start time", { ...captured, start_ticks: captured.start_ticks + 1 }, "dead", "owner_reused");
  const rebooted = { ...captured, boot_id: "00000000-0000-0000-0000-000000000000" };
  agree("an earlier boot of this host", rebooted, "dead", "rebooted");
  agree("a boot of another host", { ...rebooted, host: "another-host.invalid" }, "unknown");
  await kill(process);
  agree("the process killed and reaped", captured, "dead", "exited");
  assert.throws(() => capture(process.pid), NoSuchProcess);
});

test("time-namespace", async (t) => {
  const process = child(t);
  const outside = capture(process.pid);
  const index = path.join(REPO, "clients/typescript/dist/src/index.js");
  const inside = spawnSync(
    "unshare",
    ["--time", "--boottime", "1000", "--fork", globalThis.process.execPath, "--input-type=module", "-e",
      `import { capture } from ${JSON.stringify(index)}; console.log(capture(${process.pid}).start_ticks);`],
    { encoding: "utf8" },
  );
  assert.equal(inside.status, 0, inside.stderr);
  assert.equal(Number(inside.stdout), outside.start_ticks);
});

test("default-socket", (t) => {
  const saved = { ...process.env };
  t.after(() => {
    process.env = saved;
  });
  process.env.LIVENESS_SOCKET = "/somewhere/else.sock";
  assert.equal(defaultSocket(), "/somewhere/else.sock");
  process.env.LIVENESS_SOCKET = "";
  if (process.getuid?.() === 0) {
    assert.equal(defaultSocket(), SYSTEM_SOCKET);
    return;
  }
  const runtime = tempDir(t);
  process.env.XDG_RUNTIME_DIR = runtime;
  assert.equal(defaultSocket(), SYSTEM_SOCKET);
  writeFileSync(path.join(runtime, "liveness.sock"), "");
  assert.equal(defaultSocket(), path.join(runtime, "liveness.sock"));
});
