package scheduler

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

var prefixT0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// prefixRig is one gateway worker: a scheduler with the prefix-aware
// profile, a hasher and a tracker over an index in store.
type prefixRig struct {
	s   *Scheduler
	h   *prefix.Hasher
	t   *PrefixTracker
	req Request
}

func newPrefixRig(t testing.TB, store prefix.Store, configJSON string) *prefixRig {
	t.Helper()
	if configJSON == "" {
		configJSON = `{"profile": "prefix-aware"}`
	}
	idx, err := prefix.NewIndex(prefix.IndexConfig{}, store)
	require.NoError(t, err)
	h, err := prefix.NewHasher(prefix.HashConfig{})
	require.NoError(t, err)
	return &prefixRig{s: newScheduler(t, configJSON, seeded(7)), h: h, t: NewPrefixTracker(idx)}
}

// route hashes a completion prompt, schedules it on snap, records the
// decision and returns the chosen endpoint's name and the blocks predicted.
func (r *prefixRig) route(t testing.TB, snap *Snapshot, target, prompt string, crit Criticality) (string, int, Result) {
	t.Helper()
	raw, _ := json.Marshal(prompt)
	require.NoError(t, r.h.HashPrompt(target, nil, raw))
	r.req = Request{Model: target, TargetModel: target, Criticality: crit}
	r.t.Prepare(&r.req, snap, r.h.Blocks(), r.h.Key())
	res := r.s.Schedule(&r.req, snap)
	if res.Outcome != Routed {
		return "", 0, res
	}
	pred := r.t.Routed(res.Index, prefixT0)
	return res.Endpoint.ID.Name, pred, res
}

func idle(n int) *Snapshot {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = ep(fmt.Sprintf("pod-%d", i), 0, 0.1, nil, nil, 0)
		eps[i].Address = fmt.Sprintf("10.0.0.%d", i+1)
	}
	return snapshot(eps...)
}

func longPrompt(topic string, n int) string {
	return strings.Repeat("Context about "+topic+" that every question repeats. ", n)
}

func TestPrefixCacheScorer(t *testing.T) {
	snap := idle(3)
	rig := newPrefixRig(t, nil, "")
	doc := longPrompt("tax law", 40)
	name, _, _ := rig.route(t, snap, "m", doc+"First question?", Critical)
	raw, _ := json.Marshal(doc + "A different, longer second question about it?")
	require.NoError(t, rig.h.HashPrompt("m", nil, raw))
	req := Request{Model: "m", Criticality: Critical}
	rig.t.Prepare(&req, snap, rig.h.Blocks(), rig.h.Key())
	scores := make([]float64, 3)
	(&PrefixCacheScorer{}).Score(testCycle(&req, snap, 1), all(snap), scores)
	for i, e := range snap.Endpoints {
		if e.ID.Name == name {
			want := float64(rig.t.Match().Blocks(rig.t.KeyOf(i))) / float64(len(rig.h.Blocks()))
			assert.InDelta(t, want, scores[i], 1e-9)
			assert.Greater(t, scores[i], 0.8, "most of the prompt is the shared document")
		} else {
			assert.Zero(t, scores[i])
		}
	}
	// No prefix information: every score 0.
	(&PrefixCacheScorer{}).Score(testCycle(&Request{Model: "m"}, snap, 1), all(snap), scores)
	assert.Equal(t, []float64{0, 0, 0}, scores)
}

func TestPrefixAffinityFollowsTheCache(t *testing.T) {
	snap := idle(8)
	rig := newPrefixRig(t, nil, "")
	doc := longPrompt("the Q3 report", 30)
	first, pred, res := rig.route(t, snap, "m", doc+"What grew?", Critical)
	assert.Zero(t, pred)
	assert.Equal(t, PathPrefixConsistent, res.Path)
	for i := range 20 {
		got, pred, res := rig.route(t, snap, "m", doc+fmt.Sprintf("Question %d about the numbers?", i), Critical)
		assert.Equal(t, first, got, "request %d left the endpoint holding its prefix", i)
		assert.Greater(t, pred, 0)
		assert.Equal(t, PathPrefixAffinity, res.Path)
	}
}

