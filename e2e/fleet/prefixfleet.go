package fleet

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// Prompt is what prefix-aware policies see of a request besides the
// scheduler's Request: its id (for the completion's feedback) and its
// prompt as token ids.
type Prompt struct {
	ID     uint64
	Tokens []uint32
}

// PromptPolicy is a Policy that routes on the prompt too; the fleet calls
// RoutePrompt instead of Route when a policy implements it.
type PromptPolicy interface {
	Policy
	RoutePrompt(req *scheduler.Request, p Prompt, v *View) (replica int, outcome scheduler.Outcome)
}

// FeedbackPolicy hears of every completion of a request it routed, with
// what the replica reported (usage.prompt_tokens and
// prompt_tokens_details.cached_tokens), at virtual time at.
type FeedbackPolicy interface {
	Completed(id uint64, promptTokens, cachedTokens int, at time.Time)
}

// TickPolicy is ticked at every metrics scrape (the plugin syncs its
// index on the root context's tick).
type TickPolicy interface {
	Tick(at time.Time)
}

// VMEnv is what one simulated gateway worker VM shares with others: its
// gateway (Envoy replica) number, that gateway's shared data, and objects
// shared by the whole run (one llm-d picker serves every gateway).
type VMEnv struct {
	Gateway int
	Store   prefix.Store
	// NumGPUBlocks is the replicas' KV cache in blocks (what vLLM reports
	// as num_gpu_blocks), for policies that size an index by it.
	NumGPUBlocks int
	run          map[string]any
}

// RunShared returns the run-wide object under key, made by mk on first use.
func (e VMEnv) RunShared(key string, mk func() any) any {
	if v, ok := e.run[key]; ok {
		return v
	}
	v := mk()
	e.run[key] = v
	return v
}

// Prefix policy names.
const (
	PolicyPrefixAware      = scheduler.ProfilePrefixAware // shared index per gateway, the plugin's
	PolicyPrefixPerVM      = "prefix-aware-per-vm"        // each VM its own index (Higress-like)
	PolicyConsistentHash   = "consistent-hash"            // no index: rendezvous with bounded loads only
	PolicyLLMDApproximate  = "llmd-approx"                // llm-d's approximate scorer and default profile
	defaultPrefixSyncEvery = scheduler.DefaultPrefixSyncInterval
)

// PrefixPolicies are the prefix-aware policies of the prefix benchmark.
func PrefixPolicies() []PolicySpec {
	return []PolicySpec{
		PrefixPolicySpec(PolicyPrefixAware, scheduler.Config{Profile: scheduler.ProfilePrefixAware}, indexShared),
		PrefixPolicySpec(PolicyPrefixPerVM, scheduler.Config{Profile: scheduler.ProfilePrefixAware}, indexPerVM),
		PrefixPolicySpec(PolicyConsistentHash, scheduler.Config{Profile: scheduler.ProfilePrefixAware}, indexNone),
		LLMDPolicySpec(),
	}
}

type indexMode int

const (
	indexShared indexMode = iota
	indexPerVM
	indexNone
)

// PrefixPolicySpec routes with the scheduler configured by cfg, hashing
// each prompt's token ids as the plugin hashes a prompt of ids, with the
// plugin's index kept per mode: in the gateway's shared data (synced at
// every tick), private to the VM, or not at all.
func PrefixPolicySpec(name string, cfg scheduler.Config, mode indexMode) PolicySpec {
	return PolicySpec{Name: name, CountsRouted: cfg.CountsRoutedSinceSnapshot(),
		New: func(seed uint64, clock func() time.Time) (Policy, error) {
			return newPrefixPolicy(cfg, mode, seed, clock, VMEnv{Store: prefix.NewMemStore(), run: map[string]any{}})
		},
		NewVM: func(seed uint64, clock func() time.Time, env VMEnv) (Policy, error) {
			return newPrefixPolicy(cfg, mode, seed, clock, env)
		}}
}

