package metricsagent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

var aggT0 = time.Unix(1_750_000_000, 0)

func agentPushAt(t *testing.T, id string, seq uint64, send time.Time, waiting uint32, version int) []byte {
	t.Helper()
	p := &wire.Push{AgentID: id, Seq: seq, SendTime: send, Endpoints: []wire.EndpointState{{
		Namespace: "llm", Name: id + "-pod", Address: netip.MustParseAddr("10.0.0.1"), Port: 8000,
		Waiting: waiting, MaxAdapters: 4, ScrapeTime: send.Add(-5 * time.Millisecond),
	}}}
	var b []byte
	var err error
	if version == 1 {
		b, err = wire.EncodePush(p, wire.Limits{})
	} else {
		var enc wire.BlockEncoder
		b, err = enc.AppendAgentPush(nil, p, wire.Limits{})
	}
	require.NoError(t, err)
	return b
}

// relayed decodes a relay push: agent id -> (waiting, held, age).
func relayed(t *testing.T, b []byte) (map[string][3]int64, int64) {
	t.Helper()
	var d wire.PushDecoder
	v, err := d.Decode(b, wire.Limits{})
	require.NoError(t, err)
	require.Equal(t, wire.KindRelay, v.Kind)
	out := map[string][3]int64{}
	for _, blk := range v.Blocks {
		r := blk.Record(0)
		out[string(blk.AgentID())] = [3]int64{int64(r.Waiting()), blk.Held(), r.Age()}
	}
	return out, v.SendTime
}

func TestAggregatorStoreRelaysLatestBlocks(t *testing.T) {
	s := NewAggregatorStore(wire.DefaultLimits(), 10*time.Second)
	require.NoError(t, s.Accept(agentPushAt(t, "node-b", 1, aggT0, 1, 2), aggT0))
	require.NoError(t, s.Accept(agentPushAt(t, "node-a", 1, aggT0, 2, 1), aggT0)) // version 1 is taken too
	require.NoError(t, s.Accept(agentPushAt(t, "node-a", 2, aggT0.Add(10*time.Millisecond), 3, 2), aggT0.Add(10*time.Millisecond)))

	b, n := s.Relay(nil, "agg-0", aggT0.Add(30*time.Millisecond), time.Time{})
	require.Equal(t, 2, n)
	got, send := relayed(t, b)
	assert.Equal(t, aggT0.Add(30*time.Millisecond).UnixNano(), send)
	// node-a's latest block, held 20 ms here; its scrape 5 ms before its
	// send is now 25 ms old. node-b's held 30 ms.
	assert.Equal(t, [3]int64{3, int64(20 * time.Millisecond), int64(25 * time.Millisecond)}, got["node-a"])
	assert.Equal(t, [3]int64{1, int64(30 * time.Millisecond), int64(35 * time.Millisecond)}, got["node-b"])

	// Only what arrived after since.
	b, n = s.Relay(nil, "agg-0", aggT0.Add(40*time.Millisecond), aggT0.Add(5*time.Millisecond))
	require.Equal(t, 1, n)
	got, _ = relayed(t, b)
	assert.Contains(t, got, "node-a")
	_, n = s.Relay(nil, "agg-0", aggT0.Add(40*time.Millisecond), aggT0.Add(30*time.Millisecond))
	assert.Equal(t, 0, n, "nothing new: nothing to send")

	// Refused: not newer, a relay, from the future.
	err := s.Accept(agentPushAt(t, "node-a", 2, aggT0, 9, 2), aggT0.Add(50*time.Millisecond))
	assert.ErrorIs(t, err, wire.ErrStaleSequence)
	assert.ErrorIs(t, s.Accept(b, aggT0), ErrRelayRefused)
	assert.ErrorIs(t, s.Accept(agentPushAt(t, "node-c", 1, aggT0.Add(time.Hour), 1, 2), aggT0), wire.ErrClockSkew)

	// An agent not heard from for the TTL is dropped.
	_, n = s.Relay(nil, "agg-0", aggT0.Add(10005*time.Millisecond), time.Time{})
	assert.Equal(t, 1, n, "node-b expired, node-a not yet")
	assert.Equal(t, 1, s.Agents())
}

func TestAggregatorStoreIsBounded(t *testing.T) {
	s := NewAggregatorStore(wire.Limits{MaxAgents: 2}.Resolved(), time.Minute)
	require.NoError(t, s.Accept(agentPushAt(t, "a", 1, aggT0, 1, 2), aggT0))
	require.NoError(t, s.Accept(agentPushAt(t, "b", 1, aggT0, 1, 2), aggT0))
	assert.ErrorIs(t, s.Accept(agentPushAt(t, "c", 1, aggT0, 1, 2), aggT0), ErrTooManyAgents)
	require.NoError(t, s.Accept(agentPushAt(t, "a", 2, aggT0, 1, 2), aggT0), "known agents still update")
}

