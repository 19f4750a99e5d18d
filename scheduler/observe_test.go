package scheduler

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingConfig is a built-in profile with countRoutedSinceSnapshot set.
func countingConfig(profile string, on bool) string {
	return fmt.Sprintf(`{"profile": %q, "countRoutedSinceSnapshot": %t}`, profile, on)
}

// burst schedules n requests for the base model on snap without a new
// snapshot in between, calling Observe after each as the plugin does, and
// returns how many went to each endpoint.
func burst(s *Scheduler, snap *Snapshot, n int) map[string]int {
	got := map[string]int{}
	req := &Request{Model: "base", Criticality: Critical}
	for range n {
		res := s.Schedule(req, snap)
		if res.Outcome != Routed {
			got[res.Outcome.String()]++
			continue
		}
		s.Observe(req, res)
		got[res.Endpoint.ID.Name]++
	}
	return got
}

// TestBurstSpreadsWhenCounting: four endpoints that differ only in KV-cache
// usage. Without counting, every request of a burst between two snapshots
// goes to the one with the least KV cache (the herding the end-to-end tests
// saw: one replica with 16 waiting, three with none). With counting, each
// routed request is waiting at its endpoint, so the burst spreads evenly.
func TestBurstSpreadsWhenCounting(t *testing.T) {
	fresh := func() *Snapshot {
		return snapshot(ep("a", 0, 0.10, nil, nil, 4), ep("b", 0, 0.20, nil, nil, 4),
			ep("c", 0, 0.30, nil, nil, 4), ep("d", 0, 0.40, nil, nil, 4))
	}
	for _, profile := range []string{ProfileDecisionTree, ProfileScoring, ProfileLeastRequest} {
		t.Run(profile, func(t *testing.T) {
			off := newScheduler(t, countingConfig(profile, false), seeded(3))
			if profile != ProfileLeastRequest { // least-request picks at random among equal loads
				assert.Equal(t, map[string]int{"a": 16}, burst(off, fresh(), 16), "without counting the burst herds")
			}

			on := newScheduler(t, countingConfig(profile, true), seeded(3))
			snap := fresh()
			assert.Equal(t, map[string]int{"a": 4, "b": 4, "c": 4, "d": 4}, burst(on, snap, 16))
			for _, e := range snap.Endpoints {
				assert.Equal(t, 4, e.Metrics.WaitingQueueSize, e.ID.Name)
				assert.Equal(t, 4, e.Metrics.RoutedSinceUpdate, e.ID.Name)
			}
		})
	}
}

// TestBurstFillsTheShortestQueueFirst: the decision tree's least-queue band
// keeps only the shortest queues while they differ by less than the number
// of candidates, so counted requests fill the idle endpoint up to the others'
// level, then spread over all: water-filling instead of herding.
func TestBurstFillsTheShortestQueueFirst(t *testing.T) {
	snap := snapshot(ep("a", 0, 0.5, nil, nil, 4), ep("b", 4, 0.5, nil, nil, 4),
		ep("c", 4, 0.5, nil, nil, 4), ep("d", 4, 0.5, nil, nil, 4))
	s := newScheduler(t, countingConfig(ProfileDecisionTree, true), seeded(9))
	assert.Equal(t, map[string]int{"a": 4}, burst(s, snap, 4))
	assert.Equal(t, map[string]int{"a": 3, "b": 3, "c": 3, "d": 3}, burst(s, snap, 12))
}

