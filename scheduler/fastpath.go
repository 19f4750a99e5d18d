package scheduler

import (
	"math"
	"slices"
	"unsafe"
)

// The fast paths: profiles whose whole decision the snapshot index
// (index.go) answers without visiting every endpoint. Each gives exactly
// the Result the profile's plugins give on the same snapshot with the
// same random source (same endpoint, path and random draws): it computes
// the same minima, maxima, bands and counts the filters compute, from
// sorted orders, and picks the k-th survivor in snapshot order as the
// pickers do. Profiles built of other plugins, or in another arrangement,
// scan as before.
//
// Covered (any parameters, built-in or user profiles):
//   - decision-tree-filter with the seed's table (SeedTree) or any table
//     whose rows are low-queue, has-capacity, lora-affinity, least-queue
//     and least-kv-cache filters, then a picker without scorers;
//   - least-request-filter, then a picker without scorers;
//   - no filter and a picker without scorers (random), or round-robin;
//   - queue, KV-cache, LoRA affinity and running-requests scorers with any
//     weights, optionally after a shed-filter, and the max-score picker
//     (fastscore.go);
//   - prefix-affinity-filter, optionally after a shed-filter, with those
//     scorers and the prefix-cache scorer and the max-score picker
//     (fastprefix.go).
//
// Where a set cannot be described by one order and a key range (after a
// least-kv-cache step over several queue lengths, the affinity group of
// an adapter, a survivor set of several distinct loads) it is listed and
// the remaining steps run the plugins themselves on the list: exact
// always, and cheap because such sets are small.

// fastPath decides for one profile on the synced index.
type fastPath interface {
	// decide returns the chosen endpoint's position, or -1 when the
	// request was dropped (c.Dropped) or nothing was kept, or declined
	// (before drawing or setting anything) when the Scheduler must scan.
	decide(c *Cycle, x *snapIndex) int
}

// randomPicks reports whether p, without scorers, picks uniformly at
// random (c.Rand.IntN(len(candidates))).
func randomPicks(p Picker) bool {
	switch p.(type) {
	case *RandomPicker, *MaxScorePicker, *WeightedRandomPicker:
		return true
	}
	return false
}

// fastPathFor returns the fast path of profile p, registering the orders
// it reads in x; nil when p is not covered.
func fastPathFor(p *Profile, x *snapIndex) fastPath {
	if len(p.Scorers) > 0 {
		if _, ok := p.Picker.(*MaxScorePicker); !ok {
			return nil
		}
		if f := newFastScoring(p, x); f != nil {
			return f
		}
		if f := newFastPrefix(p, x); f != nil {
			return f
		}
		return nil
	}
	random := randomPicks(p.Picker)
	switch len(p.Filters) {
	case 0:
		if random {
			return &fastRandom{all: x.orderOf(keyPosition, -1, false)}
		}
		if rr, ok := p.Picker.(*RoundRobinPicker); ok {
			return &fastRoundRobin{picker: rr, all: x.orderOf(keyPosition, -1, false)}
		}
	case 1:
		if !random {
			return nil
		}
		switch f := p.Filters[0].(type) {
		case *LeastRequestFilter:
			return &fastLeastRequest{by: x.orderOf(keyOutstanding, -1, false)}
		case *DecisionTreeFilter:
			return newFastTree(f, x)
		}
	}
	return nil
}

// nth is the position of the k-th fresh endpoint in snapshot order.
func (x *snapIndex) nth(all, k int) int {
	if x.nFresh == x.n {
		return k
	}
	return int(x.ord(all).es[k].i)
}

type fastRandom struct{ all int }

func (f *fastRandom) decide(c *Cycle, x *snapIndex) int {
	if x.flat {
		return f.decideFlat(c, x)
	}
	return x.nth(f.all, c.Rand.IntN(x.nFresh))
}

type fastRoundRobin struct {
	picker *RoundRobinPicker
	all    int
}

func (f *fastRoundRobin) decide(c *Cycle, x *snapIndex) int {
	if x.flat {
		return f.decideFlat(c, x)
	}
	k := int(f.picker.next % uint64(x.nFresh))
	f.picker.next++
	return x.nth(f.all, k)
}

