package fleet

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// Prefix policy names.
const (
	// PolicyPrefixAware is the plugin's prefix-aware routing: the
	// prefix-aware profile with the index in each gateway's shared data,
	// synced at every tick.
	PolicyPrefixAware = scheduler.ProfilePrefixAware
	// PolicyPrefixPerVM is the same profile with an index per worker VM
	// and nothing shared (as Higress' in-proxy picker keeps it).
	PolicyPrefixPerVM = "prefix-aware-per-vm"
	// PolicyConsistentHash is the same profile with no index at all:
	// rendezvous hashing with bounded loads and the load guard only, for
	// every prompt (minReuse 0: without an index no prompt is ever seen
	// reused, so the default would hand every one to the scorers).
	PolicyConsistentHash = "consistent-hash"
	// PolicyLLMDApproximate is llm-d's approximate prefix scorer with its
	// default profile, one picker for every gateway (LLMDApprox).
	PolicyLLMDApproximate = "llmd-approx"
)

// PrefixPolicies are the prefix-aware policies of the prefix benchmark.
func PrefixPolicies() []PolicySpec {
	cfg := scheduler.Config{Profile: scheduler.ProfilePrefixAware}
	return []PolicySpec{
		PrefixPolicySpec(PolicyPrefixAware, cfg, IndexShared),
		PrefixPolicySpec(PolicyPrefixPerVM, cfg, IndexPerVM),
		PrefixPolicySpec(PolicyConsistentHash, consistentHashConfig(), IndexNone),
		LLMDPolicySpec(),
	}
}

// consistentHashConfig is the prefix-aware profile whose affinity filter
// makes the consistent choice for every prompt nobody holds.
func consistentHashConfig() scheduler.Config {
	spec := scheduler.BuiltinProfiles()[scheduler.ProfilePrefixAware]
	spec.Filters = slices.Clone(spec.Filters)
	const name = "always-consistent"
	for i, f := range spec.Filters {
		if f == scheduler.TypePrefixAffinityFilter {
			spec.Filters[i] = name
		}
	}
	return scheduler.Config{
		Profile:  PolicyConsistentHash,
		Plugins:  []scheduler.PluginSpec{{Type: scheduler.TypePrefixAffinityFilter, Name: name, Parameters: json.RawMessage(`{"minReuse": 0}`)}},
		Profiles: map[string]scheduler.ProfileSpec{PolicyConsistentHash: spec},
	}
}

// IndexMode says where a prefix-aware fleet policy keeps its index.
type IndexMode int

const (
	// IndexShared: one index per gateway in its shared data.
	IndexShared IndexMode = iota
	// IndexPerVM: each worker VM its own.
	IndexPerVM
	// IndexNone: nothing recorded.
	IndexNone
)

// PrefixPolicySpec routes with the scheduler configured by cfg, hashing
// each prompt's token ids as the plugin hashes a prompt of ids
// (prefix.Hasher.HashTokens, so a block is 16 tokens), with the plugin's
// index kept as mode says. With IndexShared the VMs of one gateway share
// one store (their Envoy's shared data) and sync at every tick (the
// scrape, 50 ms, the plugin's default syncInterval): one VM sees another's
// decisions one to two ticks later, as in the plugin.
func PrefixPolicySpec(name string, cfg scheduler.Config, mode IndexMode) PolicySpec {
	return prefixPolicySpec(name, cfg, mode, 0)
}

// prefixPolicySpec is PrefixPolicySpec with the scheduler's
// Options.IndexMinEndpoints (0: its default).
func prefixPolicySpec(name string, cfg scheduler.Config, mode IndexMode, indexMinEndpoints int) PolicySpec {
	return PolicySpec{Name: name, CountsRouted: cfg.CountsRoutedSinceSnapshot(),
		New: func(seed uint64, clock func() time.Time) (Policy, error) {
			s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{
				Rand: rand.NewPCG(seed, 0x5c4e), Now: clock, StaleAfter: DefaultStaleAfter, FailOpen: true,
				IndexMinEndpoints: indexMinEndpoints,
			})
			if err != nil {
				return nil, err
			}
			h, err := prefix.NewHasher(prefix.HashConfig{})
			if err != nil {
				return nil, err
			}
			p := &prefixPolicy{s: s, h: h, mode: mode, clock: clock, pending: map[uint64]pendingPrediction{}}
			if err := p.useStore(nil); err != nil { // replaced by Place for a shared index
				return nil, err
			}
			return p, nil
		}}
}