// TestRequestsJoiningTheirAdapterAreNotCounted: LoRA affinity keeps an
// adapter's requests where it is loaded, and counting them would spread the
// adapter (see Observe). A request placed where its adapter is not listed
// (a free slot) is counted, and so is one for the base model.
func TestRequestsJoiningTheirAdapterAreNotCounted(t *testing.T) {
	snap := snapshot(
		ep("runs-sql", 0, 0.1, []string{"sql"}, nil, 4),
		ep("queues-sql", 0, 0.2, nil, []string{"sql"}, 4),
		ep("free", 0, 0.3, []string{"chat"}, nil, 4),
	)
	s := newScheduler(t, countingConfig(ProfileDecisionTree, true), seeded(2))
	for _, tc := range []struct {
		req  Request
		at   int
		want int // RoutedSinceUpdate afterwards
	}{
		{Request{Model: "sql"}, 0, 0},
		{Request{Model: "s", TargetModel: "sql"}, 1, 0},
		{Request{Model: "tweets"}, 2, 1},
		{Request{Model: "chat"}, 0, 1},
		{Request{Model: "base"}, 2, 2},
	} {
		s.Observe(&tc.req, Result{Outcome: Routed, Endpoint: &snap.Endpoints[tc.at]})
		assert.Equal(t, tc.want, snap.Endpoints[tc.at].Metrics.RoutedSinceUpdate, "%+v", tc.req)
	}
	assert.Equal(t, []int{1, 0, 2}, []int{snap.Endpoints[0].Metrics.WaitingQueueSize,
		snap.Endpoints[1].Metrics.WaitingQueueSize, snap.Endpoints[2].Metrics.WaitingQueueSize})

	// A burst for an adapter two endpoints run stays where the tree puts
	// it (the one with less KV cache) instead of alternating.
	two := snapshot(ep("a", 0, 0.1, []string{"sql"}, nil, 4), ep("b", 0, 0.2, []string{"sql"}, nil, 4))
	got := map[string]int{}
	for range 8 {
		req := &Request{Model: "sql", Criticality: Critical}
		res := s.Schedule(req, two)
		s.Observe(req, res)
		got[res.Endpoint.ID.Name]++
	}
	assert.Equal(t, map[string]int{"a": 8}, got)
}

// TestFreshMetricsResetTheCounts: the counts live in the caller's snapshot
// and nowhere else. Overwriting an endpoint's metrics with a new scrape, or
// scheduling on a new snapshot, starts from the scraped values again.
func TestFreshMetricsResetTheCounts(t *testing.T) {
	scraped := []Endpoint{ep("a", 0, 0.1, nil, nil, 4), ep("b", 0, 0.2, nil, nil, 4)}
	s := newScheduler(t, countingConfig(ProfileDecisionTree, true), seeded(1))

	snap := &Snapshot{Endpoints: append([]Endpoint(nil), scraped...)}
	require.Equal(t, map[string]int{"a": 2, "b": 2}, burst(s, snap, 4))

	// A new snapshot (what the plugin decodes when the version changes).
	next := &Snapshot{Endpoints: append([]Endpoint(nil), scraped...)}
	assert.Equal(t, map[string]int{"a": 1}, burst(s, next, 1), "the Scheduler carries no count over")

	// The same snapshot overwritten in place (what the fleet simulation does).
	copy(snap.Endpoints, scraped)
	assert.Equal(t, map[string]int{"a": 1}, burst(s, snap, 1))
	assert.Equal(t, 1, snap.Endpoints[0].Metrics.RoutedSinceUpdate)
	assert.Zero(t, snap.Endpoints[1].Metrics.RoutedSinceUpdate)
}

// TestCountingOffIsTheSeed: with counting off, calling Observe after every
// decision changes nothing: the same decisions as a Scheduler never told
// about them, and the snapshot stays as it was.
func TestCountingOffIsTheSeed(t *testing.T) {
	for _, profile := range []string{ProfileDecisionTree, ProfileScoring, ProfileLeastRequest, ProfileRandom} {
		t.Run(profile, func(t *testing.T) {
			snap := randomSnapshot(newRand(11), 40)
			pristine := randomSnapshot(newRand(11), 40)
			seed := newScheduler(t, `{"profile": "`+profile+`"}`, seeded(5))
			off := newScheduler(t, countingConfig(profile, false), seeded(5))
			require.False(t, off.CountsRoutedSinceSnapshot())
			for i := range 2000 {
				req := &Request{Model: adapterName(i % 7), Criticality: Criticality(i % 3)}
				want := seed.Schedule(req, pristine)
				got := off.Schedule(req, snap)
				off.Observe(req, got)
				require.Equal(t, want.Outcome, got.Outcome, "request %d", i)
				require.Equal(t, want.Path, got.Path, "request %d", i)
				if want.Endpoint != nil {
					require.Equal(t, want.Endpoint.ID, got.Endpoint.ID, "request %d", i)
				}
			}
			assert.Equal(t, pristine, snap, "Observe with counting off leaves the snapshot alone")
		})
	}
}

