package scheduler

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFilters(t *testing.T) {
	x := []string{"x"}
	tests := []struct {
		name   string
		filter Filter
		crit   Criticality
		snap   *Snapshot
		want   []string
		drop   bool
	}{
		{"low-queue keeps waiting <= threshold", &LowQueueFilter{Threshold: 2},
			Critical, snapshot(ep("a", 2, 0, nil, nil, 0), ep("b", 3, 0, nil, nil, 0)), []string{"a"}, false},
		{"has-capacity needs both queue and kv", &HasCapacityFilter{QueueThreshold: 5, KVCacheThreshold: 0.8},
			Critical, snapshot(ep("a", 5, 0.8, nil, nil, 0), ep("b", 6, 0.1, nil, nil, 0), ep("c", 0, 0.81, nil, nil, 0)), []string{"a"}, false},
		{"has-capacity treats NaN KV as full", &HasCapacityFilter{QueueThreshold: 5, KVCacheThreshold: 0.8},
			Critical, snapshot(ep("a", 0, math.NaN(), nil, nil, 0)), []string{}, false},
		{"least-queue band with integer division", &LeastQueueFilter{},
			Critical, snapshot(ep("a", 0, 0, nil, nil, 0), ep("b", 5, 0, nil, nil, 0), ep("c", 6, 0, nil, nil, 0), ep("d", 20, 0, nil, nil, 0)), []string{"a", "b"}, false},
		{"least-queue all equal keeps all", &LeastQueueFilter{},
			Critical, snapshot(ep("a", 4, 0, nil, nil, 0), ep("b", 4, 0, nil, nil, 0)), []string{"a", "b"}, false},
		{"least-queue single", &LeastQueueFilter{},
			Critical, snapshot(ep("a", 400, 0, nil, nil, 0)), []string{"a"}, false},
		{"least-kv band", &LeastKVCacheFilter{},
			Critical, snapshot(ep("a", 0, 0.1, nil, nil, 0), ep("b", 0, 0.3, nil, nil, 0), ep("c", 0, 0.5, nil, nil, 0), ep("d", 0, 0.9, nil, nil, 0)), []string{"a", "b"}, false},
		{"least-kv NaN is never least", &LeastKVCacheFilter{},
			Critical, snapshot(ep("a", 0, math.NaN(), nil, nil, 0), ep("b", 0, 0.95, nil, nil, 0), ep("c", 0, 0.0, nil, nil, 0)), []string{"c"}, false},
		{"least-request sums waiting and running", &LeastRequestFilter{},
			Critical, snapshot(
				Endpoint{ID: EndpointID{Name: "a"}, Metrics: Metrics{WaitingQueueSize: 1, RunningQueueSize: 5}},
				Endpoint{ID: EndpointID{Name: "b"}, Metrics: Metrics{WaitingQueueSize: 3, RunningQueueSize: 1}},
				Endpoint{ID: EndpointID{Name: "c"}, Metrics: Metrics{WaitingQueueSize: 0, RunningQueueSize: 4}}),
			[]string{"b", "c"}, false},
		{"lora affinity with threshold 1", &LoRAAffinityFilter{Threshold: 1},
			Critical, snapshot(ep("a", 0, 0, x, nil, 1), ep("b", 0, 0, nil, nil, 1), ep("c", 0, 0, []string{"y"}, nil, 1)), []string{"a"}, false},
		{"lora affinity: neither group", &LoRAAffinityFilter{Threshold: 1},
			Critical, snapshot(ep("c", 0, 0, []string{"y"}, nil, 1)), []string{}, false},
		{"shed-filter passes critical untouched", &ShedFilter{HasCapacityFilter{QueueThreshold: 0, KVCacheThreshold: 0}},
			Critical, snapshot(ep("a", 9, 0.9, nil, nil, 0)), []string{"a"}, false},
		{"shed-filter keeps capable endpoints for sheddable", &ShedFilter{HasCapacityFilter{QueueThreshold: 5, KVCacheThreshold: 0.8}},
			Sheddable, snapshot(ep("a", 9, 0.1, nil, nil, 0), ep("b", 1, 0.1, nil, nil, 0)), []string{"b"}, false},
		{"shed-filter drops standard without capacity", &ShedFilter{HasCapacityFilter{QueueThreshold: 5, KVCacheThreshold: 0.8}},
			Standard, snapshot(ep("a", 9, 0.1, nil, nil, 0)), []string{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := testCycle(&Request{Model: "x", Criticality: tc.crit}, tc.snap, 1)
			got := tc.filter.Filter(c, nil, all(tc.snap))
			assert.Equal(t, tc.want, append([]string{}, names(got)...))
			assert.Equal(t, tc.drop, c.Dropped())
		})
	}
}

