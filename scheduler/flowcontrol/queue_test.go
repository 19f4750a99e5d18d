package flowcontrol

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

type req struct {
	id   int
	flow string
	band Band
}

func newQueue(t testing.TB, cfg Config) *Queue[req] {
	t.Helper()
	q, err := New[req](cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func push(t testing.TB, q *Queue[req], r req, bytes int64, now, ttl time.Duration) Handle {
	t.Helper()
	h, err := q.Push(r.band, []byte(r.flow), bytes, now, ttl, r)
	if err != nil {
		t.Fatalf("push %+v: %v", r, err)
	}
	return h
}

// drain releases everything, dispatching every request, and returns the ids
// in release order.
func drain(q *Queue[req], now time.Duration) []int {
	var ids []int
	q.Release(now, func(e Entry[req]) Verdict {
		ids = append(ids, e.Value.id)
		return Dispatched
	})
	return ids
}

func TestBandsThenRoundRobinThenFIFO(t *testing.T) {
	q := newQueue(t, Config{})
	// Arrival order mixes bands and flows; ids say the arrival order.
	arrivals := []req{
		{1, "a", BandSheddable}, {2, "a", BandStandard}, {3, "a", BandStandard},
		{4, "a", BandStandard}, {5, "b", BandStandard}, {6, "c", BandSheddable},
		{7, "b", BandStandard}, {8, "c", BandStandard}, {9, "a", BandSheddable},
	}
	for i, r := range arrivals {
		push(t, q, r, 10, time.Duration(i), time.Hour)
	}
	// A string key names the same flow as its bytes.
	if _, err := q.PushString(BandSheddable, "c", 10, 20, time.Hour, req{10, "c", BandSheddable}); err != nil {
		t.Fatal(err)
	}
	got := drain(q, 100)
	// Standard: flows in order of first arrival (a, b, c), one each per
	// turn, FIFO inside each: a2 b5 c8 a3 b7 a4. Then Sheddable: a1 c6 a9
	// c10.
	want := []int{2, 5, 8, 3, 7, 4, 1, 6, 9, 10}
	if !slices.Equal(got, want) {
		t.Fatalf("release order %v, want %v", got, want)
	}
	if q.Len() != 0 || q.Stats().Bytes != 0 || q.Stats().Flows != 0 {
		t.Fatalf("not empty after drain: %+v", q.Stats())
	}
}

// A busy flow cannot starve a quiet one: with one slot per release, the
// quiet flow's request leaves within one turn of each busy flow.
func TestFairnessUnderSustainedLoad(t *testing.T) {
	q := newQueue(t, Config{})
	for i := range 100 {
		push(t, q, req{i, "busy", BandStandard}, 1, 0, time.Hour)
	}
	push(t, q, req{1000, "quiet", BandStandard}, 1, 0, time.Hour)
	push(t, q, req{1001, "other", BandStandard}, 1, 0, time.Hour)
	var order []int
	for range 3 { // three releases with capacity for one request each
		slots := 1
		q.Release(1, func(e Entry[req]) Verdict {
			if slots == 0 {
				return Blocked
			}
			slots--
			order = append(order, e.Value.id)
			return Dispatched
		})
	}
	if want := []int{0, 1000, 1001}; !slices.Equal(order, want) {
		t.Fatalf("served %v, want %v (busy, then quiet, then other)", order, want)
	}
}

// A flow whose head is blocked keeps its turn; others are served meanwhile.
func TestBlockedFlowKeepsItsTurn(t *testing.T) {
	q := newQueue(t, Config{})
	push(t, q, req{1, "big-model", BandStandard}, 1, 0, time.Hour)
	push(t, q, req{2, "small", BandStandard}, 1, 0, time.Hour)
	push(t, q, req{3, "small", BandStandard}, 1, 0, time.Hour)
	bigFits := false
	var served []int
	release := func() {
		q.Release(1, func(e Entry[req]) Verdict {
			if e.Value.flow == "big-model" && !bigFits {
				return Blocked
			}
			served = append(served, e.Value.id)
			return Dispatched
		})
	}
	release()
	if !slices.Equal(served, []int{2, 3}) {
		t.Fatalf("first release served %v, want [2 3]", served)
	}
	push(t, q, req{4, "small", BandStandard}, 1, 0, time.Hour)
	bigFits = true
	release()
	if !slices.Equal(served, []int{2, 3, 1, 4}) {
		t.Fatalf("served %v, want the blocked flow first once it fits: [2 3 1 4]", served)
	}
}

func TestReleaseBoundsBlockedProbes(t *testing.T) {
	q := newQueue(t, Config{})
	for i := range 100 {
		push(t, q, req{i, fmt.Sprint("tenant-", i), BandStandard}, 1, 0, time.Hour)
		push(t, q, req{1000 + i, fmt.Sprint("tenant-", i), BandSheddable}, 1, 0, time.Hour)
	}
	calls := 0
	n := q.Release(1, func(Entry[req]) Verdict { calls++; return Blocked })
	if n != 0 || calls != 2*maxBlockedProbes {
		t.Fatalf("released %d with %d dispatch calls, want 0 and %d (%d per band)", n, calls, 2*maxBlockedProbes, maxBlockedProbes)
	}
	// One flow only: a full lap ends the band after one probe.
	q2 := newQueue(t, Config{})
	push(t, q2, req{1, "x", BandStandard}, 1, 0, time.Hour)
	push(t, q2, req{2, "x", BandStandard}, 1, 0, time.Hour)
	calls = 0
	q2.Release(1, func(Entry[req]) Verdict { calls++; return Blocked })
	if calls != 1 {
		t.Fatalf("%d dispatch calls for one blocked flow, want 1", calls)
	}
}

func TestLeftVerdictRemovesWithoutCountingReleased(t *testing.T) {
	q := newQueue(t, Config{})
	push(t, q, req{1, "a", BandStandard}, 5, 0, time.Hour)
	push(t, q, req{2, "a", BandStandard}, 5, 0, time.Hour)
	n := q.Release(3, func(e Entry[req]) Verdict {
		if e.Value.id == 1 {
			return Left
		}
		return Dispatched
	})
	s := q.Stats()
	if n != 1 || s.Released != 1 || s.Left != 1 || q.Len() != 0 || s.Bytes != 0 {
		t.Fatalf("released %d, stats %+v", n, s)
	}
}

func TestBounds(t *testing.T) {
	q := newQueue(t, Config{MaxRequests: 3, MaxBytes: 100})
	push(t, q, req{1, "a", BandStandard}, 60, 0, time.Hour)
	if _, err := q.Push(BandStandard, []byte("a"), 41, 0, time.Hour, req{id: 2}); !errors.Is(err, ErrFullBytes) {
		t.Fatalf("61+41 > 100 bytes: err %v, want ErrFullBytes", err)
	}
	push(t, q, req{3, "a", BandStandard}, 40, 0, time.Hour) // exactly 100
	push(t, q, req{4, "b", BandSheddable}, 0, 0, time.Hour)
	if _, err := q.Push(BandSheddable, []byte("c"), 0, 0, time.Hour, req{id: 5}); !errors.Is(err, ErrFull) {
		t.Fatalf("4th request: err %v, want ErrFull", err)
	}
	s := q.Stats()
	if s.RejectedFull != 2 || q.Len() != 3 || s.Bytes != 100 || s.Enqueued != 3 {
		t.Fatalf("stats %+v", s)
	}
	// Room comes back when requests leave.
	q.Release(1, func(e Entry[req]) Verdict {
		if e.Value.id == 1 {
			return Dispatched
		}
		return Blocked
	})
	push(t, q, req{6, "c", BandSheddable}, 60, 0, time.Hour)
	if q.Stats().Bytes != 100 {
		t.Fatalf("bytes %d, want 100", q.Stats().Bytes)
	}
	// A negative size counts as 0; an unknown band waits as Sheddable.
	q2 := newQueue(t, Config{MaxBytes: 1})
	h, err := q2.Push(Band(9), nil, -5, 0, time.Hour, req{id: 7})
	if err != nil || q2.Stats().Bytes != 0 || q2.BandLen(BandSheddable) != 1 || !q2.Contains(h) {
		t.Fatalf("err %v, stats %+v", err, q2.Stats())
	}
}

func TestExpireEarliestDeadlineFirst(t *testing.T) {
	q := newQueue(t, Config{})
	// Deadlines: id1 at 100, id2 at 30, id3 at 30 (pushed later), id4 at 50.
	push(t, q, req{1, "a", BandStandard}, 1, 0, 100)
	push(t, q, req{2, "a", BandStandard}, 1, 10, 20)
	push(t, q, req{3, "b", BandSheddable}, 1, 20, 10)
	push(t, q, req{4, "c", BandStandard}, 1, 0, 50)
	if d, ok := q.NextDeadline(); !ok || d != 30 {
		t.Fatalf("next deadline %v %v, want 30", d, ok)
	}
	var got []string
	collect := func(e Entry[req]) { got = append(got, fmt.Sprintf("%d@%v", e.Value.id, e.Waited)) }
	if n := q.Expire(29, collect); n != 0 {
		t.Fatalf("expired %d before any deadline", n)
	}
	if n := q.Expire(50, collect); n != 3 {
		t.Fatalf("expired %d at 50, want 3", n)
	}
	if want := []string{"2@40ns", "3@30ns", "4@50ns"}; !slices.Equal(got, want) {
		t.Fatalf("expired %v, want %v", got, want)
	}
	if ids := drain(q, 60); !slices.Equal(ids, []int{1}) {
		t.Fatalf("left %v, want [1]", ids)
	}
	if s := q.Stats(); s.Expired != 3 || s.Released != 1 {
		t.Fatalf("stats %+v", s)
	}
	// A zero or negative TTL expires at once.
	push(t, q, req{5, "a", BandStandard}, 1, 100, 0)
	push(t, q, req{6, "a", BandStandard}, 1, 100, -time.Second)
	if n := q.Expire(100, nil); n != 2 {
		t.Fatalf("expired %d with TTL <= 0, want 2", n)
	}
}

func TestRemoveAndStaleHandles(t *testing.T) {
	q := newQueue(t, Config{})
	h1 := push(t, q, req{1, "a", BandStandard}, 7, 0, time.Hour)
	h2 := push(t, q, req{2, "a", BandStandard}, 7, 0, time.Hour)
	h3 := push(t, q, req{3, "b", BandStandard}, 7, 0, time.Hour)
	e, ok := q.Remove(h2, 5)
	if !ok || e.Value.id != 2 || e.Waited != 5 || e.Bytes != 7 {
		t.Fatalf("remove: %+v %v", e, ok)
	}
	if _, ok := q.Remove(h2, 5); ok {
		t.Fatal("removed twice")
	}
	if _, ok := q.Remove(Handle{}, 5); ok {
		t.Fatal("zero handle removed something")
	}
	// h2's slot is reused by the next push: the old handle must not name it.
	h4 := push(t, q, req{4, "a", BandStandard}, 7, 0, time.Hour)
	if h4.idx != h2.idx {
		t.Fatalf("slot not reused (test premise): %v %v", h4, h2)
	}
	if q.Contains(h2) || !q.Contains(h4) {
		t.Fatal("stale handle names the new request")
	}
	if _, ok := q.Remove(h2, 5); ok {
		t.Fatal("stale handle removed the new request")
	}
	if ids := drain(q, 9); !slices.Equal(ids, []int{1, 3, 4}) {
		t.Fatalf("release order %v, want [1 3 4]", ids)
	}
	if q.Contains(h1) || q.Contains(h3) {
		t.Fatal("released requests still queued")
	}
	if _, ok := q.Remove(h1, 9); ok {
		t.Fatal("removed a released request")
	}
	if s := q.Stats(); s.Abandoned != 1 || s.Released != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCallbacksCannotChangeTheQueue(t *testing.T) {
	q := newQueue(t, Config{})
	h := push(t, q, req{1, "a", BandStandard}, 1, 0, 10)
	q.Release(1, func(e Entry[req]) Verdict {
		if _, err := q.Push(BandStandard, nil, 1, 1, 1, req{}); !errors.Is(err, ErrBusy) {
			t.Errorf("push inside release: %v", err)
		}
		if _, ok := q.Remove(h, 1); ok {
			t.Error("remove inside release succeeded")
		}
		return Blocked
	})
	q.Expire(10, func(Entry[req]) {
		if _, err := q.Push(BandStandard, nil, 1, 1, 1, req{}); !errors.Is(err, ErrBusy) {
			t.Errorf("push inside expire: %v", err)
		}
	})
	if q.Len() != 0 {
		t.Fatalf("len %d", q.Len())
	}
}

// The flow table never grows past MaxRequests records, however many keys
// clients send; idle flows are reused oldest first.
func TestFlowTableBounded(t *testing.T) {
	q := newQueue(t, Config{MaxRequests: 4})
	for i := range 1000 {
		h := push(t, q, req{i, fmt.Sprint("k", i), BandStandard}, 1, 0, time.Hour)
		if i%2 == 0 {
			q.Remove(h, 0)
		} else {
			drain(q, 0)
		}
	}
	if len(q.flows) > 4 || len(q.flowIndex) > 4 || len(q.items) > 4 {
		t.Fatalf("flows %d, index %d, items %d: want at most 4 each", len(q.flows), len(q.flowIndex), len(q.items))
	}
	// With three flows active, a fourth key takes the one idle record.
	for i := range 3 {
		push(t, q, req{i, fmt.Sprint("active", i), BandStandard}, 1, 0, time.Hour)
	}
	push(t, q, req{9, "new", BandSheddable}, 1, 0, time.Hour)
	if _, err := q.Push(BandSheddable, []byte("newer"), 1, 0, time.Hour, req{}); !errors.Is(err, ErrFull) {
		t.Fatalf("err %v, want ErrFull", err)
	}
	if len(q.flowIndex) != 4 || q.Stats().Flows != 4 {
		t.Fatalf("index %d, flows %d", len(q.flowIndex), q.Stats().Flows)
	}
}

func TestWaiting(t *testing.T) {
	q := newQueue(t, Config{})
	if q.Waiting(BandStandard) || q.Waiting(BandSheddable) {
		t.Fatal("empty queue waiting")
	}
	h := push(t, q, req{1, "a", BandSheddable}, 1, 0, time.Hour)
	if q.Waiting(BandStandard) || !q.Waiting(BandSheddable) {
		t.Fatal("a Standard request must not queue behind Sheddable ones; a Sheddable one must")
	}
	q.Remove(h, 0)
	push(t, q, req{2, "a", BandStandard}, 1, 0, time.Hour)
	if !q.Waiting(BandStandard) || !q.Waiting(BandSheddable) {
		t.Fatal("both bands are behind a queued Standard request")
	}
}

func TestBandFor(t *testing.T) {
	for c, want := range map[scheduler.Criticality]struct {
		b  Band
		ok bool
	}{
		scheduler.Critical: {0, false}, scheduler.Standard: {BandStandard, true},
		scheduler.Sheddable: {BandSheddable, true}, scheduler.Criticality(7): {BandSheddable, true},
	} {
		if b, ok := BandFor(c); b != want.b || ok != want.ok {
			t.Errorf("BandFor(%v) = %v %v, want %v %v", c, b, ok, want.b, want.ok)
		}
	}
}

// Once the queue has held its peak, Push, Release, Expire and Remove of
// known flows allocate nothing.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	q := newQueue(t, Config{MaxRequests: 64})
	keys := [][]byte{[]byte("model-a"), []byte("model-b"), []byte("tenant-c")}
	models := []string{"model-a", "model-d"}
	var hs [64]Handle
	cycle := func() {
		for i := range hs {
			var err error
			if i%4 == 3 {
				hs[i], err = q.PushString(Band(i%2), models[i%2], 4096, 0, time.Duration(i%5)*time.Millisecond, req{id: i})
			} else {
				hs[i], err = q.Push(Band(i%2), keys[i%3], 4096, 0, time.Duration(i%5)*time.Millisecond, req{id: i})
			}
			if err != nil {
				panic(err)
			}
		}
		for i := 0; i < len(hs); i += 7 {
			q.Remove(hs[i], 0)
		}
		q.Expire(2*time.Millisecond, func(Entry[req]) {})
		k := 0
		q.Release(time.Millisecond, func(Entry[req]) Verdict {
			k++
			if k%3 == 0 {
				return Blocked
			}
			return Dispatched
		})
		q.Expire(time.Hour, nil)
	}
	cycle()
	if a := testing.AllocsPerRun(50, cycle); a != 0 {
		t.Fatalf("%v allocations per cycle, want 0", a)
	}
	if q.Len() != 0 {
		t.Fatalf("len %d", q.Len())
	}
}

// TestRandomOperations checks the queue's invariants against a simple
// model under random pushes, removals, expiries and releases: every
// request leaves exactly once, counts and bytes agree, FIFO holds inside
// each (flow, band), and no Sheddable request is dispatched while a
// Standard one that could have been is waiting.
func TestRandomOperations(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomOps(t, seed) })
	}
}

