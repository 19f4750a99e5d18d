# Init-container image for plain Kubernetes: copies the plugin into the
# emptyDir that Envoy loads it from. The compat image (plugin.Dockerfile) has
# no program in it to run, so it cannot copy itself; clusters with image
# volumes (KEP-4639, Kubernetes >= 1.33 with the ImageVolume feature) can
# mount the compat image directly instead. Build context bin/:
#
#   docker build -f build/plugin-installer.Dockerfile -t wasm-epp/plugin-installer:dev bin/
#
FROM busybox:1.37-musl
COPY wasm-epp.wasm /plugin.wasm
USER 65532:65532
# cp /plugin.wasm <destination>; the Deployment passes the destination.
ENTRYPOINT ["/bin/cp", "/plugin.wasm"]
