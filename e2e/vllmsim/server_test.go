package vllmsim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testModel = "meta-llama/Llama-2-7b-hf"

// startSim serves a simulator on a loopback httptest server. Time runs 1000×
// faster than real, so a 100-token response takes well under a second.
func startSim(t *testing.T, mod func(*ServerConfig)) (*Server, string) {
	t.Helper()
	rc := DefaultReplicaConfig(Llama2_7B)
	rc.MaxLoRAs = 2
	cfg := ServerConfig{
		Name:             "sim-0",
		Model:            testModel,
		Adapters:         []string{"sql-lora", "tweet-lora"},
		Replica:          rc,
		TimeScale:        1000,
		MetricsNames:     MetricsV1,
		Seed:             1,
		DefaultMaxTokens: 16,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := NewServer(cfg)
	require.NoError(t, err)
	s.Start()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); s.Close() })
	return s, hs.URL
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decode[T any](t *testing.T, r io.Reader) T {
	t.Helper()
	var v T
	require.NoError(t, json.NewDecoder(r).Decode(&v))
	return v
}

type testResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageInfo `json:"usage"`
}

func TestCompletionsPlain(t *testing.T) {
	_, url := startSim(t, nil)
	tests := []struct {
		name, path, body string
		wantPrompt, n    int
		chat             bool
	}{
		{"completion", "/v1/completions", `{"model":"sql-lora","prompt":"hello world","max_tokens":5}`, 3, 5, false},
		{"token ids", "/v1/completions", `{"model":"` + testModel + `","prompt":[1,2,3,4,5,6,7]}`, 7, 16, false},
		{"hint", "/v1/completions", `{"model":"tweet-lora","prompt":"x","max_tokens":2,"sim_prompt_tokens":900}`, 900, 2, false},
		{"chat", "/v1/chat/completions", `{"model":"sql-lora","messages":[{"role":"user","content":"12345678"}],"max_completion_tokens":4}`, 8, 4, true},
		{"chat parts", "/v1/chat/completions", `{"model":"sql-lora","messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"abcd"}]}],"max_tokens":3}`, 11, 3, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, url+tc.path, tc.body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "sim-0", resp.Header.Get(ReplicaHeader))
			body := decode[testResponse](t, resp.Body)
			require.Len(t, body.Choices, 1)
			require.NotNil(t, body.Usage)
			assert.Equal(t, tc.wantPrompt, body.Usage.PromptTokens)
			assert.Equal(t, tc.n, body.Usage.CompletionTokens)
			assert.Equal(t, tc.wantPrompt+tc.n, body.Usage.TotalTokens)
			require.NotNil(t, body.Choices[0].FinishReason)
			assert.Equal(t, "length", *body.Choices[0].FinishReason)
			if tc.chat {
				assert.Equal(t, "chat.completion", body.Object)
				assert.True(t, strings.HasPrefix(body.ID, "chatcmpl-"))
				assert.Equal(t, "assistant", body.Choices[0].Message.Role)
				assert.Equal(t, GeneratedText(tc.n), body.Choices[0].Message.Content)
			} else {
				assert.Equal(t, "text_completion", body.Object)
				assert.Equal(t, GeneratedText(tc.n), body.Choices[0].Text)
			}
		})
	}
}

// readSSE returns the data payloads of an event stream, [DONE] included.
func readSSE(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		require.True(t, strings.HasPrefix(line, "data: "), "line %q", line)
		events = append(events, strings.TrimPrefix(line, "data: "))
	}
	require.NoError(t, sc.Err())
	return events
}

