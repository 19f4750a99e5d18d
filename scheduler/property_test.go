package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 99)) }

func adapterName(i int) string { return fmt.Sprintf("adapter-%d", i) }

// randomSnapshot draws a fleet like the seed's benchmark (10 adapters,
// max-lora 4) with queues and KV use spread over every threshold.
func randomSnapshot(r *rand.Rand, n int) *Snapshot {
	snap := &Snapshot{Endpoints: make([]Endpoint, n)}
	for i := range snap.Endpoints {
		maxActive := r.IntN(5) // 0..4, 0 included on purpose
		var active, waiting []string
		perm := r.Perm(10)
		na := r.IntN(maxActive + 1)
		for _, a := range perm[:na] {
			active = append(active, adapterName(a))
		}
		for _, a := range perm[na : na+r.IntN(3)] {
			waiting = append(waiting, adapterName(a))
		}
		if r.IntN(10) == 0 && na > 0 { // an adapter both active and waiting
			waiting = append(waiting, active[0])
		}
		var q int
		switch r.IntN(4) {
		case 0:
			q = r.IntN(6)
		case 1:
			q = r.IntN(20)
		case 2:
			q = 100 + r.IntN(60)
		default:
			q = r.IntN(300)
		}
		snap.Endpoints[i] = Endpoint{
			ID:      EndpointID{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)},
			Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1),
			Port:    8000,
			Metrics: Metrics{
				WaitingQueueSize: q,
				RunningQueueSize: r.IntN(64),
				KVCacheUsage:     r.Float64(),
				ActiveModels:     active,
				WaitingModels:    waiting,
				MaxActiveModels:  maxActive,
			},
		}
	}
	return snap
}

// sheddableFits is the seed's "has capacity for sheddable requests" written
// out from its published numbers — a waiting queue of at most 5 and KV-cache
// use of at most 80 % — rather than through HasCapacityFilter and its
// defaults, which are the code under test. A NaN KV use compares false, as
// in the seed's Go, so it never fits.
func sheddableFits(m Metrics) bool { return m.WaitingQueueSize <= 5 && m.KVCacheUsage <= 0.8 }

// onCapacityBoundaries moves some endpoints' queue and KV use onto the
// values where "has capacity" flips (queue 5 or 6; KV exactly 0.8, just
// above it, 0, 1 or NaN), which uniform draws almost never hit.
func onCapacityBoundaries(r *rand.Rand, snap *Snapshot) {
	kvs := []float64{0, 0.8, math.Nextafter(0.8, 1), 1, math.NaN()}
	for i := range snap.Endpoints {
		m := &snap.Endpoints[i].Metrics
		if r.IntN(3) == 0 {
			m.WaitingQueueSize = 5 + r.IntN(2)
		}
		if r.IntN(3) == 0 {
			m.KVCacheUsage = kvs[r.IntN(len(kvs))]
		}
	}
}

func hasAdapter(e *Endpoint, model string) bool {
	return e.Metrics.HasActiveModel(model) || e.Metrics.HasWaitingModel(model)
}

// TestProperties checks invariants over seeded random snapshots for every
// built-in profile. The shedding invariants are judged by sheddableFits, an
// oracle independent of the filters that decide.
func TestProperties(t *testing.T) {
	for _, profile := range []string{"decision-tree", "scoring", "random", "round-robin", "least-request"} {
		t.Run(profile, func(t *testing.T) {
			s := newScheduler(t, `{"profile": "`+profile+`"}`, seeded(11))
			paths := map[string]bool{}
			for _, p := range s.Paths() {
				paths[p] = true
			}
			r := newRand(2)
			var routedOnBoundary, dropped, routedFit int
			for iter := range 3000 {
				snap := randomSnapshot(r, r.IntN(24))
				onCapacityBoundaries(r, snap)
				req := &Request{Model: adapterName(r.IntN(10)), Criticality: Criticality(r.IntN(3))}
				anyFits := false
				for i := range snap.Endpoints {
					anyFits = anyFits || sheddableFits(snap.Endpoints[i].Metrics)
				}
				res := s.Schedule(req, snap)
				require.True(t, paths[res.Path], "iteration %d: path %q not listed", iter, res.Path)
				if len(snap.Endpoints) == 0 {
					require.Equal(t, NoEndpoint, res.Outcome)
					continue
				}
				switch res.Outcome {
				case Routed:
					assertChosen(t, snap, res)
					if sheds(profile) && req.Criticality != Critical {
						m := res.Endpoint.Metrics
						require.True(t, sheddableFits(m),
							"iteration %d: %v request placed on %+v without capacity", iter, req.Criticality, m)
						routedFit++
						if m.WaitingQueueSize == 5 || m.KVCacheUsage == 0.8 {
							routedOnBoundary++
						}
					}
				case Dropped:
					require.True(t, sheds(profile))
					require.NotEqual(t, Critical, req.Criticality, "critical requests are never dropped")
					require.False(t, anyFits, "iteration %d: dropped although an endpoint had capacity", iter)
					dropped++
				default:
					t.Fatalf("iteration %d: unexpected outcome %v on a non-empty snapshot", iter, res.Outcome)
				}
			}
			if sheds(profile) {
				// The draws must reach both sides of the boundary.
				assert.Greater(t, routedOnBoundary, 50, "non-critical requests routed onto an endpoint exactly at a threshold")
				assert.Greater(t, dropped, 50, "non-critical requests dropped")
				assert.Greater(t, routedFit, 500, "non-critical requests routed")
			}
		})
	}
}

func sheds(profile string) bool { return profile == "decision-tree" || profile == "scoring" }

// TestPropertyAffinityThresholdOne: with LoraAffinityThreshold 1.0 the pick
// has the adapter whenever an endpoint that survives the filters before
// the affinity step has it. For a critical request on a fleet where every
// queue is under the low-queue threshold, that is every endpoint; for a
// sheddable one, every endpoint with capacity.
func TestPropertyAffinityThresholdOne(t *testing.T) {
	s := newScheduler(t, `{"profile": "strict", "plugins": [{"type": "decision-tree-filter", "name": "tree", "parameters": {"loraAffinityThreshold": 1}}],
		"profiles": {"strict": {"filters": ["tree"], "picker": "random-picker"}}}`, seeded(4))
	r := newRand(3)
	checked := 0
	for iter := range 5000 {
		snap := randomSnapshot(r, 1+r.IntN(16))
		for i := range snap.Endpoints {
			snap.Endpoints[i].Metrics.WaitingQueueSize %= DefaultQueueingThresholdLoRA + 1
		}
		req := &Request{Model: adapterName(r.IntN(10)), Criticality: Criticality(r.IntN(3))}
		res := s.Schedule(req, snap)
		eligible := false
		for i := range snap.Endpoints {
			e := &snap.Endpoints[i]
			if hasAdapter(e, req.Model) && (req.Criticality == Critical || sheddableFits(e.Metrics)) {
				eligible = true
			}
		}
		if !eligible || res.Outcome != Routed {
			continue
		}
		checked++
		require.True(t, hasAdapter(res.Endpoint, req.Model), "iteration %d: picked %s without %s", iter, res.Endpoint.ID.Name, req.Model)
	}
	assert.Greater(t, checked, 1000, "the property must be exercised")
}
