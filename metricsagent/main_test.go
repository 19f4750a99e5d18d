package metricsagent

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

var minimal = map[string]string{TokenEnv: "tok"}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig([]string{"--targets", "127.0.0.1:8000", "--envoy-targets", "127.0.0.1:10001"}, env(minimal), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 50*time.Millisecond, cfg.Interval)
	assert.Equal(t, 40*time.Millisecond, cfg.ScrapeTimeout)
	assert.Equal(t, int64(4<<20), cfg.MaxBodyBytes)
	assert.Equal(t, DefaultMetricNames(), cfg.Names)
	assert.Equal(t, "/wasm-epp/v1/push", cfg.PushPath)
	assert.Equal(t, ":9100", cfg.Listen)
	assert.Equal(t, "tok", cfg.PushToken)
	assert.Equal(t, slog.LevelInfo, cfg.LogLevel)
	assert.Equal(t, "8000", cfg.MetricsPort)
	assert.True(t, cfg.AskForNames)
	assert.Equal(t, 1, cfg.MaxProcs)
	assert.Equal(t, wire.DefaultSendThresholds(), cfg.Send)

	cfg, err = ParseConfig([]string{"--targets", "127.0.0.1:8000", "--envoy-targets", "127.0.0.1:10001",
		"--heartbeat", "1s", "--send-waiting-delta", "2", "--send-running-delta", "4", "--send-kv-delta", "0.05"}, env(minimal), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, wire.SendThresholds{Heartbeat: time.Second, Waiting: 2, Running: 4, KVCacheUsage: 0.05}, cfg.Send)
}

func TestParseConfigEnvironment(t *testing.T) {
	e := map[string]string{
		TokenEnv:                          "tok",
		"NODE_NAME":                       "node-7",
		"WASM_EPP_AGENT_POD_SELECTOR":     "app=vllm",
		"WASM_EPP_AGENT_ENVOY_DNS":        "envoy-push:10001",
		"WASM_EPP_AGENT_INTERVAL":         "100ms",
		"WASM_EPP_AGENT_SCRAPE_TIMEOUT":   "80ms",
		"WASM_EPP_AGENT_METRIC_KV_USAGE":  "a, b",
		"WASM_EPP_AGENT_METRIC_LORA_INFO": "",
		"WASM_EPP_AGENT_LOG_LEVEL":        "debug",
	}
	cfg, err := ParseConfig([]string{"--interval", "200ms"}, env(e), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "node-7", cfg.NodeName, "NODE_NAME from the downward API")
	assert.Equal(t, "app=vllm", cfg.PodSelector)
	assert.Equal(t, 200*time.Millisecond, cfg.Interval, "the command line wins over the environment")
	assert.Equal(t, 80*time.Millisecond, cfg.ScrapeTimeout)
	assert.Equal(t, []string{"a", "b"}, cfg.Names.KVUsage)
	assert.Equal(t, "vllm:lora_requests_info", cfg.Names.LoRAInfo, "an empty variable is unset")
	assert.Equal(t, slog.LevelDebug, cfg.LogLevel)

	e["WASM_EPP_AGENT_NODE_NAME"] = "node-8"
	cfg, err = ParseConfig(nil, env(e), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "node-8", cfg.NodeName, "our variable wins over NODE_NAME")

	e["WASM_EPP_AGENT_INTERVAL"] = "soon"
	_, err = ParseConfig(nil, env(e), io.Discard)
	assert.ErrorContains(t, err, `WASM_EPP_AGENT_INTERVAL="soon"`)
}

