package scheduler

import "sync/atomic"

// changeLog is how a Snapshot's owner tells the Schedulers that index it
// what changed in place (Snapshot.MetricsChanged, Snapshot.Changed). Every
// call advances gen; ring holds the endpoint positions of the latest
// MetricsChanged calls, so an index that has applied generation g applies
// exactly the endpoints changed after g, and rebuilds when the ring has
// wrapped past g or Changed came after g.
//
// Nothing is logged before a Scheduler first indexes the snapshot (id 0):
// the first index reads every endpoint anyway, so snapshots too small to
// be indexed never pay for the log.
type changeLog struct {
	id   uint64 // identity, assigned by the first index (atomically: read-only sharing stays race-free)
	gen  uint64
	all  uint64 // gen of the latest Changed
	ring []int32
}

// minChangeRing is the smallest change ring; a snapshot gets one entry per
// four endpoints beyond that, so refreshing a quarter of the endpoints
// between two decisions is still applied change by change.
const minChangeRing = 64

// oneByOne is how many metric changes to n endpoints are still worth
// applying to an index one by one: the change ring's size.
func oneByOne(n int) int { return max(minChangeRing, n/4) }

var snapshotIDs atomic.Uint64

// MetricsChanged records that Endpoints[i].Metrics was rewritten in place
// (new values, or new adapter lists; same endpoint at the same position).
// A Scheduler that indexes the snapshot re-reads that endpoint at its next
// decision. An i outside Endpoints counts as Changed.
func (s *Snapshot) MetricsChanged(i int) { s.MetricsChangedRange(i, i+1) }

// MetricsChangedRange is MetricsChanged(i) for every i in [from, to): one
// call for a run of endpoints rewritten together (a block an agent sent
// again), so the owner pays one call per run, not per endpoint.
func (s *Snapshot) MetricsChangedRange(from, to int) {
	l := &s.changes
	if atomic.LoadUint64(&l.id) == 0 || from >= to {
		return // not indexed yet: nothing to tell
	}
	if from < 0 || to > len(s.Endpoints) {
		s.Changed()
		return
	}
	if l.ring == nil {
		l.ring = make([]int32, oneByOne(len(s.Endpoints)))
	}
	n := uint64(len(l.ring))
	if uint64(to-from) > n {
		// More than the ring holds: an index behind it rebuilds whatever
		// the ring says (snapIndex.sync), so the entries need no writing.
		l.gen += uint64(to - from)
		return
	}
	p := (l.gen + 1) % n
	ring := l.ring
	for i := from; i < to; i++ {
		ring[p] = int32(i)
		if p++; p == n {
			p = 0
		}
	}
	l.gen += uint64(to - from)
}

// Changed records that the snapshot may have changed in any way: endpoints
// added, removed, reordered or given another identity or address, Endpoints
// replaced, or more metrics rewritten than is worth listing. A Scheduler
// that indexes the snapshot rebuilds its index at its next decision.
func (s *Snapshot) Changed() {
	l := &s.changes
	if atomic.LoadUint64(&l.id) == 0 {
		return
	}
	l.gen++
	l.all = l.gen
}

// identity is the snapshot's id for indexes, assigned on first use.
func (s *Snapshot) identity() uint64 {
	if id := atomic.LoadUint64(&s.changes.id); id != 0 {
		return id
	}
	id := snapshotIDs.Add(1)
	if atomic.CompareAndSwapUint64(&s.changes.id, 0, id) {
		return id
	}
	return atomic.LoadUint64(&s.changes.id)
}
