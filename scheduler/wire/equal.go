package wire

import "unsafe"

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
