package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

var mixed = CriticalityMix{Critical: 0.6, Standard: 0.2, Sheddable: 0.2}

// overloadedRun is the small fleet past its saturation with the mixed
// criticality mix: the default decision tree drops non-critical requests.
func overloadedRun(t *testing.T, flow bool, vms int) RunConfig {
	cfg := smallRun(t, scheduler.ProfileDecisionTree, 110)
	cfg.Scenario.Criticality = mixed
	cfg.GatewayVMs = vms
	cfg.RecordOutcomes = true
	if flow {
		cfg.Policy = FlowPolicySpec(cfg.Policy, flowcontrol.Config{})
	}
	return cfg
}

// The queues' books balance: every queued request left by release, expiry
// or 503, no critical request waited, and every non-critical refusal is an
// expiry or a full queue (none is dropped at once while there is room).
func TestFlowControlAccounting(t *testing.T) {
	for _, vms := range []int{1, 4} {
		base, err := Run(overloadedRun(t, false, vms))
		require.NoError(t, err)
		r, err := Run(overloadedRun(t, true, vms))
		require.NoError(t, err)
		f := r.Flow
		t.Logf("%d VM(s): today %d non-critical refused of %d; with flow control %d (queued %d, released %d, expired %d, full %d, max queued %d, wait p90 %v)",
			vms, base.NonCritical().Refused, base.NonCritical().Measured, r.NonCritical().Refused, f.Queued, f.Released, f.Expired, f.Full, f.MaxQueued, f.Wait.P90)
		require.Positive(t, base.NonCritical().Refused, "the baseline must refuse requests for the test to mean anything")
		require.Positive(t, f.Released)
		assert.Equal(t, f.Queued, f.Released+f.Expired+f.Left, "every queued request leaves exactly once")
		assert.Equal(t, r.DroppedAll, f.Expired+f.Full, "with room in the queue nothing is refused at once")
		assert.Zero(t, r.Classes[scheduler.Critical].Refused, "critical requests are never refused")
		assert.Equal(t, base.Measured, r.Measured, "same workload")
		assert.Equal(t, uint64(f.Released), f.Admitted, "every release is written to the shared record")
		assert.LessOrEqual(t, f.Wait.P99, flowcontrol.DefaultTTL, "no request waits past its TTL")
		assert.Less(t, r.NonCritical().Refused, base.NonCritical().Refused, "holding serves some of what today refuses")
		require.Len(t, r.Outcomes, len(base.Outcomes), "the same arrivals, one outcome each")
	}
}

func TestFlowControlDeterministic(t *testing.T) {
	cfg := overloadedRun(t, true, 4)
	a, err := Run(cfg)
	require.NoError(t, err)
	b, err := Run(cfg)
	require.NoError(t, err)
	require.Equal(t, a, b)
}

// A queue of one request per VM refuses almost everything today refuses:
// the bound holds in the simulation as in the plugin.
func TestFlowControlQueueBound(t *testing.T) {
	cfg := overloadedRun(t, false, 1)
	cfg.Policy = FlowPolicySpec(cfg.Policy, flowcontrol.Config{MaxRequests: 1})
	r, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, 1, r.Flow.MaxQueued)
	assert.Positive(t, r.Flow.Full)
}

func TestFlowControlNeedsASchedulerPolicy(t *testing.T) {
	cfg := overloadedRun(t, false, 1)
	cfg.Policy = FlowPolicySpec(mustPolicy(t, EnvoyLeastRequest), flowcontrol.Config{})
	_, err := Run(cfg)
	require.ErrorContains(t, err, "flow control needs a scheduler policy")
}

