package prefix

import "math"

// Rendezvous chooses an endpoint for a key by rendezvous (highest random
// weight) hashing with bounded loads: every endpoint gets the weight
// chain(key, endpoint key), and the request goes to the heaviest endpoint
// whose load is under the bound
//
//	capacity = max(MinCapacity, ceil(Factor · (total load + 1) / endpoints))
//
// (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
// Loads": no endpoint takes more than Factor times the mean). Every
// gateway replica and worker VM that sees the same endpoints and loads
// makes the same choice without talking to the others, and an endpoint
// joining or leaving moves only the keys it wins or held. Rendezvous
// hashing instead of a ring: no per-snapshot ring to build, exact shares
// (no virtual-node variance), and the overflow order is a per-key
// permutation, like the random probes Envoy's bounded-load ring hash uses,
// so a hot key's overflow does not all land on its ring neighbour.
type Rendezvous struct {
	// Factor is c = 1 + ε (> 1).
	Factor float64
	// MinCapacity is the smallest capacity, so at low load a key stays on
	// its endpoint while that endpoint runs a few requests.
	MinCapacity int
	weights     []uint64
}

// Pick returns the index in ids (endpoint keys) of the endpoint chosen for
// key, given each endpoint's load (same length); -1 when ids is empty.
func (r *Rendezvous) Pick(key uint64, ids []uint32, loads []int) int {
	n := len(ids)
	if n == 0 {
		return -1
	}
	total := 0
	for _, l := range loads {
		total += max(l, 0)
	}
	capacity := r.Capacity(total, n)
	if cap(r.weights) < n {
		r.weights = make([]uint64, n)
	}
	w := r.weights[:n]
	for i, id := range ids {
		w[i] = weight(key, id) // never 0: 0 marks a rejected endpoint
	}
	// Probe in weight order; the first under capacity wins. Some endpoint
	// is at or below the mean, which is below capacity, so this ends.
	for range n {
		best := -1
		for i, v := range w {
			if v != 0 && (best < 0 || v > w[best]) {
				best = i
			}
		}
		if loads[best] < capacity {
			return best
		}
		w[best] = 0
	}
	return RendezvousOrder(key, ids)[0] // unreachable
}

// Capacity is Pick's load bound for n endpoints whose loads (negative
// ones as 0) sum to total.
func (r *Rendezvous) Capacity(total, n int) int {
	return max(int(math.Ceil(r.Factor*float64(total+1)/float64(n))), r.MinCapacity, 1)
}

// Weight is endpoint id's weight for key, which Pick ranks by (never 0):
// for callers that rank endpoints they do not list (the scheduler's
// index picks as Pick would: the heaviest under Capacity, the first of
// equal ones).
func Weight(key uint64, id uint32) uint64 { return weight(key, id) }

// RendezvousOrder returns ids' indexes by descending weight for key (for
// tests and tools; allocates).
func RendezvousOrder(key uint64, ids []uint32) []int {
	idx := make([]int, len(ids))
	for i := range idx {
		idx[i] = i
	}
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && weight(key, ids[idx[j]]) > weight(key, ids[idx[j-1]]); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	return idx
}

func weight(key uint64, id uint32) uint64 { return chain(key, uint64(id)) | 1 }
