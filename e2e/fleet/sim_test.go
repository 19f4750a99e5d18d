package fleet

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// smallScenario is a fleet small enough for unit tests: 4 replicas with
// max-lora 2 and 6 equally shared adapters, so LoRA placement matters.
func smallScenario() Scenario {
	cfg := vllmsim.DefaultReplicaConfig(vllmsim.Llama2_7B)
	cfg.MaxLoRAs = 2
	return Scenario{
		Name: "small", Title: "test", Replicas: 4, Replica: cfg,
		Adapters: vllmsim.EqualShares(vllmsim.AdapterNames("lora", 6)...),
		Input:    vllmsim.ShareGPTInput, Output: vllmsim.ShareGPTOutput,
		Criticality: AllCritical,
	}
}

func mustPolicy(t *testing.T, name string) PolicySpec {
	t.Helper()
	p, err := PolicyByName(name)
	require.NoError(t, err)
	return p
}

func smallRun(t *testing.T, policy string, rate float64) RunConfig {
	return RunConfig{
		Scenario: smallScenario(), Policy: mustPolicy(t, policy), Rate: rate, Seed: 7,
		Warmup: 10 * time.Second, Window: 40 * time.Second, ScrapeInterval: DefaultScrapeInterval,
	}
}

func TestSameSeedSameResult(t *testing.T) {
	for _, policy := range []string{scheduler.ProfileDecisionTree, scheduler.ProfileScoring, scheduler.ProfileRandom, EnvoyLeastRequest} {
		t.Run(policy, func(t *testing.T) {
			cfg := smallRun(t, policy, 60)
			first, err := Run(cfg)
			require.NoError(t, err)
			second, err := Run(cfg)
			require.NoError(t, err)
			require.Equal(t, first, second)
			require.Positive(t, first.Completed)

			cfg.Seed++
			other, err := Run(cfg)
			require.NoError(t, err)
			assert.NotEqual(t, first.TTFT, other.TTFT, "another seed is another workload")
		})
	}
}

func TestEveryRequestIsCompletedOrDropped(t *testing.T) {
	mixed := CriticalityMix{Critical: 0.5, Standard: 0.25, Sheddable: 0.25}
	for _, tc := range []struct {
		policy    string
		mix       CriticalityMix
		load      float64
		wantDrops bool
	}{
		{scheduler.ProfileDecisionTree, AllCritical, 1.3, false},
		{scheduler.ProfileDecisionTree, mixed, 1.3, true},
		{scheduler.ProfileScoring, mixed, 1.3, true},
		{scheduler.ProfileRoundRobin, mixed, 1.3, false}, // baselines never shed
		{EnvoyLeastRequest, mixed, 0.5, false},
		{scheduler.ProfileLeastRequest, mixed, 0.5, false},
	} {
		t.Run(tc.policy+"/"+tc.mix.String(), func(t *testing.T) {
			cfg := smallRun(t, tc.policy, tc.load*4*19.5)
			cfg.Scenario.Criticality = tc.mix
			r, err := Run(cfg) // Run itself fails when a request is lost
			require.NoError(t, err)
			routed := 0
			for _, n := range r.Routed {
				routed += n
			}
			assert.Equal(t, r.Arrivals, routed+r.DroppedAll+r.NoEndpointAll)
			assert.Equal(t, r.Measured, r.Completed+r.Dropped+r.NoEndpoint)
			assert.Zero(t, r.NoEndpointAll)
			assert.Equal(t, tc.wantDrops, r.DroppedAll > 0, "drops: %d", r.DroppedAll)
			assert.GreaterOrEqual(t, r.End, cfg.Warmup+cfg.Window)
		})
	}
}

// TestDecisionTreeKeepsAdaptersPut is the routing-quality claim in
// miniature: LoRA affinity loads adapters far less often than random
// routing, and serves requests sooner.
func TestDecisionTreeKeepsAdaptersPut(t *testing.T) {
	tree, err := Run(smallRun(t, scheduler.ProfileDecisionTree, 40))
	require.NoError(t, err)
	random, err := Run(smallRun(t, scheduler.ProfileRandom, 40))
	require.NoError(t, err)
	t.Logf("adapter loads: decision-tree %d, random %d; p90 TTFT %v vs %v", tree.AdapterLoads, random.AdapterLoads, tree.TTFT.P90, random.TTFT.P90)
	assert.Less(t, 4*tree.AdapterLoads, random.AdapterLoads)
	assert.Less(t, tree.TTFT.P90, random.TTFT.P90)
	assert.Less(t, tree.NTPOT.P90, random.NTPOT.P90)
}

