//go:build !wasip1

package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// These tests run the test plugin natively under the SDK's proxytest
// emulator, through the binding's forwarding build: they prove the forwarding
// works and pin the plugin's contract. The same plugin built for wasip1 is
// exercised through the real ABI by e2e/envoyhost and by wasm_test.go.

func newHost(t *testing.T, opt *proxytest.EmulatorOption) proxytest.HostEmulator {
	t.Helper()
	host, reset := proxytest.NewHostEmulator(opt.WithVMContext(&vmContext{}))
	t.Cleanup(reset)
	require.Equal(t, types.OnVMStartStatusOK, host.StartVM())
	return host
}

func startedHost(t *testing.T, config string) proxytest.HostEmulator {
	t.Helper()
	host := newHost(t, proxytest.NewEmulatorOption().WithPluginConfiguration([]byte(config)))
	require.Equal(t, types.OnPluginStartStatusOK, host.StartPlugin())
	return host
}

func get(path string, extra ...[2]string) [][2]string {
	return append([][2]string{{":method", "GET"}, {":path", path}, {":authority", "test"}}, extra...)
}

func TestConfigure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string
		want   types.OnPluginStartStatus
	}{
		{"empty", "", types.OnPluginStartStatusOK},
		{"object", `{"tick_period_ms": 10}`, types.OnPluginStartStatusOK},
		{"fail", `{"fail_configure": true}`, types.OnPluginStartStatusFailed},
		{"unknown field", `{"nope": 1}`, types.OnPluginStartStatusFailed},
		{"bad json", `{`, types.OnPluginStartStatusFailed},
		{"trailing", `{} {}`, types.OnPluginStartStatusFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newHost(t, proxytest.NewEmulatorOption().WithPluginConfiguration([]byte(tc.config)))
			assert.Equal(t, tc.want, host.StartPlugin())
		})
	}
}

func TestPanicInConfigure(t *testing.T) {
	host := newHost(t, proxytest.NewEmulatorOption().WithPluginConfiguration([]byte(`{"panic_in_configure": true}`)))
	assert.Panics(t, func() { host.StartPlugin() })
}

func TestVMStart(t *testing.T) {
	for _, tc := range []struct {
		vmConfig string
		want     types.OnVMStartStatus
	}{
		{"", types.OnVMStartStatusOK},
		{"hello", types.OnVMStartStatusOK},
		{"fail-vm-start", types.OnVMStartStatusFailed},
	} {
		host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
			WithVMContext(&vmContext{}).WithVMConfiguration([]byte(tc.vmConfig)))
		assert.Equal(t, tc.want, host.StartVM(), tc.vmConfig)
		reset()
	}
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
		WithVMContext(&vmContext{}).WithVMConfiguration([]byte("panic-vm-start")))
	defer reset()
	assert.Panics(t, func() { host.StartVM() })
}

func TestHeaderEditsReachUpstream(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	action := host.CallOnRequestHeaders(id, get("/x",
		[2]string{"x-tp-add", "added=1"},
		[2]string{"x-tp-replace", ":authority=replaced"},
		[2]string{"x-tp-remove", "gone"},
		[2]string{"gone", "yes"},
		[2]string{"x-tp-set-pairs", "paired=2"},
		[2]string{"x-tp-get", "x-tp-add"},
	), true)
	assert.Equal(t, types.ActionContinue, action)
	headers := host.GetCurrentRequestHeaders(id)
	assert.Contains(t, headers, [2]string{"added", "1"})
	assert.Contains(t, headers, [2]string{":authority", "replaced"})
	assert.Contains(t, headers, [2]string{"paired", "2"})
	assert.NotContains(t, headers, [2]string{"gone", "yes"})
	assert.Nil(t, host.GetSentLocalResponse(id))

	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	resp := host.GetCurrentResponseHeaders(id)
	assert.Contains(t, resp, [2]string{"x-tp-got", "added=1"})
	assert.Contains(t, resp, [2]string{"x-tp-vm-requests", "1"})
	assert.Contains(t, resp, [2]string{"x-tp-resp-headers-count", "1"})
	assert.Contains(t, resp, [2]string{"x-tp-req-body-calls", ""})
	host.CompleteHttpContext(id)
	assert.Contains(t, host.GetInfoLogs(), "testplugin log: path=/x status=200")
}

func TestGetMissingHeader(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, get("/x", [2]string{"x-tp-get", "absent"}), true)
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	assert.Contains(t, host.GetCurrentResponseHeaders(id), [2]string{"x-tp-got-error", "not_found"})
}

