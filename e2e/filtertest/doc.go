// Package filtertest tests the real bin/wasm-epp.wasm (the module users
// deploy) inside the Envoy-faithful test host e2e/envoyhost: a router
// listener in front of an ORIGINAL_DST cluster, a push listener running the
// same module in its receiver role (same vm_id, so they share data), and
// loopback HTTP servers acting as vLLM pods. Snapshots are seeded the way
// production seeds them: a metrics push POSTed to the receiver.
//
// The tests use $WASM_EPP_WASM when set (make test), else build ./plugin
// once per test binary. -short skips them.
//
// The benchmark BenchmarkPluginRequest measures one request (headers +
// 4 KiB body + scheduling) through the host with the real plugin over 8 and
// 64 endpoints, next to the same request through a trivial plugin; the
// difference is the plugin's own cost.
package filtertest
