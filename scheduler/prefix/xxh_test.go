package prefix

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The XXH64 written here agrees with an independent implementation.
func TestHashBytesIsXXH64(t *testing.T) {
	buf := make([]byte, 200)
	for i := range buf {
		buf[i] = byte(i*7 + 3)
	}
	for n := 0; n <= len(buf); n++ {
		if got, want := hashBytes(0, buf[:n]), xxhash.Sum64(buf[:n]); got != want {
			t.Fatalf("length %d: %x, want %x", n, got, want)
		}
	}
	d := xxhash.NewWithSeed(12345)
	_, _ = d.Write(buf[:77])
	if got := hashBytes(12345, buf[:77]); got != d.Sum64() {
		t.Fatalf("seeded: %x, want %x", got, d.Sum64())
	}
}

// Block hashes spread evenly over index buckets (their low bits), even for
// blocks that differ in one byte, and never collide in a large sample.
func TestBlockHashSpread(t *testing.T) {
	var blk [64]byte
	counts := make([]int, 256)
	seen := make(map[uint64]bool, 200000)
	for i := range 200000 {
		// Distinct blocks that differ in a few bits of one word.
		binary.LittleEndian.PutUint64(blk[8*(i%8):], uint64(i))
		h := mixBlock64(uint64(i%3), &blk)
		if seen[h] {
			t.Fatalf("collision after %d blocks", i)
		}
		seen[h] = true
		counts[h&255]++
	}
	for b, c := range counts {
		if c < 600 || c > 960 { // mean 781
			t.Fatalf("bucket %d got %d of 200000", b, c)
		}
	}
}
