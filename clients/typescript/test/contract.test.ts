// The fixtures: every marked JSON block of docs/protocol.md, read from that file (see
// clients/contract/scenarios.md), decoded into this client's types and encoded again.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { test } from "node:test";

import { ERROR_CODES } from "../src/errors.js";
import type { Codec } from "../src/codec.js";
import { cause, event, exitStatus, identity, lock, message, reply, request, session, survivors, usage } from "../src/types.js";
import { REPO, differs } from "./daemon.js";

const DOC = path.join(REPO, "docs/protocol.md");
const MARKER = "<!-- contract: ";

/** [line, kind, text] of every marked document; an unmarked json block fails. */
function fixtures(): [number, string, string][] {
  const lines = readFileSync(DOC, "utf8").split("\n");
  const out: [number, string, string][] = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== "```json") continue;
    let end = i + 1;
    while (!lines[end].startsWith("```")) end++;
    const marker = lines[i - 1];
    assert.ok(marker.startsWith(MARKER) && marker.endsWith(" -->"), `${DOC}:${i + 1}: a json block without a marker`);
    const kind = marker.slice(MARKER.length, -" -->".length);
    if (kind.endsWith(" lines")) {
      for (let j = i + 1; j < end; j++) if (lines[j].trim()) out.push([j + 1, kind.slice(0, -" lines".length), lines[j]]);
    } else {
      out.push([i + 2, kind, lines.slice(i + 1, end).join("\n")]);
    }
    i = end;
  }
  return out;
}

const roundTrip = <T>(codec: Codec<T>) => (value: unknown) => codec.encode(codec.decode(value, "$"));

/** A line as a client reads it: a request has "op", a reply "ok", else a stream message. */
function wire(value: unknown): unknown {
  const keys = value as Record<string, unknown>;
  if ("op" in keys) return roundTrip(request)(value);
  if ("ok" in keys) return roundTrip(reply)(value);
  const decoded = message.decode(value, "$");
  assert.ok(decoded, `no stream message: ${JSON.stringify(value)}`);
  return message.encode(decoded);
}

const KINDS: Record<string, (value: unknown) => unknown> = {
  identity: roundTrip(identity),
  exit_status: roundTrip(exitStatus),
  cause: roundTrip(cause),
  usage: roundTrip(usage),
  session: roundTrip(session),
  event: roundTrip(event),
  lock: roundTrip(lock),
  survivors: roundTrip(survivors),
  wire,
  doctor: (value) => value, // the CLI's output, checked against the daemon's types in Rust
};

test("every fixture decodes and says the same again", () => {
  const all = fixtures();
  assert.ok(all.length >= 40, `only ${all.length} fixtures`);
  const failures: string[] = [];
  for (const [line, kind, text] of all) {
    const value = JSON.parse(text);
    let problem: string | undefined;
    try {
      problem = differs(value, KINDS[kind](value));
    } catch (e) {
      problem = `${(e as Error).name}: ${(e as Error).message}`;
    }
    if (problem) failures.push(`${DOC}:${line} (${kind}): ${problem}`);
  }
  assert.deepEqual(failures, []);
});

test("every documented error code is named", () => {
  const lines = readFileSync(DOC, "utf8").split("\n");
  const documented: string[] = [];
  for (const row of lines.slice(lines.indexOf(`${MARKER}error_codes -->`) + 1)) {
    if (!row.startsWith("|")) break;
    const cell = row.split("|")[1].trim();
    if (cell.startsWith("`") && cell.endsWith("`")) documented.push(cell.slice(1, -1));
  }
  assert.deepEqual(documented, [...ERROR_CODES]);
});

test("closed kinds refuse what they do not know, open ones keep it", () => {
  for (const bad of [{ kind: "vanished" }, { kind: "exited" }, { kind: "signaled", signal: 9 }, "exited", null]) {
    assert.throws(() => exitStatus.decode(bad, "exit"), `${JSON.stringify(bad)} was read as an exit status`);
  }
  const newer = { kind: "frozen", reason: "a newer daemon's cause" };
  assert.deepEqual(cause.encode(cause.decode(newer, "cause")), newer);
  const [, , text] = fixtures().find(([, kind]) => kind === "session")!;
  const known = session.encode(session.decode(JSON.parse(text), "session")) as Record<string, unknown>;
  for (const [field, value] of [["phase", "paused"], ["until", "forever"], ["on_end", "explode"]]) {
    assert.throws(() => session.decode({ ...known, [field]: value }, "session"), `${field}=${value} was read`);
  }
  assert.equal(session.decode({ ...known, reason: "a_newer_reason" }, "session").reason, "a_newer_reason");
});
