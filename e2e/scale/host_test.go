package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
	"github.com/wasm-epp/wasm-epp/e2e/internal/hosttest"
	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// The tests here run the real .wasm in the test host (router and receiver
// on 4 worker VMs, as in Envoy) at small sizes; the bench (bench.go,
// make bench-scale) runs the same parts at fleet sizes.

const (
	testVMID   = "wasm-epp"
	testToken  = "scale-test-token"
	staleAfter = 2 * time.Second
)

var testT0 = time.Unix(1_760_000_000, 0)

// hostEnv is the real .wasm in an in-process test host.
type hostEnv struct {
	t      *testing.T
	host   *envoyhost.Host
	clock  *hosttest.Clock
	up     *Upstream
	client *http.Client
	router string
	push   string
}

func startHost(t *testing.T, routerCfg string) *hostEnv {
	t.Helper()
	return startHostAt(t, routerCfg, "127.0.0.1:0")
}

// startHostAt is startHost with the push listener on pushAddr (a host
// started again on the same address is an Envoy restarted: the same
// address, empty shared data).
func startHostAt(t *testing.T, routerCfg, pushAddr string) *hostEnv {
	t.Helper()
	code, err := os.ReadFile(wasmbuild.Plugin(t))
	require.NoError(t, err)
	up, err := StartUpstream()
	require.NoError(t, err)
	t.Cleanup(up.Close)
	e := &hostEnv{t: t, clock: hosttest.NewClock(testT0), up: up,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}
	t.Cleanup(e.client.CloseIdleConnections)
	vm := envoyhost.VMConfig{VMID: testVMID, Code: code, EnvironmentVariables: map[string]string{"WASM_EPP_PUSH_TOKEN": testToken}}
	cfg := envoyhost.Config{
		Workers: 4, Clock: e.clock,
		CompilationCacheDir: filepath.Join(os.TempDir(), "wasm-epp-scale-test-cache"),
		Clusters:            []envoyhost.ClusterConfig{{Name: "pods", Type: envoyhost.ClusterOriginalDst}},
		Listeners: []envoyhost.ListenerConfig{
			{Name: "router", Address: "127.0.0.1:0", Cluster: "pods", Plugin: &envoyhost.PluginConfig{
				Name: "wasm-epp", RootID: "wasm-epp", Configuration: []byte(routerCfg),
				FailurePolicy: envoyhost.FailClosed, AllowOnHeadersStopIteration: true, VM: vm}},
			{Name: "push", Address: pushAddr, Cluster: "pods", Plugin: &envoyhost.PluginConfig{
				Name: "wasm-epp-receiver", RootID: "wasm-epp",
				Configuration: []byte(`{"role": "receiver", "staleAfter": "` + staleAfter.String() + `"}`),
				FailurePolicy: envoyhost.FailClosed, AllowOnHeadersStopIteration: true, VM: vm}},
		},
	}
	h, err := envoyhost.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	require.NoError(t, h.Start())
	e.host = h
	e.router = "http://" + h.ListenerAddr("router")
	e.push = "http://" + h.ListenerAddr("push") + wire.PushPath
	return e
}

const routerCfg = `{"models": [{"name": "chat"}], "unknownModels": "passthrough", "servedByHeader": "x-served-by", "staleAfter": "2s", "whenNoFreshEndpoint": "reject"}`

