package vllmsim

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokens returns n token ids starting at from: tokens(0, 48) and
// tokens(0, 60) share their first 48.
func tokens(from uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func promptRequest(prompt []uint32, out int) *Request {
	return &Request{PromptTokens: len(prompt), Prompt: prompt, OutputTokens: out}
}

// checkPool verifies the block pool's invariants against the replica's
// requests: the free queue holds exactly the blocks with no reference, the
// references are the running requests' block tables, and the cache maps
// only hashed blocks.
func checkPool(t *testing.T, r *Replica) {
	t.Helper()
	p := &r.pool
	inQueue := 0
	queued := make([]bool, len(p.blocks))
	for _, b := range freeQueue(p) {
		require.Zero(t, p.blocks[b].ref, "block %d in the free queue", b)
		require.False(t, queued[b], "block %d twice in the free queue", b)
		queued[b] = true
		inQueue++
	}
	for _, b := range p.stack {
		require.Zero(t, p.blocks[b].hash, "block %d on the stack has no hash", b)
	}
	require.Equal(t, p.free, inQueue)
	refs := make([]int32, len(p.blocks))
	for _, s := range r.running {
		for _, b := range s.table {
			refs[b]++
		}
		require.Equal(t, r.blocksFor(int(s.computed+s.sched)), len(s.table), "a running request holds the blocks of its computed and scheduled tokens")
		require.Equal(t, len(s.table)*r.blockTokens, int(s.tableTokens))
	}
	hashed := 0
	for _, s := range r.running {
		if s.salt != 0 {
			// Counted as cached when full, tagged when freed.
			for i, b := range s.table[:s.cachedBlocks] {
				require.Equal(t, i < s.taggedBlocks, p.blocks[b].hash != 0, "block %d of a running request without token ids", i)
			}
			hashed += s.cachedBlocks - s.taggedBlocks
		}
	}
	for b := range p.blocks {
		blk := &p.blocks[b]
		require.Equal(t, refs[b], blk.ref, "block %d", b)
		require.Equal(t, blk.ref == 0, queued[b], "block %d", b)
		require.Equal(t, blk.ref == 0, p.isFree(int32(b)), "block %d", b)
		if blk.hash != 0 {
			hashed++
		}
		if blk.hash != 0 && blk.flags&virtualBlock == 0 {
			found := false
			for c := p.byHash.get(blk.hash, blk.home); c != noBlock; c = p.blocks[c].link {
				found = found || c == int32(b)
			}
			require.True(t, found, "hashed block %d is reachable from the cache", b)
		}
	}
	require.Equal(t, p.hashed, hashed)
	require.LessOrEqual(t, r.totalBlocks-p.free, r.totalBlocks)
}

// freeQueue lists the pool's free queue from its head: the stack from its
// top, then the FIFO's live entries.
func freeQueue(p *blockPool) []int32 {
	var q []int32
	for i := len(p.stack) - 1; i >= 0; i-- {
		q = append(q, p.stack[i])
	}
	for seq := p.fifoHead; seq < p.fifoTail; seq++ {
		if b := p.fifo[seq&p.fifoMask]; b != noBlock {
			if blk := &p.blocks[b]; blk.flags&inFIFO == 0 || blk.fifoSeq != uint32(seq) {
				panic("vllmsim test: a FIFO entry that is not its block's place")
			}
			q = append(q, b)
		}
	}
	return q
}

func TestTwoRequestsShareThreeFullBlocks(t *testing.T) {
	r := newTestReplica(t, nil)
	shared := tokens(1000, 48) // 3 blocks of 16
	a := promptRequest(concat(shared, tokens(1, 12)), 1)
	require.NoError(t, r.Submit(a, 0))
	aTable := append([]int32(nil), a.table...)
	drain(t, r)
	assert.Zero(t, a.CachedTokens)
	checkPool(t, r)

	b := promptRequest(concat(shared, tokens(5000, 30)), 2)
	start := r.Now()
	require.NoError(t, r.Submit(b, start))
	checkPool(t, r)
	assert.Equal(t, 48, b.CachedTokens)
	assert.Equal(t, aTable[:3], b.table[:3], "the hit reuses a's blocks")
	assert.Equal(t, 5, len(b.table), "78 tokens: 3 cached blocks + 2 new")
	end, ok := r.NextEventTime()
	require.True(t, ok)
	assert.Equal(t, us(5750+17.25*30), end-start, "only the 30 uncached tokens are prefilled")
	drain(t, r)
	m := r.Metrics()
	assert.Equal(t, int64(60+78), m.PrefixQueries)
	assert.Equal(t, int64(48), m.PrefixHits)
	assert.Equal(t, int64(60+78-48), m.PrefillTokens, "hits + computed prefill = queried tokens")
	checkPool(t, r)
}

func TestPartialBlocksAreNeverCached(t *testing.T) {
	r := newTestReplica(t, nil)
	prompt := tokens(7, 40) // 2 full blocks and 8 tokens
	first := promptRequest(prompt, 1)
	require.NoError(t, r.Submit(first, 0))
	drain(t, r)
	assert.Equal(t, 2, r.Metrics().KVBlocksCached, "the partial third block has no hash")

	again := promptRequest(prompt, 1)
	require.NoError(t, r.Submit(again, r.Now()))
	assert.Equal(t, 32, again.CachedTokens)
	drain(t, r)

	// A prompt of exactly 3 blocks, fully cached, still computes its last
	// token, so its whole last block is recomputed.
	exact := tokens(9000, 48)
	require.NoError(t, r.Submit(promptRequest(exact, 1), r.Now()))
	drain(t, r)
	repeat := promptRequest(exact, 1)
	require.NoError(t, r.Submit(repeat, r.Now()))
	assert.Equal(t, 32, repeat.CachedTokens)
	drain(t, r)
	checkPool(t, r)
}

func TestGeneratedBlocksAreCachedForTheNextTurn(t *testing.T) {
	r := newTestReplica(t, nil)
	prompt := tokens(1, 20)
	turn1 := promptRequest(prompt, 30)
	turn1.OutputSeed = 77
	require.NoError(t, r.Submit(turn1, 0))
	drain(t, r)
	// The next turn re-sends the prompt and the 30 generated tokens, then a
	// new message: blocks 0..2 (48 of the 50 tokens) are cached.
	history := append([]uint32(nil), prompt...)
	for i := range 30 {
		history = append(history, OutputToken(77, i))
	}
	turn2 := promptRequest(append(history, tokens(500, 10)...), 5)
	require.NoError(t, r.Submit(turn2, r.Now()))
	assert.Equal(t, 48, turn2.CachedTokens)
	drain(t, r)

	other := promptRequest(append(append([]uint32(nil), prompt...), tokens(900, 40)...), 1)
	require.NoError(t, r.Submit(other, r.Now()))
	assert.Equal(t, 16, other.CachedTokens, "another response diverges in block 1")
	drain(t, r)
}

func TestEvictionIsLRUOverFreedBlocks(t *testing.T) {
	// 10 blocks. a and b (40 tokens: 2 hashed blocks and 1 partial) run and
	// finish in turn; their hashed blocks join the free queue's tail, a's
	// longest-chain block first, behind the never-used blocks and the
	// partial blocks.
	r := newTestReplica(t, func(c *ReplicaConfig) { c.KVCapacityTokens = 160; c.MaxModelLen = 160 })
	pa, pb := tokens(100, 40), tokens(200, 40)
	require.NoError(t, r.Submit(promptRequest(pa, 1), 0))
	drain(t, r)
	require.NoError(t, r.Submit(promptRequest(pb, 1), r.Now()))
	drain(t, r)
	probe := func(p []uint32) int { return r.CachedPrefixTokens(promptRequest(p, 1)) }
	require.Equal(t, 32, probe(pa))
	require.Equal(t, 32, probe(pb))

	// 7 fresh blocks: the 6 never-used or partial ones, then a's block 1.
	d := promptRequest(tokens(300, 7*16-1), 1)
	require.NoError(t, r.Submit(d, r.Now()))
	checkPool(t, r)
	assert.Equal(t, 16, probe(pa), "a's second block went first")
	assert.Equal(t, 32, probe(pb))
	drain(t, r)

	// d's blocks are now the most recently freed: the next allocation takes
	// a's first block, then b's blocks, before any of d's.
	e := promptRequest(tokens(400, 4*16-1), 1)
	require.NoError(t, r.Submit(e, r.Now()))
	checkPool(t, r)
	assert.Equal(t, 0, probe(pa))
	assert.Equal(t, 0, probe(pb), "b's blocks, freed before d's, are evicted next, tail first")
	assert.Equal(t, 6*16, probe(tokens(300, 7*16-1)), "d's hashed blocks survive")
	drain(t, r)
	checkPool(t, r)
}

func TestReferencedBlocksAreNeverEvicted(t *testing.T) {
	// 10 blocks; a holds 3 (2 hashed) for a long generation.
	r := newTestReplica(t, func(c *ReplicaConfig) { c.KVCapacityTokens = 160; c.MaxModelLen = 160 })
	pa := tokens(100, 40)
	a := promptRequest(pa, 100)
	require.NoError(t, r.Submit(a, 0))
	// A request sharing a's prompt while a runs takes a's in-use blocks.
	twin := promptRequest(pa, 1)
	require.NoError(t, r.Submit(twin, 0))
	next, _ := r.NextEventTime()
	r.Advance(next)
	assert.Equal(t, 32, twin.CachedTokens)
	checkPool(t, r)
	// A request needing every block cannot start while a runs, and a's
	// blocks stay cached.
	big := promptRequest(tokens(300, 150), 1)
	require.NoError(t, r.Submit(big, r.Now()))
	for range 20 {
		next, _ := r.NextEventTime()
		r.Advance(next)
		checkPool(t, r)
		assert.Equal(t, 32, r.CachedPrefixTokens(promptRequest(pa, 1)))
		assert.Equal(t, 1, r.Metrics().Waiting)
	}
	drain(t, r)
	assert.True(t, big.Done())
	checkPool(t, r)
}

func TestTheAdapterIsPartOfTheHash(t *testing.T) {
	r := newTestReplica(t, func(c *ReplicaConfig) { c.MaxLoRAs = 2 })
	prompt := tokens(1, 64)
	for _, adapter := range []string{"", "sql", "tweet"} {
		q := promptRequest(prompt, 1)
		q.Adapter = adapter
		require.NoError(t, r.Submit(q, r.Now()))
		drain(t, r)
		assert.Zero(t, q.CachedTokens, "adapter %q misses the others' blocks", adapter)
	}
	q := promptRequest(prompt, 1)
	q.Adapter = "sql"
	require.NoError(t, r.Submit(q, r.Now()))
	assert.Equal(t, 48, q.CachedTokens)
	drain(t, r)
}

func TestPreemptedRequestsHitTheirOwnBlocks(t *testing.T) {
	// 30 blocks; four requests of 100-token prompts (7 blocks each) grow
	// until the KV runs out at their 113th token; the last one is preempted
	// and its 7 cached blocks join the free queue tail first; the three
	// others take four of them (longest chains first) growing to 140 tokens
	// and finish, and it resumes on the three it still finds. Prompts
	// without token ids (tagged blocks) behave the same.
	for _, withIDs := range []bool{true, false} {
		r := newTestReplica(t, func(c *ReplicaConfig) { c.KVCapacityTokens = 480; c.MaxModelLen = 480 })
		reqs := make([]*Request, 4)
		for i := range reqs {
			reqs[i] = promptRequest(tokens(uint32(1000*i), 100), []int{40, 40, 40, 60}[i])
			reqs[i].OutputSeed = uint64(i)
			if !withIDs {
				reqs[i].Prompt = nil
			}
			require.NoError(t, r.Submit(reqs[i], 0))
		}
		for range 1_000_000 {
			next, ok := r.NextEventTime()
			if !ok {
				break
			}
			r.Advance(next)
			checkPool(t, r)
		}
		m := r.Metrics()
		require.Equal(t, int64(1), m.Preemptions)
		assert.Equal(t, 1, reqs[3].Preemptions)
		assert.Equal(t, int64(113), m.PreemptedPrefixQueries, "100 prompt + 13 generated tokens")
		assert.Equal(t, int64(48), m.PreemptedPrefixHits, "a resumed request finds part of its own KV (token ids: %v)", withIDs)
		assert.Equal(t, int64(400), m.PrefixQueries, "first admissions only")
		assert.Equal(t, int64(4), m.Completed)
	}
}

func TestCachingOffNeverHits(t *testing.T) {
	r := newTestReplica(t, func(c *ReplicaConfig) { c.EnablePrefixCaching = false })
	prompt := tokens(1, 100)
	for range 2 {
		q := promptRequest(prompt, 3)
		require.NoError(t, r.Submit(q, r.Now()))
		drain(t, r)
		assert.Zero(t, q.CachedTokens)
	}
	m := r.Metrics()
	assert.Zero(t, m.PrefixQueries)
	assert.Zero(t, m.KVBlocksCached)
	assert.False(t, m.PrefixCaching)
}

func TestPromptLengthMustMatchTheTokenIDs(t *testing.T) {
	r := newTestReplica(t, nil)
	err := r.Submit(&Request{PromptTokens: 5, Prompt: tokens(1, 4), OutputTokens: 1}, 0)
	assert.ErrorIs(t, err, ErrInvalidRequest)
}

// TestPrefixCacheProperties drives replicas with random workloads drawn
// from a small pool of shared prefixes (and some prompts without token
// ids), under KV pressure, and checks at
// every step: cached tokens within the prompt, hits plus prefilled tokens
// equal to the queried tokens while nothing was preempted, and blocks in use
// within the capacity (with every pool invariant).
func TestPrefixCacheProperties(t *testing.T) {
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 99))
		pressure := seed%2 == 0 // small KV: preemptions and evictions
		r := newTestReplica(t, func(c *ReplicaConfig) {
			c.KVCapacityTokens = 16 * (40 + rng.IntN(200))
			if !pressure {
				c.KVCapacityTokens = 16 * 4000
			}
			c.MaxModelLen = c.KVCapacityTokens
			c.BlockSize = 16
			c.MaxLoRAs = 2
			c.MaxNumBatchedTokens = 64 + rng.IntN(512)
		})
		prefixes := make([][]uint32, 4)
		for i := range prefixes {
			prefixes[i] = tokens(uint32(i)<<20, 16+rng.IntN(200))
		}
		var reqs []*Request
		now := time.Duration(0)
		for i := range 150 {
			p := append([]uint32(nil), prefixes[rng.IntN(len(prefixes))]...)
			p = append(p, tokens(uint32(i+1)<<24, rng.IntN(60))...)
			q := promptRequest(p, 1+rng.IntN(40))
			if q.PromptTokens+q.OutputTokens > r.cfg.MaxModelLen {
				continue
			}
			q.Adapter = []string{"", "", "x", "y", "z"}[rng.IntN(5)]
			q.OutputSeed = uint64(rng.IntN(3))
			if rng.IntN(8) == 0 {
				q.Prompt = nil // tagged blocks among hashed ones
			}
			now += time.Duration(rng.ExpFloat64() * float64(20*time.Millisecond))
			require.NoError(t, r.Submit(q, now))
			reqs = append(reqs, q)
			for {
				next, ok := r.NextEventTime()
				if !ok || next > now {
					break
				}
				r.Advance(next)
				checkPool(t, r)
			}
		}
		drain(t, r)
		checkPool(t, r)
		m := r.Metrics()
		var prompts, cached int64
		for _, q := range reqs {
			require.True(t, q.Done())
			require.LessOrEqual(t, q.CachedTokens, q.PromptTokens-1)
			require.Zero(t, q.CachedTokens%16)
			prompts += int64(q.PromptTokens)
			cached += int64(q.CachedTokens)
		}
		require.Equal(t, prompts, m.PrefixQueries, "seed %d", seed)
		require.Equal(t, cached, m.PrefixHits, "seed %d", seed)
		require.LessOrEqual(t, m.PrefixHits, m.PrefixQueries)
		if !pressure {
			// Without preemption every queried token is either a hit or
			// prefilled (and priced) exactly once.
			require.Zero(t, m.Preemptions)
			require.Equal(t, m.PrefixQueries-m.PrefixHits, m.PrefillTokens, "seed %d: hits + prefill = queries", seed)
		}
		require.Positive(t, m.PrefixHits, "seed %d: the shared prefixes hit", seed)
	}
}

func TestHashIndexAgreesWithAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	h := newHashIndex(200)
	ref := map[uint64]int32{}
	// Blocks not in use sit in spare.
	var spare []int32
	for b := range int32(1000) {
		spare = append(spare, b)
	}
	take := func() int32 {
		b := spare[len(spare)-1]
		spare = spare[:len(spare)-1]
		return b
	}
	// Few distinct homes (the index takes them from the caller) stress the
	// probe runs and the backward shift.
	keys := make([]uint64, 300)
	homes := map[uint64]uint32{}
	for i := range keys {
		keys[i] = rng.Uint64() | 1
		homes[keys[i]] = uint32(rng.IntN(64)) & h.mask
	}
	for range 100_000 {
		k := keys[rng.IntN(len(keys))]
		home := homes[k]
		cur, present := ref[k]
		switch op := rng.IntN(4); {
		case op == 0 && present:
			assert.Equal(t, cur, h.removeIf(k, home, cur, noBlock))
			delete(ref, k)
			spare = append(spare, cur)
		case op == 1 && present:
			next := take()
			assert.Equal(t, cur, h.removeIf(k, home, cur, next), "moves to the next block of the hash")
			ref[k] = next
			spare = append(spare, cur)
		case op == 2 && present:
			other := spare[0]
			assert.Equal(t, cur, h.removeIf(k, home, other, noBlock), "another block: nothing changes")
		case len(ref) < 200:
			b := take()
			got := h.getOrSet(k, home, b)
			if present {
				assert.Equal(t, cur, got)
				spare = append(spare, b)
			} else {
				assert.Equal(t, b, got)
				ref[k] = got
			}
		}
		for _, k := range keys[:20] {
			want, ok := ref[k]
			if !ok {
				want = noBlock
			}
			require.Equal(t, want, h.get(k, homes[k]))
		}
	}
	for k, b := range ref {
		require.Equal(t, b, h.get(k, homes[k]))
	}
}

