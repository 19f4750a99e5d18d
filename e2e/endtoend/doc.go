// Package endtoend holds wasm-epp's end-to-end tests, the agent → receiver
// → router path among them: real processes from bin/ — vllm-sim
// replicas, the metrics agent, and the gateway running bin/wasm-epp.wasm
// from a copy of envoy/envoy.yaml (real Envoy when it is on PATH, otherwise
// bin/envoyhost) — started and stopped by package e2e/stack on free loopback
// ports.
//
// The tests use the binaries in $WASM_EPP_BIN and the plugin at
// $WASM_EPP_WASM (make test sets both). When either is unset or a binary is
// missing, they are built once per test binary into a temporary directory.
// Set WASM_EPP_GATEWAY=envoy or envoyhost to force a gateway. -short skips
// the package.
//
// Every wait is a bounded poll; every process is stopped in t.Cleanup, whole
// process groups; only 127.0.0.1 is used.
package endtoend
