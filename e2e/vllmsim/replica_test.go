package vllmsim

import (
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testConfig(mod func(*ReplicaConfig)) ReplicaConfig {
	cfg := DefaultReplicaConfig(Llama2_7B)
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

func newTestReplica(t *testing.T, mod func(*ReplicaConfig)) *Replica {
	t.Helper()
	r, err := NewReplica(testConfig(mod))
	require.NoError(t, err)
	return r
}

func us(v float64) time.Duration { return micros(v) }

// drain advances until idle and returns completions in order.
func drain(t *testing.T, r *Replica) []*Request {
	t.Helper()
	var done []*Request
	for i := 0; ; i++ {
		require.Less(t, i, 1_000_000, "replica never went idle")
		next, ok := r.NextEventTime()
		if !ok {
			break
		}
		done = append(done, r.Advance(next)...)
	}
	return done
}

func TestStepTimeFollowsSIMPARAMSFormula(t *testing.T) {
	r := newTestReplica(t, nil)
	req := &Request{PromptTokens: 100, OutputTokens: 3}
	require.NoError(t, r.Submit(req, 0))

	// Step 1 prefills 100 tokens: 5750 + 17.25·100 µs, and samples token 1.
	step1 := us(5750 + 17.25*100)
	// Steps 2 and 3 decode one sequence of context 101 then 102 tokens.
	step2 := us(5750 + 6 + 0.30*101)
	step3 := us(5750 + 6 + 0.30*102)

	next, ok := r.NextEventTime()
	require.True(t, ok)
	assert.Equal(t, step1, next)
	done := drain(t, r)
	require.Equal(t, []*Request{req}, done)
	assert.Equal(t, step1, req.FirstTokenAt)
	assert.Equal(t, step1+step2+step3, req.CompletedAt)
	assert.Equal(t, req.CompletedAt, req.LastTokenAt)
	assert.Equal(t, 3, req.Generated)
	assert.True(t, req.Done())
	assert.Equal(t, step1, req.TTFT())
	assert.Equal(t, (step2+step3)/2, req.TPOT())

	m := r.Metrics()
	assert.Equal(t, int64(3), m.Steps)
	assert.Equal(t, int64(100), m.PromptTokens)
	assert.Equal(t, int64(3), m.GenerationTokens)
	assert.Equal(t, 0.0, m.KVCacheUsage)
	assert.Equal(t, step1+step2+step3, m.BusyTime)
}

func TestProfilesDifferOnlyInContextCost(t *testing.T) {
	assert.Equal(t, us(5750+17.25*10+6*4+0.30*1000), Llama2_7B.StepTime(10, 4, 1000))
	assert.Equal(t, us(5750+17.25*10+6*4+0.075*1000), Llama31_8B.StepTime(10, 4, 1000))
	p, err := ProfileByName("llama-3.1-8b")
	require.NoError(t, err)
	assert.Equal(t, Llama31_8B, p)
	_, err = ProfileByName("gpt-5")
	assert.ErrorContains(t, err, "unknown model profile")
}

func TestChunkedPrefillSplitsLongPrompts(t *testing.T) {
	r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxModelLen = 8192 })
	req := &Request{PromptTokens: 5000, OutputTokens: 1}
	require.NoError(t, r.Submit(req, 0))
	done := drain(t, r)
	require.Len(t, done, 1)
	// 2048 + 2048 + 904 tokens over three steps; the third samples the token.
	want := us(5750+17.25*2048)*2 + us(5750+17.25*904)
	assert.Equal(t, want, req.FirstTokenAt)
	assert.Equal(t, int64(3), r.Metrics().Steps)
}

func TestMaxNumSeqsCapsTheBatch(t *testing.T) {
	r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxNumSeqs = 4 })
	for i := range 10 {
		require.NoError(t, r.Submit(&Request{ID: uint64(i), PromptTokens: 20, OutputTokens: 50}, 0))
	}
	sawFull := false
	for {
		m := r.Metrics()
		require.LessOrEqual(t, m.Running, 4)
		require.Equal(t, 10-int(m.Completed), m.Running+m.Waiting)
		if m.Running == 4 {
			sawFull = true
			assert.Equal(t, 10-4-int(m.Completed), m.Waiting)
		}
		next, ok := r.NextEventTime()
		if !ok {
			break
		}
		r.Advance(next)
	}
	assert.True(t, sawFull)
	assert.Equal(t, int64(10), r.Metrics().Completed)
}