func TestAggregatorHandlerStatuses(t *testing.T) {
	const token = "agg-token"
	s := NewAggregatorStore(wire.DefaultLimits(), time.Minute)
	m := NewAggregatorMetrics(prometheus.NewRegistry())
	now := aggT0
	h := AggregatorHandler(s, wire.PushPath, &TokenSource{Value: token}, 1<<20, func() time.Time { return now }, m, slog.New(slog.DiscardHandler), nil)
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(path, tok string, body []byte) int {
		req, _ := http.NewRequest("POST", srv.URL+path, bytes.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	good := agentPushAt(t, "node-a", 5, now, 1, 2)
	assert.Equal(t, 401, post(wire.PushPath, "", good))
	assert.Equal(t, 401, post(wire.PushPath, "wrong", good))
	assert.Equal(t, 404, post("/other", token, good))
	assert.Equal(t, 400, post(wire.PushPath, token, []byte("garbage")))
	assert.Equal(t, 204, post(wire.PushPath, token, good))
	assert.Equal(t, 409, post(wire.PushPath, token, good))
	assert.Equal(t, 413, post(wire.PushPath, token, make([]byte, 2<<20)))
	resp, err := http.Get(srv.URL + wire.PushPath)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 405, resp.StatusCode)
	assert.Equal(t, 1, s.Agents())
}

// envoySink is an Envoy stand-in that records relay pushes.
type envoySink struct {
	srv    *httptest.Server
	mu     sync.Mutex
	relays [][]byte
	status int    // answer; 0 means 204
	held   string // wire.ConfigHeldHeader of its answers ("": none)
}

func newEnvoySink(t *testing.T) *envoySink {
	e := &envoySink{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.status != 0 {
			w.WriteHeader(e.status)
			return
		}
		e.relays = append(e.relays, b)
		if e.held != "" {
			w.Header().Set(wire.ConfigHeldHeader, e.held)
		}
		w.WriteHeader(204)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *envoySink) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *envoySink) take() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.relays
	e.relays = nil
	return out
}

func TestRelayerSendsChangesAndEverythingEveryFull(t *testing.T) {
	s := NewAggregatorStore(wire.DefaultLimits(), time.Minute)
	for i := 0; i < 3; i++ {
		require.NoError(t, s.Accept(agentPushAt(t, fmt.Sprintf("node-%d", i), 1, time.Now(), 1, 2), time.Now()))
	}
	up, down := newEnvoySink(t), newEnvoySink(t)
	down.status = 503
	r := &Relayer{Store: s, Sender: "agg-0", Envoys: StaticEnvoys{up.addr(), down.addr()}, Interval: 20 * time.Millisecond,
		FullEvery: time.Hour, Client: &http.Client{}, Path: wire.PushPath, Timeout: time.Second, Token: &TokenSource{Value: "t"},
		Now: time.Now, Log: slog.New(slog.DiscardHandler), Metrics: NewAggregatorMetrics(prometheus.NewRegistry())}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	require.Eventually(t, func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return len(up.relays) > 0
	}, 5*time.Second, 5*time.Millisecond)
	first := up.take()
	got, _ := relayed(t, first[0])
	assert.Len(t, got, 3, "the first relay carries every agent")
	time.Sleep(100 * time.Millisecond)
	assert.Empty(t, up.take(), "nothing changed: nothing sent")

	require.NoError(t, s.Accept(agentPushAt(t, "node-1", 2, time.Now(), 7, 2), time.Now()))
	require.Eventually(t, func() bool {
		up.mu.Lock()
		defer up.mu.Unlock()
		return len(up.relays) > 0
	}, 5*time.Second, 5*time.Millisecond)
	got, _ = relayed(t, up.take()[0])
	assert.Equal(t, map[string]bool{"node-1": true}, keys(got), "only the agent that pushed")

	// The Envoy that refused everything gets everything once it answers.
	down.mu.Lock()
	down.status = 0
	down.mu.Unlock()
	require.Eventually(t, func() bool {
		down.mu.Lock()
		defer down.mu.Unlock()
		return len(down.relays) > 0
	}, 5*time.Second, 5*time.Millisecond)
	got, _ = relayed(t, down.take()[0])
	assert.Len(t, got, 3)
}

func keys[V any](m map[string]V) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

