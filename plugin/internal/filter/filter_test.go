package filter

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/vmmem"
)

const baseConfig = `{
  "seed": 7,
  "models": [
    {"name": "base", "criticality": "Critical"},
    {"name": "sql-lora", "criticality": "Critical"},
    {"name": "chat", "criticality": "Standard"},
    {"name": "batch", "criticality": "Sheddable"},
    {"name": "sql", "criticality": "Critical", "targets": [{"name": "sql-v1", "weight": 80}, {"name": "sql-v2", "weight": 20}]}
  ]
}`

func TestRoutesToTheAdaptersPod(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(
		pod{name: "with-adapter", addr: "10.0.0.1", active: []string{"sql-lora"}, max: 1},
		pod{name: "other-adapter", addr: "10.0.0.2", active: []string{"tweets"}, max: 1},
	)
	for i := 0; i < 50; i++ {
		r := e.post("/v1/chat/completions", nil, chat("sql-lora"))
		require.Nil(t, r.local)
		assert.Equal(t, types.ActionContinue, r.action)
		assert.Equal(t, "10.0.0.1:8000", r.dest(), "request %d", i)
		assert.Equal(t, chat("sql-lora"), r.body, "no target: body untouched")
	}
	assert.Equal(t, uint64(50), e.counter("wasm_epp.requests.routed"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.snapshot.decodes"), "decoded once, not per request")
}

// A "stream" value the router cannot read as a boolean is forwarded as it
// came (vLLM's lax parsing decides what it means) and routed like any
// request: the router validates only the fields it routes on.
func TestNonBooleanStreamIsForwarded(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", addr: "10.0.0.1", max: 4})
	for i, v := range []string{`"yes"`, `1`, `"true"`, `{}`, `[true]`} {
		body := `{"model":"chat","stream":` + v + `,"messages":[{"role":"user","content":"hi"}]}`
		r := e.post("/v1/chat/completions", nil, body)
		require.Nil(t, r.local, "stream %s is not refused", v)
		assert.Equal(t, types.ActionContinue, r.action)
		assert.Equal(t, "10.0.0.1:8000", r.dest())
		assert.Equal(t, body, r.body, "forwarded unchanged")
		assert.Equal(t, uint64(i+1), e.counter("wasm_epp.requests.routed"))
	}
	assert.Equal(t, uint64(0), e.counter("wasm_epp.requests.bad_request"))
}

func TestTrafficSplitProportionsAndRewrite(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", addr: "10.0.0.1", max: 4}, pod{name: "b", addr: "10.0.0.2", max: 4})
	const n = 2000
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		r := e.post("/v1/completions", [][2]string{{"content-length", "37"}}, `{"model": "sql", "prompt": "select"}`)
		require.Nil(t, r.local)
		p, err := ParseRequest([]byte(r.body), 64)
		require.NoError(t, err, "rewritten body %q", r.body)
		counts[p.Model]++
		assert.Equal(t, `{"model": "`+p.Model+`", "prompt": "select"}`, r.body, "only the model token changes")
		assert.NotContains(t, r.headers, "content-length", "removed: the body may change")
	}
	assert.Len(t, counts, 2)
	// 80/20 over 2000 draws: the standard deviation is about 18 (0.9%).
	assert.InDelta(t, 0.8, float64(counts["sql-v1"])/n, 0.04, "%v", counts)
	assert.InDelta(t, 0.2, float64(counts["sql-v2"])/n, 0.04, "%v", counts)
}

func TestSplitIsReproducibleWithASeed(t *testing.T) {
	draws := func() string {
		e := newEnv(t, baseConfig)
		defer e.close()
		e.setPods(pod{name: "a", max: 4})
		var b strings.Builder
		for i := 0; i < 40; i++ {
			p, err := ParseRequest([]byte(e.post("/v1/completions", nil, `{"model":"sql","prompt":"x"}`).body), 64)
			require.NoError(t, err)
			b.WriteString(p.Model[len(p.Model)-1:])
		}
		return b.String()
	}
	assert.Equal(t, draws(), draws())
}

func TestContentLengthKeptWhenNoModelIsRewritten(t *testing.T) {
	e := newEnv(t, `{"models": [{"name": "m", "targets": [{"name": "m", "weight": 1}]}]}`)
	e.setPods(pod{name: "a"})
	r := e.post("/v1/completions", [][2]string{{"content-length", "25"}}, `{"model":"m","prompt":"x"}`)
	require.Nil(t, r.local)
	assert.Equal(t, "25", r.headers["content-length"])
}

func TestSheddingAnswers429(t *testing.T) {
	e := newEnv(t, baseConfig)
	// Queues above the seed's threshold (5) and KV above 0.8: no capacity.
	e.setPods(pod{name: "a", waiting: 50, kv: 0.95}, pod{name: "b", addr: "10.0.0.2", waiting: 40, kv: 0.9})
	r := e.post("/v1/completions", nil, `{"model":"batch","prompt":"x"}`)
	require.NotNil(t, r.local)
	assert.Equal(t, uint32(429), r.local.StatusCode)
	_, typ, code := r.errorJSON(t)
	assert.Equal(t, "rate_limit_error", typ)
	assert.Equal(t, "capacity_exhausted", code)
	assert.Empty(t, r.dest())
	assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.dropped"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.path.sheddable.no-capacity"))

	// A critical request on the same saturated pods is never shed.
	r = e.post("/v1/completions", nil, `{"model":"base","prompt":"x"}`)
	require.Nil(t, r.local)
	assert.NotEmpty(t, r.dest())
}