// Two gateway replicas with separate indexes, and workers that see
// nothing of each other, agree on where a new prefix goes.
func TestConsistentChoiceAcrossReplicas(t *testing.T) {
	snap := idle(8)
	a, b := newPrefixRig(t, nil, ""), newPrefixRig(t, nil, "")
	spread := map[string]bool{}
	for g := range 40 {
		doc := longPrompt(fmt.Sprintf("group %d", g), 10)
		na, _, _ := a.route(t, snap, "m", doc+"a?", Critical)
		nb, _, _ := b.route(t, snap, "m", doc+"b?", Critical)
		assert.Equal(t, na, nb, "group %d", g)
		spread[na] = true
	}
	assert.Len(t, spread, 8, "40 groups over 8 endpoints use them all")
}

func TestPrefixLoadGuard(t *testing.T) {
	snap := idle(4)
	rig := newPrefixRig(t, nil, "")
	doc := longPrompt("contracts", 30)
	holder, _, _ := rig.route(t, snap, "m", doc+"Q0?", Critical)
	var h *Endpoint
	for i := range snap.Endpoints {
		if snap.Endpoints[i].ID.Name == holder {
			h = &snap.Endpoints[i]
		}
	}
	// Over the queue threshold: the prefix no longer holds it there.
	h.Metrics.WaitingQueueSize = DefaultPrefixQueueThreshold + 1
	got, _, res := rig.route(t, snap, "m", doc+"Q1?", Critical)
	assert.NotEqual(t, holder, got)
	assert.Equal(t, PathPrefixConsistent, res.Path)
	// A full KV cache too.
	h.Metrics.WaitingQueueSize = 0
	h.Metrics.KVCacheUsage = 0.95
	got, _, _ = rig.route(t, snap, "m", doc+"Q2?", Critical)
	assert.NotEqual(t, holder, got)
	// Every endpoint past the guard: the scorers spread (least loaded).
	for i := range snap.Endpoints {
		snap.Endpoints[i].Metrics.WaitingQueueSize = 20 + i
		snap.Endpoints[i].Metrics.KVCacheUsage = 0.5
	}
	h.Metrics.WaitingQueueSize = 40
	got, _, res = rig.route(t, snap, "m", doc+"Q3?", Critical)
	assert.Equal(t, PathPrefixSaturated, res.Path)
	assert.NotEqual(t, holder, got, "saturated: the scorers avoid the most loaded")
}

// A hot prefix does not pile onto one replica: as its holder's queue grows
// the requests move on, and the bound keeps any endpoint near the mean.
func TestNoDeathSpiral(t *testing.T) {
	snap := idle(4)
	rig := newPrefixRig(t, nil, "")
	doc := longPrompt("the one hot system prompt", 40)
	for i := range 200 {
		name, _, res := rig.route(t, snap, "m", doc+fmt.Sprintf("user %d asks", i), Critical)
		require.Equal(t, Routed, res.Outcome)
		for j := range snap.Endpoints {
			if snap.Endpoints[j].ID.Name == name {
				snap.Endpoints[j].Metrics.WaitingQueueSize++ // nothing completes
			}
		}
	}
	for _, e := range snap.Endpoints {
		assert.InDelta(t, 50, e.Metrics.WaitingQueueSize, 20, "%s took %d of 200", e.ID.Name, e.Metrics.WaitingQueueSize)
	}
}

func TestPrefixAffinityKeepsAdaptersTogether(t *testing.T) {
	snap := idle(4)
	for i := range snap.Endpoints {
		snap.Endpoints[i].Metrics.MaxActiveModels = 2
	}
	snap.Endpoints[2].Metrics.ActiveModels = []string{"lora-a"}
	rig := newPrefixRig(t, nil, "")
	for i := range 10 {
		got, _, _ := rig.route(t, snap, "lora-a", fmt.Sprintf("unrelated prompt number %d with enough text to fill a block or two of hashes", i), Critical)
		assert.Equal(t, "pod-2", got, "request %d", i)
	}
}

