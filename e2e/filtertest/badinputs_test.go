package filtertest

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// TestBadInputRequests sends every bad request we know of (rows 1-16,
// numbered as in plugin/internal/filter's parser tests) through the real
// module: status, the JSON error body, the access log's response code
// details, and shared data left exactly as the last push wrote it.
func TestBadInputRequests(t *testing.T) {
	s := startStack(t, routerConfig, 2, func(c *envoyhost.Config) { c.AdminAddress = "127.0.0.1:0" })
	s.setPods(podState{max: 4}, podState{max: 4})
	snap, snapCas, ver, verCas := s.shared()
	require.NotEmpty(t, snap)
	require.NotEmpty(t, ver)

	type row struct {
		name    string
		method  string
		body    *string // nil: no body at all
		headers []string
		status  int
		typ     string
		code    string
		details string
	}
	str := func(s string) *string { return &s }
	bad := func(name, body, code string) row {
		return row{name, "POST", str(body), nil, 400, "invalid_request_error", code, "wasm_epp_bad_request"}
	}
	rows := []row{
		{"1 POST without a body", "POST", nil, nil, 400, "invalid_request_error", "empty_body", "wasm_epp_bad_request"},
		bad("1 POST with an empty body (content-length 0)", "", "empty_body"),
		bad("2 not JSON", "hello", "invalid_json"),
		bad("3 truncated JSON", `{"model":"base"`, "invalid_json"),
		bad("4 two objects", `{"model":"base"}{"model":"base"}`, "trailing_data"),
		bad("4 trailing garbage", `{"model":"base"} xyz`, "trailing_data"),
		bad("5 no model", `{"prompt":"x"}`, "missing_model"),
		bad("6 model is a number", `{"model":123}`, "model_not_a_string"),
		bad("6 model is null", `{"model":null}`, "model_not_a_string"),
		bad("6 model is an array", `{"model":["base"]}`, "model_not_a_string"),
		bad("6 model is an object", `{"model":{"name":"base"}}`, "model_not_a_string"),
		bad("7 model twice", `{"model":"base","model":"batch"}`, "duplicate_key"),
		bad("7 model twice, escaped", `{"model":"base","mod\u0065l":"batch"}`, "duplicate_key"),
		{"8 unknown model", "POST", str(`{"model":"gpt-evil","prompt":"x"}`), nil, 404, "invalid_request_error", "model_not_found", "wasm_epp_unknown_model"},
		bad("9 model too long", `{"model":"`+strings.Repeat("m", 257)+`"}`, "model_too_long"),
		bad("9 model with control characters", `{"model":"evil\u0007\r\nx-injected: 1"}`, "invalid_model_name"),
		{"10 body over the limit (content-length)", "POST", str(`{"model":"base","prompt":"` + strings.Repeat("x", 1<<20) + `"}`), nil, 413, "invalid_request_error", "request_too_large", "wasm_epp_too_large"},
		bad("12 top-level array", `[{"model":"base"}]`, "not_an_object"),
		bad("12 top-level string", `"base"`, "not_an_object"),
		bad("12 top-level number", `42`, "not_an_object"),
	}
	for i, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/completions?case=" + strconv.Itoa(i)
			var body io.Reader
			if tc.body != nil {
				body = strings.NewReader(*tc.body)
			}
			req, err := http.NewRequest(tc.method, s.router+path, body)
			require.NoError(t, err)
			if tc.body != nil {
				req.ContentLength = int64(len(*tc.body)) // also for "": an explicit 0
			}
			r := s.send(req)
			assert.Equal(t, tc.status, r.status, "%s", r.body)
			msg, typ, code := r.errorJSON(t)
			assert.Equal(t, tc.typ, typ)
			assert.Equal(t, tc.code, code)
			assert.NotEmpty(t, msg)
			assert.Empty(t, r.pod, "nothing reached a pod")
			assert.Empty(t, r.header.Get("x-injected"))
			assert.Equal(t, tc.details, s.routerAccessFor(path).Details)
		})
	}

	t.Run("9 the bad model never reaches logs or stats unescaped", func(t *testing.T) {
		for _, rec := range s.logs.Records() {
			assert.NotContains(t, rec.String(), "\x07", "log line %q", rec.String())
			assert.NotContains(t, rec.String(), "\r\nx-injected")
		}
		resp, err := http.Get("http://" + s.host.AdminAddr() + "/stats")
		require.NoError(t, err)
		stats, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Contains(t, string(stats), "wasm_epp.requests.bad_request")
		assert.NotContains(t, string(stats), "evil", "no stat is named after a model")
	})

	t.Run("10 chunked body over the default limit", func(t *testing.T) {
		big := `{"model":"base","prompt":"` + strings.Repeat("y", 1<<20) + `"}`
		var chunks []string
		for i := 0; i < len(big); i += 64 << 10 {
			chunks = append(chunks, big[i:min(i+64<<10, len(big))])
		}
		r := s.chunkedPost("/v1/completions", chunks, 0)
		// maxBodyBytes defaults to Envoy's buffer limit (1 MiB); whichever
		// trips first, the answer is 413 and nothing is routed.
		assert.Equal(t, http.StatusRequestEntityTooLarge, r.status, "%s", r.body)
		assert.Empty(t, r.pod)
	})

	t.Run("11 body in many small chunks, model last", func(t *testing.T) {
		body := `{"prompt":"` + strings.Repeat("z", 200) + `","model":"base"}`
		var chunks []string
		for i := 0; i < len(body); i += 5 {
			chunks = append(chunks, body[i:min(i+5, len(body))])
		}
		r := s.chunkedPost("/v1/completions", chunks, time.Millisecond)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		got := s.podByName(r.pod).requests()
		assert.Equal(t, body, string(got[len(got)-1].Body))
	})

	t.Run("13 GET /v1/models", func(t *testing.T) {
		r := s.get("/v1/models")
		assert.Equal(t, http.StatusOK, r.status)
		assert.NotEmpty(t, r.pod)
	})

	t.Run("14 client-supplied destination", func(t *testing.T) {
		decoy := newPod(t, "decoy") // listening, but not in the snapshot
		for _, h := range []string{destHeader, "x-envoy-original-dst-host"} {
			r := s.post("/v1/completions", `{"model":"base","prompt":"x"}`, h, decoy.addr())
			assert.Equal(t, http.StatusOK, r.status)
			assert.Contains(t, []string{"pod-0", "pod-1"}, r.pod)
			r = s.get("/v1/models", h, decoy.addr())
			assert.Equal(t, http.StatusOK, r.status)
		}
		r := s.post("/v1/completions", `{"model":"nope"}`, destHeader, decoy.addr())
		assert.Equal(t, http.StatusNotFound, r.status, "a refused request is not routed to the client's choice either")
		assert.Empty(t, decoy.requests(), "the decoy never saw a request")
	})

	snap2, snapCas2, ver2, verCas2 := s.shared()
	assert.True(t, bytes.Equal(snap, snap2), "snapshot unchanged")
	assert.Equal(t, snapCas, snapCas2)
	assert.True(t, bytes.Equal(ver, ver2), "version unchanged")
	assert.Equal(t, verCas, verCas2)
}

