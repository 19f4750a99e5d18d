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

func TestCompareIDsIsBytesCompare(t *testing.T) {
	ids := []string{"", "a", "b", "ab", "node-0000", "node-00001", "node-00002", "node-00010", "node-00001x", "node-0000\xff", "node-00001-long-suffix-a", "node-00001-long-suffix-b", "\x00", "\x00\x00"}
	for _, a := range ids {
		for _, b := range ids {
			if got, want := compareIDs([]byte(a), []byte(b)), bytes.Compare([]byte(a), []byte(b)); got != want {
				t.Errorf("compareIDs(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}

func TestSumBytesAddsEveryByte(t *testing.T) {
	for n := 0; n <= 1100; n += 1 + n/8 {
		b := make([]byte, n)
		want := 0
		for i := range b {
			b[i] = byte(255 - i%7)
			want += int(b[i])
		}
		if got := sumBytes(b); got != want {
			t.Errorf("sumBytes of %d bytes = %d, want %d", n, got, want)
		}
	}
}