type fastLeastRequest struct{ by int }

func (f *fastLeastRequest) decide(c *Cycle, x *snapIndex) int {
	if x.flat {
		return f.decideFlat(c, x)
	}
	es := x.ord(f.by).es
	ties := es.searchAfter(keyAbove(es[0].a))
	return int(es[c.Rand.IntN(ties)].i)
}

// leastLoaded is Scheduler.LeastLoaded on the index: the first key of the
// (outstanding, KV-cache) order and its ties, in snapshot order.
func (x *snapIndex) leastLoaded(c *Cycle, by int) int {
	if x.flat {
		return x.leastLoadedFlat(c)
	}
	es := x.ord(by).es
	ties := es.searchAfter(entry{es[0].a, math.MaxInt32, es[0].b})
	k := 0
	if ties > 1 {
		k = c.Rand.IntN(ties)
	}
	return int(es[k].i)
}

// treeOp is a decision-tree row's filter as the fast path runs it.
type treeOp struct {
	kind      treeOpKind
	queue     int     // low-queue threshold
	capacity  int     // has-capacity: capacity class
	threshold float64 // lora-affinity
}

type treeOpKind uint8

const (
	opLowQueue treeOpKind = iota
	opCapacity
	opLoRA
	opLeastQueue
	opLeastKV
)

// fastTree runs a DecisionTreeFilter on the index.
type fastTree struct {
	t   *DecisionTreeFilter
	ops []treeOp // by row
	// loads[cap+1][free] is the (waiting, KV) order of the fresh
	// endpoints with capacity class cap (-1: all), free-slot only or not.
	loads [][2]int

	bufs [2][]*Endpoint
	pos  []int32
	flat [2][]int32 // decideFlat's position lists
	held []uint8    // flatLoRA's: whether each endpoint holds the target
}

func newFastTree(t *DecisionTreeFilter, x *snapIndex) *fastTree {
	f := &fastTree{t: t, ops: make([]treeOp, len(t.steps))}
	addLoads := func(c int) {
		f.loads = append(f.loads, [2]int{x.orderOf(keyLoad, c, false), x.orderOf(keyLoad, c, true)})
	}
	addLoads(-1)
	for i, st := range t.steps {
		switch p := st.Filter.(type) {
		case *LowQueueFilter:
			f.ops[i] = treeOp{kind: opLowQueue, queue: p.Threshold}
		case *HasCapacityFilter:
			c := x.capacityClass(p.QueueThreshold, p.KVCacheThreshold)
			f.ops[i] = treeOp{kind: opCapacity, capacity: c}
			for len(f.loads) < c+2 {
				addLoads(len(f.loads) - 1)
			}
		case *LoRAAffinityFilter:
			f.ops[i] = treeOp{kind: opLoRA, threshold: p.Threshold}
		case *LeastQueueFilter:
			f.ops[i] = treeOp{kind: opLeastQueue}
		case *LeastKVCacheFilter:
			f.ops[i] = treeOp{kind: opLeastKV}
		default:
			return nil
		}
	}
	return f
}

// span is a set of fresh endpoints described without listing them: the
// members of order o whose entries lie in [lo, hi].
type span struct {
	o      int
	cap    int // o's capacity class (-1: none)
	free   bool
	lo, hi entry
}

// resolved is a span located in its order: es[p0:p1].
type resolved struct {
	es     sortedEntries
	p0, p1 int
}

func (x *snapIndex) resolve(sp *span) resolved {
	r := resolved{es: x.ord(sp.o).es}
	r.p0 = r.es.search(sp.lo)
	r.p1 = max(r.es.searchAfter(sp.hi), r.p0)
	return r
}

func (r *resolved) count() int { return r.p1 - r.p0 }

// at returns the k-th member (0-based) in entry order.
func (r *resolved) at(k int) entry { return r.es[r.p0+k] }

func minOf(x, y entry) entry {
	if y.less(x) {
		return y
	}
	return x
}

func maxOf(x, y entry) entry {
	if x.less(y) {
		return y
	}
	return x
}

func (x *snapIndex) endpoint(c *Cycle, i int32) *Endpoint { return &c.Snapshot.Endpoints[i] }

