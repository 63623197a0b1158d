// What a tool such as `agentctl` needs from liveness: it launches a coding agent through a
// wrapper, knows the session's real id only later, and serializes agents per repository
// with a lock. The session is registered under a pending id owned by the agent itself (not
// its wrapper), renamed once the agent reports its id, and holds the repository's lock: the
// lock is released when the agent dies, however it dies, and not when the wrapper does, so
// no `pending-<pid>` placeholder or stuck lock outlives its process.
//
//   node dist/examples/agentctl.js start REPO -- WRAPPER...   prints "PENDING_ID TOKEN"
//   node dist/examples/agentctl.js name PENDING_ID REAL_ID
//
// WRAPPER starts the agent and prints its pid on its first line (for example
// `sh -c 'agent & echo $!; wait'`). The lock belongs to the session, not to this process:
// `start` may exit while the agent works on.

import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

import { Client, type Lock, type Session } from "../src/index.js";

/** An agent launched, its session registered and its repository's lock held. */
export interface Launched {
  wrapper: ChildProcess;
  agentPid: number;
  session: Session;
  lock: Lock;
}

/** The lock that serializes agents working in one repository. */
export const repositoryLock = (repo: string) => `repo:${repo}`;

/** Runs the wrapper, reads its agent's pid, registers a pending session owned by the
 * agent, and waits in line for the repository's lock. */
export async function launch(client: Client, repo: string, wrapper: string[]): Promise<Launched> {
  const child = spawn(wrapper[0], wrapper.slice(1), { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout! });
  const [first] = await Promise.race([
    new Promise<string[]>((resolve) => lines.once("line", (line) => resolve([line]))),
    new Promise<never>((_, reject) => child.once("exit", () => reject(new Error("the wrapper exited without an agent pid")))),
  ]);
  lines.close();
  const agentPid = Number(first);
  const { session } = await client.register({
    pending: true,
    owner: { pid: agentPid },
    labels: { tool: "agentctl", repo },
  });
  const lock = await client.acquireLock(repositoryLock(repo), session.id, { wait: true });
  return { wrapper: child, agentPid, session, lock };
}

/** The agent reported its real session id. */
export function name(client: Client, pendingId: string, realId: string): Promise<Session> {
  return client.rename(pendingId, realId);
}

async function main(args: string[]): Promise<void> {
  const client = await Client.connect();
  try {
    if (args[0] === "start" && args[2] === "--") {
      const launched = await launch(client, args[1], args.slice(3));
      launched.wrapper.unref();
      console.log(launched.session.id, launched.lock.token);
    } else if (args[0] === "name" && args.length === 3) {
      console.log((await name(client, args[1], args[2])).id);
    } else {
      throw new Error("usage: agentctl start REPO -- WRAPPER... | agentctl name PENDING_ID REAL_ID");
    }
  } finally {
    client.close();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(`agentctl: ${e.message}`);
    process.exit(1);
  });
}
