package vllmsim

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
)

// blockPool is vLLM V1's pool of KV-cache blocks with automatic prefix
// caching, after vllm/v1/core/block_pool.py (BlockPool) and the free queue
// of vllm/v1/core/kv_cache_utils.py (FreeKVCacheBlockQueue):
//
//   - A block in use has a reference count > 0: one per request whose block
//     table holds it. A block whose count is 0 sits in the free queue and
//     still counts as free (vllm:kv_cache_usage_perc leaves it out).
//   - New blocks are taken from the head of the free queue (get_new_blocks);
//     a taken block that still carries a hash is evicted from the cache at
//     that moment (_maybe_evict_cached_block): eviction is lazy, in free-queue
//     order, and an evicted block is gone.
//   - Freeing (free_blocks) lowers the counts; blocks reaching 0 without a
//     hash are prepended (reused first), blocks with a hash are appended
//     (evicted last), so the head holds the least recently freed cached
//     block. Callers free a request's blocks tail first
//     (single_type_kv_cache_manager.py, free), so within one request the
//     block with the longest chain is evicted first.
//   - A hit (touch) takes a block with count 0 out of the free queue and
//     raises its count.
//   - The cache maps a block hash to the blocks holding it in insertion order
//     (BlockHashToBlockMap): two requests that miss at the same time compute
//     the same block twice, and a lookup returns the first.
//
// vLLM also reserves one null block; the simulator has none, so every block
// of KVCapacityTokens is usable.
//
// Only what vLLM's rules make observable is kept per block: which cached
// blocks the queue evicts first, what a lookup finds, and how many blocks
// are free. So a block is a record (kvBlock) only while it holds a hash or
// belongs to a request with token ids; a block without a hash in the free
// queue is interchangeable with any other, and the queue's head part of
// them (the blocks vLLM prepends) is a count, anonymous.
//
// The cache is kept by request, not by block: the cached blocks a request
// computed itself (after those it found cached) form a hash run holding
// their hashes in chain order, and the hash index maps only a run's first
// hash to the run (hashRun). A lookup walks its chain, picks up the runs
// that begin at each block it passes and follows them while their hashes
// are the chain's; of the blocks holding a hash it takes the one cached
// first (kvBlock.seq), as BlockHashToBlockMap would. Caching and evicting
// a block thus touch its run, in order, and the index changes once per
// run instead of once per block.
//
// A request without token ids (Request.Prompt nil) shares no block with any
// other, so only its own resumption after a preemption can hit its cached
// blocks, and its blocks are never records: its table counts them. When it
// frees them, its cached blocks (tail first, as vLLM appends them) enter the
// FIFO as one run that counts how many of them are still cached: the head
// evicts a run from its last block, and the request, resuming, finds the
// leading blocks the run still holds (runHits), exactly the blocks vLLM's
// lookup would find under the hashes salted by the request. The fleet
// benchmark's ShareGPT scenarios thus pay no work per block
// (BENCHMARKS.md, "Replica-model speed work, third round").
type blockPool struct {
	// blocks are the records, in chunks of chunkRecords: a request takes
	// the records of its blocks from a chunk of its own (recordCursor).
	blocks []kvBlock
	// chunkUse counts, per chunk, its live records (in use or holding a
	// hash) plus one while it is a request's current chunk, whose records
	// not yet handed out count as live (so taking one writes no count);
	// freeChunks lists the chunks whose count is 0, the last freed on top.
	chunkUse   []int32
	freeChunks []int32
	// anonymous counts the free blocks that sit at the head of the free
	// queue without a hash: vLLM's prepended blocks and the pool's initial
	// ones, which all come before any block with a hash.
	anonymous int
	// fifo is the rest of the free queue, oldest first: record ids, holes
	// (noBlock) left by hits, and runs (runEntry).
	fifo               []int32
	fifoHead, fifoTail uint64 // sequence numbers; fifo[seq&fifoMask]
	fifoMask           uint64
	runs               []blockRun
	spareRuns          []int32
	free               int
	// byHash maps the first hash of every hash run to the run (the oldest
	// run with it; link to the others).
	byHash        hashIndex
	hashRuns      []hashRun
	spareHashRuns []int32
	runSlices     slicePool
	cacheSeq      uint32
	// candidates is lookup's scratch.
	candidates []int32
	caching    bool
	// hashed counts blocks that carry a hash (in use or free), counting
	// the blocks of requests without token ids from when they are full.
	hashed int
}

