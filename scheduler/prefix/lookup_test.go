package prefix

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// lookupReference is Lookup written plainly: every recorded position, the
// first count slots in use of its bucket, the deepest match per endpoint.
func (x *Index) lookupReference(blocks []uint64, m *Match) {
	m.Reset(len(blocks))
	step := x.cfg.RecordEvery
	for p := step - 1; p < len(blocks); p += step {
		b := x.localBucket(int(blocks[p] & x.mask))
		n := bucketCount(b)
		for j := 0; j < x.cfg.BucketEntries && n > 0; j++ {
			ent := b[bucketHeader+j*entryBytes:]
			ep := binary.LittleEndian.Uint32(ent[8:])
			if ep == 0 {
				continue
			}
			n--
			if binary.LittleEndian.Uint64(ent) == blocks[p] {
				m.set(ep, p+1)
			}
		}
	}
}

// TestLookupMatchesReference compares Lookup with lookupReference over
// random indexes: small buckets that fill and evict, forgets that free
// slots in the middle, shared chains so that several endpoints and
// positions match with gaps, and buckets fetched from another VM.
func TestLookupMatchesReference(t *testing.T) {
	for seed := range uint64(12) {
		r := rand.New(rand.NewPCG(seed, 77))
		cfg := IndexConfig{
			BucketEntries: []int{1, 2, 3, 16}[seed%4],
			RecordEvery:   1 + int(seed%3),
			MaxEntries:    64 << (seed % 3),
		}
		t.Run(fmt.Sprintf("seed%d-entries%d-every%d", seed, cfg.BucketEntries, cfg.RecordEvery), func(t *testing.T) {
			s := NewMemStore()
			x := newTestIndex(t, cfg, s)
			y := newTestIndex(t, cfg, s)
			bases := [][]uint64{randomChain(r, 200), randomChain(r, 200), randomChain(r, 200)}
			prompt := func() []uint64 {
				base := bases[r.IntN(len(bases))]
				n := 1 + r.IntN(len(base))
				if r.IntN(2) == 0 {
					return base[:n]
				}
				return extend(r, base, n, n+r.IntN(100))
			}
			now := t0
			var got, want Match
			checks, hits := 0, 0
			for i := range 600 {
				now = now.Add(time.Duration(r.IntN(3)) * 100 * time.Millisecond)
				vm := []*Index{x, y}[r.IntN(2)]
				a := prompt()
				ep := uint32(1 + r.IntN(6))
				switch k := r.IntN(10); {
				case k < 6:
					vm.lookupReference(a, &want)
					vm.Record(a, ep, want.Blocks(ep), now)
				case k < 8:
					vm.Forget(a, ep, r.IntN(len(a)+1), now)
				default:
					vm.Sync()
				}
				if i%3 == 0 {
					for _, v := range []*Index{x, y} {
						q := prompt()
						v.Lookup(q, &got)
						v.lookupReference(q, &want)
						checks++
						if want.Len() > 0 {
							hits++
						}
						if got.Total != want.Total || !slices.Equal(got.keys, want.keys) || !slices.Equal(got.blocks, want.blocks) {
							t.Fatalf("step %d: Lookup %v %v, reference %v %v", i, got.keys, got.blocks, want.keys, want.blocks)
						}
					}
				}
			}
			if hits < checks/4 {
				t.Fatalf("only %d of %d lookups matched anything: the comparison says little", hits, checks)
			}
		})
	}
}

// BenchmarkLookupHostShape is e2e/envoyhost's prefix-aware request at
// 4 KiB: 64 blocks whose 16 recorded positions one endpoint holds, the
// other buckets nearly empty.
func BenchmarkLookupHostShape(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	x := newTestIndex(b, IndexConfig{}, nil)
	a := randomChain(r, 64)
	x.Record(a, 5, 0, t0)
	var m Match
	for b.Loop() {
		x.Lookup(a, &m)
	}
	if m.Blocks(5) != 64 {
		b.Fatal(m.Blocks(5))
	}
}