func TestFiltersOnEmptyInput(t *testing.T) {
	for _, typ := range NewRegistry().Types() {
		if typ.Kind != KindFilter {
			continue
		}
		t.Run(typ.Type, func(t *testing.T) {
			p, err := typ.New(typ.Type, nil, nil)
			require.NoError(t, err)
			c := testCycle(&Request{Model: "x", Criticality: Sheddable}, snapshot(), 1)
			assert.Empty(t, p.(Filter).Filter(c, nil, nil))
			assert.False(t, c.Dropped(), "an empty input is no reason to shed")
		})
	}
}

func TestLoRAUsesTargetModelBeforeModel(t *testing.T) {
	snap := snapshot(ep("a", 0, 0, []string{"adapter-v2"}, nil, 1), ep("b", 0, 0, []string{"base"}, nil, 1))
	f := &LoRAAffinityFilter{Threshold: 1}
	c := testCycle(&Request{Model: "base", TargetModel: "adapter-v2"}, snap, 1)
	assert.Equal(t, []string{"a"}, names(f.Filter(c, nil, all(snap))))
	c = testCycle(&Request{Model: "base"}, snap, 1)
	assert.Equal(t, []string{"b"}, names(f.Filter(c, nil, all(snap))))
}

func TestScorers(t *testing.T) {
	x := []string{"x"}
	tests := []struct {
		name   string
		scorer Scorer
		snap   *Snapshot
		want   []float64
	}{
		{"queue min-max", &QueueScorer{}, snapshot(ep("a", 0, 0, nil, nil, 0), ep("b", 5, 0, nil, nil, 0), ep("c", 10, 0, nil, nil, 0)), []float64{1, 0.5, 0}},
		{"queue all equal", &QueueScorer{}, snapshot(ep("a", 3, 0, nil, nil, 0), ep("b", 3, 0, nil, nil, 0)), []float64{1, 1}},
		{"kv free fraction", &KVCacheScorer{}, snapshot(ep("a", 0, 0.25, nil, nil, 0), ep("b", 0, 1, nil, nil, 0), ep("c", 0, math.NaN(), nil, nil, 0)), []float64{0.75, 0, 0}},
		{"lora: active, free slot, waiting, none", &LoRAAffinityScorer{}, snapshot(
			ep("active", 0, 0, x, nil, 1),
			ep("free", 0, 0, []string{"y"}, nil, 2),
			ep("waiting", 0, 0, []string{"y"}, x, 2),
			ep("none", 0, 0, []string{"y"}, nil, 1),
			ep("waiting-with-slot", 0, 0, nil, x, 4),
		), []float64{1, 0.8, 0.6, 0, 0.8}},
		{"running min-max", &RunningRequestsScorer{}, snapshot(
			Endpoint{Metrics: Metrics{RunningQueueSize: 2}}, Endpoint{Metrics: Metrics{RunningQueueSize: 6}}), []float64{1, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := testCycle(&Request{Model: "x"}, tc.snap, 1)
			got := make([]float64, len(tc.snap.Endpoints))
			tc.scorer.Score(c, all(tc.snap), got)
			assert.InDeltaSlice(t, tc.want, got, 1e-12)
		})
	}
}

