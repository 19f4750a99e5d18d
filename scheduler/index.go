package scheduler

import (
	"math"
	"slices"
	"time"
	"unsafe"
)

// DefaultIndexMinEndpoints is Options.IndexMinEndpoints's default: below
// it a scan of every endpoint costs about what the index saves (measured
// in BENCHMARKS.md), and small snapshots then cost nothing to keep.
const DefaultIndexMinEndpoints = 128

// snapIndex is a Scheduler's index of the snapshot it last decided on: the
// values the fast paths (fastpath.go) compare, copied once per change;
// sorted orders of the fresh endpoints by those values; and the endpoints
// holding each adapter. A decision on an indexed snapshot reads a few
// positions of the orders instead of every endpoint.
//
// It follows its snapshot through Snapshot.MetricsChanged and Changed (and
// through Scheduler.Observe, which updates it directly): one changed
// endpoint costs its removal from and insertion into each order built so
// far, so a refresh that rewrites a few endpoints costs what it rewrote.
// Orders are built on first use after a rebuild, so an order no profile
// asks for costs nothing. Freshness is kept against one point in time
// (oldest) and re-evaluated only when the clock has moved past the oldest
// fresh or the newest stale update time.
type snapIndex struct {
	id   uint64  // Snapshot.identity; 0: nothing indexed
	base uintptr // address of Endpoints[0], to recognise Observe's results
	n    int
	gen  uint64 // the snapshot's change generation applied

	staleAfter time.Duration
	oldest     time.Time // fresh: update time not before oldest
	// minFresh is at most the oldest update time of a fresh endpoint,
	// maxStale at least the newest of a stale one.
	minFresh, maxStale   time.Time
	nFresh, nStale, nBad int

	// Per endpoint, the values indexed.
	w, r  []int
	kv    []float64 // kvUsage, -0 as +0
	upd   []time.Time
	flags []uint8
	ads   [][]adRef // the adapter names as last read, active then waiting (into arena)
	arena []adRef
	spare []adRef // compactArena's other arena
	// arenaCompact is the arena's length after the last build or
	// compaction.
	arenaCompact int
	marks        []uint32 // markAll's stamps
	mark         uint32

	adapterID map[string]int32
	names     []string  // by adapter id
	holders   [][]int32 // by adapter id: positions of the endpoints holding it, ascending
	freeIDs   []int32   // ids no endpoint holds

	caps   []capacity
	orders []order

	// flat says the decision in progress is made on values read for it
	// alone (flatRead): metric churn came faster than decisions, so the
	// index is not brought up to date. stale says those reads overwrote
	// the index's values: it is rebuilt before any other use.
	flat, stale bool

	wait waiting // the state a rebuild is waiting for a second decision on
	// looks counts the decisions since wait was set; churnRun is what it
	// reached when the latest metric churn replaced the state before.
	looks, churnRun int
	// eager rebuilds at once (tests and benchmarks of the rebuild).
	eager bool

	// rebuilds, updates and decisions count the index's work (tests,
	// benchmarks); flatReads the decisions made flat.
	rebuilds, updates, decisions, flatReads int
}

// capacity is one has-capacity test (waiting ≤ queue, KV-cache use ≤ kv).
type capacity struct {
	queue int
	kv    float64
}

// order is the fresh endpoints of one kind sorted by one key.
type order struct {
	key  keyKind
	cap  int  // index into caps: only endpoints with that capacity; -1: every fresh endpoint
	free bool // only endpoints with a free adapter slot
	// from is the order of every fresh endpoint by the same key, which
	// this one is a subset of (built by filtering it); -1 for that order.
	from  int
	built bool
	es    sortedEntries
	// sum is the members' outstanding requests (waiting + running).
	sum int
	// score and nu are a keyScore order's scorers and the normalisation
	// its keys were computed with.
	score *scoreSpec
	nu    norm
}

type keyKind uint8

