package envoyhost

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests drive plugin/internal/testplugin (the project's Proxy-Wasm
// binding in a real Go wasip1 module) through the host, one host call
// family at a time. The plugin's control headers and /tp/ endpoints are
// documented in its package doc.

func TestTestPluginRequestHeaderEdits(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/tp/echo", "", map[string]string{
		"X-Tp-Add":       "added=1",
		"X-Tp-Replace":   "user-agent=replaced",
		"X-Tp-Remove":    "x-drop",
		"X-Drop":         "gone",
		"X-Tp-Set-Pairs": "from-pairs=2",
		"X-Tp-Get":       "X-Multi",
		"X-Multi":        "first",
	})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var echo struct{ Headers [][2]string }
	require.NoError(t, json.Unmarshal([]byte(body), &echo))
	got := map[string][]string{}
	for _, p := range echo.Headers {
		got[p[0]] = append(got[p[0]], p[1])
	}
	// Pseudo-headers as Envoy presents an HTTP/1 request.
	assert.Equal(t, []string{"GET"}, got[":method"])
	assert.Equal(t, []string{"/tp/echo"}, got[":path"])
	assert.Equal(t, []string{"http"}, got[":scheme"])
	assert.NotEmpty(t, got[":authority"])
	assert.Equal(t, []string{"http"}, got["x-forwarded-proto"])
	assert.Len(t, got["x-request-id"], 1)
	// Edits: add, replace (one value), remove (all), set_pairs (whole map).
	assert.Equal(t, []string{"1"}, got["added"])
	assert.Equal(t, []string{"replaced"}, got["user-agent"])
	assert.NotContains(t, got, "x-drop")
	assert.Equal(t, []string{"2"}, got["from-pairs"])
	for k := range got {
		assert.Equal(t, strings.ToLower(k), k, "header keys are lower case")
	}
	// x-tp-get on a mixed-case name found the lower-case header.
	assert.Equal(t, "first", resp.Header.Get("X-Tp-Got"))
}

func TestTestPluginGetMissingHeaderIsNotFound(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, _ := h.do("GET", "/plain", "", map[string]string{"X-Tp-Get": "x-absent"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "not_found", resp.Header.Get("X-Tp-Got-Error"))
}

func TestTestPluginProxiesAndReportsContexts(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("POST", "/upstream/path?q=1", "hello", map[string]string{"X-Tp-Add": "k=v", "User-Agent": ""})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "upstream saw /upstream/path body=hello", body)
	assert.Equal(t, "yes", resp.Header.Get("X-Upstream"))
	assert.Equal(t, "envoy", resp.Header.Get("Server"))
	assert.NotEmpty(t, resp.Header.Get("X-Envoy-Upstream-Service-Time"))
	assert.Equal(t, "1", resp.Header.Get("X-Tp-Root-Id"), "the first root context is id 1")
	assert.Equal(t, "5:true", resp.Header.Get("X-Tp-Req-Body-Calls"))
	got := h.up.last(t)
	assert.Equal(t, "/upstream/path?q=1", got.Path)
	assert.Equal(t, "v", got.Header.Get("K"))
	assert.Equal(t, "hello", string(got.Body))
	assert.NotEmpty(t, got.Header.Get("X-Envoy-Expected-Rq-Timeout-Ms"))
	assert.Empty(t, got.Header.Values("User-Agent"), "no user agent is added on the way")
}

func TestTestPluginLocalReply(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/x", "", map[string]string{
		"X-Tp-Local-Reply":        "418",
		"X-Tp-Local-Reply-Body":   "short and stout",
		"X-Tp-Local-Reply-Header": "x-extra=1",
	})
	assert.Equal(t, 418, resp.StatusCode)
	assert.Equal(t, "short and stout", body)
	assert.Equal(t, "1", resp.Header.Get("X-Extra"), "extra headers are appended")
	assert.Equal(t, "text/plain", resp.Header.Get("Content-Type"), "Envoy sets text/plain when absent")
	// The reply went through the same filter's on_response_headers.
	assert.NotEmpty(t, resp.Header.Get("X-Tp-Vm-Nonce"))
	assert.Empty(t, h.up.requests(), "a local reply never reaches the upstream")
}

