package filter

import (
	"errors"
	"fmt"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

// Flow control (configuration "flowControl"): a Standard or Sheddable
// request that finds no endpoint with capacity is held instead of refused,
// and released from the router's tick when the scheduler admits it. The
// queue, its order and bounds, and the release decision are
// scheduler/flowcontrol's, the same code the fleet benchmark runs; this
// file is the glue to the proxy:
//
//   - hold: the body callback returns Pause at the end of the body, so with
//     allow_on_headers_stop_iteration the headers and the buffered body stay
//     writable until the request is released (as Envoy holds a stream:
//     e2e/envoyhost emulates it, with its sources);
//   - release: OnTick (every releaseInterval) expires requests past their
//     TTL with 429, refreshes the snapshot (a new one is acted on at the
//     next tick) and offers the queue to the scheduler; a released request
//     gets its destination header (and its rewritten body) at that moment
//     through proxy_set_effective_context, then proxy_continue_stream;
//   - abandonment: a client that goes away while held ends the stream
//     (on_log, then on_done): OnHttpStreamDone takes it out of the queue
//     before the context is reused.

// flowGate is a router's flow control.
type flowGate struct {
	cfg      flowcontrol.Config
	queue    *flowcontrol.Queue[*httpContext]
	releaser flowcontrol.Releaser[*httpContext]
	// ttlHeader and flowHeader are the request headers read when a request
	// is held ("" when not configured).
	ttlHeader, flowHeader string
	headerBuf             []byte
	// expire is Router.expired as a func value made once.
	expire func(flowcontrol.Entry[*httpContext])
	// snap is the snapshot of the release in progress; elapsed the time
	// of its last scheduler call.
	snap    *scheduler.Snapshot
	elapsed time.Duration

	m        flowMetrics
	lastSeen flowcontrol.Stats
	// Rate-limited logs: queue full, malformed headers, admission errors.
	fullLog, headerLog, admissionLog flowcontrol.LogLimiter
}

type flowMetrics struct {
	queued                                     [flowcontrol.NumBands]proxywasm.MetricGauge
	bytes                                      proxywasm.MetricGauge
	enqueued, released, expired, full, aband   proxywasm.MetricCounter
	left, badTTL, longKey, admissionErr, contn proxywasm.MetricCounter
	waitMs                                     proxywasm.MetricHistogram
	published                                  [flowcontrol.NumBands]int64
	publishedBytes                             int64
	contention                                 uint64
}

// flowLogEvery bounds each flow-control log line to one per interval.
const flowLogEvery = 10 * time.Second

func newFlowGate(r *Router, cfg flowcontrol.Config) (*flowGate, error) {
	q, err := flowcontrol.New[*httpContext](cfg)
	if err != nil {
		return nil, err
	}
	g := &flowGate{cfg: cfg, queue: q, headerBuf: make([]byte, 0, 64),
		fullLog: flowcontrol.LogLimiter{Interval: flowLogEvery}, headerLog: flowcontrol.LogLimiter{Interval: flowLogEvery},
		admissionLog: flowcontrol.LogLimiter{Interval: flowLogEvery}}
	if cfg.TTLHeader != flowcontrol.NoTTLHeader {
		g.ttlHeader = cfg.TTLHeader
	}
	g.flowHeader = cfg.FlowHeader
	g.releaser = flowcontrol.Releaser[*httpContext]{
		Queue:     q,
		Admission: flowcontrol.NewAdmission(sharedData{}, r.cfg.AdmissionKey()),
		Schedule:  r.scheduleHeld,
		Done:      r.released,
	}
	g.expire = r.expired
	m := &g.m
	for b := range m.queued {
		m.queued[b] = proxywasm.DefineGaugeMetric("wasm_epp.flow.queued." + flowcontrol.Band(b).String())
	}
	m.bytes = proxywasm.DefineGaugeMetric("wasm_epp.flow.queued_bytes")
	m.enqueued = proxywasm.DefineCounterMetric("wasm_epp.flow.enqueued")
	m.released = proxywasm.DefineCounterMetric("wasm_epp.flow.released")
	m.expired = proxywasm.DefineCounterMetric("wasm_epp.flow.expired")
	m.full = proxywasm.DefineCounterMetric("wasm_epp.flow.rejected_full")
	m.aband = proxywasm.DefineCounterMetric("wasm_epp.flow.abandoned")
	m.left = proxywasm.DefineCounterMetric("wasm_epp.flow.no_endpoint")
	m.badTTL = proxywasm.DefineCounterMetric("wasm_epp.flow.bad_ttl_header")
	m.longKey = proxywasm.DefineCounterMetric("wasm_epp.flow.long_flow_key")
	m.admissionErr = proxywasm.DefineCounterMetric("wasm_epp.flow.admission_errors")
	m.contn = proxywasm.DefineCounterMetric("wasm_epp.flow.admission_contention")
	m.waitMs = proxywasm.DefineHistogramMetric("wasm_epp.flow.wait_ms")
	return g, nil
}

// sharedData is flowcontrol.Store over the proxy's shared data.
type sharedData struct{}

func (sharedData) GetInto(buf []byte, key string) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedDataInto(buf, key)
	if errors.Is(err, types.ErrorStatusNotFound) {
		return v, 0, flowcontrol.ErrNotFound
	}
	return v, cas, err
}

