package envoyhost

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// prefixHarness runs the real module on workers worker VMs with the
// prefix-aware profile over n fresh endpoints.
func prefixHarness(t testing.TB, workers, n int, profile string) (*harness, *config.Config) {
	t.Helper()
	return prefixHarnessWith(t, workers, n, profile, "")
}

// prefixHarnessWith is prefixHarness with more top-level members of the
// plugin configuration (JSON without braces, "" for none).
func prefixHarnessWith(t testing.TB, workers, n int, profile, more string) (*harness, *config.Config) {
	t.Helper()
	code, err := os.ReadFile(wasmbuild.Plugin(t))
	require.NoError(t, err)
	if more != "" {
		more = ", " + more
	}
	pluginConfig := `{"models": [{"name": "chat", "criticality": "Critical"}], "scheduler": {"profile": "` + profile + `"}` + more + `}`
	cfg, err := config.Decode([]byte(pluginConfig))
	require.NoError(t, err)
	h := newHarness(t, trivialGuestPkg, withWorkers(workers), withAllowStopIteration(), withPluginConfig(pluginConfig),
		func(_ *Config, p *PluginConfig) { p.VM.Code = code })
	benchSnapshot(t, n, time.Now().Add(time.Hour)).Each(func(key string, value []byte) {
		h.host.shared.set("test-vm", key, value, 0)
	})
	return h, cfg
}

// routeOn sends one chat body through worker thread's VM and returns the
// destination it chose; the response body (if any) goes through the
// filter before the stream ends.
func routeOn(t testing.TB, h *harness, cfg *config.Config, thread int, body []byte, response []byte) string {
	t.Helper()
	if response == nil {
		return routeChunksOn(t, h, cfg, thread, body)
	}
	return routeChunksOn(t, h, cfg, thread, body, response)
}

// routeChunksOn is routeOn with a response body delivered in chunks, as
// Envoy passes a streamed response: each chunk alone in the buffer, the
// last one ending the stream.
func routeChunksOn(t testing.TB, h *harness, cfg *config.Config, thread int, body []byte, chunks ...[]byte) string {
	t.Helper()
	vm, root, mode := h.host.listeners[0].plugin.contextFor(thread)
	require.Equal(t, filterActive, mode)
	req := NewHeaderMap(Pair{":authority", "gw"}, Pair{":path", "/v1/chat/completions"}, Pair{":method", "POST"},
		Pair{":scheme", "http"}, Pair{"content-type", "application/json"}, Pair{"content-length", fmt.Sprint(len(body))})
	d := newDirectStream(vm, root)
	d.requestHeaders(req, false)
	d.s.reqHeaders = req
	if res := d.requestBody(body); res != 0 || d.reply() != nil {
		t.Fatalf("not routed: %v %+v", res, d.reply())
	}
	d.s.reqHeaders = nil
	resp := NewHeaderMap(Pair{":status", "200"}, Pair{"content-type", "application/json"})
	d.responseHeaders(resp)
	for i, c := range chunks {
		d.responseChunk(c, i == len(chunks)-1)
	}
	d.finish(req, resp)
	require.False(t, vm.Failed())
	dest, _ := req.Get(cfg.DestinationHeader)
	return dest
}

// responseChunk delivers one chunk of the response body.
func (d *directStream) responseChunk(chunk []byte, end bool) {
	d.s.respBody = &chunk
	d.s.endOfStream = end
	d.call("proxy_on_response_body", uint64(len(chunk)), b2u(end))
	d.s.respBody, d.s.endOfStream = nil, false
}

func chatJSON(system, user string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "chat", "max_tokens": 64, "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": user}}})
	return b
}

// chatJSONRoleFirst is chatJSON with each message's role before its
// content, as OpenAI clients send them (json.Marshal sorts a map's keys,
// which puts content first: the hasher then skips the content once before
// it renders it, since the role comes first in the canonical stream).
func chatJSONRoleFirst(system, user string) []byte {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return []byte(`{"model":"chat","max_tokens":64,"messages":[{"role":"system","content":` + q(system) +
		`},{"role":"user","content":` + q(user) + `}]}`)
}

// TestPrefixIndexAcrossWorkerVMs: what one worker VM routed, the others
// find in shared data; the lag (one VM's decision until every other VM
// fetched it) is logged for BENCHMARKS.md.
func TestPrefixIndexAcrossWorkerVMs(t *testing.T) {
	h, cfg := prefixHarness(t, 4, 8, "prefix-aware")
	stat := func(name string) uint64 {
		v, _ := h.host.StatValue("wasmcustom.wasm_epp." + name)
		return v
	}
	var first, all []time.Duration
	for trial := range 12 {
		// One recorded position (4 blocks of 64 bytes): one bucket changes.
		system := fmt.Sprintf("%03d %s", trial, strings.Repeat("q", 300))
		// Start from quiet shared data: the last trial's probe may still be
		// on its way to the other VMs.
		before := stat("prefix.index.fetched_buckets")
		for quiet := 0; quiet < 4; {
			time.Sleep(50 * time.Millisecond)
			if now := stat("prefix.index.fetched_buckets"); now != before {
				before, quiet = now, 0
				continue
			}
			quiet++
		}
		start := time.Now()
		dest := routeOn(t, h, cfg, 1, chatJSON(system, "hi"), nil)
		seen := time.Duration(0)
		deadline := time.Now().Add(20 * time.Second)
		for stat("prefix.index.fetched_buckets") < before+4 { // the main thread's VM and the three other workers
			if seen == 0 && stat("prefix.index.fetched_buckets") > before {
				seen = time.Since(start)
			}
			require.True(t, time.Now().Before(deadline), "the other VMs never fetched what VM 1 wrote")
			time.Sleep(time.Millisecond)
		}
		if seen == 0 {
			seen = time.Since(start)
		}
		first, all = append(first, seen), append(all, time.Since(start))
		// Another VM now routes the same prefix by affinity, to the same
		// endpoint.
		affinity := stat("path.prefix.affinity")
		require.Equal(t, dest, routeOn(t, h, cfg, 2+trial%3, chatJSON(system, "hello again"), nil))
		require.Equal(t, affinity+1, stat("path.prefix.affinity"), "trial %d: VM %d did not know the prefix", trial, 2+trial%3)
	}
	slices.Sort(first)
	slices.Sort(all)
	t.Logf("lag from a decision on one VM until the first / every other VM fetched it (syncInterval 50ms, %d trials): first p50 %v max %v; all p50 %v max %v",
		len(first), first[len(first)/2].Round(time.Millisecond), first[len(first)-1].Round(time.Millisecond),
		all[len(all)/2].Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond))
}

