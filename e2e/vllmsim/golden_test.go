package vllmsim

import (
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/outcomes.golden from the current model")

// TestOutcomesMatchTheGolden pins every request's outcome of a few mixed
// workloads (first token, completion, cached tokens, preemptions, replica
// counters) to testdata/outcomes.golden. Changes that only make the model
// faster must leave it untouched; a change of behaviour shows here first
// and is accepted with -update (and e2e/results regenerated).
func TestOutcomesMatchTheGolden(t *testing.T) {
	var got strings.Builder
	for _, tc := range []struct {
		name     string
		kvBlocks int
		loras    int
		nilShare int // one request in nilShare has no token ids; 0: none
	}{
		{"roomy", 4000, 0, 0},
		{"pressure", 600, 0, 0},
		{"pressure-lora", 600, 2, 0},
		{"pressure-mixed", 500, 2, 3},
		{"no-token-ids", 400, 2, 1},
	} {
		got.WriteString(goldenRun(t, tc.name, tc.kvBlocks, tc.loras, tc.nilShare))
	}
	path := "testdata/outcomes.golden"
	if *updateGolden {
		require.NoError(t, os.WriteFile(path, []byte(got.String()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), got.String(), "the replica model's outcomes changed (go test -run TestOutcomesMatchTheGolden -update ./e2e/vllmsim to accept)")
}

// goldenRun drives three replicas with multi-turn conversations whose
// turns re-send the history (prompt, the replica's own output tokens, a new
// message), groups sharing long contexts, adapters, and the oracle's
// CachedPrefixTokens and Load calls, and summarises every outcome.
func goldenRun(t *testing.T, name string, kvBlocks, loras, nilShare int) string {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(kvBlocks), uint64(loras*10+nilShare)))
	fleet := make([]*Replica, 3)
	for i := range fleet {
		cfg := DefaultReplicaConfig(Llama31_8B)
		cfg.KVCapacityTokens = 16 * kvBlocks
		cfg.MaxModelLen = cfg.KVCapacityTokens
		cfg.MaxNumBatchedTokens = 512
		cfg.MaxLoRAs = loras
		r, err := NewReplica(cfg)
		require.NoError(t, err)
		fleet[i] = r
	}
	contexts := make([][]uint32, 5)
	for i := range contexts {
		contexts[i] = tokens(uint32(i+1)<<24, 300+rng.IntN(900))
	}
	type session struct {
		history []uint32
		turns   int
	}
	sessions := make([]session, 12)
	var reqs []*Request
	var now time.Duration
	var loadSum int
	for i := range 700 {
		now += time.Duration(rng.ExpFloat64() * float64(15*time.Millisecond))
		var prompt []uint32
		if k := rng.IntN(3); k == 0 {
			prompt = append(append(prompt, contexts[rng.IntN(len(contexts))]...), tokens(uint32(i)<<12, 20+rng.IntN(200))...)
		} else {
			s := &sessions[rng.IntN(len(sessions))]
			if s.turns == 6 {
				s.history, s.turns = s.history[:0], 0
			}
			s.history = append(s.history, tokens(uint32(i)<<12|1<<11, 10+rng.IntN(150))...)
			s.turns++
			prompt = append(prompt, s.history...)
		}
		q := &Request{ID: uint64(i), PromptTokens: len(prompt), Prompt: prompt, OutputTokens: 1 + rng.IntN(120), OutputSeed: uint64(i)}
		if loras > 0 {
			q.Adapter = []string{"", "a", "b", "c"}[rng.IntN(4)]
		}
		if nilShare > 0 && rng.IntN(nilShare) == 0 {
			q.Prompt = nil
		}
		if q.PromptTokens+q.OutputTokens > fleet[0].cfg.MaxModelLen {
			continue
		}
		// Route to the replica the oracle would like best, now and then at
		// random, advancing every replica to the arrival first.
		for _, r := range fleet {
			r.Advance(now)
		}
		best, bestScore := rng.IntN(len(fleet)), -1<<62
		if rng.IntN(4) != 0 {
			for j, r := range fleet {
				l := r.Load()
				loadSum += l.PendingPrefillTokens + l.DecodeContextTokens
				if score := r.CachedPrefixTokens(q) - l.PendingPrefillTokens - 50*l.Waiting; score > bestScore {
					best, bestScore = j, score
				}
			}
		}
		require.NoError(t, fleet[best].Submit(q, now))
		reqs = append(reqs, q)
	}
	for _, r := range fleet {
		drain(t, r)
	}
	h := fnv.New64a()
	for _, q := range reqs {
		require.True(t, q.Done())
		fmt.Fprintf(h, "%d %d %d %d %d %d;", q.ID, q.FirstTokenAt, q.CompletedAt, q.CachedTokens, q.Preemptions, q.Generated)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s requests=%d outcomes=%016x load=%d\n", name, len(reqs), h.Sum64(), loadSum)
	for i, r := range fleet {
		m := r.Metrics()
		fmt.Fprintf(&b, "  replica %d: %+v cached=%d used=%d\n", i, m.Counters, m.KVBlocksCached, m.KVBlocksUsed)
	}
	return b.String()
}

// TestUniquePromptsServeAsWithoutIDs: prompts whose token ids no other
// request shares are served exactly as prompts without ids, under KV
// pressure (preemptions whose resumption hits the request's own blocks,
// found by hash in one case and by tag in the other) and with adapters.
// The fleet benchmark relies on it to keep such prompts' ids from the
// replicas (e2e/fleet sim.go).
func TestUniquePromptsServeAsWithoutIDs(t *testing.T) {
	serve := func(withIDs bool) ([]Request, Metrics) {
		cfg := DefaultReplicaConfig(Llama2_7B)
		cfg.KVCapacityTokens = 16 * 700
		cfg.MaxModelLen = cfg.KVCapacityTokens
		cfg.MaxNumBatchedTokens = 512
		cfg.MaxLoRAs = 2
		r, err := NewReplica(cfg)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(5, 6))
		reqs := make([]Request, 600)
		var now time.Duration
		for i := range reqs {
			q := &reqs[i]
			q.ID, q.PromptTokens, q.OutputTokens, q.OutputSeed = uint64(i), 1+rng.IntN(700), 1+rng.IntN(300), uint64(i)
			q.Adapter = []string{"", "a", "b", "c"}[rng.IntN(4)]
			prompt := make([]uint32, q.PromptTokens)
			for k := range prompt {
				prompt[k] = rng.Uint32()
			}
			ask := rng.IntN(3) == 0
			if withIDs {
				q.Prompt = prompt
				if ask {
					r.CachedPrefixTokens(q) // as the oracle asks before Submit
				}
			}
			now += time.Duration(rng.ExpFloat64() * float64(20*time.Millisecond))
			require.NoError(t, r.Submit(q, now))
			q.Prompt = nil
		}
		drain(t, r)
		return reqs, r.Metrics()
	}
	with, mWith := serve(true)
	without, mWithout := serve(false)
	require.Positive(t, mWith.Preemptions, "the run must preempt")
	require.Positive(t, mWith.PreemptedPrefixHits, "and resume on its own blocks")
	require.Equal(t, mWithout, mWith)
	for i := range with {
		a, b := &with[i], &without[i]
		require.Equal(t, [5]any{b.FirstTokenAt, b.CompletedAt, b.CachedTokens, b.Preemptions, b.Generated},
			[5]any{a.FirstTokenAt, a.CompletedAt, a.CachedTokens, a.Preemptions, a.Generated}, "request %d", i)
	}
}
