package scheduler

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"
	"unsafe"
)

// Options are the Scheduler's injected dependencies.
type Options struct {
	// Rand is the only source of randomness. Nil means a private PCG
	// seeded once from crypto/rand (never a global source). Tests and the
	// fleet simulation pass rand.NewPCG(seed, seq) to be reproducible.
	Rand rand.Source
	// Now is the clock for staleness; nil means time.Now. It is read at
	// most once per decision, and only when StaleAfter > 0.
	Now func() time.Time
	// StaleAfter, when > 0, restricts every decision to endpoints whose
	// Metrics.UpdateTime is within StaleAfter of Now. When endpoints exist
	// but none is fresh the outcome is AllStale, or FailedOpen with
	// FailOpen set.
	StaleAfter time.Duration
	// FailOpen, when every endpoint of a non-empty snapshot is stale,
	// routes to one of them chosen uniformly at random (Outcome
	// FailedOpen) instead of reporting AllStale. Stale metrics say nothing
	// reliable about load, so no profile runs on them: the traffic spreads
	// evenly over every endpoint last known.
	FailOpen bool
	// IndexMinEndpoints is the snapshot size from which decisions use the
	// Scheduler's per-snapshot index (see the package doc, "Large
	// snapshots") instead of visiting every endpoint. Decisions are the
	// same either way. 0 means DefaultIndexMinEndpoints; a negative value
	// never indexes.
	IndexMinEndpoints int
}

// Outcome is what became of a request.
type Outcome int

const (
	// Routed: Result.Endpoint serves the request.
	Routed Outcome = iota
	// Dropped: a sheddable (or standard) request was shed for lack of
	// capacity; the gateway answers 429.
	Dropped
	// NoEndpoint: nothing can serve the request (empty snapshot, or the
	// profile's filters kept nothing); the gateway answers 503.
	NoEndpoint
	// AllStale: endpoints exist but every one's metrics are older than
	// Options.StaleAfter, and Options.FailOpen is off; the gateway
	// answers 503.
	AllStale
	// FailedOpen: every endpoint was stale and Options.FailOpen routed the
	// request to one of them at random; Result.Endpoint serves it.
	FailedOpen
)

func (o Outcome) String() string {
	switch o {
	case Routed:
		return "routed"
	case Dropped:
		return "dropped"
	case NoEndpoint:
		return "no-endpoint"
	case AllStale:
		return "all-stale"
	case FailedOpen:
		return "failed-open"
	}
	return "unknown"
}

// Fixed paths, besides profile names and decision-tree routes.
const (
	// PathNoEndpoint: the snapshot had no endpoint at all.
	PathNoEndpoint = "no-endpoint"
	// PathAllStale: every endpoint was stale (Outcome AllStale or
	// FailedOpen).
	PathAllStale = "all-stale"
	// PathLeastLoaded: a LeastLoaded decision.
	PathLeastLoaded = "least-loaded"
)

// Result is one scheduling decision.
type Result struct {
	// Endpoint is the chosen endpoint, &snapshot.Endpoints[Index]; nil
	// unless the outcome is Routed or FailedOpen.
	Endpoint *Endpoint
	// Index is Endpoint's position in the snapshot's Endpoints, or -1 when
	// no endpoint was chosen.
	Index   int
	Outcome Outcome
	// Path names how the decision was reached, for metrics and debug logs:
	// a decision-tree route, the profile name, or one of the Path*
	// constants. Scheduler.Paths lists every value it can take.
	Path string
	// Profile is the profile that ran ("" for PathNoEndpoint, PathAllStale
	// and LeastLoaded).
	Profile string
	// Stale counts endpoints skipped because their metrics were stale.
	Stale int
}

