package filter

import (
	"fmt"
	"math"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// originalDstHostHeader is Envoy's own ORIGINAL_DST header (its default for
// use_http_header without a name): removed too, so a cluster configured
// with the default can never be steered by a client.
const originalDstHostHeader = "x-envoy-original-dst-host"

// httpContext is one request through the router.
type httpContext struct {
	types.DefaultHttpContext
	r *router
	// finished: a decision was made (routed, or a local reply sent); later
	// callbacks change nothing.
	finished bool
	// servedBy names the chosen endpoint for the optional response header.
	servedBy string
	// spent is the time spent in the request callbacks so far; recorded in
	// wasm_epp.request_us once the request is decided.
	spent    time.Duration
	recorded bool
	// start is when the current callback began (router.mono).
	start time.Duration
}

// maxFreeContexts bounds the finished contexts a router keeps for reuse.
const maxFreeContexts = 64

// newHTTPContext returns a fresh context for a request, reusing a finished
// one when there is one: an allocation less per request.
func (r *router) newHTTPContext() *httpContext {
	if n := len(r.free); n > 0 {
		c := r.free[n-1]
		r.free[n-1] = nil
		r.free = r.free[:n-1]
		*c = httpContext{r: r}
		return c
	}
	return &httpContext{r: r}
}

// OnHttpStreamDone (proxy_on_log) is the stream's last callback with the
// context (then proxy_on_done and proxy_on_delete, which the binding
// handles), so the context can serve another request.
func (c *httpContext) OnHttpStreamDone() {
	r := c.r
	if len(r.free) < maxFreeContexts {
		*c = httpContext{r: r}
		r.free = append(r.free, c)
	}
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
	if !endOfStream && !c.finished && bodySize <= c.r.cfg.MaxBodyBytes {
		return types.ActionPause // still buffering: nothing to time
	}
	c.begin()
	a := c.onRequestBody(bodySize, endOfStream)
	c.account()
	return a
}

func (c *httpContext) begin() { c.start = c.r.mono() }

func (c *httpContext) account() {
	c.spent += c.r.mono() - c.start
	if c.finished && !c.recorded {
		c.recorded = true
		c.r.m.requestMicro.Record(uint64((c.spent + time.Microsecond/2) / time.Microsecond))
	}
}

func (c *httpContext) onRequestHeaders(endOfStream bool) types.Action {
	r := c.r
	// Only the filter names a destination (ARCHITECTURE.md "fail-safe
	// routing"); removing an absent header is OK in Envoy.
	_ = proxywasm.RemoveHttpRequestHeader(r.cfg.DestinationHeader)
	_ = proxywasm.RemoveHttpRequestHeader(originalDstHostHeader)

	if endOfStream {
		switch method, _ := proxywasm.GetHttpRequestHeader(":method"); method {
		case "POST", "PUT", "PATCH":
			return c.replyBadRequest(&RequestError{Reason: ReasonEmptyBody,
				Msg: "the request body is empty: expected a JSON object with a \"model\" field"})
		}
		return c.route(nil, nil, nil, "")
	}
	if cl, err := proxywasm.GetHttpRequestHeaderInto(r.headerBuf[:0], "content-length"); err == nil {
		if n, ok := parseDecimal(cl); ok && n > uint64(r.cfg.MaxBodyBytes) {
			return c.replyTooLarge()
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
	r := c.r
	if bodySize > r.cfg.MaxBodyBytes {
		return c.replyTooLarge()
	}
	if !endOfStream {
		return types.ActionPause // buffer: each later call sees the whole body
	}
	body, err := r.readBody(bodySize)
	if err != nil {
		return c.failInternal("cannot read the request body", err)
	}
	p, err := parseRequest(body, r.cfg.MaxModelNameLength, r.knownModel)
	if err != nil {
		return c.replyBadRequest(err.(*RequestError))
	}
	m, ok := r.models[p.Model]
	if !ok {
		if r.cfg.UnknownModels != config.UnknownModelPassthrough {
			return c.replyUnknownModel(p.Model)
		}
		m = &r.passthrough
	}
	return c.route(&p, m, body, r.pickTarget(m, p.Model))
}

// OnHttpRequestTrailers: a request with trailers ends in this callback,
// where Envoy no longer exposes the body, so it cannot be routed on.
func (c *httpContext) OnHttpRequestTrailers(int) types.Action {
	if c.finished {
		return types.ActionContinue
	}
	return c.replyBadRequest(&RequestError{Reason: ReasonInvalidField,
		Msg: "requests with trailers are not supported: send the JSON body without trailers"})
}

// route schedules the request (p nil: no body, least loaded), rewrites the
// model when the target differs, sets the destination header and lets the
// request continue, or replies with the error the decision calls for.
func (c *httpContext) route(p *Parsed, m *model, body []byte, targetModel string) types.Action {
	r := c.r
	snap := r.snapshot()
	start := r.setRequestTime()
	var req *scheduler.Request
	if p != nil {
		req = &r.req
		req.Model, req.TargetModel, req.Criticality = p.Model, targetModel, m.crit
	}
	d := r.decide(req, snap, start)
	if r.debugEnabled() {
		c.logDecision(p, req, &d)
	}
	switch d.outcome {
	case outDropped:
		c.finish(outDropped)
		sendError(429, "wasm_epp_dropped", "rate_limit_error", "capacity_exhausted",
			"every endpoint is at capacity and this request is sheddable: retry later")
		return types.ActionPause
	case outNoEndpoint:
		c.finish(outNoEndpoint)
		msg := "no model server endpoint is available"
		if d.res.Outcome == scheduler.AllStale {
			msg = "no model server endpoint has fresh metrics"
		}
		sendError(503, "wasm_epp_no_endpoint", "service_unavailable", "no_endpoint", msg)
		return types.ActionPause
	}

	if p != nil && targetModel != p.Model {
		if err := proxywasm.ReplaceHttpRequestBody(spliceModel(body, p, targetModel)); err != nil {
			return c.failInternal("cannot rewrite the request body", err)
		}
	}
	if err := proxywasm.ReplaceHttpRequestHeader(r.cfg.DestinationHeader, r.destinationOf(snap, d.res.Index)); err != nil {
		return c.failInternal("cannot set the destination header", err)
	}
	if r.cfg.ServedByHeader != "" {
		c.servedBy = d.res.Endpoint.ID.String()
	}
	c.finish(d.outcome)
	return types.ActionContinue
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

func (c *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	if c.servedBy != "" {
		_ = proxywasm.ReplaceHttpResponseHeader(c.r.cfg.ServedByHeader, c.servedBy)
	}
	return types.ActionContinue
}

func (c *httpContext) finish(o outcome) {
	c.finished = true
	c.r.count(o)
}

//go:noinline
func (c *httpContext) replyBadRequest(e *RequestError) types.Action {
	c.finish(outBadRequest)
	sendError(400, "wasm_epp_bad_request", "invalid_request_error", string(e.Reason), e.Msg)
	return types.ActionPause
}

//go:noinline
func (c *httpContext) replyTooLarge() types.Action {
	c.finish(outTooLarge)
	sendError(413, "wasm_epp_too_large", "invalid_request_error", "request_too_large",
		fmt.Sprintf("the request body is larger than %d bytes", c.r.cfg.MaxBodyBytes))
	return types.ActionPause
}

// The replies below are kept out of line (go:noinline): the request path
// of a Wasm guest pays for every byte of code it runs through, and error
// formatting inlined into it would spread its hot code over more cache
// lines.

//go:noinline
func (c *httpContext) replyUnknownModel(model string) types.Action {
	c.finish(outUnknownModel)
	// model passed ValidModelName (no control characters, bounded) and is
	// JSON-escaped in the body.
	sendError(404, "wasm_epp_unknown_model", "invalid_request_error", "model_not_found",
		fmt.Sprintf("The model %q does not exist", model))
	return types.ActionPause
}

//go:noinline
func (c *httpContext) failInternal(what string, err error) types.Action {
	return c.replyInternal(what + ": " + err.Error())
}

//go:noinline
func (c *httpContext) replyInternal(msg string) types.Action {
	c.finish(outInternal)
	proxywasm.LogErrorf("wasm-epp: %s", msg)
	sendError(500, "wasm_epp_internal_error", "server_error", "internal_error", "the gateway failed to route the request")
	return types.ActionPause
}

// debugEnabled tells whether the host logs at debug level, so the decision
// log costs nothing unless it is on. The host is asked at most once per
// logLevelRefresh of the request clock: a change of Envoy's log level (admin
// /logging) shows within that time.
func (r *router) debugEnabled() bool {
	if !r.levelKnown || r.reqMono-r.levelAt >= logLevelRefresh || r.reqMono < r.levelAt {
		lvl, err := r.logLevel()
		if err != nil {
			return false
		}
		r.level, r.levelKnown, r.levelAt = lvl, true, r.reqMono
	}
	return r.level <= proxywasm.LogLevelDebug
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
