package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

func routerConfig(t *testing.T) *config.Config {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "envoy", "envoy.yaml"))
	require.NoError(t, err)
	info, err := stack.InspectBootstrap(b)
	require.NoError(t, err)
	return info.Router
}

func TestBuildMixCoversEveryConfiguredModel(t *testing.T) {
	c := routerConfig(t)
	mix := buildMix(c, stack.DefaultModel)
	require.Len(t, mix, len(c.Models))
	var sum float64
	byName := map[string]mixEntry{}
	for _, m := range mix {
		sum += m.Weight
		byName[m.Model] = m
		require.Positive(t, m.Weight, m.Model)
	}
	require.InDelta(t, 1, sum, 1e-9)
	require.InDelta(t, 0.10, byName[stack.DefaultModel].Weight, 1e-9)
	require.InDelta(t, 0.10, byName["sql-assistant"].Weight, 1e-9)
	require.Greater(t, byName["sql-lora-0"].Weight, byName["sql-lora-9"].Weight, "earlier adapters are hotter")
	require.Equal(t, config.CriticalitySheddable, byName["sql-lora-9"].Criticality)
}

func TestLoadShapeInverse(t *testing.T) {
	for _, ramp := range []float64{0, 0.3, 1} {
		l := loadShape{Duration: 20 * time.Second, Peak: 50, Ramp: ramp}
		for _, x := range []float64{0.1, 1, 7, 12.5, 19.9} {
			require.InDelta(t, x, l.inverse(l.cumulative(x)), 1e-6, "ramp %v t %v", ramp, x)
		}
		// Expected arrivals: peak/10 rising to peak over the ramp, then peak.
		want := 50*20*(1-ramp) + 27.5*20*ramp
		require.InDelta(t, want, l.cumulative(20), 1e-6)
	}
}

func TestPlanIsDeterministicAndFollowsTheShape(t *testing.T) {
	mix := buildMix(routerConfig(t), stack.DefaultModel)
	shape := loadShape{Duration: 20 * time.Second, Peak: 40, Ramp: 0.5, StreamFrac: 0.3, ChatFrac: 0.3, Seed: 7}
	a, b := plan(shape, mix), plan(shape, mix)
	require.Equal(t, a, b)
	require.NotEqual(t, a, plan(loadShape{Duration: 20 * time.Second, Peak: 40, Ramp: 0.5, Seed: 8}, mix))

	want := shape.cumulative(20) // 650 expected arrivals
	require.InDelta(t, want, float64(len(a)), 4*math.Sqrt(want))
	firstHalf := 0
	streams := 0
	for i, j := range a {
		require.Equal(t, i, j.Seq)
		require.Less(t, j.At, shape.Duration)
		if i > 0 {
			require.GreaterOrEqual(t, j.At, a[i-1].At)
		}
		if j.At < 10*time.Second {
			firstHalf++
		}
		if j.Stream {
			streams++
		}
		require.Positive(t, j.PromptToks)
		require.Positive(t, j.MaxTokens)
	}
	require.Less(t, firstHalf, len(a)/2, "the ramp puts fewer arrivals in the first half")
	require.InDelta(t, 0.3, float64(streams)/float64(len(a)), 0.07)

	capped := plan(loadShape{Duration: 20 * time.Second, Peak: 40, Ramp: 0.5, Seed: 7, MaxJobs: 10}, mix)
	require.Len(t, capped, 10)
}

func TestJobBody(t *testing.T) {
	j := job{Model: "sql-lora-1", PromptToks: 100, MaxTokens: 8, Chat: true, Stream: true}
	require.Equal(t, "/v1/chat/completions", j.path())
	body := string(j.body())
	require.Contains(t, body, `"messages":[{`)
	require.Contains(t, body, `"stream":true`)
	require.Contains(t, body, `"stream_options":{"include_usage":true}`, "streams ask for the usage chunk")
	require.Greater(t, len(body), 400, "4 characters per prompt token")
	require.Less(t, len(body), 560)
	j.Chat = false
	require.Equal(t, "/v1/completions", j.path())
	require.Contains(t, string(j.body()), `"prompt":"Tenant 0 schema. SELECT`)
	// Jobs share one of sharedContexts contexts, then differ.
	other := job{Seq: sharedContexts, Model: "sql-lora-1", PromptToks: 100, MaxTokens: 8}
	a, b := string(j.body()), string(other.body())
	require.NotEqual(t, a, b)
	require.Equal(t, a[:300], b[:300])
}

func TestReadStream(t *testing.T) {
	tests := []struct {
		name, body, wantErr string
		tokens              int
	}{
		{"complete", "data: {\"model\":\"a\",\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"model\":\"a\",\"choices\":[{\"text\":\"y\"}]}\n\n" +
			"data: {\"model\":\"a\",\"choices\":[],\"usage\":{}}\n\ndata: [DONE]\n\n", "", 2},
		{"cut short", "data: {\"model\":\"a\",\"choices\":[{\"text\":\"x\"}]}\n\n", "stream ended without [DONE]", 1},
		{"garbage", "data: {nope\n\n", "bad stream chunk", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := result{Sent: time.Now()}
			err := readStream(strings.NewReader(tt.body), &r)
			if tt.wantErr == "" {
				require.Empty(t, err)
				require.Equal(t, "a", r.Target)
			} else {
				require.Contains(t, err, tt.wantErr)
			}
			require.Equal(t, tt.tokens, r.Tokens)
		})
	}
}

