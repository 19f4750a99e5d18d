package scale

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// PushStats counts what pushers sent and what they were answered.
type PushStats struct {
	Sent   atomic.Int64
	Bytes  atomic.Int64
	Errors atomic.Int64 // transport errors
	Blocks atomic.Int64 // agent blocks relayed (relay mode)
	// held is the latest 2xx answer's wire.ConfigHeldHeader ("" or nil:
	// none): which model table the gateway says it holds.
	held    atomic.Pointer[string]
	mu      sync.Mutex
	statuse map[int]int64
}

func (s *PushStats) status(code int) {
	s.mu.Lock()
	if s.statuse == nil {
		s.statuse = map[int]int64{}
	}
	s.statuse[code]++
	s.mu.Unlock()
}

// Statuses returns the answers by HTTP status.
func (s *PushStats) Statuses() map[int]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]int64, len(s.statuse))
	for k, v := range s.statuse {
		out[k] = v
	}
	return out
}

// ProbeEvent says the probe agent started reporting adapter Adapter with a
// push sent at Sent.
type ProbeEvent struct {
	Adapter string
	Sent    time.Time
}

// poster sends pushes over kept-alive connections.
type poster struct {
	client *http.Client
	token  string
	stats  *PushStats
}

func newPoster(token string, conns int, stats *PushStats) *poster {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     time.Minute,
	}
	return &poster{client: &http.Client{Transport: tr, Timeout: 2 * time.Second}, token: token, stats: stats}
}

func (p *poster) post(ctx context.Context, url string, body []byte) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		p.stats.Errors.Add(1)
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	req.Header.Set("Content-Type", wire.ContentType)
	p.stats.Sent.Add(1)
	p.stats.Bytes.Add(int64(len(body)))
	resp, err := p.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			p.stats.Errors.Add(1)
		}
		return 0
	}
	var sink [512]byte
	for {
		if _, err := resp.Body.Read(sink[:]); err != nil {
			break
		}
	}
	resp.Body.Close()
	p.stats.status(resp.StatusCode)
	if resp.StatusCode/100 == 2 {
		held := resp.Header.Get(wire.ConfigHeldHeader)
		p.stats.held.Store(&held)
	}
	return resp.StatusCode
}

func (p *poster) close() { p.client.CloseIdleConnections() }

// DirectOptions configure agents pushing on their own, each at its own
// phase of the interval, to every URL (Envoy receivers, or aggregators).
type DirectOptions struct {
	URLs     []string
	Token    string
	Interval time.Duration
	// Version is the wire version the agents speak (1 or 2).
	Version int
	// Change is the fraction of endpoints whose values move each scrape.
	Change float64
	// Send is when an agent pushes (the agent's --heartbeat and --send-*
	// flags); the zero value pushes every scrape.
	Send wire.SendThresholds
	// Probe receives the probe agent's adapter changes (may be nil).
	Probe chan<- ProbeEvent
	Stats *PushStats
}

// gate is agent a's send gate under t (nil: every scrape is sent).
func gate(a *Agent, t wire.SendThresholds) *wire.SendGate {
	if t.Heartbeat <= 0 {
		return nil
	}
	return wire.NewSendGate(a.ID, t)
}

// RunDirect runs every agent of f until ctx ends.
func RunDirect(ctx context.Context, f *Fleet, o DirectOptions) {
	p := newPoster(o.Token, max(8, len(f.Agents)/4), o.Stats)
	defer p.close()
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(uint64(len(f.Agents)), 7))
	for _, a := range f.Agents {
		phase := time.Duration(rng.Int64N(int64(o.Interval)))
		wg.Add(1)
		go func(a *Agent) {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-time.After(phase):
			}
			t := time.NewTicker(o.Interval)
			defer t.Stop()
			var buf []byte
			lastAdapter := ""
			g := gate(a, o.Send)
			for {
				now := time.Now()
				a.Step(now, o.Change)
				if g != nil {
					if g.Due(a.Eps, now) == wire.NotDue {
						select {
						case <-ctx.Done():
							return
						case <-t.C:
						}
						continue
					}
					g.Sent(a.Eps, now)
				}
				var err error
				if buf, err = a.Push(buf[:0], o.Version, now); err != nil {
					panic(err) // the fleet only holds valid states
				}
				if a == f.Probe && o.Probe != nil && a.ProbeAdapter() != lastAdapter {
					lastAdapter = a.ProbeAdapter()
					select {
					case o.Probe <- ProbeEvent{Adapter: lastAdapter, Sent: now}:
					default:
					}
				}
				for _, u := range o.URLs {
					p.post(ctx, u, buf)
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}(a)
	}
	wg.Wait()
}

