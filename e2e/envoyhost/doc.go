// Package envoyhost is an Envoy-faithful Proxy-Wasm host built on wazero.
//
// It runs a real .wasm plugin the way Envoy (with proxy-wasm-cpp-host and
// the V8 runtime) does, so tests of the plugin test the binary users
// deploy. Each emulated behaviour names the upstream source it follows;
// the repositories are proxy-wasm/proxy-wasm-cpp-host ("cpp-host") and
// envoyproxy/envoy ("envoy").
//
// What it covers:
//   - loading: ABI version export, the exact cpp-host import set (imports.go;
//     anything else fails with "Failed to load Wasm module due to a missing
//     import: <module>.<name>"), the WASI functions with cpp-host's return
//     values (two generations: WASICurrent and WASILegacy), restricted
//     callbacks during _initialize and inside the allocator;
//   - linear memory reserved up front and grown in place, as V8 does
//     (memory.go), instead of wazero's reallocate-and-copy;
//   - VM lifecycle: base VM, canary (its on_vm_start/on_configure answer
//     accepts or rejects the configuration), then one VM for the main thread
//     and one per worker; plugins whose vm key matches share those VMs, each
//     with its own root context; shared data per vm_id with one CAS counter;
//     tick timers per root context; proxy_done at shutdown;
//   - HTTP: listeners running each request through the filter on a worker
//     VM (round robin), Envoy's header-map, body-buffering,
//     StopIteration/StopAll, local-reply and buffer-limit (413) semantics, a
//     route table with direct responses, ORIGINAL_DST and STATIC clusters,
//     streamed responses, Content-Length never fixed;
//   - callouts (proxy_http_call), properties, metrics on an admin listener at
//     /stats and /stats/prometheus (the wasmcustom namespace hidden, as
//     Envoy does), failure policies FAIL_CLOSED, FAIL_OPEN, FAIL_RELOAD.
//
// Configure it with Config (Go) or from an Envoy bootstrap YAML subset with
// LoadBootstrap; the command is e2e/cmd/envoyhost.
//
// Known differences from Envoy, on purpose or for lack of need:
//   - HTTP/1.1 only, through net/http: no HTTP/2, no gRPC-specific local
//     replies, trailers are not delivered to the filter; Go adds a Date
//     response header; request headers reach the filter sorted by name
//     after the pseudo-headers (net/http does not keep their order).
//   - A worker is chosen per request (Envoy: per connection).
//   - A VM's callbacks run on the goroutine of the stream, so on any OS
//     thread and CPU (Envoy: always on the VM's worker thread). On a busy
//     machine each callback may start with caches and TLB that hold none of
//     the VM's code and data: with GOMAXPROCS > 1 a plugin measured about
//     twice the in-guest time it measured with GOMAXPROCS=1. Handing the
//     calls to one locked thread per VM costs more than it saves here
//     (a cross-thread wake-up per callback).
//   - wazero compiles Go's Wasm to about six times its size in native code
//     (explicit bounds checks with inline trap stubs; V8 uses guard pages),
//     so a plugin's request path spans more cache lines and pages than in
//     V8.
//   - Bytes past a stale Content-Length are dropped (Envoy writes them on
//     the upstream connection, where they break the next request).
//   - Histograms are visible at once (Envoy merges them at each stats flush)
//     and /stats prints their count and sum, not quantiles. Gauges are one
//     stat per name, so increments from all workers add up and a record
//     (set) from any worker replaces the value, as in Envoy.
//   - No gRPC callouts, no foreign functions; path normalisation removes dot
//     segments and merges slashes only; circuit breakers and idle timeouts
//     are accepted and not enforced.
//   - A trap in a root context's on_context_create refuses the plugin
//     (cpp-host would go on calling on_vm_start on the failed VM).
package envoyhost
