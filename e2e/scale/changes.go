package scale

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/fleet"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// ChangeConfig is one measurement of how often replicas' metrics move:
// the fleet simulator's replicas (e2e/fleet, e2e/vllmsim) serve a
// scenario at a load under a routing policy, and at every scrape each
// simulated agent (PerNode replicas to a node) asks its send gate whether
// its state is worth pushing.
type ChangeConfig struct {
	Scenario fleet.Scenario
	// Load is the arrival rate as a fraction of the fleet's saturation.
	Load   float64
	Policy fleet.PolicySpec
	Seed   uint64
	// Warmup and Window of simulated time; only the window's scrapes count.
	Warmup, Window time.Duration
	PerNode        int
	Send           wire.SendThresholds
}

// ChangeResult is what the scrapes of the window saw.
type ChangeResult struct {
	Config ChangeConfig `json:"-"`
	Rate   float64      // requests per second offered
	// Scrapes counts endpoint scrapes; the Moved fields those where the
	// value differed from the endpoint's previous scrape at all.
	Scrapes                                            int
	MovedWaiting, MovedRunning, MovedKV, MovedAdapters int
	// BeyondThreshold counts endpoint scrapes where some value had moved
	// beyond its threshold (or the adapters changed) since the copy last
	// sent, with one gate per endpoint and no heartbeat.
	BeyondThreshold int
	// AgentScrapes counts agent scrapes (a node's PerNode replicas);
	// Sent[r] those sent for reason r, by a gate with the heartbeat.
	AgentScrapes int
	Sent         map[wire.Reason]int
}

// EndpointFraction is the share of endpoint scrapes with a value moved
// beyond its threshold since the copy last sent: the -change of a bench
// run with the same pattern of moves.
func (r *ChangeResult) EndpointFraction() float64 {
	return float64(r.BeyondThreshold) / float64(max(r.Scrapes, 1))
}

// AgentSendFraction is the share of agent scrapes that pushed, heartbeats
// included.
func (r *ChangeResult) AgentSendFraction() float64 {
	n := 0
	for why, c := range r.Sent {
		if why != wire.NotDue {
			n += c
		}
	}
	return float64(n) / float64(max(r.AgentScrapes, 1))
}

func (r *ChangeResult) String() string {
	f := func(n int) string { return fmt.Sprintf("%.3f", float64(n)/float64(max(r.Scrapes, 1))) }
	var why []string
	for _, k := range []wire.Reason{wire.Values, wire.Endpoints, wire.Heartbeat} {
		why = append(why, fmt.Sprintf("%s %.3f", k, float64(r.Sent[k])/float64(max(r.AgentScrapes, 1))))
	}
	return fmt.Sprintf("scenario %s load %.2f (%.1f req/s), %d endpoint scrapes: moved at all: waiting %s running %s kv %s adapters %s; beyond thresholds %.3f; "+
		"agents of %d: sent %.3f of scrapes (%s)",
		r.Config.Scenario.Name, r.Config.Load, r.Rate, r.Scrapes, f(r.MovedWaiting), f(r.MovedRunning), f(r.MovedKV), f(r.MovedAdapters),
		r.EndpointFraction(), r.Config.PerNode, r.AgentSendFraction(), strings.Join(why, ", "))
}

// MeasureChanges runs the simulation once and counts the moves.
func MeasureChanges(cfg ChangeConfig) (*ChangeResult, error) {
	if cfg.PerNode <= 0 {
		return nil, fmt.Errorf("scale: PerNode must be positive")
	}
	if err := cfg.Send.Validate(); err != nil {
		return nil, err
	}
	capa, err := fleet.MeasureCapacity(cfg.Scenario, cfg.Seed)
	if err != nil {
		return nil, err
	}
	res := &ChangeResult{Config: cfg, Rate: cfg.Load * capa.FleetRPS, Sent: map[wire.Reason]int{}}
	noHeartbeat := cfg.Send
	noHeartbeat.Heartbeat = wire.MaxHeartbeat
	rec := &changeRecorder{cfg: cfg, res: res, window: [2]time.Duration{cfg.Warmup, cfg.Warmup + cfg.Window}, noHeartbeat: noHeartbeat}
	inner := cfg.Policy
	spec := fleet.PolicySpec{Name: inner.Name, New: func(seed uint64, clock func() time.Time) (fleet.Policy, error) {
		p, err := inner.New(seed, clock)
		if err != nil {
			return nil, err
		}
		if _, ok := p.(fleet.Ticker); ok {
			return nil, fmt.Errorf("scale: policy %q has its own ticks; measure with a scheduler profile", inner.Name)
		}
		rec.inner = p
		return rec, nil
	}}
	_, err = fleet.Run(fleet.RunConfig{Scenario: cfg.Scenario, Policy: spec, Rate: res.Rate, Load: cfg.Load, Seed: cfg.Seed,
		Warmup: cfg.Warmup, Window: cfg.Window, ScrapeInterval: fleet.DefaultScrapeInterval})
	return res, err
}