// RelayOptions configure the in-process stand-in for the aggregator tier:
// every RelayInterval it sends each URL one relay push holding the latest
// block of every agent that pushed since the previous one, as a healthy
// aggregator does (each agent scrapes every Interval at its own phase; its
// block's held time and ages say how long ago).
type RelayOptions struct {
	URLs     []string
	Token    string
	Interval time.Duration
	// RelayInterval is the time between two relays (the aggregator's
	// --relay-interval; 0: Interval). Longer than Interval, a relay
	// carries each agent's latest block of the scrapes in between.
	RelayInterval time.Duration
	Change        float64
	// Send is when an agent pushes (as DirectOptions.Send); FullEvery how
	// often the relay carries every agent's latest block again (the
	// aggregator's --relay-full-every; 0: every relay). In between, a relay
	// carries the blocks agents sent since the previous one, as the
	// aggregator does.
	Send      wire.SendThresholds
	FullEvery time.Duration
	Probe     chan<- ProbeEvent
	Stats     *PushStats
	// Sender names the relay.
	Sender string
}

// RunRelay sends relay pushes until ctx ends.
func RunRelay(ctx context.Context, f *Fleet, o RelayOptions) {
	p := newPoster(o.Token, 2*len(o.URLs), o.Stats)
	defer p.close()
	if o.Sender == "" {
		o.Sender = "relay-0"
	}
	rng := rand.New(rand.NewPCG(uint64(len(f.Agents)), 9))
	type agentClock struct {
		a       *Agent
		gate    *wire.SendGate
		phase   time.Duration
		block   []byte    // the agent's latest push (version 2)
		sent    time.Time // when it was sent
		scraped time.Time // the agent's latest scrape
	}
	relayEvery := o.RelayInterval
	if relayEvery <= 0 {
		relayEvery = o.Interval
	}
	clocks := make([]agentClock, len(f.Agents))
	for i, a := range f.Agents {
		clocks[i] = agentClock{a: a, gate: gate(a, o.Send), phase: time.Duration(rng.Int64N(int64(o.Interval)))}
	}
	var lastRelay, lastFull time.Time
	slices.SortFunc(clocks, func(x, y agentClock) int { return compareStrings(x.a.ID, y.a.ID) })
	epoch0 := time.Now()
	t := time.NewTicker(relayEvery)
	defer t.Stop()
	var dec wire.PushDecoder
	var out []byte
	lastAdapter := ""
	// scrape is one scrape of agent c at at, and its push when its gate
	// lets it go (the aggregator keeps the latest).
	scrape := func(c *agentClock, at time.Time) {
		c.scraped = at
		c.a.Step(at, o.Change)
		if c.gate != nil {
			if c.block != nil && c.gate.Due(c.a.Eps, at) == wire.NotDue {
				return
			}
			c.gate.Sent(c.a.Eps, at)
		}
		b, err := c.a.Push(c.block[:0], 2, at)
		if err != nil {
			panic(err)
		}
		c.block, c.sent = b, at
		if c.a == f.Probe && o.Probe != nil && c.a.ProbeAdapter() != lastAdapter {
			lastAdapter = c.a.ProbeAdapter()
			select {
			case o.Probe <- ProbeEvent{Adapter: lastAdapter, Sent: at}:
			default:
			}
		}
	}
	for {
		now := time.Now()
		// Each agent scraped (and pushed) at its phase of every interval
		// since the previous relay.
		since := now.Sub(epoch0)
		for i := range clocks {
			c := &clocks[i]
			if since < c.phase {
				if c.scraped.IsZero() {
					scrape(c, now) // its first scrape, before its phase comes
				}
				continue
			}
			latest := (since - c.phase) / o.Interval
			k := latest - relayEvery/o.Interval - 1 // at most the scrapes of one relay interval
			for ; k <= latest; k++ {
				if at := epoch0.Add(c.phase + k*o.Interval); k >= 0 && at.After(c.scraped) {
					scrape(c, at)
				}
			}
		}
		full := o.FullEvery <= 0 || now.Sub(lastFull) >= o.FullEvery
		n := 0
		for i := range clocks {
			if full || clocks[i].sent.After(lastRelay) {
				n++
			}
		}
		if full {
			lastFull = now
		}
		if n == 0 {
			lastRelay = now
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			continue
		}
		out = wire.AppendPushV2Header(out[:0], wire.KindRelay, o.Sender, now, n)
		for i := range clocks {
			if !full && !clocks[i].sent.After(lastRelay) {
				continue
			}
			v, err := dec.Decode(clocks[i].block, wire.Limits{})
			if err != nil {
				panic(err)
			}
			out = wire.AppendRelayBlock(out, v.Blocks[0], now.Sub(clocks[i].sent))
		}
		lastRelay = now
		o.Stats.Blocks.Add(int64(n))
		var wg sync.WaitGroup
		for _, u := range o.URLs {
			wg.Add(1)
			go func(u string) { defer wg.Done(); p.post(ctx, u, out) }(u)
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Percentiles returns the p-quantiles (0..1) of ds, nearest rank.
func Percentiles(ds []time.Duration, ps ...float64) []time.Duration {
	if len(ds) == 0 {
		return make([]time.Duration, len(ps))
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		k := int(p*float64(len(s))+0.5) - 1
		out[i] = s[max(0, min(len(s)-1, k))]
	}
	return out
}

// ConfigOptions configure the agents' configuration records. An agent
// watching Kubernetes objects sends its model table to an Envoy when that
// Envoy's answers to the metrics pushes (Pushes) name another table, once
// per answer (metricsagent ConfigPublisher), or, when the answers carry no
// header (an older receiver) or OnDemand is off (the agents before it),
// every Resend, changed or not.
type ConfigOptions struct {
	URL      string
	Token    string
	Resend   time.Duration
	OnDemand bool
	// Pushes are the metrics pushes' stats, whose answers say what the
	// gateway holds; Interval is how often an agent looks (its cycle).
	Pushes   *PushStats
	Interval time.Duration
	Stats    *PushStats
}

// ConfigRecord is the record agent id resends: every agent reads the same
// objects, so every agent's table is the same (a rewrite of the bench's
// model onto itself, and one objective).
func ConfigRecord(id string) ([]byte, error) {
	return wire.EncodeConfig(&wire.ConfigRecord{AgentID: id, PoolNamespace: "llm", PoolName: "bench",
		Revision: wire.ConfigRevision{Pools: 1, Objectives: 1, Rewrites: 1},
		Table: wire.ModelTable{
			Rewrites:   []wire.ModelRewrite{{Model: "chat", Targets: []wire.WeightedTarget{{Model: "chat", Weight: 1}}}},
			Objectives: []wire.Objective{{Name: "batch", Priority: -1}},
		}}, wire.ConfigLimits{})
}

// RunConfigResends sends the agents' records until ctx ends: every
// agent's once per Resend, spread evenly over it, or with OnDemand every
// agent's once whenever the gateway's answer names another table than the
// agents' (they all read the same objects: one table, one answer, as the
// aggregators' summary tells every agent in relay mode).
func RunConfigResends(ctx context.Context, f *Fleet, o ConfigOptions) {
	if len(f.Agents) == 0 || o.Resend <= 0 && !o.OnDemand {
		return
	}
	records := make([][]byte, len(f.Agents))
	for i, a := range f.Agents {
		b, err := ConfigRecord(a.ID)
		if err != nil {
			panic(err) // a fixed, valid table
		}
		records[i] = b
	}
	head, err := wire.PeekConfig(records[0], wire.ConfigLimits{})
	if err != nil {
		panic(err)
	}
	mine := head.Held()
	p := newPoster(o.Token, 8, o.Stats)
	defer p.close()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	defer wg.Wait()
	send := func(b []byte) bool {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return false
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			p.post(ctx, o.URL, b)
		}()
		return true
	}
	if o.OnDemand {
		t := time.NewTicker(o.Interval)
		defer t.Stop()
		under := ""
		var lastResend time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			held := ""
			if h := o.Pushes.held.Load(); h != nil {
				held = *h
			}
			switch {
			case held == "":
				// No answer yet, or an older receiver: resend on the timer.
				if o.Resend <= 0 || time.Since(lastResend) < o.Resend {
					continue
				}
				lastResend = time.Now()
			case held == mine:
				under = held
				continue
			case held == under:
				continue // sent under this answer already
			}
			under = held
			for _, b := range records {
				if !send(b) {
					return
				}
			}
		}
	}
	t := time.NewTicker(max(o.Resend/time.Duration(len(records)), 100*time.Microsecond))
	defer t.Stop()
	for i := 0; ; i = (i + 1) % len(records) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !send(records[i]) {
			return
		}
	}
}