type prefixPolicy struct {
	s       *scheduler.Scheduler
	h       *prefix.Hasher
	t       *scheduler.PrefixTracker
	idx     *prefix.Index
	mode    indexMode
	clock   func() time.Time
	pending map[uint64]pendingPrediction
	stats   *PrefixStats
}

type pendingPrediction struct {
	endpoint          uint32
	blocks, predicted int
	kept              []uint64
}

// PrefixStats sums, over a run, what prefix-aware policies predicted and
// what the replicas reported, for the accuracy columns.
type PrefixStats struct {
	Judged, Mispredicted          int
	PredictedTokens, CachedTokens int64
	PromptTokens                  int64
	// PredictedHits and ReportedHits count requests predicted and reported
	// with more than half their prompt cached; BothHit those with both.
	PredictedHits, ReportedHits, BothHit int
}

func newPrefixPolicy(cfg scheduler.Config, mode indexMode, seed uint64, clock func() time.Time, env VMEnv) (*prefixPolicy, error) {
	s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{
		Rand: rand.NewPCG(seed, 0x5c4e), Now: clock, StaleAfter: DefaultStaleAfter, FailOpen: true,
	})
	if err != nil {
		return nil, err
	}
	h, err := prefix.NewHasher(prefix.HashConfig{})
	if err != nil {
		return nil, err
	}
	store := env.Store
	if mode != indexShared {
		store = nil // private
	}
	idx, err := prefix.NewIndex(prefix.IndexConfig{}, store)
	if err != nil {
		return nil, err
	}
	p := &prefixPolicy{s: s, h: h, idx: idx, t: scheduler.NewPrefixTracker(idx), mode: mode, clock: clock,
		pending: map[uint64]pendingPrediction{}}
	p.stats = env.RunShared("prefix-stats", func() any { return &PrefixStats{} }).(*PrefixStats)
	return p, nil
}

func (p *prefixPolicy) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	return p.RoutePrompt(req, Prompt{}, v)
}

func (p *prefixPolicy) RoutePrompt(req *scheduler.Request, pr Prompt, v *View) (int, scheduler.Outcome) {
	target := req.TargetModel
	if target == "" {
		target = req.Model
	}
	p.h.HashTokens(target, nil, pr.Tokens)
	p.t.Prepare(req, v.Snapshot, p.h.Blocks(), p.h.Key())
	res := p.s.Schedule(req, v.Snapshot)
	req.Prefix = nil
	if res.Outcome != scheduler.Routed && res.Outcome != scheduler.FailedOpen {
		return -1, res.Outcome
	}
	p.s.Observe(req, res)
	predicted := p.t.Match().Blocks(p.t.KeyOf(res.Index))
	if p.mode != indexNone {
		predicted = p.t.Routed(res.Index, p.clock())
	}
	blocks := p.h.Blocks()
	p.pending[pr.ID] = pendingPrediction{endpoint: p.t.KeyOf(res.Index), blocks: len(blocks), predicted: predicted,
		kept: append([]uint64(nil), blocks[:predicted]...)}
	return res.Index, scheduler.Routed
}

func (p *prefixPolicy) Completed(id uint64, promptTokens, cachedTokens int, at time.Time) {
	pp, ok := p.pending[id]
	if !ok {
		return
	}
	delete(p.pending, id)
	predTokens, forget := prefix.Judge(pp.blocks, pp.predicted, int64(promptTokens), int64(cachedTokens), p.idx.Config().RecordEvery)
	p.stats.add(promptTokens, cachedTokens, predTokens, forget >= 0)
	if forget >= 0 && p.mode != indexNone {
		p.idx.Forget(pp.kept, pp.endpoint, forget, at)
	}
}

