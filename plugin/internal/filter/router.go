package filter

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/prefixroute"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/plugin/internal/vmmem"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Options are the router's injected dependencies; the zero value is what
// the .wasm uses.
type Options struct {
	// Now is the clock for staleness and the snapshot-age gauge; nil means
	// the wall clock (WASI clock_time_get in the .wasm), read once per
	// scheduling decision.
	Now func() time.Time
	// Mono replaces the monotonic clock callbacks are timed on and the
	// snapshot's re-reads are paced by (tests); nil means the time since
	// the router started.
	Mono func() time.Duration
	// LogLevel asks the host for its log level (decides whether decisions
	// are logged at debug); nil means proxywasm.GetLogLevel. Native tests
	// and benchmarks set it: proxytest always reports trace.
	LogLevel func() (proxywasm.LogLevel, error)
}

// outcome is what became of one request; each request counts exactly once.
type outcome int

const (
	outRouted outcome = iota
	outFailOpen
	outDropped
	outBadRequest
	outUnknownModel
	outTooLarge
	outNoEndpoint
	outInternal
	// outDirectResponse: the filter chose an endpoint, but Envoy's route
	// table answered the request itself (a route's direct_response, or no
	// route): it never went upstream.
	outDirectResponse
	// outExpired: held by flow control for its whole TTL, then 429.
	outExpired
	// outAbandoned: the client went away while flow control held it.
	outAbandoned
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"routed", "fail_open", "dropped", "bad_request",
	"unknown_model", "too_large", "no_endpoint", "internal_error", "direct_response", "expired", "abandoned"}

// Router is the router role of one plugin context on one VM: the
// configuration, the scheduler, the per-VM snapshot cache and the buffers
// every request reuses. A Proxy-Wasm VM is single-threaded, so nothing here
// is locked. Its methods are the work a request's callbacks (http.go) hand
// it, in the order they do.
type Router struct {
	cfg   *config.Config
	sched *scheduler.Scheduler
	// rnd draws weighted targets.
	rnd      *rand.Rand
	clock    clock
	logLevel logLevel

	models map[string]*model
	// knownModel finds a configured name by its bytes (parseRequest).
	knownModel func([]byte) (string, bool)
	// mayRewrite: some model has a target other than itself, so a body
	// may change and Content-Length must go.
	mayRewrite bool
	// passthrough is a reused model for unknown names when they are allowed.
	passthrough model
	// crd is the model table from Kubernetes objects (crdtable.go); while
	// it holds one, it replaces models.
	crd crdTable

	// cache is this VM's snapshot, kept up to date from shared data at
	// the cost of what changed (scheduler/wire.Cache); identity is the
	// cache identity dests was filled for.
	cache    *wire.Cache
	snap     *scheduler.Snapshot
	identity uint64
	// refreshEvery is how often the tick re-reads the snapshot (0: every
	// request does); refreshedAt is when the last re-read began
	// (clock.Since), refreshed whether one ran yet. A request decides on
	// what the last re-read found unless that is older than
	// 2*refreshEvery (current).
	refreshEvery time.Duration
	refreshedAt  time.Duration
	refreshed    bool
	// idleRereads counts the tick's re-reads since the last request
	// (maxIdleRereads until the first: a VM that serves none, such as
	// Envoy's main-thread one, never re-reads on its tick).
	idleRereads int

	// req is reused for every request (the scheduler keeps no reference).
	req scheduler.Request
	// bodyBuf is where request bodies are read (proxywasm.*Into): reusing
	// it keeps a request off the allocator and on memory that is already
	// warm, which in a Wasm guest is most of the cost of reading it.
	// Nothing read into it outlives the callback. (The snapshot cache
	// keeps its own read buffers.)
	bodyBuf []byte
	// headerBuf is where Content-Length and the response code details are
	// read.
	headerBuf []byte
	// dests caches the destination header value of each endpoint of snap
	// (same index), filled on first use.
	dests []string
	// free holds finished request contexts for reuse (NewHttpContext).
	free []*httpContext
	// lastPath is the decision path counted last, with its counter.
	lastPath        string
	lastPathCounter proxywasm.MetricCounter
	lastPathOK      bool

	// prefix tracks prompt prefixes for prefix-aware plugins; nil when
	// the scheduler runs none.
	prefix *prefixroute.Tracker
	// respBuf is where response chunks are read for their usage.
	respBuf []byte

	m metrics
	// flow holds requests without capacity (flow.go); nil when flow control
	// is off.
	flow *flowGate
	// refreshTick, prefixTick and flowTick time the work sharing the tick
	// (OnTick).
	refreshTick, prefixTick, flowTick periodic
	// lastFailOpenWarn rate-limits the fail-open warning.
	lastFailOpenWarn time.Time
	lastAgeSet       time.Time
}