func TestBadInputUnknownModelPassthrough(t *testing.T) {
	s := startStack(t, `{"unknownModels": "passthrough"}`, 1)
	s.setPods(podState{})
	body := `{"model":"not-configured","prompt":"x"}`
	r := s.post("/v1/completions", body)
	require.Equal(t, http.StatusOK, r.status, "row 8 with pass-through configured")
	assert.Equal(t, body, string(s.pods[0].requests()[0].Body), "unchanged")
}

// TestBadInputFreshness covers rows 15 and 16 and checks that the router
// never writes shared data.
func TestBadInputFreshness(t *testing.T) {
	t.Run("15 every endpoint stale: fail open, counted", func(t *testing.T) {
		s := startStack(t, routerConfig, 2)
		s.setPods(podState{age: time.Hour}, podState{age: time.Hour})
		snap, cas, _, _ := s.shared()
		for i := 0; i < 10; i++ {
			r := s.post("/v1/completions", `{"model":"chat","prompt":"x"}`)
			require.Equal(t, http.StatusOK, r.status)
		}
		assert.Equal(t, uint64(10), s.stat("wasm_epp.requests.fail_open"))
		snap2, cas2, _, _ := s.shared()
		assert.Equal(t, snap, snap2)
		assert.Equal(t, cas, cas2)
	})
	t.Run("15 every endpoint stale: reject configured", func(t *testing.T) {
		s := startStack(t, `{"whenNoFreshEndpoint": "reject", "models": [{"name": "chat"}]}`, 1)
		s.setPods(podState{age: time.Hour})
		r := s.post("/v1/completions", `{"model":"chat","prompt":"x"}`)
		assert.Equal(t, http.StatusServiceUnavailable, r.status)
		_, _, code := r.errorJSON(t)
		assert.Equal(t, "no_endpoint", code)
	})
	t.Run("15 no endpoint known at all", func(t *testing.T) {
		s := startStack(t, routerConfig, 0)
		for _, r := range []reply{s.post("/v1/completions?no-endpoint", `{"model":"chat","prompt":"x"}`), s.get("/v1/models")} {
			assert.Equal(t, http.StatusServiceUnavailable, r.status)
			msg, typ, code := r.errorJSON(t)
			assert.Equal(t, "service_unavailable", typ)
			assert.Equal(t, "no_endpoint", code)
			assert.NotEmpty(t, msg)
		}
		// The receiver created the keys empty at its start; nothing since.
		dir, _, found := s.host.SharedData(vmID, versionKey)
		require.True(t, found)
		var d wire.Directory
		require.NoError(t, wire.DecodeDirectory(dir, &d))
		assert.Equal(t, wire.Directory{}, d, "the router wrote nothing")
		assert.Equal(t, "wasm_epp_no_endpoint", s.routerAccessFor("/v1/completions?no-endpoint").Details)
	})
	t.Run("16 sheddable, every endpoint saturated", func(t *testing.T) {
		s := startStack(t, routerConfig, 2)
		s.setPods(podState{waiting: 100, kv: 0.99}, podState{waiting: 100, kv: 0.99})
		r := s.post("/v1/completions", `{"model":"batch","prompt":"x"}`)
		assert.Equal(t, http.StatusTooManyRequests, r.status)
		msg, typ, code := r.errorJSON(t)
		assert.Equal(t, "rate_limit_error", typ)
		assert.Equal(t, "capacity_exhausted", code)
		assert.Contains(t, msg, "sheddable")
		assert.Equal(t, "wasm_epp_dropped", s.routerAccessFor("/v1/completions").Details)
		assert.Equal(t, uint64(0), s.stat("wasm_epp.requests.routed"))
	})
}
