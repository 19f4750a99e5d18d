package envoyhost

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/logcapture"
)

// The binding's ABI side (plugin/internal/proxywasm) seen through the test
// plugin: argument layouts the host can only see from inside (the gRPC
// status of a local reply, set_property's key, the tick period), (0, 0) as
// an empty value rather than an error, the allocator under GC pressure,
// the message of a Go panic. The other test plugin tests are in
// testplugin_test.go, body_test.go, callout_test.go and failure_test.go.

// directStream runs one stream's callbacks straight on the single worker
// VM, without the network, so a test can read what the guest handed the
// host (BenchmarkFilterCallbacksTrivialPlugin does the same).
type directStream struct {
	vm *VM
	c  *wasmContext
	s  *stream
}

// workerVM is the worker VM and its root context of a one-worker harness.
func workerVM(t testing.TB, h *harness) (*VM, *wasmContext) {
	t.Helper()
	vm, root, mode := h.host.listeners[0].plugin.contextFor(1)
	require.Equal(t, filterActive, mode)
	return vm, root
}

// newDirectStream creates a stream context (on_context_create).
func newDirectStream(vm *VM, root *wasmContext) *directStream {
	s := &stream{plugin: root.plugin, vm: vm, mode: filterActive, filterState: map[string][]byte{}}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	c := &wasmContext{vm: vm, id: vm.allocContextID(), parentID: root.id, root: root, plugin: root.plugin, stream: s}
	vm.contexts[c.id] = c
	vm.callback(c, "proxy_on_context_create", uint64(c.id), uint64(root.id))
	return &directStream{vm: vm, c: c, s: s}
}

// call runs one callback of the stream; false if the VM failed.
func (d *directStream) call(name string, args ...uint64) (uint64, bool) {
	d.vm.mu.Lock()
	defer d.vm.mu.Unlock()
	res, _, ok := d.vm.callback(d.c, name, append([]uint64{uint64(d.c.id)}, args...)...)
	return res, ok
}

// requestHeaders runs on_request_headers with the map visible only during
// the call, as the filter does once the stream continues.
func (d *directStream) requestHeaders(headers *HeaderMap, endOfStream bool) uint64 {
	d.s.reqHeaders = headers
	res, _ := d.call("proxy_on_request_headers", uint64(headers.Len()), b2u(endOfStream))
	d.s.reqHeaders = nil
	return res
}

// requestBody runs on_request_body with the whole body at end of stream.
func (d *directStream) requestBody(body []byte) uint64 {
	d.s.reqBody = &body
	d.s.endOfStream = true
	res, _ := d.call("proxy_on_request_body", uint64(len(body)), 1)
	d.s.reqBody, d.s.endOfStream = nil, false
	return res
}

func (d *directStream) responseHeaders(headers *HeaderMap) uint64 {
	d.s.respHeaders = headers
	res, _ := d.call("proxy_on_response_headers", uint64(headers.Len()), 0)
	d.s.respHeaders = nil
	return res
}

// finish runs on_log (with the maps of the access-log phase), on_done and
// on_delete, and forgets the context, as stream.complete does.
func (d *directStream) finish(req, resp *HeaderMap) {
	d.s.accessLogPhase = true
	d.s.logReqHeaders, d.s.logRespHeaders = req, resp
	d.call("proxy_on_log")
	d.s.accessLogPhase = false
	d.s.logReqHeaders, d.s.logRespHeaders = nil, nil
	d.call("proxy_on_done")
	d.call("proxy_on_delete")
	d.vm.mu.Lock()
	delete(d.vm.contexts, d.c.id)
	d.vm.mu.Unlock()
}