func TestCompletionsStreaming(t *testing.T) {
	_, url := startSim(t, nil)
	tests := []struct {
		name, path, body string
		chat, usage      bool
		prompt           int
	}{
		{"completion", "/v1/completions", `{"model":"sql-lora","prompt":"hello","max_tokens":40,"stream":true}`, false, true, 2},
		{"chat", "/v1/chat/completions", `{"model":"tweet-lora","messages":[{"role":"user","content":"hi"}],"max_tokens":40,"stream":true}`, true, true, 6},
		{"no usage", "/v1/completions", `{"model":"` + testModel + `","prompt":"hello","max_tokens":40,"stream":true,"stream_options":{"include_usage":false}}`, false, false, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, url+tc.path, tc.body)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			events := readSSE(t, resp.Body)
			require.NotEmpty(t, events)
			require.Equal(t, "[DONE]", events[len(events)-1])
			events = events[:len(events)-1]

			var text strings.Builder
			var finishes []string
			var usage *usageInfo
			for i, e := range events {
				c := decode[testResponse](t, strings.NewReader(e))
				if c.Usage != nil {
					require.Equal(t, len(events)-1, i, "usage comes last")
					require.Empty(t, c.Choices)
					usage = c.Usage
					continue
				}
				require.Len(t, c.Choices, 1)
				if tc.chat {
					assert.Equal(t, "chat.completion.chunk", c.Object)
					if i == 0 {
						assert.Equal(t, "assistant", c.Choices[0].Delta.Role)
					}
					text.WriteString(c.Choices[0].Delta.Content)
				} else {
					assert.Equal(t, "text_completion", c.Object)
					text.WriteString(c.Choices[0].Text)
				}
				if c.Choices[0].FinishReason != nil {
					finishes = append(finishes, *c.Choices[0].FinishReason)
				}
			}
			assert.Equal(t, GeneratedText(40), text.String())
			assert.Equal(t, []string{"length"}, finishes)
			if tc.usage {
				require.NotNil(t, usage)
				assert.Equal(t, 40, usage.CompletionTokens)
				assert.Equal(t, tc.prompt, usage.PromptTokens)
			} else {
				assert.Nil(t, usage)
			}
		})
	}
}

// TestRepeatedPromptReportsCachedTokens sends one long prompt three times
// (plain, streamed, and with prompt token details off) and reads the cached
// tokens from each response and from /metrics.
func TestRepeatedPromptReportsCachedTokens(t *testing.T) {
	_, url := startSim(t, func(c *ServerConfig) { c.PromptTokensDetails = true })
	prompt := strings.Repeat("The same long system prompt. ", 80)[:2000] // 500 tokens
	body := `{"model":"sql-lora","prompt":"` + prompt + `","max_tokens":4}`

	first := decode[testResponse](t, post(t, url+"/v1/completions", body).Body)
	require.NotNil(t, first.Usage.PromptTokensDetails, "details are sent for a miss too")
	assert.Equal(t, 0, first.Usage.PromptTokensDetails.CachedTokens)

	second := decode[testResponse](t, post(t, url+"/v1/completions", body).Body)
	require.NotNil(t, second.Usage.PromptTokensDetails)
	assert.Equal(t, 496, second.Usage.PromptTokensDetails.CachedTokens, "31 of 32 blocks: the last token is always computed")
	assert.Equal(t, 500, second.Usage.PromptTokens)

	stream := post(t, url+"/v1/completions", `{"model":"sql-lora","prompt":"`+prompt+`","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`)
	events := readSSE(t, stream.Body)
	require.GreaterOrEqual(t, len(events), 2)
	final := decode[testResponse](t, strings.NewReader(events[len(events)-2]))
	require.Empty(t, final.Choices)
	require.NotNil(t, final.Usage.PromptTokensDetails)
	assert.Equal(t, 496, final.Usage.PromptTokensDetails.CachedTokens)

	// Under another adapter the same text misses.
	other := decode[testResponse](t, post(t, url+"/v1/completions", strings.Replace(body, "sql-lora", "tweet-lora", 1)).Body)
	assert.Equal(t, 0, other.Usage.PromptTokensDetails.CachedTokens)

	fams := scrape(t, url)
	assert.Equal(t, 4*500.0, fams["vllm:prefix_cache_queries_total"].GetMetric()[0].GetCounter().GetValue())
	assert.Equal(t, 2*496.0, fams["vllm:prefix_cache_hits_total"].GetMetric()[0].GetCounter().GetValue())

	_, plain := startSim(t, nil)
	resp := post(t, plain+"/v1/completions", body)
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "prompt_tokens_details", "off, as vLLM without --enable-prompt-tokens-details")
}

