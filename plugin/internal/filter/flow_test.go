package filter

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// flowConfig has one model per criticality and flow control on.
const flowConfig = `{"seed": 3, "models": [
  {"name": "crit", "criticality": "Critical"},
  {"name": "std", "criticality": "Standard"},
  {"name": "shed", "criticality": "Sheddable"},
  {"name": "shed2", "criticality": "Sheddable"},
  {"name": "split", "criticality": "Sheddable", "targets": [{"name": "split-v2", "weight": 1}]}
 ], "flowControl": {"maxRequests": 50, "flowHeader": "x-tenant", "maxFlowKeyBytes": 16}}`

// busy and free are snapshots without and with room for non-critical
// requests (flow control's default room: nothing waiting, KV <= 0.9).
var (
	busy = []pod{{name: "p0", waiting: 50, kv: 0.95}, {name: "p1", addr: "10.0.0.2", waiting: 40, kv: 0.9}}
	free = []pod{{name: "p0", waiting: 0, kv: 0.1}, {name: "p1", addr: "10.0.0.2", waiting: 0, kv: 0.1}}
	// oneSlot has room for exactly one more non-critical request.
	oneSlot = []pod{{name: "p0", waiting: 0, kv: 0.1}, {name: "p1", addr: "10.0.0.2", waiting: 40, kv: 0.9}}
)

func (e *env) gauge(name string) uint64 {
	e.t.Helper()
	v, err := e.host.GetGaugeMetric(name)
	require.NoError(e.t, err, name)
	return v
}

// held asserts that r was held: paused, no reply, no destination yet.
func (e *env) requireHeld(r result) {
	e.t.Helper()
	require.Equal(e.t, types.ActionPause, r.action)
	require.Nil(e.t, r.local, "a held request gets no reply yet")
	require.Empty(e.t, r.dest())
}

// state is what became of stream id so far: "held", "routed <dest>", or
// the local reply's status.
func (e *env) state(id uint32) string {
	if l := e.host.GetSentLocalResponse(id); l != nil {
		return fmt.Sprint(l.StatusCode)
	}
	if e.host.GetCurrentHttpStreamAction(id) != types.ActionContinue {
		return "held"
	}
	for _, h := range e.host.GetCurrentRequestHeaders(id) {
		if h[0] == e.cfg.DestinationHeader {
			return "routed " + h[1]
		}
	}
	return "continued without a destination"
}

func TestFlowHoldsThenReleasesOnNewSnapshot(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	r := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(r)
	assert.Equal(t, uint64(1), e.gauge("wasm_epp.flow.queued.sheddable"))
	assert.Equal(t, uint64(len(chat("shed"))), e.gauge("wasm_epp.flow.queued_bytes"))
	assert.Zero(t, e.counter("wasm_epp.requests.dropped"), "not refused")

	e.host.Tick() // still no capacity
	assert.Equal(t, "held", e.state(r.id))

	crit := e.post("/v1/chat/completions", nil, chat("crit"))
	assert.Equal(t, types.ActionContinue, crit.action, "critical requests never wait")
	assert.NotEmpty(t, crit.dest())

	e.setPods(free...)
	e.host.Tick()
	assert.Contains(t, []string{"routed 10.0.0.1:8000", "routed 10.0.0.2:8000"}, e.state(r.id), "released with the destination set at release")
	assert.Zero(t, e.gauge("wasm_epp.flow.queued.sheddable"))
	assert.Zero(t, e.gauge("wasm_epp.flow.queued_bytes"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.flow.released"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.path.sheddable.admitted.low-queue.least-queue.least-kv"), "the releasing decision's path")
	_, err := e.host.GetHistogramMetric("wasm_epp.flow.wait_ms")
	require.NoError(t, err, "wait-time histogram defined")
	// Both streams end: each counts as routed, the held one like a request
	// that never waited, and nothing as abandoned.
	e.host.CompleteHttpContext(crit.id)
	e.host.CompleteHttpContext(r.id)
	assert.Equal(t, uint64(2), e.counter("wasm_epp.requests.routed"))
	assert.Zero(t, e.counter("wasm_epp.requests.abandoned"))
}

