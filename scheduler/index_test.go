package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// indexTestConfigs are the configurations whose decisions must not depend
// on indexing: every built-in profile, the seed's tree with thresholds that
// reach its other routes, and tables and profiles the fast path covers only
// in part.
var indexTestConfigs = []string{
	`{"profile": "decision-tree"}`,
	`{"profile": "decision-tree", "countRoutedSinceSnapshot": true}`,
	`{"profile": "scoring"}`,
	`{"profile": "random"}`,
	`{"profile": "round-robin"}`,
	`{"profile": "least-request"}`,
	`{"profile": "least-request", "countRoutedSinceSnapshot": true}`,
	`{"profile": "t", "plugins": [{"type": "decision-tree-filter", "name": "tree",
		"parameters": {"queueThresholdCritical": 200, "queueingThresholdLoRA": 60, "kvCacheThreshold": 0.5, "loraAffinityThreshold": 0.7}}],
		"profiles": {"t": {"filters": ["tree"], "picker": "max-score-picker"}}}`,
	`{"profile": "t", "plugins": [{"type": "decision-tree-filter", "name": "tree", "parameters": {"loraAffinityThreshold": 0.5}}],
		"profiles": {"t": {"filters": ["tree"], "picker": "random-picker"}}, "countRoutedSinceSnapshot": true}`,
	// A table of its own: least-kv first (over several queue lengths),
	// capacity after lora-affinity, low-queue at the end.
	`{"profile": "t", "plugins": [
		{"type": "has-capacity-filter", "name": "cap", "parameters": {"queueThreshold": 20}},
		{"type": "low-queue-filter", "name": "lq", "parameters": {"threshold": 10}},
		{"type": "decision-tree-filter", "name": "tree", "parameters": {"steps": [
			{"name": "kv", "filter": "least-kv-cache-filter", "onSuccess": "lora", "onFailure": "lora"},
			{"name": "lora", "filter": "lora-affinity-filter", "onSuccess": "cap", "onFailure": "lq"},
			{"name": "cap", "filter": "cap", "onSuccess": "lq", "onFailure": "drop"},
			{"name": "lq", "filter": "lq", "onSuccess": "done", "onFailure": "done"}],
			"entries": {"critical": "lq", "standard": "kv", "sheddable": "cap"}}}],
		"profiles": {"t": {"filters": ["tree"], "picker": "weighted-random-picker"}}}`,
	`{"profile": "decision-tree", "byCriticality": {"critical": "least-request", "sheddable": "round-robin"}}`,
	`{"profile": "scoring", "countRoutedSinceSnapshot": true}`,
	// Scorers in another order, other weights, no shed-filter; and a
	// shed-filter of its own with only some scorers.
	`{"profile": "s", "profiles": {"s": {"scorers": [{"scorer": "running-requests-scorer", "weight": 0.5},
		{"scorer": "lora-affinity-scorer", "weight": 3}, {"scorer": "kv-cache-scorer", "weight": 1}, {"scorer": "queue-scorer", "weight": 1}],
		"picker": "max-score-picker"}}}`,
	`{"profile": "s", "plugins": [{"type": "shed-filter", "name": "shed", "parameters": {"queueThreshold": 2, "kvCacheThreshold": 0.5}}],
		"profiles": {"s": {"filters": ["shed"], "scorers": [{"scorer": "queue-scorer", "weight": 1}, {"scorer": "lora-affinity-scorer", "weight": 1}],
		"picker": "max-score-picker"}}}`,
}

// fleetShape varies the snapshots so every branch and tie pattern shows up.
type fleetShape int

const (
	shapeRandom    fleetShape = iota // randomSnapshot: queues over every threshold
	shapeIdle                        // everything at 0: one big tie
	shapeQuantised                   // few distinct queue and KV values: many ties
	shapeQueued                      // every queue past the low-queue threshold
	shapeOdd                         // NaN and -0 KV use, empty adapter names
	numShapes
)

