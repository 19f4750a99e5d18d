// Package scale measures and tests the metrics path at fleet sizes: many
// simulated agents (or the aggregator tier) pushing real wire messages into
// the real .wasm in the test host while router worker VMs serve requests.
//
// The fleet (fleet.go) is simulated endpoints grouped by node, one agent
// per node; pushers (push.go) send its state directly to the receiver or to
// aggregators, or send what the aggregator tier would (relay pushes built
// in process); the load (load.go) sends chat requests through the router
// and probes how long a push takes to become visible to a router VM.
// bench.go runs the measurements `make bench-scale` reports; the tests run
// the same parts at small sizes.
package scale
