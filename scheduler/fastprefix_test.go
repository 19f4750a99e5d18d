package scheduler

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// TestPrefixTrackerFollowsInPlaceChanges: an owner that rewrites one
// Snapshot in place (same pointer, same Endpoints array) and says so with
// Changed gets keys read from the new identities; MetricsChanged alone
// keeps them.
func TestPrefixTrackerFollowsInPlaceChanges(t *testing.T) {
	snap := idle(3)
	idx, err := prefix.NewIndex(prefix.IndexConfig{}, nil)
	require.NoError(t, err)
	tr := NewPrefixTracker(idx)
	h, err := prefix.NewHasher(prefix.HashConfig{})
	require.NoError(t, err)
	raw, _ := json.Marshal(longPrompt("keys", 10))
	require.NoError(t, h.HashPrompt("m", nil, raw))
	keyOf := func(e *Endpoint) uint32 { return prefix.EndpointKey(e.ID.Namespace, e.ID.Name, e.Address, e.Port) }
	prepare := func() {
		req := &Request{Model: "m"}
		tr.Prepare(req, snap, h.Blocks(), h.Key())
	}

	prepare()
	require.Equal(t, keyOf(&snap.Endpoints[1]), tr.KeyOf(1))
	before := tr.KeyOf(1)

	snap.Endpoints[1].ID.Name, snap.Endpoints[1].Address = "pod-9", "10.0.0.9"
	snap.Changed()
	prepare()
	require.NotEqual(t, before, tr.KeyOf(1))
	require.Equal(t, keyOf(&snap.Endpoints[1]), tr.KeyOf(1), "identity rewritten in place, then Changed")
	require.Equal(t, keyOf(&snap.Endpoints[1]), tr.EndpointKey(&snap.Endpoints[1]))

	read := tr.keysRead
	snap.Endpoints[2].Metrics.WaitingQueueSize = 5
	snap.MetricsChanged(2)
	prepare()
	require.Equal(t, read, tr.keysRead, "new metrics: the keys stay")
}

// prefixTwin is one side of TestIndexedPrefixAwareEqualsScanned: a
// Scheduler, its own tracker and prefix index, its own copy of the
// snapshot.
type prefixTwin struct {
	s    *Scheduler
	t    *PrefixTracker
	snap *Snapshot
	res  Result
	// before is the index's decisions before the last one.
	before int
}

// foreignInfo is a PrefixInfo that is not a *PrefixTracker: the fast path
// must leave such requests to the plugins.
type foreignInfo struct{ *PrefixTracker }

// prefixTwinConfigs are the prefix-aware profiles whose decisions must not
// depend on indexing.
var prefixTwinConfigs = []string{
	`{"profile": "prefix-aware"}`,
	`{"profile": "prefix-aware", "countRoutedSinceSnapshot": true}`,
	`{"profile": "p", "plugins": [{"type": "prefix-affinity-filter", "name": "pa",
		"parameters": {"queueThreshold": 2, "kvCacheThreshold": 0.6, "minCapacity": 2, "balanceFactor": 1.1, "keepRatio": 0.5, "minReuse": 0.5}}],
		"profiles": {"p": {"filters": ["shed-filter", "pa"], "scorers": [{"scorer": "prefix-cache-scorer", "weight": 3},
		{"scorer": "queue-scorer", "weight": 1}, {"scorer": "lora-affinity-scorer", "weight": 2}], "picker": "max-score-picker"}}}`,
	`{"profile": "p", "plugins": [{"type": "prefix-affinity-filter", "name": "pa", "parameters": {"consistentHashing": false}}],
		"profiles": {"p": {"filters": ["pa"], "scorers": [{"scorer": "prefix-cache-scorer", "weight": 1},
		{"scorer": "kv-cache-scorer", "weight": 1}], "picker": "max-score-picker"}}}`,
	`{"profile": "p", "plugins": [{"type": "prefix-affinity-filter", "name": "pa",
		"parameters": {"queueThreshold": 200, "kvCacheThreshold": 1, "minCapacity": 0, "balanceFactor": 1.01, "minMatchBlocks": 1, "keepRatio": 1, "minReuse": 0.4}}],
		"profiles": {"p": {"filters": ["pa"], "scorers": [{"scorer": "running-requests-scorer", "weight": 1},
		{"scorer": "prefix-cache-scorer", "weight": 2}], "picker": "max-score-picker"}}, "countRoutedSinceSnapshot": true}`,
}

