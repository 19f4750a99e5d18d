package receiver

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

const testToken = "s3cret-token"

var testNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// testVM is the smallest VM/plugin context pair that hosts a Receiver.
type testVM struct {
	types.DefaultVMContext
	cfg    string
	plugin *testPlugin // the last one made
}

func (vm *testVM) NewPluginContext(uint32) types.PluginContext {
	vm.plugin = &testPlugin{vm: vm}
	return vm.plugin
}

type testPlugin struct {
	types.DefaultPluginContext
	vm *testVM
	r  *Receiver
}

func (p *testPlugin) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, err := config.Decode([]byte(p.vm.cfg))
	if err != nil {
		return types.OnPluginStartStatusFailed
	}
	r, err := New(cfg, testToken)
	if err != nil {
		return types.OnPluginStartStatusFailed
	}
	r.SetClock(func() time.Time { return testNow })
	p.r = r
	return types.OnPluginStartStatusOK
}

func (p *testPlugin) NewHttpContext(id uint32) types.HttpContext { return p.r.NewHttpContext(id) }

func newHost(t *testing.T, cfg string) proxytest.HostEmulator {
	t.Helper()
	host, _ := newHostReceiver(t, cfg)
	return host
}

// newHostReceiver is newHost that also returns the plugin's Receiver.
func newHostReceiver(t testing.TB, cfg string) (proxytest.HostEmulator, *Receiver) {
	t.Helper()
	vm := &testVM{cfg: cfg}
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg))
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	require.Equal(t, types.OnPluginStartStatusOK, host.StartPlugin())
	return host, vm.plugin.r
}

func push(t *testing.T, agent string, seq uint64, names ...string) []byte {
	t.Helper()
	p := &wire.Push{AgentID: agent, Seq: seq, SendTime: testNow}
	for i, n := range names {
		p.Endpoints = append(p.Endpoints, wire.EndpointState{
			Namespace: agent, Name: n,
			Address:    netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}),
			Port:       8000,
			Waiting:    uint32(i),
			ScrapeTime: testNow,
		})
	}
	wire.Normalize(p.Endpoints)
	b, err := wire.EncodePush(p, wire.DefaultLimits())
	require.NoError(t, err)
	return b
}

type sent struct {
	status  uint32
	code    string
	headers [][2]string
}

// send runs one push request through the receiver, the body in chunks of
// chunk bytes (0: one chunk), and returns the local reply.
func send(t *testing.T, host proxytest.HostEmulator, headers [][2]string, body []byte, chunk int) sent {
	t.Helper()
	id := host.InitializeHttpContext()
	action := host.CallOnRequestHeaders(id, headers, len(body) == 0)
	for len(body) > 0 && host.GetSentLocalResponse(id) == nil {
		n := len(body)
		if chunk > 0 && chunk < n {
			n = chunk
		}
		action = host.CallOnRequestBody(id, body[:n], n == len(body))
		body = body[n:]
	}
	resp := host.GetSentLocalResponse(id)
	require.NotNil(t, resp, "no local reply (action %v)", action)
	out := sent{status: resp.StatusCode, headers: resp.Headers}
	if resp.StatusCode != 204 {
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		require.NoError(t, json.Unmarshal(resp.Data, &e), "body %q", resp.Data)
		assert.NotEmpty(t, e.Error.Message)
		out.code = e.Error.Code
	}
	return out
}

func pushHeaders(token string, n int) [][2]string {
	h := [][2]string{{":method", "POST"}, {":path", config.DefaultReceiverPath}, {":authority", "envoy"}}
	if token != "" {
		h = append(h, [2]string{"authorization", "Bearer " + token})
	}
	if n >= 0 {
		h = append(h, [2]string{"content-length", strconv.Itoa(n)})
	}
	return h
}

// stored reads shared data as a router does: the snapshot (nil when
// nothing was ever accepted), and every key's bytes, to check that nothing
// changed.
func stored(t *testing.T, host proxytest.HostEmulator) (*scheduler.Snapshot, map[string]string) {
	t.Helper()
	cfg, _ := config.Decode(nil)
	keys := wire.NewKeys(cfg.SharedDataKeyPrefix)
	raw := map[string]string{}
	for _, k := range append(keys.Segments[:], keys.Dir) {
		if v, _, err := proxywasm.GetSharedData(k); err == nil {
			raw[k] = string(v)
		}
	}
	snap, _, err := wire.NewCache(keys, wire.Limits{}).Refresh(shareddata.Store{})
	require.NoError(t, err)
	if len(snap.Endpoints) == 0 {
		return nil, raw
	}
	return snap, raw
}

