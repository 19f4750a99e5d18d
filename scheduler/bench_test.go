package scheduler

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// benchSizes are the snapshot sizes of the scheduler benchmarks.
var benchSizes = []int{8, 64, 512, 1000, 5000}

// benchModes are the ways of deciding compared: visiting every endpoint
// (scan, as below DefaultIndexMinEndpoints) and the per-snapshot index.
var benchModes = []struct {
	name         string
	minEndpoints int
}{{"scan", -1}, {"index", 1}}

func benchRequests() []*Request {
	var reqs []*Request
	for i := range 30 {
		reqs = append(reqs, &Request{Model: adapterName(i % 10), Criticality: Criticality(i % 3)})
	}
	return reqs
}

// BenchmarkSchedule measures one decision per op for each built-in profile
// at each size, scanning and indexed, on an unchanging snapshot (the index
// is built once). Requests rotate over 10 adapters and the three
// criticalities, so every branch of the tree is exercised.
//
//	go test -run '^$' -bench BenchmarkSchedule -benchmem ./scheduler/
func BenchmarkSchedule(b *testing.B) {
	benchSchedule(b, []string{"decision-tree", "scoring", "least-request", "random", "round-robin"}, benchRequests())
}

// BenchmarkScheduleBaseModel is BenchmarkSchedule for requests of the base
// model, which no endpoint lists as an adapter: the profiles whose
// decision depends on the target adapter then have no holders to score,
// and the indexed decision is O(log N) alone.
//
//	go test -run '^$' -bench BenchmarkScheduleBaseModel -benchmem ./scheduler/
func BenchmarkScheduleBaseModel(b *testing.B) {
	var reqs []*Request
	for i := range 3 {
		reqs = append(reqs, &Request{Model: "base", Criticality: Criticality(i)})
	}
	benchSchedule(b, []string{"decision-tree", "scoring"}, reqs)
}

