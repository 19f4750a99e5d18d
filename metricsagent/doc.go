// Package metricsagent is the node agent of wasm-epp: it finds the vLLM pods
// of its node (static targets or a Kubernetes informer), scrapes their
// Prometheus /metrics every cycle (50 ms by default), and pushes the queue,
// KV-cache and LoRA state of every pod, encoded with scheduler/wire, to every
// Envoy replica, where the plugin's receiver keeps it in shared data.
//
// The pieces are small and separately testable: Discoverer (discovery.go),
// Scraper and ParseMetrics (scrape.go, parse.go), Pusher (push.go), Agent
// (agent.go) tying them into cycles, and Main (main.go) reading flags and
// environment variables and serving /metrics, /healthz and /readyz.
package metricsagent