func TestAdmissionWaitsForFreeKVBlocks(t *testing.T) {
	// 20 blocks of 16 tokens. Each request needs 10 blocks (150 prompt + up
	// to 9 generated tokens fit in 160), so two run and the third waits.
	r := newTestReplica(t, func(c *ReplicaConfig) { c.KVCapacityTokens = 320; c.MaxModelLen = 320 })
	reqs := []*Request{{PromptTokens: 150, OutputTokens: 10}, {PromptTokens: 150, OutputTokens: 10}, {PromptTokens: 150, OutputTokens: 10}}
	require.NoError(t, r.Submit(&Request{PromptTokens: 1, OutputTokens: 1}, 0)) // occupies step 1
	for _, q := range reqs {
		require.NoError(t, r.Submit(q, 0))
	}
	next, _ := r.NextEventTime()
	r.Advance(next) // step 2 admits the first two
	m := r.Metrics()
	assert.Equal(t, 2, m.Running)
	assert.Equal(t, 1, m.Waiting)
	assert.Equal(t, 1.0, m.KVCacheUsage)
	assert.Equal(t, 20, m.KVBlocksUsed)

	drain(t, r)
	assert.Greater(t, reqs[2].FirstTokenAt, reqs[0].CompletedAt, "third request starts only after KV is freed")
	assert.Equal(t, int64(0), r.Metrics().Preemptions)
}

func TestDecodeWithoutFreeBlocksPreemptsTheNewestRequest(t *testing.T) {
	// Two requests of 150 prompt tokens fill 20 blocks; when they grow past
	// 160 tokens the later-admitted one is preempted and recomputed.
	r := newTestReplica(t, func(c *ReplicaConfig) { c.KVCapacityTokens = 320; c.MaxModelLen = 320 })
	require.NoError(t, r.Submit(&Request{PromptTokens: 1, OutputTokens: 1}, 0))
	first := &Request{ID: 1, PromptTokens: 150, OutputTokens: 40}
	second := &Request{ID: 2, PromptTokens: 150, OutputTokens: 40}
	require.NoError(t, r.Submit(first, 0))
	require.NoError(t, r.Submit(second, 0))
	done := drain(t, r)

	require.Len(t, done, 3)
	assert.Equal(t, 0, first.Preemptions)
	assert.GreaterOrEqual(t, second.Preemptions, 1)
	assert.Equal(t, 40, first.Generated)
	assert.Equal(t, 40, second.Generated)
	assert.Greater(t, second.CompletedAt, first.CompletedAt)
	assert.Less(t, second.FirstTokenAt, first.CompletedAt, "first token predates the preemption and is kept")
	m := r.Metrics()
	assert.Equal(t, int64(second.Preemptions), m.Preemptions)
	assert.Equal(t, int64(81), m.GenerationTokens)
	assert.Equal(t, int64(301), m.PromptTokens, "prompt tokens count once per request")
	assert.Greater(t, m.PrefillTokens, m.PromptTokens, "recomputation adds prefill work")
	assert.Equal(t, 0, m.KVBlocksUsed)
}

// loraQueue submits, on one adapter slot, sql (long), tweet, sql and a
// base-model request, in that order.
func loraQueue(t *testing.T, rule LoRAAdmission) (r *Replica, a1, b, a2, base *Request) {
	r = newTestReplica(t, func(c *ReplicaConfig) { c.MaxLoRAs = 1; c.LoRAAdmission = rule })
	a1 = &Request{ID: 1, Adapter: "sql", PromptTokens: 10, OutputTokens: 30}
	b = &Request{ID: 2, Adapter: "tweet", PromptTokens: 10, OutputTokens: 5}
	a2 = &Request{ID: 3, Adapter: "sql", PromptTokens: 10, OutputTokens: 5}
	base = &Request{ID: 4, PromptTokens: 10, OutputTokens: 5}
	for _, q := range []*Request{a1, b, a2, base} {
		require.NoError(t, r.Submit(q, 0))
	}
	return r, a1, b, a2, base
}