func (sharedData) Set(key string, value []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, value, cas)
	if errors.Is(err, types.ErrorStatusCasMismatch) {
		return flowcontrol.ErrCASMismatch
	}
	return err
}

// held is what a held request needs at release: what its first decision
// had.
type held struct {
	handle flowcontrol.Handle
	p      Parsed
	m      *model
	target string
}

// mustWait reports whether a request of criticality c must join the queue
// without being scheduled: requests of its band or a higher one wait, and
// scheduling it now would let it overtake them. Critical requests never
// wait.
func (g *flowGate) mustWait(c scheduler.Criticality) bool {
	b, ok := flowcontrol.BandFor(c)
	return ok && g.queue.Waiting(b)
}

// hold queues the request, or refuses it with 429 as without flow control
// when the queue is full or the client's TTL header asks not to wait.
func (c *httpContext) hold(p *Parsed, m *model, target string, bodySize int) types.Action {
	r := c.r
	g := r.flow
	b, ok := flowcontrol.BandFor(m.crit)
	if !ok {
		return c.refuseDropped("") // unreachable: Critical requests are never dropped
	}
	ttl := g.cfg.TTL
	if g.ttlHeader != "" {
		if v, err := proxywasm.GetHttpRequestHeaderInto(g.headerBuf[:0], g.ttlHeader); err == nil {
			var st flowcontrol.TTLStatus
			if ttl, st = flowcontrol.ParseTTL(v, g.cfg.TTL); st == flowcontrol.TTLMalformed {
				g.m.badTTL.Increment(1)
				if ok, n := g.headerLog.Allow(r.clock.Since()); ok {
					proxywasm.LogWarnf("wasm-epp: ignored a malformed %s header (want milliseconds as digits; %d more ignored since the last warning): the request waits up to %s",
						g.ttlHeader, n, g.cfg.TTL)
				}
			}
		}
	}
	if ttl <= 0 {
		return c.refuseDropped("") // the client asked not to wait
	}
	now := r.clock.Since()
	var h flowcontrol.Handle
	var err error
	if g.flowHeader == "" {
		h, err = g.queue.PushString(b, target, int64(bodySize), now, ttl, c)
	} else {
		v, _ := proxywasm.GetHttpRequestHeaderInto(g.headerBuf[:0], g.flowHeader)
		key, st := flowcontrol.FlowKey(v, g.cfg.MaxFlowKeyBytes)
		if st == flowcontrol.FlowKeyTooLong {
			g.m.longKey.Increment(1)
		}
		h, err = g.queue.Push(b, key, int64(bodySize), now, ttl, c)
	}
	if err != nil {
		if ok, n := g.fullLog.Allow(now); ok {
			proxywasm.LogWarnf("wasm-epp: flow-control queue full (%d requests, %d bytes held; limits %d and %d): refusing with 429 (%d more since the last warning)",
				g.queue.Len(), g.queue.Stats().Bytes, g.cfg.MaxRequests, g.cfg.MaxBytes, n)
		}
		g.publish()
		return c.refuseDropped(" and the queue is full")
	}
	c.held = held{handle: h, p: *p, m: m, target: target}
	g.publish()
	return types.ActionPause
}

// releaseHeld is flow control's part of the router's tick (every
// flowControl.releaseInterval): expire, then release.
func (r *Router) releaseHeld() {
	g := r.flow
	if g == nil || g.queue.Len() == 0 {
		return
	}
	now := r.clock.Since()
	g.queue.Expire(now, g.expire)
	if g.queue.Len() > 0 {
		g.snap = r.snapshot()
		g.releaser.Release(now, g.snap, r.snapshotTag())
		g.snap = nil
	}
	g.publish()
}

// scheduleHeld is the scheduler call of a held request: the same as for a
// new one (Router.decide), without Observe (the releaser counts what it
// dispatches) and without counting the decision: a request still blocked
// is offered again at every tick, and only the decision that releases it
// is counted (released).
func (r *Router) scheduleHeld(c *httpContext, snap *scheduler.Snapshot) scheduler.Result {
	r.req.Model, r.req.TargetModel, r.req.Criticality = c.held.p.Model, c.held.target, c.held.m.crit
	start := r.clock.Decide()
	res := r.sched.Schedule(&r.req, snap)
	r.flow.elapsed = r.clock.Since() - start
	return res
}

