package metricsagent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// t0 is the fake clock's start; tests never read the wall clock for values.
var t0 = time.Unix(1_760_000_000, 0)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// sink is a loopback Envoy stand-in: it checks the token and decodes every
// push with wire.DecodePush, and every configuration record with
// wire.DecodeConfig, as the plugin's receiver does.
type sink struct {
	srv    *httptest.Server
	token  string
	block  chan struct{} // when non-nil, every request waits for it
	mu     sync.Mutex
	pushes []*wire.Push
	got    chan *wire.Push
	// configs receives the records; conflict answers them 409 (an Envoy
	// holding a newer table).
	configs  chan *wire.DecodedConfig
	conflict bool
}

func newSink(t *testing.T, token string) *sink {
	s := &sink{token: token, got: make(chan *wire.Push, 100), configs: make(chan *wire.DecodedConfig, 100)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	if s.block != nil {
		select {
		case <-s.block:
		case <-r.Context().Done():
			return
		}
	}
	if r.Method != http.MethodPost || (r.URL.Path != wire.PushPath && r.URL.Path != wire.ConfigPath) {
		http.Error(w, "wrong method or path", http.StatusNotFound)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+s.token {
		http.Error(w, "bad token", http.StatusUnauthorized)
		return
	}
	if r.Header.Get("Content-Type") != "application/octet-stream" {
		http.Error(w, "bad content type", http.StatusBadRequest)
		return
	}
	b, _ := io.ReadAll(r.Body)
	if r.URL.Path == wire.ConfigPath {
		s.serveConfig(w, b)
		return
	}
	p, err := wire.DecodeAgentPush(b, wire.Limits{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.pushes = append(s.pushes, p)
	s.mu.Unlock()
	s.got <- p
	w.WriteHeader(http.StatusNoContent)
}

func (s *sink) serveConfig(w http.ResponseWriter, b []byte) {
	rec, err := wire.DecodeConfig(b, wire.ConfigLimits{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	conflict := s.conflict
	s.mu.Unlock()
	s.configs <- rec
	if conflict {
		http.Error(w, "not newer", http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// nextConfig waits for the next configuration record.
func (s *sink) nextConfig(t *testing.T) *wire.DecodedConfig {
	t.Helper()
	select {
	case r := <-s.configs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no configuration record arrived")
		return nil
	}
}

func (s *sink) addr() string { u, _ := url.Parse(s.srv.URL); return u.Host }

// next waits for the next push (bounded: a hang is a failure, not a wait).
func (s *sink) next(t *testing.T) *wire.Push {
	t.Helper()
	select {
	case p := <-s.got:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no push arrived")
		return nil
	}
}

// podServer serves whatever handler is current; tests swap it between cycles.
type podServer struct {
	srv     *httptest.Server
	handler atomic.Pointer[http.HandlerFunc]
}

func newPodServer(t testing.TB, h http.HandlerFunc) *podServer {
	p := &podServer{}
	p.set(h)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*p.handler.Load())(w, r) }))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *podServer) set(h http.HandlerFunc) { p.handler.Store(&h) }

func (p *podServer) target(ns, name string) Target {
	ap := netip.MustParseAddrPort(strings.TrimPrefix(p.srv.URL, "http://"))
	return newTarget(ns, name, ap.Addr(), ap.Port(), "/metrics")
}

func serveText(body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(body)
	}
}

type fixedTargets []Target

func (f fixedTargets) Targets() []Target { return f }

type testAgent struct {
	*Agent
	clock   *fakeClock
	metrics *Metrics
	pusher  *Pusher
}

func newTestAgent(t *testing.T, targets []Target, envoys []string, token string, scrapeTimeout time.Duration) *testAgent {
	clock := &fakeClock{t: t0}
	m := NewMetrics(prometheus.NewRegistry())
	pusher := &Pusher{Client: NewPushClient(), Path: "/wasm-epp/v1/push", Timeout: 5 * time.Second,
		Token: &TokenSource{Value: token}, Log: quietLog, Metrics: m}
	t.Cleanup(pusher.Close)
	a := NewAgent(Options{
		AgentID: "node-1", Interval: 50 * time.Millisecond, Discoverer: fixedTargets(targets),
		Scraper: &Scraper{Timeout: scrapeTimeout, MaxBodyBytes: 64 << 10, Names: DefaultMetricNames(), AskForNames: true},
		Envoys:  StaticEnvoys(envoys), Pusher: pusher, Now: clock.Now, Log: quietLog, Metrics: m,
	})
	t.Cleanup(a.Close)
	return &testAgent{Agent: a, clock: clock, metrics: m, pusher: pusher}
}

// TestBadExpositions serves bad metrics pages from real loopback servers: a
// first good scrape, then the bad page. A failure keeps the last good
// values and their scrape time (the pod ages towards stale at the
// receiver) and marks the pod unhealthy; the last two cases are unusual
// pages that are read correctly.
func TestBadExpositions(t *testing.T) {
	v0 := golden(t, "vllm-v0.6.txt")
	good := PodMetrics{Waiting: 3, Running: 14, KVCacheUsage: 0.4171, MaxAdapters: 4,
		ActiveAdapters: []string{"sql-lora", "tweet-summary"}, WaitingAdapters: []string{"code-lora"}}
	tests := []struct {
		row     string
		handler http.HandlerFunc
		status  wire.ScrapeStatus
		want    PodMetrics // for rows read correctly
	}{
		{"17 endless body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			for r.Context().Err() == nil {
				if _, err := w.Write(v0); err != nil {
					return
				}
			}
		}, wire.ScrapeBodyTooLarge, PodMetrics{}},
		{"17 huge body", serveText([]byte(strings.Repeat("# padding comment line\n", 4000) + string(v0))), wire.ScrapeBodyTooLarge, PodMetrics{}},
		{"18 slower than the timeout", func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // answers only once the agent gave up
		}, wire.ScrapeTimeout, PodMetrics{}},
		{"18 headers then a stalled body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write(v0[:100])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, wire.ScrapeTimeout, PodMetrics{}},
		{"19 status 503", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "engine dead", http.StatusServiceUnavailable)
		}, wire.ScrapeHTTPStatus, PodMetrics{}},
		{"19 HTML page", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, "<!DOCTYPE html><html><body>login</body></html>")
		}, wire.ScrapeBadContentType, PodMetrics{}},
		{"19 HTML sent as text/plain", serveText([]byte("<html><body>oops</body></html>\n")), wire.ScrapeMissingMetric, PodMetrics{}},
		{"20 NaN", serveText(page(waiting2, "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running NaN", kvV1)), wire.ScrapeInvalidValue, PodMetrics{}},
		{"20 +Inf", serveText(page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting +Inf", running5, kvV1)), wire.ScrapeInvalidValue, PodMetrics{}},
		{"20 negative queue", serveText(page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting -3", running5, kvV1)), wire.ScrapeInvalidValue, PodMetrics{}},
		{"20 KV above 1", serveText(page(waiting2, running5, "# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc 1.5")), wire.ScrapeInvalidValue, PodMetrics{}},
		{"21 untyped", serveText(page("vllm:num_requests_waiting 3", running5, kvV1)), wire.ScrapeInvalidValue, PodMetrics{}},
		{"21 duplicate unlabelled series", serveText(page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 3", "vllm:num_requests_waiting 99", running5, kvV1)),
			wire.ScrapeParseError, PodMetrics{}},
		// A page cut short: with a Content-Length that matches what was
		// sent, and with a body that runs to the end of a connection the
		// pod closed mid-page. Both are whole HTTP answers of incomplete pages.
		{"truncated page, whole HTTP answer", serveText([]byte(strings.TrimSuffix(string(page(running5, kvV1, "# TYPE vllm:num_requests_waiting gauge",
			`vllm:num_requests_waiting{model_name="m"} 17.0`)), "7.0\n"))), wire.ScrapeParseError, PodMetrics{}},
		{"truncated page, connection closed mid-page", func(w http.ResponseWriter, r *http.Request) {
			conn, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n")
			_, _ = bw.Write(v0[:len(v0)-len(v0)/3]) // ends inside a line
			_ = bw.Flush()
		}, wire.ScrapeParseError, PodMetrics{}},
		{"22 several LoRA series", serveText(page(waiting2, running5, kvV1, "# TYPE vllm:lora_requests_info gauge",
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.76e9`,
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="new-a,new-b",waiting_lora_adapters="q"} 1.77e9`,
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="mid",waiting_lora_adapters=""} 1.765e9`)),
			wire.ScrapeOK, PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.5, MaxAdapters: 2, ActiveAdapters: []string{"new-a", "new-b"}, WaitingAdapters: []string{"q"}}},
		{"23 only the v1 KV name", serveText(golden(t, "vllm-v1.txt")), wire.ScrapeOK,
			PodMetrics{Waiting: 7, Running: 31, KVCacheUsage: 0.8125, MaxAdapters: 2, ActiveAdapters: []string{"fin-lora", "sql-lora"}, WaitingAdapters: []string{"sql-lora"}}},
	}
	for _, tc := range tests {
		t.Run(tc.row, func(t *testing.T) {
			pod := newPodServer(t, serveText(v0))
			envoy := newSink(t, "s3cret")
			timeout := 5 * time.Second // generous: the machine may be busy; row 18 never needs it to elapse...
			if strings.HasPrefix(tc.row, "18") {
				timeout = 300 * time.Millisecond // ...except row 18, which is about it elapsing
			}
			a := newTestAgent(t, []Target{pod.target("llm", "vllm-0")}, []string{envoy.addr()}, "s3cret", timeout)

			a.Cycle(context.Background())
			first := envoy.next(t)
			require.Len(t, first.Endpoints, 1)
			e := first.Endpoints[0]
			assert.Equal(t, wire.ScrapeOK, e.LastError)
			assert.Equal(t, good, podMetricsOf(e))
			assert.Equal(t, t0, e.ScrapeTime)

			pod.set(tc.handler)
			a.clock.Advance(time.Second)
			a.Cycle(context.Background())
			second := envoy.next(t)
			require.Len(t, second.Endpoints, 1)
			e = second.Endpoints[0]
			assert.Greater(t, second.Seq, first.Seq)
			assert.Equal(t, tc.status, e.LastError)
			if tc.status == wire.ScrapeOK {
				assert.Equal(t, tc.want, podMetricsOf(e))
				assert.Equal(t, t0.Add(time.Second), e.ScrapeTime)
				return
			}
			assert.Equal(t, good, podMetricsOf(e), "last good values kept, not zeroed")
			assert.Equal(t, t0, e.ScrapeTime, "scrape time stays the last good one: the pod ages towards stale")
			assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.ScrapeErrors.WithLabelValues("llm/vllm-0", tc.status.String())))
			assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.EndpointsUnhealthy))

			// And it recovers on the next good scrape.
			pod.set(serveText(v0))
			a.clock.Advance(time.Second)
			a.Cycle(context.Background())
			third := envoy.next(t)
			assert.Equal(t, wire.ScrapeOK, third.Endpoints[0].LastError)
			assert.Equal(t, t0.Add(2*time.Second), third.Endpoints[0].ScrapeTime)
		})
	}
}

// TestOneBadPodAmongGoodOnes: a pod whose page carries a bad value fails
// its own scrape only. The good pods next to it are pushed with their new
// values in the same push, and the bad one is marked unhealthy with its last
// good values (or left out when it never had any).
func TestOneBadPodAmongGoodOnes(t *testing.T) {
	withValues := func(waiting int, kv string, adapter string) []byte {
		return page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting "+strconv.Itoa(waiting), running5,
			"# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc "+kv,
			"# TYPE vllm:lora_requests_info gauge", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="`+adapter+`",waiting_lora_adapters=""} 1.7e9`)
	}
	longName := strings.Repeat("a", wire.DefaultLimits().MaxNameLen+1)
	good1, good2 := newPodServer(t, serveText(withValues(1, "0.1", "x"))), newPodServer(t, serveText(withValues(2, "0.2", "y")))
	bad := newPodServer(t, serveText(withValues(3, "0.3", "z")))
	never := newPodServer(t, serveText(withValues(4, "NaN", "w"))) // bad from the start
	envoy := newSink(t, "tok")
	a := newTestAgent(t, []Target{good1.target("llm", "a"), bad.target("llm", "b"), good2.target("llm", "c"), never.target("llm", "d")},
		[]string{envoy.addr()}, "tok", 5*time.Second)

	a.Cycle(context.Background())
	p := envoy.next(t)
	require.Len(t, p.Endpoints, 3, "the pod that never had a good scrape is left out")
	for _, e := range p.Endpoints {
		assert.Equal(t, wire.ScrapeOK, e.LastError, e.Name)
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.ScrapeErrors.WithLabelValues("llm/d", wire.ScrapeInvalidValue.String())))

	for step, badPage := range []struct {
		name string
		body []byte
	}{
		{"NaN KV", withValues(30, "NaN", "z")},
		{"adapter name over the wire limit", withValues(31, "0.31", longName)},
	} {
		bad.set(serveText(badPage.body))
		good1.set(serveText(withValues(10+step, "0.5", "x")))
		good2.set(serveText(withValues(20+step, "0.6", "y")))
		a.clock.Advance(time.Second)
		a.Cycle(context.Background())
		p := envoy.next(t)
		require.Len(t, p.Endpoints, 3, badPage.name)
		byName := map[string]wire.EndpointState{}
		for _, e := range p.Endpoints {
			byName[e.Name] = e
		}
		now := t0.Add(time.Duration(step+1) * time.Second)
		for name, waiting := range map[string]uint32{"a": uint32(10 + step), "c": uint32(20 + step)} {
			e := byName[name]
			assert.Equal(t, wire.ScrapeOK, e.LastError, "%s: %s", badPage.name, name)
			assert.Equal(t, waiting, e.Waiting, "%s: %s has its new values", badPage.name, name)
			assert.Equal(t, now, e.ScrapeTime, "%s: %s", badPage.name, name)
		}
		e := byName["b"]
		assert.Equal(t, wire.ScrapeInvalidValue, e.LastError, badPage.name)
		assert.Equal(t, uint32(3), e.Waiting, "%s: last good values kept", badPage.name)
		assert.Equal(t, 0.3, e.KVCacheUsage, badPage.name)
		assert.Equal(t, []string{"z"}, e.ActiveAdapters, badPage.name)
		assert.Equal(t, t0, e.ScrapeTime, "%s: the bad pod ages from its last good scrape", badPage.name)
		assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.EndpointsUnhealthy), badPage.name)
		assert.Equal(t, float64(step+1), testutil.ToFloat64(a.metrics.ScrapeErrors.WithLabelValues("llm/b", wire.ScrapeInvalidValue.String())), badPage.name)
	}
}

func podMetricsOf(e wire.EndpointState) PodMetrics {
	return PodMetrics{Waiting: e.Waiting, Running: e.Running, KVCacheUsage: e.KVCacheUsage,
		ActiveAdapters: e.ActiveAdapters, WaitingAdapters: e.WaitingAdapters, MaxAdapters: e.MaxAdapters}
}

func TestCycleReportsEveryPodAndDropsVanished(t *testing.T) {
	v1 := golden(t, "vllm-v1.txt")
	p1, p2 := newPodServer(t, serveText(v1)), newPodServer(t, serveText(v1))
	never := newPodServer(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "x", 500) })
	envoy := newSink(t, "tok")
	targets := []Target{p1.target("llm", "b"), p2.target("llm", "a"), never.target("llm", "c")}
	a := newTestAgent(t, targets, []string{envoy.addr()}, "tok", 5*time.Second)

	payload := a.Cycle(context.Background())
	require.NotNil(t, payload)
	assert.True(t, a.Ready())
	p := envoy.next(t)
	assert.Equal(t, "node-1", p.AgentID)
	assert.Equal(t, uint64(t0.UnixNano())+1, p.Seq, "sequence starts at the start time in ns")
	assert.Equal(t, t0, p.SendTime)
	require.Len(t, p.Endpoints, 2, "a pod never scraped successfully has nothing to report")
	assert.Equal(t, "a", p.Endpoints[0].Name)
	assert.Equal(t, "b", p.Endpoints[1].Name)
	assert.Equal(t, p2.target("llm", "a").Address, p.Endpoints[0].Address)
	assert.Equal(t, 2.0, testutil.ToFloat64(a.metrics.EndpointsReported))

	a.disc = fixedTargets(targets[:1])
	a.Cycle(context.Background())
	p = envoy.next(t)
	require.Len(t, p.Endpoints, 1)
	assert.Equal(t, "b", p.Endpoints[0].Name)
	assert.Equal(t, 0, testutil.CollectAndCount(a.metrics.ScrapeErrors), "series of vanished pods deleted")
}

