package prefix

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func randomChain(r *rand.Rand, n int) []uint64 {
	b := make([]uint64, n)
	h := r.Uint64()
	for i := range b {
		h = chain(h, r.Uint64())
		b[i] = h
	}
	return b
}

// extend returns a copy of base[:n] followed by fresh blocks up to total.
func extend(r *rand.Rand, base []uint64, n, total int) []uint64 {
	b := append([]uint64(nil), base[:n]...)
	h := b[n-1] ^ r.Uint64()
	for len(b) < total {
		h = chain(h, r.Uint64())
		b = append(b, h)
	}
	return b
}

func newTestIndex(t testing.TB, cfg IndexConfig, s Store) *Index {
	t.Helper()
	x, err := NewIndex(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestRecordThenLookup(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := newTestIndex(t, IndexConfig{}, nil)
	a := randomChain(r, 103)
	x.Record(a, 7, 0, t0)
	var m Match
	x.Lookup(a, &m)
	if got := m.Blocks(7); got != 100 { // positions every 4 blocks: 103 → 100
		t.Fatalf("matched %d blocks, want 100", got)
	}
	if m.Len() != 1 || m.Blocks(8) != 0 || m.Total != 103 {
		t.Fatalf("match %+v", m)
	}
	// A prompt sharing 41 blocks matches 40 of them; another prompt nothing.
	b := extend(r, a, 41, 90)
	x.Lookup(b, &m)
	if got := m.Blocks(7); got != 40 {
		t.Fatalf("shared prefix: matched %d blocks, want 40", got)
	}
	x.Lookup(randomChain(r, 50), &m)
	if m.Len() != 0 {
		t.Fatalf("unrelated prompt matched %+v", m)
	}
	// Another endpoint receiving b: both known, each to its own depth.
	x.Lookup(b, &m)
	x.Record(b, 9, m.Blocks(9), t0)
	x.Lookup(b, &m)
	if m.Blocks(7) != 40 || m.Blocks(9) != 88 || m.Best() != 88 {
		t.Fatalf("two endpoints: %d and %d, want 40 and 88", m.Blocks(7), m.Blocks(9))
	}
}

func TestDeepestEntryWinsOverGaps(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := newTestIndex(t, IndexConfig{}, nil)
	a := randomChain(r, 64)
	x.Record(a, 5, 0, t0)
	// Evicting shallow entries (here: forgetting them) leaves the deepest,
	// which still proves the whole prefix.
	x.Forget(a[:32], 5, 0, t0)
	var m Match
	x.Lookup(a, &m)
	if got := m.Blocks(5); got != 64 {
		t.Fatalf("matched %d blocks, want 64", got)
	}
}

func TestForgetRemovesTheMispredictedEntries(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := newTestIndex(t, IndexConfig{}, nil)
	a := randomChain(r, 80)
	x.Record(a, 3, 0, t0)
	// The endpoint reported only 20 blocks cached of a predicted 80.
	x.Forget(a, 3, 20, t0.Add(time.Second))
	var m Match
	x.Lookup(a, &m)
	if got := m.Blocks(3); got != 20 {
		t.Fatalf("after forgetting past block 20: matched %d, want 20", got)
	}
	// Entries recorded after the cut-off time are kept.
	x.Record(a, 3, 20, t0.Add(2*time.Second))
	x.Forget(a, 3, 0, t0.Add(time.Second))
	x.Lookup(a, &m)
	if got := m.Blocks(3); got != 80 {
		t.Fatalf("a newer record was forgotten: matched %d, want 80", got)
	}
	if s := x.Stats(); s.Forgotten == 0 {
		t.Fatal("nothing counted as forgotten")
	}
}

func TestBoundsAndLRUEviction(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	store := NewMemStore()
	cfg := IndexConfig{MaxEntries: 256, BucketEntries: 8, RecordEvery: 1, KeyPrefix: "t."}
	x := newTestIndex(t, cfg, store)
	if x.Capacity() != 256 || x.Buckets() != 32 {
		t.Fatalf("capacity %d in %d buckets", x.Capacity(), x.Buckets())
	}
	old := randomChain(r, 8)
	x.Record(old, 1, 0, t0)
	now := t0.Add(time.Minute)
	for i := range 200 {
		x.Record(randomChain(r, 10), uint32(2+i%5), 0, now)
		if i%20 == 0 {
			x.Sync()
		}
	}
	x.Sync()
	if n := x.Entries(); n > x.Capacity() {
		t.Fatalf("%d entries over capacity %d", n, x.Capacity())
	}
	st := x.Stats()
	if st.Evicted == 0 {
		t.Fatal("2,008 records into 256 slots evicted nothing")
	}
	var m Match
	x.Lookup(old, &m)
	if m.Blocks(1) != 0 {
		t.Fatalf("the oldest prompt survived %d newer records: matched %d", st.Recorded, m.Blocks(1))
	}
	// The store holds exactly the buckets, the directory and the
	// generation, within MaxBytes.
	if keys, _ := store.Keys(); keys != x.Buckets()+2 {
		t.Fatalf("%d keys in the store, want %d", keys, x.Buckets()+2)
	}
	if b := store.Bytes(); b > DefaultMaxBytes || b < x.Bytes() {
		t.Fatalf("store holds %d bytes; index bytes %d", b, x.Bytes())
	}
	// MaxBytes bounds the layout too.
	small := newTestIndex(t, IndexConfig{MaxEntries: 1 << 16, MaxBytes: 20000, BucketEntries: 16}, nil)
	if small.Bytes() > 20000 {
		t.Fatalf("index of %d bytes over MaxBytes 20000", small.Bytes())
	}
}

func TestCrossVMVisibility(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	store := NewMemStore()
	vms := make([]*Index, 4)
	for i := range vms {
		vms[i] = newTestIndex(t, IndexConfig{KeyPrefix: "wasm-epp."}, store)
	}
	a := randomChain(r, 40)
	vms[0].Record(a, 11, 0, t0)
	var m Match
	vms[1].Lookup(a, &m)
	if m.Len() != 0 {
		t.Fatal("another VM saw a write before any Sync")
	}
	vms[1].Sync() // the writer has not synced yet
	vms[1].Lookup(a, &m)
	if m.Len() != 0 {
		t.Fatal("another VM saw a write its writer had not synced")
	}
	vms[0].Sync()
	for i, vm := range vms[1:] {
		vm.Sync()
		vm.Lookup(a, &m)
		if m.Blocks(11) != 40 {
			t.Fatalf("VM %d: matched %d after both synced, want 40", i+1, m.Blocks(11))
		}
	}
	// Writes of two VMs to the same blocks merge, they do not overwrite.
	vms[2].Record(a, 12, 0, t0)
	vms[3].Record(a, 13, 0, t0)
	vms[2].Sync()
	vms[3].Sync()
	vms[0].Sync()
	vms[0].Lookup(a, &m)
	if m.Blocks(11) != 40 || m.Blocks(12) != 40 || m.Blocks(13) != 40 {
		t.Fatalf("merge lost a VM's write: %d %d %d", m.Blocks(11), m.Blocks(12), m.Blocks(13))
	}
	// A second Sync with nothing changed reads only the directory.
	before := vms[0].Stats().Fetched
	vms[0].Sync()
	if vms[0].Stats().Fetched != before {
		t.Fatal("a Sync with nothing changed fetched buckets")
	}
}

// casRacer is a store whose Set fails with a CAS mismatch the first time
// for every key, as when another worker wrote in between.
type casRacer struct {
	*MemStore
	seen map[string]bool
}

func (s *casRacer) Set(key string, v []byte, cas uint32) error {
	if cas != 0 && !s.seen[key] {
		s.seen[key] = true
		// Another VM's write lands first.
		cur, c, _ := s.MemStore.Get(key, nil)
		_ = s.MemStore.Set(key, cur, c)
		return ErrCASMismatch
	}
	return s.MemStore.Set(key, v, cas)
}

func TestCASContentionRetries(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	base := NewMemStore()
	a := randomChain(r, 16)
	seedVM := newTestIndex(t, IndexConfig{}, base)
	seedVM.Record(a, 1, 0, t0)
	seedVM.Sync()
	racer := &casRacer{MemStore: base, seen: map[string]bool{}}
	x := newTestIndex(t, IndexConfig{}, racer)
	x.Record(a, 2, 0, t0)
	x.Sync()
	if st := x.Stats(); st.CASRetries == 0 || st.DroppedWrites != 0 {
		t.Fatalf("stats %+v: want retries and no dropped write", st)
	}
	y := newTestIndex(t, IndexConfig{}, base)
	y.Sync()
	var m Match
	y.Lookup(a, &m)
	if m.Blocks(1) != 16 || m.Blocks(2) != 16 {
		t.Fatalf("after contention: %d and %d, want 16 and 16", m.Blocks(1), m.Blocks(2))
	}
}

func TestStoreKeysStayBoundedUnderChurn(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	store := NewMemStore()
	x := newTestIndex(t, IndexConfig{MaxEntries: 4096}, store)
	for i := range 1000 { // 1,000 endpoints coming and going
		x.Record(randomChain(r, 20), EndpointKey("ns", fmt.Sprint("pod-", i), "10.0.0.1", 8000), 0, t0.Add(time.Duration(i)*time.Second))
		x.Sync()
	}
	if keys, _ := store.Keys(); keys != x.Buckets()+2 || x.Entries() > x.Capacity() {
		t.Fatalf("%d keys (want %d), %d entries (capacity %d)", keys, x.Buckets()+2, x.Entries(), x.Capacity())
	}
}

func TestForeignValuesAreReadAsEmpty(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	store := NewMemStore()
	x := newTestIndex(t, IndexConfig{MaxEntries: 64, BucketEntries: 4}, store)
	for _, k := range x.keys {
		_ = store.Set(k, []byte("garbage"), 0)
	}
	_ = store.Set(x.dirKey, []byte("WPD1 but short"), 0)
	x.Sync()
	a := randomChain(r, 8)
	x.Record(a, 4, 0, t0)
	x.Sync()
	y := newTestIndex(t, IndexConfig{MaxEntries: 64, BucketEntries: 4}, store)
	y.Sync()
	var m Match
	y.Lookup(a, &m)
	if m.Blocks(4) != 8 {
		t.Fatalf("after overwriting foreign values: matched %d, want 8", m.Blocks(4))
	}
}

func TestRecordCapsLongPrompts(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	x := newTestIndex(t, IndexConfig{MaxRecord: 16}, nil)
	a := randomChain(r, 4000)
	x.Record(a, 1, 0, t0)
	if p := x.Pending(); p > 16 {
		t.Fatalf("%d writes for one request, MaxRecord 16", p)
	}
	var m Match
	x.Lookup(a, &m)
	if m.Blocks(1) != 4000 {
		t.Fatalf("matched %d, want 4000 (the deepest position is always recorded)", m.Blocks(1))
	}
}

func TestIndexAllocatesNothing(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	x := newTestIndex(t, IndexConfig{}, NewMemStore())
	a := randomChain(r, 400)
	var m Match
	x.Lookup(a, &m)
	x.Record(a, 1, 0, t0)
	x.Sync()
	if n := testing.AllocsPerRun(100, func() {
		x.Lookup(a, &m)
		x.Record(a, 2, m.Blocks(2), t0)
	}); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}

func BenchmarkLookup(b *testing.B) {
	r := rand.New(rand.NewPCG(21, 22))
	x := newTestIndex(b, IndexConfig{}, nil)
	for range 2000 {
		x.Record(randomChain(r, 100), uint32(1+r.IntN(8)), 0, t0)
	}
	for _, n := range []int{64, 1024, 4096} {
		a := randomChain(r, n)
		x.Record(a, 3, 0, t0)
		b.Run(fmt.Sprintf("%dblocks", n), func(b *testing.B) {
			var m Match
			for b.Loop() {
				x.Lookup(a, &m)
			}
		})
	}
}

// nilStore returns nil instead of dst for a missing key, as Envoy's
// shared data does through the binding.
type nilStore struct{ *MemStore }

func (s nilStore) Get(key string, dst []byte) ([]byte, uint32, error) {
	v, cas, err := s.MemStore.Get(key, dst)
	if err != nil {
		return nil, 0, err
	}
	return v, cas, nil
}

func TestStoreReturningNilForMissingKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	x := newTestIndex(t, IndexConfig{}, nilStore{NewMemStore()})
	a := randomChain(r, 16)
	x.Record(a, 1, 0, t0)
	x.Sync()
	x.Sync()
	if x.Stats().Flushes == 0 {
		t.Fatal("nothing flushed")
	}
}

func TestRepeatedRecordsWriteNothingNew(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	store := NewMemStore()
	x := newTestIndex(t, IndexConfig{}, store)
	a := randomChain(r, 40)
	x.Record(a, 1, 0, t0)
	x.Sync()
	sets := store.Sets
	var m Match
	for range 5 { // the same prompt again within one stamp: nothing new
		x.Lookup(a, &m)
		x.Record(a, 1, m.Blocks(1), t0)
	}
	if x.Pending() != 0 {
		t.Fatalf("%d writes pending for records that change nothing", x.Pending())
	}
	x.Sync()
	if store.Sets != sets {
		t.Fatalf("%d store writes for records that change nothing", store.Sets-sets)
	}
	// A later stamp refreshes the deepest entry: one bucket, the
	// directory and the generation.
	x.Lookup(a, &m)
	x.Record(a, 1, m.Blocks(1), t0.Add(time.Second))
	x.Sync()
	if got := store.Sets - sets; got != 3 {
		t.Fatalf("a refresh wrote %d values, want 3 (bucket, directory, generation)", got)
	}
}

// A Sync reads the directory only when another VM wrote since: an idle
// tick reads the 8-byte generation alone, and a VM's own write does not
// make it read the directory back.
func TestSyncReadsTheDirectoryOnlyAfterAnotherVMWrote(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	store := NewMemStore()
	a := newTestIndex(t, IndexConfig{}, store)
	b := newTestIndex(t, IndexConfig{}, store)
	a.Sync()
	b.Sync()
	reads := func(x *Index) int64 { return x.Stats().DirectoryReads }
	ra, rb := reads(a), reads(b)
	got := store.GotBytes
	for range 5 {
		a.Sync()
		b.Sync()
	}
	if reads(a) != ra || reads(b) != rb {
		t.Fatalf("idle Syncs read the directory: a %d, b %d times", reads(a)-ra, reads(b)-rb)
	}
	if per := (store.GotBytes - got) / 10; per > genBytes {
		t.Fatalf("an idle Sync read %d bytes, want at most %d", per, genBytes)
	}
	// a's own write: a does not read the directory back; b does, once.
	chain := randomChain(r, 16)
	a.Record(chain, 7, 0, t0)
	a.Sync()
	if reads(a) != ra {
		t.Fatalf("a read the directory back after its own write")
	}
	b.Sync()
	b.Sync()
	if reads(b) != rb+1 {
		t.Fatalf("b read the directory %d times after a's write, want 1", reads(b)-rb)
	}
	var m Match
	b.Lookup(chain, &m)
	if m.Blocks(7) != 16 {
		t.Fatalf("b sees %d blocks of a's write, want 16", m.Blocks(7))
	}
	// Both write between two Syncs: each reads the other's write.
	ca, cb := randomChain(r, 16), randomChain(r, 16)
	a.Record(ca, 8, 0, t0)
	b.Record(cb, 9, 0, t0)
	a.Sync()
	b.Sync()
	a.Sync()
	a.Lookup(cb, &m)
	if m.Blocks(9) != 16 {
		t.Fatalf("a missed b's write made after a's (matched %d)", m.Blocks(9))
	}
	b.Lookup(ca, &m)
	if m.Blocks(8) != 16 {
		t.Fatalf("b missed a's write made before b's (matched %d)", m.Blocks(8))
	}
}

// Entries is kept as buckets change (records, evictions, forgets, buckets
// fetched from the store and writes re-applied over them): it always
// equals a count of the local copy.
func TestEntriesFollowEveryChange(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 30))
	store := NewMemStore()
	cfg := IndexConfig{MaxEntries: 256, BucketEntries: 4}
	vms := []*Index{newTestIndex(t, cfg, store), newTestIndex(t, cfg, store)}
	var chains [][]uint64
	for step := range 3000 {
		x := vms[r.IntN(2)]
		now := t0.Add(time.Duration(step) * 100 * time.Millisecond)
		switch k := r.IntN(10); {
		case k < 5 || len(chains) == 0:
			c := randomChain(r, 4+r.IntN(40))
			chains = append(chains, c)
			x.Record(c, uint32(1+r.IntN(6)), 0, now)
		case k < 8:
			c := chains[r.IntN(len(chains))]
			x.Forget(c, uint32(1+r.IntN(6)), r.IntN(len(c)), now)
		default:
			x.Sync()
		}
		for i, v := range vms {
			if got, want := v.Entries(), v.countEntries(); got != want {
				t.Fatalf("step %d: VM %d: Entries %d, counted %d", step, i, got, want)
			}
		}
	}
	if vms[0].Entries() == 0 || vms[0].Stats().Evicted == 0 || vms[0].Stats().Forgotten == 0 {
		t.Fatalf("the walk did not exercise the index: %+v, %d entries", vms[0].Stats(), vms[0].Entries())
	}
}
