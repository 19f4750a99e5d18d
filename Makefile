# wasm-epp build, test and run targets. `make help` lists them.
SHELL := /usr/bin/env bash
GO    ?= go
BIN   := $(CURDIR)/bin
WASM  := $(BIN)/wasm-epp.wasm
MODULE := github.com/wasm-epp/wasm-epp

# Native commands built into bin/ (directory under the repo -> binary name).
CMDS := $(wildcard e2e/cmd/* metricsagent/cmd/*)

.PHONY: help build wasm cmds test check bench fuzz clean

help: ## List targets.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: wasm cmds ## Build the plugin and every command into bin/.

wasm: ## Build bin/wasm-epp.wasm (Go wasip1, c-shared).
	@mkdir -p $(BIN)
	@if [ -f plugin/main.go ]; then \
	  GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(WASM) ./plugin && echo "built $(WASM)"; \
	else echo "plugin/ not written yet: no wasm to build"; fi

cmds: ## Build the native commands (agent, test host, simulator, benchmarks).
	@mkdir -p $(BIN)
	@for d in $(CMDS); do $(GO) build -trimpath -o $(BIN)/$$(basename $$d) ./$$d || exit 1; echo "built bin/$$(basename $$d)"; done

test: build ## Run every test (unit, fuzz corpora, the real .wasm in the test host, end to end).
	WASM_EPP_WASM=$(WASM) WASM_EPP_BIN=$(BIN) $(GO) test -count=1 -timeout 14m ./...

check: ## gofmt, go vet, go mod tidy drift, import boundaries.
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@cp go.mod /tmp/wasm-epp-go.mod.bak; cp go.sum /tmp/wasm-epp-go.sum.bak; \
	 $(GO) mod tidy >/dev/null 2>&1; \
	 if ! git diff --quiet -- go.mod go.sum; then echo "go.mod/go.sum not tidy: run go mod tidy"; git --no-pager diff --stat -- go.mod go.sum; \
	   cp /tmp/wasm-epp-go.mod.bak go.mod; cp /tmp/wasm-epp-go.sum.bak go.sum; exit 1; fi
	@./build/check-imports.sh
	@echo "check: ok"

bench: ## Micro-benchmarks (scheduler, plugin in the host, agent). Results go in BENCHMARKS.md.
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./scheduler/... ./plugin/... ./e2e/... ./metricsagent/...

fuzz: ## Run each fuzz target for FUZZTIME (default 30s); corpora are kept in testdata/fuzz.
	@grep -rl --include='*_test.go' '^func Fuzz' . | while read f; do \
	  pkg=./$$(dirname $$f); for fn in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | cut -d' ' -f2); do \
	    echo "== $$pkg $$fn"; $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $${FUZZTIME:-30s} $$pkg || exit 1; done; done

clean: ## Remove build outputs.
	rm -rf $(BIN)