// kvBlock is a block's record, 16 bytes, four to a cache line: the
// passes over the records (freeing a table, evicting at the head,
// caching) read and write a cache line every four blocks instead of every
// two (BENCHMARKS.md, "Replica-model speed work, fifth round"). Its hash
// is in its run (hashOf).
type kvBlock struct {
	// seq is when the block was cached: of the blocks holding one hash, a
	// lookup finds the one cached first (BlockHashToBlockMap keeps them in
	// insertion order). It wraps around after 2^32 - 1 cached blocks,
	// when the live ones are numbered again in order (renumberSeqs).
	seq uint32
	// state is the block's reference count while it is in use (> 0);
	// for a block in the free queue's FIFO (a count of 0 and a hash), -1
	// minus its place in the FIFO (fifoPlace); 0 otherwise.
	state int32
	// run is the hash run holding a cached block (noRun: no hash), pos its
	// place in the chain.
	run, pos int32
}

// refs is the block's reference count.
func (b *kvBlock) refs() int32 { return max(b.state, 0) }

// inFIFO reports whether the block sits in the free queue's FIFO.
func (b *kvBlock) inFIFO() bool { return b.state < 0 }

// fifoPlace is the FIFO slot of a block in the FIFO.
func (b *kvBlock) fifoPlace() uint64 { return uint64(-1 - b.state) }

// setFIFOPlace records that the block sits in FIFO slot slot.
func (b *kvBlock) setFIFOPlace(slot uint64) { b.state = -1 - int32(slot) }

// hashOf is record b's block hash, 0 for none (no block hash is 0).
func (p *blockPool) hashOf(b int32) uint64 {
	blk := &p.blocks[b]
	if blk.run == noRun {
		return 0
	}
	r := &p.hashRuns[blk.run]
	return r.hashes[blk.pos-r.start]
}

// hashRun is a request's own cached blocks, in chain order from position
// start: the blocks it computed, after those it found in the cache. The
// hash index maps a run's first hash to the run, not every block's hash to
// its block: caching a block appends to its request's run, and evicting it
// marks its place in the run; the index changes only when a run begins
// and when its last block is gone (BENCHMARKS.md, "Replica-model speed
// work, fourth round").
type hashRun struct {
	// hashes are those of the blocks start, start+1, ...: a view of its
	// request's hash list, not a copy (the view took (e) from 30.2 M to
	// 26.5 M misses of a 1 MiB L2; BENCHMARKS.md, "Replica-model speed
	// work, fifth round"). The view stays true after the request is gone
	// by the rule on PromptHashes: nothing writes a hash array below the
	// length its borrowers reached.
	hashes []uint64
	blocks []int32 // their records, noBlock once evicted
	start  int32
	live   int32 // blocks still cached
	// link is the next run with the same first hash (the same chain
	// position), oldest first.
	link int32
	home uint32 // index home of the first hash
	open bool   // its request is running and may append blocks
}

// blockRun is the cached blocks 0..left-1 of the request with salt that are
// still in the free queue; the FIFO holds its entry where vLLM's queue held
// those blocks, last block first.
type blockRun struct {
	salt uint64
	left int32
}

const noBlock int32 = -1

// runEntry is the FIFO entry of run i (below noBlock).
func runEntry(i int32) int32 { return -2 - i }

// noRun is a request's run when it has none.
const noRun int32 = -1