// Standard before Sheddable, flows round-robin, FIFO inside a flow: with
// room for one request per snapshot, the releases come out in that order.
func TestFlowReleaseOrder(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	send := func(model, tenant string) uint32 {
		r := e.post("/v1/chat/completions", [][2]string{{"x-tenant", tenant}}, chat(model))
		e.requireHeld(r)
		return r.id
	}
	ids := map[uint32]string{}
	for _, x := range []struct{ model, tenant string }{
		{"shed", "a"}, {"std", "a"}, {"std", "a"}, {"std", "a"}, {"std", "b"}, {"shed", "b"}, {"std", "c"},
	} {
		id := send(x.model, x.tenant)
		ids[id] = fmt.Sprintf("%s/%s#%d", x.model, x.tenant, len(ids))
	}
	var order []string
	for range len(ids) {
		e.setPods(oneSlot...) // a fresh snapshot with one free slot
		e.host.Tick()
		e.host.Tick() // the slot was counted: a second tick releases nothing more
		n := 0
		for id, name := range ids {
			if strings.HasPrefix(e.state(id), "routed") {
				order = append(order, name)
				delete(ids, id)
				n++
			}
		}
		require.Equal(t, 1, n, "one free slot is filled once (released so far: %v)", order)
	}
	assert.Equal(t, []string{
		"std/a#1", "std/b#4", "std/c#6", "std/a#2", "std/a#3", // Standard: tenants a, b, c in turn, FIFO inside a
		"shed/a#0", "shed/b#5", // then Sheddable
	}, order)
}

// A request arriving while others of its band wait joins them: the new
// snapshot its callback sees releases the older one first, and the room
// is then taken. A Standard request does not wait behind Sheddable ones.
func TestFlowNoOvertaking(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	first := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(first)
	e.setPods(oneSlot...)
	second := e.post("/v1/chat/completions", nil, chat("shed2"))
	e.requireHeld(second)
	assert.Equal(t, "routed 10.0.0.1:8000", e.state(first.id), "released by the next request's callback, before it")
	e.setPods(free...)
	std := e.post("/v1/chat/completions", nil, chat("std"))
	assert.Equal(t, types.ActionContinue, std.action, "a Standard request does not wait behind Sheddable ones")
	assert.True(t, strings.HasPrefix(e.state(second.id), "routed"), "then the held Sheddable one: %s", e.state(second.id))
	assert.NotEqual(t, std.dest(), e.state(second.id)[len("routed "):], "each took its own room")
}

// Room, not the decision tree's capacity test, decides a non-critical
// request with flow control on: a queue of 3 is within the tree's limit
// (5) but not flow control's (0), and a KV cache at 0.85 is over the
// tree's (0.8) but within flow control's (0.9).
func TestFlowRoomDecidesNewRequests(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(pod{name: "p0", waiting: 3, kv: 0.1})
	e.requireHeld(e.post("/v1/chat/completions", nil, chat("std")))
	e.setPods(pod{name: "p0", waiting: 0, kv: 0.85})
	e.host.Tick() // the held one takes the room
	r := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(r) // the room was counted
	e.setPods(pod{name: "p0", waiting: 0, kv: 0.85}, pod{name: "p1", addr: "10.0.0.2", waiting: 0, kv: 0.5})
	e.host.Tick()
	assert.True(t, strings.HasPrefix(e.state(r.id), "routed"), e.state(r.id))
	now := e.post("/v1/chat/completions", nil, chat("shed2"))
	assert.Equal(t, types.ActionContinue, now.action, "room left and nothing held: it goes at once")
	assert.Zero(t, e.counter("wasm_epp.requests.dropped"))
}

// A new snapshot is acted on by the first request callback that sees it,
// not only by the tick: the held request is routed while a critical one
// is, before any tick, and the critical one keeps its own destination.
func TestFlowReleasesInARequestCallback(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	held := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(held)
	e.setPods(oneSlot...)
	crit := e.post("/v1/chat/completions", nil, chat("crit"))
	assert.Equal(t, types.ActionContinue, crit.action)
	assert.Equal(t, "routed 10.0.0.1:8000", e.state(held.id), "released from the critical request's callback")
	assert.NotEmpty(t, crit.dest(), "the critical request's own destination")
	assert.Equal(t, uint64(1), e.counter("wasm_epp.flow.released"))
}

// A release in a request callback only routes: a held request that can no
// longer be routed stays until the tick answers it (503), so no local
// reply is sent to another stream from a request callback.
func TestFlowCallbackReleaseNeverReplies(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	held := e.post("/v1/chat/completions", nil, chat("std"))
	e.requireHeld(held)
	e.setPods() // the fleet is gone
	crit := e.post("/v1/chat/completions", nil, chat("crit"))
	require.NotNil(t, crit.local)
	assert.Equal(t, uint32(503), crit.local.StatusCode)
	assert.Equal(t, "held", e.state(held.id), "not answered from another stream's callback")
	e.host.Tick()
	assert.Equal(t, "503", e.state(held.id))
}

