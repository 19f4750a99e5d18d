package vllmsim

import (
	"math"
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
// requests: the free queue holds exactly the records with no reference and
// a hash, the references are the running requests' block tables, every
// block is in use, free or counted once, the cache maps exactly the hashed
// records, and each chunk of records counts its live records and the
// request taking from it.
func checkPool(t *testing.T, r *Replica) {
	t.Helper()
	p := &r.pool
	queued := make([]bool, len(p.blocks))
	free, hashed := p.anonymous, 0
	for _, e := range freeQueue(p) {
		if e < noBlock {
			run := p.runs[-2-e]
			require.Positive(t, run.left)
			require.NotZero(t, run.salt)
			free += int(run.left)
			hashed += int(run.left)
			continue
		}
		require.Zero(t, p.blocks[e].refs(), "block %d in the free queue", e)
		require.NotZero(t, p.hashOf(e), "block %d in the FIFO has a hash", e)
		require.False(t, queued[e], "block %d twice in the free queue", e)
		queued[e] = true
		free++
	}
	require.Equal(t, p.free, free)
	refs := make([]int32, len(p.blocks))
	inUse := 0
	use := make([]int32, len(p.chunkUse))
	for _, s := range r.running {
		if s.records.end != 0 {
			require.Less(t, s.records.next, s.records.end+1)
			use[(s.records.end-1)/chunkRecords] += 1 + s.records.end - s.records.next
		}
		for _, b := range s.table {
			if s.salt != 0 {
				require.Equal(t, noBlock, b, "a request without token ids holds no record")
				inUse++
				continue
			}
			if refs[b] == 0 {
				inUse++
			}
			refs[b]++
		}
		if s.salt != 0 {
			// Counted as cached when full.
			hashed += s.cachedBlocks
		}
		require.Equal(t, r.blocksFor(int(s.computed+s.sched)), len(s.table), "a running request holds the blocks of its computed and scheduled tokens")
		require.Equal(t, len(s.table)*r.blockTokens, int(s.tableTokens))
	}
	require.Equal(t, r.totalBlocks, inUse+p.free, "every block is in use or free")
	for b := range p.blocks {
		blk := &p.blocks[b]
		require.Equal(t, refs[b], blk.refs(), "block %d", b)
		require.Equal(t, blk.refs() == 0 && blk.run != noRun, queued[b], "block %d", b)
		require.Equal(t, queued[b], blk.inFIFO(), "block %d: its state says it is in the FIFO", b)
		if !queued[b] && refs[b] == 0 {
			require.Zero(t, blk.state, "block %d: a dead record", b)
		}
		if blk.refs() != 0 || blk.run != noRun {
			use[b/chunkRecords]++
		}
		if blk.run != noRun {
			hashed++
			run := &p.hashRuns[blk.run]
			require.Equal(t, int32(b), run.blocks[blk.pos-run.start], "block %d in its run", b)
			require.LessOrEqual(t, blk.seq, p.cacheSeq, "block %d", b)
		}
	}
	require.Equal(t, p.hashed, hashed)
	checkHashRuns(t, p)
	// Every running request's chain is found as a search of every
	// record finds it: hash by hash, the block with it cached first.
	for _, s := range r.running {
		if s.salt == 0 {
			checkLookup(t, p, s.hashes)
		}
	}
	require.Equal(t, use, append([]int32{}, p.chunkUse...), "chunks count their live records and holders")
	freeChunk := make([]bool, len(p.chunkUse))
	for _, c := range p.freeChunks {
		require.False(t, freeChunk[c], "chunk %d twice free", c)
		freeChunk[c] = true
	}
	for c, n := range p.chunkUse {
		require.Equal(t, n == 0, freeChunk[c], "chunk %d is free when unused", c)
	}
}

// checkHashRuns verifies the hash runs: a run's live count is its blocks
// not evicted, a run without one is its running request's, and every run
// is reachable from the index by its first hash.
func checkHashRuns(t *testing.T, p *blockPool) {
	t.Helper()
	spare := map[int32]bool{}
	for _, id := range p.spareHashRuns {
		spare[id] = true
	}
	for id := range int32(len(p.hashRuns)) {
		if spare[id] {
			continue
		}
		run := &p.hashRuns[id]
		live := 0
		for k, b := range run.blocks {
			if b != noBlock {
				live++
				require.Equal(t, id, p.blocks[b].run)
				require.Equal(t, run.start+int32(k), p.blocks[b].pos)
			}
		}
		require.Equal(t, int32(live), run.live, "run %d", id)
		require.True(t, live > 0 || run.open, "run %d without blocks is a running request's", id)
		found := false
		for c := p.byHash.get(run.hashes[0], run.home, p.hashRuns); c != noRun; c = p.hashRuns[c].link {
			found = found || c == id
			require.Equal(t, run.hashes[0], p.hashRuns[c].hashes[0])
		}
		require.True(t, found, "run %d is reachable from the index", id)
	}
}

// checkLookup compares the pool's lookup of a chain with a search of all
// the records: block by block, the record with the hash that was cached
// first, until no record has it.
func checkLookup(t *testing.T, p *blockPool, hashes []uint64) {
	t.Helper()
	var want []int32
	for _, h := range hashes {
		best := noBlock
		for b := range p.blocks {
			if blk := &p.blocks[b]; p.hashOf(int32(b)) == h && (best == noBlock || blk.seq < p.blocks[best].seq) {
				best = int32(b)
			}
		}
		if best == noBlock {
			break
		}
		want = append(want, best)
	}
	var got []int32
	require.Equal(t, len(want), p.lookup(hashes, len(hashes), &got))
	require.Equal(t, want, got)
	require.Equal(t, len(want), p.lookup(hashes, len(hashes), nil))
}

// freeQueue lists the pool's FIFO from its head: its records and its runs
// that still hold blocks (after the anonymous blocks, which have no ids).
func freeQueue(p *blockPool) []int32 {
	var q []int32
	for seq := p.fifoHead; seq < p.fifoTail; seq++ {
		e := p.fifo[seq&p.fifoMask]
		switch {
		case e == noBlock:
		case e < noBlock:
			if p.runs[-2-e].left > 0 {
				q = append(q, e)
			}
		default:
			if blk := &p.blocks[e]; !blk.inFIFO() || blk.run == noRun || blk.fifoPlace() != seq&p.fifoMask {
				panic("vllmsim test: a FIFO entry that is not its block's place")
			}
			q = append(q, e)
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
			if rng.IntN(3) == 0 && len(p) >= 16 {
				// Whole blocks of a shared prefix: the last one is computed
				// again and cached twice under one hash.
				p = p[:min(len(p), len(prefixes[0]))/16*16]
			}
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
				for _, q := range reqs {
					if q.state == stateWaiting && q.salt == 0 {
						checkLookup(t, &r.pool, q.hashes) // what its admission will find
					}
				}
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
	// Few distinct homes (the index takes them from the caller) stress the
	// probe runs and the backward shift; two homes for 400 entries push
	// entries beyond maxDist of theirs.
	for _, tc := range []struct{ entries, homes, steps int }{{200, 64, 100_000}, {400, 2, 20_000}} {
		rng := rand.New(rand.NewPCG(3, uint64(tc.homes)))
		blocks := make([]hashRun, 1000)
		h := newHashIndex(tc.entries)
		ref := map[uint64]int32{}
		// Blocks not in use sit in spare.
		var spare []int32
		for b := range int32(len(blocks)) {
			spare = append(spare, b)
		}
		keys := make([]uint64, tc.entries*3/2)
		homes := map[uint64]uint32{}
		for i := range keys {
			keys[i] = rng.Uint64() | 1
			if i%7 == 6 {
				// Same fingerprint as another key: told apart by the
				// block's hash.
				keys[i] = keys[i-1] ^ 2
			}
			homes[keys[i]] = uint32(rng.IntN(tc.homes)) & h.mask
		}
		take := func(k uint64) int32 {
			b := spare[len(spare)-1]
			spare = spare[:len(spare)-1]
			blocks[b] = hashRun{hashes: []uint64{k}, home: homes[k]}
			return b
		}
		put := func(b int32) {
			blocks[b] = hashRun{}
			spare = append(spare, b)
		}
		maxDistSeen := uint32(0)
		for step := range tc.steps {
			k := keys[rng.IntN(len(keys))]
			home := homes[k]
			cur, present := ref[k]
			switch op := rng.IntN(4); {
			case op == 0 && present:
				assert.Equal(t, cur, h.removeIf(k, home, cur, noRun, blocks))
				delete(ref, k)
				put(cur)
			case op == 1 && present:
				next := take(k)
				assert.Equal(t, cur, h.removeIf(k, home, cur, next, blocks), "moves to the next block of the hash")
				ref[k] = next
				put(cur)
			case op == 2 && present:
				other := take(k) // a later block with the same hash
				assert.Equal(t, cur, h.removeIf(k, home, other, noRun, blocks), "another block: nothing changes")
				put(other)
			case len(ref) < tc.entries:
				b := take(k)
				got := h.getOrSet(k, home, b, blocks)
				if present {
					assert.Equal(t, cur, got)
					put(b)
				} else {
					assert.Equal(t, b, got)
					ref[k] = got
				}
			}
			if step%64 == 0 {
				for i, s := range h.slots {
					if s != 0 {
						maxDistSeen = max(maxDistSeen, (uint32(i)-blocks[slotRun(s)].home)&h.mask)
					}
				}
			}
			if tc.homes < 64 && step%8 != 0 {
				continue // long probe runs: check the lookups less often
			}
			for _, k := range keys[:20] {
				want, ok := ref[k]
				if !ok {
					want = noRun
				}
				require.Equal(t, want, h.get(k, homes[k], blocks))
			}
		}
		for k, b := range ref {
			require.Equal(t, b, h.get(k, homes[k], blocks))
		}
		if tc.homes == 2 {
			require.Greater(t, maxDistSeen, uint32(maxDist), "entries beyond maxDist of their home")
		}
	}
}

// TestFreeQueueIsVLLMsQueue drives the pool with random allocations,
// hits and frees, of tables of records and of tables that only count their
// blocks (requests without token ids), and checks its free queue, block by
// block, against a plain list kept as vLLM's FreeKVCacheBlockQueue keeps
// it: freed blocks with a hash appended, without one prepended, hits taken
// out anywhere, allocations taken from the head. Blocks without a hash
// cannot be told apart (the pool does not name them); every other block
// must be in its place, a record by its id, a counted request's block by
// its request.
func TestFreeQueueIsVLLMsQueue(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 64
	p := newBlockPool(n, true)
	// An entry of the reference queue: a record (block >= 0), block index
	// of the blocks a counted request freed into the pool's run run, or
	// a block without a hash.
	type entry struct {
		block, run, index int32
		salt              uint64 // the counted request's
		hash              uint64 // a record's
	}
	anon := entry{block: noBlock, run: noRun}
	list := []entry{}
	for range n {
		list = append(list, anon)
	}
	type counted struct {
		salt        uint64
		run         int32 // its latest run, noRun for none
		blocks, hit int   // blocks held (0: not running), leading ones hit
	}
	owners := make([]counted, 6)
	for i := range owners {
		owners[i] = counted{salt: uint64(2*i + 1), run: noRun}
	}
	// A table of records and the chunk its new blocks came from (nil for
	// a table of hits).
	type held struct {
		table []int32
		cur   *recordCursor
	}
	var tables []held
	nextHash := uint64(1)
	compactions, lastTail := 0, p.fifoTail
	maxRecords := 0
	homeOf := func(h uint64) uint32 { return uint32(h>>32) & p.byHash.mask }
	runHits, runEvictions := 0, 0
	take := func(k int) []entry {
		head := append([]entry(nil), list[:k]...)
		for _, e := range head {
			if e.run != noRun {
				runEvictions++
			}
		}
		list = list[k:]
		return head
	}
	for step := range 40_000 {
		// Allocations are rarer than hits and frees, so that holes pile up
		// in the FIFO and it gets compacted.
		switch op := rng.IntN(9); {
		case op == 0 && p.free > 0:
			k := 1 + rng.IntN(min(p.free, 12))
			head := take(k)
			cur := &recordCursor{}
			table := p.allocate(k, nil, cur)
			for _, e := range head {
				if e.block >= 0 {
					require.Equal(t, noRun, p.byHash.get(e.hash, homeOf(e.hash), p.hashRuns), "step %d: allocation evicts the head", step)
				}
			}
			for _, b := range table {
				require.Zero(t, p.hashOf(b), "step %d: a new block has no hash", step)
				require.Equal(t, int32(1), p.blocks[b].refs(), "step %d: a new block is in use", step)
			}
			// Some full blocks get a hash (and are cached).
			for _, b := range table[:rng.IntN(k+1)] {
				nextHash += 2
				// Each its own chain, of a request that is gone.
				run := noRun
				p.cacheBlocks([]int32{b}, []uint64{nextHash}, 0, &run, 1)
				p.closeHashRun(&run)
			}
			tables = append(tables, held{table, cur})
		case op == 1 && p.free > 0:
			// A counted request starts, resuming on the blocks it finds.
			o := &owners[rng.IntN(len(owners))]
			if o.blocks > 0 {
				break
			}
			maxHit := rng.IntN(10)
			want := 0
			for _, e := range list {
				if e.run == o.run && e.salt == o.salt && e.index < int32(maxHit) {
					want++
				}
			}
			hit := p.runHits(o.run, o.salt, maxHit)
			require.Equal(t, want, hit, "step %d: a resumed request finds its leading blocks", step)
			kept := list[:0]
			for _, e := range list {
				if e.run == o.run && e.salt == o.salt && e.index < int32(hit) {
					continue
				}
				kept = append(kept, e)
			}
			list = kept
			if o.run != noRun {
				p.takeRun(o.run, hit)
			}
			o.run, o.hit = noRun, hit
			runHits += hit
			k := min(p.free, rng.IntN(8))
			take(k)
			for _, b := range p.allocate(k, nil, nil) {
				require.Equal(t, noBlock, b)
			}
			o.blocks = hit + k
			if o.blocks == 0 {
				break
			}
		case op == 2:
			o := &owners[rng.IntN(len(owners))]
			if o.blocks == 0 {
				break
			}
			cached := o.hit + rng.IntN(o.blocks-o.hit+1)
			p.hashed += cached - o.hit
			o.run = p.releaseRun(o.salt, o.blocks, cached)
			for i := cached - 1; i >= 0; i-- {
				list = append(list, entry{block: noBlock, run: o.run, index: int32(i), salt: o.salt})
			}
			for range o.blocks - cached {
				list = append([]entry{anon}, list...)
			}
			o.blocks = 0
		case op <= 5 && len(tables) > 0:
			i := rng.IntN(len(tables))
			table := tables[i].table
			p.release(table)
			if tables[i].cur != nil {
				p.dropCursor(tables[i].cur)
			}
			tables = append(tables[:i], tables[i+1:]...)
			var front []entry
			for j := len(table) - 1; j >= 0; j-- {
				if b := table[j]; p.blocks[b].refs() == 0 {
					if p.hashOf(b) != 0 {
						list = append(list, entry{block: b, run: noRun, hash: p.hashOf(b)})
					} else {
						front = append(front, anon)
					}
				}
			}
			list = append(front, list...)
		case op >= 6:
			// A hit on free cached blocks (and on some in use).
			var hit []int32
			for b := range int32(len(p.blocks)) {
				if p.hashOf(b) != 0 && rng.IntN(3) == 0 {
					hit = append(hit, b)
				}
			}
			for _, b := range hit {
				if p.blocks[b].refs() == 0 {
					for i, e := range list {
						if e.block == b {
							list = append(list[:i], list[i+1:]...)
							break
						}
					}
				}
			}
			p.touch(hit)
			tables = append(tables, held{table: hit})
		}
		if p.fifoTail < lastTail {
			compactions++
		}
		lastTail = p.fifoTail
		require.Equal(t, len(list), p.free, "step %d", step)
		got := []entry{}
		for range p.anonymous {
			got = append(got, anon)
		}
		for _, e := range freeQueue(&p) {
			if e >= 0 {
				got = append(got, entry{block: e, run: noRun, hash: p.hashOf(e)})
				continue
			}
			for range p.runs[-2-e].left {
				got = append(got, entry{block: noBlock, run: -2 - e, salt: p.runs[-2-e].salt})
			}
		}
		want := make([]entry, len(list))
		for i, e := range list {
			want[i] = entry{block: e.block, run: e.run, salt: e.salt, hash: e.hash}
		}
		require.Equal(t, want, got, "step %d", step)
		hashed := 0
		for _, b := range p.blocks {
			if b.run != noRun {
				hashed++
			}
		}
		for _, e := range list {
			if e.run != noRun {
				hashed++
			}
		}
		for _, o := range owners {
			if o.blocks > 0 {
				hashed += o.hit
			}
		}
		require.Equal(t, hashed, p.hashed, "step %d", step)
		// Records: a chunk counts its live records and its holder.
		use := make([]int32, len(p.chunkUse))
		for b, blk := range p.blocks {
			if blk.refs() != 0 || blk.run != noRun {
				use[b/chunkRecords]++
			}
		}
		for _, h := range tables {
			if h.cur != nil && h.cur.end != 0 {
				use[(h.cur.end-1)/chunkRecords] += 1 + h.cur.end - h.cur.next
			}
		}
		require.Equal(t, use, append([]int32{}, p.chunkUse...), "step %d", step)
		maxRecords = max(maxRecords, len(p.blocks))
	}
	t.Logf("at most %d records for %d blocks", maxRecords, n)
	require.Positive(t, compactions, "the FIFO filled with holes and was compacted")
	require.Positive(t, runHits, "counted requests resumed on their blocks")
	require.Positive(t, runEvictions, "counted requests' blocks were evicted")
	t.Logf("%d compactions, %d blocks hit and %d evicted from runs", compactions, runHits, runEvictions)
}

// TestPromptHashesAreTheHashesOfThePrompt runs a conversation of turns,
// each resending the history and the response, with a PromptHashes on two
// replicas of different block sizes and adapters, and checks that every
// turn gets the block hashes a request without it computes, and the same
// cached tokens.
func TestPromptHashesAreTheHashesOfThePrompt(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	small := newTestReplica(t, func(c *ReplicaConfig) { c.MaxLoRAs = 2 })
	big := newTestReplica(t, func(c *ReplicaConfig) { c.BlockSize, c.MaxLoRAs = 32, 2 })
	var memo PromptHashes
	var history []uint32
	for turn := range 12 {
		history = append(history, tokens(uint32(1000*turn), 1+rng.IntN(70))...)
		r := small
		if turn%4 == 3 {
			r = big // another block size: the memo starts again
		}
		adapter := ""
		if turn >= 8 {
			adapter = "a" // another adapter: the memo starts again
		}
		with := &Request{PromptTokens: len(history), Prompt: history, OutputTokens: 1 + rng.IntN(60), OutputSeed: uint64(turn), Adapter: adapter, Hashes: &memo}
		if turn%2 == 0 {
			// The oracle's look before Submit uses the memo too.
			r.CachedPrefixTokens(with)
		}
		require.NoError(t, r.Submit(with, r.Now()))
		want := &Request{PromptTokens: len(history), Prompt: history, OutputTokens: with.OutputTokens, Adapter: adapter}
		r.prepareHashes(want)
		require.Equal(t, want.hashes, with.hashes, "turn %d", turn)
		require.Equal(t, r.blockTokens, memo.blockSize)
		drain(t, r)
		require.True(t, with.Done())
		// The memo now holds the full blocks of prompt and response, but
		// for a block the last generated token fills (never hashed: no
		// token follows it).
		for i := range with.OutputTokens {
			history = append(history, OutputToken(with.OutputSeed, i))
		}
		again := &Request{PromptTokens: len(history), Prompt: history, OutputTokens: 1, Adapter: adapter}
		r.prepareHashes(again)
		require.GreaterOrEqual(t, len(memo.hashes), len(again.hashes)-1, "turn %d", turn)
		require.Equal(t, again.hashes[:len(memo.hashes)], memo.hashes, "turn %d: prompt and response", turn)
		probe := &Request{PromptTokens: len(history), Prompt: history, OutputTokens: 1, Adapter: adapter}
		probeMemo := memo
		probeMemo.hashes = append([]uint64(nil), memo.hashes...)
		probeWith := &Request{PromptTokens: len(history), Prompt: history, OutputTokens: 1, Adapter: adapter, Hashes: &probeMemo}
		require.Equal(t, r.CachedPrefixTokens(probe), r.CachedPrefixTokens(probeWith), "turn %d", turn)
		require.Positive(t, r.CachedPrefixTokens(probe), "turn %d: the history is cached", turn)
	}
}

// TestConcurrentTurnsKeepTheirHashes: a request shares its PromptHashes'
// array and appends its generated blocks' hashes there, so a second
// request given the same PromptHashes while the first runs (its prompt
// extends the first's) must not write into that array, nor the first
// request's completion into the second's. Each request's hashes stay the
// hashes of its own tokens, step by step.
func TestConcurrentTurnsKeepTheirHashes(t *testing.T) {
	// a longer than b: b joins a's array; b longer: a completes into the
	// PromptHashes while b holds its array.
	for _, outputs := range [][2]int{{150, 70}, {60, 100}} {
		r := newTestReplica(t, nil)
		var memo PromptHashes
		first := tokens(100, 40)
		second := concat(first, tokens(5000, 37))
		a := &Request{PromptTokens: len(first), Prompt: first, OutputTokens: outputs[0], OutputSeed: 1, Hashes: &memo}
		b := &Request{PromptTokens: len(second), Prompt: second, OutputTokens: outputs[1], OutputSeed: 2, Hashes: &memo}
		require.NoError(t, r.Submit(a, r.Now()))
		require.NoError(t, r.Submit(b, r.Now()))
		// own is the hash list of req's prompt and generated tokens so far.
		own := func(req *Request) []uint64 {
			all := append([]uint32(nil), req.Prompt...)
			for i := range req.Generated {
				all = append(all, OutputToken(req.OutputSeed, i))
			}
			ref := &Request{PromptTokens: len(all), Prompt: all, OutputTokens: 1}
			r.prepareHashes(ref)
			return ref.hashes
		}
		for steps := 0; !a.Done() || !b.Done(); steps++ {
			require.Less(t, steps, 10_000)
			for _, q := range []*Request{a, b} {
				if !q.Done() {
					want := own(q)
					require.GreaterOrEqual(t, len(want), len(q.hashes))
					require.Equal(t, want[:len(q.hashes)], q.hashes, "outputs %v: request %d after %d steps", outputs, q.OutputSeed, steps)
				}
			}
			next, ok := r.NextEventTime()
			require.True(t, ok)
			r.Advance(next)
		}
	}
}

// TestAbortedTurnKeepsItsCachedHashes: the block runs view their
// requests' hash lists, so a turn aborted after hashing generated blocks
// its PromptHashes never learned must keep those hashes when the next
// turn (another continuation of the history) hashes its own blocks in
// the same places: the aborted turn's blocks stay findable by its tokens.
func TestAbortedTurnKeepsItsCachedHashes(t *testing.T) {
	r := newTestReplica(t, nil)
	var memo PromptHashes
	history := tokens(100, 40)
	aborted := &Request{PromptTokens: len(history), Prompt: history, OutputTokens: 100, OutputSeed: 1, Hashes: &memo}
	require.NoError(t, r.Submit(aborted, r.Now()))
	for aborted.Generated < 60 {
		next, ok := r.NextEventTime()
		require.True(t, ok)
		r.Advance(next)
	}
	generated := aborted.Generated
	ok, err := r.Abort(aborted, r.Now())
	require.True(t, ok)
	require.NoError(t, err)
	// Fewer blocks than the aborted turn had room for: the same array would do.
	next := &Request{PromptTokens: 70, Prompt: concat(history, tokens(9000, 30)), OutputTokens: 20, OutputSeed: 2, Hashes: &memo}
	require.NoError(t, r.Submit(next, r.Now()))
	drain(t, r)
	require.Equal(t, 32, next.CachedTokens, "the history's full blocks")
	checkPool(t, r)
	resent := history
	for i := range generated {
		resent = append(resent, OutputToken(1, i))
	}
	resent = resent[:len(resent):len(resent)]
	want := (len(resent) - 1) / r.blockTokens * r.blockTokens
	assert.Equal(t, want, r.CachedPrefixTokens(promptRequest(resent, 1)), "the aborted turn's blocks, found by its tokens")
	assert.Equal(t, 64, r.CachedPrefixTokens(promptRequest(concat(next.Prompt, tokens(50, 5)), 1)), "the next turn's")
}

// TestPromptHashesServeAsWithout: a multi-turn chat load served with a
// PromptHashes per conversation is served exactly as without. Three
// replicas, two block sizes, under KV pressure (preemptions); each turn
// resends its conversation's history and the last response; the oracle's
// CachedPrefixTokens probes come before most submits (and some probed
// turns are never submitted); some turns are hedged on a second replica,
// the loser aborted when the winner completes; some are cancelled while
// they run, aborted before or after the next turn is sent, which drops
// the cancelled response. So turns borrow and hand on their
// conversation's hash arrays, other turns and probes of other block sizes
// write to the same PromptHashes, and the block runs view the arrays: a
// write over a hash that a request or a run still reads shows in a
// lookup. The outcomes, the probes' answers and
// the replicas' metrics must be those of requests that hash their own
// prompts.
func TestPromptHashesServeAsWithout(t *testing.T) {
	type outcome struct {
		first, completed               time.Duration
		cached, preemptions, generated int
	}
	inFlight := func(q *Request) bool { return q != nil && (q.state == stateWaiting || q.state == stateRunning) }
	serve := func(withHashes bool) (outcomes []outcome, probes []int, metrics []Metrics, shared int) {
		fleet := make([]*Replica, 3)
		for i := range fleet {
			cfg := DefaultReplicaConfig(Llama2_7B)
			cfg.BlockSize = []int{16, 32, 16}[i]
			cfg.KVCapacityTokens = 16 * 300
			cfg.MaxModelLen = cfg.KVCapacityTokens
			cfg.MaxNumBatchedTokens = 512
			cfg.MaxLoRAs = 2
			r, err := NewReplica(cfg)
			require.NoError(t, err)
			fleet[i] = r
		}
		rng := rand.New(rand.NewPCG(11, 12))
		systems := [][]uint32{tokens(1<<30, 160), tokens(2<<30, 250), tokens(3<<30, 90)}
		type conversation struct {
			history []uint32
			hashes  PromptHashes
			turns   int
			adapter string
			// turn is the last turn submitted, hedge its copy on another
			// replica; nil once its response is in the history.
			turn, hedge *Request
		}
		convs := make([]conversation, 24)
		var reqs []*Request
		var on []*Replica // of each request
		var now time.Duration
		abort := func(qs ...*Request) {
			for _, q := range qs {
				if q != nil {
					_, err := on[q.ID].Abort(q, now)
					require.NoError(t, err)
				}
			}
		}
		for i := range 3000 {
			now += time.Duration(rng.ExpFloat64() * float64(10*time.Millisecond))
			for _, r := range fleet {
				for _, done := range r.Advance(now) {
					// A hedged turn's winner: the loser is aborted.
					for k := range convs {
						c := &convs[k]
						if c.hedge == nil || (done != c.turn && done != c.hedge) {
							continue
						}
						if done == c.turn {
							abort(c.hedge)
						} else {
							abort(c.turn)
						}
					}
				}
			}
			c := &convs[rng.IntN(len(convs))]
			var cancelled []*Request
			if inFlight(c.turn) || inFlight(c.hedge) {
				if rng.IntN(20) != 0 {
					continue // the user waits for the response
				}
				// The user cancels: the next turn goes without the
				// response, and the cancelled one is aborted before it is
				// sent or, while it still runs, after.
				cancelled = []*Request{c.turn, c.hedge}
				c.turn, c.hedge = nil, nil
				if rng.IntN(2) == 0 {
					abort(cancelled...)
					cancelled = nil
				}
			}
			if c.turn != nil {
				// The response, as the winner generated it.
				for k := range c.turn.OutputTokens {
					c.history = append(c.history, OutputToken(c.turn.OutputSeed, k))
				}
				c.turn, c.hedge = nil, nil
			}
			message := tokens(uint32(i)<<12, 10+rng.IntN(150))
			output := 1 + rng.IntN(150)
			if c.turns == 0 || c.turns == 8 || len(c.history)+len(message)+output > fleet[0].cfg.MaxModelLen {
				// A new conversation, in the old one's buffers.
				abort(cancelled...)
				cancelled = nil
				c.history = append(c.history[:0], systems[rng.IntN(len(systems))]...)
				c.hashes, c.turns = PromptHashes{}, 0
				c.adapter = []string{"", "", "a", "b"}[rng.IntN(4)]
			}
			c.history = append(c.history, message...)
			c.turns++
			q := &Request{ID: uint64(len(reqs)), PromptTokens: len(c.history), Prompt: c.history, OutputTokens: output, OutputSeed: uint64(i), Adapter: c.adapter}
			if withHashes {
				q.Hashes = &c.hashes
			}
			best, bestScore := rng.IntN(len(fleet)), -1<<62
			if rng.IntN(4) != 0 {
				for j, r := range fleet {
					hit := r.CachedPrefixTokens(q)
					probes = append(probes, hit)
					l := r.Load()
					if score := hit - l.PendingPrefillTokens - 50*l.Waiting; score > bestScore {
						best, bestScore = j, score
					}
				}
				if rng.IntN(10) == 0 {
					abort(cancelled...)
					continue // shed: the next turn's prompt extends this one
				}
			}
			require.NoError(t, fleet[best].Submit(q, now))
			abort(cancelled...)
			if q.lender != nil {
				shared++
			}
			reqs, on = append(reqs, q), append(on, fleet[best])
			c.turn = q
			if rng.IntN(6) == 0 {
				h := &Request{ID: uint64(len(reqs)), PromptTokens: q.PromptTokens, Prompt: q.Prompt, OutputTokens: q.OutputTokens, OutputSeed: q.OutputSeed, Adapter: q.Adapter, Hashes: q.Hashes}
				other := fleet[(best+1+rng.IntN(len(fleet)-1))%len(fleet)]
				require.NoError(t, other.Submit(h, now))
				reqs, on = append(reqs, h), append(on, other)
				c.hedge = h
			}
		}
		for _, r := range fleet {
			drain(t, r)
			if withHashes {
				checkPool(t, r)
			}
			metrics = append(metrics, r.Metrics())
		}
		for _, q := range reqs {
			outcomes = append(outcomes, outcome{q.FirstTokenAt, q.CompletedAt, q.CachedTokens, q.Preemptions, q.Generated})
		}
		return outcomes, probes, metrics, shared
	}
	with, probesWith, mWith, shared := serve(true)
	without, probesWithout, mWithout, _ := serve(false)
	var preemptions, aborted, hits int64
	for _, m := range mWith {
		preemptions += m.Preemptions
		aborted += m.Aborted
		hits += m.PrefixHits
	}
	require.Positive(t, preemptions, "the run must preempt")
	require.Positive(t, aborted, "and abort")
	require.Positive(t, hits, "and hit")
	require.Greater(t, shared, len(with)/2, "most turns borrow their conversation's array")
	require.Equal(t, mWithout, mWith)
	require.Equal(t, probesWithout, probesWith)
	require.Equal(t, len(without), len(with))
	for i := range with {
		require.Equal(t, without[i], with[i], "request %d", i)
	}
}

// TestDuplicateBlocksFindTheFirstCached: a prompt of whole blocks
// computes its last block even when it is cached (the last token is always
// computed), so requests with the same such prompt cache that block again
// under the same hash; a lookup finds the copy cached first
// (BlockHashToBlockMap keeps insertion order), and the copies go as they
// are evicted.
func TestDuplicateBlocksFindTheFirstCached(t *testing.T) {
	t.Run("fresh", func(t *testing.T) { duplicateBlocksFindTheFirstCached(t, 0, 4) })
	// The cache order's counter wraps after the first request: the
	// cached blocks are numbered again, in the same order.
	t.Run("wrapping", func(t *testing.T) { duplicateBlocksFindTheFirstCached(t, math.MaxUint32-4, math.MaxUint32) })
	// It wraps while the first request caches its four blocks in one
	// call: the two it cached already are numbered again with the rest.
	t.Run("wrapping-in-a-call", func(t *testing.T) { duplicateBlocksFindTheFirstCached(t, math.MaxUint32-2, 4) })
}

// duplicateBlocksFindTheFirstCached starts the cache order's counter at
// seq; the first request leaves it at afterFirst.
func duplicateBlocksFindTheFirstCached(t *testing.T, seq, afterFirst uint32) {
	r := newTestReplica(t, func(c *ReplicaConfig) { c.KVCapacityTokens = 16 * 12; c.MaxModelLen = 16 * 12 })
	r.pool.cacheSeq = seq
	prompt := tokens(7, 64) // 4 full blocks
	var lastBlocks []int32  // each request's block 3
	for i := range 3 {
		q := promptRequest(prompt, 1)
		require.NoError(t, r.Submit(q, r.Now()))
		if i > 0 {
			assert.Equal(t, 48, q.CachedTokens, "blocks 0-2 hit, block 3 computed again")
		}
		lastBlocks = append(lastBlocks, q.table[3])
		drain(t, r)
		checkPool(t, r)
		if i == 0 {
			require.Equal(t, afterFirst, r.pool.cacheSeq)
		}
	}
	require.Len(t, r.pool.hashRuns, 3, "one run from block 0, two from block 3 under one hash")
	longer := promptRequest(concat(prompt, tokens(900, 20)), 1)
	require.NoError(t, r.Submit(longer, r.Now()))
	assert.Equal(t, 64, longer.CachedTokens)
	assert.Equal(t, lastBlocks[0], longer.table[3], "the first request's copy, cached first")
	chain := append([]uint64(nil), longer.hashes...)
	drain(t, r)
	checkPool(t, r)
	// Pressure evicts the copies one by one; lookups always find the oldest
	// left.
	for i := range 8 {
		require.NoError(t, r.Submit(promptRequest(tokens(uint32(10_000*(i+1)), 16+16*i%64), 1), r.Now()))
		drain(t, r)
		checkPool(t, r)
		checkLookup(t, &r.pool, chain)
	}
	require.Zero(t, r.CachedPrefixTokens(promptRequest(prompt, 1)), "all evicted")
}

// TestRenumberSeqsKeepsTheCacheOrder: numbering the cached blocks again
// keeps their order of caching, whatever their order among the records,
// and leaves the records without a hash alone.
func TestRenumberSeqsKeepsTheCacheOrder(t *testing.T) {
	p := blockPool{cacheSeq: math.MaxUint32, blocks: []kvBlock{
		{seq: 90, run: 0},
		{seq: 7, run: noRun},
		{seq: math.MaxUint32, run: 1},
		{seq: 12, run: 0},
		{seq: 4000, run: 2},
		{seq: 0, run: noRun},
		{seq: 13, run: 1},
	}}
	p.renumberSeqs()
	var seqs []uint32
	for _, b := range p.blocks {
		seqs = append(seqs, b.seq)
	}
	assert.Equal(t, []uint32{3, 7, 5, 1, 4, 0, 2}, seqs)
	assert.Equal(t, uint32(5), p.cacheSeq, "the next block cached comes after them")
}

func TestHashOutputBlockIsHashBlockOfTheTokens(t *testing.T) {
	for n := 1; n <= 33; n++ {
		for _, from := range []int{0, 1, 17, 1000} {
			toks := make([]uint32, n)
			for i := range toks {
				toks[i] = OutputToken(42, from+i)
			}
			require.Equal(t, hashBlock(7, 9, toks), hashOutputBlock(7, 9, 42, from, n), "n %d from %d", n, from)
		}
	}
}

// TestHashRunViewIsTheRequestsList: a run grows as a view of the hash list
// its request caches from. Caching from a list with the same hashes in
// other memory is a bug (the view would miss what the request's list
// holds next), and is caught even though the values agree.
func TestHashRunViewIsTheRequestsList(t *testing.T) {
	p := newBlockPool(8, true)
	var cur recordCursor
	table := p.allocate(4, nil, &cur)
	hashes := []uint64{10, 12, 14, 16}
	run := noRun
	p.cacheBlocks(table[:2], hashes, 0, &run, 4)
	require.Same(t, &hashes[0], &p.hashRuns[run].hashes[0], "the run views the list")
	copied := append([]uint64(nil), hashes...)
	require.PanicsWithValue(t, "vllmsim: a hash run's view is not of its request's hash list", func() {
		p.cacheBlocks(table[2:], copied, 2, &run, 4)
	})
}