// TestIndexedPrefixAwareEqualsScanned is TestIndexedDecisionsEqualScanned
// for the prefix-aware profiles: prompts that share prefixes, each side
// recording its decisions in its own prefix index (identical while the
// decisions are), endpoints going stale, metrics rewritten in place,
// identities rewritten in place (Changed) and new snapshots. Every path
// of the filter must have been decided on the index.
func TestIndexedPrefixAwareEqualsScanned(t *testing.T) {
	var fast, decisions int
	fastPaths := map[string]int{}
	for ci, cfg := range prefixTwinConfigs {
		for shape := range numShapes {
			t.Run(fmt.Sprintf("config=%d/shape=%d", ci, shape), func(t *testing.T) {
				r := newRand(uint64(1000*ci) + uint64(shape))
				f, d := runPrefixTwins(t, r, cfg, 130+r.IntN(100), shape, twinQuiet, func(k int, o Options) *Scheduler {
					o.IndexMinEndpoints = []int{1, -1}[k]
					s := newScheduler(t, cfg, o)
					if k == 0 {
						s.index.eager = r.IntN(2) == 0
					} else {
						withoutFused(s) // the plugins themselves
					}
					return s
				}, func(tw *prefixTwin, res Result) bool { return tw.s.index.decisions > tw.before }, fastPaths)
				fast, decisions = fast+f, decisions+d
			})
		}
	}
	require.Greater(t, fast, decisions*2/3, "fast decisions %d of %d", fast, decisions)
	for _, p := range (&PrefixAffinityFilter{}).Paths() {
		require.Positive(t, fastPaths[p], "path %s decided on the index (%v)", p, fastPaths)
	}
	t.Logf("fast decisions %d of %d, by path %v", fast, decisions, fastPaths)
}

// TestFusedPrefixAwareEqualsScanned: below the index's size the fused
// prefix-aware path (fusedprefix.go) decides as the plugins do, in the
// setting of TestIndexedPrefixAwareEqualsScanned at 0 to 40 endpoints:
// the same results, random draws (the twins' sources stay in step) and
// reuse share. Every path of the filter must have been decided fused.
func TestFusedPrefixAwareEqualsScanned(t *testing.T) {
	var fused, decisions int
	paths := map[string]int{}
	for ci, cfg := range prefixTwinConfigs {
		for shape := range numShapes {
			for trial := range 3 {
				t.Run(fmt.Sprintf("config=%d/shape=%d/trial=%d", ci, shape, trial), func(t *testing.T) {
					r := newRand(uint64(1000*ci) + uint64(10*shape) + uint64(trial) + 77)
					n := []int{r.IntN(4), 4 + r.IntN(8), 12 + r.IntN(29)}[trial]
					f, d := runPrefixTwins(t, r, cfg, n, shape, twinQuiet, func(k int, o Options) *Scheduler {
						o.IndexMinEndpoints = -1
						s := newScheduler(t, cfg, o)
						if k == 1 {
							withoutFused(s)
						} else {
							require.NotNil(t, s.profiles[0].fused, "the profile has a fused path")
						}
						return s
					}, func(tw *prefixTwin, res Result) bool {
						return res.Outcome == Routed || res.Outcome == Dropped
					}, paths)
					fused, decisions = fused+f, decisions+d
				})
			}
		}
	}
	for _, p := range (&PrefixAffinityFilter{}).Paths() {
		require.Positive(t, paths[p], "path %s decided fused (%v)", p, paths)
	}
	t.Logf("decisions %d, routed or dropped %d, by path %v", decisions, fused, paths)
}