func TestCycleWithoutPodsPushesEmptyState(t *testing.T) {
	envoy := newSink(t, "tok")
	a := newTestAgent(t, nil, []string{envoy.addr()}, "tok", time.Second)
	a.Cycle(context.Background())
	p := envoy.next(t)
	assert.Empty(t, p.Endpoints, "the receiver must learn this node has no endpoints now")
}

func TestSlowEnvoyDoesNotDelayOthers(t *testing.T) {
	pod := newPodServer(t, serveText(golden(t, "vllm-v1.txt")))
	slow, fast := newSink(t, "tok"), newSink(t, "tok")
	slow.block = make(chan struct{})
	defer close(slow.block)
	a := newTestAgent(t, []Target{pod.target("llm", "a")}, []string{slow.addr(), fast.addr()}, "tok", 5*time.Second)
	var seqs []uint64
	for range 5 {
		a.Cycle(context.Background())
		seqs = append(seqs, fast.next(t).Seq) // arrives while the slow Envoy holds its first push
	}
	for i := 1; i < len(seqs); i++ {
		assert.Equal(t, seqs[i-1]+1, seqs[i])
	}
	assert.Empty(t, slow.pushes)
}

func TestPushErrorsAreCountedPerTarget(t *testing.T) {
	envoy := newSink(t, "right")
	a := newTestAgent(t, nil, []string{envoy.addr()}, "wrong", time.Second)
	done := make(chan error, 1)
	a.pusher.Sent = func(_ string, err error) { done <- err }
	a.Cycle(context.Background())
	err := <-done
	require.Error(t, err)
	assert.Contains(t, err.Error(), "status 401")
	assert.NotContains(t, err.Error(), "wrong", "the token is never in errors")
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.PushErrors.WithLabelValues(envoy.addr(), "http_401")))

	// An Envoy that is gone: connection refused, counted, and dropped from
	// the metrics once it leaves the target list.
	gone := httptest.NewServer(http.NotFoundHandler())
	goneAddr := gone.Listener.Addr().String()
	gone.Close()
	a.envoys = StaticEnvoys{goneAddr}
	a.Cycle(context.Background())
	require.Error(t, <-done)
	assert.Equal(t, 1.0, testutil.ToFloat64(a.metrics.PushErrors.WithLabelValues(goneAddr, "connect")))
	a.envoys = StaticEnvoys{}
	a.Cycle(context.Background())
	assert.Equal(t, 0, testutil.CollectAndCount(a.metrics.PushErrors))
}

