package metricsagent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// The aggregator is the agent binary in --mode aggregator: a Deployment of
// a few replicas between the node agents and the Envoy replicas. Agents
// push to every aggregator (cheap: a handful of targets instead of every
// Envoy); each aggregator keeps every agent's latest block and sends each
// Envoy one relay push per interval with the blocks that changed since
// that Envoy last accepted one (all of them every FullEvery). An Envoy
// then takes interval⁻¹ pushes a second per aggregator whatever the
// fleet's size, instead of one per agent per interval. Two aggregators
// relay the same blocks; the receiver stores a block only when its
// sequence is newer, so the second copy writes nothing, and either
// aggregator alone keeps routing fresh. When no aggregator answers, agents
// push to the Envoys themselves (FailoverTargets).

// AggregatorStore holds every agent's latest block. Safe for concurrent
// use (pushes arrive on many connections; relays are built from one
// goroutine).
type AggregatorStore struct {
	lim wire.Limits
	ttl time.Duration

	mu     sync.Mutex
	agents map[string]*heldBlock
	ids    []string // sorted, for building relays in wire order
	dec    wire.PushDecoder
}

// heldBlock is one agent's latest block and when it arrived (this
// machine's clock).
type heldBlock struct {
	block    wire.Block
	seq      uint64
	received time.Time
}

// NewAggregatorStore returns an empty store. Pushes are checked against
// lim; an agent not heard from for ttl is dropped.
func NewAggregatorStore(lim wire.Limits, ttl time.Duration) *AggregatorStore {
	return &AggregatorStore{lim: lim, ttl: ttl, agents: map[string]*heldBlock{}}
}

// Errors of AggregatorStore.Accept besides the wire format's.
var (
	// ErrRelayRefused: a relay push sent to an aggregator (relays do not
	// chain: every aggregator gets the agents' own pushes).
	ErrRelayRefused = errors.New("relay pushes are not accepted by an aggregator")
	// ErrTooManyAgents: the store holds Limits.MaxAgents agents already.
	ErrTooManyAgents = errors.New("too many agents")
)

// Accept checks one agent push (wire version 1 or 2) and keeps its block.
// now is this machine's clock. Errors are the wire format's (bad push,
// ErrClockSkew, ErrStaleSequence), ErrRelayRefused or ErrTooManyAgents.
func (s *AggregatorStore) Accept(push []byte, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.dec.Decode(push, s.lim)
	if err != nil {
		return err
	}
	if v.Kind != wire.KindAgent {
		return ErrRelayRefused
	}
	if ahead := time.Duration(v.SendTime - now.UnixNano()); ahead > s.lim.MaxClockSkew {
		return fmt.Errorf("%w: %q sent %v ahead of this aggregator's clock (limit %v)", wire.ErrClockSkew, v.Sender, ahead, s.lim.MaxClockSkew)
	}
	blk := v.Blocks[0]
	id := string(blk.AgentID())
	h, ok := s.agents[id]
	switch {
	case ok && blk.Seq() <= h.seq && now.Sub(h.received) < s.ttl:
		return fmt.Errorf("%w: agent %q sent seq %d, last accepted %d", wire.ErrStaleSequence, id, blk.Seq(), h.seq)
	case !ok:
		if len(s.agents) >= s.lim.MaxAgents {
			return fmt.Errorf("%w: %d agents held, limit %d", ErrTooManyAgents, len(s.agents), s.lim.MaxAgents)
		}
		h = &heldBlock{}
		s.agents[id] = h
		i, _ := slices.BinarySearch(s.ids, id)
		s.ids = slices.Insert(s.ids, i, id)
	}
	// The block was sent at v.SendTime on the agent's clock; its held time
	// and ages are relative to that, so received is the reference here.
	h.block = append(h.block[:0], blk...)
	h.seq, h.received = blk.Seq(), now
	return nil
}

// Agents counts the agents held.
func (s *AggregatorStore) Agents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.agents)
}

// Relay appends to dst a relay push from sender, sent at now, holding the
// block of every agent received after since (every agent when since is
// zero), each aged by the time it was held. Agents not heard from for the
// store's ttl are dropped first. It returns dst unchanged and 0 when no
// block is due.
func (s *AggregatorStore) Relay(dst []byte, sender string, now, since time.Time) ([]byte, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now)
	n := 0
	for _, id := range s.ids {
		if s.agents[id].received.After(since) {
			n++
		}
	}
	if n == 0 {
		return dst, 0
	}
	dst = wire.AppendPushV2Header(dst, wire.KindRelay, sender, now, n)
	for _, id := range s.ids {
		h := s.agents[id]
		if h.received.After(since) {
			dst = wire.AppendRelayBlock(dst, h.block, now.Sub(h.received))
		}
	}
	return dst, n
}