// TestPrefixFeedbackInTheHost: a response reporting a miss where the
// index predicted a hit removes the entries, in the real module.
func TestPrefixFeedbackInTheHost(t *testing.T) {
	h, cfg := prefixHarness(t, 1, 4, "prefix-aware")
	stat := func(name string) uint64 {
		v, _ := h.host.StatValue("wasmcustom.wasm_epp." + name)
		return v
	}
	// The tracker's counters are published on the tick (every 50 ms).
	waitStat := func(name string, want uint64) {
		deadline := time.Now().Add(20 * time.Second)
		for stat(name) < want {
			require.True(t, time.Now().Before(deadline), "%s stayed at %d, want %d", name, stat(name), want)
			time.Sleep(5 * time.Millisecond)
		}
	}
	body := chatJSON(strings.Repeat("Shared manual text. ", 60), "q")
	routeOn(t, h, cfg, 1, body, []byte(`{"usage":{"prompt_tokens":300,"prompt_tokens_details":{"cached_tokens":0}}}`))
	routeOn(t, h, cfg, 1, body, []byte(`{"choices":[],"usage":{"prompt_tokens":300,"prompt_tokens_details":{"cached_tokens":0}}}`))
	waitStat("prefix.responses.judged", 2)
	require.Equal(t, uint64(1), stat("prefix.responses.mispredicted"))
	require.Greater(t, stat("prefix.predicted_cached_tokens"), uint64(250))
	consistent := stat("path.prefix.consistent")
	routeOn(t, h, cfg, 1, body, nil)
	require.Equal(t, consistent+1, stat("path.prefix.consistent"), "the forgotten prefix was still predicted")
}

// BenchmarkPrefixFilterCallbacks is BenchmarkFilterCallbacksMainPlugin for
// chat bodies of several sizes, with the default decision tree, the
// scoring profile and prefix-aware routing (hashing, lookup, record, and
// the response's usage read as it passes), 8 endpoints.
//
// prefix-aware syncs its index on the root context's tick (50 ms), which
// a request does not wait for; "prefix-aware-sync10s" leaves the ticks
// out, so that the request path alone is counted where each request is
// slowed down (under cachegrind a request takes about 50 times longer, so
// the ticks would come every few requests instead of every few hundred).
// "prefix-aware-tickeach" adds a tick after every request: its excess
// over prefix-aware-sync10s is what one tick costs (a sync with one request's writes).
func BenchmarkPrefixFilterCallbacks(b *testing.B) {
	const noTicks = `"prefix": {"syncInterval": "10s"}`
	cases := []struct {
		name, profile, more string
		tickEach            bool
	}{
		{"decision-tree", "decision-tree", "", false},
		{"scoring", "scoring", "", false},
		{"prefix-aware", "prefix-aware", "", false},
		{"prefix-aware-sync10s", "prefix-aware", noTicks, false},
		{"prefix-aware-tickeach", "prefix-aware", noTicks, true},
	}
	for _, kib := range []int{4, 64, 220, 256} {
		for _, c := range cases {
			b.Run(fmt.Sprintf("%dKiB/%s", kib, c.name), func(b *testing.B) {
				h, cfg := prefixHarnessWith(b, 1, 8, c.profile, c.more)
				content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", kib*1024/45)
				body := chatJSONRoleFirst("You are helpful.", content)
				// The usage confirms the prediction (all but the last
				// block cached, as vLLM reports a repeated prompt), the
				// steady state: a misprediction would also forget and
				// re-record the prompt's entries on every request.
				resp := []byte(`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"Sure."}}],"usage":{"prompt_tokens":` +
					strconv.Itoa(len(body)/4) + `,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":` + strconv.Itoa(len(body)/4-16) + `}}}`)
				routeOn(b, h, cfg, 1, body, resp)
				cpu0 := processCPU()
				b.ResetTimer()
				for range b.N {
					routeOn(b, h, cfg, 1, body, resp)
					if c.tickEach {
						tickRoot(b, h, 1)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/req")
				// Process CPU (the host's timers included): steadier than
				// wall time on a shared machine.
				b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
			})
		}
	}
}

// tickRoot runs proxy_on_tick for worker thread's root context now, as
// its timer would.
func tickRoot(t testing.TB, h *harness, thread int) {
	t.Helper()
	vm, _, _ := h.host.listeners[0].plugin.contextFor(thread)
	require.NotNil(t, vm)
	vm.mu.Lock()
	defer vm.mu.Unlock()
	require.NotEmpty(t, vm.timers, "no root context set a tick period")
	for id := range vm.timers {
		_, _, ok := vm.callback(vm.contexts[id], "proxy_on_tick", uint64(id))
		require.True(t, ok, "on_tick failed")
	}
}
