//go:build wasip1

// Command missingimport is a Proxy-Wasm module that imports a WASI function
// proxy-wasm-cpp-host does not offer (wasi_snapshot_preview1.proc_raise):
// Envoy refuses to load it, naming the import.
package main

import "unsafe"

//go:wasmimport wasi_snapshot_preview1 proc_raise
func procRaise(sig uint32) uint32

var keep = map[uintptr][]byte{}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	b := make([]byte, size)
	p := uintptr(unsafe.Pointer(&b[0]))
	keep[p] = b
	return uint32(p)
}

//go:wasmexport proxy_on_vm_start
func onVMStart(rootID, size uint32) uint32 {
	return procRaise(6) // never reached: the module does not load
}

func main() {}
