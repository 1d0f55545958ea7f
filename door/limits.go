package door

import (
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// The defaults that FitKeyLen and FitResponse start from.
const (
	// DefaultMaxKeyLen is the longest key a door accepts by default
	// (255 bytes), unless the Client's limit leaves less room.
	DefaultMaxKeyLen = 255
	// DefaultMaxResponse is the largest response a door stores by default
	// (1 MiB), unless the Client's WithMaxResultSize is smaller.
	DefaultMaxResponse = 1 << 20
)

// FitKeyLen returns the longest key a door accepts, fitted to c's
// idem.WithMaxKeyLen: want is the door's own option (0 when not given)
// and scope its longest fixed scope ("" when the scope varies, per
// principal: a longer scope then leaves less room, which Do's
// idem.ErrInvalidKey reports). Without want it is DefaultMaxKeyLen or
// what the Client leaves after Key's prefix and scope, whichever is
// smaller. A want the Client cannot hold is an error, not a limit
// lowered in silence: keys near it would be accepted by the door and
// refused by the Client.
func FitKeyLen(c *idem.Client, want int, scope string) (int, error) {
	room := c.MaxKeyLen() - KeyOverhead(scope) - len(scope)
	switch {
	case room < 1:
		return 0, fmt.Errorf("the Client's WithMaxKeyLen(%d) leaves no room for a key after the scope %q and its length prefix", c.MaxKeyLen(), scope)
	case want == 0:
		return min(DefaultMaxKeyLen, room), nil
	case want > room:
		return 0, fmt.Errorf("WithMaxKeyLen(%d) does not fit the Client's WithMaxKeyLen(%d) with the scope's length prefix (%q and longer): "+
			"keys near the limit would be refused; use at most %d, less the longest scope, or raise the Client's", want, c.MaxKeyLen(), Key(scope, ""), room)
	}
	return want, nil
}

// FitResponse returns the largest response a door stores, fitted to c's
// idem.WithMaxResultSize: want is the door's own option (0 when not
// given). Without it, it is DefaultMaxResponse or the Client's limit,
// whichever is smaller; a want above the Client's is an error: a response
// between the two would be sent, then refused by the Client, and its
// retries would find no response to replay.
func FitResponse(c *idem.Client, want int) (int, error) {
	results := c.MaxResultSize()
	switch {
	case want == 0:
		return min(DefaultMaxResponse, results), nil
	case want > results:
		return 0, fmt.Errorf("WithMaxResponse(%d) is larger than the Client's WithMaxResultSize(%d): a response between the two would be sent, "+
			"then refused by the Client, and its retries would find none; lower it, or raise the Client's", want, results)
	}
	return want, nil
}

// CheckRetryAfter checks the delay a door tells a caller to wait before a
// retry (WithRetryAfter in each door): a positive whole number of
// seconds, the unit HTTP's Retry-After has, so that one value means the
// same in every door.
func CheckRetryAfter(d time.Duration) error {
	if d <= 0 || d%time.Second != 0 {
		return fmt.Errorf("WithRetryAfter(%v): must be a positive whole number of seconds", d)
	}
	return nil
}
