// Package fleet is the routing-quality benchmark: a discrete-event
// simulation, in virtual time, of gateways routing an LLM workload over N
// simulated vLLM replicas (e2e/vllmsim), with the routing decision made by
// the real scheduler package, by Envoy's own load balancers, or by the
// oracle.
//
// One Run is deterministic for its seed. Its events are, in this order at
// equal times: replica engine-step ends (tokens, completions), metric
// scrapes, arrivals. Policies that read metrics see only the last scrape
// (every ScrapeInterval, 50 ms by default as upstream EPP), with
// Metrics.UpdateTime set to the scrape time and the scheduler's clock set to
// virtual time, so they work on data as stale as in production. Envoy's
// least-request balancer instead sees its gateway's own live count of
// requests in flight per replica, as Envoy does. The oracle (oracle.go)
// reads every replica's true cache and load: the upper bound.
//
// A scenario's Traffic (traffic.go) generates the requests: ShareGPT
// lengths without shared prefixes for (a)-(c); token ids with shared
// prefixes for (d) shared long contexts, (e) multi-turn conversations (a
// closed loop: a turn follows the previous response) and (f) adapters with
// system prompts. The replicas cache prefixes by those ids as vLLM does;
// policies see the ids of the request they route (View.Request).
//
// Arrivals run for Warmup+Window; requests arriving inside the window are
// measured. Arrivals then stop and the fleet drains, like a benchmark tool
// that sends for a duration and waits for every response. Every arrival ends
// as completed, dropped (429), or without endpoint (503); Run checks that.
// Policies can learn from responses (ResponseObserver: first token, then
// the end with cached_tokens) and share state within a gateway (Placed,
// GatewayShared); RunConfig.Gateways × GatewayVMs sets how many routing
// instances there are.
//
// Sweep runs a grid of scenarios × loads × policies (in parallel, each run on
// its own goroutine with its own state), and the report functions turn the
// results into markdown, CSV and SVG plots.
package fleet
