package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
)

func TestFlagsBuildTheServerConfig(t *testing.T) {
	o, err := parseFlags([]string{"--addr", "127.0.0.1:0", "--name", "pod-a", "--adapters", "a, b,,c",
		"--max-loras", "2", "--model-profile", "llama-3.1-8b", "--kv-capacity-tokens", "200000",
		"--time-scale", "10", "--metrics-names", "v0", "--error-rate", "0.1",
		"--latency-spike-rate", "0.2", "--latency-spike", "1s", "--metrics-down", "--seed", "9",
		"--max-cpu-loras", "3", "--lora-disk-load", "300ms", "--block-size", "32", "--enable-prefix-caching=false",
		"--enable-prompt-tokens-details=false", "--lora-admission", "fifo"})
	require.NoError(t, err)
	cfg, err := serverConfig(o, nil)
	require.NoError(t, err)
	assert.Equal(t, "pod-a", cfg.Name)
	assert.Equal(t, []string{"a", "b", "c"}, cfg.Adapters)
	assert.Equal(t, 2, cfg.Replica.MaxLoRAs)
	assert.Equal(t, vllmsim.Llama31_8B, cfg.Replica.Profile)
	assert.Equal(t, 200000, cfg.Replica.KVCapacityTokens)
	assert.Equal(t, 131072, cfg.Replica.MaxModelLen)
	assert.Equal(t, 10.0, cfg.TimeScale)
	assert.Equal(t, vllmsim.MetricsV0, cfg.MetricsNames)
	assert.Equal(t, vllmsim.Faults{ErrorRate: 0.1, LatencySpikeRate: 0.2, LatencySpike: time.Second, MetricsDown: true}, cfg.Faults)
	assert.Equal(t, uint64(9), cfg.Seed)
	assert.Equal(t, 3, cfg.Replica.AdapterLoad.MaxCPUAdapters)
	assert.Equal(t, 300*time.Millisecond, cfg.Replica.AdapterLoad.DiskLoad)
	assert.Equal(t, 32, cfg.Replica.BlockSize)
	assert.False(t, cfg.Replica.EnablePrefixCaching)
	assert.False(t, cfg.PromptTokensDetails)
	assert.Equal(t, vllmsim.LoRAFIFO, cfg.Replica.LoRAAdmission)

	o, err = parseFlags(nil)
	require.NoError(t, err)
	cfg, err = serverConfig(o, nil)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8000", cfg.Name, "name defaults to the address")
	assert.Equal(t, 0, cfg.Replica.MaxLoRAs, "no adapters, no LoRA")
	assert.Equal(t, vllmsim.MetricsV1, cfg.MetricsNames)
	assert.Equal(t, 16, cfg.Replica.BlockSize)
	assert.True(t, cfg.Replica.EnablePrefixCaching, "on by default, as in vLLM V1")
	assert.True(t, cfg.PromptTokensDetails, "cached_tokens reported by default")
	assert.Equal(t, vllmsim.LoRASkip, cfg.Replica.LoRAAdmission)
}

func TestBadFlagsFail(t *testing.T) {
	for _, args := range [][]string{
		{"--model-profile", "gpt"},
		{"--metrics-names", "v3"},
		{"--adapters", "a", "--max-loras", "0"},
		{"--lora-admission", "random"},
		{"stray"},
	} {
		o, err := parseFlags(args)
		if err == nil {
			_, err = serverConfig(o, nil)
		}
		assert.Error(t, err, "%v", args)
	}
	_, err := parseFlags([]string{"-h"})
	assert.True(t, errors.Is(err, flag.ErrHelp))
}

func TestRunServesAndShutsDownGracefully(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--addr", "127.0.0.1:0", "--name", "r7", "--adapters", "x", "--time-scale", "1000", "--log-level", "warn"},
			func(a string) { addrc <- a })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("run failed: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not listening")
	}
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"model":"x","prompt":"hi","max_tokens":4}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Equal(t, "r7", resp.Header.Get(vllmsim.ReplicaHeader))

	cancel()
	select {
	case err := <-errc:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("no shutdown")
	}
	_, err = http.Get("http://" + addr + "/health")
	assert.Error(t, err, "listener closed")
}

// startRun runs the command in-process with args and returns its address.
func startRun(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"--addr", "127.0.0.1:0", "--log-level", "warn"}, args...), func(a string) { addrc <- a })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-errc:
		case <-time.After(15 * time.Second):
			t.Error("no shutdown")
		}
	})
	select {
	case addr := <-addrc:
		return addr
	case err := <-errc:
		t.Fatalf("run failed: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not listening")
	}
	return ""
}

// TestRepeatedLongPromptHitsTheCache is the command with its default flags:
// the second send of a long prompt reports cached tokens, and /metrics
// counts the hit.
func TestRepeatedLongPromptHitsTheCache(t *testing.T) {
	addr := startRun(t, "--time-scale", "1000")
	prompt := strings.Repeat("Answer from the attached 40-page contract only. ", 100) // 4800 bytes: 1200 tokens
	body := `{"model":"meta-llama/Llama-2-7b-hf","messages":[{"role":"system","content":"` + prompt + `"},{"role":"user","content":"Who signs?"}],"max_tokens":8}`
	cached := func() int {
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var out struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.NotNil(t, out.Usage.PromptTokensDetails)
		return out.Usage.PromptTokensDetails.CachedTokens
	}
	assert.Equal(t, 0, cached())
	second := cached()
	assert.Greater(t, second, 1000)

	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	hits := regexp.MustCompile(`(?m)^vllm:prefix_cache_hits_total\{[^}]*\} (\d+)$`).FindSubmatch(page)
	require.NotNil(t, hits, "%s", page)
	assert.Equal(t, strconv.Itoa(second), string(hits[1]))
	assert.Regexp(t, `vllm:cache_config_info\{[^}]*enable_prefix_caching="True"`, string(page))
}
