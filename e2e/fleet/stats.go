package fleet

import (
	"math"
	"slices"
	"time"
)

// summarize sorts xs in place and returns its mean and nearest-rank
// percentiles (the smallest value with at least q of the samples at or
// below it). An empty sample summarises to zeros.
func summarize(xs []time.Duration) Quantiles {
	if len(xs) == 0 {
		return Quantiles{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += float64(x)
	}
	return Quantiles{
		Mean: time.Duration(sum / float64(len(xs))),
		P50:  percentile(xs, 0.50),
		P90:  percentile(xs, 0.90),
		P99:  percentile(xs, 0.99),
	}
}

// percentile of sorted xs by nearest rank.
func percentile(sorted []time.Duration, q float64) time.Duration {
	n := len(sorted)
	k := int(math.Ceil(q*float64(n)-1e-9)) - 1 // guard: 0.9*10 is 9.000000000000002
	return sorted[min(max(k, 0), n-1)]
}