// TestPrefixAwareUnderChurnEqualsScanned: above the index's size, with
// relays rewriting most endpoints before a third of the steps, the
// prefix-aware decisions that the index declines (churn, new snapshots)
// are decided fused and the others on the index, interleaved on one
// filter's reuse share and one prefix index, with prompts that hit,
// Observe, stale endpoints and a moving clock, with and without monotonic
// readings: the results, random draws and reuse share must stay the
// plugins'. Both kinds of decision must have been many, and every path
// of the filter decided fused.
func TestPrefixAwareUnderChurnEqualsScanned(t *testing.T) {
	var fused, indexed, decisions, switches int
	paths := map[string]int{}
	for ci, cfg := range prefixTwinConfigs {
		for shape := range numShapes {
			t.Run(fmt.Sprintf("config=%d/shape=%d", ci, shape), func(t *testing.T) {
				r := newRand(uint64(1000*ci) + uint64(shape) + 555)
				n := 130 + r.IntN(500)
				last := 0    // 1: the last decision was fused, 2: indexed
				counted := 0 // the fused path's decisions counted so far
				_, d := runPrefixTwins(t, r, cfg, n, shape, twinSetting{relays: true, monotonic: shape%2 == 1}, func(k int, o Options) *Scheduler {
					o.IndexMinEndpoints = []int{1, -1}[k]
					s := newScheduler(t, cfg, o)
					if k == 0 {
						s.index.eager = r.IntN(4) == 0
						require.NotNil(t, s.profiles[0].fused)
					} else {
						withoutFused(s)
					}
					return s
				}, func(tw *prefixTwin, res Result) bool {
					kind := 0
					switch fp := tw.s.profiles[0].fused; {
					case fp.decisions > counted:
						counted = fp.decisions
						fused++
						kind = 1
					case tw.s.index.decisions > tw.before:
						indexed++
						kind = 2
					}
					if kind != 0 && last != 0 && kind != last {
						switches++
					}
					if kind != 0 {
						last = kind
					}
					return kind == 1
				}, paths)
				decisions += d
			})
		}
	}
	t.Logf("decisions %d: fused %d, indexed %d, %d switches between them; fused by path %v", decisions, fused, indexed, switches, paths)
	require.Greater(t, fused, decisions/4, "fused decisions")
	require.Greater(t, indexed, decisions/10, "indexed decisions")
	require.Greater(t, switches, 500, "indexed and fused decisions interleave")
	for _, p := range (&PrefixAffinityFilter{}).Paths() {
		require.Positive(t, paths[p], "path %s decided fused (%v)", p, paths)
	}
}

// withoutFused makes s decide every profile by its plugins below the
// index's size.
func withoutFused(s *Scheduler) {
	for _, p := range s.profiles {
		p.fused = nil
	}
}

// twinSetting is what runPrefixTwins adds to its steps.
type twinSetting struct {
	// relays: before a third of the steps, a relay rewrites 82 % of the
	// blocks of two endpoints in place (more than the index applies one
	// by one); monotonic: the clock carries a monotonic reading, as the
	// plugin's does, and two thirds of the update times too.
	relays, monotonic bool
}

var twinQuiet = twinSetting{}

