package flowcontrol

import (
	"fmt"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Room is flow control's test of whether an endpoint takes a Standard or
// Sheddable request now. With flow control on it replaces the profile's
// own shedding test (the decision tree's capacity step): the profile,
// scheduling the request with Request.Admitted, decides where it would go,
// and Room decides whether it goes there now or waits.
//
// An endpoint has room for a request when its metrics say the request
// would start at once without delaying anything already there:
//   - its waiting queue, counting what this proxy sent it since the
//     snapshot, is at most MaxWaiting;
//   - its KV-cache usage is at most MaxKVCacheUsage: a fuller cache
//     leaves no blocks for the request, and a full one makes vLLM preempt
//     running requests (the fleet benchmark measured 1.0 as worse than
//     0.9 for critical requests, BENCHMARKS.md);
//   - the request's adapter runs there, or a slot is free (running plus
//     waiting adapters below max_loras): otherwise it would wait at the
//     endpoint for a slot, and the decision tree's LoRA affinity would
//     send the next requests of that adapter, Critical ones too, to wait
//     behind it. An endpoint that reports no adapter slots needs none.
//
// The decision tree's capacity test (waiting ≤ 5, KV ≤ 0.8) is different
// on purpose: past saturation it stays closed for longer than a request's
// TTL, so held requests expired instead of being served, while releasing
// into a waiting queue delays the Critical requests behind them
// (BENCHMARKS.md has both measurements).
type Room struct {
	MaxWaiting      int
	MaxKVCacheUsage float64
}

// Defaults of Room.
const (
	DefaultRoomMaxWaiting      = 0
	DefaultRoomMaxKVCacheUsage = 0.9
)

// MaxRoomMaxWaiting bounds Room.MaxWaiting: larger values are mistakes.
const MaxRoomMaxWaiting = 1 << 16

// DefaultRoom returns the defaults.
func DefaultRoom() Room {
	return Room{MaxWaiting: DefaultRoomMaxWaiting, MaxKVCacheUsage: DefaultRoomMaxKVCacheUsage}
}

func (t Room) validate() error {
	switch {
	case t.MaxWaiting < 0 || t.MaxWaiting > MaxRoomMaxWaiting:
		return fieldErr("admit.maxWaiting", fmt.Sprintf("must be in [0, %d]", MaxRoomMaxWaiting))
	case !(t.MaxKVCacheUsage > 0 && t.MaxKVCacheUsage <= 1):
		return fieldErr("admit.maxKVCacheUsage", "must be in (0, 1]")
	}
	return nil
}

// Has reports whether an endpoint with metrics m has room for a request
// served by target (the adapter or model the scheduler routes on).
func (t Room) Has(m *scheduler.Metrics, target string) bool {
	// !(x <= max) also refuses a NaN usage.
	if m.WaitingQueueSize > t.MaxWaiting || !(m.KVCacheUsage <= t.MaxKVCacheUsage) {
		return false
	}
	if m.MaxActiveModels <= 0 || m.HasActiveModel(target) {
		return true
	}
	return len(m.ActiveModels)+len(m.WaitingModels) < m.MaxActiveModels
}

// fits reports whether res, a decision on snap for a request served by
// target, may be acted on now: a routed request when its endpoint has
// room, a failed-open one always (every endpoint is stale, so no metrics
// can say no, and a new request would be sent the same way).
func (t Room) fits(snap *scheduler.Snapshot, res scheduler.Result, target string) bool {
	switch res.Outcome {
	case scheduler.FailedOpen:
		return true
	case scheduler.Routed:
		return res.Index >= 0 && res.Index < len(snap.Endpoints) && t.Has(&snap.Endpoints[res.Index].Metrics, target)
	}
	return false
}

// Take decides a new request that nothing held is waiting ahead of: res is
// its decision on snap (scheduled with Request.Admitted), target its
// model. It reports whether the request goes now, and counts a routed one
// as waiting at its endpoint in snap, this VM's copy, so the next request
// does not find the same room. A request that may not go is held.
//
// Nothing is written to the shared admission record: a new request that
// finds the queue empty costs no shared-data write (the record counts
// releases, Releaser).
func (t Room) Take(snap *scheduler.Snapshot, res scheduler.Result, target string) bool {
	if !t.fits(snap, res, target) {
		return false
	}
	if res.Outcome == scheduler.Routed {
		snap.Endpoints[res.Index].Metrics.WaitingQueueSize++
		snap.MetricsChanged(res.Index)
	}
	return true
}
