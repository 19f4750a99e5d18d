package metricsagent

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Agent runs scrape-and-push cycles.
type Agent struct {
	id       string
	interval time.Duration
	disc     Discoverer
	scraper  *Scraper
	envoys   EnvoyTargets
	// configEnvoys, when set, get the configuration record instead of
	// envoys (metrics go to aggregators, the record to the Envoys).
	configEnvoys EnvoyTargets
	pusher       *Pusher
	config       *ConfigPublisher
	wireVersion  int
	enc          wire.BlockEncoder
	before       func()
	now          func() time.Time
	log          *slog.Logger
	metrics      *Metrics
	limits       wire.Limits
	// gate decides which cycles push (nil: every cycle); lastTargets are
	// the targets of the last push (new targets get the state at once).
	gate        *wire.SendGate
	lastTargets []string

	seq      uint64
	pods     map[TargetKey]*podState
	scrapers map[TargetKey]*podScraper
	ready    atomic.Bool
	cycles   atomic.Uint64
}

// podScraper is a pod's scraper, kept across cycles with its connection
// and its page parser, and the metrics it feeds.
type podScraper struct {
	ps        *PodScraper
	err       error // the target's URL is unusable; reported as its scrape error
	duration  prometheus.Observer
	fullSeen  uint64 // the parser's counts already added to the metrics
	valueSeen uint64
}

// podState is what the agent remembers of one pod between cycles.
type podState struct {
	target   Target
	last     PodMetrics // last good values, kept through failures
	lastGood time.Time  // zero until a scrape succeeds
	status   wire.ScrapeStatus
	lastWarn time.Time // last "scrape failing" warning: a flapping pod warns once a minute
}

// warnEvery bounds the "scrape failing" warnings of one pod; every other
// failure is logged at debug level and counted in the metrics.
const warnEvery = time.Minute

// Options configure an Agent. Every field is required except Now (default
// time.Now) and Limits (zero means wire defaults).
type Options struct {
	AgentID    string
	Interval   time.Duration
	Discoverer Discoverer
	Scraper    *Scraper
	Envoys     EnvoyTargets
	// ConfigEnvoys, when set, are where the configuration record goes
	// when Envoys are not the Envoys themselves (aggregators).
	ConfigEnvoys EnvoyTargets
	// WireVersion is the push format: 2 (default) or 1.
	WireVersion int
	Pusher      *Pusher
	// Config, when set, publishes the configuration record each cycle to
	// the same Envoy targets.
	Config *ConfigPublisher
	// BeforeCycle, when set, runs at the start of every cycle (the objects
	// file is read there, so its changes go out in the same cycle).
	BeforeCycle func()
	Now         func() time.Time
	Log         *slog.Logger
	Metrics     *Metrics
	Limits      wire.Limits
	// Send says which cycles push (wire.SendThresholds, validated by the
	// caller); the zero value pushes every cycle.
	Send wire.SendThresholds
}

// NewAgent builds an agent.
func NewAgent(o Options) *Agent {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.WireVersion == 0 {
		o.WireVersion = 2
	}
	var gate *wire.SendGate
	if o.Send.Heartbeat > 0 {
		gate = wire.NewSendGate(o.AgentID, o.Send)
	}
	return &Agent{
		gate:         gate,
		configEnvoys: o.ConfigEnvoys, wireVersion: o.WireVersion,
		id: o.AgentID, interval: o.Interval, disc: o.Discoverer, scraper: o.Scraper,
		envoys: o.Envoys, pusher: o.Pusher, config: o.Config, before: o.BeforeCycle, now: o.Now, log: o.Log, metrics: o.Metrics, limits: o.Limits,
		// The sequence starts at the current Unix time in nanoseconds and
		// then grows by one per push. A restarted agent therefore starts
		// above anything its previous run sent (that run would have needed
		// to push more than once per nanosecond to get ahead), so the
		// receiver, which refuses a sequence not above the last accepted,
		// takes the new process at once without any state kept on disk.
		seq:      uint64(o.Now().UnixNano()),
		pods:     map[TargetKey]*podState{},
		scrapers: map[TargetKey]*podScraper{},
	}
}

// Close drops the scrape connections. Run calls it on return; callers of
// Cycle call it when done.
func (a *Agent) Close() {
	for key, sc := range a.scrapers {
		if sc.ps != nil {
			sc.ps.Close()
		}
		delete(a.scrapers, key)
	}
}

func (a *Agent) newPodScraper(t Target) *podScraper {
	ps, err := a.scraper.ForURL(a.scraper.URL(t.URL))
	if err != nil { // cannot happen for discovered targets; reported, not hidden
		err = &ScrapeError{Status: wire.ScrapeConnectFailed, Err: err}
	}
	return &podScraper{ps: ps, err: err, duration: a.metrics.ScrapeDuration.WithLabelValues(t.ID())}
}