// Scheduler runs profiles over snapshots.
//
// A Scheduler is NOT safe for concurrent use: it reuses per-Scheduler
// scratch buffers, its random source and stateful plugins (round-robin)
// across calls. That fits its callers: a Proxy-Wasm VM is single-threaded
// (one Scheduler per VM) and the fleet simulation is a single-threaded
// event loop. Concurrent callers need one Scheduler each.
type Scheduler struct {
	byCriticality [3]*Profile
	profiles      []*Profile // distinct selected profiles, in selection order
	rand          *rand.Rand
	now           func() time.Time
	staleAfter    time.Duration
	failOpen      bool
	countRouted   bool
	cycle         Cycle

	// index is the per-snapshot index of the fast paths (fastpath.go),
	// used from indexFrom endpoints on (never when indexFrom < 0).
	index         *snapIndex
	indexFrom     int
	leastLoadedBy int // the index's order for LeastLoaded

	candidates []*Endpoint
	bufs       [2][]*Endpoint
	scores     []float64
	scratch    []float64
}

// New assembles a Scheduler from a configuration. reg nil means
// NewRegistry(). Errors are *ConfigError with paths relative to the
// configuration document.
func New(cfg Config, reg *Registry, opts Options) (*Scheduler, error) {
	if reg == nil {
		reg = NewRegistry()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.StaleAfter < 0 {
		return nil, fmt.Errorf("scheduler: Options.StaleAfter must be >= 0, got %v", opts.StaleAfter)
	}
	src := opts.Rand
	if src == nil {
		var seed [16]byte
		_, _ = crand.Read(seed[:]) // never fails (Go 1.24+ crashes instead)
		src = rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:]))
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	s := &Scheduler{rand: rand.New(src), now: now, staleAfter: opts.StaleAfter, failOpen: opts.FailOpen, countRouted: cfg.CountsRoutedSinceSnapshot()}
	s.cycle.Rand, s.cycle.clock = s.rand, now
	s.indexFrom = opts.IndexMinEndpoints
	if s.indexFrom == 0 {
		s.indexFrom = DefaultIndexMinEndpoints
	}
	s.index = newSnapIndex(opts.StaleAfter)
	s.leastLoadedBy = s.index.orderOf(keyLeastLoaded, -1, false)

	b := &builder{reg: reg, declared: map[string]Plugin{}, byType: map[string]Plugin{}}
	for i, spec := range cfg.Plugins {
		if err := b.declare(spec); err != nil {
			return nil, prefixErr(fmt.Sprintf("plugins[%d]", i), err)
		}
	}
	built := map[string]*Profile{}
	for _, name := range sortedKeys(cfg.Profiles) {
		p, err := b.profile(name, cfg.Profiles[name], true)
		if err != nil {
			return nil, prefixErr("profiles."+name, err)
		}
		built[name] = p
	}
	builtin := BuiltinProfiles()
	for c := Critical; c <= Sheddable; c++ {
		name := cfg.profileFor(c)
		p, ok := built[name]
		if !ok {
			spec, isBuiltin := builtin[name]
			if !isBuiltin {
				return nil, fieldErr("profile", fmt.Sprintf("unknown profile %q", name))
			}
			var err error
			if p, err = b.profile(name, spec, false); err != nil {
				return nil, fmt.Errorf("scheduler: built-in profile %q: %w", name, err) // a bug, not a config error
			}
			built[name] = p
		}
		s.byCriticality[c] = p
		if !containsProfile(s.profiles, p) {
			p.fast = fastPathFor(p, s.index)
			_, p.fastFlat = p.fast.(flatPath)
			p.fused = newFusedPrefix(p)
			s.profiles = append(s.profiles, p)
		}
	}
	return s, nil
}

func containsProfile(list []*Profile, p *Profile) bool {
	for _, q := range list {
		if q == p {
			return true
		}
	}
	return false
}

// builder resolves plugin references while assembling a Scheduler.
type builder struct {
	reg      *Registry
	declared map[string]Plugin // by instance name, from Config.Plugins
	byType   map[string]Plugin // default-parameter instances, by type name
}

func (b *builder) declare(spec PluginSpec) error {
	t, ok := b.reg.Lookup(spec.Type)
	if !ok {
		return fieldErr("type", fmt.Sprintf("unknown plugin type %q", spec.Type))
	}
	name := spec.instanceName()
	if other, isType := b.reg.Lookup(name); isType && other.Type != spec.Type {
		return fieldErr("name", fmt.Sprintf("%q is the name of plugin type %q; choose another name", name, other.Type))
	}
	p, err := t.New(name, spec.Parameters, b)
	if err != nil {
		return prefixErr("parameters", err)
	}
	if err := checkKind(p, t.Kind); err != nil {
		return err
	}
	b.declared[name] = p
	return nil
}