// reply is the local reply the guest queued, nil if none.
func (d *directStream) reply() *localReply {
	d.s.pmu.Lock()
	defer d.s.pmu.Unlock()
	return d.s.pendingReply
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func getRequest(path string, extra ...Pair) *HeaderMap {
	return NewHeaderMap(append([]Pair{{":authority", "a"}, {":path", path}, {":method", "GET"}, {":scheme", "http"}}, extra...)...)
}

func intPtr(v int) *int { return &v }

// send_local_response's eight arguments as the binding lays them out:
// status, details, body, the serialized extra headers and the gRPC status
// (-1, any value past 16, is none).
func TestBindingLocalReplyArguments(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1))
	vm, root := workerVM(t, h)
	cases := []struct {
		name    string
		headers []Pair
		want    localReply
	}{
		{"grpc status, header and body", []Pair{{"x-tp-local-reply", "503"}, {"x-tp-local-reply-grpc", "14"},
			{"x-tp-local-reply-header", "a=b"}, {"x-tp-local-reply-body", "down"}},
			localReply{code: 503, body: []byte("down"), headers: []Pair{{"a", "b"}}, grpcStatus: intPtr(14)}},
		{"details, nothing else", []Pair{{"x-tp-local-reply", "429"}, {"x-tp-local-reply-details", "too many"}},
			localReply{code: 429, details: "too_many"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDirectStream(vm, root)
			assert.EqualValues(t, 1, d.requestHeaders(getRequest("/x", c.headers...), true), "Pause")
			got := d.reply()
			require.NotNil(t, got)
			// nil and empty are the same on the wire.
			if len(got.body) == 0 {
				got.body = nil
			}
			if len(got.headers) == 0 {
				got.headers = nil
			}
			assert.Equal(t, c.want, *got)
			d.finish(getRequest("/x"), NewHeaderMap(Pair{":status", "200"}))
		})
	}
	require.False(t, vm.Failed())

	// Through the listener: the details reach the access log, the body is empty.
	resp, body := h.do("GET", "/x", "", map[string]string{"X-Tp-Local-Reply": "429", "X-Tp-Local-Reply-Details": "too many"})
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Empty(t, body)
	require.Eventually(t, func() bool { return len(h.access.all()) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "too_many", h.access.all()[0].Details)
}

// set_property's path arrives joined by NUL bytes and lands in the
// stream's filter state; tick_period_ms reaches the host in milliseconds.
func TestBindingSetPropertyAndTickPeriod(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1), withPluginConfig(`{"tick_period_ms": 50000}`))
	vm, root := workerVM(t, h)
	vm.mu.Lock()
	timer := vm.timers[root.id]
	require.NotNil(t, timer)
	assert.Equal(t, 50*time.Second, timer.period)
	vm.mu.Unlock()

	d := newDirectStream(vm, root)
	d.requestHeaders(getRequest("/tp/set-property?path=a.b&value=zz"), true)
	require.NotNil(t, d.reply())
	assert.Equal(t, 200, d.reply().code, string(d.reply().body))
	assert.Equal(t, map[string][]byte{"wasm.a\x00b": []byte("zz")}, d.s.filterState)
	d.finish(getRequest("/tp/set-property"), NewHeaderMap(Pair{":status", "200"}))
}

