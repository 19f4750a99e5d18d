package envoyhost

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withRoutes replaces the harness's single route with a route table: /up/
// goes to the ORIGINAL_DST cluster, anything else gets a 404 direct
// response with a JSON body, as envoy/envoy.yaml has it.
func withRoutes() harnessOpt {
	return func(c *Config, _ *PluginConfig) {
		l := &c.Listeners[0]
		l.Cluster = ""
		l.VirtualHosts = []VirtualHostConfig{{Name: "v", Domains: []string{"*"}, Routes: []RouteConfig{
			{Name: "up", Prefix: "/up/", Cluster: "original_dst"},
			{Name: "rest", Prefix: "/", DirectResponse: &DirectResponse{Status: 404, Body: `{"error":"not found"}`},
				ResponseHeadersToAdd: []Pair{{"content-type", "application/json"}}},
		}}}
	}
}

// A route with direct_response is answered by the router filter (envoy
// source/common/router/router.cc Filter::decodeHeaders: sendLocalReply with
// details "direct_response"): the filter chain ran, and the reply goes
// through the Wasm filter's response callbacks, where the stream has no
// upstream. A proxied response instead has details "via_upstream" (set with
// the response code before the encoder filters run, router.cc
// onUpstreamHeaders) and the upstream host's address.
func TestDirectResponseThroughTheFilter(t *testing.T) {
	h := newHarness(t, testPluginPkg, withRoutes())
	props := "response.code_details,response.code,upstream.address,xds.route_name"

	resp, body := h.do("POST", "/other", "{}", map[string]string{"X-Tp-Resp-Property": props})
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	assert.Equal(t, `{"error":"not found"}`, body)
	assert.Equal(t, []string{"application/json"}, resp.Header.Values("Content-Type"), "response_headers_to_add, no text/plain")
	assert.NotEmpty(t, resp.Header.Get("X-Tp-Vm-Nonce"), "on_response_headers ran")
	assert.Equal(t, "direct_response", resp.Header.Get("X-Tp-Resp-Property-Response.code_details"))
	assert.Equal(t, "not_found", resp.Header.Get("X-Tp-Resp-Property-Upstream.address"), "no upstream host")
	assert.Equal(t, "rest", resp.Header.Get("X-Tp-Resp-Property-Xds.route_name"))
	assert.Empty(t, h.up.requests(), "the route table answered: nothing went upstream")

	resp, body = h.do("POST", "/up/x", "{}", map[string]string{"X-Tp-Resp-Property": props})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "via_upstream", resp.Header.Get("X-Tp-Resp-Property-Response.code_details"))
	assert.Equal(t, "int:200", resp.Header.Get("X-Tp-Resp-Property-Response.code"))
	assert.Equal(t, h.up.addr(), resp.Header.Get("X-Tp-Resp-Property-Upstream.address"))
	assert.Equal(t, "up", resp.Header.Get("X-Tp-Resp-Property-Xds.route_name"))
	require.Len(t, h.up.requests(), 1)
	assert.True(t, strings.HasPrefix(h.up.last(t).Path, "/up/"))
}
