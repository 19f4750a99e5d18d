package filter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Destinations of the cached snapshot's endpoints are formatted once, at
// the index the scheduler names; another snapshot's are formatted afresh.
func TestDestinationCache(t *testing.T) {
	const cfgJSON = `{"models": [{"name": "chat", "criticality": "Standard"}]}`
	e := newEnv(t, cfgJSON) // a host for the router's metrics and shared data
	cfg, err := config.Decode([]byte(cfgJSON))
	require.NoError(t, err)
	r, err := NewRouter(cfg, Options{Now: func() time.Time { return t0 }})
	require.NoError(t, err)
	e.setPods(pod{name: "a", addr: "10.0.0.1", port: 8000, max: 4},
		pod{name: "b", addr: "fd00::2", port: 8001, max: 4, waiting: 9})
	snap := r.snapshot()
	require.Len(t, snap.Endpoints, 2)

	r.clock.Decide()
	r.req = scheduler.Request{Model: "chat", TargetModel: "chat", Criticality: scheduler.Standard}
	res := r.sched.Schedule(&r.req, snap)
	require.Equal(t, scheduler.Routed, res.Outcome)
	want := r.destination(res.Endpoint)
	assert.Equal(t, want, r.destinationOf(snap, res.Index))
	assert.Equal(t, want, r.dests[res.Index], "cached")

	assert.Equal(t, "[fd00::2]:8001", r.destinationOf(snap, 1))
	assert.Equal(t, "[fd00::2]:8001", r.dests[1])
	other := *snap
	other.Endpoints = append([]scheduler.Endpoint(nil), snap.Endpoints...)
	other.Endpoints[0].Port = 9000
	assert.Equal(t, "10.0.0.1:9000", r.destinationOf(&other, 0), "not the cached snapshot: formatted")
}
