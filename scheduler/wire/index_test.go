package wire

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// The scheduler indexes large snapshots, and the cache rewrites its
// snapshot in place: every decision on the refreshed snapshot must equal
// the decision on a snapshot built afresh from the same shared data, for
// value changes, adapter changes, agents coming and going, and the same
// endpoint reported by two agents.
func TestDecisionAfterInPlaceRefreshEqualsFreshSnapshot(t *testing.T) {
	// values: only values move (the cache reports each rewritten endpoint);
	// mixed: also identities, counts and duplicates (the whole snapshot).
	for _, changes := range []struct {
		name  string
		kinds int
	}{{"values", 6}, {"mixed", 10}} {
		for _, profile := range []string{"decision-tree", "scoring", "least-request"} {
			t.Run(changes.name+"/"+profile, func(t *testing.T) { testInPlaceRefresh(t, profile, changes.kinds) })
		}
	}
}

func testInPlaceRefresh(t *testing.T, profile string, kinds int) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	const agents = 150 // 300 endpoints: indexed
	seq := map[string]uint64{}
	now := at(0)
	push := func(id string, n int, marker uint32) {
		seq[id]++
		eps := agentState(id, n, marker, now)
		_, err := w.Apply(st, agentPush(t, id, seq[id], now, eps), now)
		require.NoError(t, err)
	}
	for i := range agents {
		push(fmt.Sprintf("node-%03d", i), 2, uint32(i))
	}
	clock := func() time.Time { return now }
	cfg, err := scheduler.DecodeConfig([]byte(`{"profile": "` + profile + `"}`))
	require.NoError(t, err)
	newSched := func() *scheduler.Scheduler {
		s, err := scheduler.New(cfg, nil, scheduler.Options{Rand: rand.NewPCG(1, 2), Now: clock})
		require.NoError(t, err)
		return s
	}
	inPlace, fresh := newSched(), newSched()
	cache := NewCache(testKeys, Limits{})
	reqs := []*scheduler.Request{
		{Model: "sql-lora", Criticality: scheduler.Critical},
		{Model: "summary", Criticality: scheduler.Sheddable},
		{Model: "base", Criticality: scheduler.Standard},
		{Model: "tenant-1", Criticality: scheduler.Critical},
	}
	r := rand.New(rand.NewPCG(7, 7))
	for round := range 60 {
		now = now.Add(50 * time.Millisecond)
		switch k := r.IntN(kinds); {
		case k < 6: // a few agents' values move (same strings: same identity)
			for range 1 + r.IntN(5) {
				i := r.IntN(agents)
				push(fmt.Sprintf("node-%03d", i), 2, uint32(i+3*r.IntN(300)))
			}
		case k < 7: // an agent's adapters change
			push(fmt.Sprintf("node-%03d", r.IntN(agents)), 2, uint32(r.IntN(1000)))
		case k < 8: // an agent reports one more endpoint
			push(fmt.Sprintf("node-%03d", r.IntN(agents)), 3, uint32(r.IntN(1000)))
		case k < 9: // a new agent
			push(fmt.Sprintf("extra-%03d", round), 2, uint32(r.IntN(1000)))
		default: // a second agent reports another's endpoints
			id := fmt.Sprintf("node-%03d", r.IntN(agents))
			seq["twin-"+id]++
			eps := agentState(id, 2, uint32(r.IntN(1000)), now)
			_, err := w.Apply(st, agentPush(t, "twin-"+id, seq["twin-"+id], now, eps), now)
			require.NoError(t, err)
		}
		snap, _, err := cache.Refresh(st)
		require.NoError(t, err)
		other := snapshotOf(t, st)
		require.Equal(t, len(other.Endpoints), len(snap.Endpoints))
		for i, req := range reqs {
			for range 3 { // the index is built on the second look
				a, b := inPlace.Schedule(req, snap), fresh.Schedule(req, other)
				require.Equal(t, b.Index, a.Index, "round %d request %d: endpoint", round, i)
				require.Equal(t, b.Path, a.Path, "round %d request %d: path", round, i)
				require.Equal(t, b.Outcome, a.Outcome, "round %d request %d: outcome", round, i)
			}
		}
	}
}
