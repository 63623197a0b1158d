// Prints every session that ends, resuming after the last one it printed across daemon
// restarts and its own. Usage: consumer CURSOR_FILE
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	liveness "example.invalid/liveness/clients/go"
)

func main() {
	ctx, path := context.Background(), os.Args[1]
	cursor, err := liveness.LoadCursor(path)
	if err != nil {
		log.Fatal(err)
	}
	events, err := liveness.Subscribe(ctx, "", cursor, liveness.Filter{})
	if err == nil && cursor == nil {
		// A first run saves where it started: stopped before its first end, the next run
		// would otherwise follow from its own start and miss the ends in between.
		err = liveness.SaveCursor(path, *events.Cursor())
	}
	for err == nil {
		var event *liveness.Event
		if event, err = events.NextEvent(ctx); err == nil && event.Kind == liveness.KindEnded {
			fmt.Println(event.Session, event.Reason)
			err = liveness.SaveCursor(path, *events.Cursor())
		}
	}
	log.Fatal(err)
}
