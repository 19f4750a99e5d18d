package envoyhost

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
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
