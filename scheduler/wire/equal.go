package wire

import (
	"math/bits"
	"unsafe"
)

// equalBytes is bytes.Equal eight bytes at a time. Inside the Wasm guest,
// Go's memequal compares one byte per loop turn (internal/bytealg's wasm
// version), about 1.7 ns a byte under wazero; words are about 0.5 ns a
// byte (BENCHMARKS.md, "Inside the guest"). Natively it is slower than
// bytes.Equal, but the receiver and routers compare string tables only
// in the Wasm guest's hot path. Unaligned 8-byte loads are fine on every
// platform the plugin targets (Wasm) and the tests run on (amd64, arm64).
func equalBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	n := len(a)
	if n == 0 {
		return true
	}
	pa, pb := unsafe.Pointer(unsafe.SliceData(a)), unsafe.Pointer(unsafe.SliceData(b))
	i := 0
	for ; i+32 <= n; i += 32 { // four words a turn: fewer branches in the guest
		if *(*uint64)(unsafe.Add(pa, i)) != *(*uint64)(unsafe.Add(pb, i)) ||
			*(*uint64)(unsafe.Add(pa, i+8)) != *(*uint64)(unsafe.Add(pb, i+8)) ||
			*(*uint64)(unsafe.Add(pa, i+16)) != *(*uint64)(unsafe.Add(pb, i+16)) ||
			*(*uint64)(unsafe.Add(pa, i+24)) != *(*uint64)(unsafe.Add(pb, i+24)) {
			return false
		}
	}
	for ; i+8 <= n; i += 8 {
		if *(*uint64)(unsafe.Add(pa, i)) != *(*uint64)(unsafe.Add(pb, i)) {
			return false
		}
	}
	if i < n { // the last 1..7 bytes: one word ending at n (n >= 8), or bytes
		if n >= 8 {
			return *(*uint64)(unsafe.Add(pa, n-8)) == *(*uint64)(unsafe.Add(pb, n-8))
		}
		for ; i < n; i++ {
			if *(*byte)(unsafe.Add(pa, i)) != *(*byte)(unsafe.Add(pb, i)) {
				return false
			}
		}
	}
	return true
}

// compareIDs is bytes.Compare eight bytes at a time, for agent ids (short
// strings that share long prefixes, like "node-00042"). Inside the Wasm
// guest, Go's cmpstring compares one byte per loop turn; the receiver
// compares ids twice or three times per block it takes.
func compareIDs(a, b []byte) int {
	n := min(len(a), len(b))
	pa, pb := unsafe.Pointer(unsafe.SliceData(a)), unsafe.Pointer(unsafe.SliceData(b))
	i := 0
	for ; i+8 <= n; i += 8 {
		if x := ld64(pa, i) ^ ld64(pb, i); x != 0 {
			k := i + bits.TrailingZeros64(x)>>3 // the first byte that differs (ld64 is little-endian)
			return cmpByte(*(*byte)(unsafe.Add(pa, k)), *(*byte)(unsafe.Add(pb, k)))
		}
	}
	for ; i < n; i++ {
		if ca, cb := *(*byte)(unsafe.Add(pa, i)), *(*byte)(unsafe.Add(pb, i)); ca != cb {
			return cmpByte(ca, cb)
		}
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

func cmpByte(a, b byte) int {
	if a < b {
		return -1
	}
	return 1
}

// sumBytes adds up b's bytes (string lengths) eight at a time.
func sumBytes(b []byte) int {
	p := unsafe.Pointer(unsafe.SliceData(b))
	n, i := len(b), 0
	var acc uint64 // four 16-bit lanes: 255 * 2 * 64 turns fit
	total := 0
	for ; i+8 <= n; i += 8 {
		x := ld64(p, i)
		acc += x&0x00ff00ff00ff00ff + x>>8&0x00ff00ff00ff00ff
		if i&(63*8) == 63*8 {
			total += lanes(acc)
			acc = 0
		}
	}
	total += lanes(acc)
	for ; i < n; i++ {
		total += int(*(*byte)(unsafe.Add(p, i)))
	}
	return total
}

// lanes adds the four 16-bit lanes of x.
func lanes(x uint64) int {
	return int(x&0xffff + x>>16&0xffff + x>>32&0xffff + x>>48)
}
