package prefix

import (
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
