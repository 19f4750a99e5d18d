package fleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
	"unsafe"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// RunConfig is one simulation: a scenario at one arrival rate under one
// policy.
type RunConfig struct {
	Scenario Scenario
	Policy   PolicySpec
	// Rate is the mean arrival rate, requests per second (Poisson).
	Rate float64
	// Load is Rate as a fraction of fleet saturation, for reports only
	// (0 when the rate was given directly).
	Load float64
	// Seed fixes the workload, the criticality draws and the policy's
	// random choices. Runs with the same seed and rate see the same
	// requests whatever the policy.
	Seed uint64
	// Warmup is simulated before the measurement Window; both receive
	// arrivals, only requests arriving in the window are measured.
	Warmup, Window time.Duration
	// ScrapeInterval is how often the metrics view is refreshed.
	ScrapeInterval time.Duration
	// MaxDrain bounds the simulated time after arrivals stop; a run whose
	// requests are not all done by then fails (0: 10 × (Warmup+Window)).
	MaxDrain time.Duration
	// GatewayVMs is how many routing instances share the traffic, as Envoy's
	// worker threads each run their own Proxy-Wasm VM (0 means 1). Each
	// has its own policy instance and its own copy of every scrape, so a
	// scheduler policy counting routed requests (countRoutedSinceSnapshot)
	// knows only its share; each arrival goes to one of them uniformly at
	// random. Envoy's least-request reads the shared live counts either way.
	GatewayVMs int
	// Gateways is how many Envoy replicas share the traffic (0 means 1),
	// each with GatewayVMs VMs: an arrival goes to a gateway uniformly at
	// random (a client-side load balancer), then to one of its VMs. Each
	// gateway keeps its own in-flight counts (Envoy's least-request) and
	// its own copy of every scrape; VMs of one gateway can share state
	// through Placement.Shared.
	Gateways int
	// HideCachedTokens makes responses report no cached tokens
	// (Response.CachedTokens -1), as vLLM without
	// --enable-prompt-tokens-details.
	HideCachedTokens bool
	// Burst, when set, raises the arrival rate periodically (flow.go).
	Burst Burst
	// RecordOutcomes keeps every arrival's outcome in Result.Outcomes, to
	// compare two policies request by request (same seed, same arrivals).
	RecordOutcomes bool
	// PolicySalt, when not 0, draws every policy instance's random choices
	// (tie-breaks, random picks) from other streams while the traffic stays
	// the same: how much of a seed's result is owed to those draws alone.
	PolicySalt uint64
	// Cooldown keeps arrivals coming, unmeasured, for this long after the
	// window, so the requests measured at its end meet the same load until
	// they leave: without it, requests a flow-control queue holds when
	// arrivals stop are released into an emptying fleet, and a queue looks
	// better than it is by up to a TTL's worth of arrivals.
	Cooldown time.Duration

	// capacity marks MeasureCapacity's run: it stops when arrivals stop,
	// without draining.
	capacity bool
}

// DefaultScrapeInterval is upstream EPP's metrics refresh period.
const DefaultScrapeInterval = 50 * time.Millisecond

// Epoch is virtual time zero as wall-clock time, for Metrics.UpdateTime and
// the scheduler's clock.
var Epoch = time.Date(2025, 6, 5, 0, 0, 0, 0, time.UTC)

// Quantiles summarise one latency distribution.
type Quantiles struct {
	Mean, P50, P90, P99 time.Duration
}

