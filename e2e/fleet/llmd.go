package fleet

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// LLMDApprox re-implements llm-d's approximate prefix index (its
// approx-prefix-cache-producer feeding prefix-cache-scorer) from its
// documented behaviour and defaults (the READMEs of its approximate
// prefix plugin, prefix hashing, indexer and scorer), for the fleet
// benchmark's comparison. It is not code of theirs.
//
//   - Blocks of BlockTokens tokens (16 by default, clamped up to 64 at
//     request time, so 64), the trailing partial block included; at most
//     MaxBlocks (maxPrefixTokensToMatch 131072 / 64 = 2048).
//   - Chain: seed = xxhash(model); block i = xxhash(le64(xxhash(block
//     tokens as little-endian uint32)) ‖ le64(previous)).
//   - One LRU of hashes per pod, of capacity Capacity (autoTune: the pod's
//     num_gpu_blocks, counted in engine blocks while entries are 64-token
//     blocks), and a hash → pods map cleaned on eviction.
//   - Match: walk the hashes from block 0, stop at the first one no pod
//     holds; each pod scores one per hash it holds; score = matched /
//     total blocks.
//   - After scheduling, every hash of the request is added to the chosen
//     pod (speculatively, at routing time).
//
// One instance serves the whole gateway: llm-d runs one active picker per
// pool, which sees every request (the benchmark's most favourable reading
// of it; several active pickers would each see a share).
type LLMDApprox struct {
	BlockTokens int
	MaxBlocks   int
	Capacity    func(replica int) int

	pods    []*hashLRU
	holders map[uint64][]int32

	hashes  []uint64
	counts  []int
	replica []int // snapshot index → pod (identity: replica i is Endpoints[i])
	buf     []byte
}

// NewLLMDApprox returns the index with llm-d's defaults for replicas whose
// KV cache holds numGPUBlocks(replica) blocks.
func NewLLMDApprox(numGPUBlocks func(replica int) int) *LLMDApprox {
	return &LLMDApprox{BlockTokens: 64, MaxBlocks: 2048, Capacity: numGPUBlocks, holders: map[uint64][]int32{}}
}

// hashPrompt fills a.hashes for a prompt of token ids served by model.
func (a *LLMDApprox) hashPrompt(model string, tokens []uint32) {
	a.hashes = a.hashes[:0]
	prev := xxhash.Sum64String(model)
	var pair [16]byte
	for start := 0; start < len(tokens) && len(a.hashes) < a.MaxBlocks; start += a.BlockTokens {
		end := min(start+a.BlockTokens, len(tokens))
		a.buf = a.buf[:0]
		for _, t := range tokens[start:end] {
			a.buf = binary.LittleEndian.AppendUint32(a.buf, t)
		}
		binary.LittleEndian.PutUint64(pair[:8], xxhash.Sum64(a.buf))
		binary.LittleEndian.PutUint64(pair[8:], prev)
		prev = xxhash.Sum64(pair[:])
		a.hashes = append(a.hashes, prev)
	}
}

// match counts, per replica, the hashes it holds along the prefix.
func (a *LLMDApprox) match(replicas int) {
	a.counts = growInts(a.counts, replicas)
	clear(a.counts)
	for _, h := range a.hashes {
		pods := a.holders[h]
		if len(pods) == 0 {
			return
		}
		for _, p := range pods {
			if int(p) < replicas {
				a.counts[p]++
			}
		}
	}
}

// record adds the request's hashes to replica's LRU.
func (a *LLMDApprox) record(replica int) {
	for len(a.pods) <= replica {
		a.pods = append(a.pods, newHashLRU(a.Capacity(len(a.pods))))
	}
	lru := a.pods[replica]
	for _, h := range a.hashes {
		if evicted, ok := lru.add(h); ok {
			a.drop(evicted, replica)
		}
		if !containsPod(a.holders[h], replica) {
			a.holders[h] = append(a.holders[h], int32(replica))
		}
	}
}