const (
	keyLoad        keyKind = iota // waiting queue, then KV-cache usage
	keyOutstanding                // waiting + running
	keyLeastLoaded                // waiting + running, then KV-cache usage
	keyPosition                   // snapshot order only
	keyRunning                    // running batch
	keyScore                      // a scoring profile's score (fastscore.go), highest first
)

const (
	flagFresh uint8 = 1 << iota
	flagFree        // a free adapter slot: active + waiting < max
	flagBad         // values whose arithmetic the fast paths do not reproduce
)

// badMagnitude bounds the queue lengths the index orders (keys are 32
// bits, and a sum of two must fit).
const badMagnitude = 1 << 29

func newSnapIndex(staleAfter time.Duration) *snapIndex {
	return &snapIndex{staleAfter: staleAfter, adapterID: map[string]int32{}}
}

// capacityClass returns the id of a has-capacity test, adding it.
func (x *snapIndex) capacityClass(queue int, kv float64) int {
	for i, c := range x.caps {
		if c.queue == queue && c.kv == kv {
			return i
		}
	}
	x.caps = append(x.caps, capacity{queue, kv})
	return len(x.caps) - 1
}

// orderOf returns the id of an order, adding it.
func (x *snapIndex) orderOf(key keyKind, cap int, free bool) int {
	for i, o := range x.orders {
		if o.key == key && o.cap == cap && o.free == free {
			return i
		}
	}
	from := -1
	if cap >= 0 || free {
		from = x.orderOf(key, -1, false)
	}
	x.orders = append(x.orders, order{key: key, cap: cap, free: free, from: from})
	return len(x.orders) - 1
}

// scoreOrderOf returns the id of the score order of spec over capacity
// class cap, adding it.
func (x *snapIndex) scoreOrderOf(cap int, spec *scoreSpec) int {
	for i, o := range x.orders {
		if o.key == keyScore && o.cap == cap && o.score == spec {
			return i
		}
	}
	x.orders = append(x.orders, order{key: keyScore, cap: cap, from: -1, score: spec})
	return len(x.orders) - 1
}

func endpointsBase(snap *Snapshot) uintptr {
	if len(snap.Endpoints) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&snap.Endpoints[0]))
}

// sync brings the index up to date with snap for a decision at the
// cycle's time, and reports whether the fast paths may decide on it;
// flatOK says the decision's fast path can also decide flat (x.flat).
//
// Changes to a few endpoints are applied one by one. A new snapshot, a
// Changed one, or more changes than are worth applying one by one need a
// rebuild, which costs a few scans of the snapshot (BENCHMARKS.md): it is
// made on the second decision that finds the same endpoints (after metric
// churn: the same metrics), and the first one scans. Metric churn that
// came again within fewer than churnBuildLooks decisions waits for that
// many looks instead (a router re-reading relays that rewrite most
// endpoints, with a few requests between two relays, would otherwise pay
// a scan and a rebuild per relay instead of a few scans). Churn followed
// by only a few changes counts as the same metrics (settled). Changes that
// come faster than decisions are therefore scanned as they were without
// an index, and an index is only paid for when decisions will use it.
//
// A decision that waits for a rebuild after metric churn, and whose fast
// path can decide flat, reads the values it needs from every endpoint
// into the index's arrays instead (flatRead) and decides on them without
// the orders (fastflat.go): the same result as the plugins' scan, for a
// fraction of its cost in the guest (BENCHMARKS.md).
func (x *snapIndex) sync(snap *Snapshot, c *Cycle, flatOK bool) bool {
	x.looks++
	x.flat = false
	id := snap.identity()
	var oldest time.Time
	if x.staleAfter > 0 {
		oldest = c.Now().Add(-x.staleAfter)
	}
	l := &snap.changes
	rebuild := id != x.id || len(snap.Endpoints) != x.n || endpointsBase(snap) != x.base || l.all > x.gen
	churn := false // more metric changes than are worth applying one by one
	if !rebuild && l.gen != x.gen {
		churn = x.churned(l)
		rebuild = churn
		if !rebuild && !x.stale {
			x.applyChanges(snap)
		}
	}
	rebuild = rebuild || x.stale // (a flat read leaves churn pending: rebuild is set)
	if rebuild {
		// A new or Changed snapshot waits for a second look at the same
		// endpoints: metric changes reported in between are applied one by
		// one after the build, so an owner that reports one per decision
		// (flow control's room count) still gets an index. Metric churn
		// waits for a second look at the same metrics.
		w := waiting{id, l.all, churn, len(snap.Endpoints), endpointsBase(snap)}
		if churn {
			w.gen = l.gen
		}
		if w != x.wait && x.settled(w) {
			x.wait.gen = w.gen // the same metrics: a look at them, from here
		}
		if w != x.wait && !x.eager {
			if churn {
				x.churnRun = x.looks - 1
			}
			x.wait, x.looks = w, 1
			return churn && flatOK && x.flatRead(snap, oldest)
		}
		if churn && !x.eager && x.churnRun < churnBuildLooks && x.looks < churnBuildLooks {
			// churn faster than decisions: a rebuild would not pay
			return flatOK && x.flatRead(snap, oldest)
		}
		x.build(snap, id, oldest)
	}
	if x.staleAfter > 0 && !x.freshAt(oldest) {
		x.reevaluate(snap, oldest)
	}
	return x.nBad == 0
}

