// The README's consumer, run as its own program, and the agentctl seed replay.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { launch, name, repositoryLock } from "../examples/agentctl.js";
import { Client, SESSION_ENDED, loadCursor, subscribe } from "../src/index.js";
import { Daemon, REPO, child, kill, tempDir } from "./daemon.js";

const HERE = path.join(REPO, "clients/typescript");

/** The consumer as its own process, its lines in order. */
class Consumer {
  readonly process: ChildProcess;
  private lines: string[] = [];
  private wake: (() => void) | undefined;

  constructor(socket: string, cursor: string) {
    this.process = spawn(globalThis.process.execPath, [path.join(HERE, "dist/examples/consumer.js"), cursor], {
      stdio: ["ignore", "pipe", "inherit"],
      env: { ...globalThis.process.env, LIVENESS_SOCKET: socket },
    });
    createInterface({ input: this.process.stdout! }).on("line", (line) => {
      this.lines.push(line);
      this.wake?.();
    });
  }

  async next(timeoutMs: number): Promise<string | undefined> {
    const deadline = Date.now() + timeoutMs;
    while (this.lines.length === 0 && Date.now() < deadline) {
      await Promise.race([new Promise<void>((resolve) => (this.wake = resolve)), sleep(deadline - Date.now())]);
    }
    return this.lines.shift();
  }

  async stop(): Promise<void> {
    await kill(this.process);
  }
}

async function status(socket: string): Promise<Record<string, unknown>> {
  const client = await Client.connect(socket);
  try {
    return await client.status();
  } finally {
    client.close();
  }
}

test("consumer: the README's consumer resumes across restarts", async (t) => {
  const d = await Daemon.start(t);
  const register = async (session: string) => {
    const owner = child(t);
    const client = await Client.connect(d.socket);
    await client.register({ session, owner: { pid: owner.pid } });
    client.close();
    return owner;
  };
  const cursor = path.join(tempDir(t), "cursor");
  let consumer = new Consumer(d.socket, cursor);
  t.after(() => consumer.stop());
  // Stopped before its first end, a run is followed by one that handles the ends in
  // between: a first run saves where it started, once subscribed.
  const deadline = Date.now() + 30_000;
  while (loadCursor(cursor) === undefined) {
    assert.ok(Date.now() < deadline, "the consumer saved no cursor when it started");
    await sleep(20);
  }
  await consumer.stop();
  await kill(await register("early"));
  consumer = new Consumer(d.socket, cursor);
  assert.equal(await consumer.next(30_000), "early owner_exited");

  const a = await register("a");
  const b = await register("b");
  await kill(a);
  assert.equal(await consumer.next(30_000), "a owner_exited");

  await d.stop();
  await kill(b);
  await d.start();
  assert.equal(await consumer.next(30_000), "b owner_exited");

  // It handles an event, then saves its cursor: stopped in between, it would handle the
  // event again (at least once). Stop it once the last event is saved.
  const head = (await status(d.socket)).head_seq;
  while (loadCursor(cursor)?.seq !== head) await sleep(20);
  await consumer.stop();
  await kill(await register("c"));
  consumer = new Consumer(d.socket, cursor);
  assert.equal(await consumer.next(30_000), "c owner_exited");
  assert.equal(await consumer.next(500), undefined, "nothing is printed twice");
});

test("consumer: the README shows this program", () => {
  const source = readFileSync(path.join(HERE, "examples/consumer.ts"), "utf8");
  const body = source.slice(source.indexOf("\nconst file"));
  assert.ok(readFileSync(path.join(HERE, "README.md"), "utf8").includes(body));
});

const WRAPPER = ["sh", "-c", "sleep 300 & echo $!; wait"];

/** SIGKILL to a process that may be gone already. */
function killPid(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // gone
  }
}

test("agentctl: a pending session renamed later, its lock released when the agent dies, not its wrapper", async (t) => {
  const d = await Daemon.start(t);
  const client = await Client.connect(d.socket);
  const events = await subscribe({ socket: d.socket });
  t.after(() => (client.close(), events.close()));

  const first = await launch(client, "web", WRAPPER);
  t.after(() => (first.wrapper.kill("SIGKILL"), killPid(first.agentPid)));
  assert.match(first.session.id, /^pending-[0-9a-f]{16}$/);
  assert.equal(first.session.owner.pid, first.agentPid, "the agent owns the session, not its wrapper");
  assert.equal((await name(client, first.session.id, "conv-A")).id, "conv-A");
  assert.deepEqual(
    (await client.locks()).map((l) => [l.name, l.session, l.token]),
    [[repositoryLock("web"), "conv-A", first.lock.token]],
    "the lock follows the rename",
  );

  // A second agent for the same repository waits in line.
  const second = launch(client, "web", WRAPPER);
  while ((await client.locks())[0].waiters !== 1) await sleep(10);

  // The first agent's wrapper dies: nothing is released. A marker session ended after it
  // shows that the daemon has handled the wrapper's death by then.
  await kill(first.wrapper);
  const marker = child(t);
  await client.register({ session: "marker", owner: { pid: marker.pid } });
  await kill(marker);
  for await (const event of events.events()) if (event.kind === SESSION_ENDED && event.session === "marker") break;
  const [held] = await client.locks();
  assert.deepEqual([held.session, held.waiters], ["conv-A", 1], "the wrapper's death released the lock");

  // The agent dies: its session ends and the lock passes to the second agent.
  killPid(first.agentPid);
  const next = await second;
  t.after(() => (next.wrapper.kill("SIGKILL"), killPid(next.agentPid)));
  assert.ok(next.lock.token > first.lock.token, "fencing tokens only grow");
  assert.equal(next.lock.session, next.session.id);
  const ended = await client.get("conv-A");
  assert.deepEqual([ended.phase, ended.reason], ["ended", "owner_exited"]);
});