// TestFreeQueueIsVLLMsQueue drives the pool with random allocations,
// hits and frees, and checks its free queue, block by block, against a
// plain list kept as vLLM's FreeKVCacheBlockQueue keeps it: freed blocks
// with a hash appended, without one prepended, hits taken out anywhere,
// allocations taken from the head.
func TestFreeQueueIsVLLMsQueue(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 64
	p := newBlockPool(n, true)
	list := []int32{}
	for b := range int32(n) {
		list = append(list, b)
	}
	remove := func(b int32) {
		for i, c := range list {
			if c == b {
				list = append(list[:i], list[i+1:]...)
				return
			}
		}
		t.Fatalf("block %d not in the reference queue", b)
	}
	var tables [][]int32
	nextHash := uint64(1)
	compactions, lastTail := 0, p.fifoTail
	for step := range 20_000 {
		// Allocations are rarer than hits and frees, so that holes pile up
		// in the FIFO and it gets compacted.
		switch op := rng.IntN(6); {
		case op == 0 && p.free > 0:
			k := 1 + rng.IntN(min(p.free, 12))
			table := p.allocate(k, nil)
			require.Equal(t, list[:k], table, "step %d: allocation takes the head", step)
			list = list[k:]
			// Some full blocks get a hash (and are cached).
			for _, b := range table[:rng.IntN(k+1)] {
				nextHash += 2
				p.cache(b, nextHash, uint32(nextHash>>32)&p.byHash.mask)
			}
			tables = append(tables, table)
		case op <= 3 && len(tables) > 0:
			i := rng.IntN(len(tables))
			table := tables[i]
			tables = append(tables[:i], tables[i+1:]...)
			p.release(table)
			var front []int32
			for j := len(table) - 1; j >= 0; j-- {
				if b := table[j]; p.blocks[b].ref == 0 && p.blocks[b].hash != 0 {
					list = append(list, b)
				}
			}
			for _, b := range table {
				if p.blocks[b].ref == 0 && p.blocks[b].hash == 0 {
					front = append([]int32{b}, front...)
				}
			}
			list = append(front, list...)
		case op >= 4:
			// A hit on free cached blocks (and on some in use).
			var hit []int32
			for b := range int32(n) {
				if p.blocks[b].hash != 0 && rng.IntN(3) == 0 {
					hit = append(hit, b)
				}
			}
			for _, b := range hit {
				if p.blocks[b].ref == 0 {
					remove(b)
				}
			}
			p.touch(hit)
			tables = append(tables, hit)
		}
		if p.fifoTail < lastTail {
			compactions++
		}
		lastTail = p.fifoTail
		require.Equal(t, len(list), p.free, "step %d", step)
		require.Equal(t, append([]int32{}, list...), append([]int32{}, freeQueue(&p)...), "step %d", step)
	}
	require.Positive(t, compactions, "the FIFO filled with holes and was compacted")
}