// TestObserveIgnoresWhatWasNotRouted: drops, refusals and stale outcomes
// name no endpoint and count nothing.
func TestObserveIgnoresWhatWasNotRouted(t *testing.T) {
	s := newScheduler(t, countingConfig(ProfileDecisionTree, true), seeded(1))
	require.True(t, s.CountsRoutedSinceSnapshot())
	full := snapshot(ep("a", 50, 0.95, nil, nil, 4)) // no capacity: sheddable requests are dropped
	res := s.Schedule(&Request{Model: "m", Criticality: Sheddable}, full)
	require.Equal(t, Dropped, res.Outcome)
	s.Observe(&Request{Model: "m", Criticality: Sheddable}, res)
	s.Observe(&Request{Model: "m"}, Result{Outcome: NoEndpoint})
	s.Observe(&Request{Model: "m"}, Result{Outcome: AllStale})
	assert.Equal(t, 50, full.Endpoints[0].Metrics.WaitingQueueSize)
	assert.Zero(t, full.Endpoints[0].Metrics.RoutedSinceUpdate)
}

// TestCountRoutedDefault: an absent or null setting is the documented
// default; a wrong type is a configuration error with its path.
func TestCountRoutedDefault(t *testing.T) {
	for _, tc := range []struct {
		json string
		want bool
	}{
		{``, DefaultCountRoutedSinceSnapshot},
		{`{}`, DefaultCountRoutedSinceSnapshot},
		{`{"countRoutedSinceSnapshot": null}`, DefaultCountRoutedSinceSnapshot},
		{`{"countRoutedSinceSnapshot": true}`, true},
		{`{"countRoutedSinceSnapshot": false, "profile": "scoring"}`, false},
	} {
		s, err := build(tc.json)
		require.NoError(t, err, tc.json)
		assert.Equal(t, tc.want, s.CountsRoutedSinceSnapshot(), tc.json)
	}
	for json, msg := range map[string]string{
		`{"countRoutedSinceSnapshot": "yes"}`:                                   "countRoutedSinceSnapshot: expected a boolean, got JSON string",
		`{"countRoutedSinceSnapshot": 1}`:                                       "countRoutedSinceSnapshot: expected a boolean, got JSON number 1",
		`{"countRoutedSinceSnapshot": true, "countRoutedSinceSnapshot": false}`: `duplicate key "countRoutedSinceSnapshot"`,
		`{"CountRoutedSinceSnapshot": true}`:                                    `unknown field "CountRoutedSinceSnapshot" (names are case-sensitive: did you mean "countRoutedSinceSnapshot"?)`,
	} {
		_, err := DecodeConfig([]byte(json))
		var ce *ConfigError
		require.ErrorAs(t, err, &ce, json)
		assert.Equal(t, msg, ce.Error(), json)
	}
}

func TestObserveAllocatesNothing(t *testing.T) {
	snap := randomSnapshot(newRand(1), 64)
	s := newScheduler(t, countingConfig(ProfileScoring, true), seeded(1))
	req := &Request{Model: "adapter-1", Criticality: Critical}
	assert.Zero(t, testing.AllocsPerRun(200, func() { s.Observe(req, s.Schedule(req, snap)) }))
}
