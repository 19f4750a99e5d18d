package flowcontrol

import (
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Releaser offers one VM's queued requests to its scheduler, counting each
// dispatch in the VM's snapshot copy and, through Admission, for the other
// VMs of the proxy. The plugin and the fleet simulation both release
// through it, so a simulated release is the plugin's.
type Releaser[T any] struct {
	Queue *Queue[T]
	// Admission shares the counts with the proxy's other VMs; nil counts
	// in this VM's copy only (one VM).
	Admission *Admission
	// Room is when an endpoint takes a released request.
	Room Room
	// Schedule runs the scheduler for queued request v on snap with
	// Request.Admitted set, exactly as for a request that never waited
	// (same profile, same fail-open policy), without Scheduler.Observe:
	// the Releaser counts dispatches itself. It returns the decision and
	// the model the request is served by (Room's adapter check).
	Schedule func(v T, snap *scheduler.Snapshot) (scheduler.Result, string)
	// Done hears of every request that leaves by release: routed
	// (res.Outcome Routed or FailedOpen: send it to res.Endpoint) or
	// refused for good (NoEndpoint, AllStale: answer 503 as for a new
	// request). A non-nil err is an admission failure (shared store
	// unreachable) the request was routed despite, counted in this VM's
	// copy only: log it.
	Done func(e Entry[T], res scheduler.Result, err error)

	// ContentionBlocked counts the requests left queued because the shared
	// record kept changing (ErrContention); they are offered again at the
	// next release.
	ContentionBlocked uint64
}

// Release offers the queue's requests in order (Queue.Release) on snap, the
// VM's current copy named by tag, and returns how many were dispatched. A
// request goes when the endpoint the scheduler picks for it has room
// (Room); otherwise it stays queued, as does one the scheduler drops.
func (r *Releaser[T]) Release(now time.Duration, snap *scheduler.Snapshot, tag uint64) int {
	return r.release(now, snap, tag, false)
}

// ReleaseRouted is Release for a caller that may only route requests, not
// refuse them: a request the scheduler finds no endpoint for stays queued
// (Release, at the next tick, answers it) instead of leaving through Done.
// The plugin releases this way from a request callback when it sees a new
// snapshot: a local reply to another stream there would stop the calling
// stream (plugin/internal/filter/flow.go).
func (r *Releaser[T]) ReleaseRouted(now time.Duration, snap *scheduler.Snapshot, tag uint64) int {
	return r.release(now, snap, tag, true)
}

func (r *Releaser[T]) release(now time.Duration, snap *scheduler.Snapshot, tag uint64, routedOnly bool) int {
	return r.Queue.Release(now, func(e Entry[T]) Verdict {
		var res scheduler.Result
		try := func() int {
			var target string
			res, target = r.Schedule(e.Value, snap)
			if res.Outcome == scheduler.Routed && !r.Room.fits(snap, res, target) {
				res.Outcome = scheduler.Dropped // no room there now: stays queued
			}
			if res.Outcome == scheduler.Routed {
				return res.Index
			}
			return -1 // failed open (not counted: stale metrics) or not routed
		}
		var err error
		if r.Admission != nil {
			_, err = r.Admission.Place(snap, tag, try)
		} else if i := try(); i >= 0 {
			snap.Endpoints[i].Metrics.WaitingQueueSize++
			snap.MetricsChanged(i)
		}
		switch res.Outcome {
		case scheduler.Dropped:
			return Blocked
		case scheduler.Routed, scheduler.FailedOpen:
			if err == ErrContention {
				r.ContentionBlocked++
				return Blocked
			}
			r.Done(e, res, err)
			return Dispatched
		}
		if routedOnly {
			return Blocked
		}
		r.Done(e, res, nil)
		return Left
	})
}
