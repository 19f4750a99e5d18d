package scheduler

import (
	"encoding/binary"
	"math"
	"time"
	"unsafe"

	"github.com/wasm-epp/wasm-epp/scheduler/internal/timewords"
)

// Flat decisions: the fast paths on values read from every endpoint for
// the one decision (snapIndex.flat), for metric churn that comes faster
// than decisions, when bringing the index up to date would not pay. One
// pass reads each endpoint's queue, running batch, KV-cache use and flags
// into the index's arrays (flatRead); each row of a decision tree is then
// one or two loops over a list of positions in snapshot order and those
// arrays, with the plugins' arithmetic on the same values, so the Result
// is the plugins' (same endpoint, path and random draws). Go's Wasm code
// pays for every call and every jump between basic blocks, which is most
// of what the plugins' scan costs there (an interface call per row, a
// pointer append per survivor, a string comparison call per adapter
// name): these loops store a position unconditionally and grow the list
// by a 0 or 1 the compiler turns into a select.

// flatPath is a fast path that can decide flat.
type flatPath interface {
	decideFlat(c *Cycle, x *snapIndex) int
}

var (
	_ flatPath = (*fastTree)(nil)
	_ flatPath = (*fastRandom)(nil)
	_ flatPath = (*fastRoundRobin)(nil)
	_ flatPath = (*fastLeastRequest)(nil)
)

// one is 1 for true and 0 for false.
func one(b bool) int {
	n := 0
	if b {
		n = 1
	}
	return n
}

// flatFresh writes the positions of the fresh endpoints into dst (whose
// capacity it grows to x.n).
func (x *snapIndex) flatFresh(dst []int32) []int32 {
	if cap(dst) < x.n {
		dst = make([]int32, x.n)
	}
	dst = dst[:x.n]
	if x.nFresh == x.n {
		for i := range dst {
			dst[i] = int32(i)
		}
		return dst
	}
	k := 0
	for i, f := range x.flags[:x.n] {
		dst[k] = int32(i)
		k += int(f & flagFresh)
	}
	return dst[:k]
}

// flatNth is the position of the k-th fresh endpoint in snapshot order.
func (x *snapIndex) flatNth(k int) int {
	if x.nFresh == x.n {
		return k
	}
	for i, f := range x.flags[:x.n] {
		if f&flagFresh != 0 {
			if k == 0 {
				return i
			}
			k--
		}
	}
	panic("scheduler: fewer fresh endpoints than counted") // the counts are the flags': a bug
}

func (f *fastRandom) decideFlat(c *Cycle, x *snapIndex) int {
	return x.flatNth(c.Rand.IntN(x.nFresh))
}

func (f *fastRoundRobin) decideFlat(_ *Cycle, x *snapIndex) int {
	k := int(f.picker.next % uint64(x.nFresh))
	f.picker.next++
	return x.flatNth(k)
}

func (f *fastLeastRequest) decideFlat(c *Cycle, x *snapIndex) int {
	best, ties := math.MaxInt, 0
	w, r := x.w[:x.n], x.r[:x.n]
	for i, fl := range x.flags[:x.n] {
		if fl&flagFresh == 0 {
			continue
		}
		switch o := w[i] + r[i]; {
		case o < best:
			best, ties = o, 1
		case o == best:
			ties++
		}
	}
	k := c.Rand.IntN(ties)
	for i, fl := range x.flags[:x.n] {
		if fl&flagFresh != 0 && w[i]+r[i] == best {
			if k == 0 {
				return i
			}
			k--
		}
	}
	panic("scheduler: least-request tie not found again")
}

