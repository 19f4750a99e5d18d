package filter

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/prefixroute"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// originalDstHostHeader is Envoy's own ORIGINAL_DST header (its default for
// use_http_header without a name): removed too, so a cluster configured
// with the default can never be steered by a client.
const originalDstHostHeader = "x-envoy-original-dst-host"

// httpContext is one request through the router. Its callbacks, in the
// order Envoy calls them, are the whole request path; the work they hand
// over is the Router's (router.go).
type httpContext struct {
	types.DefaultHttpContext
	r *Router
	// finished: a decision was made (routed, or a local reply sent); later
	// callbacks change nothing.
	finished bool
	// forwarded is the outcome (routed or fail_open) of a request let on
	// with a destination; pending until the response shows whether it
	// went upstream (countForwarded), so that each request counts once and
	// one Envoy's route table answers counts as direct_response.
	forwarded outcome
	pending   bool
	// servedBy names the chosen endpoint for the optional response header,
	// set only on responses that came from it.
	servedBy string
	// bodySize is what the body callbacks buffered so far: a request with
	// trailers ends without a body callback at end of stream.
	bodySize int
	sawBody  bool
	// spent is the time spent in the request callbacks so far; recorded in
	// wasm_epp.request_us once the request is decided.
	spent    time.Duration
	recorded bool
	// start is when the current callback began (clock.Since).
	start time.Duration
	// prefix is the routed request's prefix prediction, checked against
	// the response's usage when scanUsage.
	prefix    prefixroute.Pending
	scanUsage bool
	// id is the stream's context id: a held request is acted on from the
	// router's tick through proxy_set_effective_context(id).
	id uint32
	// held is set while flow control holds the request (flow.go).
	held held
}

// reset readies a context for another request, keeping its buffers.
func (c *httpContext) reset(r *Router) {
	p := c.prefix
	p.Reset()
	*c = httpContext{r: r, prefix: p}
}

// The request callbacks are timed: wasm_epp.request_us is the filter's own
// cost per request (host calls included), the figure the CPU budget is about.

func (c *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	c.begin()
	a := c.onRequestHeaders(endOfStream)
	c.account()
	return a
}

func (c *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	c.bodySize, c.sawBody = bodySize, true
	if !endOfStream && !c.finished && bodySize <= c.r.cfg.MaxBodyBytes {
		return types.ActionPause // still buffering: nothing to time
	}
	c.begin()
	a := c.onRequestBody(bodySize, endOfStream)
	c.account()
	return a
}

// OnHttpRequestTrailers: a request with trailers (HTTP/2) ends here; its
// last body callback had no end of stream. Envoy still gives the body
// buffered so far (the filter paused every body callback, and the request
// body reads as the decoding buffer while buffering: envoy's Wasm context
// getBuffer) and the request headers have not left (on_request_headers
// paused), so the request is routed here as at the end of its body.
func (c *httpContext) OnHttpRequestTrailers(int) types.Action {
	if c.finished {
		return types.ActionContinue
	}
	c.begin()
	var a types.Action
	if c.sawBody {
		a = c.onRequestBody(c.bodySize, true)
	} else {
		a = c.onRequestHeaders(true) // headers, then trailers: no body
	}
	c.account()
	return a
}

// OnHttpResponseHeaders counts a forwarded request by where its response
// comes from, and names the endpoint only on a response it served.
func (c *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	if !c.pending && c.servedBy == "" {
		return types.ActionContinue
	}
	src := c.r.responseSource()
	if c.pending {
		c.pending = false
		if src == fromRouteTable {
			c.r.count(outDirectResponse)
		} else {
			c.r.count(c.forwarded)
		}
	}
	if c.servedBy != "" && src == fromUpstream {
		_ = proxywasm.ReplaceHttpResponseHeader(c.r.cfg.ServedByHeader, c.servedBy)
	}
	return types.ActionContinue
}

// OnHttpResponseBody reads usage for the prefix check as chunks pass:
// never buffered, never delayed.
func (c *httpContext) OnHttpResponseBody(bodySize int, endOfStream bool) types.Action {
	if c.scanUsage {
		c.r.scanResponse(c, bodySize, endOfStream)
		c.scanUsage = !endOfStream
	}
	return types.ActionContinue
}

// OnHttpStreamDone (proxy_on_log) is the stream's last callback with the
// context (then proxy_on_done and proxy_on_delete, which the binding
// handles), so the context can serve another request. A forwarded request
// that got no response (the client went away) counts as forwarded. A
// response that ended without its last body chunk (no body, a reset) is
// judged for the prefix check on what passed. A held request whose client
// went away leaves the queue first.
func (c *httpContext) OnHttpStreamDone() {
	if c.pending {
		c.r.count(c.forwarded)
	}
	if c.scanUsage {
		c.r.prefix.ResponseDone(&c.prefix, c.r.clock.Now())
	}
	if g := c.r.flow; g != nil {
		g.abandon(c)
	}
	c.r.recycle(c)
}

func (c *httpContext) begin() { c.start = c.r.clock.Since() }

