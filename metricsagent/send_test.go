package metricsagent

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/kv"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// vllmPage is a minimal vLLM metrics page.
func vllmPage(waiting, running int, kv float64, adapters string) []byte {
	return fmt.Appendf(nil, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} %d
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} %d
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} %g
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="%s",waiting_lora_adapters=""} 1.7e9
`, running, waiting, kv, adapters)
}

// TestAgentSendThresholds runs an agent with the default send thresholds
// against a real loopback pod and stores what it pushes with the plugin's
// write step (wire.Writer) and read step (wire.Cache): a move below a
// threshold is not pushed, one beyond it is; an idle pod's endpoint stays
// fresh at the router through the heartbeat alone; and once the agent
// falls silent its endpoint is older than staleAfter after staleAfter, and
// is dropped by the next push that brings news.
func TestAgentSendThresholds(t *testing.T) {
	const staleAfter = 2 * time.Second
	pod := newPodServer(t, serveText(vllmPage(3, 10, 0.40, "x")))
	envoy := newSink(t, "tok")
	a := newTestAgent(t, []Target{pod.target("llm", "a")}, []string{envoy.addr()}, "tok", 5*time.Second)
	th := wire.DefaultSendThresholds()
	a.gate = wire.NewSendGate("node-1", th)

	keys := wire.NewKeys(wire.DefaultKeyPrefix)
	st := &kv.MemStore{}
	w := wire.NewWriter(keys, wire.DefaultLimits(), staleAfter)
	require.NoError(t, w.Init(st))
	cache := wire.NewCache(keys, wire.DefaultLimits())
	// cycle runs one cycle at the fake clock and stores its push, if any.
	cycle := func() bool {
		t.Helper()
		payload := a.Cycle(context.Background())
		if payload != nil {
			envoy.next(t)
			_, err := w.Apply(st, payload, a.clock.Now())
			require.NoError(t, err)
		}
		a.clock.Advance(50 * time.Millisecond)
		return payload != nil
	}
	fresh := func() time.Duration {
		t.Helper()
		snap, _, err := cache.Refresh(st)
		require.NoError(t, err)
		require.Len(t, snap.Endpoints, 1)
		return a.clock.Now().Sub(snap.Endpoints[0].Metrics.UpdateTime)
	}

	require.True(t, cycle(), "the first state is sent")
	// Stay inside one heartbeat slot for the threshold checks.
	slotStart := func() {
		for !cycle() {
		}
	}
	slotStart()
	steps := []struct {
		page []byte
		sent bool
		why  string
	}{
		{vllmPage(3, 10, 0.40, "x"), false, "nothing moved"},
		{vllmPage(3, 10, 0.41, "x"), false, "KV-cache use 1 point: below 2"},
		{vllmPage(3, 10, 0.43, "x"), true, "KV-cache use 3 points from the copy sent"},
		{vllmPage(4, 10, 0.43, "x"), true, "a queued request"},
		{vllmPage(4, 11, 0.43, "x"), true, "a running request"},
		{vllmPage(4, 11, 0.43, "x,y"), true, "an adapter started"},
		{vllmPage(4, 11, 0.43, "x,y"), false, "nothing moved"},
	}
	for _, s := range steps {
		pod.set(serveText(s.page))
		assert.Equal(t, s.sent, cycle(), s.why)
	}
	skipped := testutil.ToFloat64(a.metrics.Cycles.WithLabelValues("not_due"))
	assert.GreaterOrEqual(t, skipped, 3.0)

	// Idle for 5 s: only heartbeats, about one per 500 ms, and the router's
	// copy never older than a heartbeat and a scrape.
	sends := 0
	for i := 0; i < 100; i++ {
		if cycle() {
			sends++
		}
		assert.LessOrEqual(t, fresh(), th.Heartbeat+100*time.Millisecond)
	}
	assert.InDelta(t, 10, sends, 1, "heartbeats in 5 s")
	assert.InDelta(t, float64(sends), testutil.ToFloat64(a.metrics.Cycles.WithLabelValues("heartbeat")), 2)

	// The agent falls silent: its endpoint is stale staleAfter later...
	a.clock.Advance(staleAfter)
	assert.Greater(t, fresh(), staleAfter)
	// ...and gone once another agent's push brings news.
	other := wire.Push{AgentID: "node-2", Seq: 1, SendTime: a.clock.Now(), Endpoints: []wire.EndpointState{{
		Namespace: "llm", Name: "b", Address: pod.target("llm", "b").Address, Port: 9, ScrapeTime: a.clock.Now(), MaxAdapters: 1}}}
	var enc wire.BlockEncoder
	payload, err := enc.AppendAgentPush(nil, &other, wire.Limits{})
	require.NoError(t, err)
	stats, err := w.Apply(st, payload, a.clock.Now())
	require.NoError(t, err)
	snap, _, err := cache.Refresh(st)
	require.NoError(t, err)
	require.Len(t, snap.Endpoints, 1, "node-1's block swept (%+v)", stats)
	assert.Equal(t, "b", snap.Endpoints[0].ID.Name)
}

// TestAgentRetriesFailedTargetsBetweenSends: a target that missed the
// last push gets it again on the next cycle, even when nothing moved.
func TestAgentRetriesFailedTargetsBetweenSends(t *testing.T) {
	pod := newPodServer(t, serveText(vllmPage(3, 10, 0.40, "")))
	envoy := newSink(t, "tok")
	var failing atomic.Bool
	failing.Store(true)
	flaky := newSink(t, "tok")
	flaky.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		flaky.serve(w, r)
	})
	a := newTestAgent(t, []Target{pod.target("llm", "a")}, []string{envoy.addr(), flaky.addr()}, "tok", 5*time.Second)
	a.gate = wire.NewSendGate("node-1", wire.SendThresholds{Heartbeat: wire.MaxHeartbeat, Waiting: 1, Running: 1, KVCacheUsage: 0.02})
	done := make(chan error, 10)
	a.pusher.Sent = func(target string, err error) {
		if target == flaky.addr() {
			done <- err
		}
	}
	require.NotNil(t, a.Cycle(context.Background()))
	envoy.next(t)
	require.Error(t, <-done)
	failing.Store(false)
	assert.Nil(t, a.Cycle(context.Background()), "nothing moved: no new push")
	require.NoError(t, <-done, "the failed target got the last push again")
	p := flaky.next(t)
	assert.Equal(t, uint32(3), p.Endpoints[0].Waiting)
	assert.Nil(t, a.Cycle(context.Background()))
	select {
	case err := <-done:
		t.Fatalf("a delivered push was sent again (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
}
