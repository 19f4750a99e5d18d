package scheduler

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// TestPrefixTrackerFollowsInPlaceChanges: an owner that rewrites one
// Snapshot in place (same pointer, same Endpoints array) and says so with
// Changed gets keys read from the new identities; MetricsChanged alone
// keeps them.
func TestPrefixTrackerFollowsInPlaceChanges(t *testing.T) {
	snap := idle(3)
	idx, err := prefix.NewIndex(prefix.IndexConfig{}, nil)
	require.NoError(t, err)
	tr := NewPrefixTracker(idx)
	h, err := prefix.NewHasher(prefix.HashConfig{})
	require.NoError(t, err)
	raw, _ := json.Marshal(longPrompt("keys", 10))
	require.NoError(t, h.HashPrompt("m", nil, raw))
	keyOf := func(e *Endpoint) uint32 { return prefix.EndpointKey(e.ID.Namespace, e.ID.Name, e.Address, e.Port) }
	prepare := func() {
		req := &Request{Model: "m"}
		tr.Prepare(req, snap, h.Blocks(), h.Key())
	}

	prepare()
	require.Equal(t, keyOf(&snap.Endpoints[1]), tr.KeyOf(1))
	before := tr.KeyOf(1)

	snap.Endpoints[1].ID.Name, snap.Endpoints[1].Address = "pod-9", "10.0.0.9"
	snap.Changed()
	prepare()
	require.NotEqual(t, before, tr.KeyOf(1))
	require.Equal(t, keyOf(&snap.Endpoints[1]), tr.KeyOf(1), "identity rewritten in place, then Changed")
	require.Equal(t, keyOf(&snap.Endpoints[1]), tr.EndpointKey(&snap.Endpoints[1]))

	read := tr.keysRead
	snap.Endpoints[2].Metrics.WaitingQueueSize = 5
	snap.MetricsChanged(2)
	prepare()
	require.Equal(t, read, tr.keysRead, "new metrics: the keys stay")
}
