package vllmsim

import "math/bits"

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
// A request without token ids (Request.Prompt nil) shares no block with any
// other, so only its own resumption after a preemption can hit its cached
// blocks. Such blocks are tagged with the request's salt and block index
// instead of going through the hash index, and only when the request frees
// them (until then nobody can look for them): the same hits and the same
// free queue, without the index traffic (the fleet benchmark's ShareGPT
// scenarios run at 1.2× the CPU of the model without caching instead of
// 3.5×, BENCHMARKS.md).
type blockPool struct {
	blocks     []kvBlock
	head, tail int32
	free       int
	byHash     hashIndex
	caching    bool
	// hashed counts blocks that carry a hash (in use or free).
	hashed int
}

type kvBlock struct {
	// hash is the block hash, or for a virtual block its request's salt.
	hash uint64
	// prev and next link the free queue; sameHash links blocks holding the
	// same hash, oldest first.
	prev, next, sameHash int32
	ref                  int32
	virtIndex            int32 // a virtual block's index in its request
	inFree, hasHash      bool
	virtual              bool
}

const noBlock int32 = -1

func newBlockPool(n int, caching bool) blockPool {
	p := blockPool{blocks: make([]kvBlock, n), head: noBlock, tail: noBlock, caching: caching}
	if caching {
		p.byHash = newHashIndex(n)
	}
	for i := range p.blocks {
		p.blocks[i].sameHash = noBlock
		p.pushBack(int32(i))
	}
	return p
}

func (p *blockPool) pushBack(b int32) {
	blk := &p.blocks[b]
	blk.prev, blk.next, blk.inFree = p.tail, noBlock, true
	if p.tail == noBlock {
		p.head = b
	} else {
		p.blocks[p.tail].next = b
	}
	p.tail = b
	p.free++
}

func (p *blockPool) pushFront(b int32) {
	blk := &p.blocks[b]
	blk.prev, blk.next, blk.inFree = noBlock, p.head, true
	if p.head == noBlock {
		p.tail = b
	} else {
		p.blocks[p.head].prev = b
	}
	p.head = b
	p.free++
}

func (p *blockPool) unlink(b int32) {
	blk := &p.blocks[b]
	if blk.prev == noBlock {
		p.head = blk.next
	} else {
		p.blocks[blk.prev].next = blk.next
	}
	if blk.next == noBlock {
		p.tail = blk.prev
	} else {
		p.blocks[blk.next].prev = blk.prev
	}
	blk.prev, blk.next, blk.inFree = noBlock, noBlock, false
	p.free--
}

// evictable counts the blocks in list that sit in the free queue: touching
// them uses up free blocks (get_num_blocks_to_allocate counts them).
func (p *blockPool) evictable(list []int32) int {
	n := 0
	for _, b := range list {
		if p.blocks[b].ref == 0 {
			n++
		}
	}
	return n
}

// touch takes hit blocks into use.
func (p *blockPool) touch(list []int32) {
	for _, b := range list {
		blk := &p.blocks[b]
		if blk.ref == 0 {
			p.unlink(b)
		}
		blk.ref++
	}
}

// allocate appends n blocks from the head of the free queue to dst,
// evicting the cached ones. The caller has checked n <= p.free.
func (p *blockPool) allocate(n int, dst []int32) []int32 {
	for range n {
		b := p.head
		p.unlink(b)
		if p.blocks[b].hasHash {
			p.evict(b)
		}
		p.blocks[b].ref = 1
		dst = append(dst, b)
	}
	return dst
}

// evict drops block b's hash from the cache.
func (p *blockPool) evict(b int32) {
	blk := &p.blocks[b]
	if blk.virtual {
		blk.hasHash, blk.hash, blk.virtual = false, 0, false
		p.hashed--
		return
	}
	if first := p.byHash.removeIf(blk.hash, b, blk.sameHash, p.blocks); first != b {
		for c := first; ; c = p.blocks[c].sameHash {
			if p.blocks[c].sameHash == b {
				p.blocks[c].sameHash = blk.sameHash
				break
			}
		}
	}
	blk.hasHash, blk.hash, blk.sameHash = false, 0, noBlock
	p.hashed--
}

// cache records that in-use block b holds the full block with hash h
// (cache_full_blocks). A block that already has a hash came from a hit and
// keeps it.
func (p *blockPool) cache(b int32, h uint64) {
	blk := &p.blocks[b]
	if !p.caching || blk.hasHash {
		return
	}
	blk.hash, blk.hasHash, blk.sameHash = h, true, noBlock
	p.hashed++
	first := p.byHash.getOrSet(h, b, p.blocks)
	if first == b {
		return
	}
	c := first
	for p.blocks[c].sameHash != noBlock {
		c = p.blocks[c].sameHash
	}
	p.blocks[c].sameHash = b
}

// tagVirtual tags block b, about to be freed, as block index of the
// request with salt. The caller counted it in hashed when it became full.
func (p *blockPool) tagVirtual(b int32, salt uint64, index int) {
	blk := &p.blocks[b]
	blk.hash, blk.hasHash, blk.virtual, blk.virtIndex = salt, true, true, int32(index)
}

