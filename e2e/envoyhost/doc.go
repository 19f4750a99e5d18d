// Package envoyhost is an Envoy-faithful Proxy-Wasm host built on wazero.
//
// It runs a real .wasm plugin the way Envoy (with proxy-wasm-cpp-host and
// the V8 runtime) does, so tests of the plugin test the binary users
// deploy. Each emulated behaviour names the upstream source it follows;
// the repositories are proxy-wasm/proxy-wasm-cpp-host ("cpp-host"),
// envoyproxy/envoy ("envoy") and proxy-wasm/proxy-wasm-cpp-sdk.
//
// Where each behaviour lives (file: what it emulates, after which upstream
// source):
//
//	imports.go, wasmbin.go  the import set, load-time checks, ABI version export
//	                        cpp-host include/proxy-wasm/exports.h, src/wasm.cc,
//	                        src/v8/v8.cc (link), src/bytecode_util.cc
//	abi.go                  result codes, map/buffer/stream types, statuses
//	                        proxy-wasm-cpp-sdk proxy_wasm_common.h, proxy_wasm_enums.h
//	hostcalls.go            the ABI table: every env.* host call with its named
//	                        parameters, argument checks, guest memory in and out
//	                        cpp-host src/exports.cc
//	wasi.go                 WASI preview1 without a file system
//	                        cpp-host src/exports.cc (wasi_unstable_*)
//	context.go              what host calls do to a context: header maps,
//	                        buffers, local replies, continue/close, set_property,
//	                        metrics
//	                        envoy source/extensions/common/wasm/context.cc
//	properties.go           get_property paths and their serialisation
//	                        envoy context.cc getProperty, findValue;
//	                        source/extensions/filters/common/expr/context.cc
//	headers.go              the header pairs format
//	                        cpp-host src/pairs_util.cc
//	vm.go                   VM start, restricted callbacks, allocator, effective
//	                        context, callbacks and after-call actions, tick timers
//	                        cpp-host src/wasm.cc, src/context.cc,
//	                        include/proxy-wasm/wasm_vm.h;
//	                        envoy source/extensions/common/wasm/wasm.cc (timers)
//	plugin.go               base VM, canary, per-thread VMs, failure policies
//	                        cpp-host src/wasm.cc; envoy source/extensions/common/wasm/wasm.cc
//	memory.go               linear memory reserved up front and grown in place (V8)
//	shareddata.go           shared data and shared queues per vm_id
//	                        cpp-host src/shared_data.cc, src/shared_queue.cc
//	httpcall.go             proxy_http_call and on_http_call_response
//	                        envoy context.cc httpCall, onHttpCallSuccess/Failure
//	filter.go               one stream through the filter chain: header, body and
//	                        trailer callbacks, status conversion, buffering, 413,
//	                        continue, local replies through the encoder filters,
//	                        on_log/on_done/on_delete
//	                        envoy source/common/http/filter_manager.cc, context.cc
//	                        decodeHeaders..onDestroy; cpp-host src/context.cc
//	listener.go             listeners, request header map, connection manager
//	                        header handling (x-forwarded-for, path normalisation)
//	                        envoy source/common/http/conn_manager_impl.cc,
//	                        conn_manager_utility.cc
//	router.go               route table, direct responses, STATIC and ORIGINAL_DST
//	                        clusters, upstream requests, route timeout
//	                        envoy source/common/router/router.cc, config_impl.cc;
//	                        source/extensions/clusters/original_dst/original_dst_cluster.cc
//	stats.go, admin.go      plugin metrics, /stats and /stats/prometheus
//	                        envoy source/extensions/common/wasm/stats_handler.h,
//	                        source/common/stats/, source/server/admin/prometheus_stats.cc
//	host.go, config.go      Host (New, Start, Close, host modules) and Config
//	                        with its defaults
//	bootstrap.go            a bootstrap (read by envoy/bootstrap) into a Config;
//	                        fields the host does not emulate are refused
//	                        envoy api/envoy/config/bootstrap/v3/bootstrap.proto and
//	                        the protos it embeds
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
//     tick timers per root context, re-armed after each on_tick; proxy_done
//     at shutdown;
//   - holding streams: proxy_set_effective_context (reset for every
//     callback), continuing, closing or answering a paused stream from a
//     tick or from another stream's callback (queued until the callback
//     returns; continuing drops the header maps at once, while a buffered
//     body stays readable; a local reply sets the VM's stop flag, so it
//     stops the calling stream too), a client reset
//     while held (on_log, on_done, on_delete, then the id is gone),
//     stream_idle_timeout (408 while the request is still coming, 504 once
//     it is complete);
//   - HTTP: listeners speaking HTTP/1.1 and cleartext HTTP/2 with prior
//     knowledge (codec_type AUTO, HTTP1, HTTP2), running each request
//     through the filter on a worker VM (round robin); Envoy's header-map,
//     body-buffering, StopIteration/StopAll, request-trailer (the last body
//     callback without end_of_stream, then on_request_trailers),
//     local-reply and buffer-limit (413) semantics, a route table with
//     direct responses, ORIGINAL_DST and STATIC clusters, streamed
//     responses, Content-Length never fixed;
//   - callouts (proxy_http_call), properties, metrics on an admin listener at
//     /stats and /stats/prometheus (the wasmcustom namespace hidden, as
//     Envoy does), failure policies FAIL_CLOSED, FAIL_OPEN, FAIL_RELOAD.
//
// Configure it with Config (Go) or from an Envoy bootstrap YAML subset with
// LoadBootstrap; the command is e2e/cmd/envoyhost.
//
// Known differences from Envoy, on purpose or for lack of need:
//   - Cleartext only, through net/http: no TLS (so no ALPN), no HTTP/3, no
//     gRPC-specific local replies; Go adds a Date response header; request
//     headers reach the filter sorted by name after the pseudo-headers
//     (net/http does not keep their order).
//   - Request trailers reach the filter over HTTP/2 only when the request
//     declared them in a Trailer header, which Go's client always does:
//     net/http drops undeclared ones, Envoy delivers them all. HTTP/1.1
//     trailers are dropped, as Envoy does unless enable_trailers is set
//     (not offered here). Upstreams are HTTP/1.1, so request trailers stop
//     at the router and response trailers never come.
//   - HTTP/2 frames are not visible through net/http: without a
//     Content-Length the end of the body shows only as the next read's EOF,
//     so a body whose last DATA frame carried END_STREAM gets one more,
//     empty body callback with end_of_stream (Envoy ends the stream in the
//     callback for that frame).
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
//     segments and merges slashes only; circuit breakers, request_timeout,
//     request_headers_timeout and the route's idle_timeout are accepted and
//     not enforced.
//   - A trap in a root context's on_context_create refuses the plugin
//     (cpp-host would go on calling on_vm_start on the failed VM).
package envoyhost