func TestDNSEnvoys(t *testing.T) {
	envoy := newSink(t, "tok")
	ap := netip.MustParseAddrPort(envoy.addr())
	r := fakeResolver{"envoy-push.llm.svc": {ap.Addr()}}
	clock := &fakeClock{t: t0}
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	d := &DNSEnvoys{Name: "envoy-push.llm.svc", Port: ap.Port(), Resolver: r, Refresh: time.Second, Timeout: time.Second,
		Now: clock.Now, Log: quietLog, Errors: errs}
	assert.Equal(t, []string{envoy.addr()}, d.Targets(context.Background()))

	r["envoy-push.llm.svc"] = []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.1")}
	assert.Equal(t, []string{envoy.addr()}, d.Targets(context.Background()), "not looked up again within Refresh")
	clock.Advance(time.Second)
	assert.Equal(t, []string{"10.0.0.1:" + strconv.Itoa(int(ap.Port())), "10.0.0.2:" + strconv.Itoa(int(ap.Port()))}, d.Targets(context.Background()))

	delete(r, "envoy-push.llm.svc")
	clock.Advance(time.Second)
	assert.Len(t, d.Targets(context.Background()), 2, "a failed lookup keeps the previous targets")
	assert.Equal(t, 1.0, testutil.ToFloat64(errs))

	a := newTestAgent(t, nil, nil, "tok", time.Second)
	r["envoy-push.llm.svc"] = []netip.Addr{ap.Addr()}
	clock.Advance(time.Second)
	a.envoys = d
	a.Cycle(context.Background())
	envoy.next(t)
}