func TestErrorReplies(t *testing.T) {
	cases := []struct {
		name    string
		method  string
		body    []string // nil: no body
		headers [][2]string
		status  uint32
		typ     string
		code    string
		counter string
	}{
		{"row 1: POST without body", "POST", nil, nil, 400, "invalid_request_error", "empty_body", "bad_request"},
		{"row 1: POST with an empty body", "POST", []string{""}, nil, 400, "invalid_request_error", "empty_body", "bad_request"},
		{"row 2: not JSON", "POST", []string{"hello"}, nil, 400, "invalid_request_error", "invalid_json", "bad_request"},
		{"row 3: truncated", "POST", []string{`{"model":"a"`}, nil, 400, "invalid_request_error", "invalid_json", "bad_request"},
		{"row 4: two objects", "POST", []string{`{"model":"base"}{"model":"base"}`}, nil, 400, "invalid_request_error", "trailing_data", "bad_request"},
		{"row 5: no model", "POST", []string{`{"prompt":"x"}`}, nil, 400, "invalid_request_error", "missing_model", "bad_request"},
		{"row 6: model number", "POST", []string{`{"model":123}`}, nil, 400, "invalid_request_error", "model_not_a_string", "bad_request"},
		{"row 7: duplicate model", "POST", []string{`{"model":"base","model":"batch"}`}, nil, 400, "invalid_request_error", "duplicate_key", "bad_request"},
		{"row 8: unknown model", "POST", []string{`{"model":"gpt-5","prompt":"x"}`}, nil, 404, "invalid_request_error", "model_not_found", "unknown_model"},
		{"row 9: control character", "POST", []string{`{"model":"a\u0007"}`}, nil, 400, "invalid_request_error", "invalid_model_name", "bad_request"},
		{"row 9: too long", "POST", []string{`{"model":"` + strings.Repeat("x", 257) + `"}`}, nil, 400, "invalid_request_error", "model_too_long", "bad_request"},
		{"row 10: body over the limit", "POST", []string{`{"model":"base","prompt":"` + strings.Repeat("x", 600), strings.Repeat("y", 600) + `"}`}, nil, 413, "invalid_request_error", "request_too_large", "too_large"},
		{"row 10: content-length over the limit", "POST", []string{`{}`}, [][2]string{{"content-length", "5000"}}, 413, "invalid_request_error", "request_too_large", "too_large"},
		{"row 12: top-level array", "POST", []string{`[{"model":"base"}]`}, nil, 400, "invalid_request_error", "not_an_object", "bad_request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{"maxBodyBytes": 1024, "models": [{"name": "base"}, {"name": "batch"}]}`)
			e.setPods(pod{name: "a"})
			hdrs := append([][2]string{{":method", tc.method}, {":path", "/v1/completions"}}, tc.headers...)
			r := e.do(hdrs, tc.body...)
			require.NotNil(t, r.local, "expected a local reply")
			assert.Equal(t, tc.status, r.local.StatusCode)
			msg, typ, code := r.errorJSON(t)
			assert.Equal(t, tc.typ, typ)
			assert.Equal(t, tc.code, code)
			assert.NotEmpty(t, msg)
			assert.NotContains(t, msg, "\x07")
			assert.Empty(t, r.dest(), "never routed")
			assert.Equal(t, uint64(1), e.counter("wasm_epp.requests."+tc.counter))
			assert.Equal(t, uint64(0), e.counter("wasm_epp.requests.routed"))
		})
	}
}