func shapedSnapshot(r *rand.Rand, n int, shape fleetShape) *Snapshot {
	snap := randomSnapshot(r, n)
	for i := range snap.Endpoints {
		m := &snap.Endpoints[i].Metrics
		switch shape {
		case shapeIdle:
			m.WaitingQueueSize, m.RunningQueueSize, m.KVCacheUsage = 0, 0, 0
		case shapeQuantised:
			m.WaitingQueueSize = r.IntN(3) * 3
			m.RunningQueueSize = r.IntN(4)
			m.KVCacheUsage = float64(r.IntN(5)) / 4
		case shapeQueued:
			m.WaitingQueueSize = 129 + r.IntN(3*n+10)
		case shapeOdd:
			switch r.IntN(4) {
			case 0:
				m.KVCacheUsage = math.NaN()
			case 1:
				m.KVCacheUsage = math.Copysign(0, -1)
			case 2:
				m.ActiveModels = append(m.ActiveModels, "")
			case 3:
				if r.IntN(40) == 0 { // values the fast paths leave to the plugins
					m.KVCacheUsage = math.Inf(1)
				}
			}
		}
	}
	return snap
}

// copySnapshot gives the twin its own endpoints (Observe writes them).
func copySnapshot(s *Snapshot) *Snapshot {
	return &Snapshot{Endpoints: slices.Clone(s.Endpoints), Time: s.Time}
}

// TestIndexedDecisionsEqualScanned runs the same requests, Observe calls,
// in-place changes and clock through two Schedulers that differ only in
// indexing, each on its own copy of the snapshot, and requires identical
// results: same endpoint, outcome, path and stale count, draw for draw.
func TestIndexedDecisionsEqualScanned(t *testing.T) {
	var fast, decisions int
	for ci, cfg := range indexTestConfigs {
		for shape := range numShapes {
			t.Run(fmt.Sprintf("config=%d/shape=%d", ci, shape), func(t *testing.T) {
				r := newRand(uint64(100*ci) + uint64(shape))
				for trial := range 6 {
					n := 1 + r.IntN(260)
					if trial == 0 {
						n = 1
					}
					f, d := runTwins(t, r, cfg, n, shape)
					fast += f
					decisions += d
				}
			})
		}
	}
	// The fast paths must have decided most of it (the rest: profiles they
	// do not cover, and snapshots with values they refuse).
	require.Greater(t, fast, decisions/2, "fast decisions %d of %d", fast, decisions)
}