func (s *AggregatorStore) expire(now time.Time) {
	kept := s.ids[:0]
	for _, id := range s.ids {
		if now.Sub(s.agents[id].received) >= s.ttl {
			delete(s.agents, id)
			continue
		}
		kept = append(kept, id)
	}
	s.ids = kept
}

// AggregatorMetrics are an aggregator's own metrics.
type AggregatorMetrics struct {
	Agents      prometheus.Gauge
	Received    *prometheus.CounterVec   // outcome
	Relays      *prometheus.CounterVec   // target, outcome
	RelayBlocks *prometheus.CounterVec   // target
	RelayBytes  *prometheus.CounterVec   // target
	RelayTime   *prometheus.HistogramVec // target
}

// NewAggregatorMetrics registers the aggregator's metrics with reg.
func NewAggregatorMetrics(reg prometheus.Registerer) *AggregatorMetrics {
	ms := []float64{.0005, .001, .0025, .005, .01, .02, .04, .08, .16, .32}
	m := &AggregatorMetrics{
		Agents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasm_epp_aggregator_agents", Help: "Agents whose latest push is held (not expired).",
		}),
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_aggregator_pushes_total", Help: "Agent pushes received, by outcome (accepted, unauthorized, bad_request, stale_sequence, clock_skew, too_large, too_many_agents).",
		}, []string{"outcome"}),
		Relays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_aggregator_relays_total", Help: "Relay pushes sent to each Envoy, by outcome (ok, or the failure reason).",
		}, []string{"target", "outcome"}),
		RelayBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_aggregator_relay_blocks_total", Help: "Agent blocks relayed to each Envoy (accepted relays only).",
		}, []string{"target"}),
		RelayBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_aggregator_relay_bytes_total", Help: "Bytes of relay pushes sent to each Envoy.",
		}, []string{"target"}),
		RelayTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wasm_epp_aggregator_relay_duration_seconds", Help: "Time to send one relay push to one Envoy, failures included.", Buckets: ms,
		}, []string{"target"}),
	}
	reg.MustRegister(m.Agents, m.Received, m.Relays, m.RelayBlocks, m.RelayBytes, m.RelayTime)
	return m
}

