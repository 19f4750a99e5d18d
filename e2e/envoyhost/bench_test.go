package envoyhost

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// The main plugin, like the test plugin, imports only what cpp-host offers
// (WASM_EPP_WASM, else a build of ./plugin).
func TestMainPluginImportsAreAllowed(t *testing.T) {
	code, err := os.ReadFile(wasmbuild.Plugin(t))
	require.NoError(t, err)
	info, err := CheckModule(code, WASICurrent)
	require.NoError(t, err)
	require.Equal(t, ABI021, info.ABI)
}

// benchRequests sends b.N POSTs with a 4 KiB body through the main
// listener over one keep-alive connection and reports µs per request.
func benchRequests(b *testing.B, h *harness) {
	body := bytes.Repeat([]byte("x"), 4096)
	h.up.reply = func(w http.ResponseWriter, r *http.Request, _ []byte) { _, _ = w.Write([]byte("ok")) }
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	send := func() {
		req, _ := http.NewRequest("POST", h.url+"/bench", bytes.NewReader(body))
		req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	send()
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		send()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/req")
	// CPU time of the whole process (client, host and upstream alike) per
	// request: steadier than wall time on a busy machine.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRequestTrivialPlugin: one request (headers + 4 KiB body)
// through the host with a trivial raw-ABI plugin that reads the headers
// and buffers the body: the host's own cost per request, loopback HTTP
// both ways included.
func BenchmarkRequestTrivialPlugin(b *testing.B) {
	benchRequests(b, newHarness(b, trivialGuestPkg))
}

// BenchmarkRequestNoPlugin is the same path without a Wasm filter, to
// separate the Wasm share from the HTTP proxying.
func BenchmarkRequestNoPlugin(b *testing.B) {
	benchRequests(b, newHarness(b, trivialGuestPkg, func(c *Config, _ *PluginConfig) {
		c.Listeners[0].Plugin = nil
	}))
}

// BenchmarkFilterCallbacksTrivialPlugin isolates the Wasm share of a
// request: the callbacks of one stream (context create, request headers,
// a 4 KiB request body, response headers, log, done, delete) with the
// host calls the trivial plugin makes, straight on a worker VM, no
// network.
func BenchmarkFilterCallbacksTrivialPlugin(b *testing.B) {
	h := newHarness(b, trivialGuestPkg, withWorkers(1))
	p := h.host.listeners[0].plugin
	vm, root, mode := p.contextFor(1)
	require.Equal(b, filterActive, mode)
	reqHeaders := NewHeaderMap(Pair{":authority", "example"}, Pair{":path", "/v1/completions"},
		Pair{":method", "POST"}, Pair{":scheme", "http"}, Pair{"content-type", "application/json"},
		Pair{"content-length", "4096"}, Pair{"x-request-id", newUUID()})
	respHeaders := NewHeaderMap(Pair{":status", "200"}, Pair{"content-length", "2"})
	body := bytes.Repeat([]byte("x"), 4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := &stream{plugin: p, vm: vm, mode: filterActive, filterState: map[string][]byte{}}
		vm.mu.Lock()
		c := &wasmContext{vm: vm, id: vm.allocContextID(), parentID: root.id, root: root, plugin: p, stream: s}
		vm.contexts[c.id] = c
		id := uint64(c.id)
		vm.callback(c, "proxy_on_context_create", id, uint64(root.id))
		s.reqHeaders = reqHeaders
		vm.callback(c, "proxy_on_request_headers", id, uint64(reqHeaders.Len()), 0)
		s.reqHeaders = nil
		chunk := body
		s.reqBody = &chunk
		vm.callback(c, "proxy_on_request_body", id, uint64(len(body)), 1)
		s.reqBody = nil
		s.respHeaders = respHeaders
		vm.callback(c, "proxy_on_response_headers", id, uint64(respHeaders.Len()), 1)
		s.respHeaders = nil
		vm.callback(c, "proxy_on_done", id)
		delete(vm.contexts, c.id)
		vm.mu.Unlock()
	}
	b.StopTimer()
	require.False(b, vm.Failed())
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/req")
}

// BenchmarkFilterCallbacksMainPlugin is BenchmarkFilterCallbacksTrivialPlugin
// with the real module (WASM_EPP_WASM, else a build of ./plugin) routing a
// 4 KiB chat request over N endpoints (8, 64, and 1,000, where the
// scheduler decides on its per-snapshot index; 5,000 for prefix-aware
// too): the plugin's own cost per
// request in the host, without the network and with warm caches
// (e2e/filtertest BenchmarkPluginRequest measures it inside a loaded HTTP
// path).
func BenchmarkFilterCallbacksMainPlugin(b *testing.B) {
	code, err := os.ReadFile(wasmbuild.Plugin(b))
	require.NoError(b, err)
	// flow=on is the same request with flow control configured and nothing
	// queued (its release tick runs meanwhile): what flow control costs a
	// request that does not wait. The snapshot never changes here, and flow
	// control counts each request it lets go as waiting at its endpoint
	// until the next one, so its room test takes any queue (maxWaiting at
	// its bound): every request finds room and goes at once.
	for _, flow := range []string{"off", "on"} {
		pluginConfig := `{"models": [{"name": "chat", "criticality": "Standard"}]}`
		if flow == "on" {
			pluginConfig = `{"models": [{"name": "chat", "criticality": "Standard"}], "flowControl": {"admit": {"maxWaiting": 65536}}}`
		}
		benchmarkMainPlugin(b, code, pluginConfig, "flow="+flow, 8, 64, 1000)
	}
	// The default profile of envoy/envoy.yaml: the prompt is hashed and
	// looked up, and after the first request its holder is known
	// (prompts=same); or every prompt starts differently, so none is
	// held and, once the filter's reuse share is below minReuse, the
	// scorers choose (prompts=unique). The shared index syncs every 10 s,
	// so the tick's work (a cost per second, not per request) stays out
	// of the figure however slowly the benchmark runs.
	prefixAware := `{"models": [{"name": "chat", "criticality": "Standard"}], "scheduler": {"profile": "prefix-aware"},
		"prefix": {"syncInterval": "10s"}}`
	benchmarkMainPlugin(b, code, prefixAware, "profile=prefix-aware/prompts=same", 8, 64, 1000, 5000)
	benchmarkMainPlugin(b, code, prefixAware, "profile=prefix-aware/prompts=unique", 8, 64, 1000, 5000)
}

// BenchmarkFilterCallbacksLargeN is the same request over fleets of 64,
// 1,000 and 5,000 endpoints, for each built-in profile: what one decision
// costs as the fleet grows (BENCHMARKS.md, "Metrics path at scale").
func BenchmarkFilterCallbacksLargeN(b *testing.B) {
	code, err := os.ReadFile(wasmbuild.Plugin(b))
	require.NoError(b, err)
	for _, profile := range []string{"decision-tree", "scoring", "least-request"} {
		pluginConfig := `{"models": [{"name": "chat", "criticality": "Standard"}], "scheduler": {"profile": "` + profile + `"}}`
		benchmarkMainPlugin(b, code, pluginConfig, "profile="+profile, 64, 1000, 5000)
	}
}

// benchmarkMainPlugin runs the benchmark's request through the module
// under pluginConfig at each of sizes endpoints; a variant ending in
// "prompts=unique" numbers each request's prompt at its start. Each
// request re-reads the snapshot itself ("snapshotRefreshInterval": "0s":
// a directory read, nothing having changed), as every request did before
// the tick took the re-read, so that these figures stay comparable with
// the earlier ones and no tick's work lands in them however slowly the
// benchmark runs; BenchmarkFilterCallbacksUnderRelays has the tick's way.
func benchmarkMainPlugin(b *testing.B, code []byte, pluginConfig, variant string, sizes ...int) {
	pluginConfig = strings.Replace(pluginConfig, "{", `{"snapshotRefreshInterval": "0s", `, 1)
	benchmarkMainPluginRelays(b, code, pluginConfig, variant, relayBench{}, func(n int) []*wire.MemStore {
		// Stored "in the future": fresh however long the benchmark runs.
		return []*wire.MemStore{benchSnapshot(b, n, time.Now().Add(time.Hour))}
	}, sizes...)
}

// relayBench is how benchmarkMainPluginRelays interleaves relays, ticks
// and requests.
type relayBench struct {
	// relayEvery: the next stored state before every relayEvery-th request
	// (0: the first state only).
	relayEvery int
	// ticks: the VMs' tick timers fire only where the benchmark fires
	// them (heldTicks), right after each relay is stored, as the next tick
	// after a relay would; without, the host's timers run as usual.
	ticks bool
	// ticksOnly: one request first (the VM then counts as serving), then
	// per iteration a relay stored and the tick, no request.
	ticksOnly bool
}

// benchmarkMainPluginRelays is benchmarkMainPlugin on the shared data
// states(n) gives: the first is stored before the first request, and with
// more than one, the next is stored as o says, in turn, as relays
// arriving between requests would leave it.
func benchmarkMainPluginRelays(b *testing.B, code []byte, pluginConfig, variant string, o relayBench,
	states func(n int) []*wire.MemStore, sizes ...int) {
	cfg, err := config.Decode([]byte(pluginConfig))
	require.NoError(b, err)
	for _, n := range sizes {
		b.Run(fmt.Sprintf("endpoints=%d/%s", n, variant), func(b *testing.B) {
			clock := &heldTicks{}
			h := newHarness(b, trivialGuestPkg, withWorkers(1), withAllowStopIteration(), withPluginConfig(pluginConfig),
				func(c *Config, p *PluginConfig) {
					p.VM.Code = code
					if o.ticks || o.ticksOnly {
						c.Clock = clock
					}
				})
			stored := states(n)
			store := func(st *wire.MemStore) {
				st.Each(func(key string, value []byte) { h.host.shared.set("test-vm", key, value, 0) })
			}
			store(stored[0])
			vm, root := workerVM(b, h)
			reqHeaders := NewHeaderMap(Pair{":authority", "gw"}, Pair{":path", "/v1/chat/completions"},
				Pair{":method", "POST"}, Pair{":scheme", "http"}, Pair{"content-type", "application/json"},
				Pair{"content-length", "4096"}, Pair{"x-request-id", newUUID()})
			respHeaders := NewHeaderMap(Pair{":status", "200"}, Pair{"content-length", "2"})
			content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 88)
			body := []byte(`{"model":"chat","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"` +
				content + `"}],"stream":false,"max_tokens":256,"temperature":0.7}`)
			unique := strings.HasSuffix(variant, "prompts=unique")
			numbered := bytes.Index(body, []byte(content))
			var req *HeaderMap
			send := func(i int) {
				if unique {
					for k, v := numbered+7, i; k >= numbered; k, v = k-1, v/10 { // eight digits in place
						body[k] = byte('0' + v%10)
					}
				}
				req = reqHeaders.Clone() // the filter sets the destination header
				d := newDirectStream(vm, root)
				d.requestHeaders(req, false)
				// Headers stopped (allow_on_headers_stop_iteration): still
				// writable in the body callback, where the filter routes.
				d.s.reqHeaders = req
				if d.requestBody(body) != 0 || d.reply() != nil {
					b.Fatalf("not routed: %+v", d.reply())
				}
				d.s.reqHeaders = nil
				d.responseHeaders(respHeaders)
				d.finish(req, respHeaders)
			}
			if o.ticksOnly {
				send(0)
				clock.fire()
				decodes, _ := h.host.StatValue("wasmcustom.wasm_epp.snapshot.decodes")
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if len(stored) > 1 {
						store(stored[(i+1)%len(stored)])
					}
					clock.fire()
				}
				b.StopTimer()
				require.False(b, vm.Failed())
				after, _ := h.host.StatValue("wasmcustom.wasm_epp.snapshot.decodes")
				if len(stored) > 1 {
					require.Equal(b, decodes+uint64(b.N), after, "every tick re-read its relay, on the worker only")
				}
				return
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if o.relayEvery > 0 && i%o.relayEvery == 0 {
					if len(stored) > 1 {
						store(stored[(i/o.relayEvery+1)%len(stored)])
					}
					if o.ticks {
						clock.fire()
					}
				}
				send(i)
			}
			b.StopTimer()
			require.False(b, vm.Failed())
			_, routed := req.Get(cfg.DestinationHeader)
			require.True(b, routed)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/req")
		})
	}
}