func TestPickers(t *testing.T) {
	snap := snapshot(ep("a", 0, 0, nil, nil, 0), ep("b", 0, 0, nil, nil, 0), ep("c", 0, 0, nil, nil, 0), ep("d", 0, 0, nil, nil, 0))
	cands := all(snap)
	const n = 40_000
	histogram := func(p Picker, scores []float64) []int {
		c := testCycle(&Request{}, snap, 7)
		h := make([]int, len(cands))
		for range n {
			h[p.Pick(c, cands, scores)]++
		}
		return h
	}
	t.Run("random is uniform", func(t *testing.T) {
		for _, got := range histogram(&RandomPicker{}, nil) {
			assert.InDelta(t, n/4, got, n/40)
		}
	})
	t.Run("max-score picks the maximum", func(t *testing.T) {
		assert.Equal(t, []int{0, 0, n, 0}, histogram(&MaxScorePicker{}, []float64{0.1, 0.5, 0.9, 0.2}))
	})
	t.Run("max-score spreads ties evenly", func(t *testing.T) {
		h := histogram(&MaxScorePicker{}, []float64{0.9, 0.5, 0.9, 0.9})
		assert.Equal(t, 0, h[1])
		for _, i := range []int{0, 2, 3} {
			assert.InDelta(t, n/3, h[i], n/30)
		}
	})
	t.Run("max-score without scores is random", func(t *testing.T) {
		for _, got := range histogram(&MaxScorePicker{}, nil) {
			assert.InDelta(t, n/4, got, n/40)
		}
	})
	t.Run("weighted-random is proportional", func(t *testing.T) {
		h := histogram(&WeightedRandomPicker{}, []float64{0.1, 0, 0.3, 0.6})
		assert.Equal(t, 0, h[1], "zero score never picked")
		assert.InDelta(t, n/10, h[0], n/50)
		assert.InDelta(t, 3*n/10, h[2], n/50)
		assert.InDelta(t, 6*n/10, h[3], n/50)
	})
	t.Run("weighted-random all zero is uniform", func(t *testing.T) {
		for _, got := range histogram(&WeightedRandomPicker{}, []float64{0, 0, 0, 0}) {
			assert.InDelta(t, n/4, got, n/40)
		}
	})
	t.Run("round-robin rotates", func(t *testing.T) {
		p := &RoundRobinPicker{}
		c := testCycle(&Request{}, snap, 1)
		var got []int
		for range 6 {
			got = append(got, p.Pick(c, cands, nil))
		}
		assert.Equal(t, []int{0, 1, 2, 3, 0, 1}, got)
	})
}

func TestCycleState(t *testing.T) {
	type prefix struct{ matched int }
	hits := NewStateKey[*prefix]("prefix")
	count := NewStateKey[int]("count")
	other := NewStateKey[int]("count") // same name, different key
	var s CycleState

	_, ok := Get(&s, hits)
	assert.False(t, ok)
	Put(&s, hits, &prefix{matched: 3})
	Put(&s, count, 1)
	Put(&s, count, 2)
	v, ok := Get(&s, hits)
	require.True(t, ok)
	assert.Equal(t, 3, v.matched)
	n, _ := Get(&s, count)
	assert.Equal(t, 2, n)
	_, ok = Get(&s, other)
	assert.False(t, ok, "keys are identities, not names")
	assert.Equal(t, 2, s.Len())
	assert.Equal(t, "prefix", hits.Name())

	s.reset()
	assert.Equal(t, 0, s.Len())
	_, ok = Get(&s, hits)
	assert.False(t, ok)
}

// TestShedFilterPassesAdmitted: a request flow control admitted keeps every
// candidate, as a Critical one does; the same request not admitted is shed.
func TestShedFilterPassesAdmitted(t *testing.T) {
	f := &ShedFilter{HasCapacityFilter{QueueThreshold: 5, KVCacheThreshold: 0.8}}
	snap := snapshot(ep("a", 9, 0.1, nil, nil, 0), ep("b", 7, 0.9, nil, nil, 0))
	c := testCycle(&Request{Model: "x", Criticality: Standard, Admitted: true}, snap, 1)
	assert.Equal(t, []string{"a", "b"}, names(f.Filter(c, nil, all(snap))))
	assert.False(t, c.Dropped())
	c = testCycle(&Request{Model: "x", Criticality: Standard}, snap, 1)
	assert.Empty(t, f.Filter(c, nil, all(snap)))
	assert.True(t, c.Dropped())
}