func checkKind(p Plugin, k Kind) error {
	var ok bool
	switch k {
	case KindFilter:
		_, ok = p.(Filter)
	case KindScorer:
		_, ok = p.(Scorer)
	case KindPicker:
		_, ok = p.(Picker)
	}
	if !ok {
		return fieldErr("type", fmt.Sprintf("plugin %q does not implement %s", p.Name(), k))
	}
	return nil
}

// Plugin implements Handle: a declared instance, else a shared
// default-parameter instance of the type with that name.
func (b *builder) Plugin(ref string) (Plugin, error) {
	return b.resolve(ref, true)
}

func (b *builder) resolve(ref string, allowDeclared bool) (Plugin, error) {
	if allowDeclared {
		if p, ok := b.declared[ref]; ok {
			return p, nil
		}
	}
	if p, ok := b.byType[ref]; ok {
		return p, nil
	}
	t, ok := b.reg.Lookup(ref)
	if !ok {
		return nil, fieldErr("", fmt.Sprintf("unknown plugin %q (neither declared in plugins nor a registered type)", ref))
	}
	p, err := t.New(ref, nil, b)
	if err != nil {
		return nil, fieldErr("", fmt.Sprintf("plugin type %q with default parameters: %v", ref, err))
	}
	if err := checkKind(p, t.Kind); err != nil {
		return nil, err
	}
	b.byType[ref] = p
	return p, nil
}

func (b *builder) profile(name string, spec ProfileSpec, allowDeclared bool) (*Profile, error) {
	p := &Profile{Name: name}
	for i, ref := range spec.Filters {
		path := fmt.Sprintf("filters[%d]", i)
		pl, err := b.resolve(ref, allowDeclared)
		if err != nil {
			return nil, prefixErr(path, err)
		}
		f, ok := pl.(Filter)
		if !ok {
			return nil, fieldErr(path, fmt.Sprintf("%q is not a filter", ref))
		}
		p.Filters = append(p.Filters, f)
	}
	for i, ref := range spec.Scorers {
		path := fmt.Sprintf("scorers[%d].scorer", i)
		pl, err := b.resolve(ref.Scorer, allowDeclared)
		if err != nil {
			return nil, prefixErr(path, err)
		}
		sc, ok := pl.(Scorer)
		if !ok {
			return nil, fieldErr(path, fmt.Sprintf("%q is not a scorer", ref.Scorer))
		}
		p.Scorers = append(p.Scorers, WeightedScorer{Scorer: sc, Weight: ref.Weight})
		p.weightSum += ref.Weight
	}
	pl, err := b.resolve(spec.Picker, allowDeclared)
	if err != nil {
		return nil, prefixErr("picker", err)
	}
	pk, ok := pl.(Picker)
	if !ok {
		return nil, fieldErr("picker", fmt.Sprintf("%q is not a picker", spec.Picker))
	}
	p.Picker = pk
	return p, nil
}

// ProfileFor returns the profile that serves a criticality (unknown values
// are served like Sheddable).
func (s *Scheduler) ProfileFor(c Criticality) *Profile {
	if c < Critical || c > Sheddable {
		c = Sheddable
	}
	return s.byCriticality[c]
}

// Paths lists every Result.Path value this Scheduler can return, without
// duplicates: the fixed Path* constants, then each selected profile's
// paths. The Proxy-Wasm plugin creates one counter per path.
func (s *Scheduler) Paths() []string {
	paths := []string{PathNoEndpoint, PathAllStale, PathLeastLoaded}
	seen := map[string]bool{}
	for _, p := range paths {
		seen[p] = true
	}
	for _, prof := range s.profiles {
		for _, p := range prof.Paths() {
			if !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
		}
	}
	return paths
}