// Corrupt admission records (another writer, a bug) are counted; the next
// admission replaces them.
func TestFlowCorruptAdmissionRecordCounted(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	r := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(r)
	setShared(t, e.cfg.AdmissionKey(), []byte("not a record"))
	e.setPods(free...)
	e.host.Tick()
	assert.True(t, strings.HasPrefix(e.state(r.id), "routed"), e.state(r.id))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.flow.admission_corrupt"))
}

func TestFlowQueueBound(t *testing.T) {
	e := newEnv(t, `{"models": [{"name": "shed", "criticality": "Sheddable"}], "flowControl": {"maxRequests": 2, "maxBytes": 200}}`)
	e.setPods(busy...)
	e.requireHeld(e.post("/v1/chat/completions", nil, chat("shed")))
	e.requireHeld(e.post("/v1/chat/completions", nil, chat("shed")))
	full := e.post("/v1/chat/completions", nil, chat("shed"))
	require.NotNil(t, full.local)
	assert.Equal(t, uint32(429), full.local.StatusCode)
	msg, typ, code := full.errorJSON(t)
	assert.Equal(t, "rate_limit_error", typ)
	assert.Equal(t, "capacity_exhausted", code)
	assert.Contains(t, msg, "the queue is full")
	assert.Equal(t, uint64(1), e.counter("wasm_epp.flow.rejected_full"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.dropped"))
	assert.Equal(t, uint64(2), e.gauge("wasm_epp.flow.queued.sheddable"))

	// The byte bound: one large body does not fit beside nothing.
	e2 := newEnvAfter(t, e, `{"models": [{"name": "shed", "criticality": "Sheddable"}], "flowControl": {"maxBytes": 100}}`)
	e2.setPods(busy...)
	big := e2.post("/v1/completions", nil, `{"model":"shed","prompt":"`+strings.Repeat("x", 200)+`"}`)
	require.NotNil(t, big.local)
	assert.Equal(t, uint32(429), big.local.StatusCode)
	assert.Equal(t, uint64(1), e2.counter("wasm_epp.flow.rejected_full"))
}

// newEnvAfter closes prev (proxytest is a process-wide singleton) and
// starts another env.
func newEnvAfter(t *testing.T, prev *env, cfg string) *env {
	prev.close()
	return newEnv(t, cfg)
}

func TestFlowTTL(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	short := e.post("/v1/chat/completions", [][2]string{{"x-wasm-epp-queue-ttl-ms", "1"}}, chat("shed"))
	e.requireHeld(short)
	long := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(long)
	time.Sleep(5 * time.Millisecond) // past the 1 ms deadline (only a lower bound matters)
	e.host.Tick()
	l := e.host.GetSentLocalResponse(short.id)
	require.NotNil(t, l, "expired")
	assert.Equal(t, uint32(429), l.StatusCode)
	// (Response code details are not passed natively; e2e/filtertest
	// checks them in the host.)
	res := result{local: l}
	msg, typ, code := res.errorJSON(t)
	assert.Equal(t, "rate_limit_error", typ)
	assert.Equal(t, "capacity_exhausted", code)
	assert.Regexp(t, `waited \d+ms \(its limit\)`, msg)
	assert.Equal(t, "held", e.state(long.id), "the default TTL (10s) has not passed")
	assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.expired"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.flow.expired"))

	// 0 means "do not wait": refused at once, as without flow control.
	now := e.post("/v1/chat/completions", [][2]string{{"x-wasm-epp-queue-ttl-ms", "0"}}, chat("shed"))
	require.NotNil(t, now.local)
	assert.Equal(t, uint32(429), now.local.StatusCode)
	assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.dropped"))

	// Malformed values are ignored (counted, logged at most every 10 s).
	for _, v := range []string{"5s", "-1", "1.5", "abc", "1 2"} {
		e.requireHeld(e.post("/v1/chat/completions", [][2]string{{"x-wasm-epp-queue-ttl-ms", v}}, chat("shed")))
	}
	assert.Equal(t, uint64(5), e.counter("wasm_epp.flow.bad_ttl_header"))
	warned := 0
	for _, l := range e.host.GetWarnLogs() {
		if strings.Contains(l, "malformed x-wasm-epp-queue-ttl-ms") {
			warned++
		}
	}
	assert.Equal(t, 1, warned, "bounded log rate")
}

