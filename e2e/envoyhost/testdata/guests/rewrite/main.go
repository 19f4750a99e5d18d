//go:build wasip1

// Command rewrite is a raw Proxy-Wasm filter that buffers the request body
// and appends "-more" to it at end of stream without touching
// Content-Length: what happens next shows that the host, like Envoy, does
// not fix the header.
package main

import "unsafe"

//go:wasmimport env proxy_set_buffer_bytes
func proxySetBufferBytes(bufType, start, length uint32, data unsafe.Pointer, size uint32) uint32

var allocations [][]byte

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	b := make([]byte, size)
	allocations = append(allocations, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 { return 0 }

var suffix = []byte("-more")

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	if eos == 0 {
		return 1 // StopIterationAndBuffer
	}
	// start at the end appends (envoy Buffer::copyFrom).
	proxySetBufferBytes(0, size, 0, unsafe.Pointer(&suffix[0]), uint32(len(suffix)))
	return 0
}

func main() {}
