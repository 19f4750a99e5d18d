// Package proxywasm is a thin Proxy-Wasm ABI 0.2.1 binding for plugins built
// with the standard Go toolchain for wasip1 (GOOS=wasip1 GOARCH=wasm
// go build -buildmode=c-shared). Its API mirrors the names and signatures of
// github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm, and plugins implement that
// SDK's types (types.VMContext, types.PluginContext, types.HttpContext), so
// filter code reads like any proxy-wasm Go plugin. The SDK itself only targets
// TinyGo.
//
// Two builds:
//   - wasip1: //go:wasmexport callbacks and //go:wasmimport env proxy_* host
//     calls (files *_wasip1.go). Only the host calls a plugin uses end up as
//     imports of the module.
//   - everything else: every function forwards to the SDK's proxywasm package
//     (forward.go), so the SDK's proxytest emulator drives the same plugin code
//     in native `go test`.
//
// # Registering a plugin
//
// In c-shared (reactor) mode the host calls _initialize, which runs the Go
// runtime and package init functions; main.main is never run. A plugin
// therefore registers from init:
//
//	func init() { proxywasm.SetVMContext(&vmContext{}) }
//	func main() {}
//
// SetVMContext only stores a Go value. No other function of this package may
// be called from init: Envoy allows only logging and some WASI calls during
// _initialize (other proxy_* calls fail as "restricted_callback").
//
// # Rules this binding keeps (Envoy's and proxy-wasm-cpp-host's behaviour,
// emulated with sources in e2e/envoyhost)
//   - Buffers the host allocates through proxy_on_memory_allocate stay
//     referenced from a table until the host call that asked for them returns
//     and the binding has taken them; leftovers are dropped when the outermost
//     callback returns. Returned byte slices and strings alias those buffers
//     without copying; they belong to the caller.
//   - Additions to the SDK's API for data read on every request:
//     GetHttpRequestBodyInto, GetHttpResponseBodyInto, GetSharedDataInto and
//     GetHttpRequestHeaderInto read into storage the caller lends (when it
//     fits), so a request allocates nothing for them and touches memory that
//     is already warm. In a Wasm guest the allocator, the garbage collector
//     and fresh memory are a large share of a small request's cost.
//   - Pointer 0 / size 0 from the host means empty, with no error: an empty
//     body, header value, header map or property reads as nil/"" and nil error.
//   - Host status codes map to the SDK's error values (types.ErrorStatusNotFound,
//     ...); codes the SDK has no value for become a StatusError.
//   - Header pairs sent to the host are checked against the host's limits
//     (1024 pairs, 1 MiB), which it would otherwise silently turn into an empty map.
//   - The binding starts no goroutine; plugin code must not leave one running
//     after a callback returns (it would only run during a later callback).
//   - A panic is not recovered: it traps, and the host marks the VM failed.
//
// Differences of the native (SDK/proxytest) build: the SDK reports an empty
// body, configuration or header map as ErrorStatusNotFound; the forwarding turns
// that into empty/nil error as Envoy does. GetLogLevel reports LogLevelTrace
// (the emulator keeps every level). Host statuses without an SDK error value
// come back as the SDK's "unknown status code" errors.
package proxywasm