func TestFailoverTargets(t *testing.T) {
	now := aggT0
	var modes []bool
	f := &FailoverTargets{Aggregators: StaticEnvoys{"agg-a:1", "agg-b:1"}, Envoys: StaticEnvoys{"envoy-1:2", "envoy-2:2"},
		FallbackAfter: 500 * time.Millisecond, RecoverAfter: time.Second, Now: func() time.Time { return now },
		Log: slog.New(slog.DiscardHandler), Direct: func(d bool) { modes = append(modes, d) }}
	ctx := context.Background()
	assert.Equal(t, []string{"agg-a:1", "agg-b:1"}, f.Targets(ctx))
	now = now.Add(400 * time.Millisecond)
	f.Observe("agg-b:1", nil)
	now = now.Add(400 * time.Millisecond)
	assert.Equal(t, []string{"agg-a:1", "agg-b:1"}, f.Targets(ctx), "one aggregator answered 400 ms ago")
	// Idle: an agent whose values stay within its send thresholds pushes
	// only on its heartbeat; silence after an accepted push is not failure.
	now = now.Add(2 * time.Second)
	assert.Equal(t, []string{"agg-a:1", "agg-b:1"}, f.Targets(ctx), "the last push was accepted 2 s ago and none failed since")
	f.Observe("agg-a:1", fmt.Errorf("connect refused"))
	f.Observe("agg-b:1", fmt.Errorf("connect refused"))
	f.Observe("envoy-1:2", nil) // an Envoy answering says nothing about aggregators
	now = now.Add(400 * time.Millisecond)
	assert.Len(t, f.Targets(ctx), 2, "failing for 400 ms: not yet")
	f.Observe("agg-a:1", fmt.Errorf("connect refused"))
	now = now.Add(200 * time.Millisecond)
	assert.Equal(t, []string{"agg-a:1", "agg-b:1", "envoy-1:2", "envoy-2:2"}, f.Targets(ctx), "failing, none accepted, for 600 ms: direct")
	assert.True(t, f.IsDirect())
	now = now.Add(300 * time.Millisecond)
	f.Observe("agg-a:1", nil)
	assert.Len(t, f.Targets(ctx), 4, "back too soon after the fallback: stay direct for RecoverAfter")
	now = now.Add(800 * time.Millisecond)
	f.Observe("agg-a:1", nil)
	assert.Equal(t, []string{"agg-a:1", "agg-b:1"}, f.Targets(ctx))
	assert.Equal(t, []bool{true, false}, modes)

	// At start, until some aggregator accepts a push: FallbackAfter of grace.
	g := &FailoverTargets{Aggregators: StaticEnvoys{"agg-a:1"}, Envoys: StaticEnvoys{"envoy-1:2"},
		FallbackAfter: 500 * time.Millisecond, RecoverAfter: time.Second, Now: func() time.Time { return now }, Log: slog.New(slog.DiscardHandler)}
	assert.Len(t, g.Targets(ctx), 1)
	now = now.Add(600 * time.Millisecond)
	assert.Len(t, g.Targets(ctx), 2, "no aggregator ever answered: direct after the grace period")
}

// configs counts the configuration records among what e was sent.
func (e *envoySink) configs() int {
	n := 0
	for _, b := range e.take() {
		if bytes.HasPrefix(b, []byte("WC")) {
			n++
		}
	}
	return n
}

func (e *envoySink) setHeld(v string) {
	e.mu.Lock()
	e.held = v
	e.mu.Unlock()
}