// leastLoadedFlat is leastLoaded on the values: the least (outstanding,
// KV-cache use) and its ties in snapshot order.
func (x *snapIndex) leastLoadedFlat(c *Cycle) int {
	best, bestKV, ties := math.MaxInt, math.Inf(1), 0
	w, r, kv := x.w[:x.n], x.r[:x.n], x.kv[:x.n]
	for i, fl := range x.flags[:x.n] {
		if fl&flagFresh == 0 {
			continue
		}
		switch o, u := w[i]+r[i], kv[i]; {
		case o < best || o == best && u < bestKV:
			best, bestKV, ties = o, u, 1
		case o == best && u == bestKV:
			ties++
		}
	}
	k := 0
	if ties > 1 {
		k = c.Rand.IntN(ties)
	}
	for i, fl := range x.flags[:x.n] {
		if fl&flagFresh != 0 && w[i]+r[i] == best && kv[i] == bestKV {
			if k == 0 {
				return i
			}
			k--
		}
	}
	panic("scheduler: least-loaded tie not found again")
}

// decideFlat walks the tree as decide does, each row on a list of
// positions.
func (f *fastTree) decideFlat(c *Cycle, x *snapIndex) int {
	t := f.t
	node := f.root(c.Request)
	cur := x.flatFresh(f.flat[0])
	f.flat[0] = cur[:0]
	free := 1
	for node.step >= 0 {
		dst := f.flat[free]
		if cap(dst) < x.n {
			dst = make([]int32, x.n)
		}
		out := f.flatRow(c, x, &f.ops[node.step], cur, dst[:len(cur)])
		f.flat[free] = dst[:0]
		kept := len(out) > 0
		if kept {
			cur, free = out, free^1
		}
		node = t.advance(node, kept)
	}
	if t.end(c, node) || len(cur) == 0 {
		return -1
	}
	return int(cur[c.Rand.IntN(len(cur))])
}

// flatRow runs row op on the endpoints at positions cur (ascending) and
// returns those it keeps, written into dst (len(cur) long).
func (f *fastTree) flatRow(c *Cycle, x *snapIndex, op *treeOp, cur, dst []int32) []int32 {
	w, kv := x.w[:x.n], x.kv[:x.n]
	k := 0
	switch op.kind {
	case opLowQueue:
		q := op.queue
		for _, i := range cur {
			dst[k] = i
			k += one(w[i] <= q)
		}
	case opCapacity:
		cp := x.caps[op.capacity]
		for _, i := range cur {
			dst[k] = i
			k += one(w[i] <= cp.queue) & one(kv[i] <= cp.kv)
		}
	case opLoRA:
		return f.flatLoRA(c, x, op, cur, dst)
	case opLeastQueue:
		// LeastQueueFilter's band.
		lo, hi := math.MaxInt, 0
		for _, i := range cur {
			lo, hi = min(lo, w[i]), max(hi, w[i])
		}
		limit := lo + (hi-lo)/len(cur)
		for _, i := range cur {
			dst[k] = i
			k += one(w[i] <= limit)
		}
	case opLeastKV:
		// LeastKVCacheFilter's band (kv holds kvUsage, -0 as +0: the
		// same comparisons).
		lo, hi := math.MaxFloat64, 0.0
		for _, i := range cur {
			lo, hi = min(lo, kv[i]), max(hi, kv[i])
		}
		limit := lo + (hi-lo)/float64(len(cur))
		for _, i := range cur {
			dst[k] = i
			k += one(kv[i] <= limit)
		}
	}
	return dst[:k]
}

// flatRead reads every endpoint's values for a flat decision at oldest
// into the index's arrays, which leaves the index stale (rebuilt before
// its next use), and reports whether the fast paths' arithmetic holds for
// them (no flagBad).
func (x *snapIndex) flatRead(snap *Snapshot, oldest time.Time) bool {
	eps := snap.Endpoints[:x.n]
	w, r, kv, flags := x.w[:x.n], x.r[:x.n], x.kv[:x.n], x.flags[:x.n]
	// Freshness first, into the flags (see freshFlags: the loop below
	// then has no call).
	stale := 0
	if x.staleAfter > 0 {
		fa := newFreshAt(oldest)
		stale = freshFlags(eps, &fa, flags)
	} else {
		for i := range flags {
			flags[i] = flagFresh
		}
	}
	bad := 0
	for i := range eps {
		m := &eps[i].Metrics
		q, run, u := m.WaitingQueueSize, m.RunningQueueSize, kvValue(m.KVCacheUsage)
		u += 0 // -0 as +0
		w[i], r[i], kv[i] = q, run, u
		b := one(uint(q+badMagnitude) > 2*badMagnitude) | one(uint(run+badMagnitude) > 2*badMagnitude) | one(math.IsInf(u, 0))
		flags[i] |= uint8(one(len(m.ActiveModels)+len(m.WaitingModels) < m.MaxActiveModels)<<1 | b<<2)
		bad += b
	}
	x.nFresh, x.nStale, x.nBad = x.n-stale, stale, bad
	x.flat, x.stale = true, true
	x.flatReads++
	return bad == 0
}

