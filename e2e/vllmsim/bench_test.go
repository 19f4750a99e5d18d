package vllmsim

import (
	"testing"
	"time"
)

// BenchmarkReplicaSaturation runs one Llama-2-7B replica overloaded with
// ShareGPT for 60 simulated seconds and reports the model's cost per engine
// step (each step touches every running sequence, ≈200 at saturation).
func BenchmarkReplicaSaturation(b *testing.B) {
	var steps int64
	for b.Loop() {
		th, err := Saturation(DefaultReplicaConfig(Llama2_7B), ShareGPTWorkload(40, 1), 0, 60*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		steps += th.Steps
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(steps), "ns/step")
	b.ReportMetric(float64(steps)/float64(b.N), "steps/op")
}

// BenchmarkFleetShape is the replica-model share of the fleet simulation's
// speed target (e2e/fleet BenchmarkTenMinutesAt200QPS):
// 8 replicas, max_loras 4, 10 adapters, 200 QPS of ShareGPT for 10 simulated
// minutes, round-robin dispatch, and every replica's Metrics sampled every
// 50 ms as the fleet simulation's scrape does. The budget for the whole
// fleet bench is 20 s.
func BenchmarkFleetShape(b *testing.B) {
	const replicas = 8
	const horizon = 10 * time.Minute
	const scrape = 50 * time.Millisecond
	for b.Loop() {
		cfg := DefaultReplicaConfig(Llama2_7B)
		cfg.MaxLoRAs = 4
		fleet := make([]*Replica, replicas)
		for i := range fleet {
			r, err := NewReplica(cfg)
			if err != nil {
				b.Fatal(err)
			}
			fleet[i] = r
		}
		wl := ShareGPTWorkload(200, 1)
		wl.Adapters = EqualShares(AdapterNames("lora", 10)...)
		gen, err := NewWorkload(wl)
		if err != nil {
			b.Fatal(err)
		}
		reqs := make([]Request, 0, 130_000)
		next := gen.Next()
		nextScrape := time.Duration(0)
		rr := 0
		for {
			// The earliest of: arrival, scrape, any replica's step end.
			at, kind := next.At, 0
			if nextScrape < at {
				at, kind = nextScrape, 1
			}
			for _, r := range fleet {
				if t, ok := r.NextEventTime(); ok && t < at {
					at, kind = t, 2
				}
			}
			if at > horizon {
				break
			}
			for _, r := range fleet {
				r.Advance(at)
			}
			switch kind {
			case 0:
				reqs = append(reqs, Request{ID: uint64(next.Seq), Adapter: next.Adapter, PromptTokens: next.PromptTokens, OutputTokens: next.OutputTokens})
				if err := fleet[rr%replicas].Submit(&reqs[len(reqs)-1], at); err != nil {
					b.Fatal(err)
				}
				rr++
				next = gen.Next()
			case 1:
				for _, r := range fleet {
					_ = r.Metrics()
				}
				nextScrape += scrape
			}
		}
		b.ReportMetric(float64(len(reqs)), "requests/op")
	}
}
