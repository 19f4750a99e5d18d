package scheduler

import (
	"math"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScheduleOutcomes(t *testing.T) {
	x := []string{"x"}
	busy := snapshot(ep("a", 10, 0.9, nil, nil, 4), ep("b", 7, 0.5, x, nil, 4))
	idle := snapshot(ep("a", 0, 0.1, nil, nil, 4), ep("b", 0, 0.1, x, nil, 4), ep("c", 9, 0.1, x, nil, 4))
	tests := []struct {
		name    string
		config  string
		crit    Criticality
		snap    *Snapshot
		outcome Outcome
		path    string
		profile string
		pick    string // "" when any pick is fine
	}{
		{"empty snapshot, critical", ``, Critical, snapshot(), NoEndpoint, PathNoEndpoint, "", ""},
		{"empty snapshot, sheddable is not a 429", ``, Sheddable, snapshot(), NoEndpoint, PathNoEndpoint, "", ""},
		{"nil endpoints", `{"profile": "scoring"}`, Standard, &Snapshot{}, NoEndpoint, PathNoEndpoint, "", ""},
		{"decision tree routes critical", ``, Critical, busy, Routed, "critical/low-queue/lora-affinity/least-queue/least-kv", "decision-tree", "b"},
		{"decision tree drops sheddable", ``, Sheddable, busy, Dropped, "sheddable/no-capacity", "decision-tree", ""},
		{"decision tree drops standard", ``, Standard, busy, Dropped, "standard/no-capacity", "decision-tree", ""},
		{"decision tree routes sheddable with capacity", ``, Sheddable, idle, Routed, "sheddable/capacity/low-queue/lora-affinity/least-queue/least-kv", "decision-tree", "b"},
		{"scoring routes critical on a busy fleet", `{"profile": "scoring"}`, Critical, busy, Routed, "scoring", "scoring", "b"},
		{"scoring sheds sheddable", `{"profile": "scoring"}`, Sheddable, busy, Dropped, "scoring", "scoring", ""},
		{"scoring prefers the adapter with the shorter queue", `{"profile": "scoring"}`, Standard, idle, Routed, "scoring", "scoring", "b"},
		{"least-request", `{"profile": "least-request"}`, Sheddable, busy, Routed, "least-request", "least-request", "b"},
		{"per-criticality profile", `{"byCriticality": {"sheddable": "random"}}`, Sheddable, busy, Routed, "random", "random", ""},
		{"user profile whose filter keeps nothing", `{"profile": "p", "plugins": [{"type": "low-queue-filter", "parameters": {"threshold": 1}}],
			"profiles": {"p": {"filters": ["low-queue-filter"], "picker": "random-picker"}}}`, Critical, busy, NoEndpoint, "p", "p", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newScheduler(t, tc.config, seeded(3))
			res := s.Schedule(&Request{Model: "x", Criticality: tc.crit}, tc.snap)
			assert.Equal(t, tc.outcome, res.Outcome)
			assert.Equal(t, tc.path, res.Path)
			assert.Equal(t, tc.profile, res.Profile)
			assert.Contains(t, s.Paths(), res.Path)
			if tc.outcome != Routed {
				assert.Nil(t, res.Endpoint)
				assert.Equal(t, -1, res.Index)
				return
			}
			require.NotNil(t, res.Endpoint)
			assertChosen(t, tc.snap, res)
			if tc.pick != "" {
				assert.Equal(t, tc.pick, res.Endpoint.ID.Name)
			}
		})
	}
}

// assertChosen checks that res names its endpoint by a pointer into snap
// and by that pointer's index.
func assertChosen(t *testing.T, snap *Snapshot, res Result) {
	t.Helper()
	require.GreaterOrEqual(t, res.Index, 0)
	require.Less(t, res.Index, len(snap.Endpoints))
	require.Same(t, &snap.Endpoints[res.Index], res.Endpoint, "Endpoint is &snap.Endpoints[Index]")
}

