// Package envoyhost is an Envoy-faithful Proxy-Wasm host built on wazero.
//
// It runs a real .wasm plugin the way Envoy (with proxy-wasm-cpp-host) does,
// so tests of the plugin test the binary users deploy. Each emulated
// behaviour names the upstream source it follows; the repositories are
// proxy-wasm/proxy-wasm-cpp-host ("cpp-host") and envoyproxy/envoy ("envoy").
//
// What it covers:
//   - loading: ABI version export, the exact cpp-host import set (anything
//     else fails with "Failed to load Wasm module due to a missing import"),
//     the WASI functions with cpp-host's return values, restricted callbacks
//     during _initialize and inside the allocator;
//   - VM lifecycle: base VM, canary (its configure result accepts or rejects
//     the configuration), then one VM for the main thread and one per
//     worker, several plugins sharing a VM when their vm key matches;
//   - HTTP: listeners running each request through the filter on a worker
//     VM, Envoy's header-map, body-buffering, StopIteration/StopAll,
//     local-reply and buffer-limit semantics, an ORIGINAL_DST or STATIC
//     cluster behind a router, streamed responses;
//   - shared data, timers, HTTP callouts, properties, metrics (exposed on an
//     admin listener at /stats and /stats/prometheus), failure policies.
//
// Configure it with Config (Go) or from an Envoy bootstrap YAML subset with
// LoadBootstrap; see the command in e2e/cmd/envoyhost.
package envoyhost
