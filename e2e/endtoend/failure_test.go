package endtoend

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// TestReplicaKilled: a replica killed mid-run stops receiving traffic
// within staleAfter plus three scrape intervals, and nothing is routed to it
// afterwards (killAndFailOver). The traffic is light, so the dead
// replica's last metrics look idle and it keeps attracting requests until
// it is stale: the bound is what ends the failures.
func TestReplicaKilled(t *testing.T) {
	s := startStack(t, stack.Config{Replicas: 3, TimeScale: 4})
	everyReplicaServes(t, s) // the victim included

	f := killAndFailOver(t, s, 0)
	t.Logf("failover: the last request to fail started %s after the kill (bound %s); %d of the %d requests sent before the bound failed",
		f.lastFailure.Round(time.Millisecond), f.bound, f.failed, f.sent)
}

// TestAgentStopped: with the agent gone, metrics go stale and each
// listener's policy applies — fail-open (the default) keeps routing to the
// last-known endpoints and counts it, reject answers 503 — and routing
// recovers when the agent returns.
func TestAgentStopped(t *testing.T) {
	s := startStack(t, stack.Config{
		Replicas:     2,
		ExtraRouters: []stack.RouterListener{{Name: "strict", Addr: "127.0.0.1:0", Patch: map[string]any{"whenNoFreshEndpoint": "reject"}}},
	})
	strictURL := s.ListenerURL("strict") + "/v1/completions"
	strict := func() reply { return send(t, http.MethodPost, strictURL, completion(stackModel, 1), nil) }
	r := strict()
	require.Equal(t, http.StatusOK, r.Status, r.String())
	failOpen := pluginStat("requests.fail_open")
	require.Zero(t, stat(t, s, failOpen))

	s.StopAgent()
	// Stale: the strict listener refuses with the plugin's JSON error...
	poll(t, func() bool { r = strict(); return r.Status == http.StatusServiceUnavailable })
	var e errorBody
	require.NoError(t, json.Unmarshal(r.Body, &e), r.String())
	assert.Equal(t, "service_unavailable", e.Error.Type)
	assert.Equal(t, "no_endpoint", e.Error.Code)
	// ...and the default listener fails open to a last-known replica.
	replicas := replicaAddrs(s)
	for range 10 {
		r := complete(t, s, stackModel, 1)
		require.Equal(t, http.StatusOK, r.Status, r.String())
		require.Contains(t, replicas, r.served(s))
	}
	require.GreaterOrEqual(t, stat(t, s, failOpen), uint64(10), "fail-open decisions are counted")

	require.NoError(t, s.StartAgent(t.Context()))
	poll(t, func() bool { return strict().Status == http.StatusOK },
		"routing did not recover after the agent returned")
	awaitRouters() // the other VMs re-read the agent's return on their ticks
	before := stat(t, s, failOpen)
	for range 10 {
		r := complete(t, s, stackModel, 1)
		require.Equal(t, http.StatusOK, r.Status, r.String())
	}
	require.Equal(t, before, stat(t, s, failOpen), "fresh metrics again: no more fail-open decisions")
}