func TestParseConfigErrors(t *testing.T) {
	base := []string{"--targets", "127.0.0.1:8000", "--envoy-targets", "127.0.0.1:10001"}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		msg  string
	}{
		{"timeout not below interval", append(base, "--scrape-timeout", "50ms"), minimal, "shorter than --interval"},
		{"no token", base, nil, "no push token"},
		{"no envoy", []string{"--targets", "127.0.0.1:8000"}, minimal, "exactly one of --envoy-targets and --envoy-dns"},
		{"both envoy", append(base, "--envoy-dns", "x:1"), minimal, "exactly one"},
		{"kube without node", []string{"--pod-selector", "app=vllm", "--envoy-targets", "a:1"}, minimal, "--node-name"},
		{"kube without selector", []string{"--node-name", "n", "--envoy-targets", "a:1"}, minimal, "--pod-selector or --inference-pool is required"},
		{"selector and pool", []string{"--node-name", "n", "--envoy-targets", "a:1", "--pod-selector", "a=b", "--inference-pool", "llm/p"}, minimal, "exclude each other"},
		{"pool without namespace", []string{"--node-name", "n", "--envoy-targets", "a:1", "--inference-pool", "p"}, minimal, `--inference-pool: "p": want namespace/name`},
		{"pool with a bad name", []string{"--node-name", "n", "--envoy-targets", "a:1", "--inference-pool", "llm/P_Q"}, minimal, `name "P_Q"`},
		{"pool in another namespace", []string{"--node-name", "n", "--envoy-targets", "a:1", "--inference-pool", "llm/p", "--namespace", "x"}, minimal, "differs from the InferencePool's namespace"},
		{"objects file without pool", append(base, "--test-objects-file", "f.yaml"), minimal, "--test-objects-file needs --inference-pool"},
		{"objects file without targets", []string{"--node-name", "n", "--envoy-targets", "a:1", "--inference-pool", "llm/p", "--test-objects-file", "f"}, minimal, "--test-objects-file needs"},
		{"config path same as push path", append(base, "--config-push-path", "/wasm-epp/v1/push"), minimal, "differ from --push-path"},
		{"config resend zero", append(base, "--config-resend", "0s"), minimal, "--config-resend must be positive"},
		{"bad log level", append(base, "--log-level", "loud"), minimal, "--log-level"},
		{"bad log format", append(base, "--log-format", "xml"), minimal, "--log-format"},
		{"unknown flag", append(base, "--bogus"), minimal, "bogus"},
		{"stray argument", append(base, "extra"), minimal, "unexpected arguments"},
		{"bad path", append(base, "--push-path", "push"), minimal, "must start with /"},
		{"empty kv names", append(base, "--metric-kv-usage", " , "), minimal, "--metric-kv-usage"},
		{"heartbeat negative", append(base, "--heartbeat", "-1s"), minimal, "--heartbeat, --send-*: heartbeat -1s"},
		{"heartbeat beyond a minute", append(base, "--heartbeat", "2m"), minimal, "up to 1m0s"},
		{"queue threshold zero", append(base, "--send-waiting-delta", "0"), minimal, "queue thresholds must be at least 1"},
		{"queue threshold not a count", append(base, "--send-running-delta", "1.5"), minimal, "want a whole number"},
		{"queue threshold negative", append(base, "--send-running-delta", "-1"), minimal, "want a whole number"},
		{"kv threshold past 1", append(base, "--send-kv-delta", "2"), minimal, "KV-cache threshold 2: want 0..1"},
		{"kv threshold NaN", append(base, "--send-kv-delta", "NaN"), minimal, "KV-cache threshold NaN"},
		{"body cap zero", append(base, "--max-body-bytes", "0"), minimal, "--max-body-bytes must be between 1 and"},
		{"body cap beyond any page", append(base, "--max-body-bytes", "4611686018427387904"), minimal, "--max-body-bytes must be between 1 and"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(tc.args, env(tc.env), io.Discard)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestParseConfigInferencePool(t *testing.T) {
	cfg, err := ParseConfig([]string{"--node-name", "n", "--envoy-dns", "envoy:10001", "--inference-pool", "llm/vllm-llama"}, env(minimal), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "llm/vllm-llama", cfg.InferencePool)
	assert.True(t, cfg.WriteStatus)
	assert.Equal(t, "/wasm-epp/v1/config", cfg.ConfigPushPath)
	assert.Equal(t, time.Second, cfg.ConfigResend)
	ns, name, err := ParsePoolName(cfg.InferencePool)
	require.NoError(t, err)
	assert.Equal(t, [2]string{"llm", "vllm-llama"}, [2]string{ns, name})
}

func TestHelpNamesEveryEnvironmentVariable(t *testing.T) {
	var out bytes.Buffer
	_, err := ParseConfig([]string{"-h"}, env(nil), &out)
	assert.ErrorIs(t, err, flag.ErrHelp)
	var cfg Config
	var a, b string
	newFlagSet(&cfg, &a, &b).VisitAll(func(f *flag.Flag) {
		assert.Contains(t, out.String(), "[$"+EnvName(f.Name)+"]", f.Name)
	})
	assert.Contains(t, out.String(), TokenEnv)
	assert.Equal(t, 0, Main(context.Background(), []string{"-h"}, env(nil), io.Discard))
	assert.Equal(t, 2, Main(context.Background(), []string{"--bogus"}, env(nil), io.Discard))
}

func TestHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.ScrapeErrors.WithLabelValues("llm/a", "timeout").Inc()
	ready := false
	srv := httptest.NewServer(Handler(reg, func() bool { return ready }))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/healthz")
	assert.Equal(t, 200, code)
	code, _ = get("/readyz")
	assert.Equal(t, 503, code)
	ready = true
	code, _ = get("/readyz")
	assert.Equal(t, 200, code)
	code, body := get("/metrics")
	assert.Equal(t, 200, code)
	for _, name := range []string{"wasm_epp_agent_scrape_errors_total{pod=\"llm/a\",reason=\"timeout\"} 1",
		"wasm_epp_agent_endpoints_reported", "wasm_epp_agent_push_payload_bytes", "process_resident_memory_bytes", "go_goroutines"} {
		assert.Contains(t, body, name)
	}
}

// TestMainRunsAndShutsDown runs the whole command in-process against
// loopback pods and a decoding Envoy stand-in, then cancels it as SIGTERM
// would.
func TestMainRunsAndShutsDown(t *testing.T) {
	pod := newPodServer(t, serveText(golden(t, "vllm-v1.txt")))
	const token = "tok-9f3a2b"
	envoy := newSink(t, token)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var logs bytes.Buffer
	go func() {
		done <- Main(ctx, []string{
			"--targets", strings.TrimPrefix(pod.srv.URL, "http://"),
			"--envoy-targets", envoy.addr(),
			"--agent-id", "test-agent",
			"--scrape-timeout", "2s", "--interval", "3s", // generous: the machine may be busy
			"--listen", "127.0.0.1:0",
			"--max-procs", "0", // leave the test process's GOMAXPROCS alone
		}, env(map[string]string{TokenEnv: token}), &lockedWriter{w: &logs})
	}()
	p := envoy.next(t)
	assert.Equal(t, "test-agent", p.AgentID)
	require.Len(t, p.Endpoints, 1)
	assert.Equal(t, uint32(7), p.Endpoints[0].Waiting)
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code)
	case <-time.After(10 * time.Second):
		t.Fatal("Main did not return after cancellation")
	}
	assert.NotContains(t, logs.String(), token, "the token is never logged")
	assert.Contains(t, logs.String(), "shutting down")
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// String is what was written, for a writer that can say (a bytes.Buffer,
// a strings.Builder).
func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.(fmt.Stringer).String()
}