// agents lists the agents a snapshot's endpoints name ("<agent>/<pod>").
func agents(snap *scheduler.Snapshot) map[string][]string {
	out := map[string][]string{}
	if snap == nil {
		return out
	}
	for _, e := range snap.Endpoints {
		out[e.ID.Namespace] = append(out[e.ID.Namespace], e.ID.Name)
	}
	return out
}

func TestPushAccepted(t *testing.T) {
	host := newHost(t, `{"role":"receiver"}`)
	body := push(t, "node-a", 1, "pod-1", "pod-2")
	r := send(t, host, pushHeaders(testToken, len(body)), body, 7)
	assert.Equal(t, uint32(204), r.status)

	s, raw1 := stored(t, host)
	assert.Equal(t, map[string][]string{"node-a": {"pod-1", "pod-2"}}, agents(s))

	// A second agent adds to, and does not replace, the first one.
	body = push(t, "node-b", 5, "pod-9")
	assert.Equal(t, uint32(204), send(t, host, pushHeaders(testToken, -1), body, 0).status)
	s, raw2 := stored(t, host)
	assert.Len(t, agents(s), 2)
	assert.NotEqual(t, raw1, raw2)

	// The same agent again replaces its own endpoints.
	body = push(t, "node-a", 2, "pod-3")
	assert.Equal(t, uint32(204), send(t, host, pushHeaders(testToken, len(body)), body, 0).status)
	s, _ = stored(t, host)
	assert.Equal(t, map[string][]string{"node-a": {"pod-3"}, "node-b": {"pod-9"}}, agents(s))
}

func TestPushRejectedWritesNothing(t *testing.T) {
	host := newHost(t, `{"role":"receiver","receiver":{"maxPushBytes":4096,"maxEndpoints":3}}`)
	good := push(t, "node-a", 10, "pod-1")
	require.Equal(t, uint32(204), send(t, host, pushHeaders(testToken, len(good)), good, 0).status)
	_, before := stored(t, host)

	truncated := good[:len(good)-3]
	badVersion := append([]byte{}, good...)
	badVersion[2] = 99
	tooMany := push(t, "node-a", 11, "a", "b", "c", "d")
	huge := make([]byte, 5000)

	cases := []struct {
		name    string
		headers [][2]string
		body    []byte
		status  uint32
		code    string
	}{
		{"no token", pushHeaders("", len(good)), good, 401, "unauthorized"},
		{"wrong token", pushHeaders("s3cret-tokem", len(good)), good, 401, "unauthorized"},
		{"token prefix only", pushHeaders("s3cret", len(good)), good, 401, "unauthorized"},
		{"wrong method", [][2]string{{":method", "GET"}, {":path", config.DefaultReceiverPath}, {"authorization", "Bearer " + testToken}}, nil, 405, "method_not_allowed"},
		{"wrong path", [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {"authorization", "Bearer " + testToken}}, good, 404, "not_found"},
		{"declared too large", pushHeaders(testToken, 5000), huge, 413, "too_large"},
		{"too large without length", pushHeaders(testToken, -1), huge, 413, "too_large"},
		{"empty", pushHeaders(testToken, 0), nil, 400, "bad_request"},
		{"garbage", pushHeaders(testToken, 5), []byte("hello"), 400, "bad_request"},
		{"truncated", pushHeaders(testToken, len(truncated)), truncated, 400, "bad_request"},
		{"unknown version", pushHeaders(testToken, len(badVersion)), badVersion, 400, "bad_request"},
		{"too many endpoints", pushHeaders(testToken, len(tooMany)), tooMany, 400, "bad_request"},
		{"same sequence", pushHeaders(testToken, len(good)), good, 409, "stale_sequence"},
		{"older sequence", pushHeaders(testToken, -1), push(t, "node-a", 9, "pod-2"), 409, "stale_sequence"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := send(t, host, tc.headers, tc.body, 0)
			assert.Equal(t, tc.status, r.status)
			assert.Equal(t, tc.code, r.code)
			_, after := stored(t, host)
			assert.Equal(t, before, after, "shared data changed")
		})
	}
}

func TestUnauthorizedSaysBearer(t *testing.T) {
	host := newHost(t, `{"role":"receiver"}`)
	r := send(t, host, pushHeaders("", 0), nil, 0)
	assert.Contains(t, r.headers, [2]string{"www-authenticate", `Bearer realm="wasm-epp-push"`})
}