// recorder wraps a policy and checks every view it is given.
type recorder struct {
	t      *testing.T
	inner  Policy
	clock  func() time.Time
	scrape time.Duration
	routed int
	oldest time.Duration
}

func (r *recorder) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	now := r.clock()
	age := now.Sub(v.Snapshot.Time)
	require.GreaterOrEqual(r.t, age, time.Duration(0))
	require.Less(r.t, age, r.scrape, "the view is at most one scrape interval old")
	for i := range v.Snapshot.Endpoints {
		require.Equal(r.t, v.Snapshot.Time, v.Snapshot.Endpoints[i].Metrics.UpdateTime)
		require.Equal(r.t, 2, v.Snapshot.Endpoints[i].Metrics.MaxActiveModels)
	}
	r.oldest = max(r.oldest, age)
	r.routed++
	return r.inner.Route(req, v)
}

func TestPoliciesSeeScrapedSnapshotsAndVirtualTime(t *testing.T) {
	const scrape = 200 * time.Millisecond
	var rec *recorder
	spec := PolicySpec{Name: "recorded", New: func(seed uint64, clock func() time.Time) (Policy, error) {
		inner, err := mustPolicy(t, scheduler.ProfileDecisionTree).New(seed, clock)
		rec = &recorder{t: t, inner: inner, clock: clock, scrape: scrape}
		return rec, err
	}}
	cfg := smallRun(t, scheduler.ProfileDecisionTree, 30)
	cfg.Policy, cfg.ScrapeInterval = spec, scrape
	r, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, r.Arrivals, rec.routed)
	assert.Greater(t, rec.oldest, scrape/2, "with this many arrivals some see an old snapshot")
}

func TestEnvoyLeastRequestPrefersFewerActiveRequests(t *testing.T) {
	inFlight := []int{5, 0, 9, 3}
	for _, tc := range []struct {
		choices int
		// want[i] is the probability of picking host i. With two
		// independent draws the host of load rank k (0 = least loaded,
		// n hosts) wins with ((n-k)/n)² - ((n-k-1)/n)².
		want []float64
	}{
		{1, []float64{0.25, 0.25, 0.25, 0.25}},
		{2, []float64{3.0 / 16, 7.0 / 16, 1.0 / 16, 5.0 / 16}},
	} {
		p := NewEnvoyLeastRequest(rand.NewPCG(1, 2), tc.choices)
		counts := make([]float64, len(inFlight))
		const n = 40000
		for range n {
			i, outcome := p.Route(&scheduler.Request{}, &View{InFlight: inFlight})
			require.Equal(t, scheduler.Routed, outcome)
			counts[i]++
		}
		for i, w := range tc.want {
			assert.InDelta(t, w, counts[i]/n, 0.01, "choices %d host %d", tc.choices, i)
		}
	}
	_, outcome := NewEnvoyLeastRequest(rand.NewPCG(1, 2), 2).Route(&scheduler.Request{}, &View{})
	assert.Equal(t, scheduler.NoEndpoint, outcome)
}

func TestSchedulerPolicyReturnsTheSnapshotIndex(t *testing.T) {
	p, err := mustPolicy(t, scheduler.ProfileRoundRobin).New(1, func() time.Time { return Epoch })
	require.NoError(t, err)
	snap := &scheduler.Snapshot{Time: Epoch, Endpoints: make([]scheduler.Endpoint, 3)}
	for i := range snap.Endpoints {
		snap.Endpoints[i].Metrics.UpdateTime = Epoch
	}
	var got []int
	for range 6 {
		i, outcome := p.Route(&scheduler.Request{Model: "m", TargetModel: "m"}, &View{Snapshot: snap, InFlight: make([]int, 3)})
		require.Equal(t, scheduler.Routed, outcome)
		got = append(got, i)
	}
	assert.Equal(t, []int{0, 1, 2, 0, 1, 2}, got)
}

func TestPolicySaltChangesOnlyThePolicysDraws(t *testing.T) {
	cfg := smallRun(t, scheduler.ProfileRandom, 60)
	first, err := Run(cfg)
	require.NoError(t, err)
	cfg.PolicySalt = 1
	salted, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, first.Arrivals, salted.Arrivals, "the same traffic")
	assert.NotEqual(t, first.Routed, salted.Routed, "other random picks")

	// A policy without random choices routes exactly as before.
	cfg = smallRun(t, scheduler.ProfileRoundRobin, 60)
	first, err = Run(cfg)
	require.NoError(t, err)
	cfg.PolicySalt = 1
	salted, err = Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, first, salted)
}

