package flowcontrol

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

func TestRoomHas(t *testing.T) {
	room := Room{MaxWaiting: 1, MaxKVCacheUsage: 0.9}
	m := func(waiting int, kv float64, active, waitingAdapters []string, slots int) *scheduler.Metrics {
		return &scheduler.Metrics{WaitingQueueSize: waiting, KVCacheUsage: kv, ActiveModels: active, WaitingModels: waitingAdapters, MaxActiveModels: slots}
	}
	ab, abc := []string{"a", "b"}, []string{"a", "b", "c"}
	for _, tc := range []struct {
		name string
		m    *scheduler.Metrics
		want bool
	}{
		{"idle", m(0, 0, nil, nil, 0), true},
		{"waiting at the limit", m(1, 0.5, nil, nil, 0), true},
		{"waiting over the limit", m(2, 0.5, nil, nil, 0), false},
		{"KV at the limit", m(0, 0.9, nil, nil, 0), true},
		{"KV over the limit", m(0, 0.91, nil, nil, 0), false},
		{"KV NaN", m(0, math.NaN(), nil, nil, 0), false},
		{"adapter running", m(0, 0.5, []string{"a", "x", "c"}, nil, 3), true},
		{"adapter not running, a slot free", m(0, 0.5, ab, nil, 3), true},
		{"adapter not running, slots taken", m(0, 0.5, abc, nil, 3), false},
		{"slots taken by waiting adapters", m(0, 0.5, ab, []string{"c"}, 3), false},
		{"adapter waiting there for a slot", m(1, 0.5, abc, []string{"x"}, 3), false},
		{"no adapter slots reported", m(0, 0.5, abc, nil, 0), true},
	} {
		if got := room.Has(tc.m, "x"); got != tc.want {
			t.Errorf("%s: Has = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Take counts a new request where it goes, in this VM's copy, so one room
// is not taken twice; it fails open as a new request does.
func TestRoomTake(t *testing.T) {
	room := DefaultRoom()
	snap := fleetSnapshot(1, 0)
	res := scheduler.Result{Outcome: scheduler.Routed, Index: 0, Endpoint: &snap.Endpoints[0]}
	if !room.Take(snap, res, "m") {
		t.Fatal("no room on an idle endpoint")
	}
	if room.Take(snap, res, "m") {
		t.Fatal("the same room taken twice")
	}
	if w := snap.Endpoints[0].Metrics.WaitingQueueSize; w != 1 {
		t.Fatalf("waiting %d, want 1", w)
	}
	if !room.Take(snap, scheduler.Result{Outcome: scheduler.FailedOpen, Index: 0}, "m") {
		t.Fatal("a failed-open decision must go")
	}
	for _, o := range []scheduler.Outcome{scheduler.Dropped, scheduler.NoEndpoint, scheduler.AllStale} {
		if room.Take(snap, scheduler.Result{Outcome: o, Index: -1}, "m") {
			t.Fatalf("%v taken", o)
		}
	}
	if w := snap.Endpoints[0].Metrics.WaitingQueueSize; w != 1 {
		t.Fatalf("waiting %d after refusals and fail-open, want 1", w)
	}
}

// A large snapshot is decided on the scheduler's index: Take tells it the
// endpoint it counted changed, so each next request goes to another
// endpoint with room, not to one just taken (which the index, once built
// without hearing of the count, would still show as free).
func TestRoomTakeUpdatesTheIndex(t *testing.T) {
	s, err := scheduler.New(scheduler.Config{}, nil, scheduler.Options{Rand: rand.NewPCG(1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	snap := fleetSnapshot(200, 3) // no room (waiting 3) but on three endpoints
	free := []int{7, 90, 150}
	for _, i := range free {
		snap.Endpoints[i].Metrics.WaitingQueueSize = 0
	}
	room := DefaultRoom()
	taken := map[int]int{}
	for range 5 {
		req := scheduler.Request{Model: "m", TargetModel: "m", Criticality: scheduler.Standard, Admitted: true}
		res := s.Schedule(&req, snap)
		if room.Take(snap, res, "m") {
			taken[res.Index]++
		}
	}
	if len(taken) != len(free) {
		t.Fatalf("taken %v, want each of %v once", taken, free)
	}
	for _, i := range free {
		if taken[i] != 1 {
			t.Fatalf("taken %v, want each of %v once", taken, free)
		}
	}
}