// Where prompts are never reused, a prompt nobody holds goes where the
// scoring profile sends it (the consistent choice would cost balance for
// nothing); once prompts are reused again, new ones get the consistent
// choice again.
func TestNewPrefixesGoToTheScorersWhenNothingIsReused(t *testing.T) {
	snap := idle(6)
	for i := range snap.Endpoints {
		snap.Endpoints[i].Metrics.WaitingQueueSize = 3
		snap.Endpoints[i].Metrics.RunningQueueSize = 40
	}
	snap.Endpoints[4].Metrics.WaitingQueueSize, snap.Endpoints[4].Metrics.RunningQueueSize = 0, 10 // the least loaded
	rig := newPrefixRig(t, nil, "")
	scoring := newScheduler(t, `{"profile": "scoring"}`, seeded(7))
	unique := func(i int) string {
		return fmt.Sprintf("%08d unique prompt %d that shares nothing, long enough for several blocks of hashes", i*7919, i)
	}

	_, _, res := rig.route(t, snap, "m", unique(0), Critical)
	assert.Equal(t, PathPrefixConsistent, res.Path, "a fresh worker assumes prompts are reused")
	for i := 1; i < 1000; i++ {
		name, _, res := rig.route(t, snap, "m", unique(i), Critical)
		if i < 19 { // the share counting prompt i is 1/(i+2): below minReuse from the 20th
			require.Equal(t, PathPrefixConsistent, res.Path, "request %d, reuse share %.3f", i, rig.reuse(t))
			continue
		}
		require.Equal(t, PathPrefixUnshared, res.Path, "request %d, reuse share %.3f", i, rig.reuse(t))
		want := scoring.Schedule(&Request{Model: "m", TargetModel: "m", Criticality: Critical}, snap)
		require.Equal(t, want.Endpoint.ID.Name, name, "request %d goes where scoring sends it", i)
		require.Equal(t, "pod-4", name)
	}
	assert.Less(t, rig.reuse(t), 0.01)

	// A document sent again and again: reuse climbs back over minReuse and
	// new prompts get the consistent choice again.
	doc := longPrompt("a shared manual", 20)
	for i := range 40 {
		rig.route(t, snap, "m", doc+fmt.Sprintf("question %d?", i), Critical)
	}
	assert.Greater(t, rig.reuse(t), DefaultPrefixMinReuse)
	_, _, res = rig.route(t, snap, "m", unique(5000), Critical)
	assert.Equal(t, PathPrefixConsistent, res.Path)

	// minReuse 0: always the consistent choice.
	always := newPrefixRig(t, nil, `{"profile": "p", "plugins": [{"type": "prefix-affinity-filter", "name": "aff", "parameters": {"minReuse": 0}}],
		"profiles": {"p": {"filters": ["aff"], "scorers": [{"scorer": "queue-scorer", "weight": 1}], "picker": "max-score-picker"}}}`)
	for i := range 600 {
		_, _, res := always.route(t, snap, "m", unique(i), Critical)
		require.Equal(t, PathPrefixConsistent, res.Path, "request %d", i)
	}
}

// reuse is the rig's prefix-affinity filter's reuse share.
func (r *prefixRig) reuse(t testing.TB) float64 {
	t.Helper()
	for _, p := range r.s.ProfileFor(Critical).Filters {
		if f, ok := p.(*PrefixAffinityFilter); ok {
			return f.Reuse()
		}
	}
	t.Fatal("no prefix-affinity filter")
	return 0
}

func TestPrefixAwareNeedsNoPrefix(t *testing.T) {
	// Without Request.Prefix the profile is the scoring profile.
	snap := idle(3)
	snap.Endpoints[1].Metrics.WaitingQueueSize = 0
	snap.Endpoints[0].Metrics.WaitingQueueSize = 4
	snap.Endpoints[2].Metrics.WaitingQueueSize = 4
	s := newScheduler(t, `{"profile": "prefix-aware"}`, seeded(1))
	res := s.Schedule(&Request{Model: "m", Criticality: Critical}, snap)
	require.Equal(t, Routed, res.Outcome)
	assert.Equal(t, "pod-1", res.Endpoint.ID.Name)
	assert.Equal(t, PathPrefixNone, res.Path)
	assert.Subset(t, s.Paths(), []string{PathPrefixAffinity, PathPrefixConsistent, PathPrefixSaturated, PathPrefixNone, PathPrefixUnshared})
}