func (a *LLMDApprox) drop(h uint64, replica int) {
	pods := a.holders[h]
	for i, p := range pods {
		if int(p) == replica {
			pods[i] = pods[len(pods)-1]
			pods = pods[:len(pods)-1]
			break
		}
	}
	if len(pods) == 0 {
		delete(a.holders, h)
		return
	}
	a.holders[h] = pods
}

func containsPod(pods []int32, replica int) bool {
	for _, p := range pods {
		if int(p) == replica {
			return true
		}
	}
	return false
}

func growInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}

// llmdInfo hands one request's match to the scheduler's prefix-cache
// scorer (scheduler.PrefixInfo).
type llmdInfo struct {
	a    *LLMDApprox
	snap *scheduler.Snapshot
}

func (i *llmdInfo) PromptBlocks() int   { return len(i.a.hashes) }
func (i *llmdInfo) AffinityKey() uint64 { return 0 }
func (i *llmdInfo) EndpointKey(e *scheduler.Endpoint) uint32 {
	return uint32(endpointPosition(i.snap, e))
}
func (i *llmdInfo) MatchedBlocks(e *scheduler.Endpoint) int {
	if p := endpointPosition(i.snap, e); p >= 0 && p < len(i.a.counts) {
		return i.a.counts[p]
	}
	return 0
}

// endpointPosition is e's index in snap.Endpoints (replica i is endpoint i).
func endpointPosition(snap *scheduler.Snapshot, e *scheduler.Endpoint) int {
	for i := range snap.Endpoints {
		if &snap.Endpoints[i] == e {
			return i
		}
	}
	return -1
}

// LLMDProfile is llm-d's built-in profile when no configuration is given
// (its configuration loader's defaults): queue-scorer 2,
// kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score picker.
// The scheduler's queue and KV scorers are upstream's, as llm-d's are.
func LLMDProfile() scheduler.Config {
	return scheduler.Config{Profile: "llmd", Profiles: map[string]scheduler.ProfileSpec{"llmd": {
		Scorers: []scheduler.ScorerRef{
			{Scorer: scheduler.TypeQueueScorer, Weight: 2},
			{Scorer: scheduler.TypeKVCacheScorer, Weight: 2},
			{Scorer: scheduler.TypePrefixCacheScorer, Weight: 3},
		},
		Picker: scheduler.TypeMaxScorePicker,
	}}}
}

// hashLRU is a set of hashes with least-recently-added eviction (a
// hashicorp LRU Add refreshes an existing key, as here).
type hashLRU struct {
	capacity   int
	nodes      map[uint64]int32
	prev, next []int32
	keys       []uint64
	head, tail int32 // most and least recent; -1 when empty
	free       []int32
}

func newHashLRU(capacity int) *hashLRU {
	return &hashLRU{capacity: max(capacity, 1), nodes: map[uint64]int32{}, head: -1, tail: -1}
}

// add inserts or refreshes h and returns the key it evicted, if any.
func (l *hashLRU) add(h uint64) (uint64, bool) {
	if n, ok := l.nodes[h]; ok {
		l.unlink(n)
		l.pushFront(n)
		return 0, false
	}
	var evicted uint64
	var did bool
	if len(l.nodes) >= l.capacity {
		t := l.tail
		evicted, did = l.keys[t], true
		l.unlink(t)
		delete(l.nodes, evicted)
		l.free = append(l.free, t)
	}
	var n int32
	if k := len(l.free); k > 0 {
		n, l.free = l.free[k-1], l.free[:k-1]
		l.keys[n] = h
	} else {
		n = int32(len(l.keys))
		l.keys, l.prev, l.next = append(l.keys, h), append(l.prev, -1), append(l.next, -1)
	}
	l.nodes[h] = n
	l.pushFront(n)
	return evicted, did
}

func (l *hashLRU) unlink(n int32) {
	p, x := l.prev[n], l.next[n]
	if p >= 0 {
		l.next[p] = x
	} else {
		l.head = x
	}
	if x >= 0 {
		l.prev[x] = p
	} else {
		l.tail = p
	}
}

func (l *hashLRU) pushFront(n int32) {
	l.prev[n], l.next[n] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = n
	}
	l.head = n
	if l.tail < 0 {
		l.tail = n
	}
}