// model is one configured model name.
type model struct {
	name string
	crit scheduler.Criticality
	// targets is empty when the model serves itself.
	targets []target
	total   int
}

type target struct {
	name string
	// cum is the running sum of weights up to and including this target.
	cum int
}

type metrics struct {
	outcomes     [numOutcomes]proxywasm.MetricCounter
	paths        map[string]proxywasm.MetricCounter
	decodes      proxywasm.MetricCounter
	decodeErrors proxywasm.MetricCounter
	// lateRefreshes counts requests that re-read the snapshot themselves
	// because the tick's last re-read was older than its bound.
	lateRefreshes proxywasm.MetricCounter
	refreshMicro  proxywasm.MetricHistogram
	scheduleMicro proxywasm.MetricHistogram
	requestMicro  proxywasm.MetricHistogram
	snapshotAge   proxywasm.MetricGauge
	endpoints     proxywasm.MetricGauge
}

// NewRouter builds the router for a decoded configuration (config.Decode)
// and defines its metrics; call it from OnPluginStart.
func NewRouter(cfg *config.Config, opts Options) (*Router, error) {
	seed1, seed2 := seeds(cfg.Seed)
	if opts.LogLevel == nil {
		opts.LogLevel = proxywasm.GetLogLevel
	}
	r := &Router{
		cfg:          cfg,
		rnd:          rand.New(rand.NewPCG(seed1, seed2^0x5eed)),
		clock:        newClock(opts.Now, opts.Mono),
		logLevel:     logLevel{ask: opts.LogLevel},
		headerBuf:    make([]byte, 0, 32),
		models:       make(map[string]*model, len(cfg.Models)),
		passthrough:  model{crit: scheduler.Sheddable},
		cache:        wire.NewCache(wire.NewKeys(cfg.SharedDataKeyPrefix), wire.Limits{}),
		refreshEvery: cfg.SnapshotRefresh(),
		idleRereads:  maxIdleRereads,
	}
	r.snap = &scheduler.Snapshot{}
	s, err := scheduler.New(cfg.SchedulerConfig, scheduler.NewRegistry(), scheduler.Options{
		Rand:       rand.NewPCG(seed1, seed2),
		Now:        r.clock.Now,
		StaleAfter: time.Duration(cfg.StaleAfter),
		FailOpen:   cfg.WhenNoFreshEndpoint == config.NoFreshFailOpen,
	})
	if err != nil {
		return nil, scheduler.PrefixError("scheduler", err)
	}
	r.sched = s
	if s.UsesPrefix() {
		if r.prefix, err = prefixroute.New(cfg.PrefixConfig, cfg.SharedDataKeyPrefix); err != nil {
			return nil, scheduler.PrefixError("prefix", err)
		}
	}
	for _, m := range cfg.Models {
		md := &model{name: m.Name, crit: criticality(m.Criticality)}
		for _, t := range m.Targets {
			if t.Weight == 0 {
				continue // configured but switched off
			}
			md.total += t.Weight
			md.targets = append(md.targets, target{name: t.Name, cum: md.total})
			if t.Name != m.Name {
				r.mayRewrite = true
			}
		}
		r.models[m.Name] = md
	}
	r.knownModel = r.lookupKnown
	r.crd = newCRDTable(cfg)
	r.defineMetrics()
	if fc := cfg.FlowControlConfig; fc != nil {
		// Its release tick is the plugin context's (TickPeriod, set by
		// plugin/main.go).
		if r.flow, err = newFlowGate(r, *fc); err != nil {
			return nil, scheduler.PrefixError("flowControl", err)
		}
	}
	return r, nil
}

