// Prints every session that ends, resuming after the last one it printed across daemon
// restarts and its own. Usage: node dist/examples/consumer.js CURSOR_FILE
import { SESSION_ENDED, loadCursor, saveCursor, subscribe } from "../src/index.js";

const file = process.argv[2];
const events = await subscribe({ cursor: loadCursor(file) });
for await (const event of events.events()) {
  if (event.kind === SESSION_ENDED) {
    console.log(event.session, event.reason);
    saveCursor(file, events.cursor!);
  }
}