// runPrefixTwins runs 600 steps of the twins' setting on n endpoints: the
// Scheduler twin k is newTwin(k, its options), twin 0 the one under test,
// twin 1 the reference; every decision of twin 0 for which counted says
// so is counted, by path, in paths. It returns the decisions counted and
// made.
func runPrefixTwins(t *testing.T, r *rand.Rand, cfg string, n int, shape fleetShape, set twinSetting, newTwin func(k int, o Options) *Scheduler,
	counted func(tw *prefixTwin, res Result) bool, paths map[string]int) (int, int) {
	h, err := prefix.NewHasher(prefix.HashConfig{})
	require.NoError(t, err)
	var fast, decisions int
	c := newTwinClock(r)
	if set.monotonic {
		c.now = time.Now()
	}
	clock, staleAfter := c.read, c.staleAfter
	stamp := func(m *Metrics) {
		m.UpdateTime = c.now.Add(-time.Duration(r.IntN(2500)) * time.Millisecond)
		if set.monotonic && r.IntN(3) == 0 {
			m.UpdateTime = m.UpdateTime.Round(0)
		}
	}
	fresh := func() *Snapshot {
		s := shapedSnapshot(r, n, shape)
		for i := range s.Endpoints {
			stamp(&s.Endpoints[i].Metrics)
		}
		return s
	}
	base := fresh()
	seed, failOpen := r.Uint64(), r.IntN(2) == 0
	twins := [2]*prefixTwin{}
	for k := range twins {
		idx, err := prefix.NewIndex(prefix.IndexConfig{}, nil)
		require.NoError(t, err)
		o := Options{Rand: rand.NewPCG(seed, 3), Now: clock, StaleAfter: staleAfter, FailOpen: failOpen}
		twins[k] = &prefixTwin{s: newTwin(k, o), t: NewPrefixTracker(idx), snap: copySnapshot(base)}
	}
	contexts := []string{longPrompt("tax law", 30), longPrompt("rust", 50), longPrompt("ops", 20), longPrompt("ops", 6), ""}
	for step := range 600 {
		if set.relays && r.IntN(3) == 0 && n > 0 {
			snaps := []*Snapshot{twins[0].snap, twins[1].snap}
			kneeRelay(r, shape, stamp, snaps, snaps...)
		}
		switch k := r.IntN(40); {
		case k < 28: // a decision
			prompt := contexts[r.IntN(len(contexts))] + fmt.Sprintf("question %d?", r.IntN(5))
			if (step/200)%2 == 1 && r.IntN(20) > 0 { // phases of unique prompts: reuse falls below minReuse
				prompt = fmt.Sprintf("%d: a prompt nobody sent before, long enough for a few blocks of hashes. ", r.Uint64()) + longPrompt("once", 3)
			}
			raw, _ := json.Marshal(prompt)
			model := []string{"base", adapterName(r.IntN(10)), ""}[r.IntN(3)]
			require.NoError(t, h.HashPrompt(model, nil, raw))
			blocks := slices.Clone(h.Blocks())
			crit := Criticality(r.IntN(3))
			admitted := r.IntN(6) == 0
			kind := r.IntN(16) // 0: no prompt; 1: not a tracker; 2: no blocks
			for _, tw := range twins {
				req := &Request{Model: model, Criticality: crit, Admitted: admitted}
				if kind%4 == 0 {
					req.TargetModel = adapterName(kind % 10)
				}
				switch kind {
				case 0:
				case 2:
					tw.t.Prepare(req, tw.snap, nil, h.Key())
				default:
					tw.t.Prepare(req, tw.snap, blocks, h.Key())
				}
				if kind == 1 {
					req.Prefix = foreignInfo{tw.t}
				}
				tw.before = tw.s.index.decisions
				tw.res = tw.s.Schedule(req, tw.snap)
				if tw == twins[0] && kind != 1 && counted(tw, tw.res) {
					fast++
					paths[tw.res.Path]++
				}
				if tw.res.Outcome == Routed && tw.res.Index >= 0 {
					tw.s.Observe(req, tw.res)
					if kind != 0 {
						tw.t.Routed(tw.res.Index, prefixT0.Add(time.Duration(step)*time.Second))
					}
				}
			}
			requireSameResult(t, step, twins[0].res, twins[1].res)
			require.Equal(t, twins[1].s.rand.Uint64(), twins[0].s.rand.Uint64(), "step %d: random draws", step)
			for p, prof := range twins[0].s.profiles {
				for f, pl := range prof.Filters {
					if pa, ok := pl.(*PrefixAffinityFilter); ok {
						require.Equal(t, twins[1].s.profiles[p].Filters[f].(*PrefixAffinityFilter).Reuse(), pa.Reuse(), "step %d: reuse share", step)
					}
				}
			}
			decisions++
		case k < 34: // fresh metrics for a few endpoints, in place
			if n == 0 {
				continue
			}
			for range 1 + r.IntN(4) {
				i := r.IntN(n)
				m := shapedSnapshot(r, 1, shape).Endpoints[0].Metrics
				stamp(&m)
				for _, tw := range twins {
					tw.snap.Endpoints[i].Metrics = m
					tw.snap.MetricsChanged(i)
				}
			}
		case k < 36: // the clock moves
			c.now = c.now.Add(time.Duration(r.IntN(1500)) * time.Millisecond)
		case k < 38: // identities rewritten in place: endpoints swap places
			perm := r.Perm(n)
			next := fresh()
			for i := range next.Endpoints {
				next.Endpoints[i].ID, next.Endpoints[i].Address = base.Endpoints[perm[i]].ID, base.Endpoints[perm[i]].Address
			}
			for _, tw := range twins {
				copy(tw.snap.Endpoints, next.Endpoints)
				tw.snap.Changed()
			}
		default: // a new snapshot
			next := fresh()
			for _, tw := range twins {
				tw.snap = copySnapshot(next)
			}
		}
	}
	return fast, decisions
}