// BenchmarkFilterCallbacksUnderRelays is the decision tree's request
// while relays rewrite the shared data between requests (2 endpoints to
// an agent, as in bin/scalebench): a relay before every second request,
// alternating two stored states. values: every endpoint's values differ
// between the two (the worst case, near the knee's); heartbeat: the same
// values scraped later (an idle fleet's relays); none: no relays (the
// same fleet, for comparison). refresh=request: every request re-reads
// the snapshot ("snapshotRefreshInterval": "0s", as before the tick took
// the re-read), so every other request re-reads the segments; tick: the
// tick after each relay re-reads them and requests decide on that (the
// tick's share is in the figure: BenchmarkRouterTicksUnderRelays has it
// alone). Per request it includes the host writing the relay's keys
// (BENCHMARKS.md, "Metrics path at scale"). /profile=prefix-aware: the
// profile envoy/envoy.yaml runs (and so bin/scalebench), the request's
// 4 KiB prompt hashed, looked up and recorded as well; its index's sync
// every 10 s, so that the tick is the re-read's alone (with the sync's
// shorter period the tick would come more often than the re-read, which
// would be due only by the host's clock, and requests would decide on
// relays long gone).
func BenchmarkFilterCallbacksUnderRelays(b *testing.B) {
	code, err := os.ReadFile(wasmbuild.Plugin(b))
	require.NoError(b, err)
	for _, profile := range []string{"decision-tree", "prefix-aware"} {
		for _, refresh := range []string{"request", "tick"} {
			more := ""
			if profile == "prefix-aware" {
				more = `, "prefix": {"syncInterval": "10s"}`
			}
			pluginConfig := `{"models": [{"name": "chat", "criticality": "Standard"}], "scheduler": {"profile": "` + profile + `"}, "snapshotRefreshInterval": "` +
				map[string]string{"request": "0s", "tick": tickBenchRefresh}[refresh] + `"` + more + `}`
			for _, pattern := range []string{"none", "values", "heartbeat"} {
				variant := "relays=" + pattern + "/refresh=" + refresh
				if profile != "decision-tree" {
					variant += "/profile=" + profile
				}
				benchmarkMainPluginRelays(b, code, pluginConfig, variant,
					relayBench{relayEvery: 2, ticks: refresh == "tick"}, relayStates(b, pattern), 1000, 5000)
			}
		}
	}
}