func TestUnknownModelMessageEscapesTheName(t *testing.T) {
	e := newEnv(t, `{}`)
	e.setPods(pod{name: "a"})
	r := e.post("/v1/completions", nil, `{"model":"evil\"name<script>","prompt":"x"}`)
	require.NotNil(t, r.local)
	msg, _, _ := r.errorJSON(t)
	assert.Equal(t, `The model "evil\"name<script>" does not exist`, msg)
}

func TestUnknownModelPassthrough(t *testing.T) {
	e := newEnv(t, `{"unknownModels": "passthrough"}`)
	e.setPods(pod{name: "a", addr: "10.0.0.7"})
	body := `{"model":"anything","prompt":"x"}`
	r := e.post("/v1/completions", nil, body)
	require.Nil(t, r.local)
	assert.Equal(t, "10.0.0.7:8000", r.dest())
	assert.Equal(t, body, r.body, "unchanged")

	// Pass-through is Sheddable: shed when there is no capacity.
	e.setPods(pod{name: "a", waiting: 100, kv: 0.99})
	r = e.post("/v1/completions", nil, body)
	require.NotNil(t, r.local)
	assert.Equal(t, uint32(429), r.local.StatusCode)
}

func TestStaleEndpointsAreExcluded(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(
		pod{name: "stale", addr: "10.0.0.1", age: 5 * time.Second},
		pod{name: "fresh", addr: "10.0.0.2", waiting: 3, age: 100 * time.Millisecond},
	)
	for i := 0; i < 30; i++ {
		r := e.post("/v1/chat/completions", nil, chat("base"))
		require.Nil(t, r.local)
		assert.Equal(t, "10.0.0.2:8000", r.dest(), "the stale pod is idle but must not be chosen")
	}
	// Time passes without a push: the fresh pod goes stale too.
	e.clock.now = e.clock.now.Add(3 * time.Second)
	r := e.post("/v1/chat/completions", nil, chat("base"))
	require.Nil(t, r.local, "fail-open by default")
	assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.fail_open"))
}

func TestAllStaleFailOpenVersusReject(t *testing.T) {
	pods := []pod{
		{name: "a", addr: "10.0.0.1", age: time.Minute},
		{name: "b", addr: "10.0.0.2", age: time.Minute},
		{name: "c", addr: "10.0.0.3", age: time.Minute},
	}
	t.Run("fail-open", func(t *testing.T) {
		e := newEnv(t, baseConfig)
		e.setPods(pods...)
		seen := map[string]int{}
		for i := 0; i < 300; i++ {
			r := e.post("/v1/chat/completions", nil, chat("chat"))
			require.Nil(t, r.local)
			seen[r.dest()]++
		}
		assert.Len(t, seen, 3, "random over every last-known endpoint: %v", seen)
		for d, n := range seen {
			assert.InDelta(t, 100, n, 40, d)
		}
		assert.Equal(t, uint64(300), e.counter("wasm_epp.requests.fail_open"))
		assert.Equal(t, uint64(0), e.counter("wasm_epp.requests.routed"))
		assert.Equal(t, uint64(300), e.counter("wasm_epp.path.all-stale"))
		assert.Len(t, e.host.GetWarnLogs(), 1, "warned once, not per request")
	})
	t.Run("reject", func(t *testing.T) {
		e := newEnv(t, `{"whenNoFreshEndpoint": "reject", "models": [{"name": "chat"}]}`)
		e.setPods(pods...)
		r := e.post("/v1/chat/completions", nil, chat("chat"))
		require.NotNil(t, r.local)
		assert.Equal(t, uint32(503), r.local.StatusCode)
		msg, typ, code := r.errorJSON(t)
		assert.Equal(t, "service_unavailable", typ)
		assert.Equal(t, "no_endpoint", code)
		assert.Contains(t, msg, "fresh")
		assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.no_endpoint"))
	})
	t.Run("nothing known at all", func(t *testing.T) {
		e := newEnv(t, baseConfig)
		r := e.post("/v1/chat/completions", nil, chat("chat"))
		require.NotNil(t, r.local)
		assert.Equal(t, uint32(503), r.local.StatusCode, "no snapshot in shared data")
		e.setPods()
		r = e.post("/v1/chat/completions", nil, chat("chat"))
		require.NotNil(t, r.local)
		assert.Equal(t, uint32(503), r.local.StatusCode, "an empty snapshot")
	})
}

