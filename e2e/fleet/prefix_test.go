package fleet

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

// smallContexts is scenario (d) in miniature: 4 replicas whose KV (45k
// tokens each) holds their share of the 24 contexts (48k tokens) with room
// to spare but not all of them, so where a group's requests go decides
// whether its context is cached.
func smallContexts() Scenario {
	cfg := vllmsim.DefaultReplicaConfig(vllmsim.Llama31_8B)
	cfg.KVCapacityTokens, cfg.MaxModelLen = 45_000, 8192
	return Scenario{Name: "small-d", Title: "test", Replicas: 4, Replica: cfg,
		Traffic:     SharedContexts{Groups: 24, ContextTokens: 2000, Question: Fixed(200), Output: Fixed(50)},
		Criticality: AllCritical}
}

func takeAll(t *testing.T, tr Traffic, rate float64, n int) []arrival {
	t.Helper()
	src, err := tr.newSource(rate, 5)
	require.NoError(t, err)
	out := make([]arrival, n)
	for i := range out {
		require.Less(t, src.peek(), never)
		src.take(&out[i])
		out[i].prompt = slices.Clone(out[i].prompt)
	}
	return out
}

func TestSharedContextsShareExactlyTheContext(t *testing.T) {
	tr := SharedContextScenario().Traffic.(SharedContexts)
	reqs := takeAll(t, tr, 10, 400)
	byContext := map[uint32][]arrival{}
	for i, a := range reqs {
		require.Equal(t, 7200, a.promptTokens)
		require.Len(t, a.prompt, 7200)
		require.Equal(t, 1000, a.outputTokens)
		require.Equal(t, i, a.seq)
		if i > 0 {
			require.GreaterOrEqual(t, a.at, reqs[i-1].at)
		}
		byContext[a.prompt[0]] = append(byContext[a.prompt[0]], a)
	}
	assert.Greater(t, len(byContext), 100, "groups are drawn uniformly from 150")
	assert.LessOrEqual(t, len(byContext), 150)
	for _, group := range byContext {
		for _, a := range group[1:] {
			assert.Equal(t, group[0].prompt[:6000], a.prompt[:6000], "one context per group")
			assert.NotEqual(t, group[0].prompt[6000:6016], a.prompt[6000:6016], "a new question every time")
		}
	}
	again := takeAll(t, tr, 10, 400)
	assert.Equal(t, reqs, again, "deterministic for a seed")
	other, err := tr.newSource(10, 6)
	require.NoError(t, err)
	var a arrival
	other.take(&a)
	assert.Contains(t, byContext, a.prompt[0], "the contexts are the same whatever the seed")
}

func TestSystemPromptsArePerAdapter(t *testing.T) {
	tr := SystemPromptScenario().Traffic.(SystemPrompts)
	first := map[string][]uint32{}
	for _, a := range takeAll(t, tr, 50, 300) {
		require.NotEmpty(t, a.adapter)
		if p, ok := first[a.adapter]; ok {
			assert.Equal(t, p[:1000], a.prompt[:1000])
			assert.NotEqual(t, p[1000:], a.prompt[1000:min(len(a.prompt), len(p))])
		} else {
			first[a.adapter] = a.prompt
		}
		assert.Equal(t, len(a.prompt), a.promptTokens)
	}
	assert.Len(t, first, 10)
	assert.NotEqual(t, first["lora-00"][:16], first["lora-01"][:16])
}

// TestMultiTurnResendsTheHistory follows conversations through the source:
// each turn's prompt is the previous prompt, the tokens the replica
// generated for it, and a new user message.
func TestMultiTurnResendsTheHistory(t *testing.T) {
	tr := MultiTurnScenario().Traffic.(MultiTurn)
	src, err := tr.newSource(20, 3)
	require.NoError(t, err)
	last := map[*conversation]arrival{}
	turns := map[*conversation]int{}
	var a arrival
	for range 2000 {
		if src.peek() == never {
			break
		}
		src.take(&a)
		c := a.turn.conv
		if prev, ok := last[c]; ok {
			require.False(t, a.opens)
			n := len(prev.prompt)
			require.Equal(t, prev.prompt, a.prompt[:n], "the history comes first")
			for i := range prev.outputTokens {
				require.Equal(t, vllmsim.OutputToken(prev.outputSeed, i), a.prompt[n+i], "then the response as generated")
			}
			require.Equal(t, tokTurnEnd, a.prompt[n+prev.outputTokens])
		} else {
			require.True(t, a.opens)
		}
		require.Equal(t, len(a.prompt), a.promptTokens)
		last[c] = arrival{prompt: slices.Clone(a.prompt), outputTokens: a.outputTokens, outputSeed: a.outputSeed}
		turns[c]++
		// Every turn completes a second later, except that every 7th
		// conversation's second turn is refused.
		refused := turns[c] == 2 && a.seq%7 == 0
		a.turn.ended(a.at+time.Second, !refused)
	}
	complete, ended := 0, 0
	for c, n := range turns {
		require.LessOrEqual(t, n, 10)
		if c.left == 0 {
			complete++
			require.GreaterOrEqual(t, n, 3)
		}
		if c.history == nil {
			ended++
		}
	}
	assert.Positive(t, complete)
	assert.Positive(t, ended-complete, "refused turns end their conversation")
}

