package grpcidem_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"google.golang.org/grpc/codes"
)

// A handler whose lease is lost while it runs (the lease ended and another
// instance took the key over and finished it) is not answered OK: its
// outcome was not recorded, and the key's outcome is the other
// instance's. The caller gets Internal, ReasonNotRecorded.
func TestLeaseLostWhileTheHandlerRuns(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		if b.MR == nil {
			t.Skip("needs miniredis's clock: on a real server the owner's renewals keep its lease")
		}
		const lease = 10 * time.Second
		var first, second counter
		h, started, release := blocking(first.debit())
		cc1 := dial(t, serve(t, &bank{debit: h}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithLease(lease), idem.WithStoreTimeout(300*time.Millisecond)))))
		cc2 := dial(t, serve(t, &bank{debit: second.debit()}, grpcidem.UnaryServerInterceptor(newIdem(t, b, idem.WithLease(lease)))))
		got := make(chan answer, 1)
		go func() { got <- invoke(cc1, methodDebit, "ll", 1) }()
		<-started
		b.Advance(t, lease+time.Second) // the first instance's lease ends unrenewed
		if a := invoke(cc2, methodDebit, "ll", 1); a.err != nil {
			t.Fatalf("the takeover: %v", a.err)
		}
		close(release)
		wantStatus(t, <-got, codes.Internal, grpcidem.ReasonNotRecorded)
		if first.runs() != 1 || second.runs() != 1 {
			t.Fatalf("runs %d and %d; want 1 and 1", first.runs(), second.runs())
		}
	})
}
