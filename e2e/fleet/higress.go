package fleet

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// PolicyHigressApprox is Higress' in-proxy endpoint picker with its
// documented defaults (HigressApprox), one per worker VM.
const PolicyHigressApprox = "higress-approx"

// HigressApprox re-implements Higress' ai-endpoint-picker Wasm plugin
// from its README's description and defaults, for the fleet benchmark's
// comparison; it is not code of theirs. Each worker VM runs its own, as
// each Wasm VM keeps its own state:
//
//   - Prefix index local to the VM: the prompt (token ids here, one
//     pseudo-token each) is cut into segments of SegmentTokens (1,024),
//     at most MaxSegments (32); each segment's hash chains the model,
//     the segment's length and content and the previous hash. Per
//     endpoint a weighted LRU of segment hashes whose capacity is the
//     endpoint's KV blocks (num_gpu_blocks, at most 31,250), an entry
//     costing ceil(segment tokens / block size). A request's segments are
//     recorded for the chosen endpoint once it is chosen; scoring does not
//     refresh the LRU. (The README keeps a chain's head over its suffix
//     under pressure; here the least recently recorded entry goes.)
//   - Prefix score: matched = the consecutive leading segments' tokens
//     the endpoint holds; 0.75 × matched/total + 0.25 ×
//     min(matched/8192, 1)².
//   - Queue depth and the VM's own in-flight count per endpoint, min-max
//     normalised (lower is better); KV cache 1 − utilisation.
//   - Weights queue 2, KV cache 2, prefix 3, in-flight 1 (LoRA and
//     failure 0); the highest weighted sum wins, ties at random.
//
// Metrics are the fleet's scrape (every 50 ms; Higress caches host
// snapshots for 250 ms), every endpoint healthy.
type HigressApprox struct {
	SegmentTokens, MaxSegments int

	rand     *rand.Rand
	lrus     []*weightedLRU
	inflight []int
	routed   map[uint64]int // request id → replica, until finished

	hashes, costs, lens []uint64
	scores              []float64
	queue, flight       []float64
	buf                 []byte
}

// Higress ai-endpoint-picker defaults (its README).
const (
	higressSegmentTokens   = 1024
	higressMaxSegments     = 32
	higressMaxCacheBlocks  = 31250
	higressPrefixLengthCap = 8192
	higressWeightQueue     = 2
	higressWeightKV        = 2
	higressWeightPrefix    = 3
	higressWeightInflight  = 1
)

// HigressPolicySpec is PolicyHigressApprox.
func HigressPolicySpec() PolicySpec {
	return PolicySpec{Name: PolicyHigressApprox, New: func(seed uint64, _ func() time.Time) (Policy, error) {
		return &HigressApprox{SegmentTokens: higressSegmentTokens, MaxSegments: higressMaxSegments,
			rand: rand.New(rand.NewPCG(seed, 0x419e)), routed: map[uint64]int{}}, nil
	}}
}

var (
	_ Policy           = (*HigressApprox)(nil)
	_ ResponseObserver = (*HigressApprox)(nil)
)

// segment fills h.hashes with the prompt's chained segment hashes and
// h.lens with their token counts.
func (h *HigressApprox) segment(model string, tokens []uint32) {
	h.hashes, h.lens = h.hashes[:0], h.lens[:0]
	prev := xxhash.Sum64String(model)
	var word [24]byte
	for start := 0; start < len(tokens) && len(h.hashes) < h.MaxSegments; start += h.SegmentTokens {
		end := min(start+h.SegmentTokens, len(tokens))
		h.buf = h.buf[:0]
		for _, t := range tokens[start:end] {
			h.buf = binary.LittleEndian.AppendUint32(h.buf, t)
		}
		binary.LittleEndian.PutUint64(word[:8], prev)
		binary.LittleEndian.PutUint64(word[8:16], uint64(end-start))
		binary.LittleEndian.PutUint64(word[16:], xxhash.Sum64(h.buf))
		prev = xxhash.Sum64(word[:])
		h.hashes = append(h.hashes, prev)
		h.lens = append(h.lens, uint64(end-start))
	}
}