func TestClientDestinationHeaderIsNeverUsed(t *testing.T) {
	e := newEnv(t, baseConfig)
	spoof := [][2]string{{"x-gateway-destination-endpoint", "10.9.9.9:1"}, {"x-envoy-original-dst-host", "10.9.9.9:1"}}

	// Nothing to route to: the reply is 503 and the spoofed headers are gone.
	r := e.post("/v1/chat/completions", spoof, chat("base"))
	require.NotNil(t, r.local)
	assert.NotContains(t, r.headers, "x-gateway-destination-endpoint")
	assert.NotContains(t, r.headers, "x-envoy-original-dst-host")

	e.setPods(pod{name: "a", addr: "10.0.0.1"})
	r = e.post("/v1/chat/completions", spoof, chat("base"))
	require.Nil(t, r.local)
	assert.Equal(t, "10.0.0.1:8000", r.dest())
	assert.NotContains(t, r.headers, "x-envoy-original-dst-host")

	r = e.do([][2]string{{":method", "GET"}, {":path", "/v1/models"}, spoof[0]})
	assert.Equal(t, "10.0.0.1:8000", r.dest())
}

func TestBodyInManySmallChunks(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", addr: "10.0.0.1", max: 4}, pod{name: "b", addr: "10.0.0.2", max: 4})
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("word ", 100) + `"}],"model":"sql"}`
	var chunks []string
	for i := 0; i < len(body); i += 3 {
		chunks = append(chunks, body[i:min(i+3, len(body))])
	}
	r := e.post("/v1/chat/completions", nil, chunks...)
	require.Nil(t, r.local)
	assert.Equal(t, types.ActionContinue, r.action)
	assert.NotEmpty(t, r.dest())
	p, err := ParseRequest([]byte(r.body), 64)
	require.NoError(t, err)
	assert.Contains(t, []string{"sql-v1", "sql-v2"}, p.Model, "rewritten as if it came whole")
	assert.Equal(t, strings.Replace(body, `"sql"`, `"`+p.Model+`"`, 1), r.body)
}

func TestRequestWithoutBodyGoesToTheLeastLoaded(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(
		pod{name: "busy", addr: "10.0.0.1", waiting: 9, running: 20},
		pod{name: "idle", addr: "10.0.0.2", waiting: 0, running: 1},
		pod{name: "idle-but-stale", addr: "10.0.0.3", age: time.Hour},
	)
	r := e.do([][2]string{{":method", "GET"}, {":path", "/v1/models"}})
	require.Nil(t, r.local)
	assert.Equal(t, types.ActionContinue, r.action, "continues from the headers callback")
	assert.Equal(t, "10.0.0.2:8000", r.dest())
	assert.Equal(t, uint64(1), e.counter("wasm_epp.path.least-loaded"))
}

func TestSnapshotDecodedOncePerChange(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", addr: "10.0.0.1"})
	for i := 0; i < 10; i++ {
		assert.Equal(t, "10.0.0.1:8000", e.post("/v1/chat/completions", nil, chat("base")).dest())
	}
	assert.Equal(t, uint64(1), e.counter("wasm_epp.snapshot.decodes"))
	e.setPods(pod{name: "b", addr: "10.0.0.2"})
	for i := 0; i < 10; i++ {
		assert.Equal(t, "10.0.0.2:8000", e.post("/v1/chat/completions", nil, chat("base")).dest())
	}
	assert.Equal(t, uint64(2), e.counter("wasm_epp.snapshot.decodes"))
	v, err := e.host.GetGaugeMetric("wasm_epp.snapshot.endpoints")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), v)
}

func TestCorruptSnapshotKeepsThePreviousOne(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", addr: "10.0.0.1"})
	assert.Equal(t, "10.0.0.1:8000", e.post("/v1/chat/completions", nil, chat("base")).dest())
	e.corruptSegment([]byte("WG\x02garbage"))
	for i := 0; i < 3; i++ {
		assert.Equal(t, "10.0.0.1:8000", e.post("/v1/chat/completions", nil, chat("base")).dest())
	}
	assert.Equal(t, uint64(1), e.counter("wasm_epp.snapshot.decode_errors"), "tried once per version")
	assert.Len(t, e.host.GetErrorLogs(), 1)
}