func TestRequestBodyModes(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		wantBody string
	}{
		{"buffer", "hello world"},
		{"replace:new", "new"},
		{"append:!", "hello world!"},
		{"prepend:>", ">hello world"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			host := startedHost(t, "")
			id := host.InitializeHttpContext()
			assert.Equal(t, types.ActionContinue, host.CallOnRequestHeaders(id, get("/b",
				[2]string{"x-tp-body", tc.mode}, [2]string{"content-length", "11"}), false))
			assert.Equal(t, types.ActionPause, host.CallOnRequestBody(id, []byte("hello "), false))
			assert.Equal(t, types.ActionContinue, host.CallOnRequestBody(id, []byte("world"), true))
			assert.Equal(t, tc.wantBody, string(host.GetCurrentRequestBody(id)))
			headers := host.GetCurrentRequestHeaders(id)
			assert.Contains(t, headers, [2]string{"x-tp-body-seen", "11"})
			if mutates(tc.mode) {
				assert.NotContains(t, headers, [2]string{"content-length", "11"})
			} else {
				assert.Contains(t, headers, [2]string{"content-length", "11"})
			}
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, true)
			resp := host.GetCurrentResponseHeaders(id)
			// proxytest appends each chunk to the body it reports, so
			// the sizes are cumulative like Envoy's buffered body_size.
			assert.Contains(t, resp, [2]string{"x-tp-req-body-calls", "6:false,11:true"})
			assert.Contains(t, resp, [2]string{"x-tp-req-body-len", "11"})
			assert.Contains(t, resp, [2]string{"x-tp-req-header-after-body", "ok"})
		})
	}
}

func TestRequestBodyEcho(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, get("/b", [2]string{"x-tp-body", "echo"}), false)
	assert.Equal(t, types.ActionPause, host.CallOnRequestBody(id, []byte("ping"), true))
	resp := host.GetSentLocalResponse(id)
	require.NotNil(t, resp)
	assert.Equal(t, uint32(200), resp.StatusCode)
	assert.Equal(t, "ping", string(resp.Data))
}

func TestPauseOnHeaders(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	assert.Equal(t, types.ActionPause, host.CallOnRequestHeaders(id, get("/p", [2]string{"x-tp-headers-action", "pause"}), false))
	id2 := host.InitializeHttpContext()
	assert.Equal(t, types.ActionContinue, host.CallOnRequestHeaders(id2, get("/p", [2]string{"x-tp-headers-action", "pause"}), true),
		"no body: nothing would resume the stream")
}

func TestLocalReplyFromHeaders(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	action := host.CallOnRequestHeaders(id, get("/x",
		[2]string{"x-tp-local-reply", "418"}, [2]string{"x-tp-local-reply-body", "teapot"},
		[2]string{"x-tp-local-reply-header", "x-why=because"}, [2]string{"x-tp-local-reply-grpc", "3"}), true)
	assert.Equal(t, types.ActionPause, action)
	resp := host.GetSentLocalResponse(id)
	require.NotNil(t, resp)
	assert.Equal(t, uint32(418), resp.StatusCode)
	assert.Equal(t, "teapot", string(resp.Data))
	assert.Equal(t, [][2]string{{"x-why", "because"}}, resp.Headers)
	assert.Equal(t, int32(3), resp.GRPCStatus)
}

// localReply sends a GET for path and returns the local reply.
func localReply(t *testing.T, host proxytest.HostEmulator, path string, extra ...[2]string) *proxytest.LocalHttpResponse {
	t.Helper()
	id := host.InitializeHttpContext()
	assert.Equal(t, types.ActionPause, host.CallOnRequestHeaders(id, get(path, extra...), true))
	resp := host.GetSentLocalResponse(id)
	require.NotNil(t, resp, path)
	return resp
}

func header(resp *proxytest.LocalHttpResponse, key string) string {
	return headerValue(resp.Headers, key)
}

func TestEchoEndpoint(t *testing.T) {
	host := startedHost(t, "")
	resp := localReply(t, host, "/tp/echo", [2]string{"x-tp-add", "k=v"})
	var got struct{ Headers [][2]string }
	require.NoError(t, json.Unmarshal(resp.Data, &got))
	assert.Contains(t, got.Headers, [2]string{"k", "v"})
	assert.Contains(t, got.Headers, [2]string{":path", "/tp/echo"})
}