func newBlockPool(n int, caching bool) blockPool {
	size := 16
	for size < 2*n {
		size *= 2
	}
	// The records start empty and grow a chunk at a time; a quarter more
	// than the blocks covers the chunks that requests hold partly used.
	p := blockPool{blocks: make([]kvBlock, 0, n+n/4+chunkRecords), fifo: make([]int32, size),
		fifoMask: uint64(size - 1), caching: caching, anonymous: n, free: n}
	if caching {
		p.byHash = newHashIndex(n)
	}
	return p
}

// Records by owner. Which record holds which block is the simulator's
// choice: vLLM's block ids are never observable, only hashes, counts and
// the free queue's order. So a request takes the records of its new blocks
// in order from a chunk of chunkRecords neighbouring records of its own
// (recordCursor), instead of reusing the record of the block it evicts: a
// table's records are then neighbours in memory, and the passes over a
// table (caching its blocks, freeing them tail first, evicting them in the
// free queue's order, which for one request is its table's order reversed)
// read a few cache lines a chunk, in an order the hardware prefetches,
// instead of a line a block. A chunk returns to the free list when its last
// record dies (evicted, or freed without a hash) and no request takes from
// it; the last freed is reused first, so a chunk emptied by an allocation's
// evictions is still in cache when that allocation takes it. At most one
// chunk per running request is partly unused, so the records stay within
// chunkRecords × (blocks + running requests), and near the block count in
// practice (BENCHMARKS.md, "Replica-model speed work, fourth round").

// chunkRecords is how many neighbouring records a request takes at once.
const chunkRecords = 16

// recordCursor is a request's current chunk: the records next..end-1 are
// its to take; end is 0 when it has none.
type recordCursor struct{ next, end int32 }

// newRecords sets every id of dst to a record taken from cur's chunk in
// order, taking a new chunk when it is used up; the records are clean (no
// hash, no run) and their counts are set to 1.
func (p *blockPool) newRecords(dst []int32, cur *recordCursor) {
	for i := 0; i < len(dst); {
		if cur.next == cur.end {
			p.takeChunk(cur)
		}
		k := min(len(dst)-i, int(cur.end-cur.next))
		for j := range k {
			b := cur.next + int32(j)
			dst[i+j] = b
			p.blocks[b].state = 1
		}
		cur.next += int32(k)
		i += k
	}
}

// takeChunk gives cur a chunk of records to take from, letting go of its
// old one.
func (p *blockPool) takeChunk(cur *recordCursor) {
	p.dropCursor(cur)
	c, ok := popID(&p.freeChunks)
	if !ok {
		c = int32(len(p.chunkUse))
		p.chunkUse = append(p.chunkUse, 0)
		for range chunkRecords {
			p.blocks = append(p.blocks, kvBlock{run: noRun})
		}
	}
	// cur holds it, and its records count as live from now on:
	// dropCursor takes back those cur did not hand out.
	p.chunkUse[c] = 1 + chunkRecords
	cur.next, cur.end = c*chunkRecords, (c+1)*chunkRecords
}

// popID takes the last id of a free list, if any.
func popID(list *[]int32) (int32, bool) {
	l := len(*list)
	if l == 0 {
		return 0, false
	}
	id := (*list)[l-1]
	*list = (*list)[:l-1]
	return id, true
}

// dropCursor lets go of cur's chunk (a request freeing its blocks).
func (p *blockPool) dropCursor(cur *recordCursor) {
	if cur.end != 0 {
		c := (cur.end - 1) / chunkRecords
		p.chunkUse[c] -= cur.end - cur.next // the records it did not hand out
		p.unuseChunk(c)
	}
	*cur = recordCursor{}
}

// killRecord returns record b, which holds no block any more (no count, no
// hash, no run), to its chunk.
func (p *blockPool) killRecord(b int32) { p.unuseChunk(b / chunkRecords) }

