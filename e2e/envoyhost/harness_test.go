package envoyhost

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/logcapture"
	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

// Guest modules used by the tests.
const (
	testPluginPkg    = "./plugin/internal/testplugin"
	trivialGuestPkg  = "./e2e/envoyhost/testdata/guests/trivial"
	missingImportPkg = "./e2e/envoyhost/testdata/guests/missingimport"
	rewriteGuestPkg  = "./e2e/envoyhost/testdata/guests/rewrite"
)

// compilationCacheDir keeps wazero's compiled code between test runs.
func compilationCacheDir() string {
	return filepath.Join(os.TempDir(), "wasm-epp-envoyhost-wazero-cache")
}

// upstream is a loopback HTTP server that records what reached it.
type upstream struct {
	srv   *httptest.Server
	mu    sync.Mutex
	reqs  []recordedRequest
	reply func(w http.ResponseWriter, r *http.Request, body []byte)
	// arrived, if set, is called when a request's headers arrive, before
	// its body is read.
	arrived func(r *http.Request)
}

type recordedRequest struct {
	Method, Path, Host string
	Header             http.Header
	Body               []byte
	BodyErr            error // why reading the body ended early (the request was reset), if it did
	Trailer            http.Header
	ContentLength      int64
}

func newUpstream(t testing.TB) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		arrived := u.arrived
		u.mu.Unlock()
		if arrived != nil {
			arrived(r)
		}
		body, err := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, recordedRequest{Method: r.Method, Path: r.URL.RequestURI(), Host: r.Host,
			Header: r.Header.Clone(), Body: body, BodyErr: err, Trailer: r.Trailer.Clone(), ContentLength: r.ContentLength})
		reply := u.reply
		u.mu.Unlock()
		if reply != nil {
			reply(w, r, body)
			return
		}
		w.Header().Set("X-Upstream", "yes")
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("upstream saw " + r.URL.Path + " body=" + string(body)))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

func (u *upstream) requests() []recordedRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]recordedRequest(nil), u.reqs...)
}

func (u *upstream) last(t testing.TB) recordedRequest {
	t.Helper()
	reqs := u.requests()
	require.NotEmpty(t, reqs, "nothing reached the upstream")
	return reqs[len(reqs)-1]
}

// harness is a started host with one listener "main" in front of an
// ORIGINAL_DST cluster (and a STATIC cluster "static" to the same
// upstream, usable for callouts), plus an admin listener.
type harness struct {
	t      testing.TB
	host   *Host
	up     *upstream
	logs   *logcapture.Handler
	url    string
	access *accessLog
}

type accessLog struct {
	mu      sync.Mutex
	entries []AccessLogEntry
}

func (a *accessLog) add(e AccessLogEntry) {
	a.mu.Lock()
	a.entries = append(a.entries, e)
	a.mu.Unlock()
}

func (a *accessLog) all() []AccessLogEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]AccessLogEntry(nil), a.entries...)
}

type harnessOpt func(*Config, *PluginConfig)

func newHarness(t testing.TB, pkg string, opts ...harnessOpt) *harness {
	t.Helper()
	h, err := startHarness(t, pkg, opts...)
	require.NoError(t, err)
	return h
}

func startHarness(t testing.TB, pkg string, opts ...harnessOpt) (*harness, error) {
	t.Helper()
	code, err := os.ReadFile(wasmbuild.Build(t, pkg))
	require.NoError(t, err)
	up := newUpstream(t)
	logs := logcapture.New(slog.LevelDebug - 4)
	acc := &accessLog{}
	pc := &PluginConfig{
		Name:          "testplugin",
		RootID:        "",
		FailurePolicy: FailClosed,
		VM:            VMConfig{VMID: "test-vm", Code: code},
	}
	cfg := Config{
		Workers:             2,
		AdminAddress:        "127.0.0.1:0",
		Logger:              logs.Logger(),
		CompilationCacheDir: compilationCacheDir(),
		AccessLog:           acc.add,
		Clusters: []ClusterConfig{
			{Name: "original_dst", Type: ClusterOriginalDst},
			{Name: "static", Type: ClusterStatic, Endpoints: []string{up.addr()}},
		},
		Listeners: []ListenerConfig{{Name: "main", Address: "127.0.0.1:0", Plugin: pc, Cluster: "original_dst"}},
	}
	for _, o := range opts {
		o(&cfg, pc)
	}
	host, err := New(cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { host.Close() })
	require.NoError(t, host.Start())
	return &harness{t: t, host: host, up: up, logs: logs, access: acc,
		url: "http://" + host.ListenerAddr("main")}, nil
}

// request sends a request through the main listener, routed to the test
// upstream unless the caller sets the destination header itself.
func (h *harness) request(method, path string, body io.Reader, headers map[string]string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, body)
	require.NoError(h.t, err)
	req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
	for k, v := range headers {
		if v == "" {
			// Present but empty keeps Go's client from adding a default.
			req.Header[http.CanonicalHeaderKey(k)] = []string{""}
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	require.NoError(h.t, err)
	return resp
}

// do sends a request and reads the whole response.
func (h *harness) do(method, path string, body string, headers map[string]string) (*http.Response, string) {
	h.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	resp := h.request(method, path, r, headers)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return resp, string(b)
}

var httpClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true}}

func withPluginConfig(s string) harnessOpt {
	return func(_ *Config, p *PluginConfig) { p.Configuration = []byte(s) }
}

func withAllowStopIteration() harnessOpt {
	return func(_ *Config, p *PluginConfig) { p.AllowOnHeadersStopIteration = true }
}

func withFailurePolicy(fp FailurePolicy) harnessOpt {
	return func(_ *Config, p *PluginConfig) { p.FailurePolicy = fp }
}

func withEnv(k, v string) harnessOpt {
	return func(_ *Config, p *PluginConfig) {
		if p.VM.EnvironmentVariables == nil {
			p.VM.EnvironmentVariables = map[string]string{}
		}
		p.VM.EnvironmentVariables[k] = v
	}
}

func withWorkers(n int) harnessOpt { return func(c *Config, _ *PluginConfig) { c.Workers = n } }
