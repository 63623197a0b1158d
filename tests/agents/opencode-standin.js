#!/usr/bin/node
// A stand-in for opencode, run under the name `opencode`, for the adapter's tests: it loads
// every plugin in $XDG_CONFIG_HOME/opencode/plugin/ (~/.config/opencode/plugin/) as
// opencode 1.18 does (each exported function called, its `event` handler kept), sends
// `session.created` for SESSION_ID, prints "ready", then reads lines on stdin: "delete"
// sends `session.deleted` and exits 0. Killed, it sends nothing.
//
// Usage: opencode SESSION_ID CWD
const fs = require("node:fs");
const path = require("node:path");
const readline = require("node:readline");
const { pathToFileURL } = require("node:url");

async function main() {
  const [session, cwd] = process.argv.slice(2);
  const config = process.env.XDG_CONFIG_HOME || path.join(process.env.HOME, ".config");
  const dir = path.join(config, "opencode", "plugin");
  const handlers = [];
  for (const name of fs.existsSync(dir) ? fs.readdirSync(dir).sort() : []) {
    // A copy with the extension of an ES module, as Bun reads any plugin as one.
    const copy = path.join(fs.mkdtempSync(path.join(require("node:os").tmpdir(), "oc-")), name.replace(/\.js$/, ".mjs"));
    fs.copyFileSync(path.join(dir, name), copy);
    const module = await import(pathToFileURL(copy));
    for (const make of Object.values(module)) handlers.push(await make({ directory: cwd }));
  }
  const emit = async (type) => {
    const event = { type, properties: { info: { id: session, directory: cwd } } };
    for (const h of handlers) if (h.event) await h.event({ event });
  };
  await emit("session.created");
  console.log("ready");
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (line.trim() === "delete") await emit("session.deleted");
    break;
  }
  process.exit(0);
}

main();