// TestHitRateMatchesTheBlockArithmetic is the check against arithmetic:
// one replica, cache big enough for every context, (d)'s requests served
// one after another. A request whose group was seen before finds the whole
// 6,000-token context (375 full blocks) and nothing of its question; the
// first of each group finds nothing.
func TestHitRateMatchesTheBlockArithmetic(t *testing.T) {
	sc := SharedContextScenario()
	cfg := sc.Replica
	cfg.KVCapacityTokens = 2_000_000
	r, err := vllmsim.NewReplica(cfg)
	require.NoError(t, err)
	src, err := sc.Traffic.newSource(1, 9)
	require.NoError(t, err)
	seen := map[uint32]bool{}
	var prompts, cached, predicted int64
	var a arrival
	for range 250 {
		src.take(&a)
		req := &vllmsim.Request{PromptTokens: a.promptTokens, Prompt: a.prompt, OutputTokens: a.outputTokens, OutputSeed: a.outputSeed}
		require.NoError(t, r.Submit(req, r.Now()))
		for {
			next, busy := r.NextEventTime()
			if !busy {
				break
			}
			r.Advance(next)
		}
		require.True(t, req.Done())
		if seen[a.prompt[0]] {
			predicted += 6000
		}
		seen[a.prompt[0]] = true
		prompts += int64(a.promptTokens)
		cached += int64(req.CachedTokens)
	}
	m := r.Metrics()
	assert.Equal(t, predicted, cached)
	assert.Equal(t, predicted, m.PrefixHits)
	assert.Equal(t, prompts, m.PrefixQueries)
	t.Logf("%d groups seen in 250 requests: hit rate %.4f", len(seen), float64(cached)/float64(prompts))
}

func TestOracleKeepsContextsWhereTheyAre(t *testing.T) {
	// 140 req/s is 80% of the fleet's saturation (MeasureCapacity: 178 req/s).
	sc := smallContexts()
	run := func(policy string) Result {
		r, err := Run(RunConfig{Scenario: sc, Policy: mustPolicy(t, policy), Rate: 140, Seed: 2,
			Warmup: 10 * time.Second, Window: 40 * time.Second, ScrapeInterval: DefaultScrapeInterval})
		require.NoError(t, err)
		return r
	}
	oracle, random := run(Oracle), run(scheduler.ProfileRandom)
	t.Logf("hit rate: oracle %.3f, random %.3f; p90 TTFT %v vs %v", oracle.HitRate(), random.HitRate(), oracle.TTFT.P90, random.TTFT.P90)
	assert.Greater(t, oracle.HitRate(), random.HitRate()+0.15)
	assert.Less(t, 10*oracle.TTFT.P90, random.TTFT.P90)
	assert.LessOrEqual(t, oracle.HitRate(), 2000.0/2200, "at most the context of every request")
}

// observing wraps a policy, records what the run tells it, and checks that
// every response comes back to the VM that routed it.
type observing struct {
	t                *testing.T
	inner            Policy
	at               Placement
	routed           map[uint64]bool
	firsts, finishes map[uint64]Response
}

func (o *observing) Place(p Placement) { o.at = p }

func (o *observing) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	require.NotNil(o.t, v.Request)
	require.Len(o.t, v.Request.Prompt, v.Request.PromptTokens, "the token ids are there while routing")
	i, out := o.inner.Route(req, v)
	if out == scheduler.Routed {
		o.routed[v.Request.ID] = true
	}
	return i, out
}