// changeRecorder routes with the inner policy and, at every scrape, reads
// the scrape the run just wrote into the view's snapshot.
type changeRecorder struct {
	cfg         ChangeConfig
	res         *ChangeResult
	window      [2]time.Duration
	noHeartbeat wire.SendThresholds
	inner       fleet.Policy
	view        *fleet.View

	prev      []wire.EndpointState
	perEP     []*wire.SendGate // one per endpoint, no heartbeat
	perAgent  []*wire.SendGate
	eps       []wire.EndpointState
	haveFirst bool
}

func (c *changeRecorder) Route(req *scheduler.Request, v *fleet.View) (int, scheduler.Outcome) {
	c.view = v
	return c.inner.Route(req, v)
}

// Tick runs after each scrape (fleet.Ticker).
func (c *changeRecorder) Tick(at time.Duration) {
	if c.view == nil {
		return // no request routed yet: the view is not known
	}
	snap := c.view.Snapshot
	now := fleet.Epoch.Add(at)
	c.eps = c.eps[:0]
	for i := range snap.Endpoints {
		c.eps = append(c.eps, endpointOf(i, &snap.Endpoints[i]))
	}
	if !c.haveFirst {
		c.haveFirst = true
		for i := range c.eps {
			g := wire.NewSendGate(fmt.Sprintf("ep-%d", i), c.noHeartbeat)
			g.Sent(c.eps[i:i+1], now)
			c.perEP = append(c.perEP, g)
		}
		for i := 0; i < len(c.eps); i += c.cfg.PerNode {
			g := wire.NewSendGate(fmt.Sprintf("node-%05d", i/c.cfg.PerNode), c.cfg.Send)
			g.Sent(c.eps[i:min(i+c.cfg.PerNode, len(c.eps))], now)
			c.perAgent = append(c.perAgent, g)
		}
		c.prev = cloneStates(c.prev[:0], c.eps)
		return
	}
	counting := at >= c.window[0] && at < c.window[1]
	for i := range c.eps {
		e, p := &c.eps[i], &c.prev[i]
		if counting {
			c.res.Scrapes++
			c.res.MovedWaiting += b2i(e.Waiting != p.Waiting)
			c.res.MovedRunning += b2i(e.Running != p.Running)
			c.res.MovedKV += b2i(e.KVCacheUsage != p.KVCacheUsage)
			c.res.MovedAdapters += b2i(!slices.Equal(e.ActiveAdapters, p.ActiveAdapters) || !slices.Equal(e.WaitingAdapters, p.WaitingAdapters))
		}
		if why := c.perEP[i].Due(c.eps[i:i+1], now); why != wire.NotDue {
			c.perEP[i].Sent(c.eps[i:i+1], now)
			if counting {
				c.res.BeyondThreshold++
			}
		}
	}
	for k, g := range c.perAgent {
		part := c.eps[k*c.cfg.PerNode : min((k+1)*c.cfg.PerNode, len(c.eps))]
		why := g.Due(part, now)
		if why != wire.NotDue {
			g.Sent(part, now)
		}
		if counting {
			c.res.AgentScrapes++
			c.res.Sent[why]++
		}
	}
	c.prev = cloneStates(c.prev[:0], c.eps)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// endpointOf is replica i's scrape as its agent would push it.
func endpointOf(i int, e *scheduler.Endpoint) wire.EndpointState {
	m := &e.Metrics
	return wire.EndpointState{
		Namespace: "fleet", Name: e.ID.Name, Address: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Port: 8000,
		Waiting: uint32(m.WaitingQueueSize), Running: uint32(m.RunningQueueSize), KVCacheUsage: m.KVCacheUsage,
		MaxAdapters: uint32(m.MaxActiveModels), ScrapeTime: m.UpdateTime,
		ActiveAdapters: sortedCopy(m.ActiveModels), WaitingAdapters: sortedCopy(m.WaitingModels),
	}
}

func sortedCopy(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

func cloneStates(dst, src []wire.EndpointState) []wire.EndpointState {
	for _, e := range src {
		e.ActiveAdapters, e.WaitingAdapters = slices.Clone(e.ActiveAdapters), slices.Clone(e.WaitingAdapters)
		dst = append(dst, e)
	}
	return dst
}
