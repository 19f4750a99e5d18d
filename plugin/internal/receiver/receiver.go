// Package receiver is the wasm-epp plugin in its receiver role: it accepts
// metrics pushes from the per-node agents on an Envoy listener that clients
// cannot reach, and merges them into the snapshot kept in Envoy shared data,
// where every router VM with the same vm_id reads it.
//
// A push is authenticated (bearer token, compared in constant time),
// bounded, decoded strictly (scheduler/wire) and merged with a CAS retry
// loop, so concurrent pushes handled by different worker VMs never lose each
// other's agents. Nothing is written unless the whole push is valid.
package receiver

import (
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// maxMergeAttempts bounds the CAS retry loop. Each retry means another worker
// VM merged a push in between; a handful of agents cannot keep that up for
// long, so running out of attempts means something is wrong (503, retried by
// the agent next cycle).
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
	path        string
	token       []byte
	maxBytes    int
	limits      wire.Limits
	snapshotKey string
	versionKey  string
	now         func() time.Time
	counters    map[string]proxywasm.MetricCounter
	config      configRecords // config.go
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
	lim.MaxClockSkew = time.Duration(cfg.Receiver.MaxClockSkew)
	r := &Receiver{
		path:        cfg.Receiver.Path,
		token:       []byte(token),
		maxBytes:    cfg.Receiver.MaxPushBytes,
		limits:      lim,
		snapshotKey: cfg.SnapshotKey(),
		versionKey:  cfg.SnapshotVersionKey(),
		now:         time.Now,
		counters:    make(map[string]proxywasm.MetricCounter, len(outcomes)),
	}
	for _, o := range outcomes {
		r.counters[o] = proxywasm.DefineCounterMetric("wasm_epp.receiver." + o)
	}
	r.config = newConfigRecords(cfg, r.counters)
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
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
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

// apply merges one push into shared data. It returns the HTTP status, the
// outcome counter and, on failure, a message for the agent.
func (r *Receiver) apply(push []byte) (status int, outcome, msg string) {
	reset := false
	for attempt := 0; attempt < maxMergeAttempts; attempt++ {
		stored, cas, err := proxywasm.GetSharedData(r.snapshotKey)
		switch {
		case errors.Is(err, types.ErrorStatusNotFound):
			stored, cas = nil, 0
		case err != nil:
			return 500, outcomeStoreError, "cannot read shared data: " + err.Error()
		}
		if reset {
			stored = nil
		}
		merged, err := wire.MergeBytes(stored, push, r.now(), r.limits)
		switch {
		case err == nil:
		case errors.Is(err, wire.ErrStoredCorrupt) && !reset:
			// Our own state is unreadable (another build wrote it, or a
			// bug): start afresh rather than refuse every push forever.
			// The other agents' endpoints return with their next push.
			proxywasm.LogErrorf("wasm-epp receiver: stored snapshot unreadable, starting afresh: %v", err)
			r.counters[outcomeReset].Increment(1)
			reset = true
			attempt--
			continue
		case errors.Is(err, wire.ErrStaleSequence):
			return 409, outcomeStale, err.Error()
		case errors.Is(err, wire.ErrClockSkew):
			return 400, outcomeClockSkew, err.Error()
		default:
			return 400, outcomeBadRequest, err.Error()
		}
		err = proxywasm.SetSharedData(r.snapshotKey, merged, cas)
		if errors.Is(err, types.ErrorStatusCasMismatch) {
			continue // another VM merged first: merge again on top of it
		}
		if err != nil {
			return 500, outcomeStoreError, "cannot write shared data: " + err.Error()
		}
		// The version lets routers skip re-reading an unchanged snapshot.
		// Written after the snapshot: a router that sees the new version
		// also sees (at least) the new snapshot.
		if err := proxywasm.SetSharedData(r.versionKey, version(merged), 0); err != nil {
			proxywasm.LogErrorf("wasm-epp receiver: cannot write the snapshot version: %v", err)
		}
		return 204, outcomeAccepted, ""
	}
	return 503, outcomeContention, fmt.Sprintf("shared data kept changing during %d merge attempts; retry", maxMergeAttempts)
}

// version is an 8-byte token that changes whenever the stored bytes do.
func version(stored []byte) []byte {
	h := fnv.New64a()
	h.Write(stored)
	return binary.LittleEndian.AppendUint64(nil, h.Sum64())
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