func benchSchedule(b *testing.B, profiles []string, reqs []*Request) {
	for _, profile := range profiles {
		for _, n := range benchSizes {
			for _, mode := range benchModes {
				b.Run(fmt.Sprintf("profile=%s/endpoints=%d/%s", profile, n, mode.name), func(b *testing.B) {
					snap := randomSnapshot(newRand(uint64(n)), n)
					o := seeded(1)
					o.IndexMinEndpoints = mode.minEndpoints
					s := newScheduler(b, `{"profile": "`+profile+`"}`, o)
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
}

// BenchmarkLeastLoaded measures the body-less (GET /v1/models) decision.
func BenchmarkLeastLoaded(b *testing.B) {
	for _, n := range benchSizes {
		for _, mode := range benchModes {
			b.Run(fmt.Sprintf("endpoints=%d/%s", n, mode.name), func(b *testing.B) {
				snap := randomSnapshot(newRand(uint64(n)), n)
				o := seeded(1)
				o.IndexMinEndpoints = mode.minEndpoints
				s := newScheduler(b, ``, o)
				b.ReportAllocs()
				for b.Loop() {
					s.LeastLoaded(snap)
				}
			})
		}
	}
}

// BenchmarkScheduleCounting is a decision followed by Observe with
// countRoutedSinceSnapshot on (the counts grow without a new snapshot; only
// the cost matters here). Indexed, each Observe moves the chosen endpoint
// in the orders.
//
//	go test -run '^$' -bench BenchmarkScheduleCounting -benchmem ./scheduler/
func BenchmarkScheduleCounting(b *testing.B) {
	reqs := benchRequests()
	for _, profile := range []string{"decision-tree", "scoring"} {
		for _, n := range []int{64, 1000} {
			for _, mode := range benchModes {
				b.Run(fmt.Sprintf("profile=%s/endpoints=%d/%s", profile, n, mode.name), func(b *testing.B) {
					snap := randomSnapshot(newRand(uint64(n)), n)
					o := seeded(1)
					o.IndexMinEndpoints = mode.minEndpoints
					s := newScheduler(b, countingConfig(profile, true), o)
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
	}
}

// BenchmarkIndexRebuild is the per-snapshot cost of the index: one
// decision on a snapshot whose metrics were all rewritten in place
// (Snapshot.Changed), so the index and the orders the decision reads are
// built again; the decision itself is BenchmarkSchedule's. Each op
// alternates between two sets of values 50 ms of serving apart (drift),
// so the orders are rebuilt from nearly sorted input, as from one scrape
// to the next.
//
//	go test -run '^$' -bench BenchmarkIndexRebuild -benchmem ./scheduler/
func BenchmarkIndexRebuild(b *testing.B) {
	reqs := benchRequests()
	for _, profile := range []string{"decision-tree", "least-request"} {
		for _, n := range benchSizes[1:] {
			b.Run(fmt.Sprintf("profile=%s/endpoints=%d", profile, n), func(b *testing.B) {
				r := newRand(uint64(n))
				snap := randomSnapshot(r, n)
				var values [2][]Metrics
				for i := range snap.Endpoints {
					m := snap.Endpoints[i].Metrics
					values[0] = append(values[0], m)
					drift(r, &m)
					values[1] = append(values[1], m)
				}
				o := seeded(1)
				o.IndexMinEndpoints = 1
				s := newScheduler(b, `{"profile": "`+profile+`"}`, o)
				s.index.eager = true
				for _, req := range reqs { // every order built once
					s.Schedule(req, snap)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					for k, m := range values[i%2] {
						snap.Endpoints[k].Metrics = m
					}
					snap.Changed()
					s.Schedule(reqs[i%len(reqs)], snap)
					i++
				}
			})
		}
	}
}

// BenchmarkIndexUpdate is one decision after k endpoints got fresh
// metrics in place (Snapshot.MetricsChanged each), as a router refresh
// that rewrote k endpoints does; per op: the k updates and the decision.
// "drift" changes what a scrape 50 ms later changes (KV use and the
// running batch always, the queue by one now and then, adapters rarely);
// "random" draws every value anew, adapters included (the worst case:
// entries move across the orders and adapter lists change every time);
// "heartbeat" keeps the values (an agent's periodic resend). Every kind
// gives the endpoint a new update time, as a re-read does.
//
//	go test -run '^$' -bench BenchmarkIndexUpdate -benchmem ./scheduler/
func BenchmarkIndexUpdate(b *testing.B) {
	reqs := benchRequests()
	for _, kind := range []string{"drift", "random", "heartbeat"} {
		for _, n := range benchSizes[1:] {
			for _, k := range []int{1, 16, 64} {
				b.Run(fmt.Sprintf("%s/endpoints=%d/changed=%d", kind, n, k), func(b *testing.B) {
					r := newRand(uint64(n))
					snap := randomSnapshot(r, n)
					fresh := randomSnapshot(r, 256).Endpoints // values to write
					o := seeded(1)
					o.IndexMinEndpoints = 1
					s := newScheduler(b, `{"profile": "decision-tree"}`, o)
					for _, req := range reqs {
						s.Schedule(req, snap)
					}
					b.ReportAllocs()
					i, j := 0, 0
					for b.Loop() {
						for range k {
							e := j * 7919 % n
							m := &snap.Endpoints[e].Metrics
							switch kind {
							case "random":
								*m = fresh[j%len(fresh)].Metrics
							case "drift":
								drift(r, m)
							}
							m.UpdateTime = m.UpdateTime.Add(time.Millisecond) // every rewrite is a new scrape
							snap.MetricsChanged(e)
							j++
						}
						s.Schedule(reqs[i%len(reqs)], snap)
						i++
					}
				})
			}
		}
	}
}

// drift changes m as 50 ms of serving would.
func drift(r interface{ IntN(int) int }, m *Metrics) {
	m.KVCacheUsage = min(1, max(0, m.KVCacheUsage+float64(r.IntN(21)-10)/1000))
	m.RunningQueueSize = max(0, m.RunningQueueSize+r.IntN(5)-2)
	if r.IntN(4) == 0 {
		m.WaitingQueueSize = max(0, m.WaitingQueueSize+r.IntN(3)-1)
	}
	if r.IntN(50) == 0 && len(m.WaitingModels) > 0 {
		m.WaitingModels = m.WaitingModels[1:]
	}
}

// BenchmarkSchedulePrefixAware is one prefix-aware decision per op, the
// tracker's lookup (PrefixTracker.Prepare) included, scanning and
// indexed. Prompts share a few long contexts:
//
//   - prompts=known: they have been routed before, so most take the
//     affinity path;
//
//   - prompts=new: the index knows none of them and the affinity filter's
//     minReuse is 0, so every one gets the consistent choice for a new
//     prefix (rendezvous over the pool, narrowed to the target adapter's
//     holders where it runs);
//
//   - prompts=unique: the index knows none of them under the default
//     minReuse, so once the reuse share has fallen below it they go to
//     the scorers (prefix/unshared).
//
//     go test -run '^$' -bench BenchmarkSchedulePrefixAware -benchmem ./scheduler/
func BenchmarkSchedulePrefixAware(b *testing.B) {
	h, err := prefix.NewHasher(prefix.HashConfig{})
	if err != nil {
		b.Fatal(err)
	}
	prompts := sharedPrompts(b, h)
	const newPrefixes = `{"profile": "p", "plugins": [{"type": "prefix-affinity-filter", "name": "pa", "parameters": {"minReuse": 0}}],
		"profiles": {"p": {"filters": ["shed-filter", "pa"], "scorers": [{"scorer": "prefix-cache-scorer", "weight": 3},
		{"scorer": "lora-affinity-scorer", "weight": 10}, {"scorer": "queue-scorer", "weight": 1},
		{"scorer": "kv-cache-scorer", "weight": 2}, {"scorer": "running-requests-scorer", "weight": 1}], "picker": "max-score-picker"}}}`
	for _, kind := range []struct {
		name, config string
		known        bool
	}{{"known", `{"profile": "prefix-aware"}`, true}, {"new", newPrefixes, false}, {"unique", `{"profile": "prefix-aware"}`, false}} {
		for _, n := range benchSizes {
			for _, mode := range benchModes {
				b.Run(fmt.Sprintf("prompts=%s/endpoints=%d/%s", kind.name, n, mode.name), func(b *testing.B) {
					benchPrefixAware(b, n, mode.minEndpoints, kind.config, kind.known, prompts)
				})
			}
		}
	}
}

type benchPrompt struct {
	blocks []uint64
	key    uint64
	model  string
}

// sharedPrompts are 40 prompts hashed with h, sharing 8 long contexts,
// half of them for the base model and half for adapters.
func sharedPrompts(b *testing.B, h *prefix.Hasher) []benchPrompt {
	var prompts []benchPrompt
	for i := range 40 {
		raw, _ := json.Marshal(fmt.Sprintf("%s question %d?", strings.Repeat(fmt.Sprintf("Context %d that every question repeats. ", i%8), 40), i))
		model := []string{"base", adapterName(i % 10)}[i%2]
		if err := h.HashPrompt(model, nil, raw); err != nil {
			b.Fatal(err)
		}
		prompts = append(prompts, benchPrompt{slices.Clone(h.Blocks()), h.Key(), model})
	}
	return prompts
}

func benchPrefixAware(b *testing.B, n, minEndpoints int, config string, known bool, prompts []benchPrompt) {
	snap := randomSnapshot(newRand(uint64(n)), n)
	o := seeded(1)
	o.IndexMinEndpoints = minEndpoints
	s := newScheduler(b, config, o)
	idx, err := prefix.NewIndex(prefix.IndexConfig{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	t := NewPrefixTracker(idx)
	var req Request
	decide := func(i int) Result {
		p := &prompts[i%len(prompts)]
		req = Request{Model: p.model, TargetModel: p.model, Criticality: Criticality(i % 3)}
		t.Prepare(&req, snap, p.blocks, p.key)
		return s.Schedule(&req, snap)
	}
	for i := range 1000 { // the index learns where prompts went; the reuse share settles
		if res := decide(i); res.Outcome == Routed && known {
			t.Routed(res.Index, time.Unix(0, 0))
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		decide(i)
		i++
	}
}

// BenchmarkScheduleChurn is one decision after a refresh that rewrote
// most endpoints in place, as a router re-reading a relay at the knee's
// change rate does: per op, 82 % of the blocks of two endpoints get the
// other of two sets of values (drift apart, new update times) and one
// MetricsChangedRange each, then one decision (none in mode "write", the
// rewrite's own cost). Every decision finds more changes than the index
// applies one by one.
//
//	go test -run '^$' -bench BenchmarkScheduleChurn -benchmem ./scheduler/
func BenchmarkScheduleChurn(b *testing.B) {
	reqs := benchRequests()
	for _, n := range []int{1000, 5000} {
		for _, mode := range churnModes {
			b.Run(fmt.Sprintf("endpoints=%d/%s", n, mode.name), func(b *testing.B) {
				benchChurn(b, randomSnapshot, false, n, mode.minEndpoints, `{"profile": "decision-tree"}`, len(reqs), func(s *Scheduler, snap *Snapshot, i int, warm bool) {
					if warm || mode.name != "write" {
						s.Schedule(reqs[i%len(reqs)], snap)
					}
				})
			})
		}
	}
}

var churnModes = []struct {
	name         string
	minEndpoints int
}{{"write", 0}, {"scan", -1}, {"index", 1}}

// BenchmarkScheduleChurnPrefixAware is BenchmarkScheduleChurn for the
// built-in prefix-aware profile (the one envoy/envoy.yaml, and so the
// scale bench, runs), the tracker's lookup (PrefixTracker.Prepare) in
// every op as in the plugin:
//
//   - prompt=bench: e2e/scale's request (a Standard request for the base
//     model "chat", one short user message: no whole block, so
//     prefix/none) on a fleet like its agents' after a while at the knee
//     (scaleSnapshot);
//   - prompt=shared: prompts sharing 8 long contexts, half of them for
//     adapters, every criticality, routed before (so most take the
//     affinity path).
//
// Mode "scan" decides without the index (IndexMinEndpoints -1). The clock
// carries a monotonic reading, as the plugin's (time.Now) does.
//
//	go test -run '^$' -bench BenchmarkScheduleChurnPrefixAware -benchmem ./scheduler/
func BenchmarkScheduleChurnPrefixAware(b *testing.B) {
	h, err := prefix.NewHasher(prefix.HashConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if err := h.HashMessages("chat", nil, nil, []byte(`[{"role":"user","content":"Say hello in one word."}]`)); err != nil {
		b.Fatal(err)
	}
	bench := []benchPrompt{{slices.Clone(h.Blocks()), h.Key(), "chat"}}
	shared := sharedPrompts(b, h)
	for _, kind := range []struct {
		name    string
		prompts []benchPrompt
		fleet   func(*rand.Rand, int) *Snapshot
	}{{"bench", bench, scaleSnapshot}, {"shared", shared, randomSnapshot}} {
		for _, n := range []int{1000, 5000} {
			for _, mode := range churnModes {
				b.Run(fmt.Sprintf("prompt=%s/endpoints=%d/%s", kind.name, n, mode.name), func(b *testing.B) {
					idx, err := prefix.NewIndex(prefix.IndexConfig{}, nil)
					if err != nil {
						b.Fatal(err)
					}
					t := NewPrefixTracker(idx)
					var req Request
					benchChurn(b, kind.fleet, true, n, mode.minEndpoints, `{"profile": "prefix-aware"}`, 1000, func(s *Scheduler, snap *Snapshot, i int, warm bool) {
						p := &kind.prompts[i%len(kind.prompts)]
						crit := Standard
						if kind.name == "shared" {
							crit = Criticality(i % 3)
						}
						req = Request{Model: p.model, TargetModel: p.model, Criticality: crit}
						if !warm && mode.name == "write" {
							return
						}
						t.Prepare(&req, snap, p.blocks, p.key)
						if res := s.Schedule(&req, snap); warm && res.Outcome == Routed {
							t.Routed(res.Index, time.Unix(0, 0)) // the warm-up: the index learns
						}
					})
				})
			}
		}
	}
}

// benchChurn runs decide once per op after a knee-like rewrite of a
// snapshot of n endpoints drawn by fleet, with a Scheduler of config
// (IndexMinEndpoints minEndpoints, StaleAfter 2s, a fixed clock, with a
// monotonic reading if mono), after warm calls on the snapshot as drawn.
func benchChurn(b *testing.B, fleet func(*rand.Rand, int) *Snapshot, mono bool, n, minEndpoints int, config string, warm int, decide func(s *Scheduler, snap *Snapshot, i int, warm bool)) {
	r := newRand(uint64(n))
	snap := fleet(r, n)
	now := time.Unix(10_000, 0)
	clock := now
	if mono {
		m := time.Now()
		clock = m.Add(now.Sub(m)) // now's wall clock, and a monotonic reading
	}
	var values [2][]Metrics
	for i := range snap.Endpoints {
		m := &snap.Endpoints[i].Metrics
		m.UpdateTime = now.Add(-time.Duration(r.IntN(100)) * time.Millisecond)
		values[0] = append(values[0], *m)
		d := *m
		drift(r, &d)
		d.UpdateTime = d.UpdateTime.Add(50 * time.Millisecond)
		values[1] = append(values[1], d)
	}
	o := seeded(1)
	o.IndexMinEndpoints = minEndpoints
	o.StaleAfter = 2 * time.Second
	o.Now = func() time.Time { return clock }
	s := newScheduler(b, config, o)
	for i := range warm {
		decide(s, snap, i, true)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		vals := values[i%2]
		for blk := 0; blk < n/2; blk++ {
			if (blk*7+i)%50 >= 41 {
				continue
			}
			snap.Endpoints[2*blk].Metrics = vals[2*blk]
			snap.Endpoints[2*blk+1].Metrics = vals[2*blk+1]
			snap.MetricsChangedRange(2*blk, 2*blk+2)
		}
		decide(s, snap, i, false)
		i++
	}
}

// scaleSnapshot draws a fleet like e2e/scale's (NewFleet) after its
// agents' values walked for a while: 4 adapter slots, one or two of the
// six adapters of 16 an endpoint serves running, queues and batches
// spread over their walks' ranges (0-40 waiting, 0-64 running, KV-cache
// use below 0.98).
func scaleSnapshot(r *rand.Rand, n int) *Snapshot {
	snap := &Snapshot{Endpoints: make([]Endpoint, n)}
	for i := range snap.Endpoints {
		serves := r.Perm(16)[:6]
		active := []string{fmt.Sprintf("lora-%02d", serves[0])}
		if r.IntN(2) == 0 && serves[1] > serves[0] {
			active = append(active, fmt.Sprintf("lora-%02d", serves[1]))
		}
		snap.Endpoints[i] = Endpoint{
			ID:      EndpointID{Namespace: "llm", Name: fmt.Sprintf("vllm-%05d-%d", i/2, i%2)},
			Address: fmt.Sprintf("127.0.%d.%d", (i+1)>>8, (i+1)&255), Port: 8000,
			Metrics: Metrics{
				WaitingQueueSize: r.IntN(41), RunningQueueSize: r.IntN(65), KVCacheUsage: r.Float64() * 0.98,
				MaxActiveModels: 4, ActiveModels: active,
			},
		}
	}
	return snap
}

// BenchmarkSchedulePrefixAwareHostShape is the scheduler's share of
// e2e/envoyhost's BenchmarkPrefixFilterCallbacks at 4 KiB: the built-in
// prefix-aware profile over that benchmark's 8 endpoints (its metrics,
// fresh, StaleAfter 2s), a Critical request for the base model whose
// 64-block prompt one endpoint holds (the affinity path). "prepare" is
// the tracker's lookup alone, "decide" the lookup and the decision, so
// their difference is the decision; "decide+routed" adds recording where
// it went. Built for wasip1 and run under wazero with cachegrind it gives
// the guest's instructions per decision (BENCHMARKS.md, "Prefix-aware
// routing: cost per request").
//
//	go test -run '^$' -bench BenchmarkSchedulePrefixAwareHostShape -benchmem ./scheduler/
func BenchmarkSchedulePrefixAwareHostShape(b *testing.B) {
	now := time.Unix(1_000_000, 0)
	snap := &Snapshot{Endpoints: make([]Endpoint, 8)}
	for i := range snap.Endpoints {
		snap.Endpoints[i] = Endpoint{
			ID:      EndpointID{Namespace: "llm", Name: fmt.Sprintf("vllm-%03d", i)},
			Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8000,
			Metrics: Metrics{
				WaitingQueueSize: i % 4, RunningQueueSize: 5 + i%11, KVCacheUsage: float64(i%70) / 100,
				MaxActiveModels: 4, ActiveModels: []string{fmt.Sprintf("adapter-%d", i%5)}, UpdateTime: now,
			},
		}
	}
	blocks := make([]uint64, 64)
	for i := range blocks {
		blocks[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	for _, sub := range []string{"prepare", "decide", "decide+routed"} {
		b.Run(sub, func(b *testing.B) {
			o := seeded(1)
			o.Now = func() time.Time { return now }
			o.StaleAfter = 2 * time.Second
			s := newScheduler(b, `{"profile": "prefix-aware"}`, o)
			idx, err := prefix.NewIndex(prefix.IndexConfig{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			t := NewPrefixTracker(idx)
			req := Request{Model: "chat", Criticality: Critical}
			t.Prepare(&req, snap, blocks, blocks[0])
			if res := s.Schedule(&req, snap); res.Outcome != Routed {
				b.Fatal(res)
			} else {
				t.Routed(res.Index, now)
			}
			b.ReportAllocs()
			for b.Loop() {
				t.Prepare(&req, snap, blocks, blocks[0])
				if sub == "prepare" {
					continue
				}
				res := s.Schedule(&req, snap)
				if sub == "decide+routed" {
					t.Routed(res.Index, now)
				}
			}
		})
	}
}