// runTwins plays one random scenario on an indexed and a scanning
// Scheduler and returns how many decisions the fast path made.
func runTwins(t *testing.T, r *rand.Rand, cfg string, n int, shape fleetShape) (fastDecisions, decisions int) {
	t.Helper()
	c := newTwinClock(r)
	clock, staleAfter := c.read, c.staleAfter
	seed, failOpen := r.Uint64(), r.IntN(2) == 0
	opts := func(minEndpoints int) Options {
		return Options{Rand: rand.NewPCG(seed, 7), Now: clock, StaleAfter: staleAfter, FailOpen: failOpen, IndexMinEndpoints: minEndpoints}
	}
	indexed := newScheduler(t, cfg, opts(1))
	indexed.index.eager = r.IntN(2) == 0 // rebuild at once, or on the second look
	scanned := newScheduler(t, cfg, opts(-1))

	base := shapedSnapshot(r, n, shape)
	stamp := func(m *Metrics) {
		m.UpdateTime = c.now.Add(-time.Duration(r.IntN(3000)) * time.Millisecond)
	}
	for i := range base.Endpoints {
		stamp(&base.Endpoints[i].Metrics)
	}
	a, b := base, copySnapshot(base)
	models := []string{"base", adapterName(0), adapterName(1), adapterName(2), adapterName(r.IntN(10)), "", "nowhere"}
	var lastA, lastB Result
	var lastReq *Request
	for step := range 150 {
		switch k := r.IntN(20); {
		case k < 12: // a decision
			req := &Request{Model: models[r.IntN(len(models))], Criticality: Criticality(r.IntN(4))}
			if req.Criticality == 3 {
				req.Criticality = 7
			}
			if r.IntN(4) == 0 {
				req.TargetModel = adapterName(r.IntN(10))
			}
			req.Admitted = r.IntN(5) == 0 // flow control let it go
			before := indexed.index.decisions
			lastA, lastB, lastReq = indexed.Schedule(req, a), scanned.Schedule(req, b), req
			requireSameResult(t, step, lastA, lastB)
			decisions++
			fastDecisions += indexed.index.decisions - before
		case k < 13:
			ra, rb := indexed.LeastLoaded(a), scanned.LeastLoaded(b)
			requireSameResult(t, step, ra, rb)
		case k < 15: // Observe the last decision
			if lastReq != nil {
				indexed.Observe(lastReq, lastA)
				scanned.Observe(lastReq, lastB)
				lastReq = nil
			}
		case k < 18 && r.IntN(4) == 0: // a run of endpoints rewritten together
			lo := r.IntN(n)
			hi := lo + 1 + r.IntN(n-lo)
			for i := lo; i < hi; i++ {
				m := shapedSnapshot(r, 1, shape).Endpoints[0].Metrics
				if r.IntN(2) == 0 {
					m = a.Endpoints[i].Metrics
				}
				stamp(&m)
				a.Endpoints[i].Metrics, b.Endpoints[i].Metrics = m, m
			}
			a.MetricsChangedRange(lo, hi)
		case k < 18: // fresh metrics for a few endpoints, in place
			heartbeat := r.IntN(3) == 0 // the same values, scraped again
			for range 1 + r.IntN(4) {
				i := r.IntN(n)
				m := shapedSnapshot(r, 1, shape).Endpoints[0].Metrics
				if heartbeat {
					m = a.Endpoints[i].Metrics
				}
				stamp(&m)
				a.Endpoints[i].Metrics, b.Endpoints[i].Metrics = m, m
				a.MetricsChanged(i)
			}
		case k < 19: // the clock moves (endpoints go stale)
			c.now = c.now.Add(time.Duration(r.IntN(1500)) * time.Millisecond)
		default: // a new snapshot, or the same one changed wholesale
			next := shapedSnapshot(r, n, shape)
			for i := range next.Endpoints {
				stamp(&next.Endpoints[i].Metrics)
			}
			if r.IntN(2) == 0 {
				a, b = next, copySnapshot(next)
			} else {
				copy(a.Endpoints, next.Endpoints)
				copy(b.Endpoints, next.Endpoints)
				a.Changed()
			}
			lastReq = nil
		}
	}
	return fastDecisions, decisions
}

// twinClock is the twins' shared clock, and the StaleAfter they use (0 or
// 2 s, drawn).
type twinClock struct {
	now        time.Time
	staleAfter time.Duration
}

func newTwinClock(r *rand.Rand) *twinClock {
	c := &twinClock{now: time.Unix(10_000, 0)}
	if r.IntN(2) == 0 {
		c.staleAfter = 2 * time.Second
	}
	return c
}

func (c *twinClock) read() time.Time { return c.now }

func requireSameResult(t *testing.T, step int, a, b Result) {
	t.Helper()
	require.Equal(t, b.Index, a.Index, "step %d: index (scanned %+v)", step, b)
	require.Equal(t, b.Outcome, a.Outcome, "step %d: outcome", step)
	require.Equal(t, b.Path, a.Path, "step %d: path", step)
	require.Equal(t, b.Profile, a.Profile, "step %d: profile", step)
	require.Equal(t, b.Stale, a.Stale, "step %d: stale", step)
	require.Equal(t, a.Index >= 0, a.Endpoint != nil)
}

// indexedTree returns a decision-tree scheduler that indexes from the
// first endpoint, a 300-endpoint snapshot and a request for one adapter:
// the setting of the index rebuild tests.
func indexedTree(t *testing.T) (*Scheduler, *Snapshot, *Request) {
	t.Helper()
	o := seeded(1)
	o.IndexMinEndpoints = 1
	s := newScheduler(t, `{"profile": "decision-tree"}`, o)
	return s, randomSnapshot(newRand(5), 300), &Request{Model: adapterName(1), Criticality: Critical}
}