func TestLoRARequestWithoutSlotWaitsWithoutBlockingOthers(t *testing.T) {
	r, a1, b, a2, base := loraQueue(t, LoRASkip)
	next, _ := r.NextEventTime()
	r.Advance(next) // step 1 ran a1 alone; step 2 admits a2 and base, skips b

	m := r.Metrics()
	assert.Equal(t, 3, m.Running)
	assert.Equal(t, 1, m.Waiting)
	assert.Equal(t, []string{"sql"}, m.RunningAdapters)
	assert.Equal(t, []string{"tweet"}, m.WaitingAdapters)
	assert.Equal(t, 1, m.MaxLoRAs)

	drain(t, r)
	assert.Less(t, a2.CompletedAt, b.FirstTokenAt, "a request behind the blocked one ran first")
	assert.Less(t, base.CompletedAt, b.FirstTokenAt)
	assert.GreaterOrEqual(t, b.FirstTokenAt, a1.CompletedAt, "tweet gets the slot once sql has left the batch")
	assert.Equal(t, []string{"tweet"}, r.ResidentAdapters())
	assert.Equal(t, int64(2), r.Metrics().AdapterLoads)
}

func TestLoRAFIFOBlocksBehindTheWaitingAdapter(t *testing.T) {
	// The same arrivals as above under vLLM V1's earlier FIFO rule:
	// b's adapter has no slot, so nothing behind it is admitted either.
	r, a1, b, a2, base := loraQueue(t, LoRAFIFO)
	next, _ := r.NextEventTime()
	r.Advance(next)
	m := r.Metrics()
	assert.Equal(t, 1, m.Running)
	assert.Equal(t, 3, m.Waiting)
	drain(t, r)
	assert.GreaterOrEqual(t, b.FirstTokenAt, a1.CompletedAt)
	assert.Greater(t, a2.FirstTokenAt, b.FirstTokenAt, "arrival order holds")
	assert.Greater(t, base.FirstTokenAt, b.FirstTokenAt)
	_, err := ParseLoRAAdmission("lifo")
	assert.Error(t, err)
	for _, a := range []LoRAAdmission{LoRASkip, LoRAFIFO} {
		got, err := ParseLoRAAdmission(a.String())
		require.NoError(t, err)
		assert.Equal(t, a, got)
	}
}

func TestLoRASkipLetsARunningAdapterStarveAWaitingOne(t *testing.T) {
	// One slot, sql arriving every 20 ms with 30-token outputs (always one
	// running), tweet once at the start: under vLLM's rule tweet waits until
	// sql's traffic stops; under FIFO it is served after the sql requests
	// that arrived before it.
	for _, tc := range []struct {
		rule    LoRAAdmission
		starved bool
	}{{LoRASkip, true}, {LoRAFIFO, false}} {
		t.Run(tc.rule.String(), func(t *testing.T) {
			r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxLoRAs = 1; c.LoRAAdmission = tc.rule })
			require.NoError(t, r.Submit(&Request{Adapter: "sql", PromptTokens: 10, OutputTokens: 30}, 0))
			tweet := &Request{Adapter: "tweet", PromptTokens: 10, OutputTokens: 5}
			require.NoError(t, r.Submit(tweet, time.Millisecond))
			last := time.Duration(0)
			for at := 20 * time.Millisecond; at < 2*time.Second; at += 20 * time.Millisecond {
				require.NoError(t, r.Submit(&Request{Adapter: "sql", PromptTokens: 10, OutputTokens: 30}, at))
				last = at
			}
			drain(t, r)
			if tc.starved {
				assert.Greater(t, tweet.FirstTokenAt, last, "tweet waits for the last sql request")
			} else {
				assert.Less(t, tweet.FirstTokenAt, 500*time.Millisecond)
			}
		})
	}
}

func TestLoRASlowdownAndLoadTime(t *testing.T) {
	load := 1500*time.Microsecond + us(float64(32<<20)/2e6)
	r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxLoRAs = 2 })
	// A base request occupies step 1 so that both adapters join step 2.
	warm := &Request{PromptTokens: 10, OutputTokens: 3}
	require.NoError(t, r.Submit(warm, 0))
	a := &Request{Adapter: "a", PromptTokens: 100, OutputTokens: 2}
	b := &Request{Adapter: "b", PromptTokens: 100, OutputTokens: 2}
	require.NoError(t, r.Submit(a, 0))
	require.NoError(t, r.Submit(b, 0))
	step1 := us(5750 + 17.25*10)
	r.Advance(step1)

	// Step 2: warm decodes (context 11), a and b prefill 200 tokens with two
	// distinct adapters (×1.04), and both adapters are loaded.
	next, _ := r.NextEventTime()
	step2 := us((5750+17.25*200+6+0.30*11)*1.04) + 2*load
	assert.Equal(t, step1+step2, next)
	r.Advance(next)

	// Step 3: three decoding sequences, adapters already resident.
	next, _ = r.NextEventTime()
	step3 := us((5750 + 6*3 + 0.30*(12+101+101)) * 1.04)
	assert.Equal(t, step1+step2+step3, next)
	drain(t, r)
	assert.Equal(t, int64(2), r.Metrics().AdapterLoads)

	// A resident adapter is not loaded again.
	again := &Request{Adapter: "a", PromptTokens: 100, OutputTokens: 1}
	now := r.Now()
	require.NoError(t, r.Submit(again, now))
	drain(t, r)
	assert.Equal(t, now+us((5750+17.25*100)*1.02), again.CompletedAt)
	assert.Equal(t, int64(2), r.Metrics().AdapterLoads)
}

