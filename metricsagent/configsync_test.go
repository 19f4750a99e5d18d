package metricsagent

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

func writeObjects(t *testing.T, path string, files ...string) {
	t.Helper()
	var docs []string
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join("testdata", "k8s", f))
		require.NoError(t, err)
		docs = append(docs, string(b))
	}
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(docs, "\n---\n")), 0o600))
}

// TestConfigRecordsReachEnvoys: objects from a file become a record that
// the agent's cycle pushes with the push token, again when it changes,
// again after Resend, and not otherwise; a 409 is not a push failure.
func TestConfigRecordsReachEnvoys(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := filepath.Join(t.TempDir(), "objects.yaml")
	writeObjects(t, path, "pools.yaml", "objectives.yaml", "rewrites.yaml")
	src, err := NewFileObjectSource(path)
	require.NoError(t, err)
	m := NewMetrics(prometheus.NewRegistry())
	cs := NewConfigSync(ConfigSyncOptions{Source: src, PoolNamespace: "llm", PoolName: "vllm-llama", AgentID: "node-1", Log: quietLog, Metrics: m})
	go cs.Run(ctx)

	envoy := newSink(t, "tok")
	configPusher := &Pusher{Client: NewPushClient(), Path: wire.ConfigPath, Timeout: 5 * time.Second, Token: &TokenSource{Value: "tok"},
		Log: quietLog, Metrics: m.configPushMetrics(), Delivered: func(s int) bool { return s == http.StatusConflict }}
	t.Cleanup(configPusher.Close)
	a := newTestAgent(t, nil, []string{envoy.addr()}, "tok", time.Second)
	a.config = &ConfigPublisher{Payload: cs.Payload, Pusher: configPusher, Resend: time.Minute}
	a.before = func() {
		if changed, err := src.Poll(); err == nil && changed {
			cs.Rebuild()
		}
	}

	a.Cycle(ctx)
	first := envoy.nextConfig(t)
	assert.Equal(t, BuildTable(testTableInput(t), wire.ConfigLimits{}).Table, first.Table)
	assert.Equal(t, "node-1", first.AgentID)

	a.Cycle(ctx)
	a.Cycle(ctx)
	select {
	case r := <-envoy.configs:
		t.Fatalf("an unchanged record was pushed again before Resend: %+v", r.Revision)
	case <-time.After(200 * time.Millisecond):
	}

	// The file changes: the next cycle pushes the new table, at a higher revision.
	writeObjects(t, path, "pools.yaml", "objectives.yaml")
	envoy.mu.Lock()
	envoy.conflict = true
	envoy.mu.Unlock()
	a.Cycle(ctx)
	second := envoy.nextConfig(t)
	assert.Empty(t, second.Table.Rewrites)
	assert.True(t, second.Revision.Covers(first.Revision) && second.Revision != first.Revision, "%v then %v", first.Revision, second.Revision)

	// Resend: the same record again once the fake clock passed it.
	a.clock.Advance(time.Minute)
	a.Cycle(ctx)
	third := envoy.nextConfig(t)
	assert.Equal(t, second.Revision, third.Revision)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 0, testutil.CollectAndCount(m.ConfigPushErrors), "409 (the Envoy holds a newer table) is not an error")
}

func TestFileObjectSourceErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n"), 0o600))
	_, err := NewFileObjectSource(bad)
	assert.ErrorContains(t, err, `kind "Pod" is not InferencePool, InferenceObjective or InferenceModelRewrite`)
	require.NoError(t, os.WriteFile(bad, []byte("a: 1\na: 2\n"), 0o600))
	_, err = NewFileObjectSource(bad)
	assert.Error(t, err, "duplicate keys")
	_, err = NewFileObjectSource(filepath.Join(dir, "missing.yaml"))
	assert.Error(t, err)
}

// TestAgentTableLimitsFollowTheReceiver: a receiver whose maxModelNameLength
// or maxConfigBytes is below the defaults refuses a record past them whole
// (400/413), so one long name would keep every change from every Envoy.
// Given the same bounds, the agent rejects just the objects past them, and
// the rest of the table gets through.
func TestAgentTableLimitsFollowTheReceiver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "objects.yaml")
	writeObjects(t, path, "pools.yaml", "objectives.yaml", "rewrites.yaml")
	require.Equal(t, []string{"llama", "llama-chat", "sql"}, rewriteModels(BuildTable(testTableInput(t), wire.ConfigLimits{}).Table))
	for _, tc := range []struct {
		nameLen, bytes int
		models         []string
	}{
		{11, 262144, nil},                          // every rewrite names a 12-byte target
		{12, 450, []string{"llama", "llama-chat"}}, // the oldest rewrite fits, the next does not
		{12, 262144, []string{"llama", "llama-chat", "sql"}},
	} {
		cfg, err := ParseConfig([]string{"--targets", "127.0.0.1:8000", "--envoy-targets", "127.0.0.1:9002", "--agent-id", "node-1",
			"--inference-pool", "llm/vllm-llama", "--test-objects-file", path,
			"--max-model-name-length", strconv.Itoa(tc.nameLen), "--max-table-bytes", strconv.Itoa(tc.bytes)}, env(minimal), io.Discard)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cs, _, err := newConfigSync(ctx, cfg, nil, quietLog, NewMetrics(prometheus.NewRegistry()))
		require.NoError(t, err)
		rec, err := wire.DecodeConfig(cs.Payload(), wire.ConfigLimits{MaxModelNameLen: tc.nameLen, MaxBytes: tc.bytes}) // the plugin's bounds
		cancel()
		require.NoError(t, err, "the receiver takes the agent's record (%d, %d)", tc.nameLen, tc.bytes)
		assert.Equal(t, tc.models, rewriteModels(rec.Table), "%d, %d", tc.nameLen, tc.bytes)
	}

	for _, bad := range [][]string{{"--max-model-name-length", "0"}, {"--max-table-bytes", "0"}, {"--max-table-bytes", "16777217"}} {
		_, err := ParseConfig(append([]string{"--targets", "127.0.0.1:8000", "--envoy-targets", "127.0.0.1:9002"}, bad...), env(minimal), io.Discard)
		assert.ErrorContains(t, err, bad[0], bad)
	}
}
