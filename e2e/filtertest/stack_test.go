package filtertest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
	"github.com/wasm-epp/wasm-epp/e2e/internal/hosttest"
	"github.com/wasm-epp/wasm-epp/e2e/internal/logcapture"
	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

const (
	vmID          = "wasm-epp"
	pushToken     = "e2e-push-token"
	pushTokenEnv  = "WASM_EPP_PUSH_TOKEN"
	pushPath      = wire.PushPath
	destHeader    = "x-gateway-destination-endpoint"
	receiverCfg   = `{"role": "receiver"}`
	podNamePrefix = "pod-"
)

// The shared-data keys of the default configuration.
var (
	// The agent's segment and the directory: what a push writes.
	snapshotKey = sharedKeys.Segments[wire.SegmentOf([]byte("node-1"))]
	versionKey  = sharedKeys.Dir
)

// t0 is the host's (and so the plugin's) wall clock at start.
var t0 = time.Unix(1_750_000_000, 0)

// podServer is a loopback HTTP server standing in for one vLLM pod: it
// records what reached it and answers with its name.
type podServer struct {
	name string
	srv  *httptest.Server
	port uint16
	mu   sync.Mutex
	reqs []seenRequest
}

type seenRequest struct {
	Method, Path  string
	Header        http.Header
	Body          []byte
	ContentLength int64
}