// post sends a push and returns the status.
func (e *hostEnv) post(body []byte) int {
	e.t.Helper()
	req, err := http.NewRequest("POST", e.push, bytes.NewReader(body))
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := e.client.Do(req)
	require.NoError(e.t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// agent returns a push of agent id's endpoints (names id-0.., addresses
// from base), each with waiting = marker, scraped at the host's now.
func (e *hostEnv) agent(id string, seq uint64, marker uint32, n int, base byte) []byte {
	e.t.Helper()
	now := e.clock.Now()
	eps := make([]wire.EndpointState, n)
	for i := range eps {
		eps[i] = wire.EndpointState{Namespace: "llm", Name: fmt.Sprintf("%s-%d", id, i),
			Address: netip.AddrFrom4([4]byte{127, 10, base, byte(i + 1)}), Port: e.up.Port,
			Waiting: marker, MaxAdapters: 4, ScrapeTime: now}
	}
	wire.Normalize(eps)
	var enc wire.BlockEncoder
	b, err := enc.AppendAgentPush(nil, &wire.Push{AgentID: id, Seq: seq, SendTime: now, Endpoints: eps}, wire.Limits{})
	require.NoError(e.t, err)
	return b
}

// visible waits until every router VM decides on what was stored before
// the call: a VM re-reads shared data on its tick (snapshotRefreshInterval),
// and a request re-reads it itself once the last re-read is older than
// twice that, so after twice the interval a request has seen it either way.
func (e *hostEnv) visible() { time.Sleep(2*config.DefaultSnapshotRefresh + 2*time.Millisecond) }

// snapshot reads the host's shared data as a router VM does.
func (e *hostEnv) snapshot() *scheduler.Snapshot {
	e.t.Helper()
	snap, err := hosttest.Snapshot(e.host, testVMID)
	require.NoError(e.t, err)
	return snap
}

// sharedBytes counts the metrics keys that exist and their bytes.
// sharedBytes counts every key of the plugin's shared data and its bytes.
func (e *hostEnv) sharedBytes() (keys, size int) {
	for _, key := range e.host.SharedDataKeys(testVMID) {
		if v, _, ok := e.host.SharedData(testVMID, key); ok {
			keys++
			size += len(v)
		}
	}
	return keys, size
}

// route sends a chat request and returns the status and the endpoint
// named in the served-by header.
func (e *hostEnv) route(model string) (int, string) {
	e.t.Helper()
	code, by, err := send(context.Background(), e.client, e.router, model)
	require.NoError(e.t, err)
	return code, by
}

// Pushes from many agents arrive on all 4 worker VMs at once: a router VM
// sees every agent's latest endpoints, and never two pushes of one agent
// mixed; every request is routed to an endpoint that exists.
func TestRouterSeesEveryAgentWholeUnderConcurrentPushes(t *testing.T) {
	// Critical: the markers travel in the waiting queue, which would shed
	// lesser requests.
	e := startHost(t, `{"models": [{"name": "chat", "criticality": "Critical"}], "servedByHeader": "x-served-by"}`)
	const agents, rounds, per = 12, 25, 3
	stop := make(chan struct{})
	var mixed []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a reader over the real shared data, all along
		defer wg.Done()
		c := wire.NewCache(wire.NewKeys(wire.DefaultKeyPrefix), wire.Limits{})
		for {
			select {
			case <-stop:
				return
			default:
			}
			snap, _, err := c.Refresh(hosttest.Store{Host: e.host, VMID: testVMID})
			if err != nil {
				continue
			}
			markers := map[string]int{}
			for _, ep := range snap.Endpoints {
				agent := ep.ID.Name[:strings.LastIndexByte(ep.ID.Name, '-')]
				if m, ok := markers[agent]; ok && m != ep.Metrics.WaitingQueueSize {
					mixed = append(mixed, agent)
				}
				markers[agent] = ep.Metrics.WaitingQueueSize
			}
		}
	}()
	var routed, failed int
	var mu sync.Mutex
	wg.Add(1)
	go func() { // requests on the router all along
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			code, by := e.route("chat")
			mu.Lock()
			switch {
			case code == 200 && strings.HasPrefix(by, "llm/node-"):
				routed++
			case code != 503: // 503 before the first push
				failed++
			}
			mu.Unlock()
		}
	}()
	var pwg sync.WaitGroup
	statuses := make(chan int, agents*rounds)
	for a := 0; a < agents; a++ {
		pwg.Add(1)
		go func(a int) {
			defer pwg.Done()
			id := fmt.Sprintf("node-%02d", a)
			for r := 1; r <= rounds; r++ {
				statuses <- e.post(e.agent(id, uint64(r), uint32(r), per, byte(a)))
			}
		}(a)
	}
	pwg.Wait()
	close(stop)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		require.Equal(t, 204, s, "every push accepted (no contention failure)")
	}
	assert.Empty(t, mixed, "an agent's endpoints from two pushes")
	assert.Zero(t, failed)
	assert.Positive(t, routed)
	snap := e.snapshot()
	require.Len(t, snap.Endpoints, agents*per, "every agent's endpoints")
	for _, ep := range snap.Endpoints {
		assert.Equal(t, rounds, ep.Metrics.WaitingQueueSize, "%s: the agent's latest push", ep.ID.Name)
	}
	retries, _ := e.host.StatValue("wasmcustom.wasm_epp.receiver.cas_retries")
	t.Logf("%d pushes, %d CAS retries, %d requests routed meanwhile", agents*rounds, retries, routed)
}