type prefixPolicy struct {
	s       *scheduler.Scheduler
	h       *prefix.Hasher
	t       *scheduler.PrefixTracker
	idx     *prefix.Index
	mode    IndexMode
	clock   func() time.Time
	pending map[uint64]pendingPrediction
	pred    Prediction
}

type pendingPrediction struct {
	endpoint          uint32
	blocks, predicted int
	kept              []uint64
}

var (
	_ Placed             = (*prefixPolicy)(nil)
	_ ResponseObserver   = (*prefixPolicy)(nil)
	_ Ticker             = (*prefixPolicy)(nil)
	_ PredictionReporter = (*prefixPolicy)(nil)
)

// gatewayStore is the key of a gateway's shared data in GatewayShared.
type gatewayStore struct{}

func (p *prefixPolicy) useStore(store prefix.Store) error {
	idx, err := prefix.NewIndex(prefix.IndexConfig{}, store)
	if err != nil {
		return err
	}
	p.idx, p.t = idx, scheduler.NewPrefixTracker(idx)
	return nil
}

func (p *prefixPolicy) Place(pl Placement) {
	if p.mode == IndexShared && pl.Shared != nil {
		store := pl.Shared.Value(gatewayStore{}, func() any { return prefix.NewMemStore() }).(prefix.Store)
		_ = p.useStore(store) // the configuration was validated in New
	}
}

func (p *prefixPolicy) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	target, tokens, id := promptOf(req, v)
	p.h.HashTokens(target, nil, tokens)
	p.t.Prepare(req, v.Snapshot, p.h.Blocks(), p.h.Key())
	res := p.s.Schedule(req, v.Snapshot)
	req.Prefix = nil
	if res.Outcome != scheduler.Routed && res.Outcome != scheduler.FailedOpen {
		return -1, res.Outcome
	}
	p.s.Observe(req, res)
	predicted := p.t.Match().Blocks(p.t.KeyOf(res.Index))
	if p.mode != IndexNone {
		predicted = p.t.Routed(res.Index, p.clock())
	}
	blocks := p.h.Blocks()
	pp := pendingPrediction{endpoint: p.t.KeyOf(res.Index), blocks: len(blocks), predicted: predicted}
	if predicted > 0 && p.mode != IndexNone {
		pp.kept = append([]uint64(nil), blocks[:predicted]...)
	}
	p.pending[id] = pp
	return res.Index, scheduler.Routed
}

func (p *prefixPolicy) FirstToken(Response) {}

// promptOf is what a prefix policy reads of the request it routes: the
// target (the requested model when nothing resolved one), the prompt's
// token ids and the request's id (View.Request; none without it).
func promptOf(req *scheduler.Request, v *View) (target string, tokens []uint32, id uint64) {
	target = req.TargetModel
	if target == "" {
		target = req.Model
	}
	if v.Request != nil {
		tokens, id = v.Request.Prompt, v.Request.ID
	}
	return target, tokens, id
}

// Finished judges the prediction against the usage the replica reported,
// and removes a predicted hit it reports as a miss, as the plugin does.
func (p *prefixPolicy) Finished(r Response) {
	pp, ok := p.pending[r.ID]
	if !ok {
		return
	}
	delete(p.pending, r.ID)
	if r.CachedTokens < 0 {
		return // not reported: nothing learned
	}
	predTokens, forget := prefix.Judge(pp.blocks, pp.predicted, int64(r.PromptTokens), int64(r.CachedTokens), p.idx.Config().RecordEvery)
	p.pred.judge(r.PromptTokens, r.CachedTokens, predTokens, forget >= 0)
	if forget >= 0 && p.mode != IndexNone {
		p.idx.Forget(pp.kept, pp.endpoint, forget, Epoch.Add(r.At))
	}
}

