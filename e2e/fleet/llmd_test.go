package fleet

import (
	"testing"
)

func tokensFrom(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

func TestHashLRUEvictsLeastRecent(t *testing.T) {
	l := newHashLRU(3)
	for _, h := range []uint64{1, 2, 3} {
		if _, ev := l.add(h); ev {
			t.Fatal("evicted below capacity")
		}
	}
	l.add(1) // refresh: 2 is now the oldest
	if k, ev := l.add(4); !ev || k != 2 {
		t.Fatalf("evicted %d (%v), want 2", k, ev)
	}
	if k, ev := l.add(5); !ev || k != 3 {
		t.Fatalf("evicted %d (%v), want 3", k, ev)
	}
}

func TestLLMDApproxMatch(t *testing.T) {
	a := NewLLMDApprox(func(int) int { return 1000 })
	shared := tokensFrom(0, 640) // 10 blocks of 64
	prompt := append(append([]uint32(nil), shared...), tokensFrom(10000, 100)...)
	a.hashPrompt("m", prompt)
	if len(a.hashes) != 12 { // 740 tokens: 11 full blocks and a partial one
		t.Fatalf("%d hashes, want 12", len(a.hashes))
	}
	a.record(2)
	other := append(append([]uint32(nil), shared...), tokensFrom(20000, 64)...)
	a.hashPrompt("m", other)
	a.match(4)
	if a.counts[2] != 10 || a.counts[0] != 0 {
		t.Fatalf("counts %v, want 10 on replica 2", a.counts)
	}
	// Another model shares nothing.
	a.hashPrompt("lora", other)
	a.match(4)
	if a.counts[2] != 0 {
		t.Fatalf("another model matched %d", a.counts[2])
	}
	// Eviction removes the pod from the holders.
	small := NewLLMDApprox(func(int) int { return 5 })
	small.hashPrompt("m", tokensFrom(0, 640))
	small.record(0)
	small.hashPrompt("m", tokensFrom(0, 640))
	small.match(1)
	if small.counts[0] != 0 {
		t.Fatalf("the first blocks were evicted, yet %d match (the walk stops at block 0)", small.counts[0])
	}
}