// AggregatorHandler serves agent pushes on path: bearer token, the same
// status codes as the plugin's receiver (204, 400, 401, 405, 409, 413; 503
// when the store is full). held, when set, gives the wire.ConfigHeldHeader
// of its 204 answers ("" or nil: none), as the receiver's answers carry it.
func AggregatorHandler(store *AggregatorStore, path string, token *TokenSource, maxBytes int64, now func() time.Time, m *AggregatorMetrics, log *slog.Logger, held func() string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reply := func(status int, outcome, msg string) {
			m.Received.WithLabelValues(outcome).Inc()
			if status == http.StatusNoContent {
				if held != nil {
					if v := held(); v != "" {
						w.Header().Set(wire.ConfigHeldHeader, v)
					}
				}
				w.WriteHeader(status)
				return
			}
			log.Debug("push refused", "status", status, "outcome", outcome, "err", msg, "remote", r.RemoteAddr)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(map[string]map[string]string{"error": {"message": msg, "type": "push_error", "code": outcome}})
		}
		if r.URL.Path != path {
			reply(http.StatusNotFound, "not_found", "no such path: pushes go to "+path)
			return
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			reply(http.StatusMethodNotAllowed, "method_not_allowed", "pushes must use POST")
			return
		}
		want, err := token.Token()
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if err != nil || !ok || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="wasm-epp-push"`)
			reply(http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token")
			return
		}
		if r.ContentLength > maxBytes {
			reply(http.StatusRequestEntityTooLarge, "too_large", "push of "+strconv.FormatInt(r.ContentLength, 10)+" bytes is over the limit "+strconv.FormatInt(maxBytes, 10))
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
		if err != nil {
			reply(http.StatusBadRequest, "bad_request", "reading the push: "+err.Error())
			return
		}
		if int64(len(body)) > maxBytes {
			reply(http.StatusRequestEntityTooLarge, "too_large", "push is over the limit "+strconv.FormatInt(maxBytes, 10))
			return
		}
		err = store.Accept(body, now())
		switch {
		case err == nil:
			reply(http.StatusNoContent, "accepted", "")
		case errors.Is(err, wire.ErrStaleSequence):
			reply(http.StatusConflict, "stale_sequence", err.Error())
		case errors.Is(err, wire.ErrClockSkew):
			reply(http.StatusBadRequest, "clock_skew", err.Error())
		case errors.Is(err, ErrTooManyAgents):
			reply(http.StatusServiceUnavailable, "too_many_agents", err.Error())
		default:
			reply(http.StatusBadRequest, "bad_request", err.Error())
		}
	})
}

// Relayer sends relay pushes from a store to every Envoy target, each on
// its own goroutine: a slow or dead Envoy delays only itself, and gets
// the blocks it missed with its next accepted relay.
type Relayer struct {
	Store     *AggregatorStore
	Sender    string // this aggregator's name in the relays
	Envoys    EnvoyTargets
	Interval  time.Duration
	FullEvery time.Duration
	Client    *http.Client
	Path      string
	Timeout   time.Duration
	Token     *TokenSource
	Now       func() time.Time
	Log       *slog.Logger
	Metrics   *AggregatorMetrics
	// Held, when set, records the Envoys' answers (wire.ConfigHeldHeader).
	Held *HeldTables

	mu      sync.Mutex
	targets map[string]*relayTarget
	wg      sync.WaitGroup
}

type relayTarget struct {
	name   string
	ctx    context.Context
	cancel context.CancelFunc
	failed bool
}

// Run keeps one sender per current Envoy target until ctx ends.
func (r *Relayer) Run(ctx context.Context) {
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		r.sync(ctx, r.Envoys.Targets(ctx))
		r.Metrics.Agents.Set(float64(r.Store.Agents()))
		select {
		case <-ctx.Done():
			r.mu.Lock()
			for name, tg := range r.targets {
				tg.cancel()
				delete(r.targets, name)
			}
			r.mu.Unlock()
			r.wg.Wait()
			return
		case <-t.C:
		}
	}
}

// sync starts senders for new targets and stops those of targets gone.
func (r *Relayer) sync(ctx context.Context, names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets == nil {
		r.targets = map[string]*relayTarget{}
	}
	for name, tg := range r.targets {
		if !slices.Contains(names, name) {
			tg.cancel()
			delete(r.targets, name)
			r.Held.forget(name)
			r.Log.Info("envoy target removed", "target", name)
		}
	}
	for _, name := range names {
		if _, ok := r.targets[name]; ok {
			continue
		}
		tg := &relayTarget{name: name}
		tg.ctx, tg.cancel = context.WithCancel(ctx)
		r.targets[name] = tg
		r.wg.Add(1)
		go r.send(tg)
		r.Log.Info("envoy target added", "target", name)
	}
}

// send relays to one target every interval: the blocks received since the
// last relay it accepted, or every block every FullEvery. Agents push at
// least every heartbeat, so an Envoy that restarted or lost shared data
// has every agent back within that; the full relay is a backstop.
func (r *Relayer) send(tg *relayTarget) {
	defer r.wg.Done()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	var since, lastFull time.Time
	var buf []byte
	for {
		now := r.Now()
		from := since
		if now.Sub(lastFull) >= r.FullEvery {
			from = time.Time{}
		}
		var n int
		buf, n = r.Store.Relay(buf[:0], r.Sender, now, from)
		if n > 0 {
			start := time.Now()
			reason, err := r.post(tg, buf)
			r.Metrics.RelayTime.WithLabelValues(tg.name).Observe(time.Since(start).Seconds())
			r.Metrics.RelayBytes.WithLabelValues(tg.name).Add(float64(len(buf)))
			if err == nil {
				since = now
				if from.IsZero() {
					lastFull = now
				}
				r.Metrics.Relays.WithLabelValues(tg.name, "ok").Inc()
				r.Metrics.RelayBlocks.WithLabelValues(tg.name).Add(float64(n))
				if tg.failed {
					tg.failed = false
					r.Log.Info("relay recovered", "target", tg.name)
				}
			} else {
				r.Metrics.Relays.WithLabelValues(tg.name, reason).Inc()
				if !tg.failed {
					tg.failed = true
					r.Log.Warn("relay failing", "target", tg.name, "reason", reason, "err", err)
				}
			}
		}
		select {
		case <-tg.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Relayer) post(tg *relayTarget, payload []byte) (string, error) {
	reason, held, err := postPayload(tg.ctx, r.Client, "http://"+tg.name+r.Path, r.Token, r.Timeout, payload, nil)
	if err == nil && tg.ctx.Err() == nil {
		r.Held.set(tg.name, held)
	}
	return reason, err
}

// HeldSummary is what the agents' pushes are answered with
// (wire.ConfigHeldHeader): which model table the current Envoy targets
// hold, by their answers to the relays (HeldTables.Summary).
func (r *Relayer) HeldSummary() string {
	r.mu.Lock()
	names := make([]string, 0, len(r.targets))
	for name := range r.targets {
		names = append(names, name)
	}
	r.mu.Unlock()
	return r.Held.Summary(names)
}