func (s *PrefixStats) add(prompt, cached int, predicted int64, mispredicted bool) {
	s.Judged++
	s.PromptTokens += int64(prompt)
	s.CachedTokens += int64(cached)
	s.PredictedTokens += predicted
	if mispredicted {
		s.Mispredicted++
	}
	ph, rh := 2*predicted > int64(prompt), 2*cached > prompt
	if ph {
		s.PredictedHits++
	}
	if rh {
		s.ReportedHits++
	}
	if ph && rh {
		s.BothHit++
	}
}

func (p *prefixPolicy) Tick(time.Time) {
	if p.mode == indexShared {
		p.idx.Sync()
	}
}

// LLMDPolicySpec is llm-d's approximate prefix scorer with its default
// profile, one picker for every gateway (LLMDApprox).
func LLMDPolicySpec() PolicySpec {
	cfg := LLMDProfile()
	mk := func(seed uint64, clock func() time.Time, env VMEnv) (Policy, error) {
		s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{
			Rand: rand.NewPCG(seed, 0x11d), Now: clock, StaleAfter: DefaultStaleAfter, FailOpen: true,
		})
		if err != nil {
			return nil, err
		}
		shared := env.RunShared("llmd", func() any { return &llmdShared{} }).(*llmdShared)
		return &llmdPolicy{s: s, shared: shared, numGPUBlocks: env.NumGPUBlocks,
			stats: env.RunShared("prefix-stats", func() any { return &PrefixStats{} }).(*PrefixStats)}, nil
	}
	return PolicySpec{Name: PolicyLLMDApproximate,
		New: func(seed uint64, clock func() time.Time) (Policy, error) {
			return mk(seed, clock, VMEnv{run: map[string]any{}})
		},
		NewVM: mk}
}

// llmdShared is the one picker's state.
type llmdShared struct {
	a *LLMDApprox
}

type llmdPolicy struct {
	s            *scheduler.Scheduler
	numGPUBlocks int
	shared       *llmdShared
	stats        *PrefixStats
	pending      map[uint64]float64
}

func (p *llmdPolicy) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	return p.RoutePrompt(req, Prompt{}, v)
}

func (p *llmdPolicy) RoutePrompt(req *scheduler.Request, pr Prompt, v *View) (int, scheduler.Outcome) {
	if p.shared.a == nil {
		blocks := p.numGPUBlocks
		if blocks <= 0 {
			blocks = DefaultLLMDCapacity
		}
		p.shared.a = NewLLMDApprox(func(int) int { return blocks })
	}
	a := p.shared.a
	target := req.TargetModel
	if target == "" {
		target = req.Model
	}
	a.hashPrompt(target, pr.Tokens)
	a.match(len(v.Snapshot.Endpoints))
	req.Prefix = &llmdInfo{a: a, snap: v.Snapshot}
	res := p.s.Schedule(req, v.Snapshot)
	req.Prefix = nil
	if res.Outcome != scheduler.Routed && res.Outcome != scheduler.FailedOpen {
		return -1, res.Outcome
	}
	if p.pending == nil {
		p.pending = map[uint64]float64{}
	}
	if n := len(a.hashes); n > 0 {
		p.pending[pr.ID] = float64(a.counts[res.Index]) / float64(n)
	}
	a.record(res.Index)
	return res.Index, scheduler.Routed
}

func (p *llmdPolicy) Completed(id uint64, promptTokens, cachedTokens int, _ time.Time) {
	frac, ok := p.pending[id]
	if !ok {
		return
	}
	delete(p.pending, id)
	p.stats.add(promptTokens, cachedTokens, int64(frac*float64(promptTokens)), false)
}

// DefaultLLMDCapacity is the per-pod LRU capacity when the pod's
// num_gpu_blocks is not known (llm-d's lruCapacityPerServer).
const DefaultLLMDCapacity = 31250

// String names an index mode.
func (m indexMode) String() string {
	switch m {
	case indexShared:
		return "shared"
	case indexPerVM:
		return "per-vm"
	case indexNone:
		return "none"
	}
	return fmt.Sprint(int(m))
}