func TestStaleness(t *testing.T) {
	now := time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)
	fresh := ep("fresh", 50, 0.5, nil, nil, 4)
	fresh.Metrics.UpdateTime = now.Add(-time.Second)
	edge := ep("edge", 50, 0.5, nil, nil, 4)
	edge.Metrics.UpdateTime = now.Add(-2 * time.Second) // exactly StaleAfter old: still fresh
	stale := ep("stale", 0, 0, nil, nil, 4)
	stale.Metrics.UpdateTime = now.Add(-3 * time.Second)
	clockCalls := 0
	opts := seeded(1)
	opts.Now = func() time.Time { clockCalls++; return now }
	opts.StaleAfter = 2 * time.Second
	s := newScheduler(t, `{"profile": "least-request"}`, opts)

	snap := snapshot(stale, fresh, edge)
	for range 20 {
		res := s.Schedule(&Request{}, snap)
		require.Equal(t, Routed, res.Outcome)
		assert.NotEqual(t, "stale", res.Endpoint.ID.Name, "the idle but stale endpoint must not be used")
		assert.Equal(t, 1, res.Stale)
	}
	assert.Equal(t, 20, clockCalls, "the clock is read once per decision")

	allStale := snapshot(stale)
	res := s.Schedule(&Request{}, allStale)
	assert.Equal(t, AllStale, res.Outcome)
	assert.Equal(t, PathAllStale, res.Path)
	assert.Equal(t, 1, res.Stale)
	assert.Nil(t, res.Endpoint)
	assert.Equal(t, -1, res.Index)
	assert.Equal(t, AllStale, s.LeastLoaded(allStale).Outcome)

	// Without StaleAfter the clock is never read.
	clockCalls = 0
	opts.StaleAfter = 0
	s = newScheduler(t, ``, opts)
	assert.Equal(t, Routed, s.Schedule(&Request{Criticality: Critical}, allStale).Outcome)
	assert.Equal(t, 0, clockCalls)

	_, err := New(Config{}, nil, Options{StaleAfter: -time.Second})
	assert.Error(t, err)
}

// With FailOpen, a snapshot whose endpoints are all stale is served by
// every endpoint alike, whatever the profile and the metrics say; fresh
// endpoints are scheduled as without it, and an empty snapshot is still
// NoEndpoint.
func TestFailOpen(t *testing.T) {
	now := time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)
	staleEp := func(name string, waiting int) Endpoint {
		e := ep(name, waiting, 0.1, nil, nil, 4)
		e.Metrics.UpdateTime = now.Add(-time.Minute)
		return e
	}
	// "idle" would win every profile's choice if its metrics counted.
	allStale := snapshot(staleEp("busy-1", 90), staleEp("idle", 0), staleEp("busy-2", 90))
	opts := seeded(4)
	opts.Now = func() time.Time { return now }
	opts.StaleAfter = 2 * time.Second
	opts.FailOpen = true
	for _, profile := range []string{"decision-tree", "least-request", "scoring"} {
		t.Run(profile, func(t *testing.T) {
			s := newScheduler(t, `{"profile": "`+profile+`"}`, opts)
			counts := map[string]int{}
			for i := range 900 {
				var res Result
				if i%2 == 0 {
					res = s.Schedule(&Request{Model: "m", Criticality: Sheddable}, allStale)
				} else {
					res = s.LeastLoaded(allStale)
				}
				require.Equal(t, FailedOpen, res.Outcome)
				assert.Equal(t, PathAllStale, res.Path)
				assert.Equal(t, 3, res.Stale)
				assert.Empty(t, res.Profile)
				assertChosen(t, allStale, res)
				counts[res.Endpoint.ID.Name]++
			}
			for name, n := range counts {
				assert.InDelta(t, 300, n, 75, "uniform over every endpoint: %s in %v", name, counts)
			}
			assert.Len(t, counts, 3)

			fresh := snapshot(staleEp("stale", 0), ep("fresh", 50, 0.5, nil, nil, 4))
			fresh.Endpoints[1].Metrics.UpdateTime = now
			res := s.Schedule(&Request{Model: "m", Criticality: Critical}, fresh)
			require.Equal(t, Routed, res.Outcome, "one fresh endpoint: no fail-open")
			assert.Equal(t, 1, res.Index)
			assert.Equal(t, NoEndpoint, s.Schedule(&Request{}, snapshot()).Outcome)
			assert.Equal(t, -1, s.LeastLoaded(snapshot()).Index)
		})
	}
}

// A request that failed open is not counted by Observe: the stale
// endpoint's numbers are not scheduled on.
func TestObserveIgnoresFailOpen(t *testing.T) {
	now := time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)
	e := ep("a", 3, 0.1, nil, nil, 4)
	e.Metrics.UpdateTime = now.Add(-time.Minute)
	snap := snapshot(e)
	opts := seeded(5)
	opts.Now, opts.StaleAfter, opts.FailOpen = func() time.Time { return now }, time.Second, true
	s := newScheduler(t, `{"countRoutedSinceSnapshot": true}`, opts)
	req := &Request{Model: "m"}
	res := s.Schedule(req, snap)
	require.Equal(t, FailedOpen, res.Outcome)
	s.Observe(req, res)
	assert.Equal(t, 3, snap.Endpoints[0].Metrics.WaitingQueueSize)
	assert.Equal(t, 0, snap.Endpoints[0].Metrics.RoutedSinceUpdate)
}