// settled reports whether churn state w is the metric churn the index
// waits on (x.wait) followed by no more changes than are worth applying
// one by one: the churn stopped, and what came since is what the index,
// once built, follows change by change (heartbeats after a full relay).
// sync counts it as another look at the state it waits on, and counts
// later changes from there. Without it, an index behind by churn stays
// behind for as long as each decision finds a few new changes (a relay of
// heartbeats per decision), as the pending changes are counted from the
// index's own generation, which only a build advances.
func (x *snapIndex) settled(w waiting) bool {
	v := x.wait
	if !w.churn || !v.churn || w.id != v.id || w.n != v.n || w.base != v.base || w.gen < v.gen {
		return false
	}
	return w.gen-v.gen <= uint64(oneByOne(x.n))
}

// churned reports whether more metric changes are pending in l than are
// worth applying one by one.
func (x *snapIndex) churned(l *changeLog) bool {
	pending := l.gen - x.gen
	return pending > uint64(len(l.ring)) || pending > uint64(oneByOne(x.n))
}

// applyChanges applies the metric changes reported since the index last
// followed its snapshot, one by one.
func (x *snapIndex) applyChanges(snap *Snapshot) {
	l := &snap.changes
	for g := x.gen + 1; g <= l.gen; g++ {
		i := int(l.ring[g%uint64(len(l.ring))])
		x.update(&snap.Endpoints[i], i)
	}
	x.gen = l.gen
}

// prepare is the part of sync that needs no decision: the metric changes
// of the snapshot the index follows, when sync would apply them one by
// one. Anything else (another or Changed snapshot, churn, a flat read
// pending) is left to the next decision's sync, which judges whether a
// rebuild pays; nothing counts as a look.
func (x *snapIndex) prepare(snap *Snapshot) {
	l := &snap.changes
	if x.id == 0 || x.stale || l.gen == x.gen || snap.identity() != x.id || len(snap.Endpoints) != x.n ||
		endpointsBase(snap) != x.base || l.all > x.gen || x.churned(l) {
		return
	}
	x.applyChanges(snap)
}

// churnBuildLooks is how many decisions metric churn must leave to a
// rebuild for it to pay: a rebuild costs about four scanning decisions
// (BENCHMARKS.md). After churn that replaced the previous state sooner,
// the index is rebuilt only on this many looks at the same metrics;
// otherwise on the second.
const churnBuildLooks = 4

