// The real livenessd and liveness CLI, built by `cargo build -p liveness-daemon -p
// liveness-cli`, for the scenarios of clients/contract/scenarios.md.

import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, closeSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import type { TestContext } from "node:test";

/** The repository, from dist/test/daemon.js. */
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

export function binary(name: string): string {
  const file = path.join(process.env.LIVENESS_BIN_DIR || path.join(REPO, "target/debug"), name);
  if (!existsSync(file)) {
    throw new Error(`${file} is needed: run \`cargo build -p liveness-daemon -p liveness-cli\` (or set LIVENESS_BIN_DIR)`);
  }
  return file;
}

export const requireEbpf = () => process.env.LIVENESS_REQUIRE_EBPF === "1";

/** A temporary directory, removed after the test. */
export function tempDir(t: TestContext): string {
  const dir = mkdtempSync(path.join(tmpdir(), "liveness-ts-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A livenessd on a temporary socket and state directory, killed after the test. */
export class Daemon {
  readonly socket: string;
  readonly state: string;
  private process: ChildProcess | undefined;

  private constructor(
    readonly dir: string,
    private readonly args: string[],
  ) {
    mkdirSync(path.join(dir, "run"));
    this.socket = path.join(dir, "run/liveness.sock");
    this.state = path.join(dir, "state");
  }

  /** A daemon with `args` besides its socket and state directory. */
  static async start(t: TestContext, ...args: string[]): Promise<Daemon> {
    const daemon = new Daemon(tempDir(t), args);
    t.after(() => daemon.process?.kill("SIGKILL"));
    await daemon.start();
    return daemon;
  }

  log(): string {
    return readFileSync(path.join(this.dir, "livenessd.log"), "utf8");
  }

  /** Runs livenessd (again, after stop or kill9) and resolves once it listens. */
  async start(): Promise<void> {
    const log = openSync(path.join(this.dir, "livenessd.log"), "a");
    const daemon = spawn(binary("livenessd"), ["--socket", this.socket, "--state-dir", this.state, ...this.args], {
      stdio: ["ignore", "ignore", log],
      env: { ...process.env, LIVENESS_LOG: "info" },
    });
    closeSync(log);
    this.process = daemon;
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      if (daemon.exitCode !== null || daemon.signalCode !== null) throw new Error(`livenessd exited during start:\n${this.log()}`);
      const listening = await new Promise<boolean>((resolve) => {
        const probe = net.createConnection({ path: this.socket });
        probe.once("connect", () => (probe.destroy(), resolve(true)));
        probe.once("error", () => resolve(false));
      });
      if (listening) return;
      await sleep(20);
    }
    throw new Error(`livenessd did not listen within 20 s:\n${this.log()}`);
  }

  private async signal(signal: NodeJS.Signals): Promise<void> {
    const daemon = this.process!;
    this.process = undefined;
    if (daemon.exitCode !== null || daemon.signalCode !== null) return;
    const exited = new Promise((resolve) => daemon.once("exit", resolve));
    daemon.kill(signal);
    const timeout = sleep(30_000).then(() => {
      throw new Error(`livenessd did not stop within 30 s of ${signal}:\n${this.log()}`);
    });
    await Promise.race([exited, timeout]);
  }

  /** A clean stop: SIGTERM, goodbye to every connection. */
  stop(): Promise<void> {
    return this.signal("SIGTERM");
  }

  kill9(): Promise<void> {
    return this.signal("SIGKILL");
  }

  /** `liveness --socket S --json ARGS...`, its output parsed, whatever its exit code. */
  cli(...args: string[]): any {
    const done = spawnSync(binary("liveness"), ["--socket", this.socket, "--json", ...args], { encoding: "utf8" });
    if (!done.stdout.trim()) throw new Error(`liveness ${args.join(" ")} printed nothing: ${done.stderr}`);
    return JSON.parse(done.stdout);
  }
}

/** A process (sleep 300 by default), killed after the test. */
export function child(t: TestContext, ...argv: string[]): ChildProcess & { pid: number } {
  const [program, ...args] = argv.length > 0 ? argv : ["sleep", "300"];
  const process = spawn(program, args, { stdio: "ignore" });
  t.after(() => process.kill("SIGKILL"));
  return process as ChildProcess & { pid: number };
}

/** SIGKILL, and its reaping (Node reaps its children itself). */
export async function kill(process: ChildProcess): Promise<void> {
  if (process.exitCode !== null || process.signalCode !== null) return;
  const exited = new Promise((resolve) => process.once("exit", resolve));
  process.kill("SIGKILL");
  await exited;
}

// What the absence of a key means, for keys docs/protocol.md lets a writer leave out; null
// is the absence of every optional key.
const DEFAULTS: Record<string, unknown> = {
  comm: "",
  on_end: "leave",
  grace_ms: 10000,
  labels: {},
  pending: false,
  terminate: false,
  wait: false,
  waiters: 0,
  warnings: [],
  wrappers: [],
};

const isDefault = (key: string, value: unknown) =>
  value === null || (key in DEFAULTS && JSON.stringify(DEFAULTS[key]) === JSON.stringify(value));

/** How `again` (decoded and encoded by this client) differs from `written`, or undefined. */
export function differs(written: unknown, again: unknown, at = ""): string | undefined {
  const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
  if (isObject(written) && isObject(again)) {
    for (const key of [...new Set([...Object.keys(written), ...Object.keys(again)])].sort()) {
      if (key in written && key in again) {
        const problem = differs(written[key], again[key], `${at}.${key}`);
        if (problem) return problem;
      } else {
        const value = key in written ? written[key] : again[key];
        if (!isDefault(key, value)) {
          return `${at}.${key} (${JSON.stringify(value)}) is ${key in written ? "lost when read" : "appears when written"}`;
        }
      }
    }
    return undefined;
  }
  if (Array.isArray(written) && Array.isArray(again) && written.length === again.length) {
    for (let i = 0; i < written.length; i++) {
      const problem = differs(written[i], again[i], `${at}[${i}]`);
      if (problem) return problem;
    }
    return undefined;
  }
  return JSON.stringify(written) === JSON.stringify(again)
    ? undefined
    : `${at} is ${JSON.stringify(written)} in the document, ${JSON.stringify(again)} read back`;
}