// Flow keys: missing or too long (over maxFlowKeyBytes, 16) share the
// anonymous flow, and a long key is counted; none grows anything past its
// bound.
func TestFlowKeys(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	long := strings.Repeat("t", 17)
	var ids []uint32
	for _, tenant := range []string{"", long, long + "x", "a"} {
		var h [][2]string
		if tenant != "" {
			h = [][2]string{{"x-tenant", tenant}}
		}
		r := e.post("/v1/chat/completions", h, chat("std"))
		e.requireHeld(r)
		ids = append(ids, r.id)
	}
	assert.Equal(t, uint64(2), e.counter("wasm_epp.flow.long_flow_key"))
	var order []int
	for range ids {
		e.setPods(oneSlot...)
		e.host.Tick()
		for i, id := range ids {
			if strings.HasPrefix(e.state(id), "routed") && !contains(order, i) {
				order = append(order, i)
			}
		}
	}
	// Anonymous flow (requests 0, 1, 2 in FIFO) and tenant a take turns.
	assert.Equal(t, []int{0, 3, 1, 2}, order)
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// A held request whose model resolves to another target is rewritten at
// release, exactly as one routed at once.
func TestFlowRewritesAtRelease(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	r := e.post("/v1/completions", nil, `{"model":"split","prompt":"hi"}`)
	e.requireHeld(r)
	assert.Equal(t, `{"model":"split","prompt":"hi"}`, string(e.host.GetCurrentRequestBody(r.id)), "not rewritten while held")
	e.setPods(free...)
	e.host.Tick()
	assert.True(t, strings.HasPrefix(e.state(r.id), "routed"), e.state(r.id))
	assert.Equal(t, `{"model":"split-v2","prompt":"hi"}`, string(e.host.GetCurrentRequestBody(r.id)))
}

// A held request that can no longer be routed at all gets what a new one
// would: 503.
func TestFlowNoEndpointAtRelease(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	r := e.post("/v1/chat/completions", nil, chat("std"))
	e.requireHeld(r)
	e.setPods() // the fleet is gone
	e.host.Tick()
	assert.Equal(t, "503", e.state(r.id))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.flow.no_endpoint"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.no_endpoint"))
}

// Clients that go away while held leave the queue at once (on_log), and
// their contexts are never touched again: thousands of them leave nothing
// queued, and a later release routes only the live one.
func TestFlowAbandoned(t *testing.T) {
	e := newEnv(t, `{"models": [{"name": "shed", "criticality": "Sheddable"}], "flowControl": {"maxRequests": 100}}`)
	e.setPods(busy...)
	const n = 3000
	for i := range n {
		r := e.post("/v1/chat/completions", nil, chat("shed"))
		e.requireHeld(r)
		if i%7 == 0 {
			e.host.Tick()
		}
		e.host.CompleteHttpContext(r.id) // client reset: on_log, then on_delete
	}
	assert.Zero(t, e.gauge("wasm_epp.flow.queued.sheddable"))
	assert.Zero(t, e.gauge("wasm_epp.flow.queued_bytes"))
	assert.Equal(t, uint64(n), e.counter("wasm_epp.flow.abandoned"))
	assert.Equal(t, uint64(n), e.counter("wasm_epp.requests.abandoned"))
	assert.Zero(t, e.counter("wasm_epp.flow.rejected_full"), "abandoned requests free their place (bound 100)")
	live := e.post("/v1/chat/completions", nil, chat("shed"))
	e.requireHeld(live)
	e.setPods(free...)
	e.host.Tick()
	assert.True(t, strings.HasPrefix(e.state(live.id), "routed"), e.state(live.id))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.flow.released"))
	assert.Empty(t, e.host.GetErrorLogs(), "no held stream was missing")
}

// Without flow control nothing waits and no tick runs.
func TestFlowOffByDefault(t *testing.T) {
	e := newEnv(t, `{"models": [{"name": "shed", "criticality": "Sheddable"}]}`)
	e.setPods(busy...)
	r := e.post("/v1/chat/completions", nil, chat("shed"))
	require.NotNil(t, r.local)
	assert.Equal(t, uint32(429), r.local.StatusCode)
	_, err := e.host.GetGaugeMetric("wasm_epp.flow.queued.sheddable")
	assert.Error(t, err, "no flow metrics are defined")
}