// waiting names the snapshot state a rebuild waits to see twice.
type waiting struct {
	id, gen uint64
	churn   bool
	n       int
	base    uintptr
}

// covers reports whether res chose an endpoint of the indexed snapshot.
func (x *snapIndex) covers(res Result) bool {
	return x.id != 0 && !x.stale && res.Index >= 0 && res.Index < x.n &&
		uintptr(unsafe.Pointer(res.Endpoint)) == x.base+uintptr(res.Index)*unsafe.Sizeof(Endpoint{})
}

func (x *snapIndex) build(snap *Snapshot, id uint64, oldest time.Time) {
	n := len(snap.Endpoints)
	// Endpoints past the new end leave their adapters; the others keep
	// what they held until setAdapters finds a difference, so a snapshot
	// whose endpoints list the same adapters as the last one costs no
	// adapter lookups.
	for i := n; i < x.n; i++ {
		for _, r := range x.ads[i] {
			if r.id >= 0 {
				x.leave(r.id, int32(i))
			}
		}
		x.ads[i] = nil
	}
	x.id, x.n, x.base, x.gen, x.oldest = id, n, endpointsBase(snap), snap.changes.gen, oldest
	x.nFresh, x.nStale, x.nBad = 0, 0, 0
	x.w, x.r, x.kv = resize(x.w, n), resize(x.r, n), resize(x.kv, n)
	x.upd, x.flags, x.ads, x.marks = resize(x.upd, n), resize(x.flags, n), resize(x.ads, n), resize(x.marks, n)
	for i := range x.orders {
		x.orders[i].built = false
	}
	for i := range snap.Endpoints {
		x.load(&snap.Endpoints[i], i)
	}
	x.stale = false
	x.rebuilds++
}

// resize returns s with length n, keeping its elements (new ones zero).
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		t := make([]T, n)
		copy(t, s)
		return t
	}
	s = s[:n]
	return s
}

// update re-reads endpoint i after a change.
func (x *snapIndex) update(e *Endpoint, i int) {
	m := &e.Metrics
	valuesMoved := m.WaitingQueueSize != x.w[i] || m.RunningQueueSize != x.r[i] || indexedKV(e) != x.kv[i] ||
		x.flags[i]&flagFree != freeFlag(m) || !sameAdapters(m, x.ads[i])
	if valuesMoved || !m.UpdateTime.Equal(x.upd[i]) && !x.retime(m.UpdateTime, i) {
		x.reload(e, i)
		x.updates++
	}
}

// retime takes a new update time t for endpoint i whose values are
// unchanged (a heartbeat, or a block resent with the same values), when
// it leaves the endpoint as fresh or stale as it was: no order's key holds
// the time, so only the time and the freshness bounds move. It reports
// false when the freshness would flip (then the caller reloads).
func (x *snapIndex) retime(t time.Time, i int) bool {
	fresh := x.staleAfter <= 0 || !t.Before(x.oldest)
	if fresh != (x.flags[i]&flagFresh != 0) {
		return false
	}
	x.upd[i] = t
	if fresh {
		if t.Before(x.minFresh) {
			x.minFresh = t
		}
	} else if x.maxStale.Before(t) {
		x.maxStale = t
	}
	return true
}

// reload reads endpoint i again and moves it in the built orders: an
// entry whose key is unchanged stays, one whose key changed moves only
// past the entries between its old and new place.
func (x *snapIndex) reload(e *Endpoint, i int) {
	was := indexed{x.w[i], x.r[i], x.kv[i], x.flags[i]}
	x.uncount(i)
	x.load(e, i)
	now := indexed{x.w[i], x.r[i], x.kv[i], x.flags[i]}
	for k := range x.orders {
		o := &x.orders[k]
		if !o.built {
			continue
		}
		in, wasIn := x.admits(o, now), x.admits(o, was)
		switch {
		case wasIn && in:
			o.es.move(o.keyOf(was, i), o.keyOf(now, i))
			o.sum += now.w + now.r - was.w - was.r
		case wasIn:
			o.es.remove(o.keyOf(was, i))
			o.sum -= was.w + was.r
		case in:
			o.es.insert(o.keyOf(now, i))
			o.sum += now.w + now.r
		}
	}
}

