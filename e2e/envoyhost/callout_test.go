package envoyhost

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// HTTP callouts, timers, routing and several listeners sharing one vm_id.

func TestHTTPCallFromStream(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/tp/http-call?cluster=static&path=/c", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "200", resp.Header.Get("X-Tp-Call-Status"))
	assert.NotEmpty(t, resp.Header.Get("X-Tp-Call-Headers"))
	assert.Equal(t, "upstream saw /c body=", body)
	assert.Equal(t, "static", h.up.last(t).Host, ":authority becomes the Host")
}

func TestHTTPCallBadArguments(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	for _, q := range []string{
		"cluster=nope",
		"cluster=static&omit=:authority",
		"cluster=static&omit=:path",
		"cluster=static&omit=:method",
	} {
		resp, _ := h.do("GET", "/tp/http-call?"+q, "", nil)
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, q)
		assert.Equal(t, "bad_argument", resp.Header.Get("X-Tp-Error"), q)
	}
}

// Connection failures before response headers come back as a local 503
// response (Envoy's async client); a reset after headers is a failure
// (on_http_call_response with no headers).
func TestHTTPCallUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	h := newHarness(t, testPluginPkg, func(c *Config, _ *PluginConfig) {
		c.Clusters = append(c.Clusters, ClusterConfig{Name: "dead", Type: ClusterStatic, Endpoints: []string{dead}})
	})
	resp, body := h.do("GET", "/tp/http-call?cluster=dead", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "503", resp.Header.Get("X-Tp-Call-Status"))
	assert.Contains(t, body, "upstream connect error or disconnect/reset before headers")

	// Reset after headers: the upstream promises a body and hangs up.
	h.up.reply = func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(200)
		_, _ = w.Write([]byte("short"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	resp, _ = h.do("GET", "/tp/http-call?cluster=static", "", map[string]string{DefaultOriginalDstHeader: "127.0.0.1:1"})
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Equal(t, "failed", resp.Header.Get("X-Tp-Call"))
}

func TestHTTPCallTimeoutIs504(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	block := make(chan struct{})
	defer close(block)
	h.up.reply = func(w http.ResponseWriter, r *http.Request, _ []byte) { <-block }
	resp, body := h.do("GET", "/tp/http-call?cluster=static&timeout_ms=50", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "504", resp.Header.Get("X-Tp-Call-Status"))
	assert.Equal(t, "upstream request timeout", body)
}

func TestResponsePausedUntilCalloutResumes(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/r", "", map[string]string{"X-Tp-Resp-Call": "static"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "200", resp.Header.Get("X-Tp-Resp-Call-Status"), "response headers writable while paused")
	assert.Equal(t, "upstream saw /r body=", body)
}

func TestTimersTickOnEveryThread(t *testing.T) {
	h := newHarness(t, testPluginPkg, withPluginConfig(`{"tick_period_ms": 5, "tick_stop_after": 3}`))
	// main + 2 workers tick 3 times each, then stop.
	require.Eventually(t, func() bool {
		v, _, ok := h.host.SharedData("test-vm", "testplugin/ticks")
		return ok && string(v) == "9"
	}, 5*time.Second, 10*time.Millisecond)
	v, ok := h.host.StatValue("wasmcustom.testplugin_ticks_total")
	require.True(t, ok)
	assert.Equal(t, uint64(9), v, "one counter for every VM")
}

func TestTickHTTPCallFromRoot(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1),
		withPluginConfig(`{"tick_period_ms": 5, "tick_stop_after": 1, "tick_http_call_cluster": "static", "tick_http_call_path": "/tick"}`))
	require.Eventually(t, func() bool {
		v, _, ok := h.host.SharedData("test-vm", "testplugin/tick-call")
		return ok && strings.HasPrefix(string(v), "200 upstream saw /tick")
	}, 5*time.Second, 10*time.Millisecond)
}

func TestDelayedDoneFinishesWithProxyDone(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1), withPluginConfig(`{"delay_done": true}`))
	require.NoError(t, h.host.Close())
	assert.Len(t, h.logs.Find("testplugin: plugin done"), 2, "main and worker root contexts")
}

func TestOriginalDstRouting(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	cases := []struct {
		name, value string
		invalid     bool
	}{
		{"missing", "", false},
		{"hostname", "localhost:80", true},
		{"no port", "127.0.0.1", true},
		{"bad ipv6", "::1:80", true},
	}
	wantInvalid := uint64(0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			headers := map[string]string{DefaultOriginalDstHeader: c.value}
			if c.value == "" {
				headers = map[string]string{}
			}
			req, err := http.NewRequest("GET", h.url+"/x", nil)
			require.NoError(t, err)
			for k, v := range headers {
				req.Header.Set(k, v)
			}
			resp, err := httpClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			if c.invalid {
				wantInvalid++
			}
			got, _ := h.host.StatValue("cluster.original_dst.original_dst_host_invalid")
			assert.Equal(t, wantInvalid, got)
		})
	}
	// Only the first value counts.
	req, err := http.NewRequest("GET", h.url+"/first", nil)
	require.NoError(t, err)
	req.Header.Add(DefaultOriginalDstHeader, h.up.addr())
	req.Header.Add(DefaultOriginalDstHeader, "garbage")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	_, body := h.do("GET", "/x", "", map[string]string{DefaultOriginalDstHeader: "nonsense"})
	assert.Equal(t, "no healthy upstream", body)
}

func TestIPv6OriginalDst(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback")
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("v6"))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/x", "", map[string]string{DefaultOriginalDstHeader: ln.Addr().String()})
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "v6", body)
}

// Two listeners with the same plugin code and vm_id (the deployment's
// client listener and its push listener) share one VM per thread and one
// shared-data table; each has its own root context.
func TestTwoListenersShareVMAndData(t *testing.T) {
	h := newHarness(t, testPluginPkg, func(c *Config, p *PluginConfig) {
		push := *p
		push.Configuration = []byte(`{"tick_period_ms": 0}`)
		c.Listeners = append(c.Listeners, ListenerConfig{Name: "push", Address: "127.0.0.1:0",
			Plugin: &push, Cluster: "static"})
	})
	push := "http://" + h.host.ListenerAddr("push")
	resp, err := httpClient.Get(push + "/tp/shared/set?key=from-push&value=1")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	pushRoot := resp.Header.Get("X-Tp-Root-Id")
	pushNonce := resp.Header.Get("X-Tp-Vm-Nonce")

	resp, body := h.do("GET", "/tp/shared/get?key=from-push", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "1", body, "one table per vm_id across listeners")
	assert.NotEqual(t, pushRoot, resp.Header.Get("X-Tp-Root-Id"), "each plugin has its own root context")

	// Round robin over 2 workers: some request lands on the push request's VM.
	seen := false
	for i := 0; i < 4; i++ {
		resp, _ := h.do("GET", "/x", "", nil)
		if resp.Header.Get("X-Tp-Vm-Nonce") == pushNonce {
			seen = true
		}
	}
	assert.True(t, seen, "the listeners share the worker VMs")
}
