package filter

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

const servedByConfig = `{"servedByHeader": "x-served-by", "models": [{"name": "base"}]}`

// envWithDetails runs the router on a host whose response code details
// (the property response.code_details) are details for every stream.
func envWithDetails(t *testing.T, details string) *env {
	t.Helper()
	e, status := startEnvWith(t, servedByConfig, Options{}, func(o *proxytest.EmulatorOption) *proxytest.EmulatorOption {
		return o.WithProperty([]string{"response", "code_details"}, []byte(details))
	})
	require.Equal(t, types.OnPluginStartStatusOK, status)
	return e
}

func servedBy(e *env, id uint32) string {
	for _, h := range e.host.GetCurrentResponseHeaders(id) {
		if h[0] == "x-served-by" {
			return h[1]
		}
	}
	return ""
}

// Where the response of a forwarded request comes from decides its count
// and the served-by header.
func TestForwardedRequestCountedByResponseSource(t *testing.T) {
	cases := []struct {
		details, counter string
		servedBy         bool
	}{
		{"via_upstream", "routed", true},
		{"direct_response", "direct_response", false},
		{"route_not_found", "direct_response", false},
		{"upstream_reset_before_response_started{connection_failure}", "routed", false},
	}
	for _, tc := range cases {
		t.Run(tc.details, func(t *testing.T) {
			e := envWithDetails(t, tc.details)
			e.setPods(pod{name: "pod-7"})
			r := e.post("/v1/chat/completions", nil, chat("base"))
			require.Equal(t, types.ActionContinue, r.action)
			assert.Equal(t, uint64(1), e.counter("wasm_epp.requests."+tc.counter))
			total := e.counter("wasm_epp.requests.routed") + e.counter("wasm_epp.requests.direct_response")
			assert.Equal(t, uint64(1), total, "counted once")
			if tc.servedBy {
				assert.Equal(t, "llm/pod-7", servedBy(e, r.id))
			} else {
				assert.Empty(t, servedBy(e, r.id))
			}
			// A second response-headers call (there is none in Envoy) counts nothing more.
			e.host.CallOnResponseHeaders(r.id, [][2]string{{":status", "200"}}, false)
			assert.Equal(t, uint64(1), e.counter("wasm_epp.requests."+tc.counter))
		})
	}
}

// A forwarded request whose client goes away before any response counts
// as forwarded when the stream ends (proxy_on_log).
func TestForwardedRequestWithoutResponseCountedAtLog(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a"})
	id := e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gw"}}, false)
	require.Equal(t, types.ActionContinue, e.host.CallOnRequestBody(id, []byte(chat("base")), true))
	assert.Equal(t, uint64(0), e.counter("wasm_epp.requests.routed"), "not yet: no response")
	e.host.CompleteHttpContext(id)
	assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.routed"))
}

// A request with trailers is routed in on_request_trailers on the body
// its body callbacks buffered.
func TestRoutesInRequestTrailers(t *testing.T) {
	e := newEnv(t, servedByConfig)
	e.setPods(pod{name: "a", addr: "10.0.0.9", port: 8001})
	id := e.host.InitializeHttpContext()
	hdrs := [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gw"}}
	require.Equal(t, types.ActionPause, e.host.CallOnRequestHeaders(id, hdrs, false))
	body := chat("base")
	require.Equal(t, types.ActionPause, e.host.CallOnRequestBody(id, []byte(body[:7]), false))
	require.Equal(t, types.ActionPause, e.host.CallOnRequestBody(id, []byte(body[7:]), false))
	require.Equal(t, types.ActionContinue, e.host.CallOnRequestTrailers(id, [][2]string{{"x-checksum", "1"}}))
	assert.Nil(t, e.host.GetSentLocalResponse(id))
	assert.Contains(t, e.host.GetCurrentRequestHeaders(id), [2]string{"x-gateway-destination-endpoint", "10.0.0.9:8001"})

	// Headers then trailers, no body: a POST without a body.
	id = e.host.InitializeHttpContext()
	e.host.CallOnRequestHeaders(id, hdrs, false)
	e.host.CallOnRequestTrailers(id, nil)
	local := e.host.GetSentLocalResponse(id)
	require.NotNil(t, local)
	assert.Equal(t, uint32(400), local.StatusCode)
}