func TestStartInfoAndConfig(t *testing.T) {
	host := startedHost(t, `{"tick_period_ms": 7}`)
	resp := localReply(t, host, "/tp/start-info")
	var info map[string]any
	require.NoError(t, json.Unmarshal(resp.Data, &info))
	assert.Equal(t, `{"tick_period_ms": 7}`, info["plugin_configuration"])
	assert.Equal(t, "trace", info["log_level"])
	assert.Len(t, info["vm_nonce"], 16)
	assert.EqualValues(t, proxytest.PluginContextID, info["root_context_id"])
	assert.Equal(t, uint32(7), host.GetTickPeriod())

	// proxytest serves the plugin configuration anywhere (Envoy: not_found).
	resp = localReply(t, host, "/tp/config")
	assert.Equal(t, uint32(200), resp.StatusCode)
	assert.Equal(t, `{"tick_period_ms": 7}`, string(resp.Data))
}

func TestSharedDataEndpoints(t *testing.T) {
	host := startedHost(t, "")
	resp := localReply(t, host, "/tp/shared/get?key=k")
	assert.Equal(t, uint32(404), resp.StatusCode)
	assert.Equal(t, "not_found", header(resp, "x-tp-error"))

	resp = localReply(t, host, "/tp/shared/set?key=k&value=v1")
	assert.Equal(t, uint32(200), resp.StatusCode)
	cas := header(resp, "x-tp-cas")
	require.NotEmpty(t, cas)

	resp = localReply(t, host, "/tp/shared/set?key=k&value=v2&cas=999")
	assert.Equal(t, uint32(409), resp.StatusCode)
	assert.Equal(t, "cas_mismatch", header(resp, "x-tp-error"))

	resp = localReply(t, host, "/tp/shared/set?key=k&value=v2&cas="+cas)
	assert.Equal(t, uint32(200), resp.StatusCode)

	resp = localReply(t, host, "/tp/shared/get?key=k")
	assert.Equal(t, uint32(200), resp.StatusCode)
	assert.Equal(t, "v2", string(resp.Data))

	for want := range []string{"1", "2", "3"} {
		resp = localReply(t, host, "/tp/shared/incr?key=n")
		assert.Equal(t, uint32(200), resp.StatusCode)
		assert.Equal(t, []string{"1", "2", "3"}[want], string(resp.Data))
	}
}

func TestPropertyEndpoints(t *testing.T) {
	host := newHost(t, proxytest.NewEmulatorOption().
		WithProperty([]string{"source", "address"}, []byte("10.0.0.1:1234")))
	require.Equal(t, types.OnPluginStartStatusOK, host.StartPlugin())

	resp := localReply(t, host, "/tp/property?path=source.address")
	assert.Equal(t, uint32(200), resp.StatusCode)
	assert.Equal(t, "10.0.0.1:1234", string(resp.Data))
	assert.Equal(t, "13", header(resp, "x-tp-property-len"))

	resp = localReply(t, host, "/tp/property?path=no.such")
	assert.Equal(t, uint32(404), resp.StatusCode)

	resp = localReply(t, host, "/tp/set-property?path=a.b&value=1")
	assert.Equal(t, uint32(200), resp.StatusCode)
	got, err := host.GetProperty([]string{"a", "b"})
	require.NoError(t, err)
	assert.Equal(t, "1", string(got))
}

func TestMetrics(t *testing.T) {
	host := startedHost(t, "")
	for range 3 {
		id := host.InitializeHttpContext()
		host.CallOnRequestHeaders(id, get("/m", [2]string{"x-tp-body", "buffer"}), false)
		host.CallOnRequestBody(id, []byte("12345"), true)
		host.CompleteHttpContext(id)
	}
	n, err := host.GetCounterMetric("testplugin_requests_total")
	require.NoError(t, err)
	assert.Equal(t, uint64(3), n)
	g, err := host.GetGaugeMetric("testplugin_active_streams")
	require.NoError(t, err)
	assert.Equal(t, uint64(0), g)
	hist, err := host.GetHistogramMetric("testplugin_request_body_bytes")
	require.NoError(t, err)
	assert.Equal(t, uint64(5), hist)

	resp := localReply(t, host, "/tp/metrics")
	var m map[string]int64
	require.NoError(t, json.Unmarshal(resp.Data, &m))
	assert.Equal(t, map[string]int64{"requests_total": 4, "active_streams": 1, "ticks_total": 0}, m)
}

