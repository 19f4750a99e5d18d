package fleet

import (
	"testing"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// BenchmarkTenMinutesAt200QPS is the simulation's speed target: scenario (a), 8
// replicas, 10 simulated minutes of arrivals at 200 req/s (then the drain),
// routed by the decision tree against 50 ms scrapes. Budget: 20 s per op.
func BenchmarkTenMinutesAt200QPS(b *testing.B) {
	for _, policy := range []string{scheduler.ProfileDecisionTree, scheduler.ProfileScoring, EnvoyLeastRequest} {
		b.Run(policy, func(b *testing.B) {
			spec, err := PolicyByName(policy)
			if err != nil {
				b.Fatal(err)
			}
			var r Result
			for b.Loop() {
				r, err = Run(RunConfig{Scenario: SeedScenario(), Policy: spec, Rate: 200, Seed: 1,
					Window: 10 * time.Minute, ScrapeInterval: DefaultScrapeInterval})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.Arrivals), "requests/op")
			b.ReportMetric(r.End.Seconds(), "simsec/op")
		})
	}
}

// BenchmarkTenMinutesPrefix is the speed check on the prefix workloads: 8
// replicas, 10 simulated minutes of arrivals, decision-tree, each of (d),
// (e), (f) at its saturation as MeasureCapacity finds it with seed 1 (10.7,
// 129.3 and 61.2 req/s; (d) at 200 QPS would only time the drain of a
// backlog), and (e) at 200 QPS as well. Compare with
// BenchmarkTenMinutesAt200QPS in the same run.
func BenchmarkTenMinutesPrefix(b *testing.B) {
	spec, err := PolicyByName(scheduler.ProfileDecisionTree)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		sc   Scenario
		rate float64
	}{
		{"d/saturation", SharedContextScenario(), 10.7},
		{"e/saturation", MultiTurnScenario(), 129.3},
		{"e/200qps", MultiTurnScenario(), 200},
		{"f/saturation", SystemPromptScenario(), 61.2},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var r Result
			for b.Loop() {
				r, err = Run(RunConfig{Scenario: tc.sc, Policy: spec, Rate: tc.rate, Seed: 1,
					Window: 10 * time.Minute, ScrapeInterval: DefaultScrapeInterval})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.Arrivals), "requests/op")
			b.ReportMetric(float64(r.PromptTokens)/float64(max(r.Completed, 1)), "prompt-tokens/request")
			b.ReportMetric(r.End.Seconds(), "simsec/op")
		})
	}
}

// BenchmarkRoute is the cost of one routing decision with the fleet's
// snapshot shape (8 endpoints, 4 adapter slots).
func BenchmarkRoute(b *testing.B) {
	for _, policy := range []string{scheduler.ProfileDecisionTree, scheduler.ProfileScoring, EnvoyLeastRequest} {
		b.Run(policy, func(b *testing.B) {
			spec, _ := PolicyByName(policy)
			p, err := spec.New(1, func() time.Time { return Epoch })
			if err != nil {
				b.Fatal(err)
			}
			snap := &scheduler.Snapshot{Time: Epoch, Endpoints: make([]scheduler.Endpoint, 8)}
			for i := range snap.Endpoints {
				snap.Endpoints[i].Metrics = scheduler.Metrics{WaitingQueueSize: i % 3, RunningQueueSize: 100 + i, KVCacheUsage: 0.1 * float64(i),
					ActiveModels: []string{"lora-00", "lora-01"}, MaxActiveModels: 4, UpdateTime: Epoch}
			}
			v := &View{Snapshot: snap, InFlight: []int{1, 2, 3, 4, 5, 6, 7, 8}}
			req := &scheduler.Request{Model: "lora-01", TargetModel: "lora-01"}
			for b.Loop() {
				p.Route(req, v)
			}
		})
	}
}