func (c *httpContext) account() {
	c.spent += c.r.clock.Since() - c.start
	c.recordCost()
}

// recordCost records the request's own callback time once it is decided
// (for a held request: at release or expiry, its wait not included).
func (c *httpContext) recordCost() {
	if c.finished && !c.recorded {
		c.recorded = true
		c.r.m.requestMicro.Record(uint64((c.spent + time.Microsecond/2) / time.Microsecond))
	}
}

func (c *httpContext) onRequestHeaders(endOfStream bool) types.Action {
	r := c.r
	// Only the filter names a destination: a client-written destination
	// header would otherwise pick the pod. Removing an absent header is OK
	// in Envoy.
	_ = proxywasm.RemoveHttpRequestHeader(r.cfg.DestinationHeader)
	_ = proxywasm.RemoveHttpRequestHeader(originalDstHostHeader)

	if endOfStream {
		switch method, _ := proxywasm.GetHttpRequestHeader(":method"); method {
		case "POST", "PUT", "PATCH":
			return c.refuse(outBadRequest, string(ReasonEmptyBody),
				"the request body is empty: expected a JSON object with a \"model\" field")
		}
		return c.route(nil, nil, nil, "", r.current(c.start))
	}
	if cl, err := proxywasm.GetHttpRequestHeaderInto(r.headerBuf[:0], "content-length"); err == nil {
		if n, ok := parseDecimal(cl); ok && n > uint64(r.cfg.MaxBodyBytes) {
			return c.refuseTooLarge()
		}
	}
	if r.mayRewrite {
		// Envoy does not fix Content-Length when a filter changes the
		// body; without one the request goes upstream chunked.
		_ = proxywasm.RemoveHttpRequestHeader("content-length")
	}
	// Wait for the body. With allow_on_headers_stop_iteration this is
	// StopIteration and the headers stay writable in the body callback.
	return types.ActionPause
}

func (c *httpContext) onRequestBody(bodySize int, endOfStream bool) types.Action {
	if c.finished {
		return types.ActionContinue
	}
	if c.held.handle.Valid() {
		return types.ActionPause // held: the tick releases it
	}
	r := c.r
	if bodySize > r.cfg.MaxBodyBytes {
		return c.refuseTooLarge()
	}
	if !endOfStream {
		return types.ActionPause // buffer: each later call sees the whole body
	}
	body, err := r.readBody(bodySize)
	if err != nil {
		return c.failInternal("cannot read the request body", err)
	}
	snap := r.current(c.start) // metrics and the model table from Kubernetes objects
	p, err := parseRequest(body, r.cfg.MaxModelNameLength, r.knownModel)
	if err != nil {
		e := err.(*RequestError)
		return c.refuse(outBadRequest, string(e.Reason), e.Msg)
	}
	m, ok := r.resolveModel(p.Model)
	if !ok {
		if r.cfg.UnknownModels != config.UnknownModelPassthrough {
			// p.Model passed ValidModelName (no control characters,
			// bounded) and is JSON-escaped in the body.
			return c.refuse(outUnknownModel, "", fmt.Sprintf("The model %q does not exist", p.Model))
		}
		m = &r.passthrough
	}
	target := r.pickTarget(m, p.Model)
	if r.prefix != nil {
		start := r.clock.Since()
		err := r.prefix.Hash(target, prefixroute.Prompt{Prompt: Raw(body, p.Prompt), Messages: Raw(body, p.Messages),
			Tools: Raw(body, p.Tools), CacheSalt: Raw(body, p.CacheSalt), NoEscapes: p.NoEscapes})
		if err != nil {
			return c.refuse(outBadRequest, string(ReasonInvalidField), strings.TrimPrefix(err.Error(), "prefix: "))
		}
		r.prefix.Hashed(r.clock.Since() - start)
	}
	return c.route(&p, m, body, target, snap)
}

// route schedules the request (p nil: no body, least loaded) on snap (read
// in this callback), rewrites the model when the target differs, sets the
// destination header and lets the request continue, or replies with the
// error the decision calls for.
func (c *httpContext) route(p *Parsed, m *model, body []byte, targetModel string, snap *scheduler.Snapshot) types.Action {
	r := c.r
	g := r.flow
	if g != nil && p != nil && m.crit != scheduler.Critical {
		return g.route(c, p, m, body, targetModel, snap) // flow control decides when (flow.go)
	}
	var req *scheduler.Request
	if p != nil {
		req = &r.req
		req.Model, req.TargetModel, req.Criticality, req.Prefix = p.Model, targetModel, m.crit, nil
		if r.prefix != nil {
			r.prefix.Prepare(req, snap)
		}
	}
	d := r.decide(req, snap)
	if r.debugEnabled() {
		c.logDecision(p, req, &d)
	}
	var a types.Action
	switch d.outcome {
	case outDropped:
		a = c.refuseDropped("")
	case outNoEndpoint:
		a = c.refuse(outNoEndpoint, "", noEndpointMessage(d.res))
	default:
		a = c.send(p, targetModel, body, snap, d)
	}
	if g != nil {
		g.onSnapshot(snap, c) // held requests go after this one, which never waits
	}
	return a
}

