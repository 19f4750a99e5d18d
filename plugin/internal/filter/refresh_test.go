package filter

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// monoClock is the router's monotonic clock in these tests.
type monoClock struct{ now time.Duration }

func (m *monoClock) since() time.Duration { return m.now }

// refreshEnv starts the router with cfg on a monotonic clock the test
// moves, with two pods: a idle, b loaded (requests go to a).
func refreshEnv(t *testing.T, cfg string) (*env, *monoClock) {
	t.Helper()
	mono := &monoClock{now: time.Second}
	e, status := startEnvOpts(t, cfg, Options{Mono: mono.since})
	require.Equal(t, types.OnPluginStartStatusOK, status, "plugin start; error logs: %v", e.host.GetCriticalLogs())
	e.setPods(pod{name: "a", addr: "10.0.0.1"}, pod{name: "b", addr: "10.0.0.2", waiting: 5})
	return e, mono
}

// swapLoad stores the pods with the load moved to the other one, as a
// relay would, without a tick; toB: requests should now go to b.
func (e *env) swapLoad(toB bool) {
	e.t.Helper()
	a, b := uint32(0), uint32(5)
	if toB {
		a, b = b, a
	}
	e.writePods("node-1", pod{name: "a", addr: "10.0.0.1", waiting: a}, pod{name: "b", addr: "10.0.0.2", waiting: b})
}

func (e *env) routedTo() string {
	e.t.Helper()
	r := e.post("/v1/chat/completions", nil, chat("base"))
	require.Nil(e.t, r.local, "routed")
	return r.dest()
}

// A request after a relay decides on what the last tick read while that
// re-read is within twice the refresh interval; the next tick brings the
// relay's values; a router whose ticks stop re-reads in the request once
// the last re-read is older than the bound.
func TestRequestsDecideOnTheTicksSnapshotWithinTheBound(t *testing.T) {
	e, mono := refreshEnv(t, `{"models": [{"name": "base", "criticality": "Critical"}], "snapshotRefreshInterval": "20ms"}`)
	require.Equal(t, "10.0.0.1:8000", e.routedTo())
	decodes := e.counter("wasm_epp.snapshot.decodes")

	e.swapLoad(true)
	mono.now += 10 * time.Millisecond
	assert.Equal(t, "10.0.0.1:8000", e.routedTo(), "decided on the tick's snapshot: no re-read in the request")
	assert.Equal(t, decodes, e.counter("wasm_epp.snapshot.decodes"), "the request did not re-read")

	mono.now += 10 * time.Millisecond
	e.host.Tick()
	assert.Equal(t, decodes+1, e.counter("wasm_epp.snapshot.decodes"), "the tick re-read")
	assert.Equal(t, "10.0.0.2:8000", e.routedTo(), "the relay's values, from the tick")

	// No tick comes: within the bound the request still decides on the
	// tick's snapshot; past it, it re-reads itself.
	e.swapLoad(false)
	mono.now += 40 * time.Millisecond // exactly the bound
	assert.Equal(t, "10.0.0.2:8000", e.routedTo())
	assert.Zero(t, e.counter("wasm_epp.snapshot.request_refreshes"))
	mono.now += time.Millisecond
	assert.Equal(t, "10.0.0.1:8000", e.routedTo(), "past the bound the request re-reads")
	assert.Equal(t, uint64(1), e.counter("wasm_epp.snapshot.request_refreshes"))
	// That re-read counts as the last one: the next request within the
	// bound does not re-read again.
	e.swapLoad(true)
	mono.now += 39 * time.Millisecond
	assert.Equal(t, "10.0.0.1:8000", e.routedTo())
	assert.Equal(t, uint64(1), e.counter("wasm_epp.snapshot.request_refreshes"))
}

// A router that never gets a tick (a host that does not deliver them)
// still follows shared data: each request past the bound re-reads.
func TestRouterWithoutTicksStillRefreshes(t *testing.T) {
	e, mono := refreshEnv(t, `{"models": [{"name": "base", "criticality": "Critical"}]}`)
	bound := 2 * config.DefaultSnapshotRefresh
	for i, toB := range []bool{true, false, true} {
		e.swapLoad(toB)
		mono.now += bound + time.Millisecond
		want := "10.0.0.1:8000"
		if toB {
			want = "10.0.0.2:8000"
		}
		assert.Equal(t, want, e.routedTo(), "relay %d", i)
	}
	assert.Equal(t, uint64(3), e.counter("wasm_epp.snapshot.request_refreshes"))
}

// "0s" keeps the re-read in every request: no tick, each request sees
// shared data as it is.
func TestRefreshIntervalZeroReReadsInEveryRequest(t *testing.T) {
	e, _ := refreshEnv(t, `{"models": [{"name": "base", "criticality": "Critical"}], "snapshotRefreshInterval": "0s"}`)
	assert.Zero(t, e.vm.root.router.TickPeriod())
	for _, toB := range []bool{true, false, true} {
		e.swapLoad(toB)
		want := "10.0.0.1:8000"
		if toB {
			want = "10.0.0.2:8000"
		}
		assert.Equal(t, want, e.routedTo())
	}
	assert.Zero(t, e.counter("wasm_epp.snapshot.request_refreshes"))
}

