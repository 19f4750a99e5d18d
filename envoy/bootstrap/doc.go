// Package bootstrap is the one reader of Envoy bootstrap files in this
// repository. Load decodes YAML strictly into go-control-plane's
// envoy.config.bootstrap.v3.Bootstrap (duplicate keys and unknown fields are
// errors, as Envoy itself rejects them) and runs the generated validation on
// it and on every typed configuration packed in an Any, which ValidateAll
// alone does not enter. Marshal writes a Bootstrap back as YAML that Load (and
// Envoy) read.
//
// Between the two, callers work on typed messages: ConnectionManagers and
// WasmFilters unpack the HTTP connection managers of a listener and the Wasm
// HTTP filters inside them, and Store packs an edited message back into its
// Any, so a program that changes a bootstrap never walks untyped maps.
//
// Who reads bootstraps through it: package envoy (the rules every wasm-epp
// bootstrap must pass), e2e/envoyhost (the test host runs the very file Envoy
// would) and e2e/stack (which derives runnable copies from a template). It
// knows nothing of the plugin, so the test host stays independent of what it
// tests (build/check-imports.sh).
package bootstrap