// An endpoint an agent stops reporting is gone with that push: no request
// goes there once the push is accepted.
func TestEndpointStopsBeingReportedAgesOut(t *testing.T) {
	e := startHost(t, routerCfg)
	require.Equal(t, 204, e.post(e.agent("node-a", 1, 0, 3, 1)))
	seen := map[string]bool{}
	for i := 0; i < 60; i++ {
		_, by := e.route("chat")
		seen[by] = true
	}
	assert.True(t, seen["llm/node-a-2"], "the third endpoint takes requests: %v", seen)
	require.Equal(t, 204, e.post(e.agent("node-a", 2, 0, 2, 1)))
	e.visible()
	for i := 0; i < 60; i++ {
		code, by := e.route("chat")
		require.Equal(t, 200, code)
		require.NotEqual(t, "llm/node-a-2", by, "routed to an endpoint no longer reported")
	}
}

// An agent that disappears leaves nothing behind staleAfter after its last
// push (once another agent pushes), and meanwhile is stale: never routed to.
func TestDisappearedAgentLeavesNothingAfterStaleAfter(t *testing.T) {
	e := startHost(t, routerCfg)
	require.Equal(t, 204, e.post(e.agent("node-gone", 1, 0, 2, 1)))
	require.Equal(t, 204, e.post(e.agent("node-live", 1, 0, 1, 2)))
	_, before := e.sharedBytes()
	seq := uint64(1)
	for _, step := range []time.Duration{time.Second, 900 * time.Millisecond, 200 * time.Millisecond} {
		e.clock.Advance(step)
		seq++
		require.Equal(t, 204, e.post(e.agent("node-live", seq, 0, 1, 2)))
	}
	// 2.1 s after node-gone's last push: stale since 2 s, removed by
	// node-live's push.
	snap := e.snapshot()
	require.Len(t, snap.Endpoints, 1)
	assert.Equal(t, "node-live-0", snap.Endpoints[0].ID.Name)
	_, after := e.sharedBytes()
	assert.Less(t, after, before, "its bytes are gone too")
	e.visible()
	for i := 0; i < 30; i++ {
		code, by := e.route("chat")
		require.Equal(t, 200, code)
		require.Equal(t, "llm/node-live-0", by)
	}
}

// Freshness is judged on the receiver's clock: an agent whose clock runs
// an hour ahead is refused, and one within the allowed skew whose scrapes
// claim to be in the future goes stale staleAfter after its push.
func TestClockAheadNeverExtendsFreshness(t *testing.T) {
	e := startHost(t, routerCfg)
	e.clock.Advance(time.Hour)
	ahead := e.agent("node-a", 1, 0, 1, 1) // built on a clock an hour ahead
	e.clock.Advance(-time.Hour)
	assert.Equal(t, 400, e.post(ahead))
	code, _ := e.route("chat")
	assert.Equal(t, 503, code, "nothing stored")

	// Scraped "in the future" (an hour after the send), sent now.
	now := e.clock.Now()
	eps := []wire.EndpointState{{Namespace: "llm", Name: "node-b-0", Address: netip.MustParseAddr("127.10.2.1"), Port: e.up.Port,
		MaxAdapters: 4, ScrapeTime: now.Add(time.Hour)}}
	var enc wire.BlockEncoder
	b, err := enc.AppendAgentPush(nil, &wire.Push{AgentID: "node-b", Seq: 1, SendTime: now, Endpoints: eps}, wire.Limits{})
	require.NoError(t, err)
	require.Equal(t, 204, e.post(b))
	code, _ = e.route("chat")
	require.Equal(t, 200, code)
	e.clock.Advance(staleAfter + time.Millisecond)
	code, _ = e.route("chat")
	assert.Equal(t, 503, code, "stale staleAfter after the push that carried it")
}

// 1,000 agent ids come and go; shared data keeps its fixed keys and bytes
// bounded by the agents alive at a time.
func TestChurnOf1000AgentsKeepsKeysAndBytesBounded(t *testing.T) {
	e := startHost(t, routerCfg)
	const alive, ids = 20, 1000
	maxKeys, maxBytes := 0, 0
	var one int
	for wave := 0; wave < ids/alive; wave++ {
		for i := 0; i < alive; i++ {
			id := fmt.Sprintf("churn-%04d", wave*alive+i)
			b := e.agent(id, 1, 0, 2, byte(i))
			one = len(b)
			require.Equal(t, 204, e.post(b))
		}
		k, s := e.sharedBytes()
		maxKeys, maxBytes = max(maxKeys, k), max(maxBytes, s)
		e.clock.Advance(800 * time.Millisecond) // a wave lives 2.4 s: ~3 waves alive
	}
	assert.Equal(t, wire.NumKeys, maxKeys, "the fixed set of keys")
	// At most 4 waves' blocks (3 alive, one expiring), plus the fixed part.
	assert.Less(t, maxBytes, wire.DirBytes+wire.NumSegments*16+4*alive*one)
	t.Logf("%d agent ids: at most %d keys, %d bytes", ids, maxKeys, maxBytes)
}
