package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// idleRelays replays the scale bench's idle fleet at 5,000 endpoints
// (two per agent, heartbeats only, every agent beating every 10th relay,
// a relay every 50 ms, the owner re-reading and calling Prepare after
// each) with profile config and the bench's request (its prompt when
// prefix-aware), each decision checked against a scanning Scheduler's,
// and returns the decisions made and those the index's orders made (not
// flat). Every fullEvery relays, one relay rewrites every endpoint (the
// receiver's full relay). perRelay gives the decisions after relay k.
func idleRelays(t *testing.T, config string, relays, fullEvery int, perRelay func(k int) int) (decisions, indexed int) {
	t.Helper()
	const n = 5000
	h, err := prefix.NewHasher(prefix.HashConfig{})
	require.NoError(t, err)
	require.NoError(t, h.HashMessages("chat", nil, nil, []byte(`[{"role":"user","content":"Say hello in one word."}]`)))
	blocks, key := slices.Clone(h.Blocks()), h.Key()
	idx, err := prefix.NewIndex(prefix.IndexConfig{}, nil)
	require.NoError(t, err)
	tracker := NewPrefixTracker(idx)

	r := newRand(14)
	snap := scaleSnapshot(r, n)
	now := time.Unix(10_000, 0)
	for i := range snap.Endpoints {
		snap.Endpoints[i].Metrics.UpdateTime = now.Add(-time.Duration(r.IntN(500)) * time.Millisecond)
	}
	o := seeded(1)
	o.StaleAfter = 2 * time.Second
	o.Now = func() time.Time { return now }
	s := newScheduler(t, config, o)
	scan := newScheduler(t, config, func() Options { o := o; o.Rand = seeded(1).Rand; o.IndexMinEndpoints = -1; return o }())
	twin := copySnapshot(snap)
	var req, twinReq Request
	twinTracker := NewPrefixTracker(idx)
	decide := func(step int) {
		req = Request{Model: "chat", TargetModel: "chat", Criticality: Standard}
		twinReq = req
		tracker.Prepare(&req, snap, blocks, key)
		twinTracker.Prepare(&twinReq, twin, blocks, key)
		requireSameResult(t, step, s.Schedule(&req, snap), scan.Schedule(&twinReq, twin))
	}
	x := s.index
	for k := range relays {
		now = now.Add(50 * time.Millisecond)
		full := fullEvery > 0 && k%fullEvery == fullEvery-1
		for agent := 0; agent < n/2; agent++ {
			if !full && agent%10 != k%10 {
				continue
			}
			for _, sn := range []*Snapshot{snap, twin} {
				for i := 2 * agent; i < 2*agent+2; i++ {
					sn.Endpoints[i].Metrics.UpdateTime = now.Add(-time.Duration(i%7) * time.Millisecond)
				}
			}
			if !full {
				snap.MetricsChangedRange(2*agent, 2*agent+2)
			}
		}
		if full {
			snap.MetricsChangedRange(0, n)
		}
		s.Prepare(snap)
		for j := range perRelay(k) {
			before := x.decisions
			decide(100*k + j)
			decisions++
			if x.decisions > before && !x.flat {
				indexed++
			}
		}
	}
	require.LessOrEqual(t, x.rebuilds, 1+relays/fullEvery, "one build at the start and one per full relay")
	return decisions, indexed
}

// TestIdleRelaysKeepTheIndex: heartbeats that retime a tenth of 5,000
// endpoints per relay are few enough to apply one by one, so once the
// index is built every decision uses it; a full relay (every endpoint
// rewritten: more than the index applies one by one) costs one decision
// without the orders and one rebuild, after which the index follows the
// heartbeats again, whether decisions come once or twice per relay and
// whether the decision after the full relay is made flat or scanned.
func TestIdleRelaysKeepTheIndex(t *testing.T) {
	const relays, fullEvery = 800, 200
	for _, config := range []string{`{"profile": "prefix-aware"}`, `{"profile": "decision-tree"}`} {
		for _, tc := range []struct {
			name     string
			perRelay func(k int) int
		}{
			{"one-per-relay", func(int) int { return 1 }},
			{"five-per-four", func(k int) int { return 1 + min(1, k%4/3) }},
			{"two-then-one", func(k int) int { return 2 - k%2 }},
		} {
			t.Run(config+"/"+tc.name, func(t *testing.T) {
				decisions, indexed := idleRelays(t, config, relays, fullEvery, tc.perRelay)
				t.Logf("%d decisions, %d by the index's orders", decisions, indexed)
				// The start (a new snapshot: scanned before the build) and
				// each full relay leave one decision to a scan.
				require.GreaterOrEqual(t, indexed, decisions-1-relays/fullEvery)
			})
		}
	}
}