// virtualHits is how many leading blocks of a preempted request's former
// table still hold its blocks, at most maxBlocks.
func (p *blockPool) virtualHits(former []int32, salt uint64, maxBlocks int) int {
	n := 0
	for n < min(maxBlocks, len(former)) {
		blk := &p.blocks[former[n]]
		if !blk.virtual || blk.hash != salt || blk.virtIndex != int32(n) {
			break
		}
		n++
	}
	return n
}

// release frees a request's block table, tail first: every count drops,
// blocks reaching 0 with a hash are appended in that order, those without
// one prepended so that the table's tail block is reused first.
func (p *blockPool) release(table []int32) {
	for i := len(table) - 1; i >= 0; i-- {
		blk := &p.blocks[table[i]]
		blk.ref--
		if blk.ref == 0 && blk.hasHash {
			p.pushBack(table[i])
		}
	}
	for _, b := range table {
		if blk := &p.blocks[b]; blk.ref == 0 && !blk.hasHash && !blk.inFree {
			p.pushFront(b)
		}
	}
}

// hashIndex maps a block hash to a block id: open addressing with linear
// probing over a power-of-two table at most half full (the pool's blocks
// bound its entries), and backward-shift deletion, so the constant insert
// and evict churn of the cache leaves no tombstones. A slot is one word:
// the hash's high 32 bits (which also pick its home slot) and the block id
// plus one, so an empty slot is 0 and a probe reads one cache line; a slot
// whose high bits match is confirmed against the full hash in the block
// array, so two hashes that share their high bits never mix. It replaced a
// Go map whose probe sequences grew under that churn, then a key array and
// a block array probed one after the other (BENCHMARKS.md has the figures).
type hashIndex struct {
	slots []uint64
	mask  uint64
}

func newHashIndex(maxEntries int) hashIndex {
	size := 16
	for size < 2*maxEntries {
		size *= 2
	}
	return hashIndex{slots: make([]uint64, size), mask: uint64(size - 1)}
}

func indexSlot(key uint64, b int32) uint64 { return key&^(1<<32-1) | uint64(uint32(b+1)) }

func slotBlock(s uint64) int32 { return int32(uint32(s)) - 1 }

// find returns key's slot, or the empty slot where it would go.
func (h *hashIndex) find(key uint64, blocks []kvBlock) uint64 {
	tag := key >> 32
	i := tag & h.mask
	for {
		s := h.slots[i]
		if s == 0 || s>>32 == tag && blocks[slotBlock(s)].hash == key {
			return i
		}
		i = (i + 1) & h.mask
	}
}

// get returns the block of key, or noBlock.
func (h *hashIndex) get(key uint64, blocks []kvBlock) int32 {
	if s := h.slots[h.find(key, blocks)]; s != 0 {
		return slotBlock(s)
	}
	return noBlock
}

// getOrSet returns key's block, first setting it to block if key is
// absent. blocks[block].hash must already be key.
func (h *hashIndex) getOrSet(key uint64, block int32, blocks []kvBlock) int32 {
	i := h.find(key, blocks)
	if h.slots[i] == 0 {
		h.slots[i] = indexSlot(key, block)
		return block
	}
	return slotBlock(h.slots[i])
}

// removeIf returns key's block; if it is block, key now maps to next, or
// is removed when next is noBlock.
func (h *hashIndex) removeIf(key uint64, block, next int32, blocks []kvBlock) int32 {
	i := h.find(key, blocks)
	if h.slots[i] == 0 {
		return noBlock
	}
	found := slotBlock(h.slots[i])
	if found != block {
		return found
	}
	if next != noBlock {
		h.slots[i] = indexSlot(key, next)
		return found
	}
	h.remove(i)
	return found
}

// remove empties slot i, shifting back the entries of its probe run.
func (h *hashIndex) remove(i uint64) {
	for j := (i + 1) & h.mask; h.slots[j] != 0; j = (j + 1) & h.mask {
		// Move the entry at j back to the hole at i unless its home slot
		// lies cyclically in (i, j].
		home := h.slots[j] >> 32 & h.mask
		if (j-home)&h.mask >= (j-i)&h.mask {
			h.slots[i] = h.slots[j]
			i = j
		}
	}
	h.slots[i] = 0
}

// slicePool keeps the block tables and hash lists of finished requests for
// the next ones, by power-of-two capacity (a replica serves thousands of
// requests a minute; without it every request allocates both).
type slicePool struct {
	freeTables [32][][]int32
	freeHashes [32][][]uint64
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

// hashes returns an empty slice with room for n hashes, reusing old when it
// is large enough.
func (p *slicePool) hashes(old []uint64, n int) []uint64 {
	if cap(old) >= n {
		return old[:0]
	}
	p.putHashes(old)
	c := sizeClass(n)
	if l := len(p.freeHashes[c]); l > 0 {
		h := p.freeHashes[c][l-1]
		p.freeHashes[c] = p.freeHashes[c][:l-1]
		return h
	}
	return make([]uint64, 0, 1<<c)
}

func (p *slicePool) putHashes(h []uint64) {
	if c := sizeClass(cap(h)); cap(h) > 0 && cap(h) == 1<<c && len(p.freeHashes[c]) < slicePoolDepth {
		p.freeHashes[c] = append(p.freeHashes[c], h[:0])
	}
}