// indexed is what the orders know of one endpoint.
type indexed struct {
	w, r  int
	kv    float64
	flags uint8
}

// keyOf is the entry of an endpoint with values v at position i in o.
func (o *order) keyOf(v indexed, i int) entry {
	switch o.key {
	case keyLoad:
		return entry{wKey(v.w), int32(i), kvKey(v.kv)}
	case keyOutstanding:
		return entry{wKey(v.w + v.r), int32(i), 0}
	case keyLeastLoaded:
		return entry{wKey(v.w + v.r), int32(i), kvKey(v.kv)}
	case keyRunning:
		return entry{wKey(v.r), int32(i), 0}
	case keyScore:
		return scoreEntry(o.score.defaultScore(&o.nu, v), i)
	}
	return entry{0, int32(i), 0}
}

// admits reports whether an endpoint with values v belongs in order o.
func (x *snapIndex) admits(o *order, v indexed) bool {
	if v.flags&flagFresh == 0 || (o.free && v.flags&flagFree == 0) {
		return false
	}
	if o.cap >= 0 {
		c := &x.caps[o.cap]
		return v.w <= c.queue && v.kv <= c.kv
	}
	return true
}

// uncount takes endpoint i out of the counts.
func (x *snapIndex) uncount(i int) {
	f := x.flags[i]
	if f&flagFresh != 0 {
		x.nFresh--
	} else {
		x.nStale--
	}
	if f&flagBad != 0 {
		x.nBad--
	}
}

// load reads endpoint i's values, flags and adapters, and counts it; the
// orders are the caller's business.
func (x *snapIndex) load(e *Endpoint, i int) {
	m := &e.Metrics
	x.w[i], x.r[i], x.kv[i], x.upd[i] = m.WaitingQueueSize, m.RunningQueueSize, indexedKV(e), m.UpdateTime
	f := freeFlag(m)
	if x.staleAfter <= 0 || !m.UpdateTime.Before(x.oldest) {
		f |= flagFresh
		if x.nFresh == 0 || m.UpdateTime.Before(x.minFresh) {
			x.minFresh = m.UpdateTime
		}
		x.nFresh++
	} else {
		if x.nStale == 0 || x.maxStale.Before(m.UpdateTime) {
			x.maxStale = m.UpdateTime
		}
		x.nStale++
	}
	if outside(m.WaitingQueueSize) || outside(m.RunningQueueSize) || math.IsInf(x.kv[i], 0) {
		f |= flagBad
		x.nBad++
	}
	x.flags[i] = f
	x.setAdapters(i, m)
}

func outside(v int) bool { return v < -badMagnitude || v > badMagnitude }

func indexedKV(e *Endpoint) float64 {
	u := kvUsage(e)
	if u == 0 {
		return 0 // -0 as +0
	}
	return u
}

func freeFlag(m *Metrics) uint8 {
	if len(m.ActiveModels)+len(m.WaitingModels) < m.MaxActiveModels {
		return flagFree
	}
	return 0
}

// freshAt reports whether the fresh flags hold for a decision whose
// oldest acceptable update time is oldest.
func (x *snapIndex) freshAt(oldest time.Time) bool {
	return (x.nFresh == 0 || !x.minFresh.Before(oldest)) && (x.nStale == 0 || x.maxStale.Before(oldest))
}