// seeds returns the configured seed, or fresh crypto-random seeds.
func seeds(seed *uint64) (uint64, uint64) {
	if seed != nil {
		return *seed, *seed ^ 0x9e3779b97f4a7c15
	}
	var b [16]byte
	_, _ = crand.Read(b[:]) // never fails (Go 1.24+ crashes instead)
	return binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
}

func criticality(s string) scheduler.Criticality {
	switch s {
	case config.CriticalityCritical:
		return scheduler.Critical
	case config.CriticalitySheddable:
		return scheduler.Sheddable
	}
	return scheduler.Standard
}

func (r *Router) defineMetrics() {
	for i, name := range outcomeNames {
		r.m.outcomes[i] = proxywasm.DefineCounterMetric("wasm_epp.requests." + name)
	}
	paths := r.sched.Paths()
	r.m.paths = make(map[string]proxywasm.MetricCounter, len(paths))
	for _, p := range paths {
		r.m.paths[p] = proxywasm.DefineCounterMetric("wasm_epp.path." + PathMetricName(p))
	}
	r.m.decodes = proxywasm.DefineCounterMetric("wasm_epp.snapshot.decodes")
	r.m.decodeErrors = proxywasm.DefineCounterMetric("wasm_epp.snapshot.decode_errors")
	r.m.lateRefreshes = proxywasm.DefineCounterMetric("wasm_epp.snapshot.request_refreshes")
	r.m.refreshMicro = proxywasm.DefineHistogramMetric("wasm_epp.snapshot.refresh_us")
	vmmem.Define()
	r.m.scheduleMicro = proxywasm.DefineHistogramMetric("wasm_epp.schedule_us")
	r.m.requestMicro = proxywasm.DefineHistogramMetric("wasm_epp.request_us")
	r.m.snapshotAge = proxywasm.DefineGaugeMetric("wasm_epp.snapshot.age_ms")
	r.m.endpoints = proxywasm.DefineGaugeMetric("wasm_epp.snapshot.endpoints")
}

// maxFreeContexts bounds the finished contexts a router keeps for reuse.
const maxFreeContexts = 64

// NewHttpContext returns a fresh context for a request, reusing a finished
// one when there is one: an allocation less per request.
func (r *Router) NewHttpContext(id uint32) types.HttpContext {
	if n := len(r.free); n > 0 {
		c := r.free[n-1]
		r.free[n-1] = nil
		r.free = r.free[:n-1]
		c.reset(r)
		c.id = id
		return c
	}
	return &httpContext{r: r, id: id}
}

// recycle keeps a finished context for NewHttpContext.
func (r *Router) recycle(c *httpContext) {
	if len(r.free) < maxFreeContexts {
		c.reset(r)
		r.free = append(r.free, c)
	}
}

// OnTick is the root context's tick, shared by the router's periodic work:
// the snapshot is re-read from shared data while the VM serves requests
// (so they decide on what the tick read instead of each re-reading after
// a relay; maxIdleRereads), the prefix
// index syncs with the other worker VMs, and flow control expires and
// releases held requests (flow.go). The tick runs at the shortest of
// their periods; each runs when its own period has come (to the nearest
// tick).
func (r *Router) OnTick() {
	now := r.clock.Since()
	tick := r.TickPeriod()
	flowDue := r.flow != nil && r.flowTick.due(now, r.flow.cfg.ReleaseInterval, tick)
	if r.refreshEvery > 0 && r.idleRereads < maxIdleRereads && r.refreshTick.due(now, r.refreshEvery, tick) {
		r.idleRereads++
		vmmem.Maybe()
		snap := r.refreshShared(now)
		// The scheduler's index takes what the re-read changed now, when
		// that is a few endpoints, instead of in the next request's decision.
		r.sched.Prepare(snap)
		if r.flow != nil && !flowDue {
			// Flow control's own tick, when due, expires first and then
			// releases on this re-read.
			r.flow.onRefresh(snap)
		}
	}
	if r.prefix != nil && r.prefixTick.due(now, r.prefix.TickPeriod(), tick) {
		r.prefix.Tick()
	}
	if flowDue {
		r.flow.tick(now)
	}
}

