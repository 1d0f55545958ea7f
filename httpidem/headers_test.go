package httpidem_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem/httpidem"
)

// Without WithScope a key is global: its replay goes to anyone who sends
// the key and the request. The headers that belong to the first request's
// user (Set-Cookie, Authentication-Info) reach that user, but are not
// stored and replayed, unless WithKeepHeaders names them; with WithScope
// they are stored (only that principal gets the replay). New without
// WithScope logs once that keys are global.
func TestPerUserHeadersWithoutScope(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b *backend) {
		keys := b.Idem(t)
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Set-Cookie", "session=alice; Path=/")
			w.Header().Add("Set-Cookie", "theme=dark")
			w.Header().Set("Authentication-Info", `nextnonce="abc"`)
			w.Header().Set("Location", "/debits/1")
			w.WriteHeader(http.StatusCreated)
		})
		alice := func(*http.Request) (string, error) { return "alice", nil }
		var logs syncBuffer
		for _, tc := range []struct {
			name     string
			opts     []httpidem.Option
			replayed []string // of Set-Cookie, Authentication-Info
		}{
			{"global", []httpidem.Option{httpidem.WithLogger(slogTo(&logs))}, nil},
			{"kept", []httpidem.Option{httpidem.WithKeepHeaders("set-cookie"), httpidem.WithLogger(slogTo(&logs))}, []string{"Set-Cookie"}},
			{"scoped", []httpidem.Option{httpidem.WithScope(alice), httpidem.WithLogger(slogTo(&logs))}, []string{"Set-Cookie", "Authentication-Info"}},
		} {
			srv := serve(t, httpidem.New(keys, tc.opts...)(handler))
			hc := httpClient(t)
			q := req{key: "cookie-" + tc.name, body: `{}`}
			first, retry := send(t, hc, srv.URL, q), send(t, hc, srv.URL, q)
			if !retry.replayed() || retry.header.Get("Location") != "/debits/1" {
				t.Fatalf("%s: retry %d, replayed %v, headers %v", tc.name, retry.status, retry.replayed(), retry.header)
			}
			if got := first.header.Values("Set-Cookie"); len(got) != 2 || first.header.Get("Authentication-Info") == "" {
				t.Errorf("%s: the first response lacks the handler's per-user headers: %v", tc.name, first.header)
			}
			for _, h := range []string{"Set-Cookie", "Authentication-Info"} {
				want := 0
				if strings.Contains(strings.Join(tc.replayed, ","), h) {
					want = len(first.header.Values(h))
				}
				if got := len(retry.header.Values(h)); got != want {
					t.Errorf("%s: the replay has %d %s headers, want %d", tc.name, got, h, want)
				}
			}
		}
		if n := strings.Count(logs.String(), "keys are global"); n != 2 {
			t.Errorf("%d notices that keys are global, want one per New without WithScope (2):\n%s", n, logs.String())
		}
	})
}