func (p *blockPool) unuseChunk(c int32) {
	p.chunkUse[c]--
	if p.chunkUse[c] == 0 {
		p.freeChunks = append(p.freeChunks, c)
	}
}

// The free queue as a count and a FIFO with holes: the queue of vLLM's
// FreeKVCacheBlockQueue (a doubly linked list) only ever gains blocks
// without a hash at its head (prepended on free) and blocks with a hash at
// its tail (appended on free), and loses blocks at its head (allocation)
// or, for blocks with a hash only, anywhere (a hit on a free block). So the
// queue is exactly the blocks without a hash, which nothing tells apart,
// then the appended ones in order; a hit leaves a hole in the FIFO (the
// block's entry, found through its state, becomes noBlock) that the head
// skips. Allocating thus reads block ids in order instead of chasing links
// from block to block, and skips holes without reading the block array
// (BENCHMARKS.md, "Replica-model speed work").

// pushBack appends entry e (a block with a hash, or a run) to the FIFO.
func (p *blockPool) pushBack(e int32) {
	if p.fifoTail-p.fifoHead == uint64(len(p.fifo)) {
		p.compactFIFO()
	}
	p.fifo[p.fifoTail&p.fifoMask] = e
	if e >= 0 {
		p.blocks[e].setFIFOPlace(p.fifoTail & p.fifoMask)
	}
	p.fifoTail++
}

// popFront takes the head of the FIFO part of the free queue, which the
// caller has checked is not empty, after taking the anonymous blocks that
// come before it (allocate): a record id (of a block with a hash, still
// cached), or noBlock for the last block of a run, evicted.
func (p *blockPool) popFront() int32 {
	p.free--
	for {
		e := p.fifo[p.fifoHead&p.fifoMask]
		if e >= 0 {
			p.fifoHead++
			return e
		}
		if e == noBlock {
			p.fifoHead++
			continue
		}
		run := &p.runs[-2-e]
		if run.left == 0 {
			p.fifoHead++
			p.dropRun(-2 - e)
			continue
		}
		// The run's last block: evicted, it joins the anonymous ones.
		run.left--
		p.hashed--
		if run.left == 0 {
			p.fifoHead++
			p.dropRun(-2 - e)
		}
		return noBlock
	}
}

func (p *blockPool) dropRun(i int32) {
	p.runs[i] = blockRun{}
	p.spareRuns = append(p.spareRuns, i)
}

// unlink takes free block b, which has a hash, out of the queue: its FIFO
// entry becomes a hole.
func (p *blockPool) unlink(b int32) {
	blk := &p.blocks[b]
	if !blk.inFIFO() || blk.run == noRun || p.fifo[blk.fifoPlace()] != b {
		panic("vllmsim: unlinking a block that is not in the free queue's FIFO")
	}
	p.fifo[blk.fifoPlace()] = noBlock
	blk.state = 0
	p.free--
}

// compactFIFO squeezes the holes and spent runs out of a full FIFO,
// keeping the order. The FIFO has room for twice the pool, so this runs at
// most once per pool-size appends.
func (p *blockPool) compactFIFO() {
	w := p.fifoHead
	for seq := p.fifoHead; seq < p.fifoTail; seq++ {
		e := p.fifo[seq&p.fifoMask]
		switch {
		case e == noBlock:
			continue
		case e < noBlock && p.runs[-2-e].left == 0:
			p.dropRun(-2 - e)
			continue
		case e >= 0:
			p.blocks[e].setFIFOPlace(w & p.fifoMask)
		}
		p.fifo[w&p.fifoMask] = e
		w++
	}
	p.fifoTail = w
}

// evictable counts the blocks in list that sit in the free queue: touching
// them uses up free blocks (get_num_blocks_to_allocate counts them).
func (p *blockPool) evictable(list []int32) int {
	n := 0
	for _, b := range list {
		if p.blocks[b].inFIFO() {
			n++
		}
	}
	return n
}

