package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// TestIndexedSchedulerRoutesTheSame runs fleets large enough for the
// scheduler's per-snapshot index (130 replicas, two gateways of two VMs,
// scrapes rewriting every endpoint in place) with the index forced on and
// off, and requires the same run: every arrival's outcome and replica,
// every latency figure. The seed's scenario with mixed criticality serves
// the load-balancing profiles; the adapters-with-system-prompts scenario
// the prefix-aware profile over a shared prefix index.
func TestIndexedSchedulerRoutesTheSame(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 130 replicas")
	}
	seed := SeedScenario()
	seed.Criticality = CriticalityMix{Critical: 0.6, Standard: 0.2, Sheddable: 0.2}
	prompts := SystemPromptScenario()
	counting := true
	for _, tc := range []struct {
		sc   Scenario
		rate float64
		cfg  scheduler.Config
	}{
		{seed, 2300, scheduler.Config{Profile: scheduler.ProfileDecisionTree}},
		{seed, 2300, scheduler.Config{Profile: scheduler.ProfileDecisionTree, CountRoutedSinceSnapshot: &counting}},
		{seed, 2300, scheduler.Config{Profile: scheduler.ProfileScoring}},
		{seed, 2300, scheduler.Config{Profile: scheduler.ProfileLeastRequest}},
		{prompts, 800, scheduler.Config{Profile: scheduler.ProfilePrefixAware}},
	} {
		sc := tc.sc
		sc.Replicas = 130 // just past DefaultIndexMinEndpoints
		run := func(minEndpoints int) Result {
			policy := schedulerPolicySpec(tc.cfg.Profile, tc.cfg, minEndpoints)
			if tc.cfg.Profile == scheduler.ProfilePrefixAware {
				policy = prefixPolicySpec(tc.cfg.Profile, tc.cfg, IndexShared, minEndpoints)
			}
			res, err := Run(RunConfig{Scenario: sc, Policy: policy, Rate: tc.rate, Seed: 1,
				Warmup: 3 * time.Second, Window: 6 * time.Second, ScrapeInterval: DefaultScrapeInterval,
				Gateways: 2, GatewayVMs: 2, RecordOutcomes: true})
			require.NoError(t, err)
			return res
		}
		scanned, indexed := run(-1), run(1)
		require.NotZero(t, scanned.Completed)
		require.Equal(t, scanned, indexed, "%s (counting %v)", tc.cfg.Profile, tc.cfg.CountsRoutedSinceSnapshot())
	}
}
