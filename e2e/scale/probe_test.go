package scale

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The probe endpoint reports a new adapter every scrape and keeps the
// last probeKeep, in the sorted order the wire wants.
func TestProbeAdapterChangesEveryScrape(t *testing.T) {
	f := NewFleet(4, 2, 8000, 1, true)
	p := f.Probe
	require.NotNil(t, p)
	assert.Empty(t, f.Agents[0].ProbeAdapter(), "not the probe")
	now := time.Unix(1_760_000_000, 0)
	seen := map[string]bool{}
	for i := 0; i < 3*probeKeep; i++ {
		now = now.Add(50 * time.Millisecond)
		p.Step(now, 1)
		a := p.ProbeAdapter()
		assert.False(t, seen[a], "adapter %q came twice", a)
		seen[a] = true
		ads := p.Eps[0].ActiveAdapters
		assert.Equal(t, probeKeep, len(ads), "every slot taken")
		assert.True(t, slices.IsSorted(ads), "sorted")
		assert.Equal(t, a, ads[len(ads)-1], "the newest is last")
		_, err := p.Push(nil, 2, now)
		require.NoError(t, err)
	}
}

// What the prober relies on, with the real .wasm: a request for the
// adapter of the probe's last push lands on the probe endpoint once that
// push is stored, not before, and the adapters of its earlier pushes
// still do.
func TestProbeAdapterRoutesToTheProbeOncePushed(t *testing.T) {
	e := startHost(t, routerCfg)
	f := NewFleet(20, 2, e.up.Port, 1, true)
	require.Equal(t, 204, e.post(relay(t, f, "relay-0", e.clock.Now())))
	var first string
	for i := 0; i < 3; i++ {
		e.clock.Advance(50 * time.Millisecond)
		b := relay(t, f, "relay-0", e.clock.Now())
		a := f.Probe.ProbeAdapter()
		if first == "" {
			first = a
		}
		code, by := e.route(a)
		require.Equal(t, 200, code)
		assert.NotEqual(t, "llm/"+ProbeName, by, "not pushed yet")
		require.Equal(t, 204, e.post(b))
		e.visible()
		code, by = e.route(a)
		require.Equal(t, 200, code)
		assert.Equal(t, "llm/"+ProbeName, by, "pushed")
	}
	code, by := e.route(first)
	require.Equal(t, 200, code)
	assert.Equal(t, "llm/"+ProbeName, by, "an earlier push's adapter is still running")
}
