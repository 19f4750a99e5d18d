// Package receiver is the wasm-epp plugin in its receiver role: it accepts
// metrics pushes from the per-node agents (or from aggregators relaying
// them) on an Envoy listener that clients cannot reach, and writes them
// into Envoy shared data, where every router VM with the same vm_id reads
// them.
//
// A push is authenticated (bearer token, compared in constant time),
// bounded and checked strictly, then each agent's block is merged into its
// segment and the directory updated, each with a CAS retry loop
// (scheduler/wire.Writer), so concurrent pushes handled by different worker
// VMs never lose each other's agents. Nothing is written unless the whole
// push is valid.
package receiver

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/plugin/internal/vmmem"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// maxMergeAttempts bounds the CAS retry loop of configuration records
// (config.go); metrics pushes have scheduler/wire.Writer's.
const maxMergeAttempts = 16

// Outcomes, one counter each (metric wasm_epp.receiver.<outcome>).
const (
	outcomeAccepted     = "accepted"
	outcomeUnauthorized = "unauthorized"
	outcomeTooLarge     = "too_large"
	outcomeBadRequest   = "bad_request"
	outcomeStale        = "stale_sequence"
	outcomeNotFound     = "not_found"
	outcomeMethod       = "method_not_allowed"
	outcomeContention   = "contention"
	outcomeStoreError   = "store_error"
	outcomeReset        = "stored_reset"
	outcomeClockSkew    = "clock_skew"
)

var outcomes = []string{outcomeAccepted, outcomeUnauthorized, outcomeTooLarge, outcomeBadRequest,
	outcomeStale, outcomeNotFound, outcomeMethod, outcomeContention, outcomeStoreError, outcomeReset, outcomeClockSkew}

// Receiver holds what one plugin context in the receiver role needs. It is
// used from one VM thread only, like everything in a Proxy-Wasm VM.
type Receiver struct {
	path     string
	token    []byte
	maxBytes int
	writer   *wire.Writer
	now      func() time.Time
	// mono reads the clock that times Apply (apply_us).
	mono     func() time.Time
	counters map[string]proxywasm.MetricCounter
	blocks   struct{ accepted, stale, swept, retries proxywasm.MetricCounter }
	applyUs  proxywasm.MetricHistogram
	// bodyBuf holds the push being applied (bounded by the body limits).
	bodyBuf []byte
	// configUs times configuration records (config_apply_us).
	configUs proxywasm.MetricHistogram
	config   configRecords // config.go
}

// New builds a receiver from a decoded configuration and the push token.
// An empty token is refused: an unauthenticated receiver would let anyone
// who reaches the listener steer all traffic.
func New(cfg *config.Config, token string) (*Receiver, error) {
	if token == "" {
		return nil, fmt.Errorf("receiver: the push token is empty: set the VM environment variable %s (vm_config.environment_variables)", cfg.Receiver.TokenEnv)
	}
	lim := wire.DefaultLimits()
	lim.MaxPushBytes = cfg.Receiver.MaxPushBytes
	lim.MaxEndpoints = cfg.Receiver.MaxEndpoints
	lim.MaxAgents = cfg.Receiver.MaxAgents
	lim.MaxTotalEndpoints = cfg.Receiver.MaxTotalEndpoints
	lim.MaxClockSkew = time.Duration(cfg.Receiver.MaxClockSkew)
	r := &Receiver{
		path:     cfg.Receiver.Path,
		token:    []byte(token),
		maxBytes: cfg.Receiver.MaxPushBytes,
		// An agent that stopped pushing is dropped once its endpoints are
		// stale: routers would not schedule on them anyway.
		writer:   wire.NewWriter(wire.NewKeys(cfg.SharedDataKeyPrefix), lim, time.Duration(cfg.StaleAfter)),
		now:      time.Now,
		mono:     time.Now,
		counters: make(map[string]proxywasm.MetricCounter, len(outcomes)),
	}
	// Create every missing key now (only if still absent, so a VM that
	// starts late wipes nothing): routers then find a directory at once.
	if err := r.writer.Init(shareddata.Store{}); err != nil {
		return nil, fmt.Errorf("receiver: cannot create the shared-data keys: %w", err)
	}
	for _, o := range outcomes {
		r.counters[o] = proxywasm.DefineCounterMetric("wasm_epp.receiver." + o)
	}
	r.config = newConfigRecords(cfg, r.counters)
	r.blocks.accepted = proxywasm.DefineCounterMetric("wasm_epp.receiver.blocks_accepted")
	r.blocks.stale = proxywasm.DefineCounterMetric("wasm_epp.receiver.blocks_not_newer")
	r.blocks.swept = proxywasm.DefineCounterMetric("wasm_epp.receiver.blocks_expired")
	r.blocks.retries = proxywasm.DefineCounterMetric("wasm_epp.receiver.cas_retries")
	r.applyUs = proxywasm.DefineHistogramMetric("wasm_epp.receiver.apply_us")
	r.configUs = proxywasm.DefineHistogramMetric("wasm_epp.receiver.config_apply_us")
	vmmem.Define()
	return r, nil
}

// SetClock replaces the clock used to stamp accepted pushes (tests).
func (r *Receiver) SetClock(now func() time.Time) { r.now = now }

// NewHttpContext returns the per-request handler.
func (r *Receiver) NewHttpContext(contextID uint32) types.HttpContext {
	return &pushContext{r: r}
}

type pushContext struct {
	types.DefaultHttpContext
	r *Receiver
	// replied is set once a local reply was sent: later callbacks only
	// drain, they never answer twice.
	replied bool
	// config: the request is a configuration record (config.go).
	config bool
}

var _ types.HttpContext = (*pushContext)(nil)