// touch takes hit blocks into use.
func (p *blockPool) touch(list []int32) {
	for _, b := range list {
		blk := &p.blocks[b]
		if blk.inFIFO() {
			p.unlink(b)
		}
		blk.state++
	}
}

// allocate appends n blocks from the head of the free queue to dst,
// evicting the cached ones: records taken from cur, or for a table that
// only counts its blocks (anonymous, a request without token ids, cur nil)
// noBlock. The caller has checked n <= p.free.
func (p *blockPool) allocate(n int, dst []int32, cur *recordCursor) []int32 {
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	taken := dst[start:]
	// The anonymous blocks at the head go first, as a count, then the
	// FIFO's.
	anonymous := min(n, p.anonymous)
	p.anonymous -= anonymous
	p.free -= anonymous
	fromFIFO := taken[anonymous:]
	for i := range fromFIFO {
		fromFIFO[i] = p.popFront()
	}
	// Read the taken records before evicting them one by one: these loads
	// do not depend on each other, so their cache misses overlap, where
	// each eviction's probe of the index waits for its record.
	all := noRun // the runs of all the records, and-ed: noRun if none has one
	for _, b := range fromFIFO {
		if b != noBlock {
			all &= p.blocks[b].run
		}
	}
	if all != noRun {
		for _, b := range fromFIFO {
			if b != noBlock {
				p.evict(b) // the queue's records all have a hash
				p.killRecord(b)
			}
		}
	}
	// The evicted records are gone; the new blocks get the owner's.
	if cur == nil {
		for i := range taken {
			taken[i] = noBlock
		}
	} else {
		p.newRecords(taken, cur)
	}
	return dst
}

// evict drops free block b's hash from the cache: its place in its run is
// emptied, and a run of a request that is gone goes with its last block.
func (p *blockPool) evict(b int32) {
	blk := &p.blocks[b]
	id := blk.run
	run := &p.hashRuns[id]
	run.blocks[blk.pos-run.start] = noBlock
	run.live--
	blk.run, blk.state = noRun, 0
	p.hashed--
	if run.live == 0 && !run.open {
		p.dropHashRun(id)
	}
}

// cacheBlocks records that in-use blocks hold full blocks from, from+1, ...
// of the chain whose block hashes are hashes (cache_full_blocks),
// appending them to the hash run *run of their request, which opens when
// there is none (the request's first own block, after those it found
// cached) with room for maxBlocks. The blocks are blocks the request
// computed, without a hash: the blocks it found cached keep theirs, and
// the caller skips them without reading them.
func (p *blockPool) cacheBlocks(blocks []int32, hashes []uint64, from int, run *int32, maxBlocks int) {
	if !p.caching || len(blocks) == 0 {
		return
	}
	if *run == noRun || int(p.hashRuns[*run].start)+len(p.hashRuns[*run].hashes) != from {
		p.closeHashRun(run)
		*run = p.openHashRun(hashes, from, maxBlocks)
	}
	r := &p.hashRuns[*run]
	// The view grows over the request's list (only its length is
	// written); a request's list has room for all its blocks, so it is
	// never moved while the request caches. The check is of memory, not
	// values: the view's new hashes are the list's own.
	n := len(r.hashes)
	if from+len(blocks) > len(hashes) || n+len(blocks) > cap(r.hashes) || &r.hashes[:n+1][n] != &hashes[from] {
		panic("vllmsim: a hash run's view is not of its request's hash list")
	}
	r.hashes = r.hashes[:n+len(blocks)]
	r.blocks = append(r.blocks, blocks...)
	r.live += int32(len(blocks))
	for k, b := range blocks {
		if p.cacheSeq == math.MaxUint32 {
			p.renumberSeqs()
		}
		p.cacheSeq++
		blk := &p.blocks[b]
		blk.seq, blk.run, blk.pos = p.cacheSeq, *run, int32(from+k)
	}
	p.hashed += len(blocks)
}

