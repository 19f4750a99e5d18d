// Package build holds wasm-epp's container image recipes (Dockerfiles,
// images.sh) and Kubernetes manifests (k8s/: kustomize base and overlays,
// Istio and Envoy Gateway examples). The package has no code of its own: its
// tests decode every manifest strictly into the Kubernetes API types, build
// every kustomization, validate the Envoy bootstrap in the ConfigMap with the
// same checks as envoy/, and check that the manifests agree with each other
// and with the binaries they run (labels, ports, flags).
package build