// TestRelayModeRecordsFollowTheAggregatorsAnswers: in relay mode the agent
// pushes metrics to an aggregator, which answers with what its Envoys said
// they hold (their answers to its relays); the agent sends its record to
// the Envoys only when that is not its own table. An aggregator that says
// nothing (an older one) leaves the agent resending on its timer.
func TestRelayModeRecordsFollowTheAggregatorsAnswers(t *testing.T) {
	record := encodeTestRecord(t)
	head, err := wire.PeekConfig(record, wire.ConfigLimits{})
	require.NoError(t, err)
	mine := head.Held()
	e1, e2 := newEnvoySink(t), newEnvoySink(t)
	e1.held, e2.held = mine, mine

	store := NewAggregatorStore(wire.DefaultLimits(), time.Minute)
	relayer := &Relayer{Store: store, Sender: "agg-0", Envoys: StaticEnvoys{e1.addr(), e2.addr()}, Interval: 10 * time.Millisecond,
		FullEvery: time.Hour, Client: &http.Client{}, Path: wire.PushPath, Timeout: time.Second, Token: &TokenSource{Value: "t"},
		Now: time.Now, Log: quietLog, Metrics: NewAggregatorMetrics(prometheus.NewRegistry()), Held: &HeldTables{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { relayer.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	summary := relayer.HeldSummary
	agg := httptest.NewServer(AggregatorHandler(store, wire.PushPath, &TokenSource{Value: "t"}, 1<<20, time.Now,
		NewAggregatorMetrics(prometheus.NewRegistry()), quietLog, func() string { return summary() }))
	defer agg.Close()
	aggAddr := strings.TrimPrefix(agg.URL, "http://")

	m := NewMetrics(prometheus.NewRegistry())
	held := &HeldTables{}
	pushed := make(chan error, 4)
	metrics := &Pusher{Client: &http.Client{}, Path: wire.PushPath, Timeout: time.Second, Token: &TokenSource{Value: "t"},
		Log: quietLog, Metrics: m, Held: held, Sent: func(_ string, err error) { pushed <- err }}
	defer metrics.Close()
	configs := &Pusher{Client: &http.Client{}, Path: wire.ConfigPath, Timeout: time.Second, Token: &TokenSource{Value: "t"},
		Log: quietLog, Metrics: m.configPushMetrics()}
	defer configs.Close()
	pub := &ConfigPublisher{Payload: func() []byte { return record }, Pusher: configs, Held: held, Via: StaticEnvoys{aggAddr},
		Resend: time.Minute, Refresh: time.Hour}
	envoys := []string{e1.addr(), e2.addr()}
	seq := uint64(0)
	now := time.Now()
	cycle := func() {
		seq++
		metrics.Publish([]string{aggAddr}, agentPushAt(t, "node-a", seq, time.Now(), 1, 2))
		require.NoError(t, <-pushed)
		pub.Publish(ctx, envoys, now)
	}
	// The relayer sends (and hears its Envoys) only when a block moved:
	// another agent keeps pushing while a test waits for an answer.
	zseq := uint64(0)
	summaryIs := func(want string) func() bool {
		return func() bool {
			zseq++
			_ = store.Accept(agentPushAt(t, "node-z", zseq, time.Now(), 1, 2), time.Now())
			return summary() == want
		}
	}
	waitConfigs := func(e *envoySink, want int) {
		t.Helper()
		got := 0
		require.Eventually(t, func() bool { got += e.configs(); return got >= want }, 5*time.Second, 5*time.Millisecond)
		time.Sleep(30 * time.Millisecond)
		assert.Equal(t, want, got+e.configs())
	}

	cycle() // new targets get the record
	waitConfigs(e1, 1)
	waitConfigs(e2, 1)
	require.Eventually(t, summaryIs(mine), 5*time.Second, 5*time.Millisecond)
	for range 3 {
		cycle()
	}
	got, _ := held.Get(aggAddr)
	assert.Equal(t, mine, got)
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, e1.configs()+e2.configs(), "both Envoys hold the table: nothing sent")

	// One Envoy restarts: the aggregator's answers turn "mixed", and the
	// next cycle sends the record (to every Envoy: the answer does not say
	// which), once.
	e2.setHeld(wire.ConfigHeldNone)
	require.Eventually(t, summaryIs(wire.ConfigHeldMixed), 5*time.Second, 5*time.Millisecond)
	cycle()
	waitConfigs(e2, 1)
	waitConfigs(e1, 1)
	cycle()
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, e1.configs()+e2.configs(), "sent under this answer already")
	e2.setHeld(mine)
	require.Eventually(t, summaryIs(mine), 5*time.Second, 5*time.Millisecond)
	cycle()

	// An aggregator that says nothing: the agent resends every Resend.
	summary = func() string { return "" }
	cycle()
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, e1.configs()+e2.configs(), "within Resend")
	now = now.Add(time.Minute)
	cycle()
	waitConfigs(e1, 1)
	waitConfigs(e2, 1)
}

func TestHeldTablesSummary(t *testing.T) {
	h := &HeldTables{}
	assert.Equal(t, "", h.Summary([]string{"a"}), "no answer yet")
	h.set("a", "x")
	h.set("b", "x")
	assert.Equal(t, "x", h.Summary([]string{"a", "b"}))
	assert.Equal(t, "", h.Summary([]string{"a", "b", "c"}), "one target without an answer")
	h.set("b", "y")
	assert.Equal(t, wire.ConfigHeldMixed, h.Summary([]string{"a", "b"}))
	h.forget("b")
	assert.Equal(t, "", h.Summary([]string{"a", "b"}))
	assert.Equal(t, "", h.Summary(nil))
	var none *HeldTables
	_, ok := none.Get("a")
	assert.False(t, ok)
}

func encodeTestRecord(t *testing.T) []byte {
	b, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "node-a", PoolNamespace: "llm", PoolName: "p",
		Revision: wire.ConfigRevision{Pools: 1, Objectives: 1, Rewrites: 1},
		Table:    wire.ModelTable{Objectives: []wire.Objective{{Name: "batch", Priority: -1}}}}, wire.ConfigLimits{})
	require.NoError(t, err)
	return b
}