// Bursts raise the arrival rate by Factor inside their windows only.
func TestBurstArrivals(t *testing.T) {
	b := Burst{Every: 10 * time.Second, Length: 2 * time.Second, Offset: 5 * time.Second, Factor: 3}
	a, err := newRunSource(RunConfig{Rate: 50, Seed: 3, Burst: b}, smallScenario())
	require.NoError(t, err)
	var in, out int
	last := time.Duration(-1)
	for seq := 0; ; seq++ {
		var n arrival
		a.take(&n)
		require.Equal(t, seq, n.seq)
		require.GreaterOrEqual(t, n.at, last, "arrivals in time order")
		last = n.at
		if n.at >= 200*time.Second {
			break
		}
		if b.inside(n.at) {
			in++
		} else {
			out++
		}
	}
	// 40 s of bursts at 150/s, 160 s outside at 50/s.
	assert.InDelta(t, 6000, in, 300)
	assert.InDelta(t, 8000, out, 350)

	for _, bad := range []Burst{
		{Every: time.Second, Length: 2 * time.Second, Factor: 2},
		{Every: time.Second, Length: time.Second / 2, Offset: time.Second, Factor: 2},
		{Every: time.Second, Length: time.Second / 2, Factor: 1},
	} {
		assert.Error(t, bad.validate(), "%+v", bad)
	}
}

// Flow control sends a Standard or Sheddable request only where the
// snapshot shows room (no waiting queue, KV cache below its limit, the
// adapter's slot): none lands on a replica whose live queue is over the
// decision tree's limit. (What that does to critical TTFT is the
// benchmark's to measure, over many seeds: one short run of this small
// fleet swings either way.)
func TestFlowControlReleasesWhereThereIsRoom(t *testing.T) {
	r, err := Run(overloadedRun(t, true, 1))
	require.NoError(t, err)
	require.Positive(t, r.Flow.Released)
	assert.Zero(t, r.Flow.OverThreshold)
	loose := overloadedRun(t, true, 1)
	loose.Policy = FlowPolicySpec(mustPolicy(t, scheduler.ProfileDecisionTree), flowcontrol.Config{Admit: flowcontrol.Room{MaxWaiting: 50, MaxKVCacheUsage: 1}})
	l, err := Run(loose)
	require.NoError(t, err)
	assert.Positive(t, l.Flow.OverThreshold, "the check must be able to fail: with a loose room test releases do join queues")
}

// Cooldown arrivals load the fleet after the window but are not measured:
// the measured requests are the same with or without it.
func TestCooldownArrivalsAreNotMeasured(t *testing.T) {
	cfg := overloadedRun(t, true, 1)
	a, err := Run(cfg)
	require.NoError(t, err)
	cfg.Cooldown = 5 * time.Second
	b, err := Run(cfg)
	require.NoError(t, err)
	assert.Equal(t, a.Measured, b.Measured)
	assert.Greater(t, b.Arrivals, a.Arrivals)
	assert.Equal(t, b.Measured, b.Completed+b.Dropped+b.NoEndpoint)
}

// Four VMs acting on one snapshot: with the shared admission record fewer
// releases land where another VM's release already took the room than when
// each VM counts only its own. (Some still do: a scrape is up to 50 ms old,
// Critical requests take rooms too, and a new request that goes at once
// counts only in its own VM's copy.)
func TestFlowSharedAdmissionKeepsRoomsSingle(t *testing.T) {
	shared, err := Run(overloadedRun(t, true, 4))
	require.NoError(t, err)
	localCfg := overloadedRun(t, true, 4)
	localCfg.Policy = FlowLocalAdmission(localCfg.Policy)
	local, err := Run(localCfg)
	require.NoError(t, err)
	t.Logf("released onto a taken room: shared %d of %d, local %d of %d", shared.Flow.OverRoom, shared.Flow.Released, local.Flow.OverRoom, local.Flow.Released)
	require.Positive(t, shared.Flow.Released)
	assert.Positive(t, local.Flow.OverRoom, "the check must be able to fail")
	assert.Less(t, shared.Flow.OverRoom*2, local.Flow.OverRoom, "the shared record keeps most rooms single")
}