// Result is what one run measured over its window.
type Result struct {
	Scenario string
	Policy   string
	Load     float64
	Rate     float64
	Window   time.Duration

	// Arrivals counts every request of the run; Measured those that
	// arrived in the window. Completed, Dropped (429) and NoEndpoint (503)
	// split Measured.
	Arrivals, Measured             int
	Completed, Dropped, NoEndpoint int
	// DroppedAll and NoEndpointAll count over the whole run, warmup
	// included: Arrivals = Σ Routed + DroppedAll + NoEndpointAll.
	DroppedAll, NoEndpointAll int

	// ThroughputRPS is completions per second inside the window (whenever
	// they arrived); OutputTokPS generated tokens per second inside it.
	ThroughputRPS, OutputTokPS float64

	// Latencies of the measured completed requests. TPOT is the mean time
	// between output tokens after the first; NTPOT is end-to-end latency
	// divided by output tokens (upstream's "normalized time per output
	// token", which includes queueing).
	TTFT, TPOT, NTPOT, E2E Quantiles

	// AdapterLoads and Preemptions are summed over replicas inside the
	// window (and over seeds).
	AdapterLoads, Preemptions int64
	// MeanActiveAdapters is the mean number of adapters in a replica's
	// running batch, sampled at every scrape inside the window: how widely
	// the policy spreads each adapter (each costs LoRA slowdown and a
	// slot).
	MeanActiveAdapters float64
	// Seeds is how many seeds were pooled (RunSeeds); counts are totals
	// over them, rates and latencies describe the pool.
	Seeds int
	// Routed counts requests sent to each replica over the whole run.
	Routed []int
	// PromptTokens and CachedTokens sum the measured completed requests'
	// prompts and what the replicas found cached of them
	// (usage.prompt_tokens_details.cached_tokens); HitRate is their ratio.
	PromptTokens, CachedTokens int64
	// Prediction is what prefix-aware policies predicted against what the
	// replicas reported (whole run, every VM).
	Prediction Prediction
	// End is the virtual time when the last request finished.
	End time.Duration

	// meanRunning and meanKVUsage average the replicas' batch and KV use
	// over the window's scrapes; replicaHitRate is the replicas' own
	// prefix-cache counters over the window (MeasureCapacity reports them).
	meanRunning, meanKVUsage, replicaHitRate float64

	// Classes splits the measured requests by criticality (index
	// scheduler.Critical, Standard, Sheddable); latencies of a request
	// that waited in a flow-control queue count its wait.
	Classes [3]ClassResult
	// Flow is what the flow-control queues did (zero without).
	Flow FlowResult
	// Outcomes, with RunConfig.RecordOutcomes, is each arrival's outcome
	// in arrival order (seeds one after the other).
	Outcomes []ArrivalOutcome
	// PerSeed is each seed's own figures (RunSeeds), to tell a pooled
	// result from the spread between seeds.
	PerSeed []SeedResult
}

// SeedResult is one seed's part of a pooled Result.
type SeedResult struct {
	Seed uint64
	// Classes are the seed's own counts and TTFT percentiles.
	Classes       [3]ClassResult
	ThroughputRPS float64
	// Outcomes are the seed's arrivals in Result.Outcomes.
	Outcomes []ArrivalOutcome
}

// PerMinute turns a count of r (summed over its seeds) into a rate per
// simulated minute of measurement window.
func (r *Result) PerMinute(count int64) float64 {
	return float64(count) / (r.Window.Minutes() * float64(max(r.Seeds, 1)))
}

// flight is one request's simulation state. It embeds the replica's
// request so a completion (a *vllmsim.Request) leads back to it by ID.
// Flights fill whole cache lines, so that in a slab (page-aligned) every
// request starts on one: the replica's step loops read the first 64 bytes
// of every running request (vllmsim.Request), one line instead of two
// (BENCHMARKS.md, "Replica-model speed work, third round").
type flight struct {
	flightState
	_ [(cacheLine - unsafe.Sizeof(flightState{})%cacheLine) % cacheLine]byte
}

const cacheLine = 64

type flightState struct {
	req      vllmsim.Request
	replica  int
	policy   int // the routing VM: gateway × GatewayVMs + VM
	measured bool
	turn     *turn
	crit     scheduler.Criticality
	// waited is the time spent in a flow-control queue before it was sent.
	waited time.Duration
}

const slabSize = 4096

// flights stores requests in fixed slabs so pointers handed to replicas
// stay valid while the store grows.
type flights struct{ slabs [][]flight }

func (f *flights) add() (*flight, uint64) {
	n := len(f.slabs)
	if n == 0 || len(f.slabs[n-1]) == slabSize {
		f.slabs = append(f.slabs, make([]flight, 0, slabSize))
		n++
	}
	s := &f.slabs[n-1]
	*s = append(*s, flight{})
	id := uint64((n-1)*slabSize + len(*s) - 1)
	return &(*s)[len(*s)-1], id
}