// reevaluate moves the freshness point to oldest (the clock moved past
// an endpoint's update time, or back).
func (x *snapIndex) reevaluate(snap *Snapshot, oldest time.Time) {
	flips := 0
	for i := range x.n {
		if x.upd[i].Before(oldest) == (x.flags[i]&flagFresh != 0) {
			flips++
		}
	}
	if flips > oneByOne(x.n) {
		x.build(snap, x.id, oldest)
		return
	}
	x.oldest = oldest
	for i := range x.n {
		if x.upd[i].Before(oldest) == (x.flags[i]&flagFresh != 0) {
			x.reload(&snap.Endpoints[i], i)
		}
	}
	// Exact bounds again (load only ever widens them).
	x.nFresh, x.nStale = 0, 0
	for i := range x.n {
		t := x.upd[i]
		if x.flags[i]&flagFresh != 0 {
			if x.nFresh == 0 || t.Before(x.minFresh) {
				x.minFresh = t
			}
			x.nFresh++
		} else {
			if x.nStale == 0 || x.maxStale.Before(t) {
				x.maxStale = t
			}
			x.nStale++
		}
	}
}

// member reports whether endpoint i belongs in order o.
func (x *snapIndex) member(o *order, i int) bool {
	return x.admits(o, indexed{x.w[i], 0, x.kv[i], x.flags[i]})
}

func (x *snapIndex) key(o *order, i int) entry {
	return o.keyOf(x.values(i), i)
}

func (x *snapIndex) values(i int) indexed { return indexed{x.w[i], x.r[i], x.kv[i], x.flags[i]} }

// ord returns order id, building it if a change dropped it: a subset
// order by filtering the full order of its key (linear), a full order by
// sorting.
func (x *snapIndex) ord(id int) *order {
	o := &x.orders[id]
	if o.built {
		return o
	}
	es := o.es
	if o.from >= 0 {
		es = es[:0]
		for _, e := range x.ord(o.from).es {
			if x.member(o, int(e.i)) {
				es = append(es, e)
			}
		}
	} else if o.key == keyPosition {
		es = es[:0]
		for i := range x.n {
			if x.member(o, i) {
				es = append(es, x.key(o, i))
			}
		}
	} else {
		// The entries in the order they had: after a rebuild values have
		// moved little, and nearly sorted input sorts in about linear
		// time.
		mark := x.markAll(nil)
		for _, e := range es {
			if i := int(e.i); i < x.n && x.marks[i] != mark && x.member(o, i) {
				x.marks[i] = mark
				es = append(es, x.key(o, i))
			}
		}
		es = slices.Delete(es, 0, len(o.es)) // drop the old entries, keep the new
		for i := range x.n {
			if x.marks[i] != mark && x.member(o, i) {
				es = append(es, x.key(o, i))
			}
		}
		es.sort()
	}
	o.sum = 0
	for _, e := range es {
		o.sum += x.w[e.i] + x.r[e.i]
	}
	o.es, o.built = es, true
	return o
}

// markAll stamps the endpoints at positions and returns the stamp.
func (x *snapIndex) markAll(positions []int32) uint32 {
	x.mark++
	if x.mark == 0 { // wrapped: old stamps could match again
		clear(x.marks)
		x.mark = 1
	}
	for _, i := range positions {
		x.marks[i] = x.mark
	}
	return x.mark
}

// adapter returns the id of adapter name, or -1 when no endpoint holds it
// (active or waiting).
func (x *snapIndex) adapter(name string) int32 {
	if id, ok := x.adapterID[name]; ok {
		return id
	}
	return -1
}

// adRef is one adapter name an endpoint lists and the id it counts as
// (-1 for a name it lists twice, active and waiting).
type adRef struct {
	name string
	id   int32
}

// sameAdapters reports whether m lists exactly the names refs were read
// from, in the same order (then its holder lists need no change). Names
// kept from the last read are usually the same strings, so most
// comparisons are of two pointers.
func sameAdapters(m *Metrics, refs []adRef) bool {
	na := len(m.ActiveModels)
	if na+len(m.WaitingModels) != len(refs) {
		return false
	}
	for k, a := range m.ActiveModels {
		if refs[k].name != a {
			return false
		}
	}
	for k, a := range m.WaitingModels {
		if refs[na+k].name != a {
			return false
		}
	}
	return true
}