func TestLeastLoaded(t *testing.T) {
	withRunning := func(e Endpoint, running int) Endpoint { e.Metrics.RunningQueueSize = running; return e }
	s := newScheduler(t, ``, seeded(9))
	tests := []struct {
		name string
		snap *Snapshot
		want []string // acceptable picks
	}{
		{"fewest outstanding", snapshot(withRunning(ep("a", 2, 0.1, nil, nil, 0), 3), withRunning(ep("b", 1, 0.9, nil, nil, 0), 3)), []string{"b"}},
		{"kv breaks ties", snapshot(withRunning(ep("a", 2, 0.5, nil, nil, 0), 1), withRunning(ep("b", 1, 0.2, nil, nil, 0), 2)), []string{"b"}},
		{"full ties are random", snapshot(ep("a", 1, 0.2, nil, nil, 0), ep("b", 1, 0.2, nil, nil, 0), ep("c", 5, 0.2, nil, nil, 0)), []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for range 200 {
				res := s.LeastLoaded(tc.snap)
				require.Equal(t, Routed, res.Outcome)
				assert.Equal(t, PathLeastLoaded, res.Path)
				assertChosen(t, tc.snap, res)
				seen[res.Endpoint.ID.Name] = true
			}
			assert.ElementsMatch(t, tc.want, keys(seen))
		})
	}
	res := s.LeastLoaded(snapshot())
	assert.Equal(t, NoEndpoint, res.Outcome)
	assert.Equal(t, PathNoEndpoint, res.Path)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestPaths(t *testing.T) {
	s := newScheduler(t, `{"profile": "scoring", "byCriticality": {"critical": "round-robin"}}`, seeded(1))
	assert.Equal(t, []string{PathNoEndpoint, PathAllStale, PathLeastLoaded, "round-robin", "scoring"}, s.Paths())
	s = newScheduler(t, ``, seeded(1))
	assert.Len(t, s.Paths(), 3+22+1, "fixed paths, 22 tree routes (8 of them admitted), the profile name")
}

// TestDeterministic: the same seed gives the same decisions.
func TestDeterministic(t *testing.T) {
	snap := randomSnapshot(newRand(5), 40)
	run := func() []string {
		s := newScheduler(t, ``, seeded(77))
		var picks []string
		for i := range 500 {
			res := s.Schedule(&Request{Model: adapterName(i % 7), Criticality: Criticality(i % 3)}, snap)
			name := res.Outcome.String()
			if res.Endpoint != nil {
				name = res.Endpoint.ID.Name
			}
			picks = append(picks, name)
		}
		return picks
	}
	assert.Equal(t, run(), run())
}

// TestRoundRobinProfile: with a stable fleet the round-robin profile
// cycles through every endpoint.
func TestRoundRobinProfile(t *testing.T) {
	s := newScheduler(t, `{"profile": "round-robin"}`, seeded(1))
	snap := snapshot(ep("a", 0, 0, nil, nil, 0), ep("b", 0, 0, nil, nil, 0), ep("c", 0, 0, nil, nil, 0))
	var got []string
	for range 6 {
		got = append(got, s.Schedule(&Request{}, snap).Endpoint.ID.Name)
	}
	assert.Equal(t, []string{"a", "b", "c", "a", "b", "c"}, got)
}

// TestCycleStateSharedBetweenPlugins: a filter leaves data for a scorer in
// the cycle state; state does not leak into the next request.
func TestCycleStateSharedBetweenPlugins(t *testing.T) {
	key := NewStateKey[string]("favourite")
	reg := NewRegistry()
	require.NoError(t, reg.Register(PluginType{Type: "mark", Kind: KindFilter, Doc: "stores the last candidate's name",
		New: noParams(func(n string) Plugin { return &markFilter{name: n, key: key} })}))
	require.NoError(t, reg.Register(PluginType{Type: "favour", Kind: KindScorer, Doc: "scores the stored name 1",
		New: noParams(func(n string) Plugin { return &favourScorer{name: n, key: key} })}))
	cfg, err := DecodeConfig([]byte(`{"profile": "p", "profiles": {"p": {"filters": ["mark"], "scorers": [{"scorer": "favour", "weight": 1}], "picker": "max-score-picker"}}}`))
	require.NoError(t, err)
	s, err := New(cfg, reg, seeded(1))
	require.NoError(t, err)
	snap := snapshot(ep("a", 0, 0, nil, nil, 0), ep("b", 0, 0, nil, nil, 0), ep("c", 0, 0, nil, nil, 0))
	for range 10 {
		assert.Equal(t, "c", s.Schedule(&Request{}, snap).Endpoint.ID.Name)
		assert.Equal(t, 0, s.cycle.State.Len(), "state is cleared after the cycle")
	}
}

