# wasm-epp plugin as an OCI image in Istio's "compat" layout: one layer holding
# plugin.wasm at the root. Istio's WasmPlugin (url: oci://...) and Envoy
# Gateway's EnvoyExtensionPolicy (code.type: Image) both accept it.
# The build context is bin/ (after `make wasm`):
#
#   docker build -f build/plugin.Dockerfile -t wasm-epp/plugin:dev bin/
#
FROM scratch
COPY wasm-epp.wasm ./plugin.wasm
