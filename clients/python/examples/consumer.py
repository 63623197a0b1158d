"""Prints every session that ends, resuming after the last one it printed across daemon
restarts and its own. Usage: consumer.py CURSOR_FILE"""

import sys

import liveness

path = sys.argv[1]
cursor = liveness.load_cursor(path)
with liveness.subscribe(cursor) as events:
    if cursor is None:
        # A first run saves where it started: stopped before its first end, the next run
        # would otherwise follow from its own start and miss the ends in between.
        liveness.save_cursor(path, events.cursor)
    for event in events.events():
        if event.kind == liveness.SESSION_ENDED:
            print(event.session, event.reason, flush=True)
            liveness.save_cursor(path, events.cursor)