// TestIndexRebuildWaitsForASecondDecision: a rebuild costs a few scans, so
// the first decision after a wholesale change scans and the second, on
// the same state, builds the index and uses it; changes to a few
// endpoints are applied without a rebuild.
func TestIndexRebuildWaitsForASecondDecision(t *testing.T) {
	s, snap, req := indexedTree(t)
	x := s.index
	decide := func() { s.Schedule(req, snap) }

	decide()
	require.Equal(t, 0, x.rebuilds, "first look at a new snapshot: scanned")
	require.Equal(t, 0, x.decisions)
	decide()
	require.Equal(t, 1, x.rebuilds, "second look: built")
	require.Equal(t, 1, x.decisions)

	snap.Endpoints[3].Metrics.WaitingQueueSize++
	snap.MetricsChanged(3)
	decide()
	require.Equal(t, 1, x.rebuilds, "one endpoint changed: updated, not rebuilt")
	require.Equal(t, 1, x.updates)
	require.Equal(t, 2, x.decisions)

	snap.Changed()
	decide()
	snap.Changed()
	decide()
	require.Equal(t, 1, x.rebuilds, "changes faster than decisions: scanned")
	decide()
	require.Equal(t, 2, x.rebuilds)
	require.Equal(t, 3, x.decisions)
}

// Prepare applies a few endpoints' changes outside a decision, so the next
// decision has none left to apply, and decides the same as without it;
// it leaves churn and new snapshots to decisions and counts no look.
func TestPrepareAppliesFewChangesOutsideADecision(t *testing.T) {
	s, snap, req := indexedTree(t)
	twin, twinSnap, _ := indexedTree(t)
	x := s.index
	s.Prepare(snap)
	require.Equal(t, 0, x.rebuilds, "no index yet: Prepare builds none")
	both := func() {
		a, b := s.Schedule(req, snap), twin.Schedule(req, twinSnap)
		require.Equal(t, b.Index, a.Index)
		require.Equal(t, b.Path, a.Path)
	}
	both()
	both()
	require.Equal(t, 1, x.rebuilds)
	for round := range 20 {
		for _, sn := range []*Snapshot{snap, twinSnap} {
			i := (round * 7) % len(sn.Endpoints)
			sn.Endpoints[i].Metrics.WaitingQueueSize += round%3 + 1
			sn.Endpoints[i].Metrics.KVCacheUsage = float64(round%10) / 10
			sn.MetricsChanged(i)
		}
		updates, looks := x.updates, x.looks
		s.Prepare(snap)
		require.Equal(t, looks, x.looks, "Prepare is not a look")
		require.Equal(t, snap.changes.gen, x.gen, "the change applied")
		require.GreaterOrEqual(t, x.updates, updates)
		updates = x.updates
		both()
		require.Equal(t, updates, x.updates, "round %d: nothing left for the decision", round)
	}
	require.Equal(t, 1, x.rebuilds)

	// Churn: Prepare leaves it to the decision.
	for i := range snap.Endpoints {
		snap.Endpoints[i].Metrics.RunningQueueSize++
		snap.MetricsChanged(i)
		twinSnap.Endpoints[i].Metrics.RunningQueueSize++
		twinSnap.MetricsChanged(i)
	}
	gen := x.gen
	s.Prepare(snap)
	require.Equal(t, gen, x.gen, "churn is not applied one by one")
	both()
	snap.Changed()
	twinSnap.Changed()
	gen = x.gen
	s.Prepare(snap)
	require.Equal(t, gen, x.gen)
	both()
	both()
}

