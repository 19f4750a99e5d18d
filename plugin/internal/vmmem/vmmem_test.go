package vmmem

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
)

// report reads every reading's gauge from a fresh host after one report.
func report(t *testing.T) map[string]uint64 {
	t.Helper()
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption())
	defer reset()
	Forget() // a new host: its gauges start at 0
	Define()
	Maybe()
	out := map[string]uint64{}
	for _, r := range readings {
		v, err := host.GetGaugeMetric(r.gauge)
		require.NoError(t, err, r.gauge)
		out[r.gauge] = v
	}
	return out
}

// The gauges carry the runtime's readings: memory mapped, a heap and its
// goal, and completed collections, which a collection advances.
func TestGaugesCarryTheRuntimeReadings(t *testing.T) {
	before := report(t)
	assert.Greater(t, before["wasm_epp.vm.memory_bytes"], uint64(1<<20))
	assert.Greater(t, before["wasm_epp.vm.heap_goal_bytes"], uint64(0))
	assert.Greater(t, before["wasm_epp.vm.heap_objects_bytes"], uint64(0))
	runtime.GC()
	after := report(t)
	assert.Greater(t, after["wasm_epp.vm.gc_cycles"], before["wasm_epp.vm.gc_cycles"])
	assert.Greater(t, after["wasm_epp.vm.heap_live_bytes"], uint64(0), "marked by the collection")
}