func TestScraperHad(t *testing.T) {
	s := newScraper(100*time.Millisecond, time.Second)
	t0 := time.Unix(1000, 0)
	s.add("r1", adapterSample{At: t0, Adapters: []string{"a", "b"}})
	s.add("r1", adapterSample{At: t0.Add(100 * time.Millisecond), Adapters: []string{"c"}})
	tests := []struct {
		at      time.Time
		adapter string
		want    hit
	}{
		{t0.Add(-time.Millisecond), "a", hitUnknown}, // before any scrape
		{t0, "a", hitYes},
		{t0.Add(50 * time.Millisecond), "b", hitYes},
		{t0.Add(50 * time.Millisecond), "c", hitNo},
		{t0.Add(150 * time.Millisecond), "c", hitYes},
		{t0.Add(150 * time.Millisecond), "a", hitNo},
		{t0.Add(2 * time.Second), "c", hitUnknown}, // scrapes stopped
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, s.had("r1", tt.adapter, tt.at), "%s at +%s", tt.adapter, tt.at.Sub(t0))
	}
	require.Equal(t, hitUnknown, s.had("r2", "a", t0))
	s.observe("pod-name-not-an-address")
	s.observe("127.0.0.1:8001")
	require.Equal(t, []string{"127.0.0.1:8001", "r1"}, s.endpoints(), "only host:port endpoints are scraped")
	for i := range 20 {
		s.add("r1", adapterSample{At: t0.Add(time.Duration(i+2) * 100 * time.Millisecond)})
	}
	require.Len(t, s.samples["r1"], s.history, "history is bounded")
}

func TestSummary(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	results := []result{
		{job: job{Model: "sql-lora-0", Criticality: "Critical"}, Status: 200, Latency: ms(100), Endpoint: "127.0.0.1:8001", Replica: "replica-0", Hit: hitYes},
		{job: job{Model: "sql-lora-0", Criticality: "Critical", Stream: true}, Status: 200, Latency: ms(300), TTFT: ms(20), Endpoint: "127.0.0.1:8001", Replica: "replica-0", Hit: hitNo},
		{job: job{Model: "sql-lora-9", Criticality: "Sheddable"}, Status: 429, ErrType: "rate_limit_exceeded"},
		{job: job{Model: "sql-lora-9", Criticality: "Sheddable"}, Status: 503, ErrType: "service_unavailable"},
		{job: job{Model: stack.DefaultModel, Criticality: "Critical"}, Status: 200, Latency: ms(200), Endpoint: "127.0.0.1:8002", Replica: "replica-1"},
	}
	s := summarize(results, 2*time.Second, 3*time.Second, 1)
	require.Equal(t, 5, s.Total)
	require.Equal(t, 3, s.OK)
	require.Equal(t, 1, s.Dropped)
	require.Equal(t, map[string]int{"503 service_unavailable": 1}, s.Errors)
	require.Equal(t, []time.Duration{ms(100), ms(200), ms(300)}, s.Latency)
	require.Equal(t, 2, s.Replicas["127.0.0.1:8001 (replica-0)"])
	require.Equal(t, 1, s.Hits)
	require.Equal(t, 1, s.Misses)
	require.Equal(t, 1, s.Models["sql-lora-9"].Dropped)

	var b strings.Builder
	s.write(&b)
	out := b.String()
	for _, want := range []string{"5 requests sent over 2s (2.5 req/s), all answered after 3s", "3 ok, 1 dropped (429), 1 failed", "1 not sent",
		"127.0.0.1:8001 (replica-0)", "sql-lora-0", "Adapter hit rate: 50.0% of 2", "503 service_unavailable", ":8001 100%"} {
		require.Contains(t, out, want)
	}
}

func TestPercentile(t *testing.T) {
	v := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.Equal(t, time.Duration(5), percentile(v, 50))
	require.Equal(t, time.Duration(9), percentile(v, 90))
	require.Equal(t, time.Duration(10), percentile(v, 99))
	require.Equal(t, time.Duration(0), percentile(nil, 50))
}

func TestParseFlags(t *testing.T) {
	_, err := parseFlags([]string{"--rate", "0"})
	require.ErrorContains(t, err, "--rate")
	_, err = parseFlags([]string{"--start", "maybe"})
	require.ErrorContains(t, err, "--start")
	o, err := parseFlags([]string{"--duration", "5s", "--seed", "3"})
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, o.duration)
	require.Equal(t, "http://localhost:10000", o.url)
}

func TestSummaryPrefixHitRate(t *testing.T) {
	rs := []result{
		{job: job{Model: "m"}, Status: 200, PromptTokens: 100, CachedTokens: 80},
		{job: job{Model: "m"}, Status: 200, PromptTokens: 100, CachedTokens: 0},
		{job: job{Model: "m"}, Status: 200, PromptTokens: 100, CachedTokens: -1},
	}
	s := summarize(rs, time.Second, time.Second, 0)
	require.Equal(t, 2, s.Reported)
	require.Equal(t, int64(80), s.CachedTokens)
	var out strings.Builder
	s.write(&out)
	require.Contains(t, out.String(), "Prefix cache hit rate: 40.0% of 200 prompt tokens")
}
