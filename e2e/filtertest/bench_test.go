package filtertest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// trivialGuestPkg is the host benchmark's raw-ABI plugin that reads the
// headers and buffers the body: the host's own share of a request.
const trivialGuestPkg = "./e2e/envoyhost/testdata/guests/trivial"

// benchBody is a chat request of about 4 KiB.
func benchBody(model string) []byte {
	content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 88)
	return []byte(`{"model":"` + model + `","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"` +
		content + `"}],"stream":false,"max_tokens":256,"temperature":0.7}`)
}

// benchEndpoints are n plausible endpoints (varied queues, KV use and
// adapters), all served by the one loopback pod at port.
func benchEndpoints(n int, port uint16, now time.Time) []wire.EndpointState {
	eps := make([]wire.EndpointState, n)
	for i := range eps {
		eps[i] = wire.EndpointState{
			Namespace: "llm", Name: fmt.Sprintf("vllm-%03d", i),
			Address: netip.MustParseAddr("127.0.0.1"), Port: port,
			Waiting: uint32(i % 4), Running: uint32(5 + i%11), KVCacheUsage: float64(i%70) / 100,
			MaxAdapters: 4, ActiveAdapters: []string{fmt.Sprintf("adapter-%d", i%5)},
			ScrapeTime: now.Add(-time.Duration(i%40) * time.Millisecond),
		}
		if i%3 == 0 {
			eps[i].ActiveAdapters = append(eps[i].ActiveAdapters, "sql-lora")
		}
	}
	return eps
}

// BenchmarkPluginRequest: one POST (headers + 4 KiB chat body) through
// the test host over a keep-alive connection to a loopback pod, with the
// real module scheduling over N endpoints (model "chat", Standard, the
// decision tree), interleaved request by request with the same POST through
// a second host running the trivial raw-ABI plugin (the host's own share:
// it reads the headers and buffers the body), so load on the machine hits
// both alike. Reported per request:
//
//	trivial-µs/req, wasm-epp-µs/req    wall time of each
//	plugin-µs/req, plugin-cpu-µs/req   the difference: wall, and CPU of the
//	                                   whole process (client, host, pod)
//	in-filter-µs/req                   the plugin's own measure of time spent
//	                                   in its request callbacks (histogram
//	                                   wasm_epp.request_us), host calls included
func BenchmarkPluginRequest(b *testing.B) {
	trivialCode, err := os.ReadFile(wasmbuild.Build(b, trivialGuestPkg))
	require.NoError(b, err)
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			triv, err := tryStartStack(b, trivialCode, "", 1, func(c *envoyhost.Config) {
				c.Listeners = c.Listeners[:1] // the trivial guest has no receiver role
			})
			require.NoError(b, err)
			plug := startStack(b, `{"models": [{"name": "chat", "criticality": "Standard"}, {"name": "sql-lora", "criticality": "Critical"}]}`, 1,
				func(c *envoyhost.Config) { c.AdminAddress = "127.0.0.1:0" })
			plug.pushEndpoints(benchEndpoints(n, plug.pods[0].port, plug.clock.Now()))

			body := benchBody("chat")
			sendTriv := newSender(b, triv, body, destHeader, triv.pods[0].addr())
			sendPlug := newSender(b, plug, body)
			for i := 0; i < 50; i++ { // warm up: connections, VMs, snapshot cache
				sendTriv()
				sendPlug()
			}
			sum0, count0 := plug.histogram("wasm_epp_request_us")
			var trivWall, plugWall, trivCPU, plugCPU time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				w, c := measure(sendTriv)
				trivWall, trivCPU = trivWall+w, trivCPU+c
				w, c = measure(sendPlug)
				plugWall, plugCPU = plugWall+w, plugCPU+c
			}
			b.StopTimer()
			sum1, count1 := plug.histogram("wasm_epp_request_us")
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
			b.ReportMetric(per(trivWall), "trivial-µs/req")
			b.ReportMetric(per(plugWall), "wasm-epp-µs/req")
			b.ReportMetric(per(plugWall-trivWall), "plugin-µs/req")
			b.ReportMetric(per(plugCPU-trivCPU), "plugin-cpu-µs/req")
			if count1 > count0 {
				b.ReportMetric((sum1-sum0)/(count1-count0), "in-filter-µs/req")
			}
			require.LessOrEqual(b, plug.stat("wasm_epp.snapshot.decodes"), uint64(3), "no decode per request")
		})
	}
}

// newSender returns a function sending one POST of body to s's router
// listener over a dedicated keep-alive connection.
func newSender(b *testing.B, s *stack, body []byte, headers ...string) func() {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	b.Cleanup(client.CloseIdleConnections)
	return func() {
		req, _ := http.NewRequest("POST", s.router+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d: %s", resp.StatusCode, got)
		}
	}
}

// measure runs f and returns its wall time and the process CPU it used.
func measure(f func()) (wall, cpu time.Duration) {
	c0, t0 := cpuTime(), time.Now()
	f()
	return time.Since(t0), cpuTime() - c0
}

// histogram reads a plugin histogram's sum and count from the admin
// listener's Prometheus output.
func (s *stack) histogram(promName string) (sum, count float64) {
	s.t.Helper()
	resp, err := http.Get("http://" + s.host.AdminAddr() + "/stats/prometheus")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	for _, line := range strings.Split(string(text), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		name, _, _ := strings.Cut(f[0], "{")
		v, err := strconv.ParseFloat(f[1], 64)
		switch {
		case err != nil:
		case name == promName+"_sum":
			sum = v
		case name == promName+"_count":
			count = v
		}
	}
	return sum, count
}

// cpuTime is the user+system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