// Schedule picks the endpoint for req from snap with the profile selected
// for req.Criticality, considering only fresh endpoints when StaleAfter is
// set (and failing open when every endpoint is stale and FailOpen is set).
// snap must not change during the call; Result.Endpoint points into it.
func (s *Scheduler) Schedule(req *Request, snap *Snapshot) Result {
	c := &s.cycle
	c.reset(req, snap)
	defer c.reset(nil, nil) // do not keep the caller's request and snapshot alive

	prof := s.ProfileFor(req.Criticality)
	if prof.fast != nil && s.indexed(c, snap, prof.fastFlat) {
		if res, ok := s.fastSchedule(c, prof, snap); ok {
			return res
		}
	}
	if prof.fused != nil {
		if res, ok := prof.fused.schedule(s, c, snap); ok {
			return res
		}
	}
	res := s.collect(c, snap)
	if res.Outcome != Routed {
		return s.failOpenIfStale(snap, res)
	}
	res.Profile = prof.Name
	in, free := s.candidates, 0
	for _, f := range prof.Filters {
		out := f.Filter(c, s.bufs[free][:0], in)
		s.bufs[free] = out[:0]
		in, free = out, free^1
		if c.dropped || len(in) == 0 {
			break
		}
	}
	if !res.settle(c, prof, len(in) > 0) {
		return res
	}
	var scores []float64
	if len(prof.Scorers) > 0 {
		scores = s.score(c, prof, in)
	}
	i := prof.Picker.Pick(c, in, scores)
	if i < 0 || i >= len(in) {
		panic(fmt.Sprintf("scheduler: picker %q returned index %d of %d candidates", prof.Picker.Name(), i, len(in)))
	}
	return chosen(res, snap, in[i])
}

// indexed reports whether the decision on snap uses the index, bringing
// the index up to date if so; flatOK says the decision can also be made
// on the index's values alone (snapIndex.flat).
func (s *Scheduler) indexed(c *Cycle, snap *Snapshot, flatOK bool) bool {
	n := len(snap.Endpoints)
	if s.indexFrom < 0 || n < s.indexFrom || n == 0 {
		return false
	}
	return s.index.sync(snap, c, flatOK)
}

// fastSchedule is Schedule by prof's fast path on the synced index; false
// when the fast path declined this request.
func (s *Scheduler) fastSchedule(c *Cycle, prof *Profile, snap *Snapshot) (Result, bool) {
	x := s.index
	res := Result{Index: -1, Stale: x.nStale}
	if x.nFresh == 0 {
		res.Outcome, res.Path = AllStale, PathAllStale
		return s.failOpenIfStale(snap, res), true
	}
	i := prof.fast.decide(c, x)
	if i == declined {
		return Result{}, false
	}
	x.decisions++
	res.Profile = prof.Name
	if res.settle(c, prof, i >= 0) {
		res.Endpoint, res.Index = &snap.Endpoints[i], i
	}
	return res, true
}

// settle completes res once prof's plugins ran on c: the path they set
// (else the profile's name), and the outcome when the request was dropped
// or nothing was kept. It reports whether an endpoint remains to be
// chosen (res stays Routed).
func (res *Result) settle(c *Cycle, prof *Profile, kept bool) bool {
	res.Path = prof.Name
	if c.path != "" {
		res.Path = c.path
	}
	switch {
	case c.dropped:
		res.Outcome = Dropped
		return false
	case !kept:
		res.Outcome = NoEndpoint
		return false
	}
	return true
}

// chosen completes a Routed res with the endpoint e of snap.
func chosen(res Result, snap *Snapshot, e *Endpoint) Result {
	res.Endpoint, res.Index = e, indexOf(snap, e)
	return res
}

// indexOf is the position of e in snap.Endpoints, where every candidate
// points. It is the pointers' distance divided by the element size,
// checked against the element it names, with a scan as the fallback (taken
// only if a plugin returned an endpoint from elsewhere). The scan alone
// cost a random-profile decision 26% at 512 endpoints and 33% at 64
// (instructions per decision under cachegrind; BENCHMARKS.md), and grows
// with N where the large-N paths are to avoid that.
func indexOf(snap *Snapshot, e *Endpoint) int {
	eps := snap.Endpoints
	if len(eps) > 0 {
		// Only the difference of two addresses is used, never turned back
		// into a pointer.
		off := uintptr(unsafe.Pointer(e)) - uintptr(unsafe.Pointer(&eps[0]))
		if i := off / unsafe.Sizeof(eps[0]); i < uintptr(len(eps)) && &eps[i] == e {
			return int(i)
		}
	}
	for i := range eps {
		if &eps[i] == e {
			return i
		}
	}
	panic("scheduler: a plugin returned an endpoint that is not in the snapshot")
}