// freshAt tests update times against the oldest fresh one as
// !t.Before(oldest) does, without Before's call and branches for a t
// without a monotonic reading (in the guest they cost more than the rest
// of a flat read). Before then compares wall clocks, which for such a t
// are its two words (seconds since year 1, nanoseconds), compared here
// with oldest's. The plugin's clock (time.Now) gives oldest a monotonic
// reading; the update times it reads from shared data have none.
type freshAt struct {
	oldest time.Time
	sec    int64  // oldest's wall clock: seconds since year 1
	nsec   uint64 // and nanoseconds
	// sec − 2³² and sec + 2³², saturated at the int64 limits: freshWall
	// clamps a time's seconds between them before subtracting sec.
	lo, hi int64
}

func newFreshAt(oldest time.Time) freshAt {
	w := oldest.Round(0) // the wall clock alone
	tw := timewords.Of(&w)
	fa := freshAt{oldest: oldest, sec: tw.Ext, nsec: tw.Wall, lo: math.MinInt64, hi: math.MaxInt64}
	if tw.Ext >= math.MinInt64+secondsClamp {
		fa.lo = tw.Ext - secondsClamp
	}
	if tw.Ext <= math.MaxInt64-secondsClamp {
		fa.hi = tw.Ext + secondsClamp
	}
	return fa
}

// secondsClamp bounds the seconds' difference freshWall works with: any
// bound of a second or more keeps its sign, and this one keeps the
// difference in freshWall's nanoseconds (2³⁰ a second) within ±2⁶².
const secondsClamp = 1 << 32

// monotonic reports whether t carries a monotonic reading.
func monotonic(t *time.Time) bool { return timewords.Of(t).Wall&timewords.HasMonotonic != 0 }

// freshWall is 1 when t, which carries no monotonic reading, is not
// before the oldest fresh time, else 0. (A function that also took the
// monotonic case would not be inlined; callers test monotonic first.)
func (fa *freshAt) freshWall(t *time.Time) int {
	tw := timewords.Of(t)
	// The sign of (t − oldest), a second counting 2³⁰ ns (more than the
	// nanoseconds' range, so the seconds decide unless equal). t's
	// seconds are clamped to oldest's ± 2³² before the subtraction, which
	// then cannot overflow; a t that is clamped lies more than 2³² s from
	// oldest (a bound saturated at an int64 limit clamps nothing), so the
	// difference keeps its sign.
	d := min(max(tw.Ext, fa.lo), fa.hi) - fa.sec
	return int(uint64(d<<30+int64(tw.Wall)-int64(fa.nsec))>>63) ^ 1
}

// freshMono is freshWall for a t with a monotonic reading, by Before.
//
//go:noinline
func (fa *freshAt) freshMono(t *time.Time) int { return one(!t.Before(fa.oldest)) }