func TestTestPluginLocalReplyKeepsPluginContentType(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, _ := h.do("GET", "/tp/metrics", "", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, []string{"application/json"}, resp.Header.Values("Content-Type"))
}

func TestTestPluginStartInfo(t *testing.T) {
	h := newHarness(t, testPluginPkg, withPluginConfig(`{}`), func(c *Config, p *PluginConfig) {
		p.VM.Configuration = []byte("vm-config-bytes")
	})
	resp, body := h.do("GET", "/tp/start-info", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var info map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &info))
	assert.Equal(t, "vm-config-bytes", info["vm_configuration"])
	assert.Equal(t, "not_found", info["vm_start_plugin_config_error"],
		"the plugin configuration is not readable in on_vm_start")
	assert.Equal(t, "{}", info["plugin_configuration"])
	assert.Equal(t, "info", info["log_level"])
}

func TestTestPluginConfigOutsideOnConfigureIsNotFound(t *testing.T) {
	h := newHarness(t, testPluginPkg, withPluginConfig(`{}`))
	resp, _ := h.do("GET", "/tp/config", "", nil)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Equal(t, "not_found", resp.Header.Get("X-Tp-Error"))
}

func TestTestPluginSharedData(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, _ := h.do("GET", "/tp/shared/get?key=k", "", nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, "not_found", resp.Header.Get("X-Tp-Error"))

	resp, _ = h.do("GET", "/tp/shared/set?key=k&value=v1", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cas1 := resp.Header.Get("X-Tp-Cas")

	resp, body := h.do("GET", "/tp/shared/get?key=k", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "v1", body)
	assert.Equal(t, cas1, resp.Header.Get("X-Tp-Cas"))

	// A stale cas is a mismatch; the current one and 0 succeed.
	resp, _ = h.do("GET", "/tp/shared/set?key=k&value=v2&cas="+cas1, "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = h.do("GET", "/tp/shared/set?key=k&value=v3&cas="+cas1, "", nil)
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, "cas_mismatch", resp.Header.Get("X-Tp-Error"))
	resp, _ = h.do("GET", "/tp/shared/set?key=k&value=v4&cas=0", "", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	v, _, ok := h.host.SharedData("test-vm", "k")
	require.True(t, ok)
	assert.Equal(t, "v4", string(v))

	// Increments from both workers land in one table.
	for i := 0; i < 6; i++ {
		resp, _ = h.do("GET", "/tp/shared/incr?key=n", "", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	v, _, _ = h.host.SharedData("test-vm", "n")
	assert.Equal(t, "6", string(v))
}

func TestTestPluginProperties(t *testing.T) {
	h := newHarness(t, testPluginPkg, func(c *Config, p *PluginConfig) { p.RootID = "my-root" })
	prop := func(path string) (int, string) {
		resp, body := h.do("GET", "/tp/property?path="+path, "", nil)
		return resp.StatusCode, body
	}
	code, v := prop("plugin_name")
	assert.Equal(t, 200, code)
	assert.Equal(t, "testplugin", v)
	_, v = prop("plugin_root_id")
	assert.Equal(t, "my-root", v)
	_, v = prop("plugin_vm_id")
	assert.Equal(t, "test-vm", v)
	_, v = prop("source.address")
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, v)
	_, v = prop("source.port")
	require.Len(t, v, 8, "numbers are 8-byte little endian")
	assert.NotZero(t, binary.LittleEndian.Uint64([]byte(v)))
	_, v = prop("request.path")
	assert.Equal(t, "/tp/property?path=request.path", v)
	_, v = prop("request.url_path")
	assert.Equal(t, "/tp/property", v)
	_, v = prop("request.method")
	assert.Equal(t, "GET", v)
	code, _ = prop("no.such.property")
	assert.Equal(t, 404, code)

	resp, body := h.do("GET", "/tp/property-map?path=request.headers", "", map[string]string{"X-Custom": "c"})
	require.Equal(t, 200, resp.StatusCode, body)
	assert.Contains(t, body, `["x-custom","c"]`)
}

func TestTestPluginSetPropertyIsStreamFilterState(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, _ := h.do("GET", "/tp/set-property?path=my_key&value=v", "", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestTestPluginLogsAndWASI(t *testing.T) {
	h := newHarness(t, testPluginPkg, withEnv("TP_NAME", "tp-value"))
	resp, _ := h.do("GET", "/tp/log", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "info", resp.Header.Get("X-Tp-Log-Level"))
	for _, lvl := range []string{"trace", "debug", "info", "warn", "error", "critical"} {
		assert.Len(t, h.logs.Find("testplugin level "+lvl), 1, lvl)
	}
	resp, _ = h.do("GET", "/tp/stdout", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := h.logs.Find("testplugin stdout")
	require.Len(t, out, 1)
	assert.Equal(t, "INFO", out[0].Level.String(), "fd 1 logs at info")
	errs := h.logs.Find("testplugin stderr")
	require.Len(t, errs, 1)
	assert.Equal(t, "ERROR", errs[0].Level.String(), "fd 2 logs at error")

	_, body := h.do("GET", "/tp/env?name=TP_NAME", "", nil)
	assert.Equal(t, "tp-value", body, "environ holds vm_config.environment_variables")
	_, body = h.do("GET", "/tp/env?name=PATH", "", nil)
	assert.Empty(t, body, "nothing of the host environment leaks")

	_, body = h.do("GET", "/tp/time", "", nil)
	var ns int64
	_, err := fmt.Sscan(body, &ns)
	require.NoError(t, err)
	assert.InDelta(t, float64(time.Now().UnixNano()), float64(ns), float64(time.Minute))

	_, r1 := h.do("GET", "/tp/random", "", nil)
	_, r2 := h.do("GET", "/tp/random", "", nil)
	assert.Len(t, r1, 64)
	assert.NotEqual(t, r1, r2)
}

func TestTestPluginAllocatorUnderGC(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/tp/gc", "", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, resp.Header.Get("X-Tp-Error"))
	assert.Equal(t, "ok", body)
}

func TestTestPluginMetrics(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	for i := 0; i < 4; i++ {
		resp, _ := h.do("GET", "/plain", "", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	_, body := h.do("POST", "/plain", "abcd", map[string]string{"X-Tp-Body": "buffer"})
	assert.Contains(t, body, "upstream saw")
	// Counters are one stat per name: increments from both workers add up.
	v, ok := h.host.StatValue("wasmcustom.testplugin_requests_total")
	require.True(t, ok)
	assert.Equal(t, uint64(5), v)

	resp, err := http.Get("http://" + h.host.AdminAddr() + "/stats/prometheus")
	require.NoError(t, err)
	defer resp.Body.Close()
	prom, _ := io.ReadAll(resp.Body)
	text := string(prom)
	// The wasmcustom namespace is hidden and no envoy_ prefix is added.
	assert.Contains(t, text, "# TYPE testplugin_requests_total counter\ntestplugin_requests_total{} 5\n")
	assert.Contains(t, text, "# TYPE testplugin_active_streams gauge\n")
	assert.Contains(t, text, "# TYPE testplugin_request_body_bytes histogram\n")
	assert.Contains(t, text, "testplugin_request_body_bytes_bucket{le=\"5\"} 1\n")
	assert.Contains(t, text, "testplugin_request_body_bytes_count{} 1\n")
	assert.NotContains(t, text, "wasmcustom")

	resp, err = http.Get("http://" + h.host.AdminAddr() + "/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	stats, _ := io.ReadAll(resp.Body)
	assert.Contains(t, string(stats), "testplugin_requests_total: 5\n")
}
