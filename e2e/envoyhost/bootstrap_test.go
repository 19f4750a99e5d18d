package envoyhost

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/logcapture"
	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
)

func getenvFrom(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// The project's own bootstrap (envoy/envoy.yaml) must load as is.
func TestProjectBootstrapLoads(t *testing.T) {
	root, err := wasmbuild.ModuleRoot()
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join(root, "envoy", "envoy.yaml"))
	if os.IsNotExist(err) {
		t.Skip("envoy/envoy.yaml not written yet")
	}
	require.NoError(t, err)
	cfg, err := LoadBootstrap(doc, BootstrapOptions{Getenv: getenvFrom(map[string]string{"WASM_EPP_PUSH_TOKEN": "tok"})})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9901", cfg.AdminAddress)
	require.Len(t, cfg.Listeners, 2)
	for _, l := range cfg.Listeners {
		require.NotNil(t, l.Plugin, l.Name)
		assert.Equal(t, "wasm-epp", l.Plugin.VM.VMID)
		assert.Equal(t, "bin/wasm-epp.wasm", l.Plugin.VM.CodePath)
		assert.True(t, l.Plugin.AllowOnHeadersStopIteration)
		assert.Equal(t, "tok", l.Plugin.VM.EnvironmentVariables["WASM_EPP_PUSH_TOKEN"])
	}
	require.Len(t, cfg.Clusters, 1)
	assert.Equal(t, ClusterOriginalDst, cfg.Clusters[0].Type)
	assert.Equal(t, "x-gateway-destination-endpoint", cfg.Clusters[0].OriginalDstHeader)
}

func TestBootstrapRejectsUnsupported(t *testing.T) {
	base := `
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 127.0.0.1, port_value: 1}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: s
          CODEC
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: c}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: c
    CLUSTER
`
	ok := strings.NewReplacer("CODEC", "codec_type: AUTO", "CLUSTER", "type: ORIGINAL_DST\n    lb_policy: CLUSTER_PROVIDED\n    original_dst_lb_config: {use_http_header: true}")
	cfg, err := LoadBootstrap([]byte(ok.Replace(base)), BootstrapOptions{})
	require.NoError(t, err)
	assert.Equal(t, "x-envoy-original-dst-host", cfg.Clusters[0].OriginalDstHeader, "Envoy's default header")
	assert.Equal(t, CodecAuto, cfg.Listeners[0].Codec)
	for codec, want := range map[string]Codec{"HTTP1": CodecHTTP1, "HTTP2": CodecHTTP2} {
		c, err := LoadBootstrap([]byte(strings.Replace(ok.Replace(base), "codec_type: AUTO", "codec_type: "+codec, 1)), BootstrapOptions{})
		require.NoError(t, err)
		assert.Equal(t, want, c.Listeners[0].Codec, codec)
	}

	cases := map[string]struct{ codec, cluster, want string }{
		"http3": {"codec_type: HTTP3", "type: STATIC\n    load_assignment: {cluster_name: c}", "codec_type HTTP3 is not supported"},
		"round robin original dst": {"codec_type: AUTO",
			"type: ORIGINAL_DST\n    lb_policy: ROUND_ROBIN\n    original_dst_lb_config: {use_http_header: true}",
			"Only 'CLUSTER_PROVIDED' is allowed"},
		"header name without use": {"codec_type: AUTO",
			"type: ORIGINAL_DST\n    lb_policy: CLUSTER_PROVIDED\n    original_dst_lb_config: {http_header_name: x}",
			"invalid config http_header_name=x and use_http_header is false"},
		"unsupported field": {"codec_type: AUTO\n          server_name: custom",
			"type: STATIC\n    load_assignment: {cluster_name: c}", "server_name: field not supported by envoyhost"},
		"unknown field": {"codec_type: AUTO\n          no_such_field: 1", "type: STATIC", "no_such_field"},
		"strict dns":    {"codec_type: AUTO", "type: STRICT_DNS", "cluster type STRICT_DNS is not supported"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			doc := strings.NewReplacer("CODEC", c.codec, "CLUSTER", c.cluster).Replace(base)
			_, err := LoadBootstrap([]byte(doc), BootstrapOptions{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	_, err = LoadBootstrap([]byte("dynamic_resources: {}\n"+ok.Replace(base)), BootstrapOptions{})
	assert.ErrorContains(t, err, "bootstrap.dynamic_resources: field not supported")
}

// The test bootstrap runs end to end: routes, direct responses, the plugin
// on two listeners sharing a vm_id, environment variables.
func TestBootstrapEndToEnd(t *testing.T) {
	wasm := wasmbuild.Build(t, testPluginPkg)
	up := newUpstream(t)
	_, port, _ := net.SplitHostPort(up.addr())
	doc, err := os.ReadFile("testdata/bootstrap.yaml")
	require.NoError(t, err)
	doc = []byte(strings.NewReplacer("TESTPLUGIN_WASM", wasm, "UPSTREAM_PORT", port).Replace(string(doc)))
	cfg, err := LoadBootstrap(doc, BootstrapOptions{Getenv: getenvFrom(map[string]string{"TP_FROM_HOST": "host"})})
	require.NoError(t, err)
	logs := logcapture.New(slog.LevelInfo)
	cfg.Logger = logs.Logger()
	cfg.CompilationCacheDir = compilationCacheDir()
	h, err := New(cfg)
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, h.Start())
	client := "http://" + h.ListenerAddr("client")
	push := "http://" + h.ListenerAddr("push")

	get := func(url string, headers map[string]string) (*http.Response, string) {
		req, err := http.NewRequest("GET", url, nil)
		require.NoError(t, err)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b := new(strings.Builder)
		_, _ = io.Copy(b, resp.Body)
		return resp, b.String()
	}

	// /v1/ goes upstream through the ORIGINAL_DST cluster; the path was
	// normalised before the filter and the route saw it.
	resp, body := get(client+"/v1//a/../models", map[string]string{"x-gateway-destination-endpoint": up.addr()})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "upstream saw /v1/models body=", body)
	assert.Equal(t, "127.0.0.1", up.last(t).Header.Get("X-Forwarded-For"), "use_remote_address")

	// Anything else: the route's direct response, through the filter.
	resp, body = get(client+"/other", nil)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, `{"error":"not found"}`, body)
	assert.Equal(t, []string{"application/json"}, resp.Header.Values("Content-Type"))
	assert.NotEmpty(t, resp.Header.Get("X-Tp-Vm-Nonce"))

	// The plugin answers /tp/ itself on both listeners; shared data is
	// one table for the vm_id.
	resp, _ = get(push+"/tp/shared/set?key=k&value=from-push", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, body = get(client+"/tp/shared/get?key=k", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "from-push", body)

	_, body = get(client+"/tp/env?name=TP_FROM_HOST", nil)
	assert.Equal(t, "host", body)
	_, body = get(client+"/tp/env?name=TP_FIXED", nil)
	assert.Equal(t, "fixed", body)
	_, body = get(client+"/tp/property?path=plugin_root_id", nil)
	assert.Equal(t, "client-root", body)

	// The admin listener serves stats.
	resp, err = httpClient.Get("http://" + h.AdminAddr() + "/stats/prometheus")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}