// send routes a decided request (d Routed or FailedOpen): rewrites the
// model when the target differs, sets the destination header and counts
// the outcome. Continue lets it go upstream; a held request is continued
// by its release (flow.go, which calls forward).
func (c *httpContext) send(p *Parsed, targetModel string, body []byte, snap *scheduler.Snapshot, d decision) types.Action {
	if err := c.forward(p, targetModel, body, snap, d, true); err != nil {
		return c.failInternal("cannot route the request", err)
	}
	return types.ActionContinue
}

// forward is send without the reply: it rewrites the body, sets the
// destination and counts the request as forwarded, or says why it could
// not (nothing counted). prepared: the request is the one the prefix
// tracker hashed last (a new request; a held one released later is not,
// and its prefix is neither recorded nor checked).
func (c *httpContext) forward(p *Parsed, targetModel string, body []byte, snap *scheduler.Snapshot, d decision, prepared bool) error {
	r := c.r
	if p != nil && targetModel != p.Model {
		if !r.mayRewrite {
			// Only the Kubernetes model table rewrites this request; the
			// headers are still held, so Content-Length can go now.
			_ = proxywasm.RemoveHttpRequestHeader("content-length")
		}
		if err := proxywasm.ReplaceHttpRequestBody(spliceModel(body, p, targetModel)); err != nil {
			return fmt.Errorf("rewriting the body: %w", err)
		}
	}
	if err := proxywasm.ReplaceHttpRequestHeader(r.cfg.DestinationHeader, r.destinationOf(snap, d.res.Index)); err != nil {
		return fmt.Errorf("setting the destination header: %w", err)
	}
	if r.cfg.ServedByHeader != "" {
		c.servedBy = d.res.Endpoint.ID.String()
	}
	if p != nil && r.prefix != nil && prepared {
		// Only a request that goes upstream is recorded: a refused one
		// (above) writes nothing to the index.
		r.prefix.Routed(d.res.Index, r.clock.Now(), &c.prefix)
		c.scanUsage = !p.Stream || p.StreamUsage
	}
	c.finished = true
	c.forwarded, c.pending = d.outcome, true
	return nil
}

func noEndpointMessage(res scheduler.Result) string {
	if res.Outcome == scheduler.AllStale {
		return "no model server endpoint has fresh metrics"
	}
	return "no model server endpoint is available"
}

func (c *httpContext) refuseDropped(why string) types.Action {
	return c.refuse(outDropped, "", "every endpoint is at capacity"+why+" and this request is sheddable: retry later")
}

func (c *httpContext) finish(o outcome) {
	c.finished = true
	c.r.count(o)
}

// refuse ends the request with the local reply of outcome o (reply.go);
// code "" means the outcome's own error code.
func (c *httpContext) refuse(o outcome, code, msg string) types.Action {
	c.finish(o)
	sendLocalReply(o, code, msg)
	return types.ActionPause
}

func (c *httpContext) refuseTooLarge() types.Action {
	return c.refuse(outTooLarge, "", fmt.Sprintf("the request body is larger than %d bytes", c.r.cfg.MaxBodyBytes))
}

// failInternal logs what went wrong and answers 500 without details.
func (c *httpContext) failInternal(what string, err error) types.Action {
	proxywasm.LogErrorf("wasm-epp: %s: %v", what, err)
	return c.refuse(outInternal, "", "the gateway failed to route the request")
}

// logDecision writes the decision and why at debug level. Model names are
// %q-quoted: they come from the client.
func (c *httpContext) logDecision(p *Parsed, req *scheduler.Request, d *decision) {
	ep := "-"
	if e := d.res.Endpoint; e != nil {
		ep = e.ID.String() + " " + c.r.destination(e)
	}
	if p == nil {
		proxywasm.LogDebugf("wasm-epp: no body: %s via path %q (stale endpoints: %d) -> %s",
			outcomeNames[d.outcome], d.res.Path, d.res.Stale, ep)
		return
	}
	proxywasm.LogDebugf("wasm-epp: model %q -> target %q, %s, %s, stream=%t, prompt %d bytes: %s via path %q (profile %q, stale endpoints: %d) -> %s",
		p.Model, req.TargetModel, req.Criticality, p.Kind, p.Stream, p.PromptBytes,
		outcomeNames[d.outcome], d.res.Path, d.res.Profile, d.res.Stale, ep)
}

// parseDecimal parses a Content-Length value (digits only; Envoy has
// already refused malformed ones). It allocates nothing, unlike
// strconv.ParseUint on a converted string.
func parseDecimal(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' || n > (math.MaxUint64-9)/10 {
			return 0, false // not a number, or too big for a uint64
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// spliceModel returns body with the "model" string token replaced by
// target, as a JSON string. Nothing else is touched (no re-marshal).
func spliceModel(body []byte, p *Parsed, target string) []byte {
	out := make([]byte, 0, len(body)-(p.ModelEnd-p.ModelStart)+len(target)+2)
	out = append(out, body[:p.ModelStart]...)
	out = appendJSONString(out, target)
	return append(out, body[p.ModelEnd:]...)
}
