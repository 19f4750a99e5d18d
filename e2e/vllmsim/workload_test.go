package vllmsim

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShareGPTLengthsMatchPublishedQuantiles(t *testing.T) {
	tests := []struct {
		name                   string
		dist                   LengthDist
		mean, median, p90, max float64
	}{
		// Published ShareGPT figures: input 252/109/714 max 1024, output
		// 225/144/564 max 1025 (mean/median/p90).
		{"input", ShareGPTInput, 252, 109, 714, 1024},
		{"output", ShareGPTOutput, 225, 144, 564, 1025},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.dist.Validate())
			assert.InDelta(t, tc.mean, tc.dist.Mean(), 0.5)

			gen, err := NewWorkload(WorkloadConfig{Rate: 1, Input: tc.dist, Output: tc.dist, Seed: 3})
			require.NoError(t, err)
			const n = 200_000
			xs := make([]int, n)
			sum := 0
			for i := range xs {
				xs[i] = gen.Next().PromptTokens
				sum += xs[i]
			}
			slices.Sort(xs)
			assert.InEpsilon(t, tc.mean, float64(sum)/n, 0.02)
			assert.InEpsilon(t, tc.median, float64(xs[n/2]), 0.03)
			assert.InEpsilon(t, tc.p90, float64(xs[n*9/10]), 0.03)
			assert.LessOrEqual(t, float64(xs[n-1]), tc.max)
			assert.GreaterOrEqual(t, xs[0], 4)
		})
	}
}

func TestWorkloadArrivalsArePoisson(t *testing.T) {
	gen, err := NewWorkload(ShareGPTWorkload(50, 1))
	require.NoError(t, err)
	const n = 100_000
	var last Arrival
	var sumSq float64
	prev := time.Duration(0)
	for range n {
		last = gen.Next()
		gap := (last.At - prev).Seconds()
		sumSq += gap * gap
		prev = last.At
	}
	mean := last.At.Seconds() / n
	assert.InEpsilon(t, 1.0/50, mean, 0.02)
	// Exponential gaps: standard deviation equals the mean.
	sd := math.Sqrt(sumSq/n - mean*mean)
	assert.InEpsilon(t, mean, sd, 0.03)
	assert.Equal(t, n-1, last.Seq)
}

func TestWorkloadAdapterShares(t *testing.T) {
	cfg := ShareGPTWorkload(10, 9)
	cfg.Adapters = []AdapterShare{{"big", 6}, {"mid", 3}, {"small", 1}}
	gen, err := NewWorkload(cfg)
	require.NoError(t, err)
	counts := map[string]int{}
	const n = 100_000
	for range n {
		counts[gen.Next().Adapter]++
	}
	assert.InEpsilon(t, 0.6*n, counts["big"], 0.03)
	assert.InEpsilon(t, 0.3*n, counts["mid"], 0.03)
	assert.InEpsilon(t, 0.1*n, counts["small"], 0.05)
	assert.Equal(t, []string{"x-00", "x-01"}, AdapterNames("x", 2))
}

func TestWorkloadSameSeedSameRequestsAtAnyRate(t *testing.T) {
	slow, err := NewWorkload(ShareGPTWorkload(5, 11))
	require.NoError(t, err)
	fast, err := NewWorkload(ShareGPTWorkload(50, 11))
	require.NoError(t, err)
	for range 1000 {
		a, b := slow.Next(), fast.Next()
		require.Equal(t, a.PromptTokens, b.PromptTokens)
		require.Equal(t, a.OutputTokens, b.OutputTokens)
		require.InEpsilon(t, float64(a.At), float64(b.At)*10, 1e-6)
	}
	other, err := NewWorkload(ShareGPTWorkload(5, 12))
	require.NoError(t, err)
	slow2, err := NewWorkload(ShareGPTWorkload(5, 11))
	require.NoError(t, err)
	differs := false
	for range 100 {
		if other.Next() != slow2.Next() {
			differs = true
		}
	}
	assert.True(t, differs)
}

func TestWorkloadRejectsBadConfig(t *testing.T) {
	bad := []WorkloadConfig{
		{Rate: 0, Input: ShareGPTInput, Output: ShareGPTOutput},
		{Rate: math.Inf(1), Input: ShareGPTInput, Output: ShareGPTOutput},
		{Rate: 1, Input: LengthDist{}, Output: ShareGPTOutput},
		{Rate: 1, Input: ShareGPTInput, Output: LengthDist{Knots: []Knot{{0, 10}, {1, 5}}}},
		{Rate: 1, Input: ShareGPTInput, Output: ShareGPTOutput, Adapters: []AdapterShare{{"a", 0}}},
	}
	for i, cfg := range bad {
		_, err := NewWorkload(cfg)
		assert.Error(t, err, "config %d", i)
	}
}

// TestSaturationNearPublishedFigure is the "check against reality": one
// Llama-2-7B H100 replica under ShareGPT saturates at ≈26 req/s and ≈6.0k
// output tok/s upstream (GAIE sample.json). The model must land in a band
// around it; the figure is logged for BENCHMARKS.md.
func TestSaturationNearPublishedFigure(t *testing.T) {
	th, err := Saturation(DefaultReplicaConfig(Llama2_7B), ShareGPTWorkload(45, 1), 30*time.Second, 120*time.Second)
	require.NoError(t, err)
	t.Logf("Llama-2-7B H100 ShareGPT saturation: %.1f req/s, %.0f output tok/s (published ≈26 req/s, ≈6.0k tok/s); mean batch %.0f, KV usage %.2f, %d preemptions in %d steps",
		th.RequestsPerSecond, th.OutputTokensPerSecond, th.MeanRunning, th.MeanKVUsage, th.Preemptions, th.Steps)
	assert.GreaterOrEqual(t, th.RequestsPerSecond, 18.0)
	assert.LessOrEqual(t, th.RequestsPerSecond, 35.0)
	assert.GreaterOrEqual(t, th.OutputTokensPerSecond, 4000.0)
	assert.LessOrEqual(t, th.OutputTokensPerSecond, 8000.0)

	// Below saturation the replica keeps up with the offered load.
	light, err := Saturation(DefaultReplicaConfig(Llama2_7B), ShareGPTWorkload(10, 1), 30*time.Second, 120*time.Second)
	require.NoError(t, err)
	assert.InEpsilon(t, 10, light.RequestsPerSecond, 0.15)
}