// TickPeriod is the tick the router needs (0: none): the shortest period
// of its periodic work.
func (r *Router) TickPeriod() time.Duration {
	var p time.Duration
	for _, d := range []time.Duration{r.refreshEvery, r.prefixPeriod(), r.flowPeriod()} {
		if d > 0 && (p == 0 || d < p) {
			p = d
		}
	}
	return p
}

func (r *Router) prefixPeriod() time.Duration {
	if r.prefix == nil {
		return 0
	}
	return r.prefix.TickPeriod()
}

func (r *Router) flowPeriod() time.Duration {
	if r.flow == nil {
		return 0
	}
	return r.flow.cfg.ReleaseInterval
}

// periodic remembers when a piece of periodic work last ran.
type periodic struct {
	last time.Duration
	ran  bool
}

// due reports whether work of the given period should run at now, on a
// tick of period tick, and records the run. Work whose period is the tick's
// runs every tick (the timer paces it); longer periods run on the nearest
// tick (the host re-arms the timer after each tick, so ticks come a little
// later than tick apart: within half a tick counts as due).
func (p *periodic) due(now, period, tick time.Duration) bool {
	if period > tick && p.ran && now-p.last+tick/2 < period {
		return false
	}
	p.last, p.ran = now, true
	return true
}

// maxKeptResponse caps the response read buffer a router keeps.
const maxKeptResponse = 64 << 10

// scanResponse reads one response chunk for the prefix check's usage.
func (r *Router) scanResponse(c *httpContext, size int, end bool) {
	if size > 0 {
		chunk, err := proxywasm.GetHttpResponseBodyInto(r.respBuf[:0], 0, size)
		if cap(chunk) > cap(r.respBuf) && cap(chunk) <= maxKeptResponse {
			r.respBuf = chunk[:0]
		}
		if err == nil {
			c.prefix.ResponseBody(chunk)
		}
	}
	if end {
		// The last decision's time, not a clock read (two host calls):
		// close enough for "recorded before this report".
		r.prefix.ResponseDone(&c.prefix, r.clock.Now())
	}
}

// maxKeptBody caps the body buffer a router keeps: larger bodies (rare:
// huge prompts) get a buffer of their own. It is 1 MiB, the default
// maxBodyBytes: at 256 KiB a chat body of a 256 KiB prompt (a little
// more with its JSON) missed the kept buffer, and allocating it, then
// collecting it, cost each such request about as much as parsing it
// (BENCHMARKS.md). An allocating router holds as much between two
// collections anyway.
const maxKeptBody = 1 << 20

// readBody reads the buffered request body into bodyBuf (growing it up to
// maxKeptBody). The result is valid until the next request's body is read.
func (r *Router) readBody(size int) ([]byte, error) {
	return readBodyInto(&r.bodyBuf, size)
}

// readBodyInto reads the current stream's request body into *buf, keeping
// the grown buffer for the next read (up to maxKeptBody).
func readBodyInto(buf *[]byte, size int) ([]byte, error) {
	body, err := proxywasm.GetHttpRequestBodyInto((*buf)[:0], 0, size)
	if cap(body) > cap(*buf) && cap(body) <= maxKeptBody {
		*buf = body[:0]
	}
	return body, err
}

// responseCodeDetailsPath is the property Envoy's stream info keeps the
// response code details under (%RESPONSE_CODE_DETAILS%).
var responseCodeDetailsPath = []string{"response", "code_details"}