func TestAdapterDiskLoadOnlyWhenNotInCPUMemory(t *testing.T) {
	disk := 200 * time.Millisecond
	r := newTestReplica(t, func(c *ReplicaConfig) {
		c.MaxLoRAs = 1
		c.AdapterLoad.DiskLoad = disk
		c.AdapterLoad.SizeBytes = 0
	})
	run := func(adapter string) time.Duration {
		q := &Request{Adapter: adapter, PromptTokens: 100, OutputTokens: 1}
		start := r.Now()
		require.NoError(t, r.Submit(q, start))
		drain(t, r)
		return q.CompletedAt - start
	}
	compute := us((5750 + 17.25*100) * 1.02)
	cpu := 1500 * time.Microsecond
	assert.Equal(t, compute+cpu+disk, run("a"), "first use reads from disk")
	assert.Equal(t, compute, run("a"), "resident")
	assert.Equal(t, compute+cpu+disk, run("b"), "first use of b evicts a from the GPU slot")
	assert.Equal(t, compute+cpu, run("a"), "a is still in CPU memory")
}

func TestSubmitRejectsBadRequests(t *testing.T) {
	tests := []struct {
		name string
		req  *Request
		at   time.Duration
		want error
	}{
		{"no prompt", &Request{PromptTokens: 0, OutputTokens: 1}, time.Second, ErrInvalidRequest},
		{"no output", &Request{PromptTokens: 1, OutputTokens: 0}, time.Second, ErrInvalidRequest},
		{"too long", &Request{PromptTokens: 4000, OutputTokens: 97}, time.Second, ErrTooLong},
		{"adapter without LoRA", &Request{Adapter: "x", PromptTokens: 1, OutputTokens: 1}, time.Second, ErrLoRADisabled},
		{"clock backwards", &Request{PromptTokens: 1, OutputTokens: 1}, 0, ErrClockBackwards},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestReplica(t, nil)
			r.Advance(500 * time.Millisecond)
			assert.ErrorIs(t, r.Submit(tc.req, tc.at), tc.want)
		})
	}
	r := newTestReplica(t, nil)
	q := &Request{PromptTokens: 1, OutputTokens: 1}
	require.NoError(t, r.Submit(q, 0))
	assert.ErrorIs(t, r.Submit(q, 0), ErrAlreadySubmited)
}

func TestNewReplicaRejectsIncompleteConfig(t *testing.T) {
	tests := map[string]func(*ReplicaConfig){
		"zero config":           func(c *ReplicaConfig) { *c = ReplicaConfig{} },
		"no seqs":               func(c *ReplicaConfig) { c.MaxNumSeqs = 0 },
		"no budget":             func(c *ReplicaConfig) { c.MaxNumBatchedTokens = 0 },
		"model longer than KV":  func(c *ReplicaConfig) { c.KVCapacityTokens = 1000 },
		"negative loras":        func(c *ReplicaConfig) { c.MaxLoRAs = -1 },
		"cpu cache below slots": func(c *ReplicaConfig) { c.MaxLoRAs = 4; c.AdapterLoad.MaxCPUAdapters = 2 },
	}
	for name, mod := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := NewReplica(testConfig(mod))
			assert.Error(t, err)
		})
	}
}

func TestAbortFreesWaitingAndRunningRequests(t *testing.T) {
	r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxNumSeqs = 1 })
	running := &Request{PromptTokens: 100, OutputTokens: 100}
	waiting := &Request{PromptTokens: 100, OutputTokens: 100}
	require.NoError(t, r.Submit(running, 0))
	require.NoError(t, r.Submit(waiting, 0))
	r.Advance(50 * time.Millisecond)
	require.Equal(t, 1, r.Metrics().Running)

	ok, err := r.Abort(waiting, 50*time.Millisecond)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = r.Abort(running, 60*time.Millisecond)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, _ = r.Abort(running, 60*time.Millisecond)
	assert.False(t, ok, "already aborted")

	drain(t, r)
	m := r.Metrics()
	assert.Equal(t, 0, m.Running+m.Waiting)
	assert.Equal(t, 0, m.KVBlocksUsed)
	assert.Equal(t, int64(2), m.Aborted)
	assert.Equal(t, int64(0), m.Completed)
}

