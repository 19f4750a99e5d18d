package filter

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBurstBetweenSnapshots: 16 requests arrive before the next snapshot,
// over four pods that differ only in KV-cache usage. Without counting they
// all go to the pod with the least KV cache (burst herding); with the
// scheduler's countRoutedSinceSnapshot each routed request counts as
// waiting in this VM's copy, so the burst spreads evenly. A new snapshot
// starts from its own numbers again.
func TestBurstBetweenSnapshots(t *testing.T) {
	pods := []pod{
		{name: "a", addr: "10.0.0.1", kv: 0.1},
		{name: "b", addr: "10.0.0.2", kv: 0.2},
		{name: "c", addr: "10.0.0.3", kv: 0.3},
		{name: "d", addr: "10.0.0.4", kv: 0.4},
	}
	config := func(count bool) string {
		return fmt.Sprintf(`{"seed": 7, "models": [{"name": "base", "criticality": "Critical"}],
			"scheduler": {"countRoutedSinceSnapshot": %t}}`, count)
	}
	burst := func(e *env, n int) map[string]int {
		got := map[string]int{}
		for range n {
			r := e.post("/v1/chat/completions", nil, chat("base"))
			require.Nil(t, r.local)
			got[r.dest()]++
		}
		return got
	}
	for _, tc := range []struct {
		count bool
		want  map[string]int
	}{
		{false, map[string]int{"10.0.0.1:8000": 16}},
		{true, map[string]int{"10.0.0.1:8000": 4, "10.0.0.2:8000": 4, "10.0.0.3:8000": 4, "10.0.0.4:8000": 4}},
	} {
		t.Run(fmt.Sprintf("count=%t", tc.count), func(t *testing.T) {
			e := newEnv(t, config(tc.count))
			defer e.close()
			e.setPods(pods...)
			assert.Equal(t, tc.want, burst(e, 16))

			e.setPods(pods...) // the next push: same scraped numbers, fresh counts
			assert.Equal(t, map[string]int{"10.0.0.1:8000": 1}, burst(e, 1))
			assert.Equal(t, uint64(2), e.counter("wasm_epp.snapshot.decodes"))
			assert.Equal(t, uint64(17), e.counter("wasm_epp.requests.routed"))
		})
	}
}

// TestBodylessRequestsAreNotCounted: GET /v1/models is not inference and
// leaves the counts alone, so it keeps going to the least-loaded pod.
func TestBodylessRequestsAreNotCounted(t *testing.T) {
	e := newEnv(t, `{"seed": 7, "scheduler": {"countRoutedSinceSnapshot": true}}`)
	e.setPods(pod{name: "idle", addr: "10.0.0.1"}, pod{name: "busy", addr: "10.0.0.2", running: 3})
	for range 5 {
		r := e.do([][2]string{{":method", "GET"}, {":path", "/v1/models"}})
		require.Nil(t, r.local)
		assert.Equal(t, "10.0.0.1:8000", r.dest())
	}
}
