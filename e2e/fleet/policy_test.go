package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// When every scrape is older than DefaultStaleAfter, a scheduler policy
// fails open as the plugin does by default: every replica alike, whatever
// the stale metrics say, and the request counts as routed.
func TestSchedulerPolicyFailsOpenAsThePlugin(t *testing.T) {
	count := true
	spec, err := ParsePolicyWith(scheduler.ProfileLeastRequest, PolicyOptions{CountRoutedSinceSnapshot: &count})
	require.NoError(t, err)
	require.True(t, spec.CountsRouted)
	p, err := spec.New(1, func() time.Time { return Epoch })
	require.NoError(t, err)
	snap := &scheduler.Snapshot{Time: Epoch, Endpoints: make([]scheduler.Endpoint, 3)}
	for i := range snap.Endpoints {
		snap.Endpoints[i].Metrics.UpdateTime = Epoch.Add(-DefaultStaleAfter - time.Second)
		snap.Endpoints[i].Metrics.WaitingQueueSize = 50
	}
	snap.Endpoints[1].Metrics.WaitingQueueSize = 0 // least-request's pick, were it fresh
	counts := make([]int, 3)
	for range 900 {
		i, outcome := p.Route(&scheduler.Request{Model: "m", Criticality: scheduler.Sheddable}, &View{Snapshot: snap, InFlight: make([]int, 3)})
		require.Equal(t, scheduler.Routed, outcome)
		counts[i]++
	}
	for i, n := range counts {
		assert.InDelta(t, 300, n, 75, "replica %d of %v", i, counts)
	}
	for i := range snap.Endpoints {
		assert.Zero(t, snap.Endpoints[i].Metrics.RoutedSinceUpdate, "a fail-open request is not counted")
	}
}
