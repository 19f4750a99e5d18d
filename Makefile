# wasm-epp build, test and run targets. `make help` lists them.
SHELL := /usr/bin/env bash
GO    ?= go
BIN   := $(CURDIR)/bin
WASM  := $(BIN)/wasm-epp.wasm
MODULE := github.com/wasm-epp/wasm-epp

# Native commands built into bin/ (directory under the repo -> binary name).
CMDS := $(wildcard e2e/cmd/* metricsagent/cmd/*)

.PHONY: help build wasm testplugin cmds run demo test race check bench bench-routing bench-flow bench-scale fuzz images clean

help: ## List targets.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: wasm cmds ## Build the plugin and every command into bin/.

wasm: ## Build bin/wasm-epp.wasm (Go wasip1, c-shared).
	@mkdir -p $(BIN)
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(WASM) ./plugin

testplugin: ## Build bin/testplugin.wasm (the binding's test plugin).
	@mkdir -p $(BIN)
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(BIN)/testplugin.wasm ./plugin/internal/testplugin

cmds: ## Build the native commands (agent, test host, simulator, benchmarks).
	@mkdir -p $(BIN)
	@for d in $(CMDS); do $(GO) build -trimpath -o $(BIN)/$$(basename $$d) ./$$d || exit 1; echo "built bin/$$(basename $$d)"; done

run: build ## Start 4 simulated vLLM replicas, the agent and the gateway; Ctrl-C stops all.
	$(BIN)/wasm-epp-run

demo: build ## Drive a short mixed load through a local stack and print a summary.
	$(BIN)/wasm-epp-demo

test: build ## Run every test (unit, fuzz corpora, the real .wasm in the test host, end to end), then `make race`.
	WASM_EPP_WASM=$(WASM) WASM_EPP_BIN=$(BIN) $(GO) test -count=1 -timeout 14m ./...
	@$(MAKE) --no-print-directory race

# The packages where goroutines share state: the scheduler, the agent, the
# plugin's native tests (proxytest), the test host alone and with the real
# .wasm (filtertest), the simulator's server and the stack's process
# handling. BENCHMARKS.md has the time each takes under the race detector.
RACE_PKGS ?= ./scheduler/... ./metricsagent/... ./plugin/... ./e2e/envoyhost/... ./e2e/filtertest/... ./e2e/vllmsim/... ./e2e/stack/...

race: wasm ## go test -race over RACE_PKGS (part of make test).
	WASM_EPP_WASM=$(WASM) $(GO) test -race -count=1 -timeout 10m $(RACE_PKGS)

check: ## gofmt, go vet, go mod tidy drift, import boundaries.
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@cp go.mod /tmp/wasm-epp-go.mod.bak; cp go.sum /tmp/wasm-epp-go.sum.bak; \
	 $(GO) mod tidy >/dev/null 2>&1; \
	 if ! git diff --quiet -- go.mod go.sum; then echo "go.mod/go.sum not tidy: run go mod tidy"; git --no-pager diff --stat -- go.mod go.sum; \
	   cp /tmp/wasm-epp-go.mod.bak go.mod; cp /tmp/wasm-epp-go.sum.bak go.sum; exit 1; fi
	@./build/check-imports.sh
	@$(MAKE) --no-print-directory wasm testplugin >/dev/null
	$(GO) run ./e2e/cmd/wasmimports $(WASM) $(BIN)/testplugin.wasm
	@echo "check: ok"

bench: ## Micro-benchmarks (scheduler, plugin in the host, agent). Results go in BENCHMARKS.md.
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./scheduler/... ./plugin/... ./e2e/... ./metricsagent/...

bench-routing: cmds ## Fleet simulation: every policy and the oracle on scenarios a, b (LoRA) and d, e, f (shared prefixes), about 17 min of CPU (9 min on 2 idle cores); writes e2e/results/.
	$(BIN)/fleetbench -out e2e/results
	$(BIN)/fleetbench -scenarios a -criticality critical=0.6,standard=0.2,sheddable=0.2 -compare-lora-fifo 0 -out e2e/results/mixed-criticality

bench-flow: cmds ## Flow-control fleet benchmark (about 25 min on 2 shared cores): today's 429 vs the queue; writes e2e/results/flow-control/.
	$(BIN)/flowbench -extra tree-kv1=e2e/results/flow-control/tree-kv1.json -out e2e/results/flow-control

# SCALE_V1 is the last commit whose plugin stores shared data version 1 (one
# value holding every endpoint): bench-scale builds it for the direct-v1 rows.
SCALE_V1 ?= 4132b91
SCALE_OUT ?= e2e/results/scale

bench-scale: build ## Metrics path at fleet sizes (about 45 min): pushes and configuration records into the real .wasm with 4 router VMs; writes $(SCALE_OUT)/.
	@mkdir -p $(SCALE_OUT)
	@rm -rf $(BIN)/scale-v1 && mkdir -p $(BIN)/scale-v1 && git archive $(SCALE_V1) | tar -x -C $(BIN)/scale-v1 && \
	  sed -i 's/MaxAgents:         256,/MaxAgents:         4096,/; s/MaxTotalEndpoints: 4096,/MaxTotalEndpoints: 16384,/' $(BIN)/scale-v1/scheduler/wire/limits.go && \
	  (cd $(BIN)/scale-v1 && GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(BIN)/wasm-epp-v1.wasm ./plugin) && rm -rf $(BIN)/scale-v1
	$(BIN)/scalebench -base-wasm $(BIN)/wasm-epp-v1.wasm -modes direct-v1,direct-v2,relay -sizes 100,1000 -per-node 2 -reps 3 -window 5s -out $(SCALE_OUT)/small.jsonl | tee $(SCALE_OUT)/small.txt
	$(BIN)/scalebench -modes relay -sizes 5000 -per-node 2 -reps 3 -window 5s -rate 100 -out $(SCALE_OUT)/relay-5000.jsonl | tee $(SCALE_OUT)/relay-5000.txt
	$(BIN)/scalebench -modes relay -sizes 1000,5000 -per-node 8 -reps 2 -window 5s -rate 100 -out $(SCALE_OUT)/relay-8.jsonl | tee $(SCALE_OUT)/relay-8.txt
	$(BIN)/scalebench -modes aggregator -sizes 1000 -per-node 2 -reps 2 -window 5s -out $(SCALE_OUT)/aggregator.jsonl | tee $(SCALE_OUT)/aggregator.txt
	$(BIN)/scalebench -modes relay -sizes 1000 -per-node 2 -change 0.1 -reps 2 -window 5s -out $(SCALE_OUT)/relay-change-0.1.jsonl | tee $(SCALE_OUT)/relay-change-0.1.txt
	$(BIN)/scalebench -modes relay -sizes 5000 -per-node 2 -rate 100 -phases soak -window 10m -sample 30s -out $(SCALE_OUT)/soak.jsonl | tee $(SCALE_OUT)/soak.txt

images: ## Build container images (docker/podman/buildah), or print the commands.
	@build/images.sh

fuzz: ## Run each fuzz target for FUZZTIME (default 30s), FUZZFLAGS added (e.g. -parallel=1); corpora are kept in testdata/fuzz.
	@grep -rl --include='*_test.go' '^func Fuzz' . | while read f; do \
	  pkg=./$$(dirname $$f); for fn in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | cut -d' ' -f2); do \
	    echo "== $$pkg $$fn"; $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $${FUZZTIME:-30s} $${FUZZFLAGS:-} $$pkg || exit 1; done; done

clean: ## Remove build outputs.
	rm -rf $(BIN)
