package endtoend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/e2e/stack"
	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/metricsagent"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// Short settings so the suite is quick on 2 cores: the agent scrapes every
// 50 ms (its default) and endpoints go stale after 600 ms.
const (
	testInterval   = 50 * time.Millisecond
	testStaleAfter = 600 * time.Millisecond
	// waitLong bounds every poll: generous for a loaded 2-core machine,
	// and only a bound, never the expected time.
	waitLong = 20 * time.Second
	tick     = 20 * time.Millisecond
)

// startStack starts a stack on free loopback ports with the test settings;
// cfg supplies the shape (replicas, adapters, extra flags, patches). It is
// stopped in t.Cleanup, after the process logs are printed if t failed.
func startStack(t *testing.T, cfg stack.Config) *stack.Stack {
	t.Helper()
	bin, wasm := binaries(t)
	root, err := wasmbuild.ModuleRoot()
	require.NoError(t, err)
	cfg.BinDir, cfg.WasmPath = bin, wasm
	cfg.Bootstrap = filepath.Join(root, "envoy", "envoy.yaml")
	cfg.Gateway = stack.Gateway(os.Getenv(envGateway))
	cfg.ClientAddr, cfg.PushAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.WorkDir = t.TempDir()
	if cfg.AgentInterval == 0 {
		cfg.AgentInterval = testInterval
	}
	patch := map[string]any{"staleAfter": testStaleAfter.String()}
	for k, v := range cfg.RouterPatch {
		patch[k] = v
	}
	cfg.RouterPatch = patch
	cfg.StopGrace = 3 * time.Second
	cfg.CompilationCache = cacheDir
	cfg.Logf = t.Logf

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		dumpLogs(t, cfg.WorkDir)
		t.Fatalf("starting the stack: %v", err)
	}
	t.Logf("stack up in %s (gateway %s, work dir %s)", time.Since(start).Round(time.Millisecond), s.Gateway(), s.WorkDir())
	t.Cleanup(func() {
		select {
		case e := <-s.Failed():
			t.Errorf("a stack process exited unexpectedly: %v", e)
		default:
		}
		if t.Failed() {
			dumpLogs(t, cfg.WorkDir)
		}
		s.Stop()
	})
	return s
}

func dumpLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, l := range logs {
		t.Logf("---- %s (tail) ----\n%s", filepath.Base(l), stack.LogTail(l, 40))
	}
}

// httpClient talks to loopback only: never through a proxy from the
// environment.
var httpClient = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256, DisableCompression: true},
}

// reply is a finished HTTP exchange.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// served is the replica the gateway says served the request (ip:port).
func (r reply) served(s *stack.Stack) string { return r.Header.Get(s.Info().Router.ServedByHeader) }

func (r reply) String() string {
	return fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Body))
}

// errorBody is the plugin's OpenAI-style error.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func send(t *testing.T, method, url string, body any, header http.Header) reply {
	t.Helper()
	r, err := trySend(context.Background(), method, url, body, header)
	require.NoError(t, err)
	return r
}

