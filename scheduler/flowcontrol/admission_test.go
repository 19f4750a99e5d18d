package flowcontrol

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

const admittedKey = "wasm-epp.flow.admitted"

func fleetSnapshot(n, waiting int) *scheduler.Snapshot {
	s := &scheduler.Snapshot{Endpoints: make([]scheduler.Endpoint, n)}
	for i := range s.Endpoints {
		s.Endpoints[i] = scheduler.Endpoint{
			ID:      scheduler.EndpointID{Name: fmt.Sprint("pod-", i)},
			Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8000,
			Metrics: scheduler.Metrics{WaitingQueueSize: waiting, KVCacheUsage: 0.1},
		}
	}
	return s
}

// copyOf is one VM's private copy of a snapshot, as each VM decodes its own.
func copyOf(s *scheduler.Snapshot) *scheduler.Snapshot {
	c := *s
	c.Endpoints = append([]scheduler.Endpoint(nil), s.Endpoints...)
	return &c
}

func waiting(s *scheduler.Snapshot) []int {
	w := make([]int, len(s.Endpoints))
	for i := range w {
		w[i] = s.Endpoints[i].Metrics.WaitingQueueSize
	}
	return w
}

func TestAdmissionSharesCountsBetweenVMs(t *testing.T) {
	store := &MemStore{}
	base := fleetSnapshot(3, 2)
	a, b := NewAdmission(store, admittedKey), NewAdmission(store, admittedKey)
	sa, sb := copyOf(base), copyOf(base)
	const tag = 42

	if err := a.Sync(sa, tag); err != nil {
		t.Fatal(err)
	}
	if err := a.Admit(sa, tag, 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Admit(sa, tag, 1); !errors.Is(err, ErrConflict) {
		t.Fatalf("second admit without a sync: %v, want ErrConflict", err)
	}
	if err := a.Sync(sa, tag); err != nil {
		t.Fatal(err)
	}
	if err := a.Admit(sa, tag, 2); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(waiting(sa)); got != "[2 3 3]" {
		t.Fatalf("VM a's copy %s, want [2 3 3]", got)
	}
	// b sees a's two admissions, once, however often it syncs.
	for range 3 {
		if err := b.Sync(sb, tag); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(waiting(sb)); got != "[2 3 3]" {
		t.Fatalf("VM b's copy %s, want [2 3 3]", got)
	}
	// Both synced; a writes first, so b's write is refused and changes nothing.
	if err := a.Sync(sa, tag); err != nil {
		t.Fatal(err)
	}
	if err := a.Admit(sa, tag, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Admit(sb, tag, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("b's stale write: %v, want ErrConflict", err)
	}
	if err := b.Sync(sb, tag); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(waiting(sb)); got != "[3 3 3]" {
		t.Fatalf("VM b's copy after a conflict and a sync %s, want [3 3 3]", got)
	}
	if s := b.Stats(); s.Conflicts != 1 || s.Admitted != 0 {
		t.Fatalf("b stats %+v", s)
	}
	if s := a.Stats(); s.Admitted != 3 {
		t.Fatalf("a stats %+v", s)
	}
}

func TestAdmissionNewSnapshotStartsOver(t *testing.T) {
	store := &MemStore{}
	a, b := NewAdmission(store, admittedKey), NewAdmission(store, admittedKey)
	old := fleetSnapshot(2, 0)
	sa := copyOf(old)
	mustSync(t, a, sa, 1)
	if err := a.Admit(sa, 1, 0); err != nil {
		t.Fatal(err)
	}
	// Fresh metrics: both VMs decode the new snapshot; the old record
	// counts for nothing on it.
	fresh := fleetSnapshot(2, 4)
	sa, sb := copyOf(fresh), copyOf(fresh)
	mustSync(t, a, sa, 2)
	mustSync(t, b, sb, 2)
	if got := fmt.Sprint(waiting(sa), waiting(sb)); got != "[4 4] [4 4]" {
		t.Fatalf("copies %s, want the fresh metrics untouched", got)
	}
	if err := b.Admit(sb, 2, 1); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a, sa, 2)
	if got := fmt.Sprint(waiting(sa)); got != "[4 5]" {
		t.Fatalf("a's copy %s, want [4 5]", got)
	}
	// A VM still on the old snapshot (it has not read the new version yet)
	// sees nothing of the new record, and its admission replaces it.
	stale := copyOf(old)
	c := NewAdmission(store, admittedKey)
	mustSync(t, c, stale, 1)
	if got := fmt.Sprint(waiting(stale)); got != "[0 0]" {
		t.Fatalf("stale copy %s", got)
	}
}

func TestAdmissionCorruptRecordIsReplaced(t *testing.T) {
	for name, bad := range map[string][]byte{
		"garbage":        []byte("not a record"),
		"short":          {'W', 'A', 1, 0},
		"wrong version":  appendRecord([]byte{}, 7, nil)[:2],
		"length":         append(appendRecord(nil, 7, []admitted{{0, 1}}), 0),
		"zero count":     appendRecord(nil, 7, []admitted{{0, 0}}),
		"unsorted":       appendRecord(nil, 7, []admitted{{1, 1}, {0, 1}}),
		"duplicate":      appendRecord(nil, 7, []admitted{{1, 1}, {1, 1}}),
		"index too high": appendRecord(nil, 7, []admitted{{5, 1}}),
		"huge count":     appendRecord(nil, 7, []admitted{{0, 1 << 31}}),
	} {
		t.Run(name, func(t *testing.T) {
			store := &MemStore{}
			if err := store.Set(admittedKey, bad, 0); err != nil {
				t.Fatal(err)
			}
			a := NewAdmission(store, admittedKey)
			s := fleetSnapshot(2, 1)
			mustSync(t, a, s, 7)
			if got := fmt.Sprint(waiting(s)); got != "[1 1]" || a.Stats().Corrupt != 1 {
				t.Fatalf("copy %s, corrupt %d: a bad record must count for nothing", got, a.Stats().Corrupt)
			}
			if err := a.Admit(s, 7, 1); err != nil {
				t.Fatal(err)
			}
			v, _, _ := store.Get(admittedKey, nil)
			tag, rec, ok := decodeRecord(v, nil)
			if !ok || tag != 7 || fmt.Sprint(rec) != "[{1 1}]" {
				t.Fatalf("record after admit: %v %d %v", ok, tag, rec)
			}
		})
	}
}

type failingStore struct {
	Store
	getErr, setErr error
}

func (f *failingStore) Get(key string, buf []byte) ([]byte, uint32, error) {
	if f.getErr != nil {
		return buf[:0], 0, f.getErr
	}
	return f.Store.Get(key, buf)
}

func (f *failingStore) Set(key string, v []byte, cas uint32) error {
	if f.setErr != nil {
		return f.setErr
	}
	return f.Store.Set(key, v, cas)
}

// A broken store never loses local accounting: Place still counts the
// request in this VM's copy and says it had no agreement.
func TestPlaceWithFailingStore(t *testing.T) {
	boom := errors.New("boom")
	for name, st := range map[string]*failingStore{
		"get": {Store: &MemStore{}, getErr: boom},
		"set": {Store: &MemStore{}, setErr: boom},
	} {
		t.Run(name, func(t *testing.T) {
			a := NewAdmission(st, admittedKey)
			s := fleetSnapshot(2, 0)
			i, err := a.Place(s, 1, func() int { return 1 })
			if i != 1 || !errors.Is(err, boom) {
				t.Fatalf("Place = %d, %v; want 1 and the store error", i, err)
			}
			if got := fmt.Sprint(waiting(s)); got != "[0 1]" {
				t.Fatalf("copy %s, want the request counted locally", got)
			}
			if a.Stats().StoreErrors == 0 {
				t.Fatal("store error not counted")
			}
		})
	}
	a := NewAdmission(&MemStore{}, admittedKey)
	if i, err := a.Place(fleetSnapshot(1, 0), 1, func() int { return 3 }); i != -1 || err == nil {
		t.Fatalf("index outside the snapshot: %d %v", i, err)
	}
	if i, err := a.Place(fleetSnapshot(1, 0), 1, func() int { return -1 }); i != -1 || err != nil {
		t.Fatalf("declined: %d %v", i, err)
	}
}

// racingStore refuses every conditional write to a key that exists, as if
// other VMs always wrote between this VM's read and write. (A conditional
// write to a missing key creates it, as in shared data.)
type racingStore struct{ MemStore }

func (r *racingStore) Set(key string, v []byte, cas uint32) error {
	if _, _, err := r.MemStore.Get(key, nil); cas != 0 && err == nil {
		return ErrCASMismatch
	}
	return r.MemStore.Set(key, v, cas)
}

func TestPlaceRetriesThenGivesUp(t *testing.T) {
	st := &racingStore{}
	a := NewAdmission(st, admittedKey)
	s := fleetSnapshot(1, 0)
	tries := 0
	i, err := a.Place(s, 1, func() int { tries++; return 0 })
	if i != -1 || !errors.Is(err, ErrContention) || tries != maxPlaceAttempts {
		t.Fatalf("Place = %d, %v after %d tries; want -1, ErrContention, %d", i, err, tries, maxPlaceAttempts)
	}
	if got := fmt.Sprint(waiting(s)); got != "[0]" {
		t.Fatalf("copy %s: nothing was admitted", got)
	}
}

func mustSync(t *testing.T, a *Admission, s *scheduler.Snapshot, tag uint64) {
	t.Helper()
	if err := a.Sync(s, tag); err != nil {
		t.Fatal(err)
	}
}

// vm is one worker VM of the concurrency test: its own scheduler, snapshot
// copy, queue and admission over the shared store.
type vm struct {
	sched *scheduler.Scheduler
	snap  *scheduler.Snapshot
	queue *Queue[int]
	adm   *Admission
	req   scheduler.Request
	sent  []int
}

func newVM(t *testing.T, store Store, base *scheduler.Snapshot, seed uint64, queued int, shared bool) *vm {
	t.Helper()
	s, err := scheduler.New(scheduler.Config{}, nil, scheduler.Options{Rand: rand.NewPCG(seed, 7)})
	if err != nil {
		t.Fatal(err)
	}
	q, err := New[int](Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range queued {
		if _, err := q.Push(BandStandard, []byte("model"), 4096, 0, time.Hour, i); err != nil {
			t.Fatal(err)
		}
	}
	v := &vm{sched: s, snap: copyOf(base), queue: q, sent: make([]int, len(base.Endpoints)),
		req: scheduler.Request{Model: "model", Criticality: scheduler.Standard}}
	if shared {
		v.adm = NewAdmission(store, admittedKey)
	} else {
		v.adm = NewAdmission(&MemStore{}, admittedKey) // a store of its own: local accounting only
	}
	return v
}

// release is what a VM's tick does: offer queued requests to the real
// scheduler under admission.
func (v *vm) release(tag uint64) {
	try := func() int {
		res := v.sched.Schedule(&v.req, v.snap)
		if res.Outcome != scheduler.Routed {
			return -1
		}
		for i := range v.snap.Endpoints {
			if &v.snap.Endpoints[i] == res.Endpoint {
				return i
			}
		}
		return -1
	}
	v.queue.Release(0, func(Entry[int]) Verdict {
		i, err := v.adm.Place(v.snap, tag, try)
		if err != nil || i < 0 {
			return Blocked
		}
		v.sent[i]++
		return Dispatched
	})
}

// Four VMs, each with a queue of its own, release at the same moment onto
// endpoints with room for three more requests each (the decision tree
// admits Standard requests while the waiting queue is at most 5). With the
// shared record they send exactly that many in all; each on its own would
// fill every slot itself.
func TestFourVMsDoNotOversubscribe(t *testing.T) {
	const endpoints, startWaiting, vms = 8, 3, 4
	room := endpoints * (scheduler.DefaultQueueThresholdCritical - startWaiting + 1)
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) {
			store := &MemStore{}
			base := fleetSnapshot(endpoints, startWaiting)
			all := make([]*vm, vms)
			for k := range all {
				all[k] = newVM(t, store, base, uint64(k), 100, shared)
			}
			var wg sync.WaitGroup
			for _, v := range all {
				wg.Go(func() {
					for range 20 { // several ticks each, interleaved with the others
						v.release(99)
					}
				})
			}
			wg.Wait()
			total, perEndpoint := 0, make([]int, endpoints)
			for _, v := range all {
				for i, n := range v.sent {
					total += n
					perEndpoint[i] += n
				}
			}
			t.Logf("shared=%v: %d requests sent, per endpoint %v (room %d)", shared, total, perEndpoint, room)
			if shared {
				if total != room {
					t.Fatalf("%d sent, want exactly the %d free slots", total, room)
				}
				for i, n := range perEndpoint {
					if startWaiting+n > scheduler.DefaultQueueThresholdCritical+1 {
						t.Fatalf("endpoint %d got %d: over its capacity", i, n)
					}
				}
				return
			}
			if total != vms*room {
				t.Fatalf("without sharing %d sent, want each VM to fill every slot (%d): the test no longer shows the problem", total, vms*room)
			}
		})
	}
}

func BenchmarkPlace(b *testing.B) {
	store := &MemStore{}
	a := NewAdmission(store, admittedKey)
	s := fleetSnapshot(100, 0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := a.Place(s, 5, func() int { i = (i + 7) % 100; return i }); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecodeRecord: any bytes in the shared record decode without panic,
// and a record accepted re-encodes to exactly its bytes (nothing is
// accepted that the encoder would not write).
func FuzzDecodeRecord(f *testing.F) {
	f.Add(appendRecord(nil, 0, nil))
	f.Add(appendRecord(nil, 42, []admitted{{0, 1}, {3, 7}}))
	f.Add([]byte("WA\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tag, rec, ok := decodeRecord(b, nil)
		if !ok {
			if len(rec) != 0 {
				t.Fatalf("refused record left %d pairs", len(rec))
			}
			return
		}
		if again := appendRecord(nil, tag, rec); string(again) != string(b) {
			t.Fatalf("accepted %x, re-encodes to %x", b, again)
		}
	})
}