func (o *observing) FirstToken(r Response) {
	require.True(o.t, o.routed[r.ID], "first token on the routing VM")
	require.NotContains(o.t, o.firsts, r.ID)
	o.firsts[r.ID] = r
}

func (o *observing) Finished(r Response) {
	require.Contains(o.t, o.firsts, r.ID, "first token before the end")
	require.NotContains(o.t, o.finishes, r.ID)
	o.finishes[r.ID] = r
}

func TestResponsesReachTheRoutingVMOfEachGateway(t *testing.T) {
	for _, hide := range []bool{false, true} {
		var all []*observing
		spec := PolicySpec{Name: "observed", New: func(seed uint64, clock func() time.Time) (Policy, error) {
			inner, err := mustPolicy(t, scheduler.ProfileLeastRequest).New(seed, clock)
			o := &observing{t: t, inner: inner, routed: map[uint64]bool{}, firsts: map[uint64]Response{}, finishes: map[uint64]Response{}}
			all = append(all, o)
			return o, err
		}}
		r, err := Run(RunConfig{Scenario: smallContexts(), Policy: spec, Rate: 10, Seed: 4, Window: 20 * time.Second,
			ScrapeInterval: DefaultScrapeInterval, Gateways: 2, GatewayVMs: 3, HideCachedTokens: hide})
		require.NoError(t, err)
		require.Len(t, all, 6)
		shared := map[int]*GatewayShared{}
		finished, hits := 0, 0
		for k, o := range all {
			assert.Equal(t, Placement{Gateway: k / 3, VM: k % 3, Gateways: 2, VMs: 3, Shared: o.at.Shared, Run: o.at.Run}, o.at)
			assert.NotNil(t, o.at.Run)
			if s, ok := shared[o.at.Gateway]; ok {
				assert.Same(t, s, o.at.Shared, "one shared state per gateway")
			}
			shared[o.at.Gateway] = o.at.Shared
			assert.Positive(t, len(o.routed), "every VM gets traffic")
			assert.Len(t, o.finishes, len(o.routed))
			for id, f := range o.finishes {
				assert.Equal(t, -1, o.firsts[id].CachedTokens, "usage comes at the end")
				assert.LessOrEqual(t, o.firsts[id].At, f.At)
				if hide {
					assert.Equal(t, -1, f.CachedTokens)
				} else if f.CachedTokens > 0 {
					hits++
				}
				assert.Equal(t, 50, f.Generated)
			}
			finished += len(o.finishes)
		}
		assert.NotSame(t, shared[0], shared[1])
		assert.Equal(t, r.Arrivals, finished)
		assert.Equal(t, !hide, hits > 0)
		v1 := shared[0].Value("k", func() any { return 7 })
		assert.Equal(t, 7, v1)
		assert.Equal(t, 7, shared[0].Value("k", func() any { return 8 }))
	}
}

func TestGatewaysKeepTheirOwnInFlightCounts(t *testing.T) {
	var views []*View
	spec := PolicySpec{Name: "views", New: func(uint64, func() time.Time) (Policy, error) {
		return policyFunc(func(_ *scheduler.Request, v *View) (int, scheduler.Outcome) {
			if !slices.Contains(views, v) {
				views = append(views, v)
			}
			return 0, scheduler.Routed
		}), nil
	}}
	_, err := Run(RunConfig{Scenario: smallScenario(), Policy: spec, Rate: 10, Seed: 1, Window: 5 * time.Second,
		ScrapeInterval: DefaultScrapeInterval, Gateways: 2, GatewayVMs: 2})
	require.NoError(t, err)
	require.Len(t, views, 4)
	byGateway := map[*int][]*View{}
	for _, v := range views {
		byGateway[&v.InFlight[0]] = append(byGateway[&v.InFlight[0]], v)
	}
	assert.Len(t, byGateway, 2, "two gateways, two in-flight counts, shared by each one's VMs")
	_, err = Run(RunConfig{Scenario: smallScenario(), Policy: FlowPolicySpec(mustPolicy(t, scheduler.ProfileScoring), flowcontrol.Config{}),
		Rate: 10, Seed: 1, Window: 5 * time.Second, ScrapeInterval: DefaultScrapeInterval, Gateways: 2})
	assert.ErrorContains(t, err, "one gateway")
}