func TestParseEnvoySpecs(t *testing.T) {
	s, err := ParseStaticEnvoys("10.0.0.1:10001, envoy-0.envoy:10001")
	require.NoError(t, err)
	assert.Equal(t, StaticEnvoys{"10.0.0.1:10001", "envoy-0.envoy:10001"}, s)
	for _, bad := range []string{"", "10.0.0.1", ":80", "a:0", "a:1,a:1"} {
		_, err := ParseStaticEnvoys(bad)
		assert.Error(t, err, bad)
	}
	name, port, err := ParseEnvoyDNS("envoy-push.llm.svc.cluster.local:10001")
	require.NoError(t, err)
	assert.Equal(t, "envoy-push.llm.svc.cluster.local", name)
	assert.Equal(t, uint16(10001), port)
	for _, bad := range []string{"", "name", ":1", "name:99999"} {
		_, _, err := ParseEnvoyDNS(bad)
		assert.Error(t, err, bad)
	}
}

func TestTokenSource(t *testing.T) {
	dir := t.TempDir()
	f := dir + "/token"
	require.NoError(t, writeFile(f, "abc\n"))
	ts := &TokenSource{File: f, Refresh: time.Hour}
	tok, err := ts.Token()
	require.NoError(t, err)
	assert.Equal(t, "abc", tok, "trailing newline of a Secret file trimmed")

	_, err = (&TokenSource{}).Token()
	assert.Error(t, err)
	v, err := (&TokenSource{Value: "xyz"}).Token()
	require.NoError(t, err)
	assert.Equal(t, "xyz", v)

	require.NoError(t, writeFile(f, ""))
	_, err = (&TokenSource{File: f}).Token()
	assert.ErrorContains(t, err, "empty")
	require.NoError(t, writeFile(f, "a\nb"))
	_, err = (&TokenSource{File: f}).Token()
	assert.ErrorContains(t, err, "more than one line")
	_, err = (&TokenSource{File: dir + "/missing"}).Token()
	assert.Error(t, err)
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o600) }