// TestIndexBuildsUnderMetricsChurn: an owner that reports one endpoint's
// metrics between every two decisions (flow control's room count does)
// still gets an index: the rebuild after a new or Changed snapshot waits
// for a second look at the same endpoints, not at the same metrics, since
// metric changes after the build are applied one by one.
func TestIndexBuildsUnderMetricsChurn(t *testing.T) {
	s, snap, req := indexedTree(t)
	x := s.index
	for i := 0; i < 4; i++ {
		s.Schedule(req, snap)
		snap.Endpoints[i].Metrics.WaitingQueueSize++
		snap.MetricsChanged(i)
	}
	require.Equal(t, 1, x.rebuilds, "built on the second look despite the churn")
	require.Equal(t, 3, x.decisions, "every decision after the build uses it")

	snap.Changed()
	for i := 0; i < 3; i++ {
		s.Schedule(req, snap)
		snap.Endpoints[i].Metrics.WaitingQueueSize++
		snap.MetricsChanged(i)
	}
	require.Equal(t, 2, x.rebuilds, "a Changed snapshot is rebuilt on its second look")
	require.Equal(t, 5, x.decisions)

	// More metric changes between two decisions than are worth applying
	// one by one still wait for quiet looks: churn that came again after
	// one decision waits for churnBuildLooks of them.
	for round := 0; round < 2; round++ {
		for i := range snap.Endpoints {
			snap.Endpoints[i].Metrics.WaitingQueueSize++
			snap.MetricsChanged(i)
		}
		s.Schedule(req, snap)
	}
	require.Equal(t, 2, x.rebuilds, "changes faster than decisions: scanned")
	for range churnBuildLooks - 2 {
		s.Schedule(req, snap)
	}
	require.Equal(t, 2, x.rebuilds, "fewer than churnBuildLooks quiet looks")
	s.Schedule(req, snap)
	require.Equal(t, 3, x.rebuilds)
}

// TestIndexedDecisionsAllocateNothing: once the index and its orders are
// built, decisions, Observe and in-place changes allocate nothing.
func TestIndexedDecisionsAllocateNothing(t *testing.T) {
	for _, cfg := range []string{`{"profile": "decision-tree", "countRoutedSinceSnapshot": true}`, `{"profile": "least-request"}`,
		`{"profile": "scoring", "countRoutedSinceSnapshot": true}`, `{"profile": "prefix-aware"}`} {
		o := seeded(1)
		o.IndexMinEndpoints = 1
		s := newScheduler(t, cfg, o)
		s.index.eager = true
		r := newRand(9)
		snap := randomSnapshot(r, 500)
		reqs := benchRequests()
		step := func(i int) {
			req := reqs[i%len(reqs)]
			s.Observe(req, s.Schedule(req, snap))
			drift(r, &snap.Endpoints[i*7%500].Metrics)
			snap.MetricsChanged(i * 7 % 500)
			s.LeastLoaded(snap)
		}
		for i := range 5000 { // warm up: every order and scratch buffer at its size
			step(i)
		}
		i := 0
		require.Zero(t, testing.AllocsPerRun(2000, func() { step(i); i++ }), cfg)
	}
}

// TestMetricsChangedBeforeIndexing costs nothing: a snapshot no Scheduler
// has indexed keeps no change log.
func TestMetricsChangedBeforeIndexing(t *testing.T) {
	snap := randomSnapshot(newRand(1), 10)
	require.Zero(t, testing.AllocsPerRun(100, func() { snap.MetricsChanged(3); snap.Changed() }))
	require.Nil(t, snap.changes.ring)
	require.Zero(t, snap.changes.gen)
}

// TestIndexNotRebuiltForChurnFasterThanDecisions: when most endpoints'
// metrics are rewritten between every two or three decisions (a router
// re-reading a relay that moved most of the fleet), each rebuild would be
// used by one decision at most: the decisions scan instead, as they are
// the same either way. Once the churn leaves churnBuildLooks decisions to
// one state, the index is built and used again.
func TestIndexNotRebuiltForChurnFasterThanDecisions(t *testing.T) {
	o := seeded(1)
	o.IndexMinEndpoints = 1
	s := newScheduler(t, `{"profile": "decision-tree"}`, o)
	scan := newScheduler(t, `{"profile": "decision-tree"}`, seeded(1))
	scan.indexFrom = -1
	r := newRand(9)
	snap := randomSnapshot(r, 300)
	req := &Request{Model: adapterName(1), Criticality: Critical}
	x := s.index
	decide := func(step int) {
		t.Helper()
		requireSameResult(t, step, s.Schedule(req, snap), scan.Schedule(req, snap))
	}
	for k := range 8 { // a quiet start: built on the second look
		decide(k)
	}
	require.Equal(t, 1, x.rebuilds)
	for round := range 30 {
		for i := range snap.Endpoints {
			drift(r, &snap.Endpoints[i].Metrics)
			snap.MetricsChanged(i)
		}
		for k := range 2 + round%2 { // two or three decisions per change
			decide(100*round + k)
		}
	}
	require.LessOrEqual(t, x.rebuilds, 2, "churn between every few decisions: scanned, not rebuilt each time")
	before, used := x.rebuilds, x.decisions
	for k := range churnBuildLooks {
		decide(10_000 + k)
	}
	require.Equal(t, before+1, x.rebuilds, "the churn stopped: built within churnBuildLooks looks")
	require.Greater(t, x.decisions, used, "and used")
}

