package wire

import (
	"bytes"
	"testing"
)

// TestEqualBytesIsBytesEqual: every length up to a few turns of four
// words, a difference at every position, and lengths that differ.
func TestEqualBytesIsBytesEqual(t *testing.T) {
	for n := 0; n <= 80; n++ {
		a := make([]byte, n)
		for i := range a {
			a[i] = byte(i*7 + 1)
		}
		b := bytes.Clone(a)
		if !equalBytes(a, b) {
			t.Fatalf("length %d: equal slices reported different", n)
		}
		for i := range n {
			b[i] ^= 0x40
			if equalBytes(a, b) {
				t.Fatalf("length %d: a difference at %d not seen", n, i)
			}
			b[i] ^= 0x40
		}
		if n > 0 && equalBytes(a, b[:n-1]) {
			t.Fatalf("length %d: a shorter slice reported equal", n)
		}
	}
}
