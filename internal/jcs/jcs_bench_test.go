package jcs_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/jcs"
)

// hostileJSON returns the bodies of FAULTS.md row 41: an object with n
// members, and objects nested depth deep with about 100 bytes at each
// level (1 MB at 10,000 levels).
func hostileJSON(members, depth int) (wide, deep []byte) {
	var w strings.Builder
	w.WriteByte('{')
	for i := range members {
		if i > 0 {
			w.WriteByte(',')
		}
		w.WriteString(`"m` + strconv.Itoa(1000000 + i)[1:] + `":1`)
	}
	w.WriteByte('}')
	pad := strings.Repeat("x", 80)
	var d strings.Builder
	for range depth {
		d.WriteString(`{"pad":"` + pad + `","a":`)
	}
	d.WriteString("0")
	d.WriteString(strings.Repeat("}", depth))
	return []byte(w.String()), []byte(d.String())
}

// BenchmarkCanonicalHostile measures the canonical form of the bodies
// of FAULTS.md row 41 (80,000 members; 10,000 levels). Run with
// -benchtime=1x -benchmem: one op is one body.
func BenchmarkCanonicalHostile(b *testing.B) {
	wide, deep := hostileJSON(80000, 10000)
	for name, body := range map[string][]byte{"members=80000": wide, "depth=10000": deep} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := jcs.Canonical(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