// TestMetricsChangedRangeIsEachEndpoint: a range tells an index what a
// MetricsChanged call per endpoint would, and one longer than the ring
// advances the generation past it (the index rebuilds either way).
func TestMetricsChangedRangeIsEachEndpoint(t *testing.T) {
	for _, run := range [][2]int{{0, 1}, {3, 40}, {250, 300}, {0, 75}, {10, 300}, {5, 5}} {
		a, b := randomSnapshot(newRand(3), 300), randomSnapshot(newRand(3), 300)
		a.identity()
		b.identity()
		for i := range 70 { // wrap the ring once first
			a.MetricsChanged(i % 300)
			b.MetricsChanged(i % 300)
		}
		a.MetricsChangedRange(run[0], run[1])
		for i := run[0]; i < run[1]; i++ {
			b.MetricsChanged(i)
		}
		require.Equal(t, b.changes.gen, a.changes.gen, "run %v", run)
		require.Equal(t, b.changes.all, a.changes.all, "run %v", run)
		if run[1]-run[0] <= len(b.changes.ring) {
			require.Equal(t, b.changes.ring, a.changes.ring, "run %v", run)
		}
	}
	s := randomSnapshot(newRand(3), 10)
	s.identity()
	s.MetricsChangedRange(5, 11) // past the end: anything may have changed
	require.Equal(t, s.changes.gen, s.changes.all)
}

// TestFlatDecisionsUnderChurnEqualScanned: relays that rewrite most
// endpoints between every one to three decisions (more changes than the
// index applies one by one) leave the index flat, deciding on its values
// without orders; the decisions, draws and paths must stay a scanning
// Scheduler's, across every configuration, fleet shape and staleness, and
// once the churn stops the orders take over.
func TestFlatDecisionsUnderChurnEqualScanned(t *testing.T) {
	flatDecisions := 0
	for ci, cfg := range indexTestConfigs {
		for shape := range numShapes {
			t.Run(fmt.Sprintf("config=%d/shape=%d", ci, shape), func(t *testing.T) {
				r := newRand(uint64(1000*ci) + uint64(shape))
				n := 200 + r.IntN(400)
				c := newTwinClock(r)
				monotonic := shape%2 == 1 // a clock with monotonic readings, and update times with or without them
				if monotonic {
					c.now = time.Now()
				}
				seed := r.Uint64()
				opts := func(minEndpoints int) Options {
					return Options{Rand: rand.NewPCG(seed, 7), Now: c.read, StaleAfter: c.staleAfter, FailOpen: true, IndexMinEndpoints: minEndpoints}
				}
				indexed, scanned := newScheduler(t, cfg, opts(1)), newScheduler(t, cfg, opts(-1))
				x := indexed.index
				stamp := func(m *Metrics) {
					m.UpdateTime = c.now.Add(-time.Duration(r.IntN(3000)) * time.Millisecond)
					if monotonic && r.IntN(3) == 0 {
						m.UpdateTime = m.UpdateTime.Round(0)
					}
				}
				a := shapedSnapshot(r, n, shape)
				for i := range a.Endpoints {
					stamp(&a.Endpoints[i].Metrics)
				}
				b := copySnapshot(a)
				models := []string{"base", adapterName(0), adapterName(1), adapterName(r.IntN(10)), "", "nowhere"}
				decide := func(step int) {
					req := &Request{Model: models[r.IntN(len(models))], Criticality: Criticality(r.IntN(3)), Admitted: r.IntN(5) == 0}
					before := x.decisions
					var ra, rb Result
					if r.IntN(8) == 0 {
						ra, rb = indexed.LeastLoaded(a), scanned.LeastLoaded(b)
					} else {
						ra, rb = indexed.Schedule(req, a), scanned.Schedule(req, b)
					}
					requireSameResult(t, step, ra, rb)
					if x.flat && x.decisions > before {
						flatDecisions++
					}
					if r.IntN(3) == 0 && ra.Outcome == Routed { // Observe moves what it counts
						indexed.Observe(req, ra)
						scanned.Observe(req, rb)
					}
				}
				for round := range 40 {
					// A relay: blocks of two, most rewritten (drifted, some
					// redrawn, some only given a new time).
					kneeRelay(r, shape, stamp, []*Snapshot{a, b}, a)
					if r.IntN(10) == 0 {
						c.now = c.now.Add(time.Duration(r.IntN(1500)) * time.Millisecond)
					}
					for k := range 1 + r.IntN(3) {
						decide(100*round + k)
					}
					if round%13 == 12 { // quiet for a while: the orders take over
						for k := range churnBuildLooks + 2 {
							decide(100*round + 50 + k)
						}
						require.False(t, x.flat, "quiet looks: the orders are built")
					}
				}
			})
		}
	}
	require.Greater(t, flatDecisions, 1000, "flat decisions")
}