// tickBenchRefresh is the refresh interval of the benchmarks' ticks: as
// long as staleAfter allows, so that a request, however slowly the
// benchmark runs (cachegrind), decides on the last tick's re-read
// instead of re-reading itself (the bound is twice this).
const tickBenchRefresh = "500ms"

// BenchmarkRouterTicksUnderRelays is what a router VM's tick costs after
// each relay of BenchmarkFilterCallbacksUnderRelays (one per iteration:
// the relay stored, then the tick that re-reads it), without requests.
// none: ticks that find nothing new (a directory read).
func BenchmarkRouterTicksUnderRelays(b *testing.B) {
	code, err := os.ReadFile(wasmbuild.Plugin(b))
	require.NoError(b, err)
	pluginConfig := `{"models": [{"name": "chat", "criticality": "Standard"}], "scheduler": {"profile": "decision-tree"}, "snapshotRefreshInterval": "` + tickBenchRefresh + `"}`
	for _, pattern := range []string{"none", "values", "heartbeat"} {
		benchmarkMainPluginRelays(b, code, pluginConfig, "relays="+pattern, relayBench{ticksOnly: true}, relayStates(b, pattern), 1000, 5000)
	}
}

// relayStates is the shared data of BenchmarkFilterCallbacksUnderRelays'
// pattern at n endpoints.
func relayStates(b *testing.B, pattern string) func(n int) []*wire.MemStore {
	return func(n int) []*wire.MemStore {
		now := time.Now().Add(time.Hour)
		st := []*wire.MemStore{relayedSnapshot(b, n, now, 0, nil)}
		switch pattern {
		case "values":
			st = append(st, relayedSnapshot(b, n, now.Add(50*time.Millisecond), 1, st[0]))
		case "heartbeat":
			st = append(st, relayedSnapshot(b, n, now.Add(50*time.Millisecond), 0, st[0]))
		}
		return st
	}
}