func randomOps(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	cfg := Config{MaxRequests: 1 + rng.IntN(40), MaxBytes: int64(1 + rng.IntN(5000))}
	q := newQueue(t, cfg)
	type model struct {
		h        Handle
		r        req
		bytes    int64
		deadline time.Duration
		seq      int
	}
	live := map[int]*model{}
	lastSeq := map[string]int{} // flow|band -> seq of the last request that left by release
	left := map[int]bool{}
	var now time.Duration
	next := 0
	leave := func(id int, why string) {
		if left[id] {
			t.Fatalf("request %d left twice (%s)", id, why)
		}
		if live[id] == nil {
			t.Fatalf("request %d left (%s) but was never queued", id, why)
		}
		left[id] = true
		delete(live, id)
	}
	for step := range 3000 {
		now += time.Duration(rng.IntN(5))
		switch op := rng.IntN(10); {
		case op < 5:
			r := req{next, fmt.Sprint("f", rng.IntN(6)), Band(rng.IntN(2))}
			bytes := int64(rng.IntN(500))
			ttl := time.Duration(rng.IntN(200))
			var held int64
			for _, m := range live {
				held += m.bytes
			}
			h, err := q.Push(r.band, []byte(r.flow), bytes, now, ttl, r)
			switch {
			case len(live) >= cfg.MaxRequests:
				if !errors.Is(err, ErrFull) {
					t.Fatalf("step %d: push with %d queued: %v", step, len(live), err)
				}
			case held+bytes > cfg.MaxBytes:
				if !errors.Is(err, ErrFullBytes) {
					t.Fatalf("step %d: push over bytes: %v", step, err)
				}
			case err != nil:
				t.Fatalf("step %d: push: %v", step, err)
			default:
				live[next] = &model{h, r, bytes, now + ttl, next}
			}
			next++
		case op < 6:
			for id, m := range live {
				if _, ok := q.Remove(m.h, now); !ok {
					t.Fatalf("step %d: remove of queued %d failed", step, id)
				}
				leave(id, "removed")
				break
			}
		case op < 7:
			q.Expire(now, func(e Entry[req]) {
				m := live[e.Value.id]
				if m == nil || m.deadline > now {
					t.Fatalf("step %d: expired %+v early or unknown", step, e)
				}
				leave(e.Value.id, "expired")
			})
			for id, m := range live {
				if m.deadline <= now {
					t.Fatalf("step %d: %d past its deadline still queued", step, id)
				}
			}
		default:
			blockStandard := rng.IntN(2) == 0
			budget := rng.IntN(8)
			q.Release(now, func(e Entry[req]) Verdict {
				if budget == 0 || (blockStandard && e.Band == BandStandard) {
					return Blocked
				}
				if e.Band == BandSheddable && !blockStandard {
					for _, m := range live {
						if m.r.band == BandStandard {
							t.Fatalf("step %d: sheddable %d served before standard %d", step, e.Value.id, m.r.id)
						}
					}
				}
				budget--
				k := e.Value.flow + e.Band.String()
				if s, ok := lastSeq[k]; ok && s > e.Value.id {
					t.Fatalf("step %d: FIFO broken in %s: %d after %d", step, k, e.Value.id, s)
				}
				lastSeq[k] = e.Value.id
				leave(e.Value.id, "released")
				return Dispatched
			})
		}
		var held int64
		var n [NumBands]int
		for _, m := range live {
			held += m.bytes
			n[m.r.band]++
		}
		s := q.Stats()
		if q.Len() != len(live) || s.Bytes != held || s.Len != n {
			t.Fatalf("step %d: queue %d/%d bytes %d/%d bands %v/%v", step, q.Len(), len(live), s.Bytes, held, s.Len, n)
		}
		if s.Enqueued != s.Released+s.Expired+s.Abandoned+s.Left+uint64(q.Len()) {
			t.Fatalf("step %d: counters do not add up: %+v", step, s)
		}
	}
}

func BenchmarkPushRelease(b *testing.B) {
	q := newQueue(b, Config{MaxRequests: 1024})
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d")}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range 64 {
			if _, err := q.Push(Band(j%2), keys[j%4], 4096, 0, time.Second, req{id: j}); err != nil {
				b.Fatal(err)
			}
		}
		q.Release(0, func(Entry[req]) Verdict { return Dispatched })
	}
}
