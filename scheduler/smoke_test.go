package scheduler

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSmokeDecisionTree(t *testing.T) {
	s, err := New(Config{}, nil, Options{Rand: rand.NewPCG(1, 2)})
	require.NoError(t, err)
	snap := &Snapshot{Endpoints: []Endpoint{
		{ID: EndpointID{Name: "a"}, Metrics: Metrics{WaitingQueueSize: 0, KVCacheUsage: 0.2, MaxActiveModels: 4}},
		{ID: EndpointID{Name: "b"}, Metrics: Metrics{WaitingQueueSize: 3, KVCacheUsage: 0.1, ActiveModels: []string{"x"}, MaxActiveModels: 4}},
	}}
	r := s.Schedule(&Request{Model: "x", Criticality: Critical}, snap)
	require.Equal(t, Routed, r.Outcome)
	require.Equal(t, "b", r.Endpoint.ID.Name)
	t.Log(r.Path, s.Paths())
}