func (f *flights) get(id uint64) *flight { return &f.slabs[id/slabSize][id%slabSize] }

// samples are the latencies of measured completed requests.
type samples struct {
	ttft, tpot, ntpot, e2e []time.Duration
	classTTFT              [3][]time.Duration
	wait                   []time.Duration
}

// Run simulates one configuration. It is deterministic: the same config
// gives the same Result.
func Run(cfg RunConfig) (Result, error) {
	return RunSeeds(cfg, 1)
}

// RunSeeds runs cfg with seeds cfg.Seed, cfg.Seed+1, ... (n in all) and
// pools them: counts are summed, rates averaged, and the latency
// percentiles taken over every measured request of every seed. Near
// saturation one seed's percentiles swing a lot (the queue is a critically
// loaded random walk); pooling a few seeds steadies them.
func RunSeeds(cfg RunConfig, n int) (Result, error) {
	if n < 1 {
		return Result{}, fmt.Errorf("fleet: %d seeds, want at least 1", n)
	}
	var all samples
	var pooled Result
	var perSeed []SeedResult
	for k := range n {
		c := cfg
		c.Seed = cfg.Seed + uint64(k)
		var before [3]int
		for i := range before {
			before[i] = len(all.classTTFT[i])
		}
		r, err := runOnce(c, &all)
		if err != nil {
			return r, err
		}
		sr := SeedResult{Seed: c.Seed, Classes: r.Classes, ThroughputRPS: r.ThroughputRPS, Outcomes: r.Outcomes}
		for i := range sr.Classes {
			sr.Classes[i].TTFT = summarize(all.classTTFT[i][before[i]:])
		}
		perSeed = append(perSeed, sr)
		if k == 0 {
			pooled = r
			continue
		}
		pooled.Arrivals += r.Arrivals
		pooled.Measured += r.Measured
		pooled.Completed += r.Completed
		pooled.Dropped += r.Dropped
		pooled.NoEndpoint += r.NoEndpoint
		pooled.DroppedAll += r.DroppedAll
		pooled.NoEndpointAll += r.NoEndpointAll
		pooled.ThroughputRPS += r.ThroughputRPS
		pooled.OutputTokPS += r.OutputTokPS
		pooled.AdapterLoads += r.AdapterLoads
		pooled.Preemptions += r.Preemptions
		pooled.PromptTokens += r.PromptTokens
		pooled.CachedTokens += r.CachedTokens
		pooled.Prediction.Add(r.Prediction)
		for i := range pooled.Routed {
			pooled.Routed[i] += r.Routed[i]
		}
		pooled.End = max(pooled.End, r.End)
		pooled.MeanActiveAdapters += r.MeanActiveAdapters
		pooled.pool(&r)
	}
	pooled.Seeds = n
	pooled.PerSeed = perSeed
	pooled.ThroughputRPS /= float64(n)
	pooled.OutputTokPS /= float64(n)
	pooled.MeanActiveAdapters /= float64(n)
	pooled.TTFT, pooled.TPOT, pooled.NTPOT, pooled.E2E = summarize(all.ttft), summarize(all.tpot), summarize(all.ntpot), summarize(all.e2e)
	for c := range pooled.Classes {
		pooled.Classes[c].TTFT = summarize(all.classTTFT[c])
	}
	pooled.Flow.Wait = summarize(all.wait)
	return pooled, nil
}