// renumberSeqs numbers the cached blocks 1, 2, ... in the order they were
// cached, so that caching goes on after 2^32 - 1 blocks without changing
// which copy of a hash a lookup finds.
func (p *blockPool) renumberSeqs() {
	var cached []int32
	for b := range p.blocks {
		if p.blocks[b].run != noRun {
			cached = append(cached, int32(b))
		}
	}
	slices.SortFunc(cached, func(a, b int32) int { return cmp.Compare(p.blocks[a].seq, p.blocks[b].seq) })
	for i, b := range cached {
		p.blocks[b].seq = uint32(i + 1)
	}
	p.cacheSeq = uint32(len(cached))
}

// openHashRun starts a run at block i of the chain hashes, with room for
// maxBlocks, and indexes it by its first hash.
func (p *blockPool) openHashRun(hashes []uint64, i, maxBlocks int) int32 {
	id, ok := popID(&p.spareHashRuns)
	if !ok {
		id = int32(len(p.hashRuns))
		p.hashRuns = append(p.hashRuns, hashRun{})
	}
	home := p.byHash.homeOf(hashes, i)
	p.hashRuns[id] = hashRun{hashes: hashes[i:i], blocks: p.runSlices.table(maxBlocks),
		start: int32(i), link: noRun, home: home, open: true}
	first := p.byHash.getOrSet(hashes[i], home, id, p.hashRuns)
	if first != id {
		c := first
		for p.hashRuns[c].link != noRun {
			c = p.hashRuns[c].link
		}
		p.hashRuns[c].link = id
	}
	return id
}

// closeHashRun ends the request's run *run (it freed its blocks, or has a
// new run): the run goes once its last block is evicted.
func (p *blockPool) closeHashRun(run *int32) {
	if id := *run; id != noRun {
		p.hashRuns[id].open = false
		if p.hashRuns[id].live == 0 {
			p.dropHashRun(id)
		}
	}
	*run = noRun
}

// dropHashRun removes run id, which holds no cached block, from the index.
func (p *blockPool) dropHashRun(id int32) {
	r := &p.hashRuns[id]
	if first := p.byHash.removeIf(r.hashes[0], r.home, id, r.link, p.hashRuns); first != id {
		for c := first; ; c = p.hashRuns[c].link {
			if p.hashRuns[c].link == id {
				p.hashRuns[c].link = r.link
				break
			}
		}
	}
	p.runSlices.putTable(r.blocks)
	*r = hashRun{}
	p.spareHashRuns = append(p.spareHashRuns, id)
}

// lookup is find_longest_cache_hit for full attention over the chain
// hashes: left to right, at most maxBlocks, stopping at the first block no
// cached block holds; of several blocks holding a hash, the one cached
// first. It appends the hit blocks to dst when dst is not nil, and returns
// how many there are. The runs holding the chain's blocks are found as the
// walk passes their first hash, and followed while their hashes are the
// chain's.
func (p *blockPool) lookup(hashes []uint64, maxBlocks int, dst *[]int32) int {
	cands := p.candidates[:0]
	n := 0
	for i, h := range hashes[:min(maxBlocks, len(hashes))] {
		for id := p.byHash.get(h, p.byHash.homeOf(hashes, i), p.hashRuns); id != noRun; id = p.hashRuns[id].link {
			cands = append(cands, id)
		}
		best := noBlock
		var bestSeq uint32
		kept := cands[:0]
		for _, id := range cands {
			r := &p.hashRuns[id]
			k := i - int(r.start)
			if k >= len(r.hashes) || r.hashes[k] != h {
				continue // the run ends here or leaves the chain
			}
			kept = append(kept, id)
			if b := r.blocks[k]; b != noBlock && (best == noBlock || p.blocks[b].seq < bestSeq) {
				best, bestSeq = b, p.blocks[b].seq
			}
		}
		cands = kept
		if best == noBlock {
			break
		}
		if dst != nil {
			*dst = append(*dst, best)
		}
		n++
	}
	p.candidates = cands[:0]
	return n
}

