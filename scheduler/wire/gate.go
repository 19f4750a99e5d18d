package wire

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// SendThresholds say when an agent's state is worth sending again: when a
// routing-relevant value of some endpoint moved at least this far from the
// copy last sent, or when that copy is Heartbeat old. Anything else an
// endpoint carries (its set, address, port, scrape status, adapter lists,
// adapter slots) is sent whenever it changes at all.
//
// A router's view of an endpoint is then the last copy sent: within the
// thresholds of the latest scrape, and never older than Heartbeat plus a
// scrape interval and the delivery (its update time is the scrape of the
// copy sent). Keep Heartbeat well under the plugin's staleAfter (default
// 2 s): an endpoint whose agent stops sending still ages out staleAfter
// after the last copy's scrape, as before.
type SendThresholds struct {
	// Heartbeat bounds the age of the last copy sent; 0 sends every
	// scrape (no thresholds).
	Heartbeat time.Duration
	// Waiting and Running: a queue that moved by at least this many
	// requests (1: any change).
	Waiting, Running uint32
	// KVCacheUsage: KV-cache use that moved by at least this much (0..1;
	// 0: any change).
	KVCacheUsage float64
}

// DefaultSendThresholds are the agent's defaults: any queue change, two
// points of KV-cache use, and a copy at least every 500 ms (a quarter of the
// default staleAfter, so two lost heartbeats in a row still leave an
// endpoint fresh).
func DefaultSendThresholds() SendThresholds {
	return SendThresholds{Heartbeat: 500 * time.Millisecond, Waiting: 1, Running: 1, KVCacheUsage: 0.02}
}

// MaxHeartbeat bounds SendThresholds.Heartbeat: past it an endpoint would
// be stale at any sensible staleAfter between two copies.
const MaxHeartbeat = time.Minute

// Validate checks the thresholds.
func (t SendThresholds) Validate() error {
	switch {
	case t.Heartbeat < 0 || t.Heartbeat > MaxHeartbeat:
		return fmt.Errorf("heartbeat %v: want 0 (send every scrape) up to %v", t.Heartbeat, MaxHeartbeat)
	case t.Waiting == 0 || t.Running == 0:
		return fmt.Errorf("queue thresholds must be at least 1 (waiting %d, running %d): a queue moves by whole requests", t.Waiting, t.Running)
	case math.IsNaN(t.KVCacheUsage) || t.KVCacheUsage < 0 || t.KVCacheUsage > 1:
		return fmt.Errorf("KV-cache threshold %v: want 0..1", t.KVCacheUsage)
	}
	return nil
}

// SendGate decides, scrape by scrape, whether an agent sends its state
// (SendThresholds). Heartbeats fall due at slot boundaries of the
// heartbeat period, offset by the agent's segment (SegmentOf): the agents
// that share a segment send their heartbeats in the same scrape interval,
// so one segment write and one router re-read carry them all, instead of
// one of each per agent. Not safe for concurrent use.
type SendGate struct {
	t      SendThresholds
	offset time.Duration
	// last is the state last sent, lastSlot its heartbeat slot.
	last     []EndpointState
	adapters []string // backing array of last's adapter lists
	lastSlot int64
	sent     bool
	forced   bool
}

// NewSendGate returns a gate for agent agentID; t must be valid.
func NewSendGate(agentID string, t SendThresholds) *SendGate {
	g := &SendGate{t: t}
	if t.Heartbeat > 0 {
		g.offset = time.Duration(int64(t.Heartbeat) / NumSegments * int64(SegmentOf([]byte(agentID))))
	}
	return g
}

// Reason says why a state is sent.
type Reason uint8

// Reasons, from Due.
const (
	NotDue    Reason = iota
	First            // nothing sent yet
	Always           // no thresholds (Heartbeat 0)
	Heartbeat        // the last copy's heartbeat slot passed
	Endpoints        // the set, an address, port, status or adapters changed
	Values           // a value moved beyond its threshold
	Forced           // the caller asked (Force)
)

func (r Reason) String() string {
	return [...]string{"not_due", "first", "always", "heartbeat", "endpoints", "values", "forced"}[r]
}

func (g *SendGate) slot(now time.Time) int64 {
	return (now.UnixNano() - int64(g.offset)) / int64(g.t.Heartbeat)
}

// Due reports whether eps (in wire order), scraped by now, should be sent.
func (g *SendGate) Due(eps []EndpointState, now time.Time) Reason {
	switch {
	case !g.sent:
		return First
	case g.forced:
		return Forced
	case g.t.Heartbeat == 0:
		return Always
	case g.slot(now) != g.lastSlot:
		return Heartbeat
	case len(eps) != len(g.last):
		return Endpoints
	}
	reason := NotDue
	for i := range eps {
		e, l := &eps[i], &g.last[i]
		if e.Namespace != l.Namespace || e.Name != l.Name || e.Address != l.Address || e.Port != l.Port ||
			e.LastError != l.LastError || e.MaxAdapters != l.MaxAdapters ||
			!slices.Equal(e.ActiveAdapters, l.ActiveAdapters) || !slices.Equal(e.WaitingAdapters, l.WaitingAdapters) {
			return Endpoints
		}
		if reason == NotDue && (moved(e.Waiting, l.Waiting, g.t.Waiting) || moved(e.Running, l.Running, g.t.Running) ||
			math.Abs(e.KVCacheUsage-l.KVCacheUsage) >= g.t.KVCacheUsage && e.KVCacheUsage != l.KVCacheUsage) {
			reason = Values
		}
	}
	return reason
}

func moved(a, b, by uint32) bool {
	if a > b {
		return a-b >= by
	}
	return b-a >= by
}

// Sent records that eps were sent at now: later states are compared with
// this copy.
func (g *SendGate) Sent(eps []EndpointState, now time.Time) {
	g.sent, g.forced = true, false
	if g.t.Heartbeat > 0 {
		g.lastSlot = g.slot(now)
	}
	g.adapters = g.adapters[:0]
	n := 0
	for i := range eps {
		n += len(eps[i].ActiveAdapters) + len(eps[i].WaitingAdapters)
	}
	if cap(g.adapters) < n {
		g.adapters = make([]string, 0, n)
	}
	g.last = append(g.last[:0], eps...)
	for i := range g.last {
		e := &g.last[i]
		e.ActiveAdapters = g.keep(e.ActiveAdapters)
		e.WaitingAdapters = g.keep(e.WaitingAdapters)
	}
}

// keep copies an adapter list into the gate's own backing array (the
// caller's lists may be rewritten in place).
func (g *SendGate) keep(list []string) []string {
	start := len(g.adapters)
	g.adapters = append(g.adapters, list...)
	return g.adapters[start:len(g.adapters):len(g.adapters)]
}

// Force makes Due report Forced until the next Sent: the next state is
// sent whatever it holds (a push failed, or the targets changed).
func (g *SendGate) Force() { g.forced = true }