// kneeRelay rewrites snapshots (copies of one another) as a relay at the
// knee's change rate does: 82 % of the blocks of two endpoints, each
// endpoint's metrics redrawn, drifted or only given a new time (stamp),
// and each block reported to the snapshots in told with one
// MetricsChangedRange.
func kneeRelay(r *rand.Rand, shape fleetShape, stamp func(*Metrics), snaps []*Snapshot, told ...*Snapshot) {
	n := len(snaps[0].Endpoints)
	for blk := 0; 2*blk < n; blk++ {
		if r.IntN(100) >= 82 {
			continue
		}
		hi := min(2*blk+2, n)
		for i := 2 * blk; i < hi; i++ {
			m := snaps[0].Endpoints[i].Metrics
			switch r.IntN(4) {
			case 0:
				m = shapedSnapshot(r, 1, shape).Endpoints[0].Metrics
			case 1, 2:
				drift(r, &m)
			}
			stamp(&m)
			for _, s := range snaps {
				s.Endpoints[i].Metrics = m
			}
		}
		for _, s := range told {
			s.MetricsChangedRange(2*blk, hi)
		}
	}
}

// TestFreshAtIsNotBefore: the flat reads' freshness test is
// !t.Before(oldest) for times with and without monotonic readings on
// either side, around oldest to the nanosecond and second, far from it
// (the zero Time, years away), at and across the seconds' clamp (2³² s
// from oldest, where the clamp's bounds saturate near the int64 limits),
// and at the extremes time.Unix gives (seconds that wrap or come near
// the limits of Time's seconds since year 1).
func TestFreshAtIsNotBefore(t *testing.T) {
	const unixToInternal = 62_135_596_800 // Time's seconds at the Unix epoch (they count from year 1)
	extremes := []time.Time{
		time.Unix(math.MaxInt64, 0), time.Unix(math.MinInt64, 0), time.Unix(1<<62, 0), time.Unix(-1<<62, 0),
		time.Unix(math.MaxInt64-unixToInternal, 999_999_999),      // the largest seconds
		time.Unix(math.MaxInt64-unixToInternal+1, 0),              // wraps to the smallest
		time.Unix(math.MaxInt64-unixToInternal-1<<32, 0),          // the clamp's upper bound saturates from here
		time.Unix(math.MaxInt64-unixToInternal+1+1<<32, 0),        // and the lower one up to here
		time.Unix(math.MinInt64, 0).Add(-1 << 63),                 // saturated by Add
		time.Unix(math.MaxInt64-unixToInternal, 0).Add(1<<63 - 1), // saturated by Add
	}
	r := newRand(3)
	now := time.Now()
	bases := append([]time.Time{now, now.Round(0), time.Unix(10_000, 0), time.Unix(0, 0), time.Unix(-5, 999_999_999), {}}, extremes...)
	const clampEdge = 1 << 32 * time.Second
	offsets := []time.Duration{0, 1, -1, time.Second, -time.Second, time.Second - 1, 1 - time.Second, 999_999_999, -999_999_999,
		2 * time.Second, time.Hour, -time.Hour, 1<<62 - 1, -1 << 62,
		clampEdge, -clampEdge, clampEdge + 1, clampEdge - 1, -clampEdge + 1, -clampEdge - 1, clampEdge + time.Second, -clampEdge - time.Second}
	fixed := len(offsets)
	for range 2000 {
		offsets = append(offsets, time.Duration(r.Int64N(1<<40)-1<<39), time.Duration(r.Int64N(4e9)-2e9))
	}
	checked, mono := 0, 0
	for _, base := range bases {
		for _, od := range offsets[:fixed] {
			oldest := base.Add(od)
			fa := newFreshAt(oldest)
			check := func(tm time.Time) {
				got := fa.freshWall(&tm)
				if monotonic(&tm) {
					got = fa.freshMono(&tm)
					mono++
				}
				if want := one(!tm.Before(oldest)); got != want {
					t.Fatalf("t %v (%#v), oldest %v (%#v): fresh %d, want %d", tm, tm, oldest, oldest, got, want)
				}
				checked++
			}
			for _, d := range offsets {
				for _, tm := range []time.Time{oldest.Add(d), oldest.Add(d).Round(0), time.Time{}, time.Unix(oldest.Unix()+int64(d)/1e9, int64(d%1e9))} {
					check(tm)
				}
			}
			for _, tm := range extremes {
				check(tm)
				check(tm.Add(1))
				check(tm.Add(-1))
			}
		}
	}
	require.Positive(t, mono)
	require.True(t, monotonic(&now))
	plain := now.Round(0)
	require.False(t, monotonic(&plain))
	t.Logf("%d comparisons, %d with a monotonic reading", checked, mono)
}