func TestPrefixAffinityParameters(t *testing.T) {
	_, err := DecodeConfig([]byte(`{"plugins": [{"type": "prefix-affinity-filter", "parameters": {"keepRatio": 0.5, "queueThreshold": 3, "consistentHashing": false}}]}`))
	require.NoError(t, err)
	for params, msg := range map[string]string{
		`{"keepRatio": 0}`:        "keepRatio: must be in (0,1]",
		`{"balanceFactor": 1}`:    "balanceFactor: must be a finite number > 1",
		`{"kvCacheThreshold": 2}`: "kvCacheThreshold: must be in [0,1]",
		`{"queueThreshold": -1}`:  "queueThreshold: must be >= 0",
		`{"minCapacity": -1}`:     "minCapacity: must be >= 0",
		`{"minMatchBlocks": -2}`:  "minMatchBlocks: must be >= 0",
		`{"minReuse": 1.5}`:       "minReuse: must be in [0,1]",
		`{"sticky": true}`:        `unknown field "sticky"`,
	} {
		_, err := New(Config{Plugins: []PluginSpec{{Type: TypePrefixAffinityFilter, Parameters: json.RawMessage(params)}}}, nil, seeded(1))
		require.Error(t, err, params)
		assert.Contains(t, err.Error(), msg, params)
	}
}

func TestPrefixAwareAllocatesNothing(t *testing.T) {
	snap := idle(16)
	rig := newPrefixRig(t, prefix.NewMemStore(), "")
	raw, _ := json.Marshal(longPrompt("alloc", 40))
	rig.route(t, snap, "m", longPrompt("alloc", 40), Critical)
	n := testing.AllocsPerRun(100, func() {
		_ = rig.h.HashPrompt("m", nil, raw)
		rig.req = Request{Model: "m", Criticality: Critical}
		rig.t.Prepare(&rig.req, snap, rig.h.Blocks(), rig.h.Key())
		res := rig.s.Schedule(&rig.req, snap)
		rig.t.Routed(res.Index, prefixT0)
	})
	assert.Zero(t, n)
}

func TestPrefixConfig(t *testing.T) {
	c, err := DecodePrefixConfig(nil)
	require.NoError(t, err)
	assert.Equal(t, DefaultPrefixConfig(), c)
	c, err = DecodePrefixConfig([]byte(`{"blockBytes": 128, "index": {"maxEntries": 4096, "bucketEntries": 8}, "shared": false, "syncInterval": "20ms"}`))
	require.NoError(t, err)
	assert.Equal(t, 128, c.Hash.BlockBytes)
	assert.Equal(t, 4096, c.Index.MaxEntries)
	assert.False(t, c.Shared)
	assert.Equal(t, 20*time.Millisecond, c.SyncInterval)
	for doc, msg := range map[string]string{
		`{"blockBytes": 3}`:                  "blockBytes: blockBytes must be in [8, 4096], got 3",
		`{"maxBlocks": -1}`:                  "maxBlocks: maxBlocks must be in [1, 1048576], got -1",
		`{"syncInterval": "fast"}`:           `syncInterval: "fast": want a duration from 1ms to 10s, like "50ms"`,
		`{"index": {"bucketEntries": 5000}}`: "index: bucketEntries must be in [1, 1024], got 5000",
		`{"index": {"maxBytes": 10}}`:        "index: maxBytes 10 holds no bucket",
		`{"index": {"extra": 1}}`:            `index: unknown field "extra"`,
		`{"blocks": 1}`:                      `unknown field "blocks"`,
	} {
		_, err := DecodePrefixConfig([]byte(doc))
		require.Error(t, err, doc)
		assert.Contains(t, err.Error(), msg, doc)
	}
	assert.True(t, newScheduler(t, `{"profile": "prefix-aware"}`, seeded(1)).UsesPrefix())
	assert.False(t, newScheduler(t, `{"profile": "scoring"}`, seeded(1)).UsesPrefix())
}