// scrape scrapes the targets in one Sweep and returns their outcomes in
// order.
func (a *Agent) scrape(ctx context.Context, targets []Target) []scrapeResult {
	start := time.Now()
	deadline := start.Add(a.scraper.Timeout)
	results := make([]scrapeResult, len(targets))
	pods := make([]*PodScraper, 0, len(targets))
	index := make([]int, 0, len(targets)) // pods[k] is targets[index[k]]
	for i, t := range targets {
		sc, ok := a.scrapers[t.Key()]
		if !ok {
			sc = a.newPodScraper(t)
			a.scrapers[t.Key()] = sc
		}
		if sc.err != nil {
			results[i] = scrapeResult{err: sc.err, at: a.now()}
			continue
		}
		pods = append(pods, sc.ps)
		index = append(index, i)
	}
	out := make([]Scraped, len(pods))
	a.scraper.Sweep(ctx, pods, deadline, out)
	full, values := a.metrics.PageParses.WithLabelValues("full"), a.metrics.PageParses.WithLabelValues("values_only")
	for k, o := range out {
		i := index[k]
		sc := a.scrapers[targets[i].Key()]
		sc.duration.Observe(o.At.Sub(start).Seconds())
		f, v := sc.ps.Parses()
		full.Add(float64(f - sc.fullSeen))
		values.Add(float64(v - sc.valueSeen))
		sc.fullSeen, sc.valueSeen = f, v
		results[i] = scrapeResult{m: o.Metrics, err: o.Err, at: a.now()}
	}
	return results
}

// Ready reports whether a first cycle has completed (for /readyz).
func (a *Agent) Ready() bool { return a.ready.Load() }