// failOpenIfStale applies Options.FailOpen to a decision that found every
// endpoint stale; other results pass unchanged.
func (s *Scheduler) failOpenIfStale(snap *Snapshot, res Result) Result {
	if res.Outcome != AllStale || !s.failOpen {
		return res
	}
	i := s.rand.IntN(len(snap.Endpoints))
	res.Outcome, res.Endpoint, res.Index = FailedOpen, &snap.Endpoints[i], i
	return res
}

// collect fills s.candidates with the fresh endpoints of snap. The
// returned Result is Routed when there is at least one.
func (s *Scheduler) collect(c *Cycle, snap *Snapshot) Result {
	s.candidates = s.candidates[:0]
	res := Result{Index: -1}
	if staleAfter := s.staleAfter; staleAfter <= 0 {
		for i := range snap.Endpoints {
			s.candidates = append(s.candidates, &snap.Endpoints[i])
		}
	} else {
		oldest := c.Now().Add(-staleAfter)
		for i := range snap.Endpoints {
			e := &snap.Endpoints[i]
			if e.Metrics.UpdateTime.Before(oldest) {
				res.Stale++
				continue
			}
			s.candidates = append(s.candidates, e)
		}
	}
	switch {
	case len(snap.Endpoints) == 0:
		res.Outcome, res.Path = NoEndpoint, PathNoEndpoint
	case len(s.candidates) == 0:
		res.Outcome, res.Path = AllStale, PathAllStale
	}
	return res
}

// score fills s.scores with the weighted mean of the profile's scorers.
func (s *Scheduler) score(c *Cycle, prof *Profile, in []*Endpoint) []float64 {
	n := len(in)
	s.scores = growFloats(s.scores, n)
	s.scratch = growFloats(s.scratch, n)
	return scoreInto(c, prof, in, s.scores[:n], s.scratch[:n])
}

// scoreInto writes into total (len(in)) the weighted mean of prof's
// scorers, using one as scratch, and returns total.
func scoreInto(c *Cycle, prof *Profile, in []*Endpoint, total, one []float64) []float64 {
	clear(total)
	for _, ws := range prof.Scorers {
		clear(one)
		ws.Scorer.Score(c, in, one)
		for i, v := range one {
			total[i] += weighted(ws.Weight, v)
		}
	}
	for i := range total {
		total[i] /= prof.weightSum
	}
	return total
}

// weighted is one scorer's share of a score. The conversion keeps the
// product rounded on its own (the compiler may not fuse it with the sum),
// so the scoring fast path, which adds the same shares, gets the same
// bits on every architecture.
func weighted(weight, v float64) float64 { return float64(weight * clamp01(v)) }

