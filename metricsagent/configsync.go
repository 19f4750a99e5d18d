package metricsagent

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// ConfigSync turns the pool's Kubernetes objects into what the agent acts
// on: the InferencePool's selector and target ports for discovery
// (PoolSource), and the model table, encoded as the configuration record
// every Envoy gets (Payload). It rebuilds both whenever the objects change,
// reports every rejected object and conflict in the log and the metrics,
// and hands the verdicts to the status writer.
type ConfigSync struct {
	src                     ObjectSource
	poolNamespace, poolName string
	agentID                 string
	limits                  wire.ConfigLimits
	log                     *slog.Logger
	metrics                 *Metrics
	status                  *StatusWriter // nil: conditions are not written

	payload atomic.Pointer[[]byte]
	pool    atomic.Pointer[InferencePool]

	// mu serializes rebuilds (Run's, and callers' of Rebuild); it guards
	// the fields below.
	mu          sync.Mutex
	last        map[string]Verdict // by ID
	lastPoolErr string
	lastPoolRV  string
	lastTable   *wire.ModelTable
}

// ConfigSyncOptions configure a ConfigSync; Status may be nil.
type ConfigSyncOptions struct {
	Source                  ObjectSource
	PoolNamespace, PoolName string
	AgentID                 string
	Limits                  wire.ConfigLimits
	Log                     *slog.Logger
	Metrics                 *Metrics
	Status                  *StatusWriter
}

// NewConfigSync builds a ConfigSync and builds a first table if the source
// has listed everything already.
func NewConfigSync(o ConfigSyncOptions) *ConfigSync {
	c := &ConfigSync{src: o.Source, poolNamespace: o.PoolNamespace, poolName: o.PoolName, agentID: o.AgentID,
		limits: o.Limits.Resolved(), log: o.Log, metrics: o.Metrics, status: o.Status, last: map[string]Verdict{}}
	c.Rebuild()
	return c
}

// rebuildEvery bounds the time between two rebuilds without a change, so
// a status write that failed is retried.
const rebuildEvery = time.Minute

// Run rebuilds after every change, and every rebuildEvery, until ctx ends.
func (c *ConfigSync) Run(ctx context.Context) {
	t := time.NewTicker(rebuildEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.src.Changed():
		case <-t.C:
		}
		c.Rebuild()
	}
}

// Pool is the pool's latest accepted spec (nil before one, or once the pool
// is deleted). A pool edited into something invalid is reported and the
// previous spec kept, as a failed scrape keeps the last good values.
func (c *ConfigSync) Pool() *InferencePool { return c.pool.Load() }

// Payload is the latest encoded configuration record; nil until every
// resource has been listed once (a table from a partial view would drop
// objects the agent has not read yet).
func (c *ConfigSync) Payload() []byte {
	if p := c.payload.Load(); p != nil {
		return *p
	}
	return nil
}

// Rebuild reads the source and rebuilds pool and table (Run calls it).
func (c *ConfigSync) Rebuild() {
	c.mu.Lock()
	defer c.mu.Unlock()
	pools, objectives, rewrites, rev, synced := c.src.Snapshot()
	if !synced {
		return
	}
	names := c.updatePool(pools)
	res := BuildTable(TableInput{PoolNamespace: c.poolNamespace, PoolName: c.poolName, Pools: names,
		Objectives: objectives, Rewrites: rewrites}, c.limits)
	c.report(res)
	rec := &wire.ConfigRecord{AgentID: c.agentID, PoolNamespace: c.poolNamespace, PoolName: c.poolName, Revision: rev, Table: res.Table}
	payload, err := wire.EncodeConfig(rec, c.limits)
	if err != nil {
		// BuildTable keeps within the limits; this would be a bug.
		c.log.Error("cannot encode the model table; the previous one stays", "err", err)
		return
	}
	if c.lastTable == nil || !tablesEqual(c.lastTable, &res.Table) {
		c.log.Info("model table built", "pool", c.poolNamespace+"/"+c.poolName, "revision", rev.String(),
			"rewritten_models", len(res.Table.Rewrites), "default_rule", len(res.Table.Default) > 0,
			"objectives", len(res.Table.Objectives), "bytes", len(payload))
		c.lastTable = &res.Table
	}
	m := c.metrics
	m.ConfigTableEntries.WithLabelValues("rewritten_models").Set(float64(len(res.Table.Rewrites)))
	m.ConfigTableEntries.WithLabelValues("objectives").Set(float64(len(res.Table.Objectives)))
	m.ConfigPayloadBytes.Set(float64(len(payload)))
	m.ConfigBuilds.Inc()
	if old := c.payload.Load(); old == nil || !bytes.Equal(*old, payload) {
		c.payload.Store(&payload) // a new slice only for new bytes: ConfigPublisher compares pointers
	}
	if c.status != nil {
		c.status.Submit(res.Verdicts)
	}
}

