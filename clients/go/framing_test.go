package liveness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"testing"
)

// A line cut short by the end of its connection is a lost connection, not a line: the
// daemon cuts one short when it gives up on a subscriber that stopped reading in its
// middle, and the subscription resumes after the last whole event. A stand-in daemon on a
// socket sends exactly those bytes.
func TestALineCutShortResumesTheSubscription(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "sock")
	listener, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	event := func(seq int) string {
		return fmt.Sprintf(`{"event":{"seq":%d,"kind":"session.ended","at_ms":0,"session":"s",`+
			`"owner":{"pid":1,"start_ticks":1,"boot_id":"b","host":"h","comm":"c"},"creator_uid":0}}`, seq)
	}
	asked := make(chan *uint64, 2)
	go func() {
		for _, sent := range []string{event(1) + "\n" + `{"event":{"seq":2,`, event(2) + "\n"} {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(conn).ReadBytes('\n')
			var subscribe struct{ Since *uint64 }
			_ = json.Unmarshal(line, &subscribe)
			asked <- subscribe.Since
			ack := `{"ok":true,"subscribed":{"since":0,"head":0,"store_id":"st"}}`
			fmt.Fprintf(conn, "%s\n%s", ack, sent)
			conn.Close()
		}
	}()
	ctx := context.Background()
	sub, err := Subscribe(ctx, socket, nil, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var got []uint64
	for len(got) < 2 {
		e, err := sub.NextEvent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Seq)
	}
	if got[0] != 1 || got[1] != 2 {
		t.Fatalf("each event once, the line cut short dropped: got %v", got)
	}
	if first, second := <-asked, <-asked; first != nil || second == nil || *second != 1 {
		t.Fatalf("resumed after the last whole event: asked since %v then %v", first, second)
	}
}
