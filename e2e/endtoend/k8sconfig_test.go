package endtoend

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// k8sObjects is an InferencePool and an InferenceModelRewrite splitting the
// requested model "sql" between two adapters, as kubectl would apply them.
func k8sObjects(w1, w2 int) string {
	return fmt.Sprintf(`apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: vllm-pool
  namespace: llm
spec:
  selector:
    matchLabels:
      app: vllm
  targetPorts:
  - number: 8000
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata:
  name: sql-canary
  namespace: llm
  creationTimestamp: "2026-01-01T00:00:00Z"
spec:
  poolRef:
    name: vllm-pool
  rules:
  - matches:
    - model:
        value: sql
    targets:
    - modelRewrite: sql-lora-1
      weight: %d
    - modelRewrite: sql-lora-2
      weight: %d
`, w1, w2)
}

// agentCycles reads the agent's completed cycles from its /metrics.
func agentCycles(ctx context.Context, s *stack.Stack) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.AgentURL()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "wasm_epp_agent_cycle_duration_seconds_count "); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no cycle count in the agent's metrics")
}

// servedModel is the model a replica says it served.
func servedModel(t *testing.T, r reply) string {
	t.Helper()
	var v struct {
		Model string `json:"model"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &v), "body %s", r)
	return v.Model
}

// TestKubernetesModelTable is the model table end to end: the real agent
// reads InferencePool and InferenceModelRewrite YAML (--test-objects-file,
// read at the start of every cycle), pushes the table to the real plugin's
// receiver in the gateway, and the router rewrites requests by it. Under a
// steady stream of requests, the rewrite's weights go from 100/0 to 0/100:
// every request sent once the agent has completed two cycles after the
// change goes to the new target, no request fails, and the gateway is
// never restarted.
func TestKubernetesModelTable(t *testing.T) {
	objects := filepath.Join(t.TempDir(), "objects.yaml")
	require.NoError(t, os.WriteFile(objects, []byte(k8sObjects(100, 0)), 0o600))
	const interval = 100 * time.Millisecond
	s := startStack(t, stack.Config{
		Replicas: 2, Adapters: []string{"sql-lora-1", "sql-lora-2"}, MaxLoRAs: 4, TimeScale: 20,
		AgentInterval: interval,
		AgentArgs:     []string{"--inference-pool", "llm/vllm-pool", "--test-objects-file", objects},
	})
	gatewayPid := s.GatewayProcess(0).Pid()

	// The table arrives: "sql", which the bootstrap does not know, is served as sql-lora-1.
	require.Eventually(t, func() bool {
		r := complete(t, s, "sql", 2)
		return r.Status == http.StatusOK && servedModel(t, r) == "sql-lora-1"
	}, waitLong, tick, "the table from the objects file reaches the router")

	type sample struct {
		at     time.Time
		status int
		model  string
		err    error
	}
	var (
		mu      sync.Mutex
		samples []sample
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 4 { // a few clients, each sending one request after another
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				at := time.Now()
				r, err := trySend(context.Background(), http.MethodPost, s.ClientURL()+"/v1/completions", completion("sql", 2), nil)
				smp := sample{at: at, status: r.Status, err: err}
				if err == nil && r.Status == http.StatusOK {
					var v struct {
						Model string `json:"model"`
					}
					if json.Unmarshal(r.Body, &v) == nil {
						smp.model = v.Model
					}
				}
				mu.Lock()
				samples = append(samples, smp)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(5 * interval) // requests flow on the old split

	require.NoError(t, os.WriteFile(objects, []byte(k8sObjects(0, 100)), 0o600))
	changed := time.Now()
	c0, err := agentCycles(ctx, s)
	require.NoError(t, err)
	var settled time.Time // when two cycles have completed since the change
	require.Eventually(t, func() bool {
		c, err := agentCycles(ctx, s)
		if err == nil && c >= c0+2 {
			settled = time.Now()
			return true
		}
		return false
	}, waitLong, 10*time.Millisecond)
	time.Sleep(10 * interval) // requests flow on the new split
	cancel()
	wg.Wait()

	var before, after, failed int
	firstNew := time.Duration(-1)
	for _, smp := range samples {
		if smp.err != nil || smp.status != http.StatusOK {
			failed++
			t.Errorf("request at %s failed: status %d, %v", smp.at.Format(time.StampMilli), smp.status, smp.err)
			continue
		}
		switch {
		case smp.at.Before(changed):
			before++
			assert.Equal(t, "sql-lora-1", smp.model, "sent before the change")
		case !smp.at.Before(settled):
			after++
			assert.Equal(t, "sql-lora-2", smp.model, "sent %s after two agent cycles since the change", smp.at.Sub(settled))
		}
		if smp.model == "sql-lora-2" && (firstNew < 0 || smp.at.Sub(changed) < firstNew) {
			firstNew = smp.at.Sub(changed)
		}
	}
	require.Positive(t, before, "requests before the change")
	require.Positive(t, after, "requests after the change")
	assert.Zero(t, failed)
	assert.Equal(t, gatewayPid, s.GatewayProcess(0).Pid(), "the gateway was not restarted")
	assert.False(t, s.GatewayProcess(0).Exited())
	t.Logf("%d requests before the change, %d after two agent cycles (%s after it); first request on the new target sent %s after the change; none failed",
		before, after, settled.Sub(changed).Round(time.Millisecond), firstNew.Round(time.Millisecond))
}
