package filtertest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
	"github.com/wasm-epp/wasm-epp/e2e/internal/h2c"
)

// withRouteTable gives the router listener envoy/envoy.yaml's route table:
// /v1/ goes to the pods, anything else is a 404 direct_response.
func withRouteTable(c *envoyhost.Config) {
	l := &c.Listeners[0]
	l.Cluster = ""
	l.VirtualHosts = []envoyhost.VirtualHostConfig{{Name: "inference", Domains: []string{"*"}, Routes: []envoyhost.RouteConfig{
		{Name: "v1", Prefix: "/v1/", Cluster: "pods", Timeout: -1},
		{Name: "rest", Prefix: "/", DirectResponse: &envoyhost.DirectResponse{Status: 404, Body: `{"error":{"message":"not found"}}`},
			ResponseHeadersToAdd: []envoyhost.Pair{{Key: "content-type", Value: "application/json"}}},
	}}}
}

// requestCount is every wasm_epp.requests.<outcome> counter summed: each
// request counts exactly once.
func (s *stack) requestCount() uint64 {
	var n uint64
	for _, o := range []string{"routed", "fail_open", "direct_response", "dropped", "bad_request",
		"unknown_model", "too_large", "no_endpoint", "internal_error"} {
		n += s.stat("wasm_epp.requests." + o)
	}
	return n
}

// A request the route table answers itself (POST /other: 404
// direct_response) passed the plugin, which chose an endpoint, but never
// went upstream: it carries no served-by header and counts as
// direct_response, not routed.
func TestRouteTableAnswerIsNotRouted(t *testing.T) {
	s := startStack(t, routerConfig, 2, withRouteTable)
	s.setPods(podState{max: 4}, podState{max: 4})

	r := s.post("/other", chat("base"))
	assert.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
	assert.Equal(t, `{"error":{"message":"not found"}}`, string(r.body))
	assert.Empty(t, r.header.Values("x-served-by"), "no replica served it")
	assert.Empty(t, r.pod)
	assert.Equal(t, uint64(0), s.stat("wasm_epp.requests.routed"))
	assert.Equal(t, uint64(1), s.stat("wasm_epp.requests.direct_response"))
	assert.Equal(t, "direct_response", s.routerAccessFor("/other").Details)

	r = s.get("/other")
	assert.Equal(t, http.StatusNotFound, r.status)
	assert.Empty(t, r.header.Values("x-served-by"))
	assert.Equal(t, uint64(2), s.stat("wasm_epp.requests.direct_response"))

	r = s.post("/v1/completions", `{"model":"base","prompt":"x"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "llm/"+r.pod, r.header.Get("x-served-by"))
	assert.Equal(t, uint64(1), s.stat("wasm_epp.requests.routed"))
	assert.Equal(t, uint64(3), s.requestCount(), "each request counted once")
}

// A request whose upstream fails before answering went upstream (routed)
// but was not served by the replica: no served-by header.
func TestUpstreamFailureIsRoutedWithoutServedBy(t *testing.T) {
	s := startStack(t, routerConfig, 1)
	s.setPods(podState{max: 4})
	s.pods[0].srv.Close() // the pod is gone; the snapshot still has it
	r := s.post("/v1/completions", `{"model":"base","prompt":"x"}`)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Empty(t, r.header.Values("x-served-by"))
	assert.Equal(t, uint64(1), s.stat("wasm_epp.requests.routed"))
	assert.Equal(t, uint64(1), s.requestCount())
}

var h2cClient = h2c.Client(20 * time.Second)

// h2Post sends body over HTTP/2 in pieces, with trailers when given.
func (s *stack) h2Post(path string, trailers http.Header, pieces ...string) reply {
	s.t.Helper()
	req, err := http.NewRequest("POST", s.router+path, h2c.PiecewiseBody(5*time.Millisecond, pieces...))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Trailer = trailers
	resp, err := h2cClient.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	require.Equal(s.t, 2, resp.ProtoMajor)
	return reply{status: resp.StatusCode, header: resp.Header, body: body, pod: resp.Header.Get("X-Pod")}
}

// An HTTP/2 request with trailers ends in on_request_trailers, its last
// body callback without end_of_stream. Envoy keeps the buffered body
// readable there and the request headers writable, so it is routed like
// any other request, model rewrite included.
func TestRoutesHTTP2RequestsWithTrailers(t *testing.T) {
	s := startStack(t, routerConfig, 2)
	s.setPods(podState{max: 4}, podState{max: 4})
	trailers := http.Header{"X-Checksum": {"abc"}}

	body := chat("base")
	r := s.h2Post("/v1/chat/completions", trailers, body[:10], body[10:])
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.NotEmpty(t, r.pod)
	assert.Equal(t, "llm/"+r.pod, r.header.Get("x-served-by"))
	got := s.podByName(r.pod).requests()
	assert.Equal(t, body, string(got[len(got)-1].Body))
	assert.NotEmpty(t, got[len(got)-1].Header.Get(destHeader))

	// The model rewrite happens in on_request_trailers too.
	r = s.h2Post("/v1/completions", trailers, `{"model": "sql", `, `"prompt": "select 1"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	got = s.podByName(r.pod).requests()
	sent := string(got[len(got)-1].Body)
	assert.True(t, strings.HasPrefix(sent, `{"model": "sql-v`), sent)

	// Bad input is still refused, from the trailers callback.
	r = s.h2Post("/v1/completions", trailers, `{"prompt": "x"}`)
	assert.Equal(t, http.StatusBadRequest, r.status)
	_, _, code := r.errorJSON(t)
	assert.Equal(t, "missing_model", code)

	// And HTTP/2 without trailers, for completeness.
	r = s.h2Post("/v1/chat/completions", nil, body)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, uint64(3), s.stat("wasm_epp.requests.routed"))
	assert.Equal(t, uint64(4), s.requestCount())
}
