package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

func TestHigressSegmentsChainOverTheModelAndLengths(t *testing.T) {
	h := HigressPolicySpec()
	p, err := h.New(1, nil)
	require.NoError(t, err)
	a := p.(*HigressApprox)
	context := fixedTokens(7, 6000)
	one := append(append([]uint32(nil), context...), fixedTokens(8, 1200)...)
	two := append(append([]uint32(nil), context...), fixedTokens(9, 1200)...)
	a.segment("m", one)
	first := append([]uint64(nil), a.hashes...)
	assert.Equal(t, []uint64{1024, 1024, 1024, 1024, 1024, 1024, 1024, 32}, a.lens, "1,024-token segments and the tail")
	a.segment("m", two)
	assert.Equal(t, first[:5], a.hashes[:5], "the segments inside the shared context match")
	assert.NotEqual(t, first[5], a.hashes[5], "the segment holding the question does not")
	a.segment("other", one)
	assert.NotEqual(t, first[0], a.hashes[0], "the model is in the chain")
	a.segment("m", fixedTokens(1, 64*1024))
	assert.Len(t, a.hashes, higressMaxSegments, "at most 32 segments")
}

func TestHigressWeightedLRUEvictsByBlocks(t *testing.T) {
	l := newWeightedLRU(10, 16)
	l.add(1, 64) // 4 blocks
	l.add(2, 64) // 4 blocks
	l.add(1, 64) // refreshed: 2 is now the oldest
	l.add(3, 17) // 2 blocks: 10 used
	assert.True(t, l.has(1) && l.has(2) && l.has(3))
	l.add(4, 16) // 1 block: 2 goes
	assert.False(t, l.has(2))
	assert.True(t, l.has(1) && l.has(3) && l.has(4))
	assert.Equal(t, uint64(7), l.used)
	l.add(5, 1000) // bigger than the whole capacity: not kept
	assert.False(t, l.has(5))
}

// Each VM's own index keeps a group on one replica, but eight VMs learn
// eight different places: the per-VM index without a consistent choice.
func TestHigressVMsAgreeOnlyWithThemselves(t *testing.T) {
	one := stickinessOver(t, HigressPolicySpec(), 1, 1)
	eight := stickinessOver(t, HigressPolicySpec(), 2, 4)
	t.Logf("replicas per group: one VM %.2f, 2 × 4 VMs %.2f", one, eight)
	assert.InDelta(t, 1, one, 0.01)
	assert.Greater(t, eight, 2.0)
	assert.Less(t, stickiness(t, PrefixPolicySpec(PolicyPrefixPerVM, scheduler.Config{Profile: scheduler.ProfilePrefixAware}, IndexPerVM)), 1.01,
		"our per-VM row keeps a group together through the consistent choice")
}
