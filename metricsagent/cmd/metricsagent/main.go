// Command metricsagent scrapes the vLLM pods of its node and pushes their
// state to the wasm-epp plugin in every Envoy. Run with -h for the flags;
// the work is done by package metricsagent.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/wasm-epp/wasm-epp/metricsagent"
)

func main() {
	// SIGTERM (Kubernetes) and SIGINT (a terminal) end the run gracefully.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := metricsagent.Main(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(code)
}