// released routes a held request the releaser let go (res Routed or
// FailedOpen), or refuses it as a new request would be (no endpoint).
func (r *Router) released(e flowcontrol.Entry[*httpContext], res scheduler.Result, admissionErr error) {
	g := r.flow
	c := e.Value
	h := c.held
	c.held = held{}
	if admissionErr != nil {
		g.m.admissionErr.Increment(1)
		if ok, n := g.admissionLog.Allow(r.clock.Since()); ok {
			proxywasm.LogWarnf("wasm-epp: flow control could not share an admission with the other workers (%v): routed on this worker's count alone (%d more since the last warning)", admissionErr, n)
		}
	}
	if err := proxywasm.SetEffectiveContext(c.id); err != nil {
		// The stream is gone without OnHttpStreamDone having run (which
		// would have taken it out of the queue): nothing to answer.
		proxywasm.LogErrorf("wasm-epp: held stream %d vanished: %v", c.id, err)
		r.count(outAbandoned)
		return
	}
	g.m.waitMs.Record(uint64(e.Waited / time.Millisecond))
	d := r.record(g.snap, res, g.elapsed)
	if r.debugEnabled() {
		c.logDecision(&h.p, &r.req, &d)
	}
	switch d.outcome {
	case outRouted, outFailOpen:
	default:
		c.refuse(outNoEndpoint, "", noEndpointMessage(res))
		c.recordCost()
		return
	}
	var body []byte
	if h.target != h.p.Model {
		var err error
		if body, err = r.readBody(int(e.Bytes)); err != nil {
			c.failInternal("cannot read the held request body", err)
			return
		}
	}
	if c.send(&h.p, h.target, body, g.snap, d) == types.ActionContinue {
		if err := proxywasm.ResumeHttpRequest(); err != nil {
			proxywasm.LogErrorf("wasm-epp: cannot resume held stream %d: %v", c.id, err)
		}
	}
	c.recordCost()
}

// expired answers a request that waited its whole TTL with 429.
func (r *Router) expired(e flowcontrol.Entry[*httpContext]) {
	c := e.Value
	c.held = held{}
	if err := proxywasm.SetEffectiveContext(c.id); err != nil {
		proxywasm.LogErrorf("wasm-epp: held stream %d vanished: %v", c.id, err)
		r.count(outAbandoned)
		return
	}
	c.refuse(outExpired, "", fmt.Sprintf("every endpoint stayed at capacity while this request waited %s (its limit): retry later",
		e.Waited.Round(time.Millisecond)))
	c.recordCost()
}

// abandon takes a held request whose stream ended out of the queue.
func (c *httpContext) abandon() {
	g := c.r.flow
	if g == nil || !c.held.handle.Valid() {
		return
	}
	if _, ok := g.queue.Remove(c.held.handle, c.r.clock.Since()); ok {
		c.r.count(outAbandoned)
		g.publish()
	}
	c.held = held{}
}

// publish brings the flow metrics up to the queue's counters: gauges by
// this VM's change (Envoy sums a gauge over the workers' additions),
// counters by their increase.
func (g *flowGate) publish() {
	s := g.queue.Stats()
	m := &g.m
	for b := range s.Len {
		if d := int64(s.Len[b]) - m.published[b]; d != 0 {
			m.queued[b].Add(d)
			m.published[b] = int64(s.Len[b])
		}
	}
	if d := s.Bytes - m.publishedBytes; d != 0 {
		m.bytes.Add(d)
		m.publishedBytes = s.Bytes
	}
	inc := func(c proxywasm.MetricCounter, now, before uint64) {
		if now > before {
			c.Increment(now - before)
		}
	}
	inc(m.enqueued, s.Enqueued, g.lastSeen.Enqueued)
	inc(m.released, s.Released, g.lastSeen.Released)
	inc(m.expired, s.Expired, g.lastSeen.Expired)
	inc(m.full, s.RejectedFull, g.lastSeen.RejectedFull)
	inc(m.aband, s.Abandoned, g.lastSeen.Abandoned)
	inc(m.left, s.Left, g.lastSeen.Left)
	inc(m.contn, g.releaser.ContentionBlocked, m.contention)
	m.contention = g.releaser.ContentionBlocked
	g.lastSeen = s
}

// snapshotTag names the current snapshot for Admission: every worker
// derives the same tag from the same stored snapshot.
func (r *Router) snapshotTag() uint64 {
	if r.cache.version != nil {
		return flowcontrol.TagFor(r.cache.version)
	}
	return uint64(r.cache.cas) | 1<<63
}
