//go:build wasip1

// Command trivial is the smallest useful Proxy-Wasm HTTP filter, written
// against the raw ABI: it reads the request headers and the body once and
// lets everything continue. The host benchmark uses it to measure the
// host's own cost per request.
package main

import "unsafe"

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mapType uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bufType, start, size uint32, retData, retSize *uint32) uint32

// The allocator is a bump pointer over a static arena, reset for each
// request, so the guest's garbage collector stays out of the measurement.
var (
	arena    [256 << 10]byte
	used     int
	overflow [][]byte // allocations that did not fit, kept until the reset
)

var retData, retSize uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	n := (int(size) + 7) &^ 7
	if used+n > len(arena) {
		b := make([]byte, size)
		overflow = append(overflow, b)
		return uint32(uintptr(unsafe.Pointer(&b[0])))
	}
	p := uint32(uintptr(unsafe.Pointer(&arena[used])))
	used += n
	return p
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_vm_start
func onVMStart(rootID, size uint32) uint32 { return 1 }

//go:wasmexport proxy_on_configure
func onConfigure(rootID, size uint32) uint32 { return 1 }

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	used, overflow = 0, nil
	proxyGetHeaderMapPairs(0, &retData, &retSize)
	return 0
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	if eos == 0 {
		return 1 // buffer until the end
	}
	proxyGetBufferBytes(0, 0, size, &retData, &retSize)
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

func main() {}
