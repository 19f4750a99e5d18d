package fleet

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTokenPCGDrawsWhatRandsPCGDraws: the fleet's generator is
// math/rand/v2's PCG draw for draw, through rand.Rand as well, with token
// fills between the draws, so the workloads keep their lengths, choices
// and token ids.
func TestTokenPCGDrawsWhatRandsPCGDraws(t *testing.T) {
	for _, seed := range [][2]uint64{{0, 0}, {1, 0x7a1c}, {^uint64(0), 42}, {0x9e3779b97f4a7c15, 0x70c5}} {
		ours, theirs := newTokenPCG(seed[0], seed[1]), rand.NewPCG(seed[0], seed[1])
		oursRand, theirsRand := rand.New(ours), rand.New(theirs)
		for round := range 200 {
			require.Equal(t, theirs.Uint64(), ours.Uint64(), "seed %v round %d", seed, round)
			require.Equal(t, theirsRand.IntN(1000+round), oursRand.IntN(1000+round))
			require.Equal(t, theirsRand.ExpFloat64(), oursRand.ExpFloat64())
			n := round % 37
			want := make([]uint32, n)
			for i := range want {
				want[i] = uint32(theirs.Uint64() >> 40)
			}
			got := make([]uint32, n)
			ours.fillTokens(got)
			require.Equal(t, want, got, "seed %v round %d", seed, round)
		}
	}
}
