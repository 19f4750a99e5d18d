package scale

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/metricsagent"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// configAgent is the agent's metrics pusher and configuration publisher
// (metricsagent), pushing to one receiver, cycle by cycle.
type configAgent struct {
	t          *testing.T
	target     string
	id         string
	seq        uint64
	metrics    *metricsagent.Pusher
	held       *metricsagent.HeldTables
	pub        *metricsagent.ConfigPublisher
	record     []byte
	pushed     chan error
	configSent chan error
}

func newConfigAgent(t *testing.T, target, id string) *configAgent {
	log := slog.New(slog.DiscardHandler)
	token := &metricsagent.TokenSource{Value: testToken}
	a := &configAgent{t: t, target: target, id: id, seq: 1, held: &metricsagent.HeldTables{},
		pushed: make(chan error, 16), configSent: make(chan error, 16)}
	a.metrics = &metricsagent.Pusher{Client: metricsagent.NewPushClient(), Path: wire.PushPath, Timeout: 5 * time.Second, Token: token,
		Log: log, Metrics: metricsagent.NewMetrics(prometheus.NewRegistry()), Held: a.held,
		Sent: func(_ string, err error) { a.pushed <- err }}
	cp := &metricsagent.Pusher{Client: metricsagent.NewPushClient(), Path: wire.ConfigPath, Timeout: 5 * time.Second, Token: token,
		Log: log, Metrics: metricsagent.NewMetrics(prometheus.NewRegistry()),
		Delivered: func(s int) bool { return s == http.StatusConflict },
		Sent:      func(_ string, err error) { a.configSent <- err }}
	// Resend and Refresh far away: every record sent here is sent on demand.
	a.pub = &metricsagent.ConfigPublisher{Payload: func() []byte { return a.record }, Pusher: cp, Held: a.held,
		Resend: time.Hour, Refresh: time.Hour}
	t.Cleanup(a.metrics.Close)
	t.Cleanup(cp.Close)
	return a
}

// cycle pushes the agent's endpoints into e, waits for the answer, then
// lets the publisher decide, as the agent's cycle does.
func (a *configAgent) cycle(e *hostEnv) {
	a.t.Helper()
	a.seq++
	a.metrics.Publish([]string{a.target}, e.agent(a.id, a.seq, 1, 2, 1))
	select {
	case err := <-a.pushed:
		require.NoError(a.t, err)
	case <-time.After(10 * time.Second):
		a.t.Fatal("the metrics push got no answer")
	}
	a.pub.Publish(context.Background(), []string{a.target}, time.Now())
}

// recordSent waits for the record's delivery (a 409 is delivered too).
func (a *configAgent) recordSent() {
	a.t.Helper()
	select {
	case err := <-a.configSent:
		require.NoError(a.t, err)
	case <-time.After(10 * time.Second):
		a.t.Fatal("no configuration record was sent")
	}
}

// noRecordSent checks that no record went out since the last one.
func (a *configAgent) noRecordSent() {
	a.t.Helper()
	select {
	case err := <-a.configSent:
		a.t.Fatalf("a record was sent (err %v)", err)
	case <-time.After(100 * time.Millisecond): // the publisher decided synchronously; this is the pusher's hand-off
	}
}

// stored is the configuration record in e's shared data (nil: none).
func stored(e *hostEnv) *wire.DecodedConfig {
	v, _, ok := e.host.SharedData(testVMID, wire.ConfigKey(wire.DefaultKeyPrefix))
	if !ok || len(v) == 0 {
		return nil
	}
	rec, err := wire.DecodeConfig(v, wire.ConfigLimits{})
	if err != nil {
		return nil
	}
	return rec
}

func heldOf(t *testing.T, record []byte) string {
	h, err := wire.PeekConfig(record, wire.ConfigLimits{})
	require.NoError(t, err)
	return h.Held()
}