// positionOf is e's position in the indexed snapshot.
func (x *snapIndex) positionOf(e *Endpoint) int {
	return int((uintptr(unsafe.Pointer(e)) - x.base) / unsafe.Sizeof(Endpoint{}))
}

// list writes the members of sp into dst in snapshot order, leaving out
// those marked with mark (0: none).
func (f *fastTree) list(c *Cycle, x *snapIndex, sp *span, mark uint32, dst []*Endpoint) []*Endpoint {
	r := x.resolve(sp)
	pos := f.pos[:0]
	for _, e := range r.es[r.p0:r.p1] {
		if mark == 0 || x.marks[e.i] != mark {
			pos = append(pos, e.i)
		}
	}
	slices.Sort(pos)
	for _, i := range pos {
		dst = append(dst, x.endpoint(c, i))
	}
	f.pos = pos
	return dst
}

// stepResult is what one row did to an indexed set.
type stepResult int

const (
	stepKept      stepResult = iota // the row kept endpoints: the returned span
	stepListed                      // it kept endpoints, listed in the returned slice
	stepEmpty                       // it kept none: the current set stays
	stepUnhandled                   // the set must be listed and the row's filter run on it
)

// step runs row op on the indexed set sp. A listed result is written to
// *buf (whose capacity it keeps).
func (f *fastTree) step(c *Cycle, x *snapIndex, op *treeOp, sp span, buf *[]*Endpoint) (span, []*Endpoint, stepResult) {
	switch op.kind {
	case opLowQueue:
		next := sp
		next.hi = minOf(sp.hi, keyAbove(wKey(op.queue)))
		if r := x.resolve(&next); r.count() == 0 {
			return sp, nil, stepEmpty
		}
		return next, nil, stepKept
	case opCapacity:
		if sp.cap >= 0 || sp.lo != minEntry || sp.hi != maxEntry {
			return sp, nil, stepUnhandled
		}
		next := span{o: f.loads[op.capacity+1][one(sp.free)], cap: op.capacity, free: sp.free, lo: minEntry, hi: maxEntry}
		if r := x.resolve(&next); r.count() == 0 {
			return sp, nil, stepEmpty
		}
		return next, nil, stepKept
	case opLoRA:
		return f.lora(c, x, op, sp, buf)
	case opLeastQueue:
		r := x.resolve(&sp)
		n := r.count()
		if n == 0 {
			return sp, nil, stepEmpty
		}
		lo := x.w[r.at(0).i]
		hi := max(0, x.w[r.at(n-1).i])
		limit := lo + (hi-lo)/n
		next := sp
		next.lo = maxOf(sp.lo, keyFrom(wKey(lo)))
		next.hi = minOf(sp.hi, keyAbove(wKey(limit)))
		return next, nil, stepKept
	case opLeastKV:
		r := x.resolve(&sp)
		n := r.count()
		if n == 0 {
			return sp, nil, stepEmpty
		}
		first, last := r.at(0), r.at(n-1)
		if first.a != last.a {
			return sp, nil, stepUnhandled // several queue lengths: KV order is per length
		}
		lo := x.kv[first.i]
		hi := max(0.0, x.kv[last.i])
		limit := lo + (hi-lo)/float64(n)
		next := sp
		next.lo = maxOf(sp.lo, entry{first.a, math.MinInt32, kvKey(lo)})
		next.hi = minOf(sp.hi, entry{first.a, math.MaxInt32, kvKey(limit)})
		return next, nil, stepKept
	}
	return sp, nil, stepUnhandled
}

