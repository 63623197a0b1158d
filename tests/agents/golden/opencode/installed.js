// Written by liveness (`liveness hooks install opencode`); `liveness hooks uninstall opencode`
// removes it.
// It registers each opencode session with livenessd, owned by this opencode process, and
// ends it when the session is deleted. It never fails opencode: errors go to stderr.
import { spawn } from "node:child_process";

const LIVENESS = ["@LIVENESS@","hooks","opencode"];
// What the session-start hook registers with besides (a cgroup and its limits).
const START = [];

function hook(name, input) {
  return new Promise((resolve) => {
    try {
      const options = name === "session-start" ? START : [];
      const child = spawn(LIVENESS[0], [...LIVENESS.slice(1), name, ...options], {
        stdio: ["pipe", "ignore", "inherit"],
      });
      child.on("error", () => resolve());
      child.on("close", () => resolve());
      child.stdin.on("error", () => {});
      child.stdin.end(JSON.stringify(input));
    } catch {
      resolve();
    }
  });
}

export const LivenessPlugin = async () => ({
  event: async ({ event }) => {
    const info = event?.properties?.info;
    if (!info?.id) return;
    if (event.type === "session.created") await hook("session-start", { sessionID: info.id, info });
    if (event.type === "session.deleted") await hook("session-end", { sessionID: info.id, info });
  },
});