func growFloats(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

// Observe records a decision the caller acted on, so that the next
// decisions on the same snapshot take it into account. Call it after
// routing req as Schedule said.
//
// A snapshot is refreshed every few tens of milliseconds; requests arriving
// in between all see the same numbers, and every one of them would go to
// the endpoint that looked least loaded (burst herding). With
// Config.CountRoutedSinceSnapshot on, Observe counts a Routed request as
// waiting at its endpoint until fresh metrics replace the endpoint's
// values: res.Endpoint.Metrics.WaitingQueueSize and RoutedSinceUpdate grow
// by one. Every filter and scorer that reads the waiting queue (and
// LeastLoaded) then sees it.
//
// A request whose target model the endpoint already runs or queues (a LoRA
// adapter it holds) is not counted. LoRA affinity deliberately
// concentrates an adapter's requests where it is loaded: every adapter in a
// batch slows each step and takes a slot, and an adapter that stops getting
// requests on a replica drains from its batch. Counting these requests
// evens the queues of an adapter's replicas and keeps it in every batch,
// which the fleet benchmark measured as slower (e2e/results/TUNING.md).
// Requests for the base model, or placed where their adapter is not yet
// listed, are counted.
//
// Observe updates the snapshot res points into, which must belong to this
// Scheduler (see Snapshot). Off, or when res is not Routed (a FailedOpen
// request is not counted: stale endpoints are not scheduled on), it does
// nothing, so decisions are exactly those without it. It allocates
// nothing. A Scheduler only knows what it routed itself: with one
// Scheduler per Proxy-Wasm VM (one per Envoy worker) each counts its own
// share.
func (s *Scheduler) Observe(req *Request, res Result) {
	if !s.countRouted || res.Outcome != Routed || res.Endpoint == nil {
		return
	}
	m := &res.Endpoint.Metrics
	if req != nil {
		target := req.TargetModel
		if target == "" {
			target = req.Model
		}
		if m.HasActiveModel(target) || m.HasWaitingModel(target) {
			return
		}
	}
	m.WaitingQueueSize++
	m.RoutedSinceUpdate++
	if s.index.covers(res) {
		s.index.update(res.Endpoint, res.Index)
	}
}

// Prepare brings the Scheduler's index of snap up to date outside a
// decision, as far as that needs none: it applies the metric changes
// reported since the last decision (Snapshot.MetricsChanged) when they are
// few enough to apply one by one, which the next decision would do first.
// A snapshot owner that re-reads shared data apart from its requests (the
// plugin's tick) calls it after the re-read, so that work leaves the
// request. It changes no decision, and leaves anything else (a new or
// Changed snapshot, churn) to the next decision, which judges whether a
// rebuild pays. snap must be the snapshot the decisions are made on.
func (s *Scheduler) Prepare(snap *Snapshot) {
	if s.indexFrom < 0 || len(snap.Endpoints) < s.indexFrom {
		return
	}
	s.index.prepare(snap)
}

// IndexRebuilds counts the times the Scheduler rebuilt its snapshot index
// from every endpoint (a new or Changed snapshot, or more metric changes
// than are worth applying one by one): a snapshot's owner that reports
// changes endpoint by endpoint (Snapshot.MetricsChanged) can check it
// causes none.
func (s *Scheduler) IndexRebuilds() int { return s.index.rebuilds }

// CountsRoutedSinceSnapshot reports whether Observe counts routed requests
// (Config.CountRoutedSinceSnapshot with its default applied).
func (s *Scheduler) CountsRoutedSinceSnapshot() bool { return s.countRouted }

// LeastLoaded picks for a request that carries no body to schedule on (GET
// /v1/models): the fresh endpoint with the fewest waiting+running requests,
// then the lowest KV-cache usage, then at random. Its Path is
// PathLeastLoaded; staleness and FailOpen apply as in Schedule.
func (s *Scheduler) LeastLoaded(snap *Snapshot) Result {
	c := &s.cycle
	c.reset(&bodylessRequest, snap)
	defer c.reset(nil, nil)
	if s.indexed(c, snap, true) {
		x := s.index
		res := Result{Index: -1, Stale: x.nStale}
		if x.nFresh == 0 {
			res.Outcome, res.Path = AllStale, PathAllStale
			return s.failOpenIfStale(snap, res)
		}
		i := x.leastLoaded(c, s.leastLoadedBy)
		res.Path, res.Endpoint, res.Index = PathLeastLoaded, &snap.Endpoints[i], i
		return res
	}
	res := s.collect(c, snap)
	if res.Outcome != Routed {
		return s.failOpenIfStale(snap, res)
	}
	res.Path = PathLeastLoaded
	better := func(a, b *Endpoint) int { // <0 when a is less loaded
		if d := outstanding(a) - outstanding(b); d != 0 {
			return d
		}
		switch ka, kb := kvUsage(a), kvUsage(b); {
		case ka < kb:
			return -1
		case ka > kb:
			return 1
		}
		return 0
	}
	best, ties := s.candidates[0], 1
	for _, e := range s.candidates[1:] {
		switch d := better(e, best); {
		case d < 0:
			best, ties = e, 1
		case d == 0:
			ties++
		}
	}
	if ties > 1 {
		k := s.rand.IntN(ties)
		for _, e := range s.candidates {
			if better(e, best) == 0 {
				if k == 0 {
					best = e
					break
				}
				k--
			}
		}
	}
	return chosen(res, snap, best)
}

// bodylessRequest stands in for the request of a LeastLoaded decision; it
// is never modified.
var bodylessRequest Request