// release frees a request's block table of records, tail first: every
// count drops, blocks reaching 0 with a hash are appended in that order,
// those without one join the anonymous blocks at the head.
func (p *blockPool) release(table []int32) {
	for i := len(table) - 1; i >= 0; i-- {
		b := table[i]
		blk := &p.blocks[b]
		blk.state--
		if blk.state != 0 {
			continue
		}
		p.free++
		if blk.run != noRun {
			p.pushBack(b)
		} else {
			p.anonymous++
			p.killRecord(b)
		}
	}
}

// releaseRun frees the n blocks of a request without token ids (with salt),
// whose leading cached blocks are cached, and returns the run that holds
// those (noRun for none).
func (p *blockPool) releaseRun(salt uint64, n, cached int) int32 {
	p.free += n
	p.anonymous += n - cached
	if cached == 0 {
		return noRun
	}
	i, ok := popID(&p.spareRuns)
	if !ok {
		i = int32(len(p.runs))
		p.runs = append(p.runs, blockRun{})
	}
	p.runs[i] = blockRun{salt: salt, left: int32(cached)}
	p.pushBack(runEntry(i))
	return i
}

// runHits is how many leading blocks of the request with salt, whose run
// is run, are still cached, at most maxBlocks.
func (p *blockPool) runHits(run int32, salt uint64, maxBlocks int) int {
	if run == noRun || p.runs[run].salt != salt {
		return 0
	}
	return min(int(p.runs[run].left), maxBlocks)
}

// takeRun takes the leading n blocks of run (from runHits) into use.
func (p *blockPool) takeRun(run int32, n int) {
	if n == 0 {
		return
	}
	p.runs[run].left -= int32(n)
	p.free -= n
}

// hashIndex maps the first hash of a hash run to the run's id: open
// addressing with linear probing over a power-of-two table at most a
// quarter full (the pool's blocks bound its runs), and backward-shift
// deletion, so the churn of runs leaves no tombstones. A slot is one word:
// the run, its distance from the slot its probe starts from (its home) and
// a fingerprint of its hash; a probe reads the run only to confirm a
// fingerprint that matches (a hit, or one probe in 16 million), and the
// deletion only for an entry more than maxDist slots from home.
//
// The home of block i of a chain is not drawn from its own hash but from
// the hash of the first block of its group of chainGroup (homeOf): a
// lookup probes every block of its chain in order, and those probes then
// read neighbouring slots. The map is the same whatever the homes, as long
// as every operation on a hash probes from the same home: lookups and
// inserts derive it from the chain that led to the hash (equal hashes come
// from equal token prefixes, so from equal chains: hash chaining, as vLLM
// assumes of its own hashes), removals from the home recorded in the run.
// It replaced a Go map whose probe sequences grew under the churn, then
// slots homed by their own hash (BENCHMARKS.md has the figures).
type hashIndex struct {
	slots []uint64
	mask  uint32
}

// A slot is 0 (empty) or fingerprint<<40 | distance<<32 | run+1.
const (
	slotRunMask = 1<<32 - 1
	maxDist     = 255 // a distance of maxDist or more: see the run's home
)

func slotOf(key uint64, dist uint32, run int32) uint64 {
	return key>>40<<40 | uint64(min(dist, maxDist))<<32 | uint64(uint32(run)+1)
}

func slotRun(s uint64) int32 { return int32(uint32(s&slotRunMask) - 1) }

func sameFingerprint(s, key uint64) bool { return (s^key)>>40 == 0 }

// chainGroup is how many consecutive blocks of a chain share a home slot range.
const chainGroup = 8

func newHashIndex(maxEntries int) hashIndex {
	size := 16
	for size < 4*maxEntries {
		size *= 2
	}
	return hashIndex{slots: make([]uint64, size), mask: uint32(size - 1)}
}

