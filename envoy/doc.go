// Package envoy holds wasm-epp's Envoy bootstrap files (envoy.yaml, for a
// local run) and the checks every wasm-epp bootstrap must pass, so that the
// files here, the Kubernetes ConfigMap in build/ and anything else that embeds
// a bootstrap are judged by one set of rules.
//
// Bootstraps are read by envoy/bootstrap (strict decoding and the generated
// validation, typed configurations inside Any fields included). Check then
// enforces what wasm-epp needs from Envoy: allow_on_headers_stop_iteration on
// every plugin, an explicit failure policy that never skips the plugin, a
// router and a receiver sharing one vm_id and code, the ORIGINAL_DST cluster
// reading the header the plugin writes, loopback-only admin, and plugin
// configurations accepted by the plugin's own decoder (plugin/config).
package envoy