// TestEqualStringIsEquality: the flat LoRA row's comparison agrees with
// == for every length around its 8-to-16-byte words and a difference at
// every position.
func TestEqualStringIsEquality(t *testing.T) {
	for n := range 24 {
		a := []byte(strings.Repeat("x", n))
		for i := 0; i < n; i++ {
			a[i] = byte('a' + i)
		}
		s := string(a)
		require.True(t, equalString(s, strings.Clone(s)), "len %d", n)
		require.False(t, equalString(s, s+"y"), "len %d", n)
		for i := range n {
			b := slices.Clone(a)
			b[i]++
			require.False(t, equalString(s, string(b)), "len %d, byte %d", n, i)
		}
	}
}

// TestFlatDecisionsAllocateNothing: under churn faster than decisions
// every decision is flat, and once its lists have grown to the snapshot
// none allocates.
func TestFlatDecisionsAllocateNothing(t *testing.T) {
	for _, cfg := range []string{`{"profile": "decision-tree"}`, `{"profile": "least-request"}`, `{"profile": "random"}`} {
		o := seeded(1)
		o.IndexMinEndpoints = 1
		s := newScheduler(t, cfg, o)
		r := newRand(9)
		snap := randomSnapshot(r, 500)
		reqs := benchRequests()
		flat := 0
		step := func(i int) {
			for e := range snap.Endpoints {
				drift(r, &snap.Endpoints[e].Metrics)
			}
			snap.MetricsChangedRange(0, len(snap.Endpoints))
			s.Schedule(reqs[i%len(reqs)], snap)
			flat += one(s.index.flat)
			s.LeastLoaded(snap)
		}
		for i := range 100 {
			step(i)
		}
		require.Greater(t, flat, 90, cfg)
		i := 0
		require.Zero(t, testing.AllocsPerRun(200, func() { step(i); i++ }), cfg)
	}
}