// homeOf is the home slot of block i of a chain whose block hashes are
// hashes (at least i+1 of them).
func (h *hashIndex) homeOf(hashes []uint64, i int) uint32 {
	return (uint32(hashes[i&^(chainGroup-1)]>>32) + uint32(i&(chainGroup-1))) & h.mask
}

// find returns key's slot, or the empty slot where it would go.
func (h *hashIndex) find(key uint64, home uint32, runs []hashRun) uint32 {
	i := home
	for {
		s := h.slots[i]
		if s == 0 || sameFingerprint(s, key) && runs[slotRun(s)].hashes[0] == key {
			return i
		}
		i = (i + 1) & h.mask
	}
}

// get returns the run of key, or noRun.
func (h *hashIndex) get(key uint64, home uint32, runs []hashRun) int32 {
	if s := h.slots[h.find(key, home, runs)]; s != 0 {
		return slotRun(s)
	}
	return noRun
}

// getOrSet returns key's run, first setting it to run (whose first hash
// is key) if key is absent.
func (h *hashIndex) getOrSet(key uint64, home uint32, run int32, runs []hashRun) int32 {
	i := h.find(key, home, runs)
	if h.slots[i] == 0 {
		h.slots[i] = slotOf(key, (i-home)&h.mask, run)
		return run
	}
	return slotRun(h.slots[i])
}

// removeIf returns key's run; if it is run, key now maps to next, or is
// removed when next is noRun.
func (h *hashIndex) removeIf(key uint64, home uint32, run, next int32, runs []hashRun) int32 {
	// The slot holding run is key's (an entry per hash): found without
	// reading the runs unless run is not key's first.
	i := home
	for {
		s := h.slots[i]
		if s == 0 {
			return noRun
		}
		if sameFingerprint(s, key) {
			if r := slotRun(s); r == run {
				break
			} else if runs[r].hashes[0] == key {
				return r
			}
		}
		i = (i + 1) & h.mask
	}
	if next != noRun {
		h.slots[i] = h.slots[i]&^slotRunMask | uint64(uint32(next)+1)
		return run
	}
	h.remove(i, runs)
	return run
}

// remove empties slot i, shifting back the entries of its probe run.
func (h *hashIndex) remove(i uint32, runs []hashRun) {
	for j := (i + 1) & h.mask; h.slots[j] != 0; j = (j + 1) & h.mask {
		s := h.slots[j]
		dist := uint32(s>>32) & maxDist
		if dist == maxDist {
			dist = (j - runs[slotRun(s)].home) & h.mask
		}
		// Move the entry at j back to the hole at i unless its home slot
		// lies cyclically in (i, j].
		if dist >= (j-i)&h.mask {
			newDist := dist - (j-i)&h.mask
			h.slots[i] = s&^(maxDist<<32) | uint64(min(newDist, maxDist))<<32
			i = j
		}
	}
	h.slots[i] = 0
}

// slicePool keeps the block tables of finished requests and runs for the
// next ones, by power-of-two capacity (a replica serves thousands of
// requests a minute; without it every request allocates one). Hash lists
// are not pooled: the runs keep views of them (hashRun), and only the rule
// on PromptHashes says who may append to an array.
type slicePool struct {
	freeTables [32][][]int32
}

const slicePoolDepth = 1024

func sizeClass(n int) int { return bits.Len(uint(max(n, 1) - 1)) }

// table returns an empty slice with room for n blocks.
func (p *slicePool) table(n int) []int32 {
	c := sizeClass(n)
	if l := len(p.freeTables[c]); l > 0 {
		t := p.freeTables[c][l-1]
		p.freeTables[c] = p.freeTables[c][:l-1]
		return t
	}
	return make([]int32, 0, 1<<c)
}

func (p *slicePool) putTable(t []int32) {
	if c := sizeClass(cap(t)); cap(t) == 1<<c && len(p.freeTables[c]) < slicePoolDepth {
		p.freeTables[c] = append(p.freeTables[c], t[:0])
	}
}
