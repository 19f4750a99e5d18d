package fleet

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// indexPolicy is SchedulerPolicySpec with the scheduler's index forced on
// (minEndpoints 1) or off (-1).
func indexPolicy(cfg scheduler.Config, minEndpoints int) PolicySpec {
	return PolicySpec{Name: cfg.Profile, CountsRouted: cfg.CountsRoutedSinceSnapshot(), New: func(seed uint64, clock func() time.Time) (Policy, error) {
		s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{
			Rand: rand.NewPCG(seed, 0x5c4e), Now: clock, StaleAfter: DefaultStaleAfter, FailOpen: true,
			IndexMinEndpoints: minEndpoints,
		})
		if err != nil {
			return nil, err
		}
		return &schedulerPolicy{s: s}, nil
	}}
}

// TestIndexedSchedulerRoutesTheSame runs a fleet large enough for the
// scheduler's per-snapshot index (the seed's scenario on 130 replicas, two
// gateway VMs, scrapes rewriting every endpoint in place) with the index
// and scanning, and requires the same run: every arrival's outcome and
// replica, every latency figure.
func TestIndexedSchedulerRoutesTheSame(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 130 replicas")
	}
	sc := SeedScenario()
	sc.Replicas = 130 // just past DefaultIndexMinEndpoints
	sc.Criticality = CriticalityMix{Critical: 0.6, Standard: 0.2, Sheddable: 0.2}
	counting := true
	for _, cfg := range []scheduler.Config{
		{Profile: scheduler.ProfileDecisionTree},
		{Profile: scheduler.ProfileDecisionTree, CountRoutedSinceSnapshot: &counting},
		{Profile: scheduler.ProfileScoring},
		{Profile: scheduler.ProfileLeastRequest},
	} {
		run := func(minEndpoints int) Result {
			res, err := Run(RunConfig{Scenario: sc, Policy: indexPolicy(cfg, minEndpoints), Rate: 2300, Seed: 1,
				Warmup: 3 * time.Second, Window: 6 * time.Second, ScrapeInterval: DefaultScrapeInterval,
				GatewayVMs: 2, RecordOutcomes: true})
			require.NoError(t, err)
			return res
		}
		scanned, indexed := run(-1), run(1)
		require.NotZero(t, scanned.Completed)
		require.Equal(t, scanned, indexed, "%s (counting %v)", cfg.Profile, cfg.CountsRoutedSinceSnapshot())
	}
}