func (p *prefixPolicy) Tick(time.Duration) {
	if p.mode == IndexShared {
		p.idx.Sync()
	}
}

func (p *prefixPolicy) Prediction() Prediction { return p.pred }

func (pr *Prediction) judge(prompt, cached int, predicted int64, mispredicted bool) {
	pr.Judged++
	pr.PromptTokens += int64(prompt)
	pr.CachedTokens += int64(cached)
	pr.PredictedTokens += predicted
	if mispredicted {
		pr.Mispredicted++
	}
	ph, rh := 2*predicted > int64(prompt), 2*cached > prompt
	if ph {
		pr.PredictedHits++
	}
	if rh {
		pr.ReportedHits++
	}
	if ph && rh {
		pr.BothHits++
	}
}

// LLMDPolicySpec is llm-d's approximate prefix scorer with its default
// profile, one picker for every gateway (LLMDApprox), its per-pod LRU
// sized by the replicas' KV blocks (autoTune).
func LLMDPolicySpec() PolicySpec {
	cfg := LLMDProfile()
	return PolicySpec{Name: PolicyLLMDApproximate, New: func(seed uint64, clock func() time.Time) (Policy, error) {
		s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{
			Rand: rand.NewPCG(seed, 0x11d), Now: clock, StaleAfter: DefaultStaleAfter, FailOpen: true,
		})
		if err != nil {
			return nil, err
		}
		return &llmdPolicy{s: s, pending: map[uint64]float64{}}, nil
	}}
}

type llmdPolicy struct {
	s       *scheduler.Scheduler
	a       *LLMDApprox
	pending map[uint64]float64
	pred    Prediction
}

// llmdPicker is the key of the one picker in the run's shared state.
type llmdPicker struct{}

func (p *llmdPolicy) Place(pl Placement) {
	if pl.Run != nil {
		p.a = pl.Run.Value(llmdPicker{}, func() any { return &LLMDApprox{} }).(*LLMDApprox)
	}
}

func (p *llmdPolicy) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	if p.a == nil {
		p.a = &LLMDApprox{}
	}
	a := p.a
	if a.holders == nil {
		// autoTune: the LRU of a pod holds its num_gpu_blocks entries
		// (vllm:cache_config_info; read here from the replicas' static
		// configuration, which every router may know).
		blocks := DefaultLLMDCapacity
		if len(v.Replicas) > 0 {
			c := v.Replicas[0].Config()
			blocks = c.KVCapacityTokens / c.BlockSize
		}
		*a = *NewLLMDApprox(func(int) int { return blocks })
	}
	target, tokens, id := promptOf(req, v)
	a.hashPrompt(target, tokens)
	a.match(len(v.Snapshot.Endpoints))
	req.Prefix = &llmdInfo{a: a, snap: v.Snapshot}
	res := p.s.Schedule(req, v.Snapshot)
	req.Prefix = nil
	if res.Outcome != scheduler.Routed && res.Outcome != scheduler.FailedOpen {
		return -1, res.Outcome
	}
	if n := len(a.hashes); n > 0 {
		p.pending[id] = float64(a.counts[res.Index]) / float64(n)
	}
	a.record(res.Index)
	return res.Index, scheduler.Routed
}

func (p *llmdPolicy) FirstToken(Response) {}

func (p *llmdPolicy) Finished(r Response) {
	frac, ok := p.pending[r.ID]
	if !ok {
		return
	}
	delete(p.pending, r.ID)
	if r.CachedTokens >= 0 {
		p.pred.judge(r.PromptTokens, r.CachedTokens, int64(frac*float64(r.PromptTokens)), false)
	}
}

func (p *llmdPolicy) Prediction() Prediction { return p.pred }

// DefaultLLMDCapacity is llm-d's lruCapacityPerServer, for pods whose
// num_gpu_blocks is unknown.
const DefaultLLMDCapacity = 31250
