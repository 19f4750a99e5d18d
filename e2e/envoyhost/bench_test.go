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
