package fleet

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

func countingPolicy(t *testing.T, profile string, on bool) PolicySpec {
	t.Helper()
	p, err := ParsePolicyWith(profile, PolicyOptions{CountRoutedSinceSnapshot: &on})
	require.NoError(t, err)
	return p
}

// TestCountRoutedIsDeterministic: counting routed requests keeps a run
// reproducible, and it is wired in: the decisions change.
func TestCountRoutedIsDeterministic(t *testing.T) {
	for _, profile := range []string{scheduler.ProfileDecisionTree, scheduler.ProfileScoring} {
		t.Run(profile, func(t *testing.T) {
			cfg := smallRun(t, profile, 60)
			cfg.Policy = countingPolicy(t, profile, true)
			require.True(t, cfg.Policy.CountsRouted)
			first, err := Run(cfg)
			require.NoError(t, err)
			second, err := Run(cfg)
			require.NoError(t, err)
			require.Equal(t, first, second)

			cfg.Policy = countingPolicy(t, profile, false)
			require.False(t, cfg.Policy.CountsRouted)
			off, err := Run(cfg)
			require.NoError(t, err)
			assert.NotEqual(t, first.Routed, off.Routed, "counting changes where requests go")

			plain, err := Run(smallRun(t, profile, 60))
			require.NoError(t, err)
			if !scheduler.DefaultCountRoutedSinceSnapshot {
				assert.Equal(t, plain, off, "off is the default")
			} else {
				assert.Equal(t, plain.Routed, first.Routed, "on is the default")
			}
		})
	}
}

// TestGatewayVMs: one VM is the plain run; several are reproducible, lose
// no request, and change a counting policy's decisions (each VM counts only
// its share).
func TestGatewayVMs(t *testing.T) {
	cfg := smallRun(t, scheduler.ProfileScoring, 60)
	cfg.Policy = countingPolicy(t, scheduler.ProfileScoring, true)
	one, err := Run(cfg)
	require.NoError(t, err)
	cfg.GatewayVMs = 1
	explicit, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, one, explicit, "GatewayVMs 0 and 1 are the same gateway")

	cfg.GatewayVMs = 4
	four, err := Run(cfg)
	require.NoError(t, err) // Run fails when a request is lost
	again, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, four, again)
	assert.Equal(t, one.Arrivals, four.Arrivals, "the same workload")
	assert.NotEqual(t, one.Routed, four.Routed)

	cfg.GatewayVMs = -1
	_, err = Run(cfg)
	assert.Error(t, err)
}

// TestGatewayVMsKeepTheirOwnCounts: each VM's policy sees a snapshot of its
// own, fresh at every scrape, carrying only what that VM routed since.
func TestGatewayVMsKeepTheirOwnCounts(t *testing.T) {
	var views []*View
	countedAll := 0
	routedSince := map[*View]int{}     // counted by this VM since its last scrape
	scrapedAt := map[*View]time.Time{} // that scrape
	inner := countingPolicy(t, scheduler.ProfileDecisionTree, true)
	spec := PolicySpec{Name: "checked", New: func(seed uint64, clock func() time.Time) (Policy, error) {
		p, err := inner.New(seed, clock)
		return policyFunc(func(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
			if !containsView(views, v) {
				views = append(views, v)
			}
			if !v.Snapshot.Time.Equal(scrapedAt[v]) {
				scrapedAt[v], routedSince[v] = v.Snapshot.Time, 0
			}
			counted := 0
			for i := range v.Snapshot.Endpoints {
				m := &v.Snapshot.Endpoints[i].Metrics
				require.Equal(t, v.Snapshot.Time, m.UpdateTime, "every VM sees the latest scrape")
				counted += m.RoutedSinceUpdate
			}
			require.Equal(t, routedSince[v], counted, "a VM counts exactly what it routed since the scrape")
			i, outcome := p.Route(req, v)
			if outcome == scheduler.Routed {
				// Requests joining their adapter are not counted (Observe).
				if m := &v.Snapshot.Endpoints[i].Metrics; !m.HasActiveModel(req.TargetModel) && !m.HasWaitingModel(req.TargetModel) {
					routedSince[v]++
					countedAll++
				}
			}
			return i, outcome
		}), err
	}}
	cfg := smallRun(t, scheduler.ProfileDecisionTree, 60)
	cfg.Policy, cfg.GatewayVMs = spec, 3
	_, err := Run(cfg)
	require.NoError(t, err)
	require.Len(t, views, 3)
	assert.Positive(t, countedAll)
	assert.NotSame(t, views[0].Snapshot, views[1].Snapshot)
	assert.NotSame(t, &views[0].Snapshot.Endpoints[0], &views[1].Snapshot.Endpoints[0])
	assert.Equal(t, views[0].InFlight, views[1].InFlight, "in-flight counts are the gateway's, shared")
}