type markFilter struct {
	name string
	key  StateKey[string]
}

func (f *markFilter) Name() string { return f.name }
func (f *markFilter) Filter(c *Cycle, dst, in []*Endpoint) []*Endpoint {
	if _, ok := Get(&c.State, f.key); ok {
		panic("state leaked from a previous cycle")
	}
	Put(&c.State, f.key, in[len(in)-1].ID.Name)
	return append(dst, in...)
}

type favourScorer struct {
	name string
	key  StateKey[string]
}

func (s *favourScorer) Name() string { return s.name }
func (s *favourScorer) Score(c *Cycle, in []*Endpoint, scores []float64) {
	fav, _ := Get(&c.State, s.key)
	for i, e := range in {
		if e.ID.Name == fav {
			scores[i] = 1
		}
	}
}

// TestScoresClamped: scorer output outside [0,1] or NaN cannot dominate.
func TestScoresClamped(t *testing.T) {
	reg := NewRegistry()
	require.NoError(t, reg.Register(PluginType{Type: "wild", Kind: KindScorer, Doc: "out of range",
		New: noParams(func(n string) Plugin { return wildScorer(n) })}))
	cfg := Config{Profile: "p", Profiles: map[string]ProfileSpec{"p": {
		Scorers: []ScorerRef{{Scorer: "wild", Weight: 1}, {Scorer: "queue-scorer", Weight: 1}}, Picker: "max-score-picker"}}}
	s, err := New(cfg, reg, seeded(1))
	require.NoError(t, err)
	// wild scores a NaN, b 0.9, c 1e9, d -5; the queue scorer gives
	// a 1, b 8/9, c 0, d 1. Clamped means: a 0.5, b 0.89, c 0.5, d 0.5.
	// Unclamped, c would win (or a, whose NaN would poison max-score).
	snap := snapshot(ep("a", 1, 0, nil, nil, 0), ep("b", 2, 0, nil, nil, 0), ep("c", 10, 0, nil, nil, 0), ep("d", 1, 0, nil, nil, 0))
	for range 20 {
		assert.Equal(t, "b", s.Schedule(&Request{}, snap).Endpoint.ID.Name)
	}
}

type wildScorer string

func (w wildScorer) Name() string { return string(w) }
func (wildScorer) Score(_ *Cycle, in []*Endpoint, scores []float64) {
	vals := map[string]float64{"a": math.NaN(), "b": 0.9, "c": 1e9, "d": -5}
	for i, e := range in {
		scores[i] = vals[e.ID.Name]
	}
}

func TestZeroAllocations(t *testing.T) {
	snap := randomSnapshot(newRand(1), 64)
	for _, profile := range []string{"decision-tree", "scoring", "least-request", "round-robin"} {
		t.Run(profile, func(t *testing.T) {
			s := newScheduler(t, `{"profile": "`+profile+`"}`, seeded(1))
			reqs := []*Request{{Model: "adapter-1", Criticality: Critical}, {Model: "adapter-2", Criticality: Sheddable}}
			i := 0
			allocs := testing.AllocsPerRun(200, func() {
				s.Schedule(reqs[i%2], snap)
				i++
			})
			assert.Zero(t, allocs)
			assert.Zero(t, testing.AllocsPerRun(100, func() { s.LeastLoaded(snap) }))
		})
	}
}

// indexOf finds every endpoint of a snapshot by its pointer, and refuses
// one from elsewhere, even one at the same position of a copy.
func TestIndexOf(t *testing.T) {
	snap := snapshot(ep("a", 0, 0, nil, nil, 0), ep("b", 0, 0, nil, nil, 0), ep("c", 0, 0, nil, nil, 0))
	for i := range snap.Endpoints {
		assert.Equal(t, i, indexOf(snap, &snap.Endpoints[i]))
	}
	other := snapshot(append([]Endpoint(nil), snap.Endpoints...)...)
	assert.Panics(t, func() { indexOf(snap, &other.Endpoints[1]) })
	inside := &snap.Endpoints[1].Metrics // inside an element, not at its start
	assert.Panics(t, func() { indexOf(snap, (*Endpoint)(unsafe.Pointer(inside))) })
	assert.Panics(t, func() { indexOf(&Snapshot{}, &snap.Endpoints[0]) })
}
