package filter

import (
	"fmt"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

// Flow control (configuration "flowControl"): flow control decides when a
// Standard or Sheddable request goes, the profile decides where. A request
// goes at once when nothing of its band is held and the endpoint the
// profile picks for it (scheduled as admitted: never shed) has room
// (flowcontrol.Room); otherwise it is held, and released when an endpoint
// has room for it. The queue, its order and bounds, the room test and the
// release are scheduler/flowcontrol's, the same code the fleet benchmark
// runs; this file is the glue to the proxy:
//
//   - hold: the body callback (or the trailers callback) returns Pause at
//     the end of the request, so with allow_on_headers_stop_iteration the
//     headers and the buffered body stay writable until the request is
//     released (as Envoy holds a stream: e2e/envoyhost emulates it, with
//     its sources);
//   - release: a released request gets its destination header (and its
//     rewritten body) through proxy_set_effective_context, then
//     proxy_continue_stream. It happens on the router's tick (every
//     releaseInterval), which first expires requests past their TTL with
//     429, and in the first request callback that sees a new snapshot,
//     which only routes: a local reply sent there to another stream would
//     stop the calling stream too (the host's stop-iteration flag is the
//     VM's, not the stream's), so expiry, 503s and failures wait for the
//     tick;
//   - abandonment: a client that goes away while held ends the stream
//     (on_log, then on_done): OnHttpStreamDone takes it out of the queue
//     before the context is reused.

// flowGate is a router's flow control; its methods are flow control's
// part of the request path and of the tick.
type flowGate struct {
	r        *Router
	cfg      flowcontrol.Config
	queue    *flowcontrol.Queue[*httpContext]
	releaser flowcontrol.Releaser[*httpContext]
	// ttlHeader and flowHeader are the request headers read when a request
	// is held ("" when not configured).
	ttlHeader, flowHeader string
	headerBuf             []byte
	// bodyBuf is where a held body is read at release: not the router's
	// body buffer, which holds the body of the request whose callback may
	// be releasing (onSnapshot).
	bodyBuf []byte
	// snap is the snapshot of the release in progress; elapsed the time
	// of its last scheduler call; inCallback says the release runs inside
	// a request callback (routes only, see the file comment).
	snap       *scheduler.Snapshot
	elapsed    time.Duration
	inCallback bool
	// releasedOn is the snapshot the last release ran on (releasedAny:
	// there was one), so a request callback releases once per snapshot.
	releasedOn  uint64
	releasedAny bool
	// failed are held requests released in a request callback whose
	// destination could not be set: the next tick answers them (500).
	failed []failedRelease

	m        flowMetrics
	lastSeen flowcontrol.Stats
	// Rate-limited logs: queue full, malformed headers, admission errors.
	fullLog, headerLog, admissionLog flowcontrol.LogLimiter
}

type failedRelease struct {
	c   *httpContext
	id  uint32
	err error
}

type flowMetrics struct {
	queued                                     [flowcontrol.NumBands]proxywasm.MetricGauge
	bytes                                      proxywasm.MetricGauge
	enqueued, released, expired, full, aband   proxywasm.MetricCounter
	left, badTTL, longKey, admissionErr, contn proxywasm.MetricCounter
	corrupt                                    proxywasm.MetricCounter
	waitMs                                     proxywasm.MetricHistogram
	published                                  [flowcontrol.NumBands]int64
	publishedBytes                             int64
	contention, corruptSeen                    uint64
}

// flowLogEvery bounds each flow-control log line to one per interval.
const flowLogEvery = 10 * time.Second

func newFlowGate(r *Router, cfg flowcontrol.Config) (*flowGate, error) {
	q, err := flowcontrol.New[*httpContext](cfg)
	if err != nil {
		return nil, err
	}
	g := &flowGate{r: r, cfg: cfg, queue: q, headerBuf: make([]byte, 0, 64),
		fullLog: flowcontrol.LogLimiter{Interval: flowLogEvery}, headerLog: flowcontrol.LogLimiter{Interval: flowLogEvery},
		admissionLog: flowcontrol.LogLimiter{Interval: flowLogEvery}}
	if cfg.TTLHeader != flowcontrol.NoTTLHeader {
		g.ttlHeader = cfg.TTLHeader
	}
	g.flowHeader = cfg.FlowHeader
	g.releaser = flowcontrol.Releaser[*httpContext]{
		Queue:     q,
		Admission: flowcontrol.NewAdmission(shareddata.Store{}, r.cfg.AdmissionKey()),
		Room:      cfg.Admit,
		Schedule:  g.schedule,
		Done:      g.released,
	}
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
	m.corrupt = proxywasm.DefineCounterMetric("wasm_epp.flow.admission_corrupt")
	m.waitMs = proxywasm.DefineHistogramMetric("wasm_epp.flow.wait_ms")
	return g, nil
}

// held is what a held request needs at release: what its first decision
// had.
type held struct {
	handle flowcontrol.Handle
	p      Parsed
	m      *model
	target string
}

// route decides a Standard or Sheddable request (the router's route hands
// every one over when flow control is on): held requests go first, then
// this one goes now if nothing of its band is held and the profile's
// endpoint for it has room, else it is held.
func (g *flowGate) route(c *httpContext, p *Parsed, m *model, body []byte, target string, snap *scheduler.Snapshot) types.Action {
	if b, _ := flowcontrol.BandFor(m.crit); g.queue.Waiting(b) {
		// Requests of its band or a higher one are held: they go first,
		// and it waits behind those that stay.
		g.onSnapshot(snap, c)
		if g.queue.Waiting(b) {
			return g.hold(c, p, m, target, len(body))
		}
	}
	a := g.admit(c, p, m, body, target, snap)
	if !c.held.handle.Valid() {
		// Only lower bands are held: they go after it. (A request held
		// just now is not released from its own callback: continuing a
		// stream before its callback has returned its status is not
		// something Envoy's filter manager expects.)
		g.onSnapshot(snap, c)
	}
	return a
}

// admit decides a request nothing of its band is held ahead of: it goes
// now if the profile's endpoint for it (scheduled as admitted) has room,
// is held if not, or is refused if there is no endpoint at all.
func (g *flowGate) admit(c *httpContext, p *Parsed, m *model, body []byte, target string, snap *scheduler.Snapshot) types.Action {
	r := g.r
	req := &r.req
	req.Model, req.TargetModel, req.Criticality, req.Admitted, req.Prefix = p.Model, target, m.crit, true, nil
	if r.prefix != nil {
		r.prefix.Prepare(req, snap)
	}
	start := r.clock.Decide()
	res := r.sched.Schedule(req, snap)
	elapsed := r.clock.Since() - start
	req.Admitted = false
	switch {
	case g.cfg.Admit.Take(snap, res, target):
	case res.Outcome == scheduler.Routed || res.Outcome == scheduler.Dropped:
		// No room there now: held, and its decision is counted when it
		// is released.
		r.m.scheduleMicro.Record(uint64(elapsed / time.Microsecond))
		return g.hold(c, p, m, target, len(body))
	}
	d := r.record(snap, res, elapsed)
	if r.debugEnabled() {
		c.logDecision(p, req, &d)
	}
	if d.outcome == outNoEndpoint {
		return c.refuse(outNoEndpoint, "", noEndpointMessage(d.res))
	}
	return c.send(p, target, body, snap, d)
}

// hold queues the request, or refuses it with 429 as without flow control
// when the queue is full or the client's TTL header asks not to wait.
func (g *flowGate) hold(c *httpContext, p *Parsed, m *model, target string, bodySize int) types.Action {
	r := g.r
	b, ok := flowcontrol.BandFor(m.crit)
	if !ok {
		return c.refuseDropped("") // unreachable: Critical requests are never held
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

// tick is flow control's part of the router's tick (every
// flowControl.releaseInterval): answer failed releases, expire, release.
// now is the tick's time (clock.Since), the one the tick's snapshot
// re-read is stamped with, so the release reuses that re-read.
func (g *flowGate) tick(now time.Duration) {
	g.answerFailed()
	if g.queue.Len() == 0 {
		return
	}
	r := g.r
	g.queue.Expire(now, g.expired)
	if g.queue.Len() > 0 {
		g.release(r.reread(now), false)
	}
	g.publish()
}

// onSnapshot releases what has room when a request callback of caller
// sees a snapshot nothing was released on yet. The releases act on other
// streams through the effective context; the caller's own callback acts
// on its stream again afterwards.
func (g *flowGate) onSnapshot(snap *scheduler.Snapshot, caller *httpContext) {
	if !g.newSnapshotToRelease() {
		return
	}
	if g.release(snap, true) > 0 {
		if err := proxywasm.SetEffectiveContext(caller.id); err != nil {
			proxywasm.LogErrorf("wasm-epp: cannot act on stream %d again after releasing held requests: %v", caller.id, err)
		}
	}
	g.publish()
}

// newSnapshotToRelease tells whether requests are held and nothing was
// released on the current snapshot yet.
func (g *flowGate) newSnapshotToRelease() bool {
	return g.queue.Len() > 0 && !(g.releasedAny && g.snapshotTag() == g.releasedOn)
}

// onRefresh releases what has room on a snapshot the tick's re-read
// brought, when nothing was released on it yet. Requests decide on what
// the tick read, so a request callback may never see that snapshot as
// new, and held requests would otherwise wait for releaseInterval.
func (g *flowGate) onRefresh(snap *scheduler.Snapshot) {
	if !g.newSnapshotToRelease() {
		return
	}
	g.release(snap, false)
	g.publish()
}

// release offers the queue to the scheduler on snap; inCallback: from a
// request callback (routes only). It returns how many requests it acted on.
func (g *flowGate) release(snap *scheduler.Snapshot, inCallback bool) int {
	tag := g.snapshotTag()
	g.snap, g.inCallback = snap, inCallback
	var n int
	if inCallback {
		n = g.releaser.ReleaseRouted(g.r.clock.Since(), snap, tag)
	} else {
		n = g.releaser.Release(g.r.clock.Since(), snap, tag)
	}
	g.snap, g.inCallback = nil, false
	g.releasedOn, g.releasedAny = tag, true
	return n
}

// schedule is the scheduler call of a held request: the same as for a new
// one (Request.Admitted: flow control decides when), without Observe (the
// releaser counts what it dispatches) and without counting the decision: a
// request still blocked is offered again at every release, and only the
// decision that releases it is counted (released).
func (g *flowGate) schedule(c *httpContext, snap *scheduler.Snapshot) (scheduler.Result, string) {
	r := g.r
	r.req.Model, r.req.TargetModel, r.req.Criticality, r.req.Admitted, r.req.Prefix = c.held.p.Model, c.held.target, c.held.m.crit, true, nil
	start := r.clock.Decide()
	res := r.sched.Schedule(&r.req, snap)
	g.elapsed = r.clock.Since() - start
	r.req.Admitted = false
	return res, c.held.target
}

// released routes a held request the releaser let go (res Routed or
// FailedOpen), or refuses it as a new request would be (no endpoint; only
// from the tick).
func (g *flowGate) released(e flowcontrol.Entry[*httpContext], res scheduler.Result, admissionErr error) {
	r := g.r
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
	var err error
	if h.target != h.p.Model {
		body, err = readBodyInto(&g.bodyBuf, int(e.Bytes))
	}
	if err == nil {
		// Not prepared: the prefix tracker holds another request's hashes.
		err = c.forward(&h.p, h.target, body, g.snap, d, false)
	}
	switch {
	case err != nil && g.inCallback:
		// A reply now would stop the calling stream: the tick answers.
		g.failed = append(g.failed, failedRelease{c: c, id: c.id, err: err})
		return
	case err != nil:
		c.failInternal("cannot route the held request", err)
	default:
		if err := proxywasm.ResumeHttpRequest(); err != nil {
			proxywasm.LogErrorf("wasm-epp: cannot resume held stream %d: %v", c.id, err)
		}
	}
	c.recordCost()
}

// answerFailed answers, from the tick, the requests a release in a request
// callback could not route.
func (g *flowGate) answerFailed() {
	for i, f := range g.failed {
		g.failed[i] = failedRelease{}
		if f.c.id != f.id || f.c.finished {
			continue // the stream ended meanwhile and its context serves another
		}
		if err := proxywasm.SetEffectiveContext(f.id); err != nil {
			continue
		}
		f.c.failInternal("cannot route the held request", f.err)
		f.c.recordCost()
	}
	g.failed = g.failed[:0]
}

// expired answers a request that waited its whole TTL with 429.
func (g *flowGate) expired(e flowcontrol.Entry[*httpContext]) {
	c := e.Value
	c.held = held{}
	if err := proxywasm.SetEffectiveContext(c.id); err != nil {
		proxywasm.LogErrorf("wasm-epp: held stream %d vanished: %v", c.id, err)
		g.r.count(outAbandoned)
		return
	}
	c.refuse(outExpired, "", fmt.Sprintf("every endpoint stayed at capacity while this request waited %s (its limit): retry later",
		e.Waited.Round(time.Millisecond)))
	c.recordCost()
}

// abandon takes a held request whose stream ended out of the queue.
func (g *flowGate) abandon(c *httpContext) {
	if !c.held.handle.Valid() {
		return
	}
	if _, ok := g.queue.Remove(c.held.handle, g.r.clock.Since()); ok {
		g.r.count(outAbandoned)
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
	corrupt := g.releaser.Admission.Stats().Corrupt
	inc(m.corrupt, corrupt, m.corruptSeen)
	m.corruptSeen = corrupt
	g.lastSeen = s
}

// snapshotTag names the current snapshot for Admission: every worker
// derives the same tag from the same stored content (wire.Cache.Tag: the
// generations of the segments it was built from), and so holds the same
// endpoints in the same order.
func (g *flowGate) snapshotTag() uint64 { return g.r.cache.Tag() }
