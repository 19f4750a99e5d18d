package scheduler

import (
	"fmt"
	"testing"
)

// BenchmarkSchedule measures one decision per op for each built-in profile
// at 8, 64 and 512 endpoints. Requests rotate over 10 adapters and the
// three criticalities, so every branch of the tree is exercised.
//
//	go test -run '^$' -bench BenchmarkSchedule -benchmem ./scheduler/
func BenchmarkSchedule(b *testing.B) {
	var reqs []*Request
	for i := range 30 {
		reqs = append(reqs, &Request{Model: adapterName(i % 10), Criticality: Criticality(i % 3)})
	}
	for _, profile := range []string{"decision-tree", "scoring", "least-request", "random"} {
		for _, n := range []int{8, 64, 512} {
			b.Run(fmt.Sprintf("profile=%s/endpoints=%d", profile, n), func(b *testing.B) {
				snap := randomSnapshot(newRand(uint64(n)), n)
				s := newScheduler(b, `{"profile": "`+profile+`"}`, seeded(1))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					s.Schedule(reqs[i%len(reqs)], snap)
					i++
				}
			})
		}
	}
}

// BenchmarkLeastLoaded measures the body-less (GET /v1/models) decision.
func BenchmarkLeastLoaded(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			snap := randomSnapshot(newRand(uint64(n)), n)
			s := newScheduler(b, ``, seeded(1))
			b.ReportAllocs()
			for b.Loop() {
				s.LeastLoaded(snap)
			}
		})
	}
}

// BenchmarkScheduleCounting is a decision followed by Observe with
// countRoutedSinceSnapshot on (the counts grow without a new snapshot; only
// the cost matters here).
//
//	go test -run '^$' -bench BenchmarkScheduleCounting -benchmem ./scheduler/
func BenchmarkScheduleCounting(b *testing.B) {
	var reqs []*Request
	for i := range 30 {
		reqs = append(reqs, &Request{Model: adapterName(i % 10), Criticality: Criticality(i % 3)})
	}
	for _, profile := range []string{"decision-tree", "scoring"} {
		b.Run("profile="+profile+"/endpoints=64", func(b *testing.B) {
			snap := randomSnapshot(newRand(64), 64)
			s := newScheduler(b, countingConfig(profile, true), seeded(1))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req := reqs[i%len(reqs)]
				s.Observe(req, s.Schedule(req, snap))
				i++
			}
		})
	}
}
