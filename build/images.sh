#!/usr/bin/env bash
# Build the wasm-epp container images with whichever builder is installed
# (docker, podman or buildah). Without one, print the commands to run elsewhere.
#
#   build/images.sh                 # build REGISTRY/<image>:TAG for every image
#   build/images.sh --print         # only print the commands
#   build/images.sh --push          # build, then push
#   build/images.sh --kind demo     # build, then load into the kind cluster "demo"
#
# Environment: REGISTRY (default wasm-epp), TAG (default dev), BUILDER (force
# docker|podman|buildah). The Kubernetes manifests in build/k8s use
# wasm-epp/<image>:dev; after pushing elsewhere, point them at your images:
#   (cd build/k8s/overlays/demo && kustomize edit set image wasm-epp/metricsagent=$REGISTRY/metricsagent:$TAG ...)
set -euo pipefail
cd "$(dirname "$0")/.."

REGISTRY=${REGISTRY:-wasm-epp}
TAG=${TAG:-dev}
print_only=false push=false kind_cluster=""
while [ $# -gt 0 ]; do
  case "$1" in
    --print) print_only=true ;;
    --push) push=true ;;
    --kind) kind_cluster=${2:?--kind needs a cluster name}; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# image name | Dockerfile | build context
images=(
  "metricsagent|build/Dockerfile|."
  "vllm-sim|build/vllm-sim.Dockerfile|."
  "plugin|build/plugin.Dockerfile|bin"
  "plugin-installer|build/plugin-installer.Dockerfile|bin"
)

builder=${BUILDER:-}
if [ -z "$builder" ]; then
  for b in docker podman buildah; do
    command -v "$b" >/dev/null 2>&1 || continue
    # A docker CLI without a reachable daemon cannot build anything.
    if [ "$b" = docker ] && ! docker info >/dev/null 2>&1; then continue; fi
    builder=$b; break
  done
fi
if [ -z "$builder" ]; then
  print_only=true
  echo "# No usable container builder (docker with a running daemon, podman, buildah): run these where one is."
fi

build_cmd() { # build_cmd <ref> <dockerfile> <context>
  case "${builder:-docker}" in
    buildah) echo "buildah bud --layers -f $2 -t $1 $3" ;;
    *) echo "${builder:-docker} build -f $2 -t $1 $3" ;;
  esac
}
push_cmd() { echo "${builder:-docker} push $1"; }

run() { echo "+ $*"; $print_only || "$@"; }

if [ ! -f bin/wasm-epp.wasm ]; then
  if $print_only; then echo "make wasm"; else run make wasm; fi
fi

for entry in "${images[@]}"; do
  IFS='|' read -r name dockerfile context <<<"$entry"
  ref="$REGISTRY/$name:$TAG"
  # shellcheck disable=SC2046 # the command is split into words on purpose
  if $print_only; then build_cmd "$ref" "$dockerfile" "$context"; else run $(build_cmd "$ref" "$dockerfile" "$context"); fi
  if $push; then
    if $print_only; then push_cmd "$ref"; else run $(push_cmd "$ref"); fi
  fi
  if [ -n "$kind_cluster" ]; then
    # kind loads from the docker daemon; with podman, save and load an archive.
    case "${builder:-docker}" in
      docker) cmd="kind load docker-image $ref --name $kind_cluster" ;;
      podman) cmd="kind load image-archive <(podman save $ref) --name $kind_cluster" ;;
      *) cmd="buildah push $ref docker-archive:/tmp/wasm-epp-$name.tar && kind load image-archive /tmp/wasm-epp-$name.tar --name $kind_cluster" ;;
    esac
    if $print_only; then echo "$cmd"; else run bash -c "$cmd"; fi
  fi
done