func newPod(t testing.TB, name string) *podServer {
	p := &podServer{name: name}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.reqs = append(p.reqs, seenRequest{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(),
			Body: body, ContentLength: r.ContentLength})
		p.mu.Unlock()
		w.Header().Set("X-Pod", name)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"ok"}`))
	}))
	t.Cleanup(p.srv.Close)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(p.srv.URL, "http://"))
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	p.port = uint16(n)
	return p
}

func (p *podServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

func (p *podServer) requests() []seenRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenRequest(nil), p.reqs...)
}

// podState is what a push reports about one pod.
type podState struct {
	waiting, running uint32
	kv               float64
	active, queued   []string
	max              uint32
	// age is how old the scrape is at the host clock's time.
	age time.Duration
}

// stack is a started host: listener "router" (the plugin as router, in
// front of ORIGINAL_DST) and listener "push" (the plugin as receiver), one
// vm_id, plus the pods.
type stack struct {
	t      testing.TB
	host   *envoyhost.Host
	clock  *hosttest.Clock
	logs   *logcapture.Handler
	pods   []*podServer
	router string // base URL
	push   string
	seq    uint64
	client *http.Client

	mu     sync.Mutex
	access []envoyhost.AccessLogEntry
}

type stackOpt func(*envoyhost.Config)

// plugin returns the .wasm under test.
func plugin(t testing.TB) []byte {
	t.Helper()
	code, err := os.ReadFile(wasmbuild.Plugin(t))
	require.NoError(t, err)
	return code
}

func startStack(t testing.TB, routerConfig string, nPods int, opts ...stackOpt) *stack {
	t.Helper()
	s, err := tryStartStack(t, plugin(t), routerConfig, nPods, opts...)
	require.NoError(t, err)
	return s
}

func tryStartStack(t testing.TB, code []byte, routerConfig string, nPods int, opts ...stackOpt) (*stack, error) {
	t.Helper()
	s := &stack{t: t, clock: hosttest.NewClock(t0), logs: logcapture.New(slog.LevelDebug),
		client: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	t.Cleanup(s.client.CloseIdleConnections)
	for i := 0; i < nPods; i++ {
		s.pods = append(s.pods, newPod(t, fmt.Sprintf("%s%d", podNamePrefix, i)))
	}
	vm := envoyhost.VMConfig{VMID: vmID, Code: code, EnvironmentVariables: map[string]string{pushTokenEnv: pushToken}}
	cfg := envoyhost.Config{
		Workers:             2,
		Logger:              s.logs.Logger(),
		Clock:               s.clock,
		CompilationCacheDir: filepath.Join(os.TempDir(), "wasm-epp-filtertest-wazero-cache"),
		AccessLog: func(e envoyhost.AccessLogEntry) {
			s.mu.Lock()
			s.access = append(s.access, e)
			s.mu.Unlock()
		},
		Clusters: []envoyhost.ClusterConfig{{Name: "pods", Type: envoyhost.ClusterOriginalDst, OriginalDstHeader: destHeader}},
		Listeners: []envoyhost.ListenerConfig{
			{Name: "router", Address: "127.0.0.1:0", Cluster: "pods", Plugin: &envoyhost.PluginConfig{
				Name: "wasm-epp", RootID: "wasm-epp", Configuration: []byte(routerConfig),
				FailurePolicy: envoyhost.FailClosed, AllowOnHeadersStopIteration: true, VM: vm,
			}},
			{Name: "push", Address: "127.0.0.1:0", Cluster: "pods", Plugin: &envoyhost.PluginConfig{
				Name: "wasm-epp-receiver", RootID: "wasm-epp-receiver", Configuration: []byte(receiverCfg),
				FailurePolicy: envoyhost.FailClosed, AllowOnHeadersStopIteration: true, VM: vm,
			}},
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	host, err := envoyhost.New(cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { host.Close() })
	require.NoError(t, host.Start())
	s.host = host
	s.router = "http://" + host.ListenerAddr("router")
	s.push = "http://" + host.ListenerAddr("push")
	return s, nil
}

// setPods pushes one agent's view of every pod (states[i] is pod i) to the
// receiver, exactly as the metrics agent does, and waits for 204.
func (s *stack) setPods(states ...podState) {
	s.t.Helper()
	require.LessOrEqual(s.t, len(states), len(s.pods))
	now := s.clock.Now()
	eps := make([]wire.EndpointState, len(states))
	for i, st := range states {
		eps[i] = wire.EndpointState{
			Namespace: "llm", Name: s.pods[i].name, Address: netip.MustParseAddr("127.0.0.1"), Port: s.pods[i].port,
			Waiting: st.waiting, Running: st.running, KVCacheUsage: st.kv,
			ActiveAdapters: st.active, WaitingAdapters: st.queued, MaxAdapters: st.max,
			ScrapeTime: now.Add(-st.age),
		}
	}
	s.pushEndpoints(eps)
}

// pushEndpoints POSTs one agent's endpoints to the receiver and waits for
// 204.
func (s *stack) pushEndpoints(eps []wire.EndpointState) {
	s.t.Helper()
	wire.Normalize(eps)
	s.seq++
	payload, err := wire.EncodePush(&wire.Push{AgentID: "node-1", Seq: s.seq, SendTime: s.clock.Now(), Endpoints: eps}, wire.DefaultLimits())
	require.NoError(s.t, err)
	req, err := http.NewRequest("POST", s.push+pushPath, bytes.NewReader(payload))
	require.NoError(s.t, err)
	req.Header.Set("Authorization", "Bearer "+pushToken)
	resp, err := s.client.Do(req)
	require.NoError(s.t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(s.t, http.StatusNoContent, resp.StatusCode, "push rejected: %s", body)
}

// reply is a response from the router listener.
type reply struct {
	status int
	header http.Header
	body   []byte
	// pod is the pod that served it ("" for a local reply).
	pod string
}

// errorJSON decodes an OpenAI-style error body.
func (r reply) errorJSON(t testing.TB) (msg, typ, code string) {
	t.Helper()
	require.Equal(t, "application/json", r.header.Get("Content-Type"), "status %d body %q", r.status, r.body)
	var v struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.body, &v), "body %q", r.body)
	return v.Error.Message, v.Error.Type, v.Error.Code
}

func (s *stack) send(req *http.Request) reply {
	s.t.Helper()
	resp, err := s.client.Do(req)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: body, pod: resp.Header.Get("X-Pod")}
}

// post sends a JSON body to the router listener.
func (s *stack) post(path, body string, headers ...string) reply {
	s.t.Helper()
	req, err := http.NewRequest("POST", s.router+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return s.send(req)
}

func (s *stack) get(path string, headers ...string) reply {
	s.t.Helper()
	req, err := http.NewRequest("GET", s.router+path, nil)
	require.NoError(s.t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return s.send(req)
}

// rawRequest writes a request on a raw TCP connection, the body as HTTP/1.1
// chunks with a pause between them, so the host hands the filter many small
// body callbacks; it returns the response.
func (s *stack) chunkedPost(path string, chunks []string, pause time.Duration) reply {
	s.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.router, "http://"))
	require.NoError(s.t, err)
	defer conn.Close()
	require.NoError(s.t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n", path)
	require.NoError(s.t, err)
	for _, c := range chunks {
		_, err = fmt.Fprintf(conn, "%x\r\n%s\r\n", len(c), c)
		require.NoError(s.t, err)
		time.Sleep(pause)
	}
	_, err = io.WriteString(conn, "0\r\n\r\n")
	require.NoError(s.t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(s.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(s.t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: body, pod: resp.Header.Get("X-Pod")}
}

// stat reads a plugin metric (wasmcustom.<name>).
func (s *stack) stat(name string) uint64 {
	s.t.Helper()
	v, ok := s.host.StatValue("wasmcustom." + name)
	require.True(s.t, ok, "stat %s not defined", name)
	return v
}

var sharedKeys = wire.NewKeys(wire.DefaultKeyPrefix)

// shared returns the stored agent segment and the directory with their
// cas values.
func (s *stack) shared() (snap []byte, snapCas uint32, ver []byte, verCas uint32) {
	snap, snapCas, _ = s.host.SharedData(vmID, snapshotKey)
	ver, verCas, _ = s.host.SharedData(vmID, versionKey)
	return
}

// snapshot reads shared data as a router does.
func (s *stack) snapshot() *scheduler.Snapshot {
	s.t.Helper()
	snap, err := hosttest.Snapshot(s.host, vmID)
	require.NoError(s.t, err)
	return snap
}

// accessFor returns the access-log entries of the router listener.
func (s *stack) routerAccess() []envoyhost.AccessLogEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []envoyhost.AccessLogEntry
	for _, e := range s.access {
		if e.Listener == "router" {
			out = append(out, e)
		}
	}
	return out
}

// routerAccessFor waits for the router's access-log entry of path (it is
// written after the response is sent) and returns it.
func (s *stack) routerAccessFor(path string) envoyhost.AccessLogEntry {
	s.t.Helper()
	var found envoyhost.AccessLogEntry
	require.Eventually(s.t, func() bool {
		for _, e := range s.routerAccess() {
			if e.Path == path {
				found = e
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "no access log entry for %s", path)
	return found
}

func (s *stack) podByName(name string) *podServer {
	for _, p := range s.pods {
		if p.name == name {
			return p
		}
	}
	return nil
}

func chat(model string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}]}`
}

type envoyHostConfig = envoyhost.Config

func itoa(v uint16) string { return strconv.Itoa(int(v)) }
