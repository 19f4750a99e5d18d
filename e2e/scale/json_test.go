package scale

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// scalebench writes every Result as a JSON line: a field JSON cannot hold
// (a func) would lose them all.
func TestResultEncodesAsJSON(t *testing.T) {
	r := &Result{Config: RunConfig{Logf: t.Logf, Gateway: GatewayOptions{Logf: t.Logf}}, Windows: []Window{{Memory: []MemorySample{{Guest: 1}}}}}
	_, err := json.Marshal(r)
	require.NoError(t, err)
}
