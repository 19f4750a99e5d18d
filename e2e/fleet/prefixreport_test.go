package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

func TestTTFTFloorIsOnePrefillOfTheUncachedTokens(t *testing.T) {
	// (d): the 1,200-token question after a context of whole blocks:
	// 5,750 + 17.25 × 1,200 µs.
	d, what := ttftFloor(SharedContextScenario())
	assert.Equal(t, 26450*time.Microsecond, d)
	assert.Contains(t, what, "1200 new tokens")
	// (f): ShareGPT's p90 input (714) plus the 1,000-token system prompt's
	// partial block (8), with one adapter's slowdown: (5,750 + 17.25 × 722)
	// × 1.02 µs.
	f, what := ttftFloor(SystemPromptScenario())
	assert.InDelta(t, (5750+17.25*722)*1.02, float64(f)/float64(time.Microsecond), 0.01)
	assert.Contains(t, what, "722 new tokens")
	// A question longer than a step's budget takes more than one step.
	sc := SharedContextScenario()
	sc.Traffic = SharedContexts{Groups: 1, ContextTokens: 6000, Question: Fixed(3000), Output: Fixed(10)}
	long, _ := ttftFloor(sc)
	assert.Equal(t, sc.Replica.Profile.StepTime(2048, 0, 0)+sc.Replica.Profile.StepTime(952, 0, 0), long)
	_, what = ttftFloor(SeedScenario())
	assert.Empty(t, what, "no floor for traffic without shared prefixes")
}

func TestPrefixSweepDividesEachComparatorByPrefixAware(t *testing.T) {
	ms := time.Millisecond
	run := func(policy string, load float64, p90 time.Duration) Result {
		return Result{Policy: policy, Load: load, TTFT: Quantiles{P90: p90}}
	}
	sr := ScenarioResult{Scenario: SharedContextScenario(), Runs: []Result{
		run(PolicyPrefixAware, 0.6, 50*ms), run(PolicyPrefixPerVM, 0.6, 60*ms), run(scheduler.ProfileScoring, 0.6, 200*ms),
		run(scheduler.ProfileDecisionTree, 0.6, 150*ms), run(Oracle, 0.6, 40*ms),
		run(PolicyPrefixAware, 1, 100*ms), run(PolicyPrefixPerVM, 1, 400*ms), run(scheduler.ProfileScoring, 1, 900*ms),
		run(scheduler.ProfileDecisionTree, 1, 1000*ms), run(Oracle, 1, 100*ms),
	}}
	rep := &Report{Config: SweepConfig{Loads: []float64{0.6, 1}}, Results: []ScenarioResult{sr, {Scenario: SeedScenario()}}}
	out := rep.prefixSweep()
	assert.Contains(t, out, "| load | prefix-aware p90 TTFT | per-VM index | best of least-request, decision-tree, scoring | prefix-aware / oracle |")
	assert.Contains(t, out, "| 60% | 50.0 ms | 1.20× | 3.00× | 1.25× |", "the best of the three baselines is decision-tree's 150 ms")
	assert.Contains(t, out, "| 100% | 100.0 ms | 4.00× | 9.00× | 1.00× |")
	assert.Contains(t, out, "**floor 26.4 ms**")
	assert.NotContains(t, out, "llm-d-style", "a comparator that did not run has no column")
	assert.Equal(t, 1, strings.Count(out, "(d):"), "scenarios without shared prefixes have no table")

	require.Empty(t, (&Report{Config: SweepConfig{Loads: []float64{1}}, Results: []ScenarioResult{{Scenario: SeedScenario()}}}).prefixSweep())
}