// responseSource says where the response a forwarded request is getting
// comes from: the upstream (the router's "via_upstream", or no details at
// all, which Envoy always sets), the route table ("direct_response", or
// "route_not_found": the request never left Envoy), or Envoy itself after
// forwarding (upstream connect failure, reset, timeout, ...).
func (r *Router) responseSource() responseSource {
	d, err := proxywasm.GetPropertyInto(r.headerBuf[:0], responseCodeDetailsPath)
	if err != nil {
		return fromUpstream
	}
	switch string(d) {
	case "via_upstream":
		return fromUpstream
	case "direct_response", "route_not_found":
		return fromRouteTable
	}
	return fromEnvoy
}

type responseSource int

const (
	fromUpstream responseSource = iota
	fromRouteTable
	fromEnvoy
)

// pickTarget draws the model a request is served by.
func (r *Router) pickTarget(m *model, requested string) string {
	switch len(m.targets) {
	case 0:
		return requested
	case 1:
		return m.targets[0].name
	}
	x := r.rnd.IntN(m.total)
	for _, t := range m.targets {
		if x < t.cum {
			return t.name
		}
	}
	return m.targets[len(m.targets)-1].name // unreachable: x < total
}

// lookupKnown finds a model name by its bytes for the request parser: in
// the active table when there is one, else among the bootstrap models.
func (r *Router) lookupKnown(b []byte) (string, bool) {
	if a := r.crd.active; a != nil {
		if m, ok := a.models[string(b)]; ok { // no allocation for the lookup
			return m[0].name, true
		}
		return "", false
	}
	if m, ok := r.models[string(b)]; ok {
		return m.name, true
	}
	return "", false
}

// resolveModel returns the model a request for name is served as: from the
// active table (always found), else from the bootstrap models.
func (r *Router) resolveModel(name string) (*model, bool) {
	a := r.crd.active
	if a == nil {
		m, ok := r.models[name]
		return m, ok
	}
	idx := critIdx
	if len(a.objectives) > 0 && r.requestObjective(a) == scheduler.Sheddable {
		idx = shedIdx
	}
	if m, ok := a.models[name]; ok {
		return &m[idx], true
	}
	if a.def != nil {
		return &a.def[idx], true
	}
	return &a.unchanged[idx], true
}

// requestObjective is the criticality of the objective the request's header
// names (Critical when it names none the table has).
func (r *Router) requestObjective(a *activeTable) scheduler.Criticality {
	for _, h := range [...]string{objectiveHeader, legacyObjectiveHeader} {
		v, err := proxywasm.GetHttpRequestHeaderInto(r.headerBuf[:0], h)
		if err != nil || len(v) == 0 {
			continue
		}
		if c, ok := a.objectives[string(v)]; ok { // no allocation for the lookup
			return c
		}
		return scheduler.Critical
	}
	return scheduler.Critical
}

// maxRefreshAge is how old the last re-read may be for a request to
// decide on it without re-reading: two tick periods, so a tick that comes
// late by less than its period (the host re-arms the timer after each
// tick, and a worker busy with other streams runs it later) costs no
// request a re-read, and ticks that stop leave requests re-reading, as
// without ticks.
func (r *Router) maxRefreshAge() time.Duration { return 2 * r.refreshEvery }

// maxIdleRereads is how many times the tick re-reads the snapshot with no
// request in between before it stops until the next request (about 5 s
// at the default interval): every VM holding the router has the tick,
// Envoy's main-thread one too, which never serves a request, and a worker
// that has no traffic would otherwise re-read every relay for nothing.
// Its next request then re-reads itself, the last re-read being older
// than the bound.
const maxIdleRereads = 256

