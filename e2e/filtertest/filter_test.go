package filtertest

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// routerConfig is the plugin configuration most tests use.
const routerConfig = `{
  "seed": 11,
  "servedByHeader": "x-served-by",
  "models": [
    {"name": "base", "criticality": "Critical"},
    {"name": "sql-lora", "criticality": "Critical"},
    {"name": "chat", "criticality": "Standard"},
    {"name": "batch", "criticality": "Sheddable"},
    {"name": "sql", "criticality": "Critical", "targets": [{"name": "sql-v1", "weight": 80}, {"name": "sql-v2", "weight": 20}]}
  ]
}`

// model reads the "model" a pod received.
func model(t testing.TB, body []byte) string {
	t.Helper()
	var v struct {
		Model string `json:"model"`
	}
	require.NoError(t, json.Unmarshal(body, &v), "%q", body)
	return v.Model
}

func TestRoutesToTheAdaptersPod(t *testing.T) {
	s := startStack(t, routerConfig, 3)
	s.setPods(
		podState{active: []string{"tweets"}, max: 1},
		podState{active: []string{"sql-lora"}, max: 1},
		podState{active: []string{"tweets"}, max: 1},
	)
	// Every VM has re-read the push by then (its tick, or a request once
	// the last re-read is twice the refresh interval old).
	time.Sleep(2*config.DefaultSnapshotRefresh + 2*time.Millisecond)
	decodes := s.stat("wasm_epp.snapshot.decodes")
	for i := 0; i < 20; i++ {
		r := s.post("/v1/chat/completions", chat("sql-lora"))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		assert.Equal(t, "pod-1", r.pod, "request %d", i)
		assert.Equal(t, "llm/pod-1", r.header.Get("x-served-by"))
	}
	reqs := s.pods[1].requests()
	require.Len(t, reqs, 20)
	assert.Equal(t, chat("sql-lora"), string(reqs[0].Body), "no target: body untouched")
	assert.Equal(t, "127.0.0.1:"+itoa(s.pods[1].port), reqs[0].Header.Get(destHeader))
	assert.Equal(t, uint64(20), s.stat("wasm_epp.requests.routed"))
	// At most once per VM that served (2 workers: its tick's re-read, or
	// the first request of a VM that had served none), never per request.
	assert.LessOrEqual(t, s.stat("wasm_epp.snapshot.decodes"), decodes+2)
}

func TestTrafficSplitAndRewrite(t *testing.T) {
	s := startStack(t, routerConfig, 2)
	s.setPods(podState{max: 4}, podState{max: 4})
	const n = 400
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		r := s.post("/v1/completions", `{"model": "sql", "prompt": "select 1"}`)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	}
	for _, p := range s.pods {
		for _, req := range p.requests() {
			m := model(t, req.Body)
			counts[m]++
			assert.Equal(t, `{"model": "`+m+`", "prompt": "select 1"}`, string(req.Body), "only the model token changed")
			assert.Empty(t, req.Header.Get("Content-Length"), "Content-Length removed: the body was rewritten")
			assert.Equal(t, int64(-1), req.ContentLength, "sent chunked")
		}
	}
	require.Equal(t, n, counts["sql-v1"]+counts["sql-v2"], "%v", counts)
	// 80/20 over 400 draws: the standard deviation is 2%.
	assert.InDelta(t, 0.8, float64(counts["sql-v1"])/n, 0.07, "%v", counts)
}

func TestSheddingAnswers429(t *testing.T) {
	s := startStack(t, routerConfig, 2)
	s.setPods(podState{waiting: 50, kv: 0.95}, podState{waiting: 30, kv: 0.9})
	r := s.post("/v1/completions", `{"model":"batch","prompt":"x"}`)
	assert.Equal(t, http.StatusTooManyRequests, r.status)
	_, typ, code := r.errorJSON(t)
	assert.Equal(t, "rate_limit_error", typ)
	assert.Equal(t, "capacity_exhausted", code)
	r = s.post("/v1/completions", `{"model":"base","prompt":"x"}`)
	assert.Equal(t, http.StatusOK, r.status, "critical requests are never shed")
	assert.Equal(t, uint64(1), s.stat("wasm_epp.requests.dropped"))
	assert.Equal(t, uint64(1), s.stat("wasm_epp.path.sheddable.no-capacity"))
}

func TestStaleEndpointsAreExcluded(t *testing.T) {
	s := startStack(t, routerConfig, 2)
	s.setPods(podState{age: 10 * time.Second}, podState{waiting: 4, age: 50 * time.Millisecond})
	for i := 0; i < 10; i++ {
		r := s.post("/v1/chat/completions", chat("base"))
		require.Equal(t, http.StatusOK, r.status)
		assert.Equal(t, "pod-1", r.pod, "the idle but stale pod-0 is never chosen")
	}
}