// lora is the lora-affinity row: the affinity group (the current set's
// holders of the target adapter) is listed from the adapter's holders,
// so its cost is the number of holders; the available group (the others
// with a free slot) stays indexed unless holders must be left out of it.
func (f *fastTree) lora(c *Cycle, x *snapIndex, op *treeOp, sp span, buf *[]*Endpoint) (span, []*Endpoint, stepResult) {
	avail := sp
	avail.o, avail.free = f.loads[sp.cap+1][1], true
	ra := x.resolve(&avail)
	nAvail := ra.count()
	affinity := (*buf)[:0]
	heldAvail := 0
	var holders []int32
	if a := x.adapter(c.TargetModel()); a >= 0 {
		holders = x.holders[a]
		cur, fr := &x.orders[sp.o], &x.orders[avail.o]
		for _, h := range holders {
			if !x.member(cur, int(h)) {
				continue
			}
			if k := x.key(cur, int(h)); k.less(sp.lo) || sp.hi.less(k) {
				continue
			}
			affinity = append(affinity, x.endpoint(c, h))
			if x.member(fr, int(h)) {
				heldAvail++
			}
		}
		*buf = affinity[:0]
	}
	nAff := len(affinity)
	nAvail -= heldAvail
	wantAffinity := nAff > 0
	if nAff > 0 && nAvail > 0 && c.Rand.Float64() >= op.threshold {
		wantAffinity = false
	}
	switch {
	case wantAffinity:
		return sp, affinity, stepListed
	case nAvail == 0:
		return sp, nil, stepEmpty
	case heldAvail == 0:
		return avail, nil, stepKept
	}
	// The available group less the holders (rare with the seed's
	// threshold: both groups exist and the draw chose this one).
	mark := x.markAll(holders)
	listed := f.list(c, x, &avail, mark, (*buf)[:0])
	*buf = listed[:0]
	return sp, listed, stepListed
}

// treeWalk is where a walk of the tree is: an indexed span, or (once a
// row could not keep it indexed) a list in one of the two buffers.
type treeWalk struct {
	sp      span
	indexed bool
	current []*Endpoint
	free    int // the buffer not holding current
}

// row runs one row on the walk's set and reports whether it kept any.
func (f *fastTree) row(c *Cycle, x *snapIndex, step int, w *treeWalk) bool {
	if w.indexed {
		next, listed, res := f.step(c, x, &f.ops[step], w.sp, &f.bufs[w.free])
		switch res {
		case stepKept:
			w.sp = next
			return true
		case stepListed:
			w.current, w.free, w.indexed = listed, w.free^1, false
			return true
		case stepEmpty:
			return false
		}
		// Unhandled: list the set and run the row's own filter on it.
		w.current = f.list(c, x, &w.sp, 0, f.bufs[w.free][:0])
		f.bufs[w.free] = w.current[:0]
		w.free, w.indexed = w.free^1, false
	}
	out := f.t.steps[step].Filter.Filter(c, f.bufs[w.free][:0], w.current)
	f.bufs[w.free] = out[:0]
	if len(out) == 0 {
		return false
	}
	w.current, w.free = out, w.free^1
	return true
}

// root is the tree's first node for req: by its criticality (an unknown
// one as Sheddable), admitted or not.
func (f *fastTree) root(req *Request) *treeNode {
	t := f.t
	crit := req.Criticality
	if crit < Critical || crit > Sheddable {
		crit = Sheddable
	}
	root := t.roots[crit]
	if req.Admitted {
		root = t.admitted[crit]
	}
	return &t.nodes[root]
}

func (f *fastTree) decide(c *Cycle, x *snapIndex) int {
	if x.flat {
		return f.decideFlat(c, x)
	}
	t := f.t
	node := f.root(c.Request)
	w := treeWalk{sp: span{o: f.loads[0][0], cap: -1, lo: minEntry, hi: maxEntry}, indexed: true}
	for node.step >= 0 {
		kept := f.row(c, x, node.step, &w)
		if c.dropped {
			return -1
		}
		node = t.advance(node, kept)
	}
	if t.end(c, node) {
		return -1
	}
	if !w.indexed {
		if len(w.current) == 0 {
			return -1
		}
		return x.positionOf(w.current[c.Rand.IntN(len(w.current))])
	}
	r := x.resolve(&w.sp)
	n := r.count()
	if n == 0 {
		return -1
	}
	k := c.Rand.IntN(n)
	if r.at(0).sameKey(r.at(n - 1)) {
		return int(r.at(k).i) // one key: its entries are in snapshot order
	}
	list := f.list(c, x, &w.sp, 0, f.bufs[w.free][:0])
	f.bufs[w.free] = list[:0]
	return x.positionOf(list[k])
}