// runOnce simulates one seed, appending its latency samples to into; the
// Result's Quantiles are left for the caller.
func runOnce(cfg RunConfig, into *samples) (Result, error) {
	sc := cfg.Scenario
	if err := sc.Validate(); err != nil {
		return Result{}, err
	}
	switch {
	case cfg.Warmup < 0 || cfg.Window <= 0:
		return Result{}, errors.New("fleet: Window must be positive and Warmup not negative")
	case cfg.ScrapeInterval <= 0:
		return Result{}, errors.New("fleet: ScrapeInterval must be positive")
	case cfg.Policy.New == nil:
		return Result{}, errors.New("fleet: RunConfig.Policy has no constructor")
	case cfg.GatewayVMs < 0 || cfg.Gateways < 0:
		return Result{}, errors.New("fleet: Gateways and GatewayVMs must not be negative")
	case cfg.Gateways > 1 && cfg.Policy.Flow != nil:
		return Result{}, errors.New("fleet: flow control is modelled for one gateway only")
	}
	if err := cfg.Burst.validate(); err != nil {
		return Result{}, err
	}
	if !cfg.capacity {
		cfg.Warmup = max(cfg.Warmup, sc.MinWarmup)
	}
	var now time.Duration
	clock := func() time.Time { return Epoch.Add(now) }
	vms, gateways := max(cfg.GatewayVMs, 1), max(cfg.Gateways, 1)
	policies := make([]Policy, gateways*vms)
	observers := make([]ResponseObserver, len(policies))
	shared := make([]*GatewayShared, gateways)
	runShared := &GatewayShared{}
	for k := range policies {
		// VM 0 has the run's seed, so one VM is exactly the single-gateway run.
		var err error
		if policies[k], err = cfg.Policy.New(cfg.Seed^(uint64(k)*0x9e3779b97f4a7c15)^(cfg.PolicySalt*0xbf58476d1ce4e5b9), clock); err != nil {
			return Result{}, fmt.Errorf("fleet: policy %q: %w", cfg.Policy.Name, err)
		}
		g := k / vms
		if shared[g] == nil {
			shared[g] = &GatewayShared{}
		}
		if p, ok := policies[k].(Placed); ok {
			p.Place(Placement{Gateway: g, VM: k % vms, Gateways: gateways, VMs: vms, Shared: shared[g], Run: runShared})
		}
		observers[k], _ = policies[k].(ResponseObserver)
	}
	vmRand := rand.New(rand.NewPCG(cfg.Seed, 0x6a7e))
	gen, err := newRunSource(cfg, sc)
	if err != nil {
		return Result{}, fmt.Errorf("fleet: scenario %q: %w", sc.Name, err)
	}
	critRand := rand.New(rand.NewPCG(cfg.Seed, 0xc417))

	reps := make([]*vllmsim.Replica, sc.Replicas)
	snap := &scheduler.Snapshot{Endpoints: make([]scheduler.Endpoint, sc.Replicas)}
	for i := range reps {
		if reps[i], err = vllmsim.NewReplica(sc.Replica); err != nil {
			return Result{}, err
		}
		snap.Endpoints[i] = scheduler.Endpoint{
			ID:      scheduler.EndpointID{Namespace: "fleet", Name: fmt.Sprintf("vllm-%d", i)},
			Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1),
			Port:    8000,
		}
	}
	inFlight := make([][]int, gateways)
	for g := range inFlight {
		inFlight[g] = make([]int, sc.Replicas)
	}
	views := make([]*View, len(policies))
	for k := range views {
		views[k] = &View{Snapshot: snap, InFlight: inFlight[k/vms], Replicas: reps}
		if k > 0 {
			views[k].Snapshot = &scheduler.Snapshot{Endpoints: slices.Clone(snap.Endpoints)}
		}
	}
	var activeSum, runningSum, kvSum float64
	var activeSamples int
	scrape := func(at time.Duration) {
		t := Epoch.Add(at)
		snap.Time = t
		inWindow := at >= cfg.Warmup && at < cfg.Warmup+cfg.Window
		for i, r := range reps {
			m := r.Metrics()
			if inWindow {
				activeSum += float64(len(m.RunningAdapters))
				runningSum += float64(m.Running)
				kvSum += m.KVCacheUsage
				activeSamples++
			}
			snap.Endpoints[i].Metrics = scheduler.Metrics{
				WaitingQueueSize: m.Waiting,
				RunningQueueSize: m.Running,
				KVCacheUsage:     m.KVCacheUsage,
				ActiveModels:     m.RunningAdapters,
				WaitingModels:    m.WaitingAdapters,
				MaxActiveModels:  m.MaxLoRAs,
				UpdateTime:       t,
			}
		}
		snap.Changed() // every endpoint rewritten in place
		for _, v := range views[1:] {
			// Every VM reads the same scrape into its own snapshot; what one
			// VM counts on top of it stays its own.
			v.Snapshot.Time = t
			copy(v.Snapshot.Endpoints, snap.Endpoints)
			v.Snapshot.Changed()
		}
	}
	counters := func() (c vllmsim.Counters) {
		for _, r := range reps {
			m := r.Metrics()
			c.GenerationTokens += m.GenerationTokens
			c.AdapterLoads += m.AdapterLoads
			c.Preemptions += m.Preemptions
			c.PrefixQueries += m.PrefixQueries
			c.PrefixHits += m.PrefixHits
		}
		return c
	}

	res := Result{
		Scenario: sc.Name, Policy: cfg.Policy.Name, Load: cfg.Load, Rate: cfg.Rate,
		Window: cfg.Window, Routed: make([]int, sc.Replicas),
	}
	winStart, winEnd := cfg.Warmup, cfg.Warmup+cfg.Window
	arrivalsEnd := winEnd + max(cfg.Cooldown, 0)
	maxDrain := cfg.MaxDrain
	if maxDrain <= 0 {
		maxDrain = 10 * arrivalsEnd
	}
	deadline := arrivalsEnd + maxDrain

	var store flights
	ttft, tpot, ntpot, e2e := into.ttft, into.tpot, into.ntpot, into.e2e
	defer func() { into.ttft, into.tpot, into.ntpot, into.e2e = ttft, tpot, ntpot, e2e }()
	var flow *flowState
	if cfg.Policy.Flow != nil {
		if flow, err = newFlowState(*cfg.Policy.Flow, cfg.Policy.FlowLocal, policies, &store); err != nil {
			return Result{}, err
		}
	}
	var atStart, atEnd vllmsim.Counters
	started, ended := false, false
	outstanding := 0
	req := scheduler.Request{}
	var next arrival
	nextScrape := time.Duration(0)

	response := func(f *flight, at time.Duration) Response {
		r := Response{ID: f.req.ID, Replica: f.replica, At: at, PromptTokens: f.req.PromptTokens,
			CachedTokens: f.req.CachedTokens, Generated: f.req.Generated}
		if cfg.HideCachedTokens {
			r.CachedTokens = -1
		}
		return r
	}
	firstTokens := func(started []*vllmsim.Request) {
		for _, r := range started {
			f := store.get(r.ID)
			if o := observers[f.policy]; o != nil {
				ev := response(f, r.FirstTokenAt)
				ev.CachedTokens = -1 // only the usage block at the end says
				o.FirstToken(ev)
			}
		}
	}
	complete := func(done []*vllmsim.Request) {
		for _, r := range done {
			f := store.get(r.ID)
			inFlight[f.policy/vms][f.replica]--
			outstanding--
			if o := observers[f.policy]; o != nil {
				o.Finished(response(f, r.CompletedAt))
			}
			if f.turn != nil {
				f.turn.ended(r.CompletedAt, true)
			}
			if r.CompletedAt >= winStart && r.CompletedAt < winEnd {
				res.ThroughputRPS++
			}
			if !f.measured {
				continue
			}
			res.Completed++
			res.PromptTokens += int64(r.PromptTokens)
			res.CachedTokens += int64(r.CachedTokens)
			// A request that waited in a queue counts its wait: the
			// replica only saw it arrive when it was sent.
			first := r.TTFT() + f.waited
			ttft = append(ttft, first)
			c := ClassOf(f.crit)
			res.Classes[c].Completed++
			into.classTTFT[c] = append(into.classTTFT[c], first)
			if r.Generated > 1 {
				tpot = append(tpot, r.TPOT())
			}
			lat := r.Latency() + f.waited
			e2e = append(e2e, lat)
			ntpot = append(ntpot, lat/time.Duration(r.OutputTokens))
		}
	}
	// Unique prompts share no block with any other, which a replica serves
	// exactly as a prompt without token ids (TestUniquePromptsServeAsWithoutIDs
	// in e2e/vllmsim), and without the hash index: the policies see the
	// ids, the replicas do not (BENCHMARKS.md, replica-model cost).
	idsToReplicas := !(sc.Traffic == nil && sc.UniquePrompts)
	// send submits f to replica i at time at.
	send := func(f *flight, i int, at time.Duration) error {
		if i < 0 || i >= len(reps) {
			return fmt.Errorf("fleet: policy %q routed to replica %d of %d", cfg.Policy.Name, i, len(reps))
		}
		f.replica = i
		inFlight[f.policy/vms][i]++
		outstanding++
		res.Routed[i]++
		if !idsToReplicas {
			f.req.Prompt = nil
		}
		err := reps[i].Submit(&f.req, at)
		f.req.Prompt = nil // the source reuses the buffer
		return err
	}
	// refuse counts f as refused (429) or without endpoint (503).
	refuse := func(f *flight, o ArrivalOutcome) {
		if cfg.RecordOutcomes {
			res.Outcomes[f.req.ID] = o
		}
		f.req.Prompt, f.req.Hashes = nil, nil
		if f.turn != nil {
			f.turn.ended(now, false)
		}
		c := ClassOf(f.crit)
		if o == OutcomeRefused {
			res.DroppedAll++
			if f.measured {
				res.Dropped++
				res.Classes[c].Refused++
			}
			return
		}
		res.NoEndpointAll++
		if f.measured {
			res.NoEndpoint++
			res.Classes[c].NoEndpoint++
		}
	}
	var releaseErr error
	if flow != nil {
		flow.onRelease(func(id uint64, r scheduler.Result, waited time.Duration) {
			f := store.get(id)
			if r.Outcome != scheduler.Routed && r.Outcome != scheduler.FailedOpen {
				refuse(f, OutcomeNoEndpoint)
				return
			}
			f.waited = waited
			if f.measured {
				into.wait = append(into.wait, waited)
			}
			if r.Index >= 0 && r.Index < len(reps) {
				w := reps[r.Index].Metrics().Waiting
				if w > scheduler.DefaultQueueThresholdCritical {
					flow.res.OverThreshold++
				}
				if w > flow.cfg.Admit.MaxWaiting {
					flow.res.OverRoom++
				}
			}
			if err := send(f, r.Index, now); err != nil && releaseErr == nil {
				releaseErr = err
			}
		})
	}

	for {
		stepAt, stepReplica := never, -1
		for i, r := range reps {
			if t, busy := r.NextEventTime(); busy && t < stepAt {
				stepAt, stepReplica = t, i
			}
		}
		arriveAt, scrapeAt, tickAt := never, never, never
		if a := gen.peek(); a < arrivalsEnd {
			arriveAt, scrapeAt = a, nextScrape
		}
		if flow != nil && (arriveAt < arrivalsEnd || flow.queued() > 0) {
			// Queued requests need fresh metrics and ticks until they leave.
			scrapeAt, tickAt = nextScrape, flow.nextTick
		}
		at := min(stepAt, scrapeAt, tickAt, arriveAt)
		if cfg.capacity && at >= arrivalsEnd {
			break // a capacity run does not drain
		}
		if at == never {
			break // no arrivals left, nothing queued and every replica idle: drained
		}
		if at > deadline {
			return res, fmt.Errorf("fleet: %s/%s at %.0f req/s: %d requests still running %v after arrivals stopped",
				sc.Name, cfg.Policy.Name, cfg.Rate, outstanding, maxDrain)
		}
		if !started && at >= winStart {
			atStart, started = counters(), true
		}
		if !ended && at >= winEnd {
			atEnd, ended = counters(), true
		}
		now = at
		switch {
		case at == stepAt:
			done := reps[stepReplica].Advance(at)
			firstTokens(reps[stepReplica].FirstTokens())
			complete(done)
		case at == scrapeAt:
			scrape(at)
			nextScrape += cfg.ScrapeInterval
			for _, p := range policies {
				if t, ok := p.(Ticker); ok {
					t.Tick(at)
				}
			}
			if flow != nil {
				flow.tag++ // every VM's copy now holds this scrape
			}
		case at == tickAt:
			flow.tick(at, views, func(id uint64) { refuse(store.get(id), OutcomeRefused) })
			if releaseErr != nil {
				return res, releaseErr
			}
		default:
			gen.take(&next)
			f, id := store.add()
			f.req = vllmsim.Request{ID: id, Adapter: next.adapter, PromptTokens: next.promptTokens, OutputTokens: next.outputTokens,
				Prompt: next.prompt, OutputSeed: next.outputSeed, Hashes: next.hashes}
			f.turn = next.turn
			f.measured = at >= winStart && at < winEnd
			f.crit = sc.Criticality.pick(critRand.Float64())
			res.Arrivals++
			if cfg.RecordOutcomes {
				res.Outcomes = append(res.Outcomes, OutcomeCompleted)
			}
			if f.measured {
				res.Measured++
				res.Classes[ClassOf(f.crit)].Measured++
			}
			req.Model, req.TargetModel = next.adapter, next.adapter
			req.Criticality = f.crit
			vm := 0
			if len(policies) > 1 {
				// The gateway, then its VM: one draw over both.
				vm = vmRand.IntN(len(policies))
			}
			f.policy = vm
			views[vm].Request = &f.req
			var i int
			var outcome scheduler.Outcome
			if flow != nil {
				i, outcome = flow.route(vm, &req, policies[vm], views[vm], at) // flow.go
				if releaseErr != nil {
					return res, releaseErr
				}
			} else {
				i, outcome = policies[vm].Route(&req, views[vm])
			}
			switch outcome {
			case scheduler.Routed:
				if err := send(f, i, at); err != nil {
					return res, fmt.Errorf("fleet: arrival %d: %w", next.seq, err)
				}
			case scheduler.Dropped:
				if flow != nil && f.crit != scheduler.Critical {
					// A held request keeps its prompt until released.
					f.req.Prompt = slices.Clone(f.req.Prompt)
				}
				if flow == nil || f.crit == scheduler.Critical || !flow.hold(vm, id, f, at) {
					refuse(f, OutcomeRefused)
				}
			default:
				refuse(f, OutcomeNoEndpoint)
			}
			views[vm].Request = nil
		}
	}
	if !started {
		atStart = counters()
	}
	if !ended {
		atEnd = counters()
	}
	res.End = now
	if flow != nil {
		res.Flow = flow.result() // Wait is pooled from the samples by RunSeeds
	}
	if cfg.capacity {
		outstanding, res.Measured = 0, res.Completed+res.Dropped+res.NoEndpoint
	}
	if outstanding != 0 || res.Completed+res.Dropped+res.NoEndpoint != res.Measured {
		// Conservation: every measured arrival is completed, dropped or
		// refused. A mismatch is a simulator bug, never a result.
		return res, fmt.Errorf("fleet: conservation broken: %d measured = %d completed + %d dropped + %d no-endpoint, %d outstanding",
			res.Measured, res.Completed, res.Dropped, res.NoEndpoint, outstanding)
	}
	secs := cfg.Window.Seconds()
	res.ThroughputRPS /= secs
	res.OutputTokPS = float64(atEnd.GenerationTokens-atStart.GenerationTokens) / secs
	res.AdapterLoads = atEnd.AdapterLoads - atStart.AdapterLoads
	res.Preemptions = atEnd.Preemptions - atStart.Preemptions
	if q := atEnd.PrefixQueries - atStart.PrefixQueries; q > 0 {
		res.replicaHitRate = float64(atEnd.PrefixHits-atStart.PrefixHits) / float64(q)
	}
	if activeSamples > 0 {
		res.MeanActiveAdapters = activeSum / float64(activeSamples)
		res.meanRunning = runningSum / float64(activeSamples)
		res.meanKVUsage = kvSum / float64(activeSamples)
	}
	for _, p := range policies {
		if pr, ok := p.(PredictionReporter); ok {
			res.Prediction.Add(pr.Prediction())
		}
	}
	return res, nil
}

// HitRate is the prefix hit rate of the measured completed requests: cached
// over prompt tokens.
func (r *Result) HitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(r.PromptTokens)
}
