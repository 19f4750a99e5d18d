package wire

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

func gateState() []EndpointState {
	return []EndpointState{
		{Namespace: "llm", Name: "a", Address: netip.MustParseAddr("10.0.0.1"), Port: 8000, Waiting: 3, Running: 10, KVCacheUsage: 0.40, MaxAdapters: 4, ActiveAdapters: []string{"x"}},
		{Namespace: "llm", Name: "b", Address: netip.MustParseAddr("10.0.0.2"), Port: 8000, Waiting: 0, Running: 2, KVCacheUsage: 0.10, MaxAdapters: 4},
	}
}

func TestSendGateThresholds(t *testing.T) {
	th := SendThresholds{Heartbeat: MaxHeartbeat, Waiting: 2, Running: 3, KVCacheUsage: 0.05}
	require.NoError(t, th.Validate())
	g := NewSendGate("node-1", th)
	now := time.Unix(1_760_000_000, 0)
	eps := gateState()
	assert.Equal(t, First, g.Due(eps, now))
	g.Sent(eps, now)
	assert.Equal(t, NotDue, g.Due(eps, now), "nothing moved")

	cases := []struct {
		name string
		edit func(e []EndpointState)
		want Reason
	}{
		{"waiting +1 below 2", func(e []EndpointState) { e[0].Waiting++ }, NotDue},
		{"waiting +2", func(e []EndpointState) { e[0].Waiting += 2 }, Values},
		{"waiting -2 from 0 cannot, +2 on b", func(e []EndpointState) { e[1].Waiting += 2 }, Values},
		{"running -2 below 3", func(e []EndpointState) { e[0].Running -= 2 }, NotDue},
		{"running -3", func(e []EndpointState) { e[0].Running -= 3 }, Values},
		{"kv +0.04 below 0.05", func(e []EndpointState) { e[0].KVCacheUsage += 0.04 }, NotDue},
		{"kv -0.06", func(e []EndpointState) { e[1].KVCacheUsage = 0.04 }, Values},
		{"an adapter started", func(e []EndpointState) { e[1].ActiveAdapters = []string{"y"} }, Endpoints},
		{"an adapter waits", func(e []EndpointState) { e[0].WaitingAdapters = []string{"z"} }, Endpoints},
		{"adapter slots", func(e []EndpointState) { e[0].MaxAdapters = 8 }, Endpoints},
		{"scrape failed", func(e []EndpointState) { e[0].LastError = ScrapeTimeout }, Endpoints},
		{"address", func(e []EndpointState) { e[1].Address = netip.MustParseAddr("10.0.0.9") }, Endpoints},
		{"port", func(e []EndpointState) { e[1].Port = 8001 }, Endpoints},
		{"endpoint gone", func(e []EndpointState) { e[1] = e[0] }, Endpoints},
	}
	for _, c := range cases {
		e := gateState()
		c.edit(e)
		assert.Equal(t, c.want, g.Due(e, now), c.name)
	}
	assert.Equal(t, Endpoints, g.Due(gateState()[:1], now), "one endpoint less")

	// Below-threshold moves accumulate against the copy last sent, not the
	// previous scrape.
	e := gateState()
	e[0].KVCacheUsage = 0.43
	assert.Equal(t, NotDue, g.Due(e, now))
	e[0].KVCacheUsage = 0.46
	assert.Equal(t, Values, g.Due(e, now))
	g.Sent(e, now)
	assert.Equal(t, NotDue, g.Due(e, now))

	// The gate keeps its own copy: the caller rewriting its lists in
	// place is still a change.
	e[0].ActiveAdapters[0] = "w"
	assert.Equal(t, Endpoints, g.Due(e, now))

	g.Force()
	assert.Equal(t, Forced, g.Due(gateState(), now))
	g.Sent(gateState(), now)
	assert.Equal(t, NotDue, g.Due(gateState(), now))
}

func TestSendGateZeroKVThresholdIsAnyChange(t *testing.T) {
	g := NewSendGate("n", SendThresholds{Heartbeat: MaxHeartbeat, Waiting: 1, Running: 1})
	now := time.Unix(1_760_000_000, 0)
	g.Sent(gateState(), now)
	e := gateState()
	assert.Equal(t, NotDue, g.Due(e, now))
	e[0].KVCacheUsage += 1e-9
	assert.Equal(t, Values, g.Due(e, now))
}