func TestErrorsFollowVLLM(t *testing.T) {
	_, url := startSim(t, nil)
	tests := []struct {
		name, path, body, typ string
		status                int
	}{
		{"unknown model", "/v1/completions", `{"model":"nope","prompt":"x"}`, "NotFoundError", 404},
		{"unknown chat model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, "NotFoundError", 404},
		{"bad json", "/v1/completions", `{"model":`, "BadRequestError", 400},
		{"no prompt", "/v1/completions", `{"model":"sql-lora"}`, "BadRequestError", 400},
		{"no messages", "/v1/chat/completions", `{"model":"sql-lora","messages":[]}`, "BadRequestError", 400},
		{"too long", "/v1/completions", `{"model":"sql-lora","prompt":"x","sim_prompt_tokens":4000,"max_tokens":200}`, "BadRequestError", 400},
		{"zero max_tokens", "/v1/completions", `{"model":"sql-lora","prompt":"x","max_tokens":0}`, "BadRequestError", 400},
		{"n=2", "/v1/completions", `{"model":"sql-lora","prompt":"x","n":2}`, "BadRequestError", 400},
		{"batch", "/v1/completions", `{"model":"sql-lora","prompt":["a","b"]}`, "BadRequestError", 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, url+tc.path, tc.body)
			require.Equal(t, tc.status, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			assert.Equal(t, "sim-0", resp.Header.Get(ReplicaHeader))
			e := decode[errorBody](t, resp.Body)
			assert.Equal(t, tc.typ, e.Error.Type)
			assert.Equal(t, tc.status, e.Error.Code)
			assert.NotEmpty(t, e.Error.Message)
			if tc.status == 404 {
				assert.Equal(t, "The model `nope` does not exist.", e.Error.Message)
				require.NotNil(t, e.Error.Param)
				assert.Equal(t, "model", *e.Error.Param)
			}
		})
	}
	resp, err := http.Get(url + "/v1/completions")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

func TestModelsAndHealth(t *testing.T) {
	_, url := startSim(t, nil)
	resp, err := http.Get(url + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	list := decode[modelList](t, resp.Body)
	require.Len(t, list.Data, 3)
	assert.Equal(t, testModel, list.Data[0].ID)
	assert.Nil(t, list.Data[0].Parent)
	require.NotNil(t, list.Data[0].MaxModelLen)
	assert.Equal(t, 4096, *list.Data[0].MaxModelLen)
	for i, name := range []string{"sql-lora", "tweet-lora"} {
		assert.Equal(t, name, list.Data[i+1].ID)
		require.NotNil(t, list.Data[i+1].Parent)
		assert.Equal(t, testModel, *list.Data[i+1].Parent)
	}

	h, err := http.Get(url + "/health")
	require.NoError(t, err)
	h.Body.Close()
	assert.Equal(t, http.StatusOK, h.StatusCode)
	assert.Equal(t, "sim-0", h.Header.Get(ReplicaHeader))
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "text/plain; version=0.0.4")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestMetricsNamesAndTypes(t *testing.T) {
	tests := []struct {
		names        MetricsNames
		want, absent []string
		engineLabel  bool
	}{
		{MetricsV0, []string{"vllm:gpu_cache_usage_perc"}, []string{"vllm:kv_cache_usage_perc"}, false},
		{MetricsV1, []string{"vllm:kv_cache_usage_perc"}, []string{"vllm:gpu_cache_usage_perc"}, true},
		{MetricsBoth, []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, nil, true},
	}
	for _, tc := range tests {
		t.Run(string(tc.names), func(t *testing.T) {
			_, url := startSim(t, func(c *ServerConfig) { c.MetricsNames = tc.names })
			resp := post(t, url+"/v1/completions", `{"model":"sql-lora","prompt":"hello","max_tokens":8}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			_, _ = io.Copy(io.Discard, resp.Body)

			fams := scrape(t, url)
			gauges := append([]string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:lora_requests_info", "vllm:cache_config_info"}, tc.want...)
			for _, name := range gauges {
				require.Contains(t, fams, name)
				assert.Equal(t, dto.MetricType_GAUGE, fams[name].GetType(), name)
			}
			for _, name := range tc.absent {
				assert.NotContains(t, fams, name)
			}
			for _, name := range []string{"vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total", "vllm:num_preemptions_total"} {
				require.Contains(t, fams, name)
				assert.Equal(t, dto.MetricType_COUNTER, fams[name].GetType(), name)
			}
			run := fams["vllm:num_requests_running"].GetMetric()[0]
			l := labelsOf(run)
			assert.Equal(t, testModel, l["model_name"])
			_, hasEngine := l["engine"]
			assert.Equal(t, tc.engineLabel, hasEngine)
			assert.Equal(t, 0.0, run.GetGauge().GetValue())
			assert.Equal(t, 8.0, fams["vllm:generation_tokens_total"].GetMetric()[0].GetCounter().GetValue())
			assert.Equal(t, 2.0, fams["vllm:prompt_tokens_total"].GetMetric()[0].GetCounter().GetValue())

			cache := labelsOf(fams["vllm:cache_config_info"].GetMetric()[0])
			assert.Equal(t, "16", cache["block_size"])
			assert.Equal(t, "6875", cache["num_gpu_blocks"])
			assert.Equal(t, "True", cache["enable_prefix_caching"])

			prefix := map[MetricsNames][]string{
				MetricsV0:   {"vllm:gpu_prefix_cache_hit_rate"},
				MetricsV1:   {"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"},
				MetricsBoth: {"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"},
			}[tc.names]
			for _, name := range prefix {
				require.Contains(t, fams, name)
			}
			if tc.names != MetricsV0 {
				assert.Equal(t, 2.0, fams["vllm:prefix_cache_queries_total"].GetMetric()[0].GetCounter().GetValue())
				assert.NotContains(t, fams, "vllm:gpu_prefix_cache_hit_rate")
			}
			if tc.names == MetricsV1 {
				assert.NotContains(t, fams, "vllm:gpu_prefix_cache_queries_total")
			}
		})
	}
}

// latestLoRA returns the lora_requests_info series with the largest value,
// as GAIE's metrics reader picks it.
func latestLoRA(t *testing.T, fams map[string]*dto.MetricFamily) (map[string]string, int) {
	t.Helper()
	require.Contains(t, fams, "vllm:lora_requests_info")
	series := fams["vllm:lora_requests_info"].GetMetric()
	var best *dto.Metric
	for _, m := range series {
		if best == nil || m.GetGauge().GetValue() > best.GetGauge().GetValue() {
			best = m
		}
	}
	return labelsOf(best), len(series)
}

func TestLoRAInfoKeepsOldSeriesAndTimestampsTheLatest(t *testing.T) {
	s, url := startSim(t, nil)
	start := float64(time.Now().Unix())
	fams := scrape(t, url)
	latest, n := latestLoRA(t, fams)
	assert.Equal(t, 1, n, "one empty series at startup")
	assert.Equal(t, map[string]string{"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}, latest)

	for _, a := range []string{"sql-lora", "tweet-lora"} {
		resp := post(t, url+"/v1/completions", `{"model":"`+a+`","prompt":"hello","max_tokens":8}`)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	fams = scrape(t, url)
	latest, n = latestLoRA(t, fams)
	assert.GreaterOrEqual(t, n, 3, "the sql-lora and tweet-lora series stay exposed")
	assert.Equal(t, "", latest["running_lora_adapters"], "idle now")
	seen := map[string]bool{}
	for _, m := range fams["vllm:lora_requests_info"].GetMetric() {
		seen[labelsOf(m)["running_lora_adapters"]] = true
		assert.GreaterOrEqual(t, m.GetGauge().GetValue(), start-1, "value is Unix time")
	}
	assert.True(t, seen["sql-lora"])
	assert.True(t, seen["tweet-lora"])
	assert.Equal(t, 0, s.Metrics().Running)
}

func TestLoRASeriesWhileAdapterWaits(t *testing.T) {
	// Directly on the exposition: running "a", waiting "b,c" renders as vLLM.
	l := newLoRASeries(1)
	t0 := time.Unix(1_700_000_000, 0)
	l.set(nil, nil, t0)
	l.set([]string{"a"}, []string{"b", "c"}, t0.Add(time.Second))
	l.set(nil, nil, t0.Add(2*time.Second))
	var b strings.Builder
	require.NoError(t, writeMetrics(&b, metricsView{names: MetricsV1, model: "m", lora: l.snapshot(), maxLoRA: 1}))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(b.String()))
	require.NoError(t, err)
	series := fams["vllm:lora_requests_info"].GetMetric()
	require.Len(t, series, 2)
	byRunning := map[string]*dto.Metric{}
	for _, m := range series {
		byRunning[labelsOf(m)["running_lora_adapters"]] = m
	}
	assert.Equal(t, "b,c", labelsOf(byRunning["a"])["waiting_lora_adapters"])
	assert.Equal(t, 1_700_000_001.0, byRunning["a"].GetGauge().GetValue())
	assert.Equal(t, 1_700_000_002.0, byRunning[""].GetGauge().GetValue())
}

func TestLoRASeriesCapDropsTheOldest(t *testing.T) {
	l := newLoRASeries(4)
	t0 := time.Unix(1_700_000_000, 0)
	for i := range loraSeriesCap + 10 {
		l.set([]string{strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)}, nil, t0.Add(time.Duration(i)*time.Second))
	}
	snap := l.snapshot()
	assert.Len(t, snap, loraSeriesCap)
	assert.Equal(t, float64(t0.Unix())+float64(loraSeriesCap+9), snap[len(snap)-1].unixSeconds)
	assert.Equal(t, float64(t0.Unix())+10, snap[0].unixSeconds)
}

func TestMetricsEscapeLabelValues(t *testing.T) {
	var b strings.Builder
	require.NoError(t, writeMetrics(&b, metricsView{names: MetricsV0, model: "we\"ird\\model\nname"}))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(b.String()))
	require.NoError(t, err)
	assert.Equal(t, "we\"ird\\model\nname", labelsOf(fams["vllm:num_requests_running"].GetMetric()[0])["model_name"])
	assert.NotContains(t, fams, "vllm:lora_requests_info", "no LoRA series without LoRA")
}

func TestFaultInjection(t *testing.T) {
	t.Run("error rate", func(t *testing.T) {
		_, url := startSim(t, func(c *ServerConfig) { c.Faults.ErrorRate = 1 })
		resp := post(t, url+"/v1/completions", `{"model":"sql-lora","prompt":"x"}`)
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		e := decode[errorBody](t, resp.Body)
		assert.Equal(t, "InternalServerError", e.Error.Type)
		fams := scrape(t, url)
		assert.Equal(t, 1.0, findByLabel(t, fams["vllm_sim:injected_faults_total"], "kind", "error").GetCounter().GetValue())
	})
	t.Run("partial error rate is seeded", func(t *testing.T) {
		outcomes := func() []int {
			_, url := startSim(t, func(c *ServerConfig) { c.Faults.ErrorRate = 0.5; c.Seed = 77 })
			var codes []int
			for range 20 {
				resp := post(t, url+"/v1/completions", `{"model":"sql-lora","prompt":"x","max_tokens":1}`)
				_, _ = io.Copy(io.Discard, resp.Body)
				codes = append(codes, resp.StatusCode)
			}
			return codes
		}
		first := outcomes()
		assert.Equal(t, first, outcomes())
		assert.Contains(t, first, 200)
		assert.Contains(t, first, 500)
	})
	t.Run("latency spike", func(t *testing.T) {
		_, url := startSim(t, func(c *ServerConfig) {
			c.Faults.LatencySpikeRate = 1
			c.Faults.LatencySpike = 2 * time.Second // 2 ms of wall time at 1000×
		})
		resp := post(t, url+"/v1/completions", `{"model":"sql-lora","prompt":"x","max_tokens":3}`)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		fams := scrape(t, url)
		assert.Equal(t, 1.0, findByLabel(t, fams["vllm_sim:injected_faults_total"], "kind", "latency_spike").GetCounter().GetValue())
	})
	t.Run("metrics down and back", func(t *testing.T) {
		s, url := startSim(t, func(c *ServerConfig) { c.Faults.MetricsDown = true })
		resp, err := http.Get(url + "/metrics")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		gen := post(t, url+"/v1/completions", `{"model":"sql-lora","prompt":"x","max_tokens":1}`)
		assert.Equal(t, http.StatusOK, gen.StatusCode, "only /metrics is down")
		require.NoError(t, s.SetFaults(Faults{}))
		scrape(t, url)
	})
	t.Run("invalid", func(t *testing.T) {
		for _, f := range []Faults{{ErrorRate: 2}, {LatencySpikeRate: 0.5}, {LatencySpike: -time.Second}} {
			assert.Error(t, f.validate())
		}
	})
}

func findByLabel(t *testing.T, f *dto.MetricFamily, name, value string) *dto.Metric {
	t.Helper()
	require.NotNil(t, f)
	for _, m := range f.GetMetric() {
		if labelsOf(m)[name] == value {
			return m
		}
	}
	t.Fatalf("no %s series with %s=%q", f.GetName(), name, value)
	return nil
}

func TestClientDisconnectAbortsTheRequest(t *testing.T) {
	// Real time (scale 1): 1000 tokens take ~6 s, far longer than the test.
	s, url := startSim(t, func(c *ServerConfig) { c.TimeScale = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
		strings.NewReader(`{"model":"sql-lora","prompt":"x","max_tokens":1000,"stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "data: "))
	cancel()
	resp.Body.Close()
	require.Eventually(t, func() bool {
		m := s.Metrics()
		return m.Aborted == 1 && m.Running == 0 && m.KVBlocksUsed == 0
	}, 5*time.Second, 5*time.Millisecond)
}

func TestCloseFailsWaitingRequests(t *testing.T) {
	s, url := startSim(t, func(c *ServerConfig) { c.TimeScale = 1 })
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"sql-lora","prompt":"x","max_tokens":1000}`))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return s.Metrics().Running == 1 }, 5*time.Second, time.Millisecond)
	s.Close()
	select {
	case code := <-done:
		assert.Equal(t, http.StatusServiceUnavailable, code)
	case <-time.After(5 * time.Second):
		t.Fatal("request still hanging after Close")
	}
	h, err := http.Get(url + "/health")
	require.NoError(t, err)
	h.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, h.StatusCode)
}

func TestNewServerRejectsBadConfig(t *testing.T) {
	base := func() ServerConfig {
		rc := DefaultReplicaConfig(Llama2_7B)
		rc.MaxLoRAs = 1
		return ServerConfig{Name: "n", Model: "m", Adapters: []string{"a"}, Replica: rc, TimeScale: 1, MetricsNames: MetricsV1, DefaultMaxTokens: 1}
	}
	_, err := NewServer(base())
	require.NoError(t, err)
	tests := map[string]func(*ServerConfig){
		"no name":          func(c *ServerConfig) { c.Name = "" },
		"zero time scale":  func(c *ServerConfig) { c.TimeScale = 0 },
		"metrics names":    func(c *ServerConfig) { c.MetricsNames = "v2" },
		"no max tokens":    func(c *ServerConfig) { c.DefaultMaxTokens = 0 },
		"adapters no lora": func(c *ServerConfig) { c.Replica.MaxLoRAs = 0 },
		"dup adapter":      func(c *ServerConfig) { c.Adapters = []string{"a", "a"} },
		"adapter is model": func(c *ServerConfig) { c.Adapters = []string{"m"} },
		"bad faults":       func(c *ServerConfig) { c.Faults.ErrorRate = -1 },
	}
	for name, mod := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := base()
			mod(&cfg)
			_, err := NewServer(cfg)
			assert.Error(t, err)
		})
	}
}
