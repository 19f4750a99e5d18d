package flowcontrol

import (
	"errors"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Band is a priority level of the queue: lower bands are served first.
type Band uint8

const (
	// BandStandard holds Standard requests.
	BandStandard Band = iota
	// BandSheddable holds Sheddable requests (and unknown criticalities).
	BandSheddable
	// NumBands is the number of bands.
	NumBands
)

func (b Band) String() string {
	switch b {
	case BandStandard:
		return "standard"
	case BandSheddable:
		return "sheddable"
	}
	return "unknown"
}

// BandFor is the band a request of criticality c waits in; false for
// Critical requests, which never wait. Unknown values wait as Sheddable,
// as the scheduler serves them.
func BandFor(c scheduler.Criticality) (Band, bool) {
	switch c {
	case scheduler.Critical:
		return 0, false
	case scheduler.Standard:
		return BandStandard, true
	}
	return BandSheddable, true
}

// Handle names one queued request. The zero Handle names none, and a
// Handle goes invalid when its request leaves the queue (slots are reused
// with a new generation), so a stale Handle never removes another request.
type Handle struct {
	idx int32
	gen uint32
}

// Valid reports whether h was returned by Push (it may have left since).
func (h Handle) Valid() bool { return h.gen != 0 }

// Entry is a queued request as Release, Expire and Remove hand it back.
type Entry[T any] struct {
	Handle Handle
	Value  T
	Band   Band
	// Bytes is the body size given to Push.
	Bytes int64
	// Waited is how long the request has been queued.
	Waited time.Duration
}

// Verdict is what a dispatch function did with the request it was offered.
type Verdict uint8

const (
	// Dispatched: the request was routed; it leaves the queue and counts
	// as released.
	Dispatched Verdict = iota
	// Blocked: no capacity for it now; it keeps its place, and its flow
	// keeps its turn.
	Blocked
	// Left: the request leaves the queue without being routed (for example
	// the scheduler found no endpoint at all and the caller answered 503).
	Left
)

// Errors of Push. Both mean "answer 429 as without flow control".
var (
	// ErrFull: the queue holds Config.MaxRequests requests.
	ErrFull = errors.New("flowcontrol: queue full (request count)")
	// ErrFullBytes: the body would take the held bytes past Config.MaxBytes.
	ErrFullBytes = errors.New("flowcontrol: queue full (body bytes)")
	// ErrBusy: Push or Remove was called from inside a Release or Expire
	// callback, which must not change the queue.
	ErrBusy = errors.New("flowcontrol: queue changed from inside its own callback")
)

// Stats are a Queue's counters since it was made, and its current size.
type Stats struct {
	// Len is the number of queued requests per band; Bytes their bodies.
	Len   [NumBands]int
	Bytes int64
	// Flows is the number of flows with a queued request.
	Flows int
	// Counters: Enqueued = Released + Expired + Abandoned + Left + queued.
	Enqueued, Released, Expired, Abandoned, Left uint64
	// RejectedFull counts Push calls refused by either bound.
	RejectedFull uint64
}

// maxBlockedProbes bounds how many blocked head requests one Release
// offers per band before giving up on it until the next call. With the
// decision tree, capacity does not depend on the request's model, so the
// first blocked head already says the band is blocked; a few more probes
// cover profiles whose filters do depend on it, without letting thousands
// of flows turn every release into thousands of scheduling calls.
const maxBlockedProbes = 8

// none marks an absent index in the linked lists.
const none int32 = -1

type item[T any] struct {
	value              T
	enqueued, deadline time.Duration
	bytes              int64
	gen                uint32
	flow               int32
	prev, next         int32 // FIFO of (flow, band); next links the free list
	heapPos            int32
	band               Band
}

// flow is one flow's FIFOs (one per band) and its places in the bands'
// round-robin rings. A flow without requests is idle: it stays in the key
// index (so a returning flow costs no allocation) until its record is
// needed for a new key.
type flow struct {
	key                string
	head, tail         [NumBands]int32
	n                  [NumBands]int32
	ringPrev, ringNext [NumBands]int32
	inRing             [NumBands]bool
	total              int32
	// idlePrev, idleNext link idle flows, oldest first; idleNext also
	// links the free records.
	idlePrev, idleNext int32
	idle               bool
}

// ring is a band's round-robin order of flows with queued requests: the
// head has the next turn.
type ring struct {
	head, tail int32
	n          int
}

// Queue holds requests of type T (what the caller needs to resume one: a
// stream id, a pointer). See the package documentation.
type Queue[T any] struct {
	maxRequests int
	maxBytes    int64

	items     []item[T]
	freeItems int32
	flows     []flow
	idleHead  int32
	idleTail  int32
	flowIndex map[string]int32
	rings     [NumBands]ring
	heap      []int32 // item indices, earliest deadline first
	lenBand   [NumBands]int
	active    int // flows with a queued request
	busy      bool
	stats     Stats
}

// New returns an empty queue bounded as cfg says (cfg.WithDefaults is
// applied; only MaxRequests and MaxBytes matter here).
func New[T any](cfg Config) (*Queue[T], error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	q := &Queue[T]{
		maxRequests: cfg.MaxRequests,
		maxBytes:    cfg.MaxBytes,
		freeItems:   none,
		idleHead:    none,
		idleTail:    none,
		flowIndex:   make(map[string]int32),
	}
	for b := range q.rings {
		q.rings[b] = ring{head: none, tail: none}
	}
	return q, nil
}

// Len is the number of queued requests.
func (q *Queue[T]) Len() int { return len(q.heap) }

// Stats returns the counters and current sizes.
func (q *Queue[T]) Stats() Stats {
	s := q.stats
	s.Len, s.Flows = q.lenBand, q.active
	return s
}

// BandLen is the number of requests queued in band b.
func (q *Queue[T]) BandLen(b Band) int {
	if b >= NumBands {
		return 0
	}
	return q.lenBand[b]
}

// Waiting reports whether a request of band b would arrive behind queued
// requests: some wait in b or a band served before it. Such a request
// should be queued too rather than scheduled at once, so it does not
// overtake them.
func (q *Queue[T]) Waiting(b Band) bool {
	for x := Band(0); x <= b && x < NumBands; x++ {
		if q.rings[x].n > 0 {
			return true
		}
	}
	return false
}

// Push queues v in band b and flow key (FlowKey bounds it; the empty key
// is the anonymous flow) with a body of size bytes, until now+ttl. It
// fails with ErrFull or ErrFullBytes when a bound would be passed, and
// with ErrBusy from inside a callback. The key is copied only when the
// flow is new.
func (q *Queue[T]) Push(b Band, key []byte, bytes int64, now, ttl time.Duration, v T) (Handle, error) {
	if err := q.room(bytes); err != nil {
		return Handle{}, err
	}
	fi, ok := q.flowIndex[string(key)] // no allocation for the lookup
	if !ok {
		fi = q.newFlow(string(key))
	}
	return q.push(b, fi, bytes, now, ttl, v), nil
}

// PushString is Push with the flow key as a string (a model name), which
// it never copies.
func (q *Queue[T]) PushString(b Band, key string, bytes int64, now, ttl time.Duration, v T) (Handle, error) {
	if err := q.room(bytes); err != nil {
		return Handle{}, err
	}
	fi, ok := q.flowIndex[key]
	if !ok {
		fi = q.newFlow(key)
	}
	return q.push(b, fi, bytes, now, ttl, v), nil
}

// room checks that a request of bytes fits both bounds.
func (q *Queue[T]) room(bytes int64) error {
	switch {
	case q.busy:
		return ErrBusy
	case len(q.heap) >= q.maxRequests:
		q.stats.RejectedFull++
		return ErrFull
	case max(bytes, 0) > q.maxBytes-q.stats.Bytes:
		q.stats.RejectedFull++
		return ErrFullBytes
	}
	return nil
}

func (q *Queue[T]) push(b Band, fi int32, bytes int64, now, ttl time.Duration, v T) Handle {
	if b >= NumBands {
		b = BandSheddable
	}
	bytes = max(bytes, 0)
	ii := q.allocItem()
	it := &q.items[ii]
	it.value, it.enqueued, it.deadline, it.bytes = v, now, now+max(ttl, 0), bytes
	it.flow, it.band = fi, b
	it.gen++
	if it.gen == 0 {
		it.gen = 1
	}
	f := &q.flows[fi]
	// Append to the flow's FIFO of band b.
	it.prev, it.next = f.tail[b], none
	if f.tail[b] != none {
		q.items[f.tail[b]].next = ii
	} else {
		f.head[b] = ii
	}
	f.tail[b] = ii
	f.n[b]++
	if f.total == 0 {
		q.unlinkIdle(fi)
		q.active++
	}
	f.total++
	q.lenBand[b]++
	if !f.inRing[b] {
		q.ringAppend(b, fi)
	}
	q.heapPush(ii)
	q.stats.Bytes += bytes
	q.stats.Enqueued++
	return Handle{idx: ii, gen: it.gen}
}

// Remove takes the request h names out of the queue (its client went
// away) and counts it as abandoned. It reports false when h is not queued
// (already released, expired or removed).
func (q *Queue[T]) Remove(h Handle, now time.Duration) (Entry[T], bool) {
	if q.busy {
		return Entry[T]{}, false
	}
	if !q.queued(h) {
		return Entry[T]{}, false
	}
	e := q.take(h.idx, now)
	q.stats.Abandoned++
	return e, true
}

// Contains reports whether h names a queued request.
func (q *Queue[T]) Contains(h Handle) bool { return q.queued(h) }

func (q *Queue[T]) queued(h Handle) bool {
	if h.gen == 0 || h.idx < 0 || int(h.idx) >= len(q.items) {
		return false
	}
	it := &q.items[h.idx]
	return it.gen == h.gen && it.heapPos >= 0
}

// NextDeadline is the earliest deadline of a queued request; false when
// the queue is empty.
func (q *Queue[T]) NextDeadline() (time.Duration, bool) {
	if len(q.heap) == 0 {
		return 0, false
	}
	return q.items[q.heap[0]].deadline, true
}

// Expire removes every request whose deadline is at or before now, earliest
// first, handing each to fn (which answers its client) and counting it as
// expired. It returns how many expired. fn must not call Push or Remove.
func (q *Queue[T]) Expire(now time.Duration, fn func(Entry[T])) int {
	n := 0
	for len(q.heap) > 0 && q.items[q.heap[0]].deadline <= now {
		e := q.take(q.heap[0], now)
		q.stats.Expired++
		n++
		if fn != nil {
			q.busy = true
			fn(e)
			q.busy = false
		}
	}
	return n
}

// Release offers queued requests to dispatch in order (band, then flows
// round-robin, then FIFO) until every band is empty or blocked: a band is
// given up after maxBlockedProbes Blocked verdicts in one call, or when
// each of its flows was blocked once. It returns how many were Dispatched.
// dispatch must not call Push or Remove; it sees the request still queued
// (Entry.Waited up to now), and the queue applies its verdict afterwards.
func (q *Queue[T]) Release(now time.Duration, dispatch func(Entry[T]) Verdict) int {
	released := 0
	for b := Band(0); b < NumBands; b++ {
		r := &q.rings[b]
		probes := 0
		// cursor walks the ring; a blocked flow keeps its place (and so
		// its turn at the next Release), a served one moves to the tail.
		cursor := r.head
		blockedRun := 0 // consecutive blocked flows; a full lap ends the band
		for cursor != none && probes < maxBlockedProbes && blockedRun < r.n {
			fi := cursor
			f := &q.flows[fi]
			ii := f.head[b]
			it := &q.items[ii]
			e := Entry[T]{Handle: Handle{idx: ii, gen: it.gen}, Value: it.value, Band: b, Bytes: it.bytes, Waited: now - it.enqueued}
			q.busy = true
			v := dispatch(e)
			q.busy = false
			if v == Blocked {
				probes++
				blockedRun++
				cursor = f.ringNext[b]
				if cursor == none {
					cursor = r.head // wrap: flows served meanwhile moved to the tail
				}
				continue
			}
			blockedRun = 0
			next := f.ringNext[b]
			q.take(ii, now) // removes fi from the ring when its band FIFO empties
			if f.n[b] > 0 { // served: the flow's next request waits for its next turn
				q.ringRemove(b, fi)
				q.ringAppend(b, fi)
			}
			if next == none {
				next = r.head
			}
			cursor = next
			if v == Dispatched {
				q.stats.Released++
				released++
			} else {
				q.stats.Left++
			}
		}
	}
	return released
}

// take unlinks item ii from its flow, band ring, heap and the byte count,
// frees its slot, and returns it as an Entry.
func (q *Queue[T]) take(ii int32, now time.Duration) Entry[T] {
	it := &q.items[ii]
	b, fi := it.band, it.flow
	e := Entry[T]{Handle: Handle{idx: ii, gen: it.gen}, Value: it.value, Band: b, Bytes: it.bytes, Waited: now - it.enqueued}
	f := &q.flows[fi]
	if it.prev != none {
		q.items[it.prev].next = it.next
	} else {
		f.head[b] = it.next
	}
	if it.next != none {
		q.items[it.next].prev = it.prev
	} else {
		f.tail[b] = it.prev
	}
	f.n[b]--
	f.total--
	q.lenBand[b]--
	if f.n[b] == 0 {
		q.ringRemove(b, fi)
	}
	if f.total == 0 {
		q.linkIdle(fi)
		q.active--
	}
	q.heapRemove(ii)
	q.stats.Bytes -= it.bytes
	var zero T
	it.value = zero // the queue keeps no reference to what left
	it.next = q.freeItems
	it.prev = none
	q.freeItems = ii
	return e
}

func (q *Queue[T]) allocItem() int32 {
	if q.freeItems != none {
		ii := q.freeItems
		q.freeItems = q.items[ii].next
		return ii
	}
	q.items = append(q.items, item[T]{heapPos: -1})
	return int32(len(q.items) - 1)
}

// newFlow makes the flow of a key not in the index. It takes a new record
// while there are fewer than maxRequests, else the longest-idle one (whose
// key leaves the index): room has checked that fewer than maxRequests
// requests are queued, so fewer flows are active and an idle one exists.
func (q *Queue[T]) newFlow(key string) int32 {
	var fi int32
	switch {
	case len(q.flows) < q.maxRequests:
		q.flows = append(q.flows, flow{})
		fi = int32(len(q.flows) - 1)
	default:
		fi = q.idleHead
		q.unlinkIdle(fi)
		delete(q.flowIndex, q.flows[fi].key)
	}
	f := &q.flows[fi]
	*f = flow{key: key, idlePrev: none, idleNext: none}
	for b := range f.head {
		f.head[b], f.tail[b], f.ringPrev[b], f.ringNext[b] = none, none, none, none
	}
	q.flowIndex[f.key] = fi
	q.linkIdle(fi) // idle until Push gives it a request (Push unlinks it)
	return fi
}

func (q *Queue[T]) linkIdle(fi int32) {
	f := &q.flows[fi]
	f.idle, f.idlePrev, f.idleNext = true, q.idleTail, none
	if q.idleTail != none {
		q.flows[q.idleTail].idleNext = fi
	} else {
		q.idleHead = fi
	}
	q.idleTail = fi
}

func (q *Queue[T]) unlinkIdle(fi int32) {
	f := &q.flows[fi]
	if !f.idle {
		return
	}
	if f.idlePrev != none {
		q.flows[f.idlePrev].idleNext = f.idleNext
	} else {
		q.idleHead = f.idleNext
	}
	if f.idleNext != none {
		q.flows[f.idleNext].idlePrev = f.idlePrev
	} else {
		q.idleTail = f.idlePrev
	}
	f.idle, f.idlePrev, f.idleNext = false, none, none
}

func (q *Queue[T]) ringAppend(b Band, fi int32) {
	r, f := &q.rings[b], &q.flows[fi]
	f.ringPrev[b], f.ringNext[b], f.inRing[b] = r.tail, none, true
	if r.tail != none {
		q.flows[r.tail].ringNext[b] = fi
	} else {
		r.head = fi
	}
	r.tail = fi
	r.n++
}

func (q *Queue[T]) ringRemove(b Band, fi int32) {
	r, f := &q.rings[b], &q.flows[fi]
	if !f.inRing[b] {
		return
	}
	if f.ringPrev[b] != none {
		q.flows[f.ringPrev[b]].ringNext[b] = f.ringNext[b]
	} else {
		r.head = f.ringNext[b]
	}
	if f.ringNext[b] != none {
		q.flows[f.ringNext[b]].ringPrev[b] = f.ringPrev[b]
	} else {
		r.tail = f.ringPrev[b]
	}
	f.ringPrev[b], f.ringNext[b], f.inRing[b] = none, none, false
	r.n--
}

// The deadline heap: a binary min-heap of item indices keyed by deadline,
// ties broken by enqueue order (earlier first), each item knowing its
// position so Remove is O(log n).

func (q *Queue[T]) less(a, b int32) bool {
	x, y := &q.items[a], &q.items[b]
	if x.deadline != y.deadline {
		return x.deadline < y.deadline
	}
	return x.enqueued < y.enqueued
}

func (q *Queue[T]) heapPush(ii int32) {
	q.heap = append(q.heap, ii)
	q.items[ii].heapPos = int32(len(q.heap) - 1)
	q.up(len(q.heap) - 1)
}

func (q *Queue[T]) heapRemove(ii int32) {
	i := int(q.items[ii].heapPos)
	last := len(q.heap) - 1
	if i != last {
		q.swap(i, last)
	}
	q.heap = q.heap[:last]
	q.items[ii].heapPos = -1
	if i != last {
		if !q.down(i) {
			q.up(i)
		}
	}
}

func (q *Queue[T]) swap(i, j int) {
	q.heap[i], q.heap[j] = q.heap[j], q.heap[i]
	q.items[q.heap[i]].heapPos = int32(i)
	q.items[q.heap[j]].heapPos = int32(j)
}

func (q *Queue[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(q.heap[i], q.heap[p]) {
			return
		}
		q.swap(i, p)
		i = p
	}
}

// down sifts position i down and reports whether it moved.
func (q *Queue[T]) down(i int) bool {
	start, n := i, len(q.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && q.less(q.heap[r], q.heap[l]) {
			c = r
		}
		if !q.less(q.heap[c], q.heap[i]) {
			break
		}
		q.swap(i, c)
		i = c
	}
	return i > start
}