// heldTicks is the benchmarks' host clock: wall time as usual, but the
// tick timers the VM arms (envoy source/extensions/common/wasm/wasm.cc
// setTickPeriod, re-armed by tickHandler after each on_tick) fire only
// when the benchmark calls fire, so a tick comes exactly where the
// benchmark puts it, however slowly it runs.
type heldTicks struct {
	mu      sync.Mutex
	pending []*heldTimer
}

type heldTimer struct {
	f       func()
	stopped bool
}

func (t *heldTimer) Stop() bool { was := !t.stopped; t.stopped = true; return was }

func (c *heldTicks) Now() time.Time { return time.Now() }

func (c *heldTicks) AfterFunc(_ time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &heldTimer{f: f}
	c.pending = append(c.pending, t)
	return t
}

// fire runs every timer armed and not stopped (the VM's tick: the host's
// handler re-arms it, which fire leaves for the next call).
func (c *heldTicks) fire() {
	c.mu.Lock()
	due := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, t := range due {
		if !t.stopped {
			t.stopped = true
			t.f()
		}
	}
}

// relayedSnapshot is shared data holding n endpoints of agents of two, as
// the receiver stores them at now, on top of a copy of base (nil: empty)
// with sequence 2 (1 without base); round shifts every value.
func relayedSnapshot(b testing.TB, n int, now time.Time, round int, base *wire.MemStore) *wire.MemStore {
	st, seq := &wire.MemStore{}, uint64(1)
	if base != nil {
		base.Each(func(key string, value []byte) { require.NoError(b, st.Set(key, value, 0)) })
		seq = 2
	}
	for a := 0; a*2 < n; a++ {
		part := make([]wire.EndpointState, 0, 2)
		for i := a * 2; i < min(n, a*2+2); i++ {
			part = append(part, wire.EndpointState{
				Namespace: "llm", Name: fmt.Sprintf("vllm-%04d", i),
				Address: netip.AddrFrom4([4]byte{10, 0, byte(i / 200), byte(i%200 + 1)}), Port: 8000,
				Waiting: uint32((i + round) % 4), Running: uint32(5 + (i+3*round)%11), KVCacheUsage: float64((i+7*round)%70) / 100,
				MaxAdapters: 4, ActiveAdapters: []string{fmt.Sprintf("adapter-%d", i%5)}, ScrapeTime: now,
			})
		}
		wire.Normalize(part)
		require.NoError(b, wire.Fill(st, wire.DefaultKeyPrefix, fmt.Sprintf("agent-%04d", a), seq, part, now))
	}
	return st
}

// benchSnapshot is shared data holding n endpoints (varied load and
// adapters), as the receiver stores them at now.
func benchSnapshot(b testing.TB, n int, now time.Time) *wire.MemStore {
	eps := make([]wire.EndpointState, n)
	for i := range eps {
		eps[i] = wire.EndpointState{
			Namespace: "llm", Name: fmt.Sprintf("vllm-%03d", i),
			Address: netip.AddrFrom4([4]byte{10, 0, byte(i / 200), byte(i%200 + 1)}), Port: 8000,
			Waiting: uint32(i % 4), Running: uint32(5 + i%11), KVCacheUsage: float64(i%70) / 100,
			MaxAdapters: 4, ActiveAdapters: []string{fmt.Sprintf("adapter-%d", i%5)}, ScrapeTime: now,
		}
	}
	st := &wire.MemStore{}
	// 8 endpoints to a node, one agent each, as on H100 nodes.
	for a := 0; a*8 < n; a++ {
		part := eps[a*8 : min(n, a*8+8)]
		wire.Normalize(part)
		require.NoError(b, wire.Fill(st, wire.DefaultKeyPrefix, fmt.Sprintf("agent-%04d", a), 1, part, now))
	}
	return st
}