func TestUnreadableSharedDataIsReplaced(t *testing.T) {
	host := newHost(t, `{"role":"receiver"}`)
	cfg, _ := config.Decode(nil)
	keys := wire.NewKeys(cfg.SharedDataKeyPrefix)
	require.NoError(t, proxywasm.SetSharedData(keys.Segments[wire.SegmentOf([]byte("node-a"))], []byte("not a segment"), 0))
	require.NoError(t, proxywasm.SetSharedData(keys.Dir, []byte("not a directory"), 0))
	body := push(t, "node-a", 1, "pod-1")
	assert.Equal(t, uint32(204), send(t, host, pushHeaders(testToken, len(body)), body, 0).status)
	s, _ := stored(t, host)
	assert.Equal(t, map[string][]string{"node-a": {"pod-1"}}, agents(s))
}

func TestNewRefusesEmptyToken(t *testing.T) {
	cfg, err := config.Decode([]byte(`{"role":"receiver"}`))
	require.NoError(t, err)
	_, err = New(cfg, "")
	require.ErrorContains(t, err, "WASM_EPP_PUSH_TOKEN")
}

// pushAt builds a one-endpoint push with the agent's send and scrape times.
func pushAt(t *testing.T, agent string, seq uint64, send, scrape time.Time) []byte {
	t.Helper()
	p := &wire.Push{AgentID: agent, Seq: seq, SendTime: send, Endpoints: []wire.EndpointState{{
		Namespace: "ns", Name: "pod-1", Address: netip.AddrFrom4([4]byte{10, 0, 0, 1}), Port: 8000, ScrapeTime: scrape,
	}}}
	b, err := wire.EncodePush(p, wire.DefaultLimits())
	require.NoError(t, err)
	return b
}

// Freshness is judged on the receiver's clock: an agent whose clock runs
// ahead is refused, and whatever times an accepted push carries, its
// endpoints are never fresher than the moment the receiver accepted it.
func TestClockAheadIsRefusedAndNeverExtendsFreshness(t *testing.T) {
	host := newHost(t, `{"role":"receiver"}`)

	for _, ahead := range []time.Duration{time.Hour, 100 * 365 * 24 * time.Hour, 1500 * time.Millisecond} {
		body := pushAt(t, "node-a", 1, testNow.Add(ahead), testNow.Add(ahead))
		r := send(t, host, pushHeaders(testToken, len(body)), body, 0)
		assert.Equal(t, uint32(400), r.status, "send time %v ahead", ahead)
		assert.Equal(t, "clock_skew", r.code, "send time %v ahead", ahead)
		s, _ := stored(t, host)
		assert.Nil(t, s, "nothing accepted for a push %v ahead", ahead)
	}

	cases := []struct {
		name         string
		send, scrape time.Time
		want         time.Time // the endpoint's stored update time
	}{
		// Within the allowed skew: accepted, but the scrape is dated by
		// its age on the agent's clock, counted back from the receipt.
		{"slightly ahead", testNow.Add(500 * time.Millisecond), testNow.Add(450 * time.Millisecond), testNow.Add(-50 * time.Millisecond)},
		// A scrape dated after the send (an agent bug, or a clock step
		// between the two readings) counts as taken at the receipt.
		{"scrape after send", testNow, testNow.Add(time.Hour), testNow},
		// A clock running behind does not make fresh metrics look old.
		{"agent behind", testNow.Add(-10 * time.Second), testNow.Add(-10*time.Second - 30*time.Millisecond), testNow.Add(-30 * time.Millisecond)},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := pushAt(t, "node-a", uint64(10+i), tc.send, tc.scrape)
			require.Equal(t, uint32(204), send(t, host, pushHeaders(testToken, len(body)), body, 0).status)
			s, _ := stored(t, host)
			require.NotNil(t, s)
			require.Len(t, s.Endpoints, 1)
			got := s.Endpoints[0].Metrics.UpdateTime
			assert.True(t, tc.want.Equal(got), "update time %v, want %v", got, tc.want)
			assert.False(t, got.After(testNow), "never after the receipt")
		})
	}
}

func TestMaxClockSkewIsConfigurable(t *testing.T) {
	host := newHost(t, `{"role":"receiver","receiver":{"maxClockSkew":"2h"}}`)
	body := pushAt(t, "node-a", 1, testNow.Add(time.Hour), testNow.Add(time.Hour))
	assert.Equal(t, uint32(204), send(t, host, pushHeaders(testToken, len(body)), body, 0).status)
	s, _ := stored(t, host)
	require.NotNil(t, s)
	assert.True(t, testNow.Equal(s.Endpoints[0].Metrics.UpdateTime))

	_, err := config.Decode([]byte(`{"role":"receiver","receiver":{"maxClockSkew":"-1s"}}`))
	require.ErrorContains(t, err, "receiver.maxClockSkew")
}
