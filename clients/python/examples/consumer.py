"""Prints every session that ends, resuming after the last one it printed across daemon
restarts and its own. Usage: consumer.py CURSOR_FILE"""

import sys

import liveness

path = sys.argv[1]
with liveness.subscribe(liveness.load_cursor(path)) as events:
    for event in events.events():
        if event.kind == liveness.SESSION_ENDED:
            print(event.session, event.reason, flush=True)
            liveness.save_cursor(path, events.cursor)
