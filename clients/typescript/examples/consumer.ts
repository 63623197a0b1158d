// Prints every session that ends, resuming after the last one it printed across daemon
// restarts and its own. Usage: node dist/examples/consumer.js CURSOR_FILE
import { SESSION_ENDED, loadCursor, saveCursor, subscribe } from "../src/index.js";

const file = process.argv[2];
const saved = loadCursor(file);
const events = await subscribe({ cursor: saved });
// A first run saves where it started: stopped before its first end, the next run would
// otherwise follow from its own start and miss the ends in between.
if (!saved) saveCursor(file, events.cursor!);
for await (const event of events.events()) {
  if (event.kind === SESSION_ENDED) {
    console.log(event.session, event.reason);
    saveCursor(file, events.cursor!);
  }
}