func benchTable(t *testing.T, id string, rev uint64, models ...string) []byte {
	var rw []wire.ModelRewrite
	for _, m := range models {
		rw = append(rw, wire.ModelRewrite{Model: m, Targets: []wire.WeightedTarget{{Model: "chat", Weight: 1}}})
	}
	b, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: id, PoolNamespace: "llm", PoolName: "bench",
		Revision: wire.ConfigRevision{Pools: rev, Objectives: rev, Rewrites: rev}, Table: wire.ModelTable{Rewrites: rw}}, wire.ConfigLimits{})
	require.NoError(t, err)
	return b
}

// TestConfigRecordsOnDemandInTheHost: the real receiver in the real .wasm
// answers every accepted metrics push with the table it holds, and the
// agent's publisher sends its record only when that is not its own: an
// unchanged table is not resent, a changed one goes at once, an Envoy
// that holds a newer table (409) is not asked again, and an Envoy that
// restarted (empty shared data) has the table back after one push.
func TestConfigRecordsOnDemandInTheHost(t *testing.T) {
	addr, err := freeLoopback()
	require.NoError(t, err)
	e := startHostAt(t, routerCfg, addr)
	a := newConfigAgent(t, addr, "agent-a")
	a.record = benchTable(t, "agent-a", 1, "chat-1")

	a.cycle(e) // a new target gets the record
	a.recordSent()
	require.NotNil(t, stored(e))
	assert.Equal(t, "agent-a", stored(e).AgentID)

	for range 5 { // unchanged: nothing goes, and the answers name our table
		a.cycle(e)
	}
	a.noRecordSent()
	held, ok := a.held.Get(addr)
	require.True(t, ok, "the receiver's answer carries %s", wire.ConfigHeldHeader)
	assert.Equal(t, heldOf(t, a.record), held)

	// Another agent's record for the same table: the same answer.
	other := benchTable(t, "agent-b", 1, "chat-1")
	require.Equal(t, heldOf(t, a.record), heldOf(t, other))

	// A changed table goes with the next cycle.
	a.record = benchTable(t, "agent-a", 2, "chat-1", "chat-2")
	a.cycle(e)
	a.recordSent()
	require.Len(t, stored(e).Table.Rewrites, 2)

	// Another agent stores a newer table: the answers name it, our agent
	// sends once, gets 409 (delivered), and is not asked again.
	newer := benchTable(t, "agent-b", 3, "chat-3")
	assert.Equal(t, http.StatusNoContent, e.postTo(wire.ConfigPath, newer))
	a.cycle(e)
	a.recordSent()
	for range 3 {
		a.cycle(e)
	}
	a.noRecordSent()
	assert.Equal(t, "agent-b", stored(e).AgentID, "the older table did not replace the newer one")
	held, _ = a.held.Get(addr)
	assert.Equal(t, heldOf(t, newer), held)

	// Our agent catches up: its table is now newest, and goes at once.
	a.record = benchTable(t, "agent-a", 4, "chat-4")
	a.cycle(e)
	a.recordSent()
	require.Equal(t, "agent-a", stored(e).AgentID)

	// The Envoy restarts: same address, empty shared data. Its first
	// answer says "none"; the record follows that one push.
	require.NoError(t, e.host.Close())
	e = startHostAt(t, routerCfg, addr)
	require.Nil(t, stored(e))
	a.cycle(e)
	held, _ = a.held.Get(addr)
	assert.Equal(t, wire.ConfigHeldNone, held)
	a.recordSent()
	rec := stored(e)
	require.NotNil(t, rec, "the restarted Envoy has the table after one push")
	assert.Equal(t, "chat-4", rec.Table.Rewrites[0].Model)
	a.cycle(e)
	a.noRecordSent()
	held, _ = a.held.Get(addr)
	assert.Equal(t, heldOf(t, a.record), held)
}

// postTo posts body to path on e's push listener with the token.
func (e *hostEnv) postTo(path string, body []byte) int {
	e.t.Helper()
	saved := e.push
	e.push = strings.TrimSuffix(e.push, wire.PushPath) + path
	defer func() { e.push = saved }()
	return e.post(body)
}