// Run runs a cycle every interval until ctx ends. A cycle that overruns
// the interval delays the next one (ticks are dropped, never queued).
func (a *Agent) Run(ctx context.Context) {
	t := time.NewTicker(a.interval)
	defer t.Stop()
	defer a.Close()
	for {
		a.Cycle(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type scrapeResult struct {
	m   PodMetrics
	err error
	at  time.Time
}

// Cycle scrapes every target concurrently, waits for all (each scrape is
// bounded by the scrape timeout), builds one push and hands it to the
// pushers. It returns the payload handed over (nil if none).
func (a *Agent) Cycle(ctx context.Context) []byte {
	start := time.Now()
	if a.before != nil {
		a.before()
	}
	targets := a.disc.Targets()
	seen := make(map[TargetKey]bool, len(targets))
	targets = slices.DeleteFunc(slices.Clone(targets), func(t Target) bool { // one scrape per target and cycle
		dup := seen[t.Key()]
		seen[t.Key()] = true
		return dup
	})
	results := a.scrape(ctx, targets)
	if ctx.Err() != nil {
		return nil // shutting down: these failures are ours, not the pods'
	}

	for i, t := range targets {
		a.record(t, results[i])
	}
	for key, sc := range a.scrapers {
		if !seen[key] {
			if sc.ps != nil {
				sc.ps.Close()
			}
			delete(a.scrapers, key)
		}
	}
	for key, st := range a.pods {
		if !seen[key] {
			delete(a.pods, key)
			if !a.hasID(st.target.ID()) {
				a.metrics.forgetPod(st.target.ID())
			}
			a.log.Info("pod no longer discovered", "pod", st.target.ID())
		}
	}

	eps, unhealthy := a.endpoints()
	now := a.now()
	envoys := a.envoys.Targets(ctx)
	reason := wire.Always
	if a.gate != nil {
		if !slices.Equal(envoys, a.lastTargets) {
			a.gate.Force() // a new target (or the fallback to the Envoys) gets the state now
		}
		reason = a.gate.Due(eps, now)
	}
	var payload []byte
	if reason == wire.NotDue {
		// Every value within its threshold of the copy last sent, which
		// is younger than the heartbeat: nothing to push. Targets that
		// missed the last copy get it again.
		a.pusher.RetryFailing()
	} else {
		a.seq++
		p := &wire.Push{AgentID: a.id, Seq: a.seq, SendTime: now, Endpoints: eps}
		var err error
		if a.wireVersion == 1 {
			payload, err = wire.EncodePush(p, a.limits)
		} else {
			// A new slice each cycle: the pushers still hold the previous one.
			payload, err = a.enc.AppendAgentPush(nil, p, a.limits)
		}
		if err != nil {
			// Only possible if more pods than the wire limit were discovered:
			// nothing is pushed, the receiver lets this node's endpoints age.
			a.log.Error("cannot encode push", "err", err, "endpoints", len(eps))
			return nil
		}
		a.pusher.Publish(envoys, payload)
		if a.gate != nil {
			a.gate.Sent(eps, now)
			a.lastTargets = append(a.lastTargets[:0], envoys...)
		}
		a.metrics.PushBytes.Set(float64(len(payload)))
	}
	a.metrics.Cycles.WithLabelValues(reason.String()).Inc()
	if a.config != nil {
		cfgEnvoys := envoys
		if a.configEnvoys != nil {
			cfgEnvoys = a.configEnvoys.Targets(ctx)
		}
		a.config.Publish(ctx, cfgEnvoys, a.now())
	}

	a.metrics.EndpointsReported.Set(float64(len(eps)))
	a.metrics.EndpointsUnhealthy.Set(float64(unhealthy))
	a.metrics.EnvoyTargets.Set(float64(len(envoys)))
	a.metrics.CycleDuration.Observe(time.Since(start).Seconds())
	a.cycles.Add(1)
	a.ready.Store(true)
	return payload
}

func (a *Agent) hasID(id string) bool {
	for _, st := range a.pods {
		if st.target.ID() == id {
			return true
		}
	}
	return false
}

// record folds one scrape into the pod's state: a success replaces the
// values and their time; a failure keeps both (the pod ages towards stale
// at the receiver) and only changes the status.
func (a *Agent) record(t Target, r scrapeResult) {
	st, ok := a.pods[t.Key()]
	if !ok {
		st = &podState{target: t}
		a.pods[t.Key()] = st
	}
	if r.err == nil {
		if err := a.validate(t, r.m, r.at); err != nil {
			r.err = &ScrapeError{Status: wire.ScrapeInvalidValue, Err: err}
		}
	}
	prev := st.status
	if r.err != nil {
		st.status = StatusOf(r.err)
		a.metrics.ScrapeErrors.WithLabelValues(t.ID(), st.status.String()).Inc()
		if now := a.now(); prev == wire.ScrapeOK && now.Sub(st.lastWarn) >= warnEvery {
			st.lastWarn = now
			a.log.Warn("scrape failing", "pod", t.ID(), "url", t.URL, "reason", st.status.String(), "err", r.err)
		} else {
			a.log.Debug("scrape failed", "pod", t.ID(), "reason", st.status.String(), "err", r.err)
		}
		return
	}
	st.last, st.lastGood, st.status = r.m, r.at, wire.ScrapeOK
	if prev != wire.ScrapeOK {
		a.log.Debug("scrape recovered", "pod", t.ID())
	}
}

// validate checks values against the wire format before they are kept, so
// one pod with, say, an over-long adapter name fails its own scrape instead
// of the whole push.
func (a *Agent) validate(t Target, m PodMetrics, at time.Time) error {
	e := endpointState(t, m, at, wire.ScrapeOK)
	return (&wire.Push{AgentID: a.id, Seq: 1, SendTime: at, Endpoints: []wire.EndpointState{e}}).Validate(a.limits)
}

func endpointState(t Target, m PodMetrics, at time.Time, status wire.ScrapeStatus) wire.EndpointState {
	return wire.EndpointState{
		Namespace: t.Namespace, Name: t.Name, Address: t.Address, Port: t.Port,
		Waiting: m.Waiting, Running: m.Running, KVCacheUsage: m.KVCacheUsage,
		ActiveAdapters: m.ActiveAdapters, WaitingAdapters: m.WaitingAdapters, MaxAdapters: m.MaxAdapters,
		ScrapeTime: at, LastError: status,
	}
}

// endpoints lists every pod with a good scrape so far, in wire order. A pod
// never scraped successfully has no values to report and is left out.
func (a *Agent) endpoints() (eps []wire.EndpointState, unhealthy int) {
	eps = make([]wire.EndpointState, 0, len(a.pods))
	ids := make(map[string]bool, len(a.pods))
	for _, st := range a.pods {
		if st.lastGood.IsZero() {
			continue
		}
		if ids[st.target.ID()] {
			// Two targets with one name (static targets can't; a pod
			// whose IP changed between discovery refreshes could): keep
			// the fresher, as the receiver would.
			for i := range eps {
				if eps[i].Namespace == st.target.Namespace && eps[i].Name == st.target.Name && eps[i].ScrapeTime.Before(st.lastGood) {
					eps[i] = endpointState(st.target, st.last, st.lastGood, st.status)
				}
			}
			continue
		}
		ids[st.target.ID()] = true
		eps = append(eps, endpointState(st.target, st.last, st.lastGood, st.status))
	}
	wire.Normalize(eps)
	for i := range eps {
		if !eps[i].Healthy() {
			unhealthy++
		}
	}
	return eps, unhealthy
}