// TestBurstsOfConversations runs (e)'s traffic with bursts: the second
// stream's conversations start only inside the bursts, every turn of a
// conversation still comes, and arrivals stay in time order (a run would
// fail on a request from the past).
func TestBurstsOfConversations(t *testing.T) {
	sc := MultiTurnScenario()
	sc.Replica.KVCapacityTokens, sc.Replicas = 200_000, 2
	sc.Replica.MaxModelLen = 100_000
	sc.MinWarmup = 0
	b := Burst{Every: 20 * time.Second, Length: 5 * time.Second, Factor: 4}
	r, err := Run(RunConfig{Scenario: sc, Policy: mustPolicy(t, Oracle), Rate: 10, Seed: 3, Window: 60 * time.Second,
		ScrapeInterval: DefaultScrapeInterval, Burst: b})
	require.NoError(t, err)
	plain, err := Run(RunConfig{Scenario: sc, Policy: mustPolicy(t, Oracle), Rate: 10, Seed: 3, Window: 60 * time.Second,
		ScrapeInterval: DefaultScrapeInterval})
	require.NoError(t, err)
	assert.Greater(t, r.Arrivals, plain.Arrivals+100, "a quarter of the time at 4× the rate of new conversations")
	assert.Positive(t, r.HitRate())
}

// TestUniquePromptsChangeOnlyPrefixPolicies: scenarios (a)–(c) carry token
// ids that no other request shares. The replicas must serve them exactly as
// prompts without ids (preemptions included, whose resumption hits the
// request's own blocks), so every policy that ignores prompts gives the
// same figures with or without them, and a prefix-aware policy sees the
// ids.
func TestUniquePromptsChangeOnlyPrefixPolicies(t *testing.T) {
	tr := shareGPT{input: vllmsim.ShareGPTInput, output: vllmsim.ShareGPTOutput,
		adapters: vllmsim.EqualShares(vllmsim.AdapterNames("lora", 6)...), unique: true}
	reqs := takeAll(t, tr, 50, 300)
	firstBlocks := map[[16]uint32]bool{}
	plain := takeAll(t, shareGPT{input: tr.input, output: tr.output, adapters: tr.adapters}, 50, 300)
	for i, a := range reqs {
		require.Len(t, a.prompt, a.promptTokens)
		require.Nil(t, plain[i].prompt)
		a.prompt = nil
		require.Equal(t, plain[i], a, "the same arrivals, lengths and adapters as without ids")
		if len(reqs[i].prompt) >= 16 {
			var b [16]uint32
			copy(b[:], reqs[i].prompt)
			require.False(t, firstBlocks[b], "no two prompts share a first block")
			firstBlocks[b] = true
		}
	}
	for _, sc := range []Scenario{SeedScenario(), RegressionScenario(), BaseModelScenario()} {
		assert.True(t, sc.UniquePrompts, sc.Name)
		assert.False(t, sc.SharesPrefixes(), sc.Name)
	}

	// Overloaded, so that replicas preempt and resume requests.
	for _, policy := range []string{scheduler.ProfileScoring, scheduler.ProfileDecisionTree, scheduler.ProfileLeastRequest, EnvoyLeastRequest, Oracle} {
		t.Run(policy, func(t *testing.T) {
			cfg := smallRun(t, policy, 60)
			cfg.Gateways, cfg.GatewayVMs = 2, 2
			cfg.Scenario.Replica.KVCapacityTokens = 20_000 // a fifth of the model's: preemptions
			without, err := Run(cfg)
			require.NoError(t, err)
			cfg.Scenario.UniquePrompts = true
			with, err := Run(cfg)
			require.NoError(t, err)
			require.Equal(t, without, with)
			require.Positive(t, without.Preemptions, "the run must exercise preemption")
			t.Logf("completed %d, preemptions %d, p90 TTFT %v", without.Completed, without.Preemptions, without.TTFT.P90)
		})
	}
	t.Run(PolicyPrefixAware, func(t *testing.T) {
		cfg := smallRun(t, scheduler.ProfileScoring, 60)
		cfg.Policy = PrefixPolicies()[0]
		cfg.Scenario.UniquePrompts = true
		res, err := Run(cfg)
		require.NoError(t, err)
		require.Positive(t, res.Prediction.Judged)
		assert.Zero(t, res.Prediction.PredictedHits, "nothing is shared: nothing to predict")
		assert.Less(t, res.HitRate(), 0.01)
	})
}