func (h *HigressApprox) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	eps := v.Snapshot.Endpoints
	n := len(eps)
	if n == 0 {
		return -1, scheduler.NoEndpoint
	}
	for len(h.lrus) < n {
		capacity := higressMaxCacheBlocks
		block := 16
		if i := len(h.lrus); i < len(v.Replicas) {
			c := v.Replicas[i].Config() // vllm:cache_config_info, which the plugin reads
			capacity, block = min(capacity, c.KVCapacityTokens/c.BlockSize), c.BlockSize
		}
		h.lrus = append(h.lrus, newWeightedLRU(capacity, block))
		h.inflight = append(h.inflight, 0)
	}
	target, tokens, id := promptOf(req, v)
	h.segment(target, tokens)

	h.queue, h.flight = growFloats(h.queue, n), growFloats(h.flight, n)
	for i := range eps {
		h.queue[i] = float64(eps[i].Metrics.WaitingQueueSize)
		h.flight[i] = float64(h.inflight[i])
	}
	minMaxLowerBetter(h.queue)
	minMaxLowerBetter(h.flight)
	h.scores = growFloats(h.scores, n)
	total := float64(len(tokens))
	best, ties := math.Inf(-1), 0
	for i := range eps {
		prefix := 0.0
		if total > 0 {
			matched := 0.0
			for k, hs := range h.hashes {
				if !h.lrus[i].has(hs) {
					break
				}
				matched += float64(h.lens[k])
			}
			prefix = 0.75*matched/total + 0.25*math.Pow(min(matched/higressPrefixLengthCap, 1), 2)
		}
		kv := 1 - min(max(eps[i].Metrics.KVCacheUsage, 0), 1)
		s := higressWeightQueue*h.queue[i] + higressWeightKV*kv + higressWeightPrefix*prefix + higressWeightInflight*h.flight[i]
		h.scores[i] = s
		switch {
		case s > best:
			best, ties = s, 1
		case s == best:
			ties++
		}
	}
	k := h.rand.IntN(ties)
	pick := -1
	for i, s := range h.scores {
		if s == best {
			if k == 0 {
				pick = i
				break
			}
			k--
		}
	}
	for k, hs := range h.hashes {
		h.lrus[pick].add(hs, h.lens[k])
	}
	h.inflight[pick]++
	h.routed[id] = pick
	return pick, scheduler.Routed
}

func (h *HigressApprox) FirstToken(Response) {}

// Finished ends the request's in-flight lease.
func (h *HigressApprox) Finished(r Response) {
	if i, ok := h.routed[r.ID]; ok {
		delete(h.routed, r.ID)
		h.inflight[i]--
	}
}

// minMaxLowerBetter maps v in place to [0,1], the lowest value 1 (all 1
// when they are equal).
func minMaxLowerBetter(v []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	for i, x := range v {
		if hi == lo {
			v[i] = 1
		} else {
			v[i] = (hi - x) / (hi - lo)
		}
	}
}

func growFloats(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

// weightedLRU is a set of segment hashes whose entries cost KV blocks,
// evicting the least recently recorded until the new entry fits.
type weightedLRU struct {
	capacity, used, block uint64
	entries               map[uint64]*lruEntry
	head, tail            *lruEntry // most and least recent
}

type lruEntry struct {
	hash, cost uint64
	prev, next *lruEntry
}

func newWeightedLRU(capacityBlocks, blockSize int) *weightedLRU {
	return &weightedLRU{capacity: uint64(max(capacityBlocks, 1)), block: uint64(max(blockSize, 1)), entries: map[uint64]*lruEntry{}}
}

func (l *weightedLRU) has(h uint64) bool { _, ok := l.entries[h]; return ok }

// add records h for a segment of tokens tokens (refreshing it if present).
func (l *weightedLRU) add(h, tokens uint64) {
	if e, ok := l.entries[h]; ok {
		l.unlink(e)
		l.pushFront(e)
		return
	}
	cost := (tokens + l.block - 1) / l.block
	for l.tail != nil && l.used+cost > l.capacity {
		old := l.tail
		l.unlink(old)
		delete(l.entries, old.hash)
		l.used -= old.cost
	}
	if cost > l.capacity {
		return
	}
	e := &lruEntry{hash: h, cost: cost}
	l.entries[h] = e
	l.used += cost
	l.pushFront(e)
}

func (l *weightedLRU) unlink(e *lruEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (l *weightedLRU) pushFront(e *lruEntry) {
	e.next = l.head
	if l.head != nil {
		l.head.prev = e
	}
	l.head = e
	if l.tail == nil {
		l.tail = e
	}
}