func tablesEqual(a, b *wire.ModelTable) bool {
	return slices.EqualFunc(a.Rewrites, b.Rewrites, func(x, y wire.ModelRewrite) bool {
		return x.Model == y.Model && slices.Equal(x.Targets, y.Targets)
	}) && slices.Equal(a.Default, b.Default) && slices.Equal(a.Objectives, b.Objectives)
}

// updatePool decodes the pool, keeps it when valid, reports it when not,
// and returns the names of every pool of the namespace.
func (c *ConfigSync) updatePool(pools [][]byte) []string {
	var names []string
	var ours []byte
	for _, js := range pools {
		meta, _ := peek(js)
		if meta.Namespace != c.poolNamespace {
			continue
		}
		names = append(names, meta.Name)
		if meta.Name == c.poolName {
			ours = js
		}
	}
	slices.Sort(names)
	id := KindInferencePool + " " + c.poolNamespace + "/" + c.poolName
	rejected := c.metrics.ConfigRejected
	if ours == nil {
		if c.pool.Swap(nil) != nil || c.lastPoolErr == "" {
			c.log.Warn("the InferencePool does not exist: no pods are discovered and objectives and rewrites naming it are rejected", "pool", id)
		}
		c.lastPoolErr, c.lastPoolRV = "absent", ""
		rejected.DeletePartialMatch(map[string]string{"kind": KindInferencePool})
		rejected.WithLabelValues(KindInferencePool, c.poolNamespace, c.poolName, "NotFound").Set(1)
		return names
	}
	p, err := DecodeInferencePool(ours)
	if err != nil {
		if msg := err.Error(); msg != c.lastPoolErr {
			c.lastPoolErr = msg
			kept := "no pods are discovered until it is fixed"
			if c.pool.Load() != nil {
				kept = "the previous spec stays in use"
			}
			c.log.Warn("InferencePool rejected; "+kept, "pool", id, "err", msg)
		}
		reason := ReasonInvalidSpec
		if oe, ok := err.(*ObjectError); ok {
			reason = oe.Reason
		}
		rejected.DeletePartialMatch(map[string]string{"kind": KindInferencePool})
		rejected.WithLabelValues(KindInferencePool, c.poolNamespace, c.poolName, reason).Set(1)
		return names
	}
	if c.lastPoolErr != "" || p.ResourceVersion != c.lastPoolRV {
		c.log.Info("InferencePool accepted", "pool", id, "selector", p.Spec.Selector.MatchLabels, "target_ports", p.Ports())
	}
	c.lastPoolErr, c.lastPoolRV = "", p.ResourceVersion
	rejected.DeletePartialMatch(map[string]string{"kind": KindInferencePool})
	c.pool.Store(p)
	return names
}