func TestTicks(t *testing.T) {
	host := startedHost(t, `{"tick_period_ms": 5, "tick_stop_after": 2}`)
	assert.Equal(t, uint32(5), host.GetTickPeriod())
	host.Tick()
	host.Tick()
	assert.Equal(t, uint32(0), host.GetTickPeriod())
	n, err := host.GetCounterMetric("testplugin_ticks_total")
	require.NoError(t, err)
	assert.Equal(t, uint64(2), n)
	resp := localReply(t, host, "/tp/shared/get?key=testplugin/ticks")
	assert.Equal(t, "2", string(resp.Data))
}

func TestTickPanic(t *testing.T) {
	host := startedHost(t, `{"tick_period_ms": 5, "tick_panic_after": 2}`)
	host.Tick()
	assert.Panics(t, func() { host.Tick() })
}

func TestTickHTTPCall(t *testing.T) {
	host := startedHost(t, `{"tick_period_ms": 5, "tick_http_call_cluster": "backend", "tick_http_call_path": "/health"}`)
	host.Tick()
	callouts := host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	require.Len(t, callouts, 1)
	assert.Equal(t, "backend", callouts[0].Upstream)
	assert.Contains(t, callouts[0].Headers, [2]string{":path", "/health"})
	host.CallOnHttpCallResponse(callouts[0].CalloutID, [][2]string{{":status", "204"}}, nil, []byte("fine"))
	resp := localReply(t, host, "/tp/shared/get?key=testplugin/tick-call")
	assert.Equal(t, "204 fine", string(resp.Data))
}

func TestDelayDone(t *testing.T) {
	host := startedHost(t, `{"delay_done": true}`)
	assert.False(t, host.FinishVM())
	assert.Equal(t, uint32(1), host.GetTickPeriod())
	host.Tick()
	assert.Contains(t, host.GetInfoLogs(), "testplugin: plugin done")
}

func TestHTTPCallEndpoint(t *testing.T) {
	for _, resume := range []bool{false, true} {
		t.Run(map[bool]string{false: "local reply", true: "resume"}[resume], func(t *testing.T) {
			host := startedHost(t, "")
			id := host.InitializeHttpContext()
			path := "/tp/http-call?cluster=backend&path=/v1&omit=:method"
			if resume {
				path += "&resume=1"
			}
			assert.Equal(t, types.ActionPause, host.CallOnRequestHeaders(id, get(path), true))
			callouts := host.GetCalloutAttributesFromContext(id)
			require.Len(t, callouts, 1)
			assert.Equal(t, [][2]string{{":path", "/v1"}, {":authority", "backend"}}, callouts[0].Headers)

			host.CallOnHttpCallResponse(callouts[0].CalloutID, [][2]string{{":status", "201"}, {"a", "b"}}, nil, []byte("made"))
			if resume {
				assert.Nil(t, host.GetSentLocalResponse(id))
				assert.Contains(t, host.GetCurrentRequestHeaders(id), [2]string{"x-tp-call-status", "201"})
				assert.Equal(t, types.ActionContinue, host.GetCurrentHttpStreamAction(id))
				return
			}
			resp := host.GetSentLocalResponse(id)
			require.NotNil(t, resp)
			assert.Equal(t, uint32(200), resp.StatusCode)
			assert.Equal(t, "made", string(resp.Data))
			assert.Equal(t, "201", header(resp, "x-tp-call-status"))
			assert.Equal(t, "2", header(resp, "x-tp-call-headers"))
		})
	}
}

func TestHTTPCallFailure(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, get("/tp/http-call?cluster=backend"), true)
	callouts := host.GetCalloutAttributesFromContext(id)
	require.Len(t, callouts, 1)
	host.CallOnHttpCallResponse(callouts[0].CalloutID, nil, nil, nil)
	resp := host.GetSentLocalResponse(id)
	require.NotNil(t, resp)
	assert.Equal(t, uint32(502), resp.StatusCode)
	assert.Equal(t, "failed", header(resp, "x-tp-call"))
}

func TestResponseCall(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, get("/r", [2]string{"x-tp-resp-call", "backend"}), true)
	assert.Equal(t, types.ActionPause, host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false))
	callouts := host.GetCalloutAttributesFromContext(id)
	require.Len(t, callouts, 1)
	host.CallOnHttpCallResponse(callouts[0].CalloutID, [][2]string{{":status", "202"}}, nil, nil)
	assert.Contains(t, host.GetCurrentResponseHeaders(id), [2]string{"x-tp-resp-call-status", "202"})
	assert.Equal(t, types.ActionContinue, host.GetCurrentHttpStreamAction(id))
}

