package flowcontrol

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

type queued struct {
	id  int
	req scheduler.Request
}

func newReleaser(t testing.TB, adm *Admission) (*Releaser[queued], *[]int, *[]scheduler.Outcome) {
	t.Helper()
	s, err := scheduler.New(scheduler.Config{}, nil, scheduler.Options{Rand: rand.NewPCG(1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	q, err := New[queued](Config{})
	if err != nil {
		t.Fatal(err)
	}
	var sent []int
	var left []scheduler.Outcome
	var req scheduler.Request // reused, as the plugin does: the scheduler keeps the pointer
	r := &Releaser[queued]{
		Queue:     q,
		Admission: adm,
		Room:      DefaultRoom(),
		Schedule: func(v queued, snap *scheduler.Snapshot) (scheduler.Result, string) {
			req = v.req
			req.Admitted = true
			return s.Schedule(&req, snap), req.Model
		},
		Done: func(e Entry[queued], res scheduler.Result, err error) {
			if err != nil {
				t.Errorf("admission error: %v", err)
			}
			switch res.Outcome {
			case scheduler.Routed, scheduler.FailedOpen:
				sent = append(sent, res.Index)
			default:
				left = append(left, res.Outcome)
			}
		},
	}
	return r, &sent, &left
}

func fill(t testing.TB, q *Queue[queued], n int, c scheduler.Criticality) {
	t.Helper()
	b, _ := BandFor(c)
	for i := range n {
		v := queued{id: i, req: scheduler.Request{Model: "m", Criticality: c}}
		if _, err := q.Push(b, []byte("m"), 100, 0, time.Hour, v); err != nil {
			t.Fatal(err)
		}
	}
}

// One free slot is filled once: the releaser counts what it dispatched in
// the VM's snapshot copy, with or without a shared record.
func TestReleaserCountsDispatches(t *testing.T) {
	for name, adm := range map[string]*Admission{"local": nil, "shared": NewAdmission(&MemStore{}, admittedKey)} {
		t.Run(name, func(t *testing.T) {
			r, sent, left := newReleaser(t, adm)
			r.Room.MaxWaiting = 2
			fill(t, r.Queue, 10, scheduler.Standard)
			snap := fleetSnapshot(2, 1) // room for 2 each
			if n := r.Release(0, snap, 1); n != 4 || len(*sent) != 4 || len(*left) != 0 {
				t.Fatalf("released %d (sent %v, left %v), want 4", n, *sent, *left)
			}
			if n := r.Release(time.Millisecond, snap, 1); n != 0 {
				t.Fatalf("second release on the same snapshot sent %d more", n)
			}
			if r.Queue.Len() != 6 {
				t.Fatalf("%d queued, want 6", r.Queue.Len())
			}
			// Fresh metrics with room again.
			if n := r.Release(2*time.Millisecond, fleetSnapshot(2, 0), 2); n != 6 {
				t.Fatalf("released %d on a fresh snapshot, want 6", n)
			}
		})
	}
}

// A queued request that can no longer be routed at all (the fleet is gone)
// leaves with the outcome a new request would get.
func TestReleaserNoEndpointLeaves(t *testing.T) {
	r, sent, left := newReleaser(t, nil)
	fill(t, r.Queue, 3, scheduler.Sheddable)
	if n := r.Release(0, &scheduler.Snapshot{}, 1); n != 0 || len(*sent) != 0 || len(*left) != 3 || (*left)[0] != scheduler.NoEndpoint {
		t.Fatalf("released %d, sent %v, left %v", n, *sent, *left)
	}
	if s := r.Queue.Stats(); s.Left != 3 || r.Queue.Len() != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A released request goes only where the profile's choice has room: the
// decision tree would shed these Standard requests (queues over 5), but
// flow control admitted them, and they wait for an endpoint with room
// rather than join a queue.
func TestReleaserWaitsForRoom(t *testing.T) {
	r, sent, left := newReleaser(t, nil)
	fill(t, r.Queue, 3, scheduler.Standard)
	snap := fleetSnapshot(2, 7)
	if n := r.Release(0, snap, 1); n != 0 || r.Queue.Len() != 3 {
		t.Fatalf("released %d into waiting queues", n)
	}
	snap.Endpoints[1].Metrics.WaitingQueueSize = 0
	snap.Endpoints[1].Metrics.KVCacheUsage = 0.95 // over the limit
	if n := r.Release(time.Millisecond, snap, 1); n != 0 {
		t.Fatalf("released %d onto a full KV cache", n)
	}
	snap.Endpoints[1].Metrics.KVCacheUsage = 0.5
	// Endpoint 1 has room for one (maxWaiting 0); the tree's critical
	// route sends every request to the least queued, so one goes.
	if n := r.Release(2*time.Millisecond, snap, 1); n != 1 || (*sent)[0] != 1 || len(*left) != 0 {
		t.Fatalf("released %d (sent %v, left %v), want 1 to endpoint 1", n, *sent, *left)
	}
}

// ReleaseRouted never refuses: a request without any endpoint stays for
// the tick.
func TestReleaseRoutedKeepsWhatItCannotRoute(t *testing.T) {
	r, sent, left := newReleaser(t, nil)
	fill(t, r.Queue, 2, scheduler.Standard)
	if n := r.ReleaseRouted(0, &scheduler.Snapshot{}, 1); n != 0 || len(*sent)+len(*left) != 0 || r.Queue.Len() != 2 {
		t.Fatalf("released %d, sent %v, left %v, queued %d", n, *sent, *left, r.Queue.Len())
	}
	if n := r.ReleaseRouted(time.Millisecond, fleetSnapshot(3, 0), 2); n != 2 || len(*sent) != 2 {
		t.Fatalf("released %d, sent %v", n, *sent)
	}
}

func TestReleaserContentionKeepsRequests(t *testing.T) {
	r, sent, _ := newReleaser(t, NewAdmission(&racingStore{}, admittedKey))
	fill(t, r.Queue, 2, scheduler.Standard)
	if n := r.Release(0, fleetSnapshot(2, 0), 1); n != 0 || len(*sent) != 0 || r.Queue.Len() != 2 || r.ContentionBlocked == 0 {
		t.Fatalf("released %d, sent %v, queued %d, contention %d", n, *sent, r.Queue.Len(), r.ContentionBlocked)
	}
}

func TestReleaserAllocatesNothing(t *testing.T) {
	r, sent, _ := newReleaser(t, NewAdmission(&MemStore{}, admittedKey))
	snap := fleetSnapshot(4, 0)
	tag := uint64(0)
	cycle := func() {
		fill(t, r.Queue, 16, scheduler.Standard)
		tag++
		for i := range snap.Endpoints {
			snap.Endpoints[i].Metrics.WaitingQueueSize = 0
		}
		r.Release(0, snap, tag)
		*sent = (*sent)[:0]
	}
	cycle()
	if a := testing.AllocsPerRun(20, cycle); a != 0 {
		t.Fatalf("%v allocations per release cycle", a)
	}
}