// The router's tick is the shortest period of its work; longer periods run
// on the nearest tick.
func TestTickShared(t *testing.T) {
	var p periodic
	const tick = 20 * time.Millisecond
	var ran []time.Duration
	for now := time.Duration(0); now <= 300*time.Millisecond; now += tick + time.Millisecond {
		if p.due(now, 100*time.Millisecond, tick) {
			ran = append(ran, now)
		}
	}
	assert.Equal(t, []time.Duration{0, 105 * time.Millisecond, 210 * time.Millisecond}, ran)
	var q periodic
	for now := time.Duration(0); now < 5*time.Millisecond; now += time.Millisecond {
		assert.True(t, q.due(now, tick, tick), "work on the tick's own period runs on every tick")
	}
	e := newEnv(t, `{"flowControl": {"releaseInterval": "35ms"}, "snapshotRefreshInterval": "0s"}`)
	_ = e
	r, err := NewRouter(e.cfg, Options{})
	require.NoError(t, err)
	assert.Equal(t, 35*time.Millisecond, r.TickPeriod())
	shared, err := NewRouter(mustDecode(t, `{"flowControl": {"releaseInterval": "35ms"}}`), Options{})
	require.NoError(t, err)
	assert.Equal(t, config.DefaultSnapshotRefresh, shared.TickPeriod(), "the snapshot's re-read shares the tick")
	off, err := NewRouter(mustDecode(t, `{"snapshotRefreshInterval": "0s"}`), Options{})
	require.NoError(t, err)
	assert.Zero(t, off.TickPeriod(), "no periodic work, no tick")
}

func mustDecode(t *testing.T, s string) *config.Config {
	t.Helper()
	c, err := config.Decode([]byte(s))
	require.NoError(t, err)
	return c
}

// A release in a request callback reads the held request's body without
// touching the calling request's: both are rewritten from their own
// bodies.
func TestFlowCallbackReleaseKeepsTheCallersBody(t *testing.T) {
	e := newEnv(t, flowConfig)
	e.setPods(busy...)
	a := e.post("/v1/completions", nil, `{"model":"split","prompt":"a"}`)
	e.requireHeld(a)
	e.setPods(free...)
	b := e.post("/v1/completions", nil, `{"model":"split","prompt":"`+strings.Repeat("b", 40)+`"}`)
	assert.Equal(t, types.ActionContinue, b.action)
	assert.True(t, strings.HasPrefix(e.state(a.id), "routed"), e.state(a.id))
	assert.Equal(t, `{"model":"split-v2","prompt":"a"}`, string(e.host.GetCurrentRequestBody(a.id)))
	assert.Equal(t, `{"model":"split-v2","prompt":"`+strings.Repeat("b", 40)+`"}`, b.body)
}

// A held request released later is not the one the prefix tracker hashed
// last: its release neither records another request's prompt under its
// endpoint nor judges its response against another's prediction.
func TestFlowReleaseUsesNoOtherPrefix(t *testing.T) {
	e := newEnv(t, `{"models": [{"name": "chat", "criticality": "Critical"}, {"name": "batch", "criticality": "Sheddable"}],
	  "scheduler": {"profile": "prefix-aware"}, "flowControl": {}}`)
	e.setPods(busy...)
	body := func(model, text string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat(text, 200) + `"}]}`
	}
	usage := `{"usage":{"prompt_tokens":600,"prompt_tokens_details":{"cached_tokens":0}}}`
	held := e.post("/v1/chat/completions", nil, body("batch", "held prompt "))
	e.requireHeld(held)
	crit := e.post("/v1/chat/completions", nil, body("chat", "critical prompt "))
	require.NotEmpty(t, crit.dest())
	e.respond(crit, usage)
	e.host.Tick() // the first tick publishes
	judged := e.counter("wasm_epp.prefix.responses.judged")
	require.Equal(t, uint64(1), judged, "the critical response is judged")
	e.setPods(free...)
	e.host.Tick()
	require.True(t, strings.HasPrefix(e.state(held.id), "routed"), e.state(held.id))
	e.respond(result{id: held.id}, usage)
	time.Sleep(60 * time.Millisecond) // the prefix counters are published every 50 ms (syncInterval)
	e.host.Tick()
	assert.Equal(t, judged, e.counter("wasm_epp.prefix.responses.judged"), "the released request was judged on the critical one's prediction")
}
