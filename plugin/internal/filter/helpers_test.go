package filter

import (
	"encoding/json"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// t0 is the fake clock's start; tests never read the wall clock.
var t0 = time.Unix(1_750_000_000, 0)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

// pod is one endpoint in a test snapshot.
type pod struct {
	name    string
	addr    string
	port    uint16
	waiting uint32
	running uint32
	kv      float64
	active  []string
	queued  []string
	max     uint32
	// age is how old its metrics are at the fake clock's time.
	age time.Duration
}

// env is one proxytest host running the filter with a fake clock.
type env struct {
	t       *testing.T
	host    proxytest.HostEmulator
	clock   *fakeClock
	cfg     *config.Config
	writer  *wire.Writer
	seq     uint64
	version uint64 // of the configuration record (crdtable_test.go)
	reset   func()
	vm      *testVM
}

// close releases the emulator: proxytest is a process-wide singleton, so a
// test needing a second env must close the first.
func (e *env) close() {
	if e.reset != nil {
		e.reset()
		e.reset = nil
	}
}

// testVM is plugin/main.go's glue reduced to the router role, so that
// proxytest drives the router as Envoy drives the plugin.
type testVM struct {
	types.DefaultVMContext
	opts Options
	// root is the last plugin context created.
	root *testRoot
}

func (v *testVM) NewPluginContext(uint32) types.PluginContext {
	v.root = &testRoot{opts: v.opts}
	return v.root
}

type testRoot struct {
	types.DefaultPluginContext
	opts   Options
	router *Router
}

func (p *testRoot) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		return types.OnPluginStartStatusFailed
	}
	cfg, err := config.Decode(data)
	if err == nil {
		p.router, err = NewRouter(cfg, p.opts)
	}
	if err != nil {
		proxywasm.LogCriticalf("%v", err)
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

func (p *testRoot) NewHttpContext(id uint32) types.HttpContext { return p.router.NewHttpContext(id) }

func (p *testRoot) OnTick() { p.router.OnTick() }

// newEnv starts the router with a configuration; it must start.
func newEnv(t *testing.T, cfgJSON string) *env {
	t.Helper()
	e, status := startEnvOpts(t, cfgJSON, Options{})
	require.Equal(t, types.OnPluginStartStatusOK, status, "plugin start; error logs: %v", e.host.GetCriticalLogs())
	return e
}

// startEnvOpts starts the router with opts (the fake clock is always set).
func startEnvOpts(t *testing.T, cfgJSON string, opts Options) (*env, types.OnPluginStartStatus) {
	return startEnvWith(t, cfgJSON, opts, nil)
}

// startEnvWith is startEnvOpts with more emulator options (properties).
func startEnvWith(t *testing.T, cfgJSON string, opts Options, more func(*proxytest.EmulatorOption) *proxytest.EmulatorOption) (*env, types.OnPluginStartStatus) {
	t.Helper()
	clock := &fakeClock{now: t0}
	opts.Now = clock.Now
	vm := &testVM{opts: opts}
	emu := proxytest.NewEmulatorOption().
		WithVMContext(vm).
		WithPluginConfiguration([]byte(cfgJSON))
	if more != nil {
		emu = more(emu)
	}
	host, reset := proxytest.NewHostEmulator(emu)
	e := &env{t: t, host: host, clock: clock, reset: reset, vm: vm}
	t.Cleanup(e.close)
	if cfg, err := config.Decode([]byte(cfgJSON)); err == nil {
		e.cfg = cfg
	}
	require.Equal(t, types.OnVMStartStatusOK, host.StartVM())
	return e, host.StartPlugin()
}

// setPods stores pods as one agent's push, through the receiver's own
// write path (scheduler/wire.Writer), at the fake clock's time, and runs
// the router's re-read as the next tick would (refreshed).
func (e *env) setPods(pods ...pod) {
	e.t.Helper()
	e.writePods("node-1", pods...)
	e.refreshed()
}

// writePods stores pods as agent's push, as setPods, with no re-read.
func (e *env) writePods(agent string, pods ...pod) {
	e.t.Helper()
	if e.writer == nil {
		e.writer = wire.NewWriter(wire.NewKeys(e.cfg.SharedDataKeyPrefix), wire.Limits{}, time.Hour)
		require.NoError(e.t, e.writer.Init(shareddata.Store{}))
	}
	e.seq++
	var enc wire.BlockEncoder
	b, err := enc.AppendAgentPush(nil, &wire.Push{AgentID: agent, Seq: e.seq, SendTime: e.clock.now, Endpoints: podStates(e.clock.now, pods...)}, wire.Limits{})
	require.NoError(e.t, err)
	_, err = e.writer.Apply(shareddata.Store{}, b, e.clock.now)
	require.NoError(e.t, err)
}

// refreshed runs the router's re-read as its tick does after a write to
// shared data (the tick's other work, flow control's releases, is left to
// the tests' own host.Tick calls), so the next request decides on what
// was written. The env's writes call it; a test that writes shared data
// itself calls it to mean "a tick came since".
func (e *env) refreshed() {
	if e.vm.root != nil && e.vm.root.router != nil {
		r := e.vm.root.router
		r.refreshShared(r.clock.Since())
	}
}

// corruptSegment overwrites the segment holding node-1 with value and
// moves the directory, as a broken writer would.
func (e *env) corruptSegment(value []byte) {
	e.t.Helper()
	keys := wire.NewKeys(e.cfg.SharedDataKeyPrefix)
	k := wire.SegmentOf([]byte("node-1"))
	require.NoError(e.t, proxywasm.SetSharedData(keys.Segments[k], value, 0))
	b, _, err := proxywasm.GetSharedData(keys.Dir)
	require.NoError(e.t, err)
	var d wire.Directory
	require.NoError(e.t, wire.DecodeDirectory(b, &d))
	d.Gen++
	d.Entries[k].Gen++
	require.NoError(e.t, proxywasm.SetSharedData(keys.Dir, wire.AppendDirectory(nil, &d), 0))
	e.refreshed()
}

func setShared(t *testing.T, key string, value []byte) {
	t.Helper()
	_, cas, err := proxywasm.GetSharedData(key)
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		require.NoError(t, err)
	}
	require.NoError(t, proxywasm.SetSharedData(key, value, cas))
}

