package endtoend

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// TestLoRAAffinityRoom: with one adapter slot per replica, a replica whose
// slot is taken has no room, so a request for another adapter must go to the
// replica that has room; requests for the running adapter go to the replica
// running it.
func TestLoRAAffinityRoom(t *testing.T) {
	s := startStack(t, stack.Config{
		Replicas: 2,
		Adapters: []string{"sql-lora-0", "sql-lora-1", "sql-lora-2"},
		MaxLoRAs: 1,
	})
	const busy, other = "sql-lora-0", "sql-lora-1"
	stream := openStream(t, s, busy, 3000)
	full := stream.Header.Get(s.Info().Router.ServedByHeader)
	require.NotNil(t, replicaByAddr(s, full), "served by %q", full)
	var free string
	for _, a := range replicaAddrs(s) {
		if a != full {
			free = a
		}
	}
	poll(t, func() bool { return runningAdapter(t, full, busy) })
	// Wait until the gateway's snapshot shows the slot taken.
	waitPushes(t, s, 3)

	for i := range 20 {
		r := complete(t, s, other, 2)
		require.Equal(t, http.StatusOK, r.Status, r.String())
		require.Equal(t, free, r.served(s), "request %d for %s went to the replica without room", i, other)
	}
	stream.Body.Close()
}