func (c *pushContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	path, _ := proxywasm.GetHttpRequestHeader(":path")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	c.config = path == c.r.config.path
	if path != c.r.path && !c.config {
		return c.reply(404, outcomeNotFound, "not_found", "no such path on the push listener: pushes go to "+c.r.path)
	}
	if method, _ := proxywasm.GetHttpRequestHeader(":method"); method != "POST" {
		return c.reply(405, outcomeMethod, "method_not_allowed", "pushes must use POST", [2]string{"allow", "POST"})
	}
	if !c.r.authorized() {
		return c.reply(401, outcomeUnauthorized, "unauthorized", "missing or wrong bearer token",
			[2]string{"www-authenticate", `Bearer realm="wasm-epp-push"`})
	}
	if cl, err := proxywasm.GetHttpRequestHeader("content-length"); err == nil && cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > int64(c.maxBytes()) {
			return c.reply(413, outcomeTooLarge, "too_large", fmt.Sprintf("push of %d bytes is over the %d-byte limit", n, c.maxBytes()))
		}
	}
	if endOfStream {
		return c.reply(400, outcomeBadRequest, "bad_request", "empty push")
	}
	return types.ActionPause
}

func (c *pushContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if c.replied {
		return types.ActionPause
	}
	if bodySize > c.maxBytes() {
		return c.reply(413, outcomeTooLarge, "too_large", fmt.Sprintf("push is over the %d-byte limit", c.maxBytes()))
	}
	if !endOfStream {
		return types.ActionPause // buffer until the whole push is here
	}
	// Into a buffer kept between pushes: a relay push of a few thousand
	// agents is a megabyte, and a buffer per push was garbage the guest's
	// collector did not keep up with (Wasm memory never shrinks).
	body, err := proxywasm.GetHttpRequestBodyInto(c.r.bodyBuf[:0], 0, bodySize)
	if cap(body) > cap(c.r.bodyBuf) {
		c.r.bodyBuf = body[:0]
	}
	if err != nil {
		return c.reply(500, outcomeStoreError, "internal", "cannot read the push body: "+err.Error())
	}
	if len(body) == 0 {
		return c.reply(400, outcomeBadRequest, "bad_request", "empty push")
	}
	apply := c.r.apply
	if c.config {
		apply = c.r.applyConfig
	}
	status, outcome, msg := apply(body)
	if status == 204 {
		if !c.config {
			if held := c.r.heldConfig(); held != "" {
				return c.reply(204, outcome, "", "", [2]string{wire.ConfigHeldHeader, held})
			}
		}
		return c.reply(204, outcome, "", "")
	}
	return c.reply(status, outcome, outcome, msg)
}

// authorized checks the Authorization header in constant time.
func (r *Receiver) authorized() bool {
	h, err := proxywasm.GetHttpRequestHeader("authorization")
	if err != nil {
		return false
	}
	const prefix = "Bearer "
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h[len(prefix):]), r.token) == 1
}

// apply writes one push into shared data. It returns the HTTP status, the
// outcome counter and, on failure, a message for the pusher.
func (r *Receiver) apply(push []byte) (status int, outcome, msg string) {
	start := r.mono()
	vmmem.Maybe()
	stats, err := r.writer.Apply(shareddata.Store{}, push, r.now())
	r.applyUs.Record(uint64(r.mono().Sub(start) / time.Microsecond))
	count := func(c proxywasm.MetricCounter, n int) {
		if n > 0 {
			c.Increment(uint64(n))
		}
	}
	count(r.blocks.accepted, stats.Accepted)
	count(r.blocks.stale, stats.Stale)
	count(r.blocks.swept, stats.Swept)
	count(r.blocks.retries, stats.Retries)
	count(r.counters[outcomeReset], stats.Reset)
	if stats.Reset > 0 {
		proxywasm.LogErrorf("wasm-epp receiver: %d stored values were unreadable and were replaced (another build, or a bug); their agents return with their next push", stats.Reset)
	}
	switch {
	case err == nil:
		return 204, outcomeAccepted, ""
	case errors.Is(err, wire.ErrStaleSequence):
		return 409, outcomeStale, err.Error()
	case errors.Is(err, wire.ErrClockSkew):
		return 400, outcomeClockSkew, err.Error()
	case errors.Is(err, wire.ErrContention):
		return 503, outcomeContention, err.Error()
	case isWireError(err):
		return 400, outcomeBadRequest, err.Error()
	}
	return 500, outcomeStoreError, "cannot use shared data: " + err.Error()
}

// isWireError reports whether err is about the push itself (as opposed to
// shared data).
func isWireError(err error) bool {
	var we *wire.Error
	return errors.As(err, &we)
}

// reply sends a local response (JSON error body unless status is 204) and
// counts the outcome.
func (c *pushContext) reply(status int, outcome, code, msg string, extra ...[2]string) types.Action {
	c.replied = true
	c.r.counters[outcome].Increment(1)
	var body []byte
	headers := extra
	if status != 204 {
		body = errorBody(msg, code)
		headers = append(headers, [2]string{"content-type", "application/json"})
		proxywasm.LogWarnf("wasm-epp receiver: push rejected with %d: %s", status, msg)
	}
	if err := proxywasm.SendHttpResponse(uint32(status), headers, body, -1); err != nil {
		proxywasm.LogErrorf("wasm-epp receiver: cannot send the reply: %v", err)
	}
	return types.ActionPause
}

// errorBody renders {"error":{"message":…,"type":"push_error","code":…}}.
func errorBody(msg, code string) []byte {
	b, _ := json.Marshal(map[string]map[string]string{
		"error": {"message": msg, "type": "push_error", "code": code},
	})
	return b
}