// An empty value comes back as (0, 0): the binding must read it as empty,
// not as an error, for a header value, a header in the pairs, shared data
// and the VM configuration.
func TestBindingEmptyValues(t *testing.T) {
	h := newHarness(t, testPluginPkg)

	resp, body := h.do("GET", "/tp/echo", "", map[string]string{"X-Empty": "", "X-Tp-Get": "x-empty"})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var echo struct{ Headers [][2]string }
	require.NoError(t, json.Unmarshal([]byte(body), &echo))
	assert.Contains(t, echo.Headers, [2]string{"x-empty", ""})
	assert.Empty(t, resp.Header.Values("X-Tp-Got-Error"), "found (a missing header is not_found)")

	// set_header_map_pairs writes the empty value back.
	resp, _ = h.do("GET", "/x", "", map[string]string{"X-Empty": "", "X-Tp-Set-Pairs": "paired=2"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got := h.up.last(t)
	assert.Equal(t, []string{""}, got.Header.Values("X-Empty"))
	assert.Equal(t, "2", got.Header.Get("Paired"))

	resp, _ = h.do("GET", "/tp/shared/set?key=k&value=", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cas := resp.Header.Get("X-Tp-Cas")
	resp, body = h.do("GET", "/tp/shared/get?key=k", "", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, resp.Header.Get("X-Tp-Error"))
	assert.Empty(t, body)
	assert.Equal(t, cas, resp.Header.Get("X-Tp-Cas"))

	resp, body = h.do("GET", "/tp/start-info", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var info map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &info))
	assert.Equal(t, "", info["vm_configuration"])
	assert.Empty(t, h.logs.Find("testplugin: vm configuration"), "no error reading an empty configuration")
}

// Returned data lives in buffers the host fills through the guest's
// allocator; a GC between host calls must not move or free them, also
// when the header pairs are large.
func TestBindingAllocatorUnderGCWithLargeHeaders(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/tp/gc", "", map[string]string{"X-Pad": strings.Repeat("p", 3000)})
	assert.Equal(t, http.StatusOK, resp.StatusCode, resp.Header.Get("X-Tp-Error"))
	assert.Equal(t, "ok", body)
}

// Log levels map one to one (critical above error), on_log reads the
// request and response maps, and every response names its VM by an
// 8-byte hex nonce.
func TestBindingLogLevelsAndOnLog(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, _ := h.do("GET", "/tp/log", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Regexp(t, regexp.MustCompile(`^[0-9a-f]{16}$`), resp.Header.Get("X-Tp-Vm-Nonce"))
	for lvl, want := range map[string]string{"trace": "DEBUG-4", "debug": "DEBUG", "info": "INFO",
		"warn": "WARN", "error": "ERROR", "critical": "ERROR+4"} {
		recs := h.logs.Find("testplugin level " + lvl)
		require.Len(t, recs, 1, lvl)
		assert.Equal(t, want, recs[0].Level.String(), lvl)
	}

	resp, _ = h.do("GET", "/x", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { return len(h.logs.Find("testplugin log: path=/x status=200")) == 1 },
		5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "INFO", h.logs.Find("testplugin log: path=/x status=200")[0].Level.String())
}

// get_metric reads back what this plugin counted: one request per
// on_request_headers, the /tp/metrics request included.
func TestBindingMetricsReadBack(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1))
	for i := 0; i < 3; i++ {
		resp, _ := h.do("GET", "/x", "", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	// The access log is written after on_log: the three streams are over.
	require.Eventually(t, func() bool { return len(h.access.all()) == 3 }, 5*time.Second, 10*time.Millisecond)
	resp, body := h.do("GET", "/tp/metrics", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var m map[string]int64
	require.NoError(t, json.Unmarshal([]byte(body), &m))
	assert.Equal(t, int64(4), m["requests_total"])
	assert.Equal(t, int64(1), m["active_streams"], "this stream; the others ended in on_log")
}

// proxy_http_call's header pairs reach the cluster as the request line and
// Host; the reply is handled in the stream that dispatched it (effective
// context), with its status and body.
func TestBindingHTTPCallRequestAndReply(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	h.up.reply = func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.WriteHeader(http.StatusNonAuthoritativeInfo)
		_, _ = w.Write([]byte("pong"))
	}
	resp, body := h.do("GET", "/tp/http-call?cluster=static&path=/p", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "pong", body)
	assert.Equal(t, "203", resp.Header.Get("X-Tp-Call-Status"))
	got := h.up.last(t)
	assert.Equal(t, "GET", got.Method)
	assert.Equal(t, "/p", got.Path)
	assert.Equal(t, "static", got.Host)
}

// A Go panic traps, and the runtime's message reaches the log through
// WASI fd 2.
func TestBindingPanicMessageIsLogged(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1))
	resp, body := h.do("GET", "/tp/panic", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Empty(t, body)
	// The runtime writes the message in pieces; each write is a log line
	// (cpp-host writevImpl), the first two "panic: " and the value.
	recs := h.logs.Records()
	i := slices.IndexFunc(recs, func(r logcapture.Record) bool { return r.Message == "panic: " })
	require.GreaterOrEqual(t, i, 0, "no panic message in the log")
	require.Greater(t, len(recs), i+1)
	assert.Equal(t, "testplugin: /tp/panic", recs[i+1].Message)
	assert.Equal(t, slog.LevelError, recs[i].Level, "fd 2 logs at error")
	assert.Equal(t, slog.LevelError, recs[i+1].Level)
	assert.NotEmpty(t, h.logs.Find("wasm VM failed"))
}

// BenchmarkFilterCallbacksTestPlugin is BenchmarkFilterCallbacksTrivialPlugin
// with the test plugin (Go, on the project's binding) buffering the 4 KiB
// body and reading it back: the difference is the binding's and the Go
// runtime's share of a request. Callbacks of one stream, straight on a
// worker VM, no network.
func BenchmarkFilterCallbacksTestPlugin(b *testing.B) {
	h := newHarness(b, testPluginPkg, withWorkers(1))
	vm, root := workerVM(b, h)
	reqHeaders := NewHeaderMap(Pair{":authority", "example"}, Pair{":path", "/v1/completions"},
		Pair{":method", "POST"}, Pair{":scheme", "http"}, Pair{"content-type", "application/json"},
		Pair{"content-length", "4096"}, Pair{"x-request-id", newUUID()}, Pair{"x-tp-body", "buffer"})
	respHeaders := NewHeaderMap(Pair{":status", "200"}, Pair{"content-length", "2"})
	body := bytes.Repeat([]byte("x"), 4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// The plugin adds response headers: a fresh map per stream.
		req, resp := reqHeaders.Clone(), respHeaders.Clone()
		d := newDirectStream(vm, root)
		d.requestHeaders(req, false)
		d.requestBody(body)
		d.responseHeaders(resp)
		d.finish(req, resp)
	}
	b.StopTimer()
	require.False(b, vm.Failed())
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/req")
}
