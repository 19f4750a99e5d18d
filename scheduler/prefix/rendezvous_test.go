package prefix

import (
	"math/rand/v2"
	"testing"
)

func endpointKeys(n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = EndpointKey("default", "vllm-"+string(rune('a'+i)), "10.0.0.1", 8000+i)
	}
	return ids
}

func TestRendezvousAgreesAcrossInstances(t *testing.T) {
	ids := endpointKeys(8)
	loads := []int{3, 0, 5, 1, 2, 2, 0, 4}
	a, b := Rendezvous{Factor: 1.25, MinCapacity: 4}, Rendezvous{Factor: 1.25, MinCapacity: 4}
	r := rand.New(rand.NewPCG(1, 1))
	for range 1000 {
		k := r.Uint64()
		if a.Pick(k, ids, loads) != b.Pick(k, ids, loads) {
			t.Fatal("two instances chose differently on the same input")
		}
	}
}

func TestRendezvousMovesOnlyTheChangedShare(t *testing.T) {
	ids := endpointKeys(9)
	zero := make([]int, 9)
	var rz Rendezvous
	rz.Factor = 1.25
	rz.MinCapacity = 1 << 30 // loads never bind: pure rendezvous
	r := rand.New(rand.NewPCG(2, 2))
	keys := make([]uint64, 20000)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	moved, toNew := 0, 0
	for _, k := range keys {
		before := rz.Pick(k, ids[:8], zero[:8])
		after := rz.Pick(k, ids, zero)
		if before != after {
			moved++
			if after == 8 {
				toNew++
			}
		}
	}
	if moved != toNew {
		t.Fatalf("a join moved %d keys, only %d of them to the new endpoint", moved, toNew)
	}
	if f := float64(moved) / float64(len(keys)); f < 0.09 || f > 0.135 {
		t.Fatalf("a join moved %.3f of the keys, want about 1/9", f)
	}
	// A leave moves exactly the keys the endpoint held.
	for _, k := range keys {
		before := rz.Pick(k, ids, zero)
		after := rz.Pick(k, append(ids[:3:3], ids[4:]...), zero)
		if before != 3 {
			want := before
			if before > 3 {
				want--
			}
			if after != want {
				t.Fatalf("key %x moved from %d though endpoint 3 left", k, before)
			}
		}
	}
}

func TestRendezvousBoundsLoad(t *testing.T) {
	ids := endpointKeys(4)
	rz := Rendezvous{Factor: 1.25}
	const key = 42
	order := RendezvousOrder(key, ids)
	loads := make([]int, 4)
	if got := rz.Pick(key, ids, loads); got != order[0] {
		t.Fatalf("at zero load picked %d, want the heaviest %d", got, order[0])
	}
	// The favourite over capacity (ceil(1.25·(10+1)/4) = 4): the next one.
	loads[order[0]] = 7
	loads[order[1]] = 1
	loads[order[2]] = 1
	loads[order[3]] = 1
	if got := rz.Pick(key, ids, loads); got != order[1] {
		t.Fatalf("favourite overloaded: picked %d, want %d", got, order[1])
	}
	// MinCapacity keeps it sticky at low load.
	rz.MinCapacity = 8
	if got := rz.Pick(key, ids, loads); got != order[0] {
		t.Fatalf("with MinCapacity 8: picked %d, want %d", got, order[0])
	}
	// Streaming keys into the fleet never puts more than the bound on one.
	rz.MinCapacity = 0
	loads = make([]int, 4)
	r := rand.New(rand.NewPCG(3, 3))
	hot := uint64(7) // one key for everything: the worst case
	for i := range 400 {
		k := hot
		if i%2 == 0 {
			k = r.Uint64()
		}
		loads[rz.Pick(k, ids, loads)]++
	}
	for i, l := range loads {
		if l > 125 { // 1.25 × 100, +1 for rounding
			t.Fatalf("endpoint %d took %d of 400, over 1.25 × the mean", i, l)
		}
	}
}

func TestRendezvousSpreadsKeys(t *testing.T) {
	ids := endpointKeys(8)
	rz := Rendezvous{Factor: 1.25, MinCapacity: 1 << 30}
	counts := make([]int, 8)
	r := rand.New(rand.NewPCG(4, 4))
	zero := make([]int, 8)
	for range 16000 {
		counts[rz.Pick(r.Uint64(), ids, zero)]++
	}
	for i, c := range counts {
		if c < 1700 || c > 2300 {
			t.Fatalf("endpoint %d got %d of 16000 keys, want about 2000", i, c)
		}
	}
}