// setAdapters records the adapters endpoint i holds in the holder lists.
func (x *snapIndex) setAdapters(i int, m *Metrics) {
	old := x.ads[i]
	if sameAdapters(m, old) {
		return
	}
	for _, r := range old {
		if r.id >= 0 {
			x.leave(r.id, int32(i))
		}
	}
	refs := old[:0] // reuse its room in the arena when the new list fits
	if n := len(m.ActiveModels) + len(m.WaitingModels); n > cap(refs) {
		refs = x.room(n)
	}
	for _, list := range [2][]string{m.ActiveModels, m.WaitingModels} {
		for _, name := range list {
			id, ok := x.adapterID[name]
			if !ok {
				id = x.newAdapterID(name)
			}
			for _, r := range refs {
				if r.id == id {
					id = -1 // listed twice
					break
				}
			}
			if id >= 0 {
				x.holders[id] = insertSorted(x.holders[id], int32(i))
			}
			refs = append(refs, adRef{name, id})
		}
	}
	x.ads[i] = refs
}

// leave takes endpoint i off adapter id's holders, freeing the id when
// nobody holds it any more.
func (x *snapIndex) leave(id, i int32) {
	x.holders[id] = removeSorted(x.holders[id], i)
	if len(x.holders[id]) == 0 {
		delete(x.adapterID, x.names[id])
		x.names[id] = ""
		x.freeIDs = append(x.freeIDs, id)
	}
}

// room returns an empty slice of the arena with room for n refs (and a
// few more), compacting the arena when most of it is left over from
// moves.
func (x *snapIndex) room(n int) []adRef {
	if len(x.arena) > 2*x.arenaCompact+256 {
		x.compactArena()
	}
	start, size := len(x.arena), n+2
	x.arena = slices.Grow(x.arena, size)[:start+size]
	return x.arena[start : start : start+size]
}

// compactArena copies every endpoint's adapter refs into the spare arena
// and swaps the two (no allocation once both are large enough).
func (x *snapIndex) compactArena() {
	arena := x.spare[:0]
	for i, a := range x.ads {
		start := len(arena)
		arena = append(arena, a...)
		x.ads[i] = arena[start:len(arena):len(arena)]
	}
	clear(x.arena) // drop the names
	x.arena, x.spare, x.arenaCompact = arena, x.arena[:0], len(arena)
}

// newAdapterID gives name an id, reusing one no endpoint holds any more.
func (x *snapIndex) newAdapterID(name string) int32 {
	var id int32
	if n := len(x.freeIDs); n > 0 {
		id, x.freeIDs = x.freeIDs[n-1], x.freeIDs[:n-1]
	} else {
		id = int32(len(x.holders))
		if len(x.holders) < cap(x.holders) {
			x.holders = x.holders[:id+1] // keeps the list's old backing array (emptied by build)
		} else {
			x.holders = append(x.holders, nil)
		}
		x.names = append(x.names, "")
	}
	x.adapterID[name] = id
	x.names[id] = name
	return id
}

func insertSorted(s []int32, v int32) []int32 {
	if len(s) == 0 || s[len(s)-1] < v {
		return append(s, v) // builds add endpoints in order
	}
	p := searchInt32(s, v)
	if p < len(s) && s[p] == v {
		return s
	}
	s = append(s, 0)
	copy(s[p+1:], s[p:])
	s[p] = v
	return s
}

func removeSorted(s []int32, v int32) []int32 {
	p := searchInt32(s, v)
	if p < len(s) && s[p] == v {
		copy(s[p:], s[p+1:])
		s = s[:len(s)-1]
	}
	return s
}

func searchInt32(s []int32, v int32) int {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s[m] < v {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}