// podStates are pods as the agent reports them at now.
func podStates(now time.Time, pods ...pod) []wire.EndpointState {
	eps := make([]wire.EndpointState, 0, len(pods))
	for _, p := range pods {
		addr := p.addr
		if addr == "" {
			addr = "10.0.0.1"
		}
		port := p.port
		if port == 0 {
			port = 8000
		}
		eps = append(eps, wire.EndpointState{
			Namespace: "llm", Name: p.name, Address: netip.MustParseAddr(addr), Port: port,
			Waiting: p.waiting, Running: p.running, KVCacheUsage: p.kv,
			ActiveAdapters: p.active, WaitingAdapters: p.queued, MaxAdapters: p.max,
			ScrapeTime: now.Add(-p.age),
		})
	}
	wire.Normalize(eps)
	return eps
}

// result is what the filter did with one request.
type result struct {
	id      uint32
	action  types.Action
	headers map[string]string
	body    string
	local   *proxytest.LocalHttpResponse
}

func (r result) dest() string { return r.headers["x-gateway-destination-endpoint"] }

// errorJSON decodes the local reply's body, which must be an OpenAI error.
func (r result) errorJSON(t *testing.T) (msg, typ, code string) {
	t.Helper()
	require.NotNil(t, r.local, "expected a local reply")
	var v struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.local.Data, &v), "body %q", r.local.Data)
	require.Contains(t, r.local.Headers, [2]string{"content-type", "application/json"})
	return v.Error.Message, v.Error.Type, v.Error.Code
}

// post sends a POST with the body in the given chunks (none: no body).
func (e *env) post(path string, extra [][2]string, chunks ...string) result {
	hdrs := append([][2]string{{":method", "POST"}, {":path", path}, {":authority", "gw"}, {"content-type", "application/json"}}, extra...)
	return e.do(hdrs, chunks...)
}

func (e *env) do(hdrs [][2]string, chunks ...string) result {
	e.t.Helper()
	id := e.host.InitializeHttpContext()
	action := e.host.CallOnRequestHeaders(id, hdrs, len(chunks) == 0)
	for i, c := range chunks {
		if e.host.GetSentLocalResponse(id) != nil {
			break
		}
		action = e.host.CallOnRequestBody(id, []byte(c), i == len(chunks)-1)
	}
	res := result{id: id, action: action, headers: map[string]string{}, local: e.host.GetSentLocalResponse(id)}
	for _, h := range e.host.GetCurrentRequestHeaders(id) {
		res.headers[h[0]] = h[1]
	}
	res.body = string(e.host.GetCurrentRequestBody(id))
	if action == types.ActionContinue && res.local == nil {
		// Forwarded: the upstream's response comes back through the filter,
		// which counts the request then.
		e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	}
	return res
}

func (e *env) counter(name string) uint64 {
	e.t.Helper()
	v, err := e.host.GetCounterMetric(name)
	require.NoError(e.t, err, name)
	return v
}

// chat is a minimal chat completion body for model.
func chat(model string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}]}`
}
