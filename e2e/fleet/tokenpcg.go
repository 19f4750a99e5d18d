package fleet

import "math/bits"

// tokenPCG draws exactly what math/rand/v2's PCG draws from the same seeds
// (a 128-bit linear congruential state, the DXSM output function;
// TestTokenPCGDrawsWhatRandsPCGDraws), and is a rand.Source for the
// lengths and choices drawn between token ids. Its fill keeps the state in
// registers across a prompt's ids, where a rand.PCG call per id stores the
// state after each one: the token ids of (e)'s user messages were about a
// tenth of its instructions (BENCHMARKS.md, "Replica-model speed work,
// fifth round").
type tokenPCG struct{ hi, lo uint64 }

func newTokenPCG(seed1, seed2 uint64) *tokenPCG { return &tokenPCG{hi: seed1, lo: seed2} }

// The state's multiplier and increment, 128 bits each.
const (
	pcgMulHi, pcgMulLo = 0x2360ed051fc65da4, 0x4385df649fccf645
	pcgIncHi, pcgIncLo = 0x5851f42d4c957f2d, 0x14057b7ef767814f
	dxsmMul            = 0xda942042e4dd58b5
)

// pcgNext is the state after (hi, lo).
func pcgNext(hi, lo uint64) (uint64, uint64) {
	h, l := bits.Mul64(lo, pcgMulLo)
	h += hi*pcgMulLo + lo*pcgMulHi
	l, carry := bits.Add64(l, pcgIncLo, 0)
	h, _ = bits.Add64(h, pcgIncHi, carry)
	return h, l
}

// dxsm is the output of state (hi, lo).
func dxsm(hi, lo uint64) uint64 {
	hi ^= hi >> 32
	hi *= dxsmMul
	hi ^= hi >> 48
	return hi * (lo | 1)
}

// Uint64 is the next draw.
func (p *tokenPCG) Uint64() uint64 {
	p.hi, p.lo = pcgNext(p.hi, p.lo)
	return dxsm(p.hi, p.lo)
}

// fillTokens sets every id of dst to a draw's top 24 bits, one draw each:
// ids below 2^24, a vocabulary.
func (p *tokenPCG) fillTokens(dst []uint32) {
	hi, lo := p.hi, p.lo
	for i := range dst {
		hi, lo = pcgNext(hi, lo)
		dst[i] = uint32(dxsm(hi, lo) >> 40)
	}
	p.hi, p.lo = hi, lo
}