func trySend(ctx context.Context, method, url string, body any, header http.Header) (reply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return reply{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// completion is a small /v1/completions body.
func completion(model string, maxTokens int) map[string]any {
	return map[string]any{"model": model, "prompt": "Write a SQL query that lists users.", "max_tokens": maxTokens}
}

func complete(t *testing.T, s *stack.Stack, model string, maxTokens int) reply {
	t.Helper()
	return send(t, http.MethodPost, s.ClientURL()+"/v1/completions", completion(model, maxTokens), nil)
}

// openStream starts a streamed completion and returns once the response
// headers arrived (the replica is chosen and generating); the caller reads
// or closes the body. Closing it aborts the request in the replica.
func openStream(t *testing.T, s *stack.Stack, model string, maxTokens int) *http.Response {
	t.Helper()
	return openStreamOf(t, s, completion(model, maxTokens))
}

// openStreamOf is openStream for a completion body of the caller's.
func openStreamOf(t *testing.T, s *stack.Stack, body map[string]any) *http.Response {
	t.Helper()
	body["stream"] = true
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, s.ClientURL()+"/v1/completions", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return resp
}

// replicaState scrapes a replica's /metrics directly (not through the
// agent): its queue and the adapters it runs or queues right now.
func replicaState(t *testing.T, addr string) metricsagent.PodMetrics {
	t.Helper()
	r := send(t, http.MethodGet, "http://"+addr+"/metrics", nil, nil)
	require.Equal(t, http.StatusOK, r.Status)
	m, err := metricsagent.ParseMetrics(r.Body, metricsagent.DefaultMetricNames())
	require.NoError(t, err)
	return m
}

// runningAdapter reports whether the replica runs a request for adapter.
func runningAdapter(t *testing.T, addr, adapter string) bool {
	m := replicaState(t, addr)
	for _, a := range m.ActiveAdapters {
		if a == adapter {
			return true
		}
	}
	return false
}

// replicaAddrs lists the replicas' ip:port.
func replicaAddrs(s *stack.Stack) []string {
	var out []string
	for _, r := range s.Replicas() {
		out = append(out, r.Addr)
	}
	return out
}

// replicaByAddr finds a replica by the address the gateway names.
func replicaByAddr(s *stack.Stack, addr string) *stack.Replica {
	for _, r := range s.Replicas() {
		if r.Addr == addr {
			return r
		}
	}
	return nil
}

// stat reads one gateway stat from the admin /stats text ("name: value").
// Absent stats read as 0.
func stat(t *testing.T, s *stack.Stack, name string) uint64 {
	t.Helper()
	return statAt(t, s.AdminURL(), name)
}

// statAt is stat from the admin interface at adminURL.
func statAt(t *testing.T, adminURL, name string) uint64 {
	t.Helper()
	r := send(t, http.MethodGet, adminURL+"/stats", nil, nil)
	require.Equal(t, http.StatusOK, r.Status)
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ": ")
		if ok && k == name {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			require.NoError(t, err, "stat %s", name)
			return n
		}
	}
	return 0
}

// pluginStat names a plugin counter as the admin /stats page shows it:
// Envoy keeps plugin metrics in the "wasmcustom" namespace and hides that
// prefix on the admin pages.
func pluginStat(name string) string { return "wasm_epp." + name }

// simText is what the simulator generates for n tokens.
func simText(n int) string { return vllmsim.GeneratedText(n) }

// poll calls cond in the test goroutine (so cond may use require) every
// tick until it reports true, failing the test after waitLong. Unlike
// require.Eventually, nothing keeps running after it returns.
func poll(t *testing.T, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			require.Fail(t, "condition not met within "+waitLong.String(), msgAndArgs...)
		}
		time.Sleep(tick)
	}
}

// agentPushes is how many pushes the agent has finished (to every target,
// failed ones included), from its own /metrics.
func agentPushes(t *testing.T, s *stack.Stack) float64 {
	t.Helper()
	return agentCounter(t, s, "wasm_epp_agent_push_duration_seconds_count")
}

// waitPushes waits until the agent has finished n more pushes: then a
// cycle that began after the caller's observation has reached the gateway
// (unless it failed, hence n > 1) and the routers decide on it. This waits on the agent's progress, not
// on a guess of how long a cycle takes on a busy machine.
func waitPushes(t *testing.T, s *stack.Stack, n int) {
	t.Helper()
	start := agentPushes(t, s)
	poll(t, func() bool { return agentPushes(t, s) >= start+float64(n) }, "the agent stopped pushing")
	awaitRouters()
}

// awaitRouters waits until every request decides on what was stored
// before the call: each router VM re-reads shared data on its tick, and a
// request re-reads itself once the last re-read is twice the refresh
// interval old.
func awaitRouters() { time.Sleep(2*config.DefaultSnapshotRefresh + 2*time.Millisecond) }