func TestResponseBodyModes(t *testing.T) {
	for _, tc := range []struct{ mode, want string }{
		{"buffer", "abc"}, {"replace:x", "x"}, {"append:!", "abc!"}, {"prepend:>", ">abc"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			host := startedHost(t, "")
			id := host.InitializeHttpContext()
			host.CallOnRequestHeaders(id, get("/r", [2]string{"x-tp-resp-body", tc.mode}), true)
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-length", "3"}}, false)
			assert.Equal(t, mutates(tc.mode), !containsKey(host.GetCurrentResponseHeaders(id), "content-length"))
			assert.Equal(t, types.ActionPause, host.CallOnResponseBody(id, []byte("ab"), false))
			assert.Equal(t, types.ActionContinue, host.CallOnResponseBody(id, []byte("c"), true))
			assert.Equal(t, tc.want, string(host.GetCurrentResponseBody(id)))
		})
	}
}

func containsKey(pairs [][2]string, key string) bool {
	for _, p := range pairs {
		if p[0] == key {
			return true
		}
	}
	return false
}

func TestTrailers(t *testing.T) {
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, get("/t", [2]string{"x-tp-trailer-add", "x-added=1"}), false)
	host.CallOnRequestTrailers(id, [][2]string{{"grpc-status", "0"}})
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	assert.Contains(t, host.GetCurrentResponseHeaders(id), [2]string{"x-tp-req-trailers", "1"})
}

func TestPanics(t *testing.T) {
	for _, cb := range []string{"request_headers", "request_body", "response_headers", "response_body", "log"} {
		t.Run(cb, func(t *testing.T) {
			host := startedHost(t, "")
			id := host.InitializeHttpContext()
			h := get("/x", [2]string{"x-tp-panic-in", cb})
			steps := []func(){
				func() { host.CallOnRequestHeaders(id, h, false) },
				func() { host.CallOnRequestBody(id, []byte("b"), true) },
				func() { host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false) },
				func() { host.CallOnResponseBody(id, []byte("b"), true) },
				func() { host.CompleteHttpContext(id) },
			}
			idx := map[string]int{"request_headers": 0, "request_body": 1, "response_headers": 2, "response_body": 3, "log": 4}[cb]
			for i, step := range steps {
				if i == idx {
					assert.Panics(t, step)
					return
				}
				assert.NotPanics(t, step)
			}
		})
	}
	host := startedHost(t, "")
	id := host.InitializeHttpContext()
	assert.Panics(t, func() { host.CallOnRequestHeaders(id, get("/tp/panic"), true) })
}

func TestMiscEndpoints(t *testing.T) {
	t.Setenv("TESTPLUGIN_PROBE", "present")
	host := startedHost(t, "")
	for _, tc := range []struct {
		path   string
		status uint32
		check  func(t *testing.T, resp *proxytest.LocalHttpResponse)
	}{
		{"/tp/env?name=TESTPLUGIN_PROBE", 200, func(t *testing.T, r *proxytest.LocalHttpResponse) {
			assert.Equal(t, "present", string(r.Data))
		}},
		{"/tp/time", 200, func(t *testing.T, r *proxytest.LocalHttpResponse) { assert.NotEmpty(t, r.Data) }},
		{"/tp/random", 200, func(t *testing.T, r *proxytest.LocalHttpResponse) { assert.Len(t, r.Data, 64) }},
		{"/tp/stdout", 200, nil},
		{"/tp/gc", 200, func(t *testing.T, r *proxytest.LocalHttpResponse) { assert.Equal(t, "ok", string(r.Data)) }},
		{"/tp/log", 200, func(t *testing.T, r *proxytest.LocalHttpResponse) {
			assert.Equal(t, "trace", header(r, "x-tp-log-level"))
		}},
		{"/tp/nope", 404, nil},
		{"/tp/shared/set?key=k&cas=x", 400, nil},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp := localReply(t, host, tc.path)
			assert.Equal(t, tc.status, resp.StatusCode)
			if tc.check != nil {
				tc.check(t, resp)
			}
		})
	}
	assert.Contains(t, host.GetCriticalLogs(), "testplugin level critical")
	assert.Contains(t, host.GetTraceLogs(), "testplugin level trace")
}
