package scheduler

import (
	"math"
	"slices"
)

// entry is one endpoint in an order: keys a and b, then the endpoint's
// position i, compared in that order. Keys are order-preserving images of
// the values the fast paths compare (wKey, kvKey), so one comparison of
// integers stands for the filters' comparisons, and endpoints with equal
// values follow snapshot order, as the filters keep them. 16 bytes: the
// orders are moved on every update.
type entry struct {
	a uint32
	i int32
	b uint64
}

func (x entry) less(y entry) bool {
	if x.a != y.a {
		return x.a < y.a
	}
	if x.b != y.b {
		return x.b < y.b
	}
	return x.i < y.i
}

func (x entry) sameKey(y entry) bool { return x.a == y.a && x.b == y.b }

func compareEntries(x, y entry) int {
	switch {
	case x.less(y):
		return -1
	case y.less(x):
		return 1
	}
	return 0
}

// Bounds for key ranges.
var (
	minEntry = entry{0, math.MinInt32, 0}
	maxEntry = entry{math.MaxUint32, math.MaxInt32, math.MaxUint64}
)

// keyAbove is the greatest entry with key a (any b).
func keyAbove(a uint32) entry { return entry{a, math.MaxInt32, math.MaxUint64} }

// keyFrom is the least entry with key a.
func keyFrom(a uint32) entry { return entry{a, math.MinInt32, 0} }

// wKey maps a count (queue length, outstanding requests) within
// ±badMagnitude to a key with the same order.
func wKey(w int) uint32 { return uint32(int32(w)) ^ 1<<31 }

// kvKey maps a KV-cache usage to a key with the same order; -0 and +0,
// equal for the filters, get the same key.
func kvKey(f float64) uint64 {
	if f == 0 {
		f = 0
	}
	b := math.Float64bits(f)
	if b>>63 != 0 {
		return ^b
	}
	return b | 1<<63
}

// sortedEntries is a set of entries kept sorted; inserting or removing one
// moves the entries after it (a memmove of a few kilobytes at a thousand
// endpoints, cheaper than any tree at these sizes).
type sortedEntries []entry

// search returns the position of the first entry not less than k.
func (s sortedEntries) search(k entry) int {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s[m].less(k) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// searchAfter returns the position of the first entry greater than k.
func (s sortedEntries) searchAfter(k entry) int {
	lo, hi := 0, len(s)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k.less(s[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

func (s *sortedEntries) insert(k entry) {
	p := s.search(k)
	*s = slices.Insert(*s, p, k)
}

// move replaces entry from, which must be present, with to, moving only
// the entries between their places (found by galloping from the old
// place: a value that changed a little moves a little).
func (s sortedEntries) move(from, to entry) {
	if from == to {
		return
	}
	p := s.search(from)
	if p == len(s) || s[p] != from {
		panic("scheduler: index entry missing") // the index keeps the keys it inserted: a bug
	}
	if from.less(to) {
		// q: the first entry after p not less than to.
		lo, step := p+1, 1
		for lo+step <= len(s) && s[lo+step-1].less(to) {
			lo, step = lo+step, step*2
		}
		q := lo + s[lo:min(lo+step, len(s))].search(to)
		copy(s[p:q-1], s[p+1:q])
		s[q-1] = to
		return
	}
	// q: the first entry not less than to, before p.
	hi, step := p, 1
	for hi-step >= 0 && !s[hi-step].less(to) {
		hi, step = hi-step, step*2
	}
	lo := max(hi-step+1, 0)
	q := lo + s[lo:hi].search(to)
	copy(s[q+1:p+1], s[q:p])
	s[q] = to
}

// remove deletes k, which must be present.
func (s *sortedEntries) remove(k entry) {
	p := s.search(k)
	if p == len(*s) || (*s)[p] != k {
		panic("scheduler: index entry missing") // the index keeps the keys it inserted: a bug

	}
	*s = slices.Delete(*s, p, p+1)
}

// sort sorts s: by insertion while that moves entries no further than a
// few places each on average (input that was sorted before values moved
// a little), else by pdqsort.
func (s sortedEntries) sort() {
	budget := 8*len(s) + 64
	for i := 1; i < len(s); i++ {
		e := s[i]
		j := i
		for j > 0 && e.less(s[j-1]) {
			j--
		}
		if j == i {
			continue
		}
		if budget -= i - j; budget < 0 {
			slices.SortFunc(s, compareEntries)
			return
		}
		copy(s[j+1:i+1], s[j:i])
		s[j] = e
	}
}