func TestRunSeedsPoolsSeeds(t *testing.T) {
	cfg := smallRun(t, scheduler.ProfileDecisionTree, 50)
	one, err := Run(cfg)
	require.NoError(t, err)
	cfg.Seed++
	two, err := Run(cfg)
	require.NoError(t, err)
	cfg.Seed--
	pooled, err := RunSeeds(cfg, 2)
	require.NoError(t, err)
	assert.Equal(t, 2, pooled.Seeds)
	assert.Equal(t, one.Arrivals+two.Arrivals, pooled.Arrivals)
	assert.Equal(t, one.Completed+two.Completed, pooled.Completed)
	assert.InDelta(t, (one.OutputTokPS+two.OutputTokPS)/2, pooled.OutputTokPS, 1e-9)
	assert.GreaterOrEqual(t, pooled.E2E.P99, min(one.E2E.P99, two.E2E.P99))
	assert.LessOrEqual(t, pooled.E2E.P99, max(one.E2E.P99, two.E2E.P99))
	_, err = RunSeeds(cfg, 0)
	assert.Error(t, err)
}

func TestRunRejectsBadConfigs(t *testing.T) {
	good := smallRun(t, scheduler.ProfileRandom, 10)
	for name, mutate := range map[string]func(*RunConfig){
		"no window":      func(c *RunConfig) { c.Window = 0 },
		"no scrape":      func(c *RunConfig) { c.ScrapeInterval = 0 },
		"no policy":      func(c *RunConfig) { c.Policy = PolicySpec{} },
		"no rate":        func(c *RunConfig) { c.Rate = 0 },
		"no replicas":    func(c *RunConfig) { c.Scenario.Replicas = 0 },
		"lora disabled":  func(c *RunConfig) { c.Scenario.Replica.MaxLoRAs = 0 },
		"bad mix":        func(c *RunConfig) { c.Scenario.Criticality = CriticalityMix{} },
		"bad replica":    func(c *RunConfig) { c.Scenario.Replica.MaxNumSeqs = 0 },
		"unnamed":        func(c *RunConfig) { c.Scenario.Name = "" },
		"negative drain": func(c *RunConfig) { c.Warmup = -time.Second },
	} {
		cfg := good
		mutate(&cfg)
		_, err := Run(cfg)
		assert.Error(t, err, name)
	}
}

func TestMaxDrainBoundsARun(t *testing.T) {
	cfg := smallRun(t, scheduler.ProfileRandom, 150) // far past saturation
	cfg.MaxDrain = time.Second
	_, err := Run(cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "still running")
}

// promptWatcher records whether its policy was shown token ids.
type promptWatcher struct {
	Policy
	sawIDs *bool
}

func (p promptWatcher) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	*p.sawIDs = *p.sawIDs || (v.Request != nil && v.Request.Prompt != nil)
	return p.Policy.Route(req, v)
}

// TestPoliciesIgnoringPromptsGetTheSameResults checks IgnoresPrompt: a
// policy marked so routes unique prompts exactly as when their ids are
// drawn (it never reads them), and the others are shown the ids.
func TestPoliciesIgnoringPromptsGetTheSameResults(t *testing.T) {
	sc := smallScenario()
	sc.UniquePrompts = true
	ignoring := 0
	for _, spec := range append(DefaultPolicies(), PrefixPolicies()...) {
		t.Run(spec.Name, func(t *testing.T) {
			run := func(ignores bool) (Result, bool) {
				s := spec
				s.IgnoresPrompt = ignores
				var saw bool
				s.New = func(seed uint64, clock func() time.Time) (Policy, error) {
					p, err := spec.New(seed, clock)
					return promptWatcher{p, &saw}, err
				}
				r, err := Run(RunConfig{Scenario: sc, Policy: s, Rate: 60, Seed: 3,
					Window: 20 * time.Second, ScrapeInterval: DefaultScrapeInterval})
				require.NoError(t, err)
				return r, saw
			}
			if !spec.IgnoresPrompt {
				_, saw := run(false)
				require.True(t, saw, "a policy that may read token ids is shown them")
				return
			}
			ignoring++
			withIDs, saw := run(false)
			require.True(t, saw)
			without, saw := run(true)
			require.False(t, saw, "no ids drawn")
			require.Equal(t, withIDs, without)
		})
	}
	require.GreaterOrEqual(t, ignoring, 6, "the scheduler's profiles and Envoy's least-request")
}