// TestSendGateHeartbeat: an idle state is sent once per heartbeat period,
// never more than a period plus a scrape apart; agents of one segment
// share their heartbeat slots, agents of other segments are spread over
// the period.
func TestSendGateHeartbeat(t *testing.T) {
	const hb, scrape = 500 * time.Millisecond, 50 * time.Millisecond
	th := DefaultSendThresholds()
	require.Equal(t, hb, th.Heartbeat)
	now := time.Unix(1_760_000_000, 0).Add(7 * time.Millisecond)
	sends := func(id string) []time.Time {
		g := NewSendGate(id, th)
		var at []time.Time
		for i := 0; i < 200; i++ { // 10 s
			t := now.Add(time.Duration(i) * scrape)
			if g.Due(gateState(), t) != NotDue {
				g.Sent(gateState(), t)
				at = append(at, t)
			}
		}
		return at
	}
	a := sends("node-00001")
	assert.InDelta(t, 20, len(a), 1, "one send per heartbeat period")
	assert.LessOrEqual(t, a[1].Sub(a[0]), hb+scrape, "the first heartbeat after the first send")
	for i := 2; i < len(a); i++ { // aligned on the agent's slots from then on
		gap := a[i].Sub(a[i-1])
		assert.LessOrEqual(t, gap, hb+scrape)
		assert.GreaterOrEqual(t, gap, hb-scrape)
	}
	// Another agent in the same segment beats in the same scrapes.
	var same, other string
	for i := 2; same == "" || other == ""; i++ {
		id := "node-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26))
		switch {
		case SegmentOf([]byte(id)) == SegmentOf([]byte("node-00001")) && same == "":
			same = id
		case SegmentOf([]byte(id)) != SegmentOf([]byte("node-00001")) && other == "" &&
			(SegmentOf([]byte(id))-SegmentOf([]byte("node-00001"))+NumSegments)%NumSegments > NumSegments/4:
			other = id
		}
	}
	assert.Equal(t, a[1:], sends(same)[1:], "same segment, same heartbeat scrapes (after the first send)")
	assert.NotEqual(t, a[1:6], sends(other)[1:6], "another segment beats at another phase")
}

func TestSendThresholdsValidate(t *testing.T) {
	require.NoError(t, DefaultSendThresholds().Validate())
	require.NoError(t, SendThresholds{Waiting: 1, Running: 1}.Validate(), "heartbeat 0: every scrape")
	for _, bad := range []SendThresholds{
		{Heartbeat: -1, Waiting: 1, Running: 1},
		{Heartbeat: 2 * MaxHeartbeat, Waiting: 1, Running: 1},
		{Heartbeat: time.Second, Waiting: 0, Running: 1},
		{Heartbeat: time.Second, Waiting: 1, Running: 0},
		{Heartbeat: time.Second, Waiting: 1, Running: 1, KVCacheUsage: 1.5},
		{Heartbeat: time.Second, Waiting: 1, Running: 1, KVCacheUsage: -0.1},
	} {
		assert.Error(t, bad.Validate(), "%+v", bad)
	}
}

func TestSendGateHeartbeatZeroSendsAlways(t *testing.T) {
	g := NewSendGate("n", SendThresholds{Waiting: 1, Running: 1})
	now := time.Unix(1_760_000_000, 0)
	g.Sent(gateState(), now)
	assert.Equal(t, Always, g.Due(gateState(), now))
}

// TestCacheRewritesOnlyChangedBlocks: when one agent of a segment pushes,
// a router rewrites only that agent's endpoints; the segment's other
// blocks are the same bytes and their endpoints keep what the router
// holds for them (here the requests it routed since their last update).
func TestCacheRewritesOnlyChangedBlocks(t *testing.T) {
	var a, b string
	for i := 0; b == ""; i++ {
		id := fmt.Sprintf("node-%03d", i)
		switch {
		case a == "":
			a = id
		case SegmentOf([]byte(id)) == SegmentOf([]byte(a)):
			b = id
		}
	}
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	require.NoError(t, w.Init(st))
	apply := func(id string, seq uint64, marker uint32, d time.Duration) {
		t.Helper()
		_, err := w.Apply(st, agentPush(t, id, seq, at(d), agentState(id, 2, marker, at(d))), at(d))
		require.NoError(t, err)
	}
	apply(a, 1, 3, 0)
	apply(b, 1, 4, 0)
	c := NewCache(testKeys, Limits{})
	snap, _, err := c.Refresh(st)
	require.NoError(t, err)
	require.Len(t, snap.Endpoints, 4)
	byAgent := func(snap *scheduler.Snapshot, id string) []*scheduler.Endpoint {
		var out []*scheduler.Endpoint
		for i := range snap.Endpoints {
			if strings.HasPrefix(snap.Endpoints[i].ID.Name, id+"-") {
				out = append(out, &snap.Endpoints[i])
			}
		}
		return out
	}
	for _, e := range byAgent(snap, a) {
		e.Metrics.RoutedSinceUpdate = 5
	}
	for _, e := range byAgent(snap, b) {
		e.Metrics.RoutedSinceUpdate = 5
	}
	apply(a, 2, 9, 50*time.Millisecond)
	snap, changed, err := c.Refresh(st)
	require.NoError(t, err)
	require.True(t, changed)
	for _, e := range byAgent(snap, a) {
		assert.Equal(t, 9, e.Metrics.WaitingQueueSize, "the agent that pushed: new values")
		assert.Zero(t, e.Metrics.RoutedSinceUpdate, "rewritten")
	}
	for _, e := range byAgent(snap, b) {
		assert.Equal(t, 4, e.Metrics.WaitingQueueSize)
		assert.Equal(t, 5, e.Metrics.RoutedSinceUpdate, "the same block: not rewritten")
	}
	// A fresh cache reads the same values.
	fresh := snapshotOf(t, st)
	for i := range fresh.Endpoints {
		got := snap.Endpoints[i].Metrics
		got.RoutedSinceUpdate = 0
		assert.Equal(t, fresh.Endpoints[i].Metrics, got)
	}
}