func containsView(list []*View, v *View) bool {
	for _, w := range list {
		if w == v {
			return true
		}
	}
	return false
}

// TestPolicyOptionsFillOnlyWhatTheConfigLeavesOut: the option sets the
// built-in profiles' setting; a configuration file that sets it wins.
func TestPolicyOptionsFillOnlyWhatTheConfigLeavesOut(t *testing.T) {
	dir := t.TempDir()
	off := filepath.Join(dir, "off.json")
	unset := filepath.Join(dir, "unset.json")
	require.NoError(t, os.WriteFile(off, []byte(`{"profile": "scoring", "countRoutedSinceSnapshot": false}`), 0o600))
	require.NoError(t, os.WriteFile(unset, []byte(`{"profile": "scoring"}`), 0o600))
	on := true
	for arg, want := range map[string]bool{
		"decision-tree":         true,
		"off=" + off:            false,
		"unset=" + unset:        true,
		EnvoyLeastRequest:       false,
		scheduler.ProfileRandom: true,
	} {
		p, err := ParsePolicyWith(arg, PolicyOptions{CountRoutedSinceSnapshot: &on})
		require.NoError(t, err, arg)
		assert.Equal(t, want, p.CountsRouted, arg)
	}
	p, err := ParsePolicy("unset=" + unset)
	require.NoError(t, err)
	assert.Equal(t, scheduler.DefaultCountRoutedSinceSnapshot, p.CountsRouted, "no option: the scheduler's default")
}

func TestReportNamesTheCountingPolicies(t *testing.T) {
	rep := &Report{Config: SweepConfig{GatewayVMs: 4, Policies: []PolicySpec{
		countingPolicy(t, scheduler.ProfileDecisionTree, true), countingPolicy(t, scheduler.ProfileScoring, false),
	}}}
	note := rep.gatewayNote()
	assert.Contains(t, note, "4 routing VMs")
	assert.Contains(t, note, "(countRoutedSinceSnapshot on): decision-tree.")

	rep.Config = SweepConfig{Policies: []PolicySpec{countingPolicy(t, scheduler.ProfileScoring, false)}}
	note = rep.gatewayNote()
	assert.NotContains(t, note, "routing VMs")
	assert.Contains(t, note, "countRoutedSinceSnapshot off")
}

// TestCountingSpreadsBaseModelBursts is the herding claim in miniature: on
// a fleet without adapters, where only load matters, counting the requests
// routed since the last scrape serves first tokens sooner.
func TestCountingSpreadsBaseModelBursts(t *testing.T) {
	sc := BaseModelScenario()
	sc.Replicas = 4
	run := func(on bool) Result {
		r, err := Run(RunConfig{Scenario: sc, Policy: countingPolicy(t, scheduler.ProfileDecisionTree, on), Rate: 0.8 * 4 * 21,
			Seed: 5, Warmup: 10 * time.Second, Window: 40 * time.Second, ScrapeInterval: DefaultScrapeInterval})
		require.NoError(t, err)
		return r
	}
	off, on := run(false), run(true)
	t.Logf("p90 TTFT %v without counting, %v with; p99 %v, %v", off.TTFT.P90, on.TTFT.P90, off.TTFT.P99, on.TTFT.P99)
	assert.Zero(t, off.AdapterLoads+on.AdapterLoads, "no adapters")
	assert.Less(t, on.TTFT.P90, off.TTFT.P90)
	assert.Less(t, on.TTFT.P99, off.TTFT.P99)
}
