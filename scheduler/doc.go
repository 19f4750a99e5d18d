// Package scheduler picks the vLLM endpoint that should serve an inference
// request. It is plain Go with no Wasm or network dependency: the Proxy-Wasm
// plugin, the fleet simulation and the tests all call the same code.
//
// A scheduling cycle works on one Snapshot of endpoint metrics, which it
// does not change, so every decision sees a consistent view and never
// touches shared state. Between decisions, Scheduler.Observe can count the
// requests routed since the snapshot was taken into the caller's own copy
// (Config.CountRoutedSinceSnapshot), so a burst arriving between two
// snapshots spreads instead of herding onto the endpoint that looked least
// loaded.
//
// # Using it
//
//	cfg, err := scheduler.DecodeConfig(raw)              // raw: the "scheduler" JSON section; empty → defaults
//	if err != nil { return scheduler.PrefixError("scheduler", err) }
//	s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{
//		Rand:       rand.NewPCG(seed1, seed2), // nil: private PCG seeded from crypto/rand
//		Now:        clock,                     // nil: time.Now
//		StaleAfter: 2 * time.Second,           // 0: no staleness check
//		FailOpen:   true,                      // every endpoint stale: a random one instead of AllStale
//	})
//	res := s.Schedule(&scheduler.Request{Model: m, TargetModel: t, Criticality: c}, snap)
//	switch res.Outcome {
//	case scheduler.Routed:     // snap.Endpoints[res.Index] (res.Endpoint); then s.Observe(req, res)
//	case scheduler.FailedOpen: // snap.Endpoints[res.Index], chosen at random: every endpoint was stale
//	case scheduler.Dropped:    // 429
//	case scheduler.NoEndpoint: // 503
//	case scheduler.AllStale:   // 503 (FailOpen off)
//	}
//	s.LeastLoaded(snap) // requests without a body (GET /v1/models)
//
// res.Path says how the decision was reached; s.Paths() lists every value
// it can take (the fixed Path* constants, the selected profiles' names and
// decision-tree routes, see DecisionTreeFilter), so a metric per path has a
// small, known label set.
//
// A Scheduler is not safe for concurrent use (scratch buffers, random
// source and round-robin state are reused across calls): use one per
// Proxy-Wasm VM or simulation loop. A decision allocates nothing.
//
// # Framework
//
// A Profile runs Filters (hard requirements, in order; keeping nothing is
// a normal outcome), then weighted Scorers (each in [0,1]; the profile
// takes the weighted mean), then one Picker. The profile is chosen per
// criticality (Config.Profile, Config.ByCriticality). Plugins share
// per-request data through Cycle.State (typed keys: NewStateKey, Put,
// Get). A Registry lists the plugin types a configuration may name;
// NewRegistry holds the built-ins, and Register adds more.
//
// Built-in profiles: "decision-tree" (the default, the seed's algorithm:
// see below), "scoring" (the same signals as weighted scores),
// "prefix-aware" (prefix-cache affinity with a load guard), and the
// baselines "random", "round-robin", "least-request". Config documents the
// JSON form; the README documents every plugin.
//
// # Large snapshots
//
// A decision that filters and scores every endpoint costs O(N): about
// 160,000 instructions (tens of µs) natively at 1,000 endpoints for the
// decision tree (BENCHMARKS.md). From Options.IndexMinEndpoints endpoints
// (DefaultIndexMinEndpoints) a Scheduler keeps an index of the snapshot
// it decides on (index.go): sorted orders of the fresh endpoints by
// (waiting queue, KV-cache use), by running batch, by outstanding
// requests, by position, and by a scoring profile's score; the same
// orders for each has-capacity test a profile uses; and each adapter's
// holders. Fast paths (fastpath.go, fastscore.go) then answer the whole
// decision of the covered profiles from a few binary searches:
// decision-tree (the seed's table, or any table of its five filter
// types), scoring (any weights of its four scorers, with or without a
// shed-filter, max-score picker), prefix-aware (fastprefix.go),
// least-request, random, round-robin, and LeastLoaded. They are exact: the
// same endpoint, path and random draws as the plugins give on the same
// snapshot, which the tests check decision by decision against a
// Scheduler that scans. What the target adapter or the prompt's prefix
// changes is computed for their holders only, so a decision costs
// O(log N + holders); prefix-aware's consistent choice for a new prefix
// still weighs every endpoint of its pool (rendezvous hashing), in one
// tight pass. Other profiles (user profiles of other plugins) scan as
// before.
//
// The index follows the snapshot through Snapshot.MetricsChanged (that
// endpoint moves in each order: O(log N) plus the entries it passes) and
// Snapshot.Changed or a new Snapshot (rebuilt, about four scans' worth, on
// the second decision that sees it, or after metric churn that came back
// within fewer than four decisions on the fourth, so changes that come
// faster than decisions cost no more than scanning; the profiles whose
// fast paths can also decide on values read for the one decision do so
// then, at a fraction of a scan's cost in the guest). Observe updates it
// itself.
//
// # The seed
//
// "The seed" is the scheduler this project reproduces exactly: the
// Gateway API Inference Extension endpoint picker's scheduler as of its
// commit 264ee45a, refactored into ActiveModels and WaitingModels, one
// cycle per request on one snapshot, and the decision tree as a table.
// SeedTree is that tree; its filters, thresholds and defaults are
// upstream's, and "upstream" in this package's comments means that code.
package scheduler
