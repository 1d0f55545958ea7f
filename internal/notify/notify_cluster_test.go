package notify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/notify"
	"github.com/idem-go/idem/internal/redistest"
)

// On a cluster the Hub keeps one sharded subscriber connection per master.
// When those connections are killed, go-redis re-subscribes each one's
// channels in one SSUBSCRIBE, which a master refuses (CROSSSLOT) when they
// span slots; the Hub subscribes them again one by one, and every watcher
// is signalled by the new confirmation and gets its messages again.
func TestClusterResubscribesAcrossSlots(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	rdb := cl.Client(t)
	ctx := context.Background()
	h := notify.New(rdb)
	defer h.Close()

	const n = 30 // channels over many slots, so every master has several
	ws := make([]*notify.Watcher, n)
	for i := range ws {
		ws[i] = h.Watch(fmt.Sprintf("{k%d}:done", i))
		defer ws[i].Stop()
		signalled(t, ws[i], "a confirmation")
	}
	killed := 0
	for _, srv := range cl.Nodes() {
		killed += srv.KillPubSub(t)
	}
	if killed != 3 {
		t.Fatalf("killed %d pub/sub connections, want one per master (3)", killed)
	}
	for i, w := range ws {
		signalled(t, w, fmt.Sprintf("channel %d's confirmation after the reconnection", i))
	}
	for i, w := range ws {
		ch := fmt.Sprintf("{k%d}:done", i)
		deadline := time.Now().Add(wait)
		for {
			// SPUBLISH returns the receivers on the channel's shard.
			got, err := rdb.SPublish(ctx, ch, "outcome").Result()
			if err != nil {
				t.Fatalf("SPUBLISH %s: %v", ch, err)
			}
			if got == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not subscribed again after the reconnection", ch)
			}
			time.Sleep(10 * time.Millisecond)
		}
		signalled(t, w, ch+"'s message")
		if msg, ok := w.Note(); !ok || msg != "outcome" {
			t.Fatalf("%s: Note() = %q, %v; want %q, true", ch, msg, ok, "outcome")
		}
	}
}
