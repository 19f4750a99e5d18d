package scheduler

import (
	"math/rand/v2"
	"time"
)

// Cycle is the context of one scheduling decision: the request, the
// snapshot it is scheduled against, the injected random source and clock,
// and a typed key/value store plugins use to share data (for example a
// prefix-cache filter handing its match lengths to a scorer) without any
// interface change. This is the seed's scheduling context.
//
// A Cycle is owned by its Scheduler and reused from one request to the next;
// plugins must not keep it, or slices obtained from it, after they return.
type Cycle struct {
	// Request being scheduled; never nil during a cycle.
	Request *Request
	// Snapshot the decision is made against; never nil during a cycle.
	Snapshot *Snapshot
	// Rand is the Scheduler's injected random source. Plugins draw from it
	// and never from a global source, so a seeded Scheduler is reproducible.
	Rand *rand.Rand
	// State is per-request data shared between plugins; empty at the start
	// of every cycle.
	State CycleState

	clock   func() time.Time
	now     time.Time
	hasNow  bool
	dropped bool
	path    string
}

// Now returns the injected clock's time, read at most once per cycle.
func (c *Cycle) Now() time.Time {
	if !c.hasNow {
		c.now, c.hasNow = c.clock(), true
	}
	return c.now
}

// Drop marks the request as shed for lack of capacity: the profile stops
// and the gateway answers 429. Only shedding plugins (the decision tree's
// drop branch, shed-filter) call it.
func (c *Cycle) Drop() { c.dropped = true }

// Dropped reports whether a plugin called Drop during this cycle.
func (c *Cycle) Dropped() bool { return c.dropped }

// SetPath lets a plugin that makes a structured decision (the decision
// tree) name the route it took; Result.Path reports it instead of the
// profile name. The string must come from the plugin's Paths list so the
// set of paths stays enumerable.
func (c *Cycle) SetPath(path string) { c.path = path }

// TargetModel is the model or adapter the request will be served by: the
// resolved target model, or the requested model when nothing resolved it.
func (c *Cycle) TargetModel() string {
	if c.Request.TargetModel != "" {
		return c.Request.TargetModel
	}
	return c.Request.Model
}

func (c *Cycle) reset(req *Request, snap *Snapshot) {
	c.Request, c.Snapshot = req, snap
	c.hasNow, c.dropped, c.path = false, false, ""
	c.State.reset()
}

// StateKey names one typed value in a CycleState. Create keys once, at
// package or plugin construction time, with NewStateKey; two keys never
// collide even when they share a name.
type StateKey[T any] struct{ id *stateKeyID }

type stateKeyID struct{ name string }

// NewStateKey returns a fresh key; name is only for debugging.
func NewStateKey[T any](name string) StateKey[T] {
	return StateKey[T]{id: &stateKeyID{name: name}}
}

// Name returns the debugging name the key was created with.
func (k StateKey[T]) Name() string { return k.id.name }

// CycleState is per-request typed key/value storage. It is a small slice
// searched linearly: a cycle holds a handful of keys, and the slice is
// reused across cycles so storing pointer-shaped values does not allocate.
type CycleState struct {
	entries []stateEntry
}

type stateEntry struct {
	key   *stateKeyID
	value any
}

// Put stores v under k in s, replacing any previous value.
func Put[T any](s *CycleState, k StateKey[T], v T) {
	for i := range s.entries {
		if s.entries[i].key == k.id {
			s.entries[i].value = v
			return
		}
	}
	s.entries = append(s.entries, stateEntry{key: k.id, value: v})
}

// Get returns the value stored under k in s, and whether there was one.
func Get[T any](s *CycleState, k StateKey[T]) (T, bool) {
	for i := range s.entries {
		if s.entries[i].key == k.id {
			v, ok := s.entries[i].value.(T)
			return v, ok
		}
	}
	var zero T
	return zero, false
}

// Len is the number of values stored.
func (s *CycleState) Len() int { return len(s.entries) }

func (s *CycleState) reset() {
	clear(s.entries) // drop references so values can be collected
	s.entries = s.entries[:0]
}

// kvUsage is an endpoint's KV-cache usage with NaN read as a full cache.
// Snapshots are validated by the wire format, so NaN only reaches here from
// careless in-process callers; reading it as 1 keeps every "least" filter
// non-empty on a non-empty input and keeps such endpoints from being
// preferred.
func kvUsage(e *Endpoint) float64 { return kvValue(e.Metrics.KVCacheUsage) }

// kvValue is kvUsage's rule on a KV-cache usage read already (the flat and
// fused passes read the metrics once): NaN as 1.
func kvValue(u float64) float64 {
	if u != u { // NaN
		return 1
	}
	return u
}
