//go:build wasip1

package proxywasm

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

// Callbacks the host calls, ABI 0.2.1. Names and signatures are those
// proxy-wasm-cpp-host looks up (N i32 parameters, no result or one i32
// result; e2e/envoyhost checks a module against the same table).
// Booleans (end_of_stream, results of on_vm_start/on_configure/on_done) are i32.

// vm is the dispatcher of this VM; buffers pins host-allocated memory;
// turns gives the Go scheduler its turns. Creating them at package init
// makes no host call.
var (
	vm      = newDispatcher()
	buffers = newHostBuffers()
	turns   schedTurns
)

// enter and exit bracket every callback; when the outermost one returns no
// host call is in flight, so unclaimed host buffers can be dropped and the
// scheduler can have a turn (schedturns_wasip1.go).
func enter() { vm.depth++ }

func exit() {
	vm.depth--
	if vm.depth == 0 {
		buffers.releaseAll()
		turns.afterCallback()
	}
}

func boolToU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// proxy_abi_version_0_2_1 marks the ABI the module speaks; the host picks the
// first such export, as proxy-wasm-cpp-host does.
//
//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion021() {}

// proxy_on_memory_allocate is the allocator the host uses to return data
// (cpp-host looks for malloc first, then this name). The buffer stays pinned
// until the binding takes it.
//
//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) uint32 {
	return uint32(buffers.alloc(size))
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentContextID uint32) {
	enter()
	vm.contextCreate(contextID, parentContextID)
	exit()
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootContextID, vmConfigurationSize uint32) uint32 {
	enter()
	ok := vm.vmStart(rootContextID, int(vmConfigurationSize))
	exit()
	return boolToU32(ok)
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootContextID, pluginConfigurationSize uint32) uint32 {
	enter()
	ok := vm.configure(rootContextID, int(pluginConfigurationSize))
	exit()
	return boolToU32(ok)
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootContextID uint32) {
	enter()
	vm.tick(rootContextID)
	exit()
}

//go:wasmexport proxy_on_queue_ready
func proxyOnQueueReady(rootContextID, queueID uint32) {
	enter()
	vm.queueReady(rootContextID, queueID)
	exit()
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	enter()
	a := vm.httpStream(contextID).OnHttpRequestHeaders(int(numHeaders), endOfStream != 0)
	exit()
	return uint32(a)
}

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	enter()
	a := vm.httpStream(contextID).OnHttpRequestBody(int(bodySize), endOfStream != 0)
	exit()
	return uint32(a)
}

//go:wasmexport proxy_on_request_trailers
func proxyOnRequestTrailers(contextID, numTrailers uint32) uint32 {
	enter()
	a := vm.httpStream(contextID).OnHttpRequestTrailers(int(numTrailers))
	exit()
	return uint32(a)
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	enter()
	a := vm.httpStream(contextID).OnHttpResponseHeaders(int(numHeaders), endOfStream != 0)
	exit()
	return uint32(a)
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	enter()
	a := vm.httpStream(contextID).OnHttpResponseBody(int(bodySize), endOfStream != 0)
	exit()
	return uint32(a)
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(contextID, numTrailers uint32) uint32 {
	enter()
	a := vm.httpStream(contextID).OnHttpResponseTrailers(int(numTrailers))
	exit()
	return uint32(a)
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHttpCallResponse(rootContextID, token, numHeaders, bodySize, numTrailers uint32) {
	enter()
	vm.httpCallResponse(rootContextID, token, int(numHeaders), int(bodySize), int(numTrailers), SetEffectiveContext)
	exit()
}

//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) {
	enter()
	vm.log(contextID)
	exit()
}

//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) uint32 {
	enter()
	done := vm.done(contextID)
	exit()
	return boolToU32(done)
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) {
	enter()
	vm.delete(contextID)
	exit()
}

// Compile-time check that the SDK's Action values are what the ABI returns
// (0 Continue, 1 Pause).
var _ = [1]struct{}{}[types.ActionContinue]
var _ = [1]struct{}{}[types.ActionPause-1]
