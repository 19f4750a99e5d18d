// Package fleet is the routing-quality benchmark: a discrete-event
// simulation, in virtual time, of a gateway routing an open-loop LLM workload
// over N simulated vLLM replicas (e2e/vllmsim), with the routing decision
// made by the real scheduler package or by Envoy's own load balancers.
//
// One Run is deterministic for its seed. Its events are, in this order at
// equal times: replica engine-step ends (tokens, completions), metric
// scrapes, arrivals. Policies that read metrics see only the last scrape
// (every ScrapeInterval, 50 ms by default as upstream EPP), with
// Metrics.UpdateTime set to the scrape time and the scheduler's clock set to
// virtual time, so they work on data as stale as in production. Envoy's
// least-request balancer instead sees the gateway's own live count of
// requests in flight per replica, as Envoy does.
//
// Arrivals run for Warmup+Window; requests arriving inside the window are
// measured. Arrivals then stop and the fleet drains, like a benchmark tool
// that sends for a duration and waits for every response. Every arrival ends
// as completed, dropped (429), or without endpoint (503); Run checks that.
//
// Sweep runs a grid of scenarios × loads × policies (in parallel, each run on
// its own goroutine with its own state), and the report functions turn the
// results into markdown, CSV and SVG plots.
package fleet
