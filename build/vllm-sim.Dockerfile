# syntax=docker/dockerfile:1
# Simulated vLLM replica (bin/vllm-sim) for the Kubernetes demo overlay, built
# from the repository root:
#
#   docker build -f build/vllm-sim.Dockerfile -t wasm-epp/vllm-sim:dev .
#
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/vllm-sim ./e2e/cmd/vllm-sim

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/vllm-sim /vllm-sim
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["/vllm-sim"]
