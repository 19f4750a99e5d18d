package scheduler

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ep builds an endpoint for tests.
func ep(name string, waiting int, kv float64, active, waitingModels []string, maxActive int) Endpoint {
	return Endpoint{
		ID:      EndpointID{Namespace: "ns", Name: name},
		Address: "10.0.0.1",
		Port:    8000,
		Metrics: Metrics{
			WaitingQueueSize: waiting,
			KVCacheUsage:     kv,
			ActiveModels:     active,
			WaitingModels:    waitingModels,
			MaxActiveModels:  maxActive,
		},
	}
}

func snapshot(eps ...Endpoint) *Snapshot { return &Snapshot{Endpoints: eps} }

func names(eps []*Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.ID.Name
	}
	return out
}

func seeded(seed uint64) Options { return Options{Rand: rand.NewPCG(seed, 0x5eed)} }

// newScheduler builds a Scheduler from JSON configuration.
func newScheduler(t testing.TB, configJSON string, opts Options) *Scheduler {
	t.Helper()
	cfg, err := DecodeConfig([]byte(configJSON))
	require.NoError(t, err)
	s, err := New(cfg, nil, opts)
	require.NoError(t, err)
	return s
}

// testCycle returns a cycle for calling plugins directly.
func testCycle(req *Request, snap *Snapshot, seed uint64) *Cycle {
	c := &Cycle{Rand: rand.New(rand.NewPCG(seed, 1)), clock: func() time.Time { return time.Unix(1000, 0) }}
	c.reset(req, snap)
	return c
}

// all returns pointers to every endpoint of snap.
func all(snap *Snapshot) []*Endpoint {
	out := make([]*Endpoint, len(snap.Endpoints))
	for i := range snap.Endpoints {
		out[i] = &snap.Endpoints[i]
	}
	return out
}