// freshFlags writes into dst, one flag per endpoint of eps (callers size
// it: len(dst) == len(eps)), whether each is fresh at fa (1) or not (0),
// and returns the count of those that are not. Update times with a
// monotonic reading, which the plugin's never have, are compared by
// Before in a second loop, only when there are some: the first has no
// call, so in the guest it keeps its values out of memory.
func freshFlags(eps []Endpoint, fa *freshAt, dst []uint8) int {
	if len(dst) != len(eps) {
		panic("scheduler: freshFlags needs one flag per endpoint") // a caller's bug
	}
	dst = dst[:len(eps)] // (so the compiler drops the bounds checks)
	var mono uint64
	fresh := 0
	for i := range eps {
		t := &eps[i].Metrics.UpdateTime
		mono |= timewords.Of(t).Wall
		f := fa.freshWall(t)
		dst[i] = uint8(f)
		fresh += f
	}
	if mono&timewords.HasMonotonic != 0 {
		fresh = 0
		for i := range eps {
			if t := &eps[i].Metrics.UpdateTime; monotonic(t) {
				dst[i] = uint8(fa.freshMono(t))
			}
			fresh += int(dst[i])
		}
	}
	return len(eps) - fresh
}

// flatLoRA is LoRAAffinityFilter on the values: the affinity group holds
// the target adapter (active or waiting), the available group is the
// others with a free slot. An endpoint whose adapter lists are the very
// strings the index last read (the router's re-read keeps them when an
// agent's lists did not change) holds the target when the index's
// holders say so; another one's names are compared.
func (f *fastTree) flatLoRA(c *Cycle, x *snapIndex, op *treeOp, cur, dst []int32) []int32 {
	flags, eps, ads := x.flags[:x.n], c.Snapshot.Endpoints[:x.n], x.ads[:x.n]
	if cap(f.held) < x.n {
		f.held = make([]uint8, x.n)
	}
	held := f.held[:x.n]
	target := c.TargetModel()
	mark, marks := uint32(0), x.marks[:x.n]
	if a := x.adapter(target); a >= 0 {
		mark = x.markAll(x.holders[a])
	}
	affinity, available := 0, 0
	for _, i := range cur {
		m := &eps[i].Metrics
		var h int
		if sameStrings(m, ads[i]) {
			h = one(mark != 0 && marks[i] == mark)
		} else {
			h = one(listed(m.ActiveModels, target) || listed(m.WaitingModels, target))
		}
		held[i] = uint8(h)
		affinity += h
		available += (1 - h) & (int(flags[i]&flagFree) >> 1)
	}
	wantAffinity := affinity > 0
	if affinity > 0 && available > 0 && c.Rand.Float64() >= op.threshold {
		wantAffinity = false
	}
	k := 0
	if wantAffinity {
		for _, i := range cur {
			dst[k] = i
			k += int(held[i])
		}
	} else {
		for _, i := range cur {
			dst[k] = i
			k += (1 - int(held[i])) & (int(flags[i]&flagFree) >> 1)
		}
	}
	return dst[:k]
}

// sameStrings reports whether m lists the very strings (same bytes in
// memory) refs were read from, in the same order: then the index's
// holder lists are m's without comparing a name.
func sameStrings(m *Metrics, refs []adRef) bool {
	na := len(m.ActiveModels)
	if na+len(m.WaitingModels) != len(refs) {
		return false
	}
	same := 1
	for k, a := range m.ActiveModels {
		r := refs[k].name
		same &= one(unsafe.StringData(a) == unsafe.StringData(r)) & one(len(a) == len(r))
	}
	for k, a := range m.WaitingModels {
		r := refs[na+k].name
		same &= one(unsafe.StringData(a) == unsafe.StringData(r)) & one(len(a) == len(r))
	}
	return same != 0
}

// listed is contains(list, s) with equalString.
func listed(list []string, s string) bool {
	for _, v := range list {
		if equalString(v, s) {
			return true
		}
	}
	return false
}

// equalString is s == t without the runtime's comparison call for
// strings of 8 to 16 bytes (adapter names, mostly), compared as their
// first and last 8 bytes.
func equalString(s, t string) bool {
	n := len(s)
	if n != len(t) {
		return false
	}
	if n < 8 || n > 16 {
		return s == t
	}
	a, b := unsafe.Slice(unsafe.StringData(s), n), unsafe.Slice(unsafe.StringData(t), n)
	le := binary.LittleEndian
	return le.Uint64(a) == le.Uint64(b) && le.Uint64(a[n-8:]) == le.Uint64(b[n-8:])
}