func TestDestinationFormats(t *testing.T) {
	t.Run("IPv6", func(t *testing.T) {
		e := newEnv(t, baseConfig)
		e.setPods(pod{name: "a", addr: "fd00::1", port: 8001})
		assert.Equal(t, "[fd00::1]:8001", e.post("/v1/chat/completions", nil, chat("base")).dest())
	})
	t.Run("targetPort", func(t *testing.T) {
		e := newEnv(t, `{"targetPort": 9000, "destinationHeader": "x-dest", "models": [{"name": "base"}]}`)
		e.setPods(pod{name: "a", addr: "10.0.0.1", port: 8001})
		r := e.post("/v1/chat/completions", [][2]string{{"x-dest", "10.9.9.9:1"}}, chat("base"))
		assert.Equal(t, "10.0.0.1:9000", r.headers["x-dest"])
		assert.NotContains(t, r.headers, "x-gateway-destination-endpoint")
	})
}

func TestServedByResponseHeader(t *testing.T) {
	e := newEnv(t, `{"servedByHeader": "x-served-by", "models": [{"name": "base"}]}`)
	e.setPods(pod{name: "pod-7", addr: "10.0.0.1"})
	r := e.post("/v1/chat/completions", nil, chat("base"))
	require.Nil(t, r.local)
	e.host.CallOnResponseHeaders(r.id, [][2]string{{":status", "200"}}, false)
	assert.Contains(t, e.host.GetCurrentResponseHeaders(r.id), [2]string{"x-served-by", "llm/pod-7"})
	e.close()

	// Off by default.
	e2 := newEnv(t, baseConfig)
	e2.setPods(pod{name: "pod-7"})
	r = e2.post("/v1/chat/completions", nil, chat("base"))
	e2.host.CallOnResponseHeaders(r.id, [][2]string{{":status", "200"}}, false)
	for _, h := range e2.host.GetCurrentResponseHeaders(r.id) {
		assert.NotEqual(t, "x-served-by", h[0])
	}
}

// Every decision path has its counter from the start, at zero.
func TestPathCountersDefinedAtStart(t *testing.T) {
	e := newEnv(t, baseConfig)
	for _, p := range []string{"no-endpoint", "all-stale", "least-loaded",
		"critical.low-queue.lora-affinity.least-queue.least-kv", "standard.no-capacity"} {
		assert.Equal(t, uint64(0), e.counter("wasm_epp.path."+p), p)
	}
}

// BenchmarkFilterRequest is the filter's own work per request in native
// code, driven by proxytest: request headers, a 4 KiB chat body, snapshot
// cache check, scheduling over N endpoints (model "chat", Standard, the
// decision tree), destination header, response headers. The test host
// benchmark (e2e/filtertest BenchmarkPluginRequest) measures the same in
// the real .wasm.
func BenchmarkFilterRequest(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			// The host runs at info level, as in production: no decision log.
			info := func() (proxywasm.LogLevel, error) { return proxywasm.LogLevelInfo, nil }
			e, status := startEnvOpts(&testing.T{}, `{"models": [{"name": "chat", "criticality": "Standard"}]}`, Options{LogLevel: info})
			defer e.close()
			if status != types.OnPluginStartStatusOK {
				b.Fatal("plugin start failed")
			}
			pods := make([]pod, n)
			for i := range pods {
				pods[i] = pod{name: fmt.Sprintf("vllm-%03d", i), addr: fmt.Sprintf("10.0.%d.%d", i/200, i%200+1),
					waiting: uint32(i % 4), running: uint32(5 + i%11), kv: float64(i%70) / 100, max: 4,
					active: []string{fmt.Sprintf("adapter-%d", i%5)}, age: time.Duration(i%40) * time.Millisecond}
			}
			e.setPods(pods...)
			body := body4K("chat")
			hdrs := [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "gw"},
				{"content-type", "application/json"}, {"content-length", strconv.Itoa(len(body))}}
			b.ReportAllocs()
			for b.Loop() {
				id := e.host.InitializeHttpContext()
				e.host.CallOnRequestHeaders(id, hdrs, false)
				if e.host.CallOnRequestBody(id, body, true) != types.ActionContinue {
					b.Fatal("not routed")
				}
				e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
				e.host.CompleteHttpContext(id)
			}
		})
	}
}

func TestGuestMemoryGauge(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", addr: "10.0.0.1"})
	vmmem.Forget() // earlier tests' hosts ran in this process
	e.post("/v1/chat/completions", nil, chat("base"))
	v, err := e.host.GetGaugeMetric("wasm_epp.vm.memory_bytes")
	require.NoError(t, err)
	assert.Greater(t, v, uint64(1<<20), "the runtime's mapped memory")
}
