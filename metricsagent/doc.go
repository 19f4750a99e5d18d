// Package metricsagent is the node agent of wasm-epp: it finds the vLLM pods
// of its node (static targets or a Kubernetes informer), scrapes their
// Prometheus /metrics every cycle (50 ms by default), and pushes the queue,
// KV-cache and LoRA state of every pod, encoded with scheduler/wire, to every
// Envoy replica, where the plugin's receiver keeps it in shared data.
//
// The pieces are small and separately testable: Discoverer (discovery.go),
// Scraper and ParseMetrics (scrape.go, parse.go), Parser (reparse.go), which
// reads only the new values when a page keeps its shape, Pusher (push.go),
// Agent (agent.go) tying them into cycles, and Main (main.go) reading flags
// and environment variables and serving /metrics, /healthz and /readyz.
//
// # Why the agent reads HTTP answers and sockets itself
//
// At 100 pods every 50 ms the agent makes 2,000 scrapes a second, so what
// one scrape costs is what the agent costs. Two pieces replace the standard
// library on that path, each held to it by tests, with the figures in
// BENCHMARKS.md:
//
//   - answer.go reads an answer's status line and header fields by
//     net/http's rules without building a Response, a header map and a
//     string per field each time (FuzzReadAnswerHead compares the two).
//   - sockio_linux.go makes the reads and writes of the pod and push
//     connections on the raw descriptor, through net's RawConn so the
//     deadlines and the poller still decide when to wait: syscall.Read and
//     Write would tell the scheduler a call may block, which wakes the
//     runtime's monitor thread after every idle gap between cycles.
//     sysio_norace_linux.go holds those calls; under the race detector
//     sysio_race_linux.go goes through syscall.Read and Write so that the
//     detector sees the socket I/O; sockio_other.go is the plain connection
//     elsewhere than Linux.
package metricsagent