// report logs what changed in the verdicts and sets the metrics.
func (c *ConfigSync) report(res TableResult) {
	m := c.metrics
	now := make(map[string]Verdict, len(res.Verdicts))
	counts := map[[2]string]int{}
	for _, v := range res.Verdicts {
		now[v.ID()] = v
		state := "accepted"
		if !v.Accepted {
			state = "rejected"
		}
		counts[[2]string{v.Kind, state}]++
		prev, seen := c.last[v.ID()]
		if seen && prev.Accepted == v.Accepted && prev.Reason == v.Reason && prev.Message == v.Message {
			continue
		}
		switch {
		case !v.Accepted:
			c.log.Warn("object rejected", "kind", v.Kind, "namespace", v.Namespace, "name", v.Name, "reason", v.Reason, "err", v.Message)
		case len(v.Conflicts) > 0:
			c.log.Warn("object accepted with conflicts", "kind", v.Kind, "namespace", v.Namespace, "name", v.Name, "conflicts", v.Conflicts)
		default:
			c.log.Info("object accepted", "kind", v.Kind, "namespace", v.Namespace, "name", v.Name, "detail", v.Message)
		}
		if len(v.Conflicts) > 0 {
			m.ConfigConflicts.WithLabelValues(v.Kind).Add(float64(len(v.Conflicts)))
		}
	}
	for id, v := range c.last {
		if _, ok := now[id]; !ok {
			c.log.Info("object gone from the table's view", "kind", v.Kind, "namespace", v.Namespace, "name", v.Name)
		}
	}
	c.last = now
	for _, kind := range []string{KindInferenceObjective, KindInferenceModelRewrite} {
		for _, state := range []string{"accepted", "rejected"} {
			m.ConfigObjects.WithLabelValues(kind, state).Set(float64(counts[[2]string{kind, state}]))
		}
		m.ConfigRejected.DeletePartialMatch(map[string]string{"kind": kind})
	}
	for _, v := range res.Verdicts {
		if !v.Accepted {
			m.ConfigRejected.WithLabelValues(v.Kind, v.Namespace, v.Name, v.Reason).Set(1)
		}
	}
}

// ConfigPublisher hands the latest configuration record to its own Pusher
// on each agent cycle, to each Envoy target that needs it: a new target;
// every target when the record changed; a target whose answers to the
// metrics pushes (Held, wire.ConfigHeldHeader) name another table than
// this record's (an Envoy that restarted says "none"), once per answer it
// gave; and a target that gives no answer (an older receiver) every
// Resend. A target that keeps naming another table after it got the
// record (it holds a newer one and answered 409) gets it again every
// Refresh. In relay mode the metrics go to aggregators, whose answers sum
// up their Envoys' (Via): an Envoy that has no answer of its own is taken
// to hold what they say.
type ConfigPublisher struct {
	Payload func() []byte
	Pusher  *Pusher
	// Held holds the metrics targets' answers (nil: none, Resend only).
	Held *HeldTables
	// Via, when set, are the aggregators whose answers stand for every
	// Envoy that has none of its own.
	Via     EnvoyTargets
	Resend  time.Duration
	Refresh time.Duration

	last    []byte
	mine    string
	targets map[string]*configTarget
	send    []string
}

// configTarget is what was last handed to one target.
type configTarget struct {
	payload []byte
	at      time.Time
	// under is the target's answer when it was handed over.
	under string
}

// Publish is called once per cycle with the cycle's Envoy targets.
func (p *ConfigPublisher) Publish(ctx context.Context, targets []string, now time.Time) {
	payload := p.Payload()
	if payload == nil {
		return
	}
	if len(payload) != len(p.last) || len(payload) > 0 && &payload[0] != &p.last[0] {
		p.last, p.mine = payload, ""
		if h, err := wire.PeekConfig(payload, wire.ConfigLimits{MaxBytes: len(payload)}); err == nil {
			p.mine = h.Held()
		}
	}
	if p.targets == nil {
		p.targets = map[string]*configTarget{}
	}
	for t := range p.targets {
		if !slices.Contains(targets, t) {
			delete(p.targets, t)
		}
	}
	via := ""
	viaOK := false
	if p.Via != nil {
		via = p.Held.Summary(p.Via.Targets(ctx))
		viaOK = via != ""
	}
	p.send = p.send[:0]
	for _, t := range targets {
		held, ok := p.Held.Get(t)
		if !ok && viaOK {
			held, ok = via, true
		}
		st := p.targets[t]
		var due bool
		switch {
		case st == nil || len(st.payload) != len(payload) || len(payload) > 0 && &st.payload[0] != &payload[0]:
			due = true // new target, or a new record
		case !ok:
			due = now.Sub(st.at) >= p.Resend // the target does not say what it holds
		case held == p.mine:
			st.under = held
		case held != st.under:
			due = true // it holds another table than when it last got ours
		default:
			due = now.Sub(st.at) >= p.Refresh
		}
		if due {
			p.targets[t] = &configTarget{payload: payload, at: now, under: held}
			p.send = append(p.send, t)
		}
	}
	if len(p.send) > 0 {
		p.Pusher.PublishTo(targets, payload, func(t string) bool { return slices.Contains(p.send, t) })
	} else {
		p.Pusher.PublishTo(targets, payload, func(string) bool { return false })
	}
	p.Pusher.RetryFailing()
}