// current returns the snapshot a callback that began at now (clock.Since)
// decides on, with the Kubernetes model table current with it: what the
// last re-read found (the tick's, normally) when it began at most
// maxRefreshAge before now; otherwise it re-reads (refreshShared). An
// empty snapshot is always re-read (a directory read: cheap), so the
// first push after a start routes at once instead of up to a bound later.
func (r *Router) current(now time.Duration) *scheduler.Snapshot {
	vmmem.Maybe()
	r.idleRereads = 0
	if r.refreshEvery > 0 && r.refreshed && len(r.snap.Endpoints) > 0 {
		if age := now - r.refreshedAt; age >= 0 && age <= r.maxRefreshAge() {
			return r.snap
		}
		r.m.lateRefreshes.Increment(1)
	}
	return r.refreshShared(now)
}

// reread returns the snapshot re-read in the tick at now: the tick's own
// re-read when it ran in this tick, else a new one. Flow control's
// releases re-read on every releaseInterval (README), however the
// snapshot's own refresh is paced.
func (r *Router) reread(now time.Duration) *scheduler.Snapshot {
	if r.refreshed && r.refreshedAt == now {
		return r.snap
	}
	return r.refreshShared(now)
}

// refreshShared brings the snapshot and the Kubernetes model table up to
// date with one shared-data read when nothing changed: the directory names
// both the segments' and the configuration record's generations. now is
// when the caller's callback began (clock.Since).
func (r *Router) refreshShared(now time.Duration) *scheduler.Snapshot {
	snap := r.snapshot()
	gen, known := r.cache.ConfigGen()
	r.crd.refresh(gen, known)
	r.refreshedAt, r.refreshed = now, true
	return snap
}

// snapshot re-reads the snapshot. One small shared-data read (the
// directory) tells whether anything changed since this VM last looked;
// only then are the changed segments read and their endpoints rewritten.
// Callers go through refreshShared (current, OnTick).
func (r *Router) snapshot() *scheduler.Snapshot {
	start := r.clock.Since()
	snap, changed, err := r.cache.Refresh(shareddata.Store{})
	if err != nil {
		r.m.decodeErrors.Increment(1)
		logSnapshotError(err)
	}
	r.snap = snap
	if !changed {
		return snap
	}
	r.m.decodes.Increment(1)
	if id := r.cache.Identity(); id != r.identity || len(r.dests) != len(snap.Endpoints) {
		// Endpoints came, went or moved: formatted destinations are stale.
		r.identity = id
		if n := len(snap.Endpoints); cap(r.dests) < n {
			r.dests = make([]string, n)
		} else {
			r.dests = r.dests[:n]
			clear(r.dests)
		}
	}
	setGauge(r.m.endpoints, int64(len(snap.Endpoints)))
	r.m.refreshMicro.Record(uint64((r.clock.Since() - start) / time.Microsecond))
	return snap
}

// decision is a scheduling result and the outcome it counts as.
type decision struct {
	res     scheduler.Result
	outcome outcome
}

// decide runs the scheduler on snap for req (nil: a request without a
// body, least loaded) and counts the decision path and the time it took.
func (r *Router) decide(req *scheduler.Request, snap *scheduler.Snapshot) decision {
	start := r.clock.Decide()
	var res scheduler.Result
	if req == nil {
		res = r.sched.LeastLoaded(snap)
	} else {
		res = r.sched.Schedule(req, snap)
	}
	d := r.record(snap, res, r.clock.Since()-start)
	if d.outcome == outRouted && req != nil {
		// With countRoutedSinceSnapshot, the request counts as waiting in
		// this VM's private snapshot copy until the next decode (install)
		// replaces it; bodyless requests are not inference.
		r.sched.Observe(req, res)
	}
	return d
}

