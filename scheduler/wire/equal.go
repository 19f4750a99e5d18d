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
	for ; i+8 <= n; i += 8 {
		if *(*uint64)(unsafe.Add(pa, i)) != *(*uint64)(unsafe.Add(pb, i)) {
			return false
		}
	}
	for ; i < n; i++ {
		if *(*byte)(unsafe.Add(pa, i)) != *(*byte)(unsafe.Add(pb, i)) {
			return false
		}
	}
	return true
}