// TestInvariantsUnderLoad drives an overloaded LoRA replica and checks the
// limits at every step and the token accounting at the end.
func TestInvariantsUnderLoad(t *testing.T) {
	cfg := testConfig(func(c *ReplicaConfig) { c.MaxLoRAs = 3; c.MaxNumSeqs = 64; c.KVCapacityTokens = 12_000 })
	r, err := NewReplica(cfg)
	require.NoError(t, err)
	wl := ShareGPTWorkload(30, 7)
	wl.Adapters = EqualShares(AdapterNames("lora", 8)...)
	gen, err := NewWorkload(wl)
	require.NoError(t, err)

	var reqs []*Request
	var wantTokens int64
	completed := 0
	check := func() {
		m := r.Metrics()
		require.LessOrEqual(t, m.Running, cfg.MaxNumSeqs)
		require.LessOrEqual(t, len(m.RunningAdapters), cfg.MaxLoRAs)
		require.LessOrEqual(t, m.KVBlocksUsed, m.KVBlocksTotal)
		require.LessOrEqual(t, len(r.ResidentAdapters()), cfg.MaxLoRAs)
	}
	for a := gen.Next(); a.At < 20*time.Second; a = gen.Next() {
		for {
			next, ok := r.NextEventTime()
			if !ok || next > a.At {
				break
			}
			completed += len(r.Advance(next))
			check()
		}
		q := &Request{ID: uint64(a.Seq), Adapter: a.Adapter, PromptTokens: a.PromptTokens, OutputTokens: a.OutputTokens}
		require.NoError(t, r.Submit(q, a.At))
		reqs = append(reqs, q)
		wantTokens += int64(a.OutputTokens)
	}
	completed += len(drain(t, r))
	m := r.Metrics()
	assert.Equal(t, len(reqs), completed)
	assert.Equal(t, wantTokens, m.GenerationTokens)
	assert.Greater(t, m.Preemptions, int64(0), "the KV cache was too small on purpose")
	for _, q := range reqs {
		require.True(t, q.Done())
		require.Equal(t, q.OutputTokens, q.Generated)
		require.LessOrEqual(t, q.Arrival, q.FirstTokenAt)
		require.LessOrEqual(t, q.FirstTokenAt, q.CompletedAt)
	}
}

func runDigest(t *testing.T, seed uint64) uint64 {
	t.Helper()
	r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxLoRAs = 2 })
	wl := ShareGPTWorkload(25, seed)
	wl.Adapters = EqualShares("a", "b", "c")
	gen, err := NewWorkload(wl)
	require.NoError(t, err)
	h := fnv.New64a()
	for a := gen.Next(); a.At < 30*time.Second; a = gen.Next() {
		for _, q := range r.Advance(a.At) {
			fmt.Fprintf(h, "%d %d %d %d;", q.ID, q.FirstTokenAt, q.CompletedAt, q.Preemptions)
		}
		require.NoError(t, r.Submit(&Request{ID: uint64(a.Seq), Adapter: a.Adapter, PromptTokens: a.PromptTokens, OutputTokens: a.OutputTokens}, a.At))
	}
	for _, q := range drain(t, r) {
		fmt.Fprintf(h, "%d %d %d %d;", q.ID, q.FirstTokenAt, q.CompletedAt, q.Preemptions)
	}
	return h.Sum64()
}

func TestSameSeedSameTimeline(t *testing.T) {
	assert.Equal(t, runDigest(t, 42), runDigest(t, 42))
	assert.NotEqual(t, runDigest(t, 42), runDigest(t, 43))
}

func TestMetricsListAdaptersByName(t *testing.T) {
	r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxLoRAs = 4 })
	for i, name := range []string{"zeta", "alpha", "mid", "beta", "alpha", "omega"} {
		require.NoError(t, r.Submit(&Request{ID: uint64(i), Adapter: name, PromptTokens: 10, OutputTokens: 50}, 0))
	}
	next, _ := r.NextEventTime()
	r.Advance(next) // four adapters run, omega waits for a slot
	m := r.Metrics()
	assert.Equal(t, []string{"alpha", "beta", "mid", "zeta"}, m.RunningAdapters)
	assert.Equal(t, []string{"omega"}, m.WaitingAdapters)
}