// record counts a decision the scheduler took in elapsed: its path, the
// time, the snapshot's age, a fail-open warning. A request flow control
// held counts the decision that released it here too (flow.go).
func (r *Router) record(snap *scheduler.Snapshot, res scheduler.Result, elapsed time.Duration) decision {
	d := decision{res: res}
	switch res.Outcome {
	case scheduler.Routed:
		d.outcome = outRouted
	case scheduler.FailedOpen:
		d.outcome = outFailOpen
	case scheduler.Dropped:
		d.outcome = outDropped
	default:
		d.outcome = outNoEndpoint
	}
	r.m.scheduleMicro.Record(uint64(elapsed / time.Microsecond))
	if c, ok := r.pathCounter(res.Path); ok {
		c.Increment(1)
	}
	now := r.clock.Now()
	if !snap.Time.IsZero() && now.Sub(r.lastAgeSet) >= 100*time.Millisecond {
		r.lastAgeSet = now
		age := now.Sub(snap.Time)
		if age < 0 {
			age = 0
		}
		setGauge(r.m.snapshotAge, int64(age/time.Millisecond))
	}
	if d.outcome == outFailOpen && now.Sub(r.lastFailOpenWarn) >= 10*time.Second {
		r.lastFailOpenWarn = now
		r.warnFailOpen()
	}
	return d
}

func (r *Router) warnFailOpen() {
	proxywasm.LogWarnf("wasm-epp: every endpoint's metrics are older than %s: failing open to random endpoints (counted in wasm_epp.requests.fail_open; this warning repeats at most every 10s)",
		time.Duration(r.cfg.StaleAfter))
}

func logSharedDataError(key string, err error) {
	proxywasm.LogErrorf("wasm-epp: cannot read shared data %q: %v", key, err)
}

func logSnapshotError(err error) {
	proxywasm.LogErrorf("wasm-epp: reading the snapshot from shared data: %v; keeping what could not be read as it was", err)
}

// pathCounter is the counter of a decision path; the last one is cached
// (paths are the scheduler's constant strings, so a hit compares one
// pointer).
func (r *Router) pathCounter(path string) (proxywasm.MetricCounter, bool) {
	if path == r.lastPath && r.lastPathOK {
		return r.lastPathCounter, true
	}
	c, ok := r.m.paths[path]
	if ok {
		r.lastPath, r.lastPathCounter, r.lastPathOK = path, c, true
	}
	return c, ok
}

func (r *Router) count(o outcome) { r.m.outcomes[o].Increment(1) }

// debugEnabled tells whether decisions are logged (host at debug level),
// asked at the current decision's time.
func (r *Router) debugEnabled() bool { return r.logLevel.Debug(r.clock.Mono()) }

// destinationOf is destination(&snap.Endpoints[i]), from the cache when
// snap is the cached snapshot (it always is, except in tests).
func (r *Router) destinationOf(snap *scheduler.Snapshot, i int) string {
	ep := &snap.Endpoints[i]
	if snap != r.snap || i >= len(r.dests) {
		return r.destination(ep)
	}
	if r.dests[i] == "" {
		r.dests[i] = r.destination(ep)
	}
	return r.dests[i]
}

// destination formats ip:port ([v6]:port) for the ORIGINAL_DST header;
// TargetPort, when set, replaces the reported port.
func (r *Router) destination(ep *scheduler.Endpoint) string {
	port := ep.Port
	if r.cfg.TargetPort != 0 {
		port = r.cfg.TargetPort
	}
	b := make([]byte, 0, len(ep.Address)+8)
	if strings.IndexByte(ep.Address, ':') >= 0 {
		b = append(b, '[')
		b = append(b, ep.Address...)
		b = append(b, ']')
	} else {
		b = append(b, ep.Address...)
	}
	b = append(b, ':')
	b = appendUint(b, uint64(port))
	return string(b)
}

func appendUint(b []byte, v uint64) []byte {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(b, tmp[i:]...)
}

// PathMetricName turns a scheduler path into a stat-name segment: "/"
// becomes "." (Envoy's hierarchy separator) and anything outside
// [a-z0-9_.-] becomes "_". Paths come from the configuration, never from
// requests, so the set of names is fixed at start.
func PathMetricName(path string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '/':
			return '.'
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '_'
	}, path)
}

// setGauge sets a gauge shared by every worker VM to v. The SDK API only
// adds, and Envoy keeps one stat per name for all workers, so add the
// difference to the current value: the last writer wins, which is right for
// values every worker derives from the same shared data.
func setGauge(g proxywasm.MetricGauge, v int64) {
	if d := v - g.Value(); d != 0 {
		g.Add(d)
	}
}
