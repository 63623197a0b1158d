// A line cut short by the end of its connection is a lost connection, not a line: the
// daemon cuts one short when it gives up on a subscriber that stopped reading in its
// middle, and the subscription resumes after the last whole event. A stand-in daemon on a
// socket sends exactly those bytes.

import assert from "node:assert/strict";
import * as net from "node:net";
import * as path from "node:path";
import { test } from "node:test";

import { subscribe } from "../src/index.js";
import { tempDir } from "./daemon.js";

const event = (seq: number) =>
  JSON.stringify({
    event: {
      seq, kind: "session.ended", at_ms: 0, session: "s", creator_uid: 0,
      owner: { pid: 1, start_ticks: 1, boot_id: "b", host: "h", comm: "c" },
    },
  });

test("a line cut short resumes the subscription", async (t) => {
  const socket = path.join(tempDir(t), "sock");
  const sends = [`${event(1)}\n{"event":{"seq":2,`, `${event(2)}\n`];
  const asked: (number | undefined)[] = [];
  const server = net.createServer((conn) => {
    let request = "";
    conn.setEncoding("utf8");
    conn.on("data", (chunk: string) => {
      request += chunk;
      if (!request.includes("\n")) return;
      const since: number | undefined = JSON.parse(request).since;
      asked.push(since);
      const ack = JSON.stringify({ ok: true, subscribed: { since: since ?? 0, head: 0, store_id: "st" } });
      conn.end(`${ack}\n${sends.shift()}`);
    });
  });
  await new Promise<void>((resolve) => server.listen(socket, resolve));
  const subscription = await subscribe({ socket });
  const got: number[] = [];
  for await (const e of subscription.events()) {
    got.push(e.seq);
    if (got.length === 2) break;
  }
  server.close();
  assert.deepEqual(got, [1, 2], "each event once, the line cut short dropped");
  assert.deepEqual(asked, [undefined, 1], "resumed after the last whole event");
});