// Between two ticks requests decide on one version of shared data: what
// the last tick read, every agent as it was then, never some agents of
// the relay that came since and others from before.
func TestTicksInstallWholeRelays(t *testing.T) {
	e, mono := refreshEnv(t, `{"models": [{"name": "base", "criticality": "Critical"}], "snapshotRefreshInterval": "20ms"}`)
	const agents, per = 6, 3
	relay := func(version uint32) {
		for a := 0; a < agents; a++ {
			pods := make([]pod, per)
			for i := range pods {
				pods[i] = pod{name: fmt.Sprintf("node-%d-%d", a, i), addr: fmt.Sprintf("10.1.%d.%d", a, i+1), waiting: version}
			}
			e.writePods(fmt.Sprintf("node-%d", a), pods...)
		}
	}
	versions := func() map[int]int {
		seen := map[int]int{}
		for _, ep := range e.vm.root.router.snap.Endpoints {
			if strings.HasPrefix(ep.ID.Name, "node-") {
				seen[ep.Metrics.WaitingQueueSize]++
			}
		}
		return seen
	}
	e.routedTo() // the VM serves requests: its tick re-reads
	relay(1)
	mono.now += 20 * time.Millisecond
	e.host.Tick()
	require.Equal(t, map[int]int{1: agents * per}, versions())
	for v := uint32(2); v <= 4; v++ {
		relay(v)
		mono.now += 5 * time.Millisecond
		e.routedTo()
		assert.Equal(t, map[int]int{int(v - 1): agents * per}, versions(), "before the tick: the last one's version, whole")
		mono.now += 15 * time.Millisecond
		e.host.Tick()
		assert.Equal(t, map[int]int{int(v): agents * per}, versions(), "after the tick: the relay's, whole")
	}
}

// A VM that serves no request (Envoy's main-thread one) does not re-read
// on its tick; one that stops serving stops re-reading after
// maxIdleRereads ticks, and its next request re-reads itself.
func TestIdleVMsTickWithoutReReading(t *testing.T) {
	e, mono := refreshEnv(t, `{"models": [{"name": "base", "criticality": "Critical"}], "snapshotRefreshInterval": "20ms"}`)
	tick := func() { mono.now += 20 * time.Millisecond; e.host.Tick() }
	decodes := e.counter("wasm_epp.snapshot.decodes")
	e.swapLoad(true)
	tick()
	assert.Equal(t, decodes, e.counter("wasm_epp.snapshot.decodes"), "no request yet: the tick does not re-read")

	mono.now += 40 * time.Millisecond
	assert.Equal(t, "10.0.0.2:8000", e.routedTo(), "the first request re-reads itself")
	assert.Equal(t, decodes+1, e.counter("wasm_epp.snapshot.decodes"))
	e.swapLoad(false)
	tick()
	assert.Equal(t, decodes+2, e.counter("wasm_epp.snapshot.decodes"), "serving: the tick re-reads")
	for range maxIdleRereads - 1 {
		tick()
	}
	e.swapLoad(true)
	tick()
	assert.Equal(t, decodes+2, e.counter("wasm_epp.snapshot.decodes"), "idle for maxIdleRereads ticks: no more re-reads")
	mono.now += 40 * time.Millisecond
	assert.Equal(t, "10.0.0.2:8000", e.routedTo(), "the next request re-reads itself")
	assert.Equal(t, decodes+3, e.counter("wasm_epp.snapshot.decodes"))
	e.swapLoad(false)
	tick()
	assert.Equal(t, decodes+4, e.counter("wasm_epp.snapshot.decodes"), "serving again: the tick re-reads")
}

// A tick on which the snapshot's re-read and flow control's release are
// both due reads shared data once: flow control expires and releases on
// the refresh's re-read. The clock moves on every reading, as a real one
// does, and a relay is stored after the re-read within the tick, as
// another worker's receiver may: a second read in the same tick would
// take it (two decodes), and release on it.
func TestTickWithRefreshAndFlowDueReadsSharedDataOnce(t *testing.T) {
	mono := time.Second
	var (
		e         *env
		tickStart time.Duration // the tick's first clock reading; 0: not in the test's tick
		relayed   bool
	)
	since := func() time.Duration {
		mono += time.Microsecond
		if tickStart == 0 || relayed {
			return mono
		}
		if r := e.vm.root.router; r.refreshed && r.refreshedAt == tickStart {
			// The tick's re-read is done: a relay lands now.
			relayed = true
			e.writePods("node-1", free...)
		}
		return mono
	}
	e, status := startEnvOpts(t, `{"seed": 3, "models": [{"name": "shed", "criticality": "Sheddable"}],
	  "snapshotRefreshInterval": "20ms", "flowControl": {"releaseInterval": "20ms"}}`, Options{Mono: since})
	require.Equal(t, types.OnPluginStartStatusOK, status, "plugin start; error logs: %v", e.host.GetCriticalLogs())
	e.setPods(busy...)
	held := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(held)
	e.host.Tick() // both due from the start: reads the busy pods again, holds

	mono += 20 * time.Millisecond
	e.writePods("node-1", pod{name: "p0", waiting: 49, kv: 0.95}, busy[1]) // moved, still no room
	decodes := e.counter("wasm_epp.snapshot.decodes")
	tickStart = mono + time.Microsecond // the tick's first reading
	e.host.Tick()
	require.True(t, relayed, "the relay was stored within the tick, after its re-read")
	assert.Equal(t, decodes+1, e.counter("wasm_epp.snapshot.decodes"), "one re-read in the tick")
	assert.Equal(t, "held", e.state(held.id), "not released on a relay its re-read did not take")

	tickStart = 0
	mono += 20 * time.Millisecond
	e.host.Tick()
	assert.Equal(t, decodes+2, e.counter("wasm_epp.snapshot.decodes"), "the next tick reads the relay")
	assert.Contains(t, []string{"routed 10.0.0.1:8000", "routed 10.0.0.2:8000"}, e.state(held.id), "and releases on it")
}
