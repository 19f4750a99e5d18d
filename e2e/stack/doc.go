// Package stack starts and stops the whole local wasm-epp stack as real
// processes: N vllm-sim replicas, the metrics agent, and the gateway (real
// Envoy when an envoy binary is on PATH, otherwise bin/envoyhost), all
// configured from the same bootstrap template, envoy/envoy.yaml.
//
// `make run` (e2e/cmd/wasm-epp-run), `make demo` (e2e/cmd/wasm-epp-demo) and
// the end-to-end tests (e2e/endtoend) all use it, so what the tests prove is
// what users start.
//
// The template is never edited: RenderBootstrap writes a copy into the
// stack's work directory with the plugin path made absolute, listener and
// admin addresses substituted (tests ask for free loopback ports), JSON merge
// patches applied to the router's and the receiver's plugin configuration,
// and optional extra router listeners that share the router's VM (and so its
// shared data) with a different configuration. The copy must pass the same
// checks as every project bootstrap (package envoy).
//
// Every child runs in its own process group. Stop sends SIGTERM to each
// group, waits a grace period, then SIGKILLs the group, so nothing a child
// started survives; on Linux the children also get SIGKILL from the kernel if
// the owner dies without stopping them. A child that exits unasked is
// reported on Failed with the tail of its log.
package stack