func TestAllStale(t *testing.T) {
	stale := []podState{{age: time.Minute}, {age: time.Minute}, {age: time.Minute}}
	t.Run("fail-open by default", func(t *testing.T) {
		s := startStack(t, routerConfig, 3)
		s.setPods(stale...)
		seen := map[string]int{}
		for i := 0; i < 60; i++ {
			r := s.post("/v1/chat/completions", chat("chat"))
			require.Equal(t, http.StatusOK, r.status, "%s", r.body)
			seen[r.pod]++
		}
		assert.Len(t, seen, 3, "random over the last-known endpoints: %v", seen)
		assert.Equal(t, uint64(60), s.stat("wasm_epp.requests.fail_open"))
		assert.NotEmpty(t, s.logs.Find("failing open"), "logged at warn")
	})
	t.Run("reject", func(t *testing.T) {
		s := startStack(t, `{"whenNoFreshEndpoint": "reject", "models": [{"name": "chat"}]}`, 2)
		s.setPods(stale[:2]...)
		r := s.post("/v1/chat/completions", chat("chat"))
		assert.Equal(t, http.StatusServiceUnavailable, r.status)
		_, typ, code := r.errorJSON(t)
		assert.Equal(t, "service_unavailable", typ)
		assert.Equal(t, "no_endpoint", code)
	})
	t.Run("staleness follows the clock", func(t *testing.T) {
		s := startStack(t, `{"whenNoFreshEndpoint": "reject", "models": [{"name": "chat"}]}`, 1)
		s.setPods(podState{})
		assert.Equal(t, http.StatusOK, s.post("/v1/chat/completions", chat("chat")).status)
		s.clock.Advance(3 * time.Second) // no push for longer than staleAfter (2 s)
		assert.Equal(t, http.StatusServiceUnavailable, s.post("/v1/chat/completions", chat("chat")).status)
	})
}

func TestRequestWithoutBody(t *testing.T) {
	s := startStack(t, routerConfig, 3)
	s.setPods(podState{waiting: 5, running: 10}, podState{running: 1}, podState{age: time.Hour})
	r := s.get("/v1/models")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "pod-1", r.pod, "the least-loaded fresh pod")
	assert.Equal(t, uint64(1), s.stat("wasm_epp.path.least-loaded"))
}

func TestBodyInManySmallChunks(t *testing.T) {
	s := startStack(t, routerConfig, 2)
	s.setPods(podState{max: 4}, podState{max: 4})
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("word ", 40) + `"}],"stream":false,"model":"sql"}`
	var chunks []string
	for i := 0; i < len(body); i += 7 {
		chunks = append(chunks, body[i:min(i+7, len(body))])
	}
	r := s.chunkedPost("/v1/chat/completions", chunks, time.Millisecond)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	got := s.podByName(r.pod).requests()
	require.Len(t, got, 1)
	m := model(t, got[0].Body)
	assert.Contains(t, []string{"sql-v1", "sql-v2"}, m)
	assert.Equal(t, strings.Replace(body, `"sql"`, `"`+m+`"`, 1), string(got[0].Body), "as if it came whole")
}

func TestContentLengthKeptWithoutRewrites(t *testing.T) {
	s := startStack(t, `{"models": [{"name": "base"}]}`, 1)
	s.setPods(podState{})
	body := chat("base")
	r := s.post("/v1/chat/completions", body)
	require.Equal(t, http.StatusOK, r.status)
	req := s.pods[0].requests()[0]
	assert.Equal(t, int64(len(body)), req.ContentLength)
	assert.Equal(t, body, string(req.Body))
}

func TestInvalidConfigurationIsRejectedAtLoad(t *testing.T) {
	for _, tc := range []struct{ cfg, field string }{
		{`{"models": [{"name": "a", "criticality": "urgent"}]}`, "models[0].criticality"},
		{`{"scheduler": {"profile": "fastest"}}`, "scheduler.profile"},
		{`{"maxBodyBytes": "big"}`, "maxBodyBytes"},
	} {
		_, err := tryStartStack(t, plugin(t), tc.cfg, 0)
		require.Error(t, err, tc.cfg)
	}
}

func TestReceiverNeedsItsToken(t *testing.T) {
	_, err := tryStartStack(t, plugin(t), routerConfig, 0, func(c *envoyHostConfig) {
		for i := range c.Listeners {
			c.Listeners[i].Plugin.VM.EnvironmentVariables = nil
		}
	})
	require.Error(t, err, "the receiver must not start without its token")
}