// restrictedPage serves page as prometheus_client does: only the families
// named by name[] query parameters when there are any.
func restrictedPage(page []byte, queries chan<- url.Values) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if queries != nil {
			queries <- q
		}
		body := page
		if names := q["name[]"]; len(names) > 0 {
			body = restrict(page, names)
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(body)
	}
}

// restrict keeps the HELP, TYPE and sample lines of the named families.
func restrict(page []byte, names []string) []byte {
	var out []byte
	for _, line := range strings.SplitAfter(string(page), "\n") {
		rest := line
		if r, ok := strings.CutPrefix(line, "# HELP "); ok {
			rest = r
		} else if r, ok := strings.CutPrefix(line, "# TYPE "); ok {
			rest = r
		}
		name, _, _ := strings.Cut(rest, " ")
		name, _, _ = strings.Cut(name, "{")
		for _, n := range names {
			if name == n {
				out = append(out, line...)
				break
			}
		}
	}
	return out
}

func TestScrapeAsksForTheFamiliesItReads(t *testing.T) {
	queries := make(chan url.Values, 1)
	pod := newPodServer(t, restrictedPage(golden(t, "vllm-v1.txt"), queries))
	envoy := newSink(t, "tok")
	a := newTestAgent(t, []Target{pod.target("llm", "a")}, []string{envoy.addr()}, "tok", 5*time.Second)
	a.Cycle(context.Background())
	p := envoy.next(t)
	assert.Equal(t, []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:lora_requests_info",
		"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, (<-queries)["name[]"])
	require.Len(t, p.Endpoints, 1)
	assert.Equal(t, PodMetrics{Waiting: 7, Running: 31, KVCacheUsage: 0.8125, MaxAdapters: 2,
		ActiveAdapters: []string{"fin-lora", "sql-lora"}, WaitingAdapters: []string{"sql-lora"}}, podMetricsOf(p.Endpoints[0]))

	s := &Scraper{Names: DefaultMetricNames()}
	assert.Equal(t, "http://10.0.0.1:8000/metrics", s.URL("http://10.0.0.1:8000/metrics"), "off: the URL as given")
	s.AskForNames = true
	s.Names.LoRAInfo = ""
	assert.Equal(t, "http://h/m?x=1&name%5B%5D=vllm%3Anum_requests_waiting&name%5B%5D=vllm%3Anum_requests_running&name%5B%5D=vllm%3Akv_cache_usage_perc&name%5B%5D=vllm%3Agpu_cache_usage_perc",
		s.URL("http://h/m?x=1"))
}
