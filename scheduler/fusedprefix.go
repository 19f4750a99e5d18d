package scheduler

import "math"

// The fused prefix-aware path: the profile [shed-filter,]
// prefix-affinity-filter, scorers of the five kinds (scoreSpec), max-score
// picker (the built-in "prefix-aware") decided, whenever the index's fast
// path does not (below the index's size, and above it on a look the index
// declines: a new snapshot, churn, values it does not order), in a few
// loops over each fresh endpoint's plain values instead of the
// plugins' interface calls per endpoint and scorer. The general path made
// a 4 KiB prefix-aware request's decision at 8 endpoints cost about 42k
// host instructions in the Wasm guest, where a trivial call costs about
// 100 (BENCHMARKS.md, "Prefix-aware routing: cost per request").
//
// Above the index's size this is the decision under metric churn (the
// scale bench's, at the knee): at 1,000 endpoints about 0.9M guest
// instructions for the plugins, 1.2M for the first version of this path
// (a call and a switch per candidate and scorer, calls in the pass), 0.7M
// now (BENCHMARKS.md, "The prefix-aware decision under churn").
//
// It decides exactly as the plugins do: the same candidates, filter
// steps, reuse share, scores (the same shares added in the same order),
// pick and random draws. TestFusedPrefixAwareEqualsScanned checks it
// against the plugins over random snapshots and prompts of up to 40
// endpoints with the index off, TestPrefixAwareUnderChurnEqualsScanned
// above the index's size under relays that rewrite most endpoints, where
// indexed and fused decisions interleave on one filter's reuse share and
// one prefix index.
// Request.Prefix must be nil or a *PrefixTracker prepared on the snapshot
// being scheduled; anything else goes to the plugins.

// fusedCand is one fresh endpoint's values, as the plugins read them.
type fusedCand struct {
	pos     int32 // in Snapshot.Endpoints
	narrow  uint8 // fusedCap etc.: the affinity filter's tests
	w, r    int   // waiting (with what Observe added) and running
	kv      float64
	matched int // the prompt's blocks it holds (MatchedBlocks)
}

// Bits of fusedCand.narrow: the consistent choice's narrowing steps.
const (
	fusedCap    uint8 = 1 << iota // the affinity filter's capacity
	fusedUnder                    // outstanding below the bound
	fusedActive                   // runs the target adapter
	fusedFree                     // has a free adapter slot
)

type fusedPrefix struct {
	prof *Profile
	shed *ShedFilter // nil: no shed-filter in front
	f    *PrefixAffinityFilter
	spec *scoreSpec

	cands   []fusedCand
	fresh   []uint8 // freshFlags' result
	holders []int32 // indexes into cands of those holding some of the prompt
	sel     []int32 // indexes into cands
	scores  []float64
	ids     []uint32
	loads   []int

	decisions int // the decisions made here (tests)
}

// newFusedPrefix returns p's fused path, or nil when p is not of its
// shape (or has no scorers: the picker would then draw for any number of
// candidates, which the fused path does not reproduce).
func newFusedPrefix(p *Profile) *fusedPrefix {
	sh, f, spec := prefixProfile(p)
	if f == nil || len(p.Scorers) == 0 {
		return nil
	}
	return &fusedPrefix{prof: p, shed: sh, f: f, spec: spec}
}

// schedule is Scheduler.Schedule for fp's profile without the index;
// false (before anything is drawn or set) when the plugins must decide.
func (fp *fusedPrefix) schedule(s *Scheduler, c *Cycle, snap *Snapshot) (Result, bool) {
	req := c.Request
	t, ok := req.Prefix.(*PrefixTracker)
	switch {
	case req.Prefix != nil && (!ok || t == nil):
		return Result{}, false
	case t != nil && len(t.blocks) == 0:
		t = nil // no prompt: the plugins stand aside as for no information
	case t != nil && !t.preparedOn(snap):
		return Result{}, false
	}

	fp.decisions++
	// One pass over the snapshot: the fresh endpoints (as
	// Scheduler.collect lists them), those the shed-filter keeps, their
	// matches, and what the affinity filter sums over them.
	res := Result{Index: -1}
	staleness := s.staleAfter > 0
	shedding := fp.shed != nil && req.shed()
	shedQ, shedKV := math.MaxInt, math.Inf(1)
	if shedding {
		shedQ, shedKV = fp.shed.QueueThreshold, fp.shed.KVCacheThreshold
	}
	f := fp.f
	capQ, capKV := f.QueueThreshold, f.KVCacheThreshold
	matches := 0
	if t != nil {
		matches = t.match.Len()
	}
	// The freshness of every endpoint first, then the pass: in the Go
	// guest a call inside a loop (Before, append's growth) makes every
	// value the loop keeps go through memory at each turn, so the pass
	// has none (the matches' search and its appends come after it). cands
	// has room for every endpoint, so each is written in place.
	eps := snap.Endpoints
	var fresh []uint8
	stale := 0
	if staleness {
		if cap(fp.fresh) < len(eps) {
			fp.fresh = make([]uint8, len(eps))
		}
		fresh = fp.fresh[:len(eps)]
		fa := newFreshAt(c.Now().Add(-s.staleAfter)) // as the index's flat read compares (fastflat.go)
		stale = freshFlags(eps, &fa, fresh)
	}
	if cap(fp.cands) < len(eps) {
		fp.cands = make([]fusedCand, len(eps))
	}
	cands, holders := fp.cands[:len(eps)], fp.holders[:0]
	k, total, seen, pool := 0, 0, 0, 0
	for i := range eps {
		m := &eps[i].Metrics
		if staleness && fresh[i] == 0 {
			continue
		}
		kv := kvValue(m.KVCacheUsage)
		w := m.WaitingQueueSize
		if w > shedQ || kv > shedKV {
			continue // shed-filter
		}
		e := &cands[k]
		r := m.RunningQueueSize
		e.pos, e.w, e.r, e.kv, e.matched, e.narrow = int32(i), w, r, kv, 0, 0
		if w <= capQ && kv <= capKV {
			e.narrow = fusedCap
			pool++
		}
		total += w + r
		k++
	}
	cands = cands[:k]
	if matches > 0 {
		for ci := range cands {
			e := &cands[ci]
			for j := range matches { // Match.Blocks: the key's first listing
				if key, blocks := t.match.At(j); key == t.keys[e.pos] {
					if blocks > 0 {
						e.matched = blocks
						seen = max(seen, blocks)
						holders = append(holders, int32(ci))
					}
					break
				}
			}
		}
	}
	res.Stale = stale
	nFresh := len(eps) - stale
	fp.cands, fp.holders = cands, holders
	switch {
	case len(snap.Endpoints) == 0:
		res.Outcome, res.Path = NoEndpoint, PathNoEndpoint
		return res, true
	case nFresh == 0:
		res.Outcome, res.Path = AllStale, PathAllStale
		return s.failOpenIfStale(snap, res), true
	}
	prof := fp.prof
	res.Profile = prof.Name
	if len(cands) == 0 {
		c.Drop() // shed-filter: nothing has capacity
		res.settle(c, prof, false)
		return res, true
	}
	sel := fp.affinity(c, t, cands, holders, total, seen, pool)
	res.settle(c, prof, true)
	i := cands[sel[0]].pos
	if len(sel) > 1 {
		i = cands[sel[fp.pick(c, t, cands, sel)]].pos
	}
	res.Endpoint, res.Index = &snap.Endpoints[i], int(i)
	return res, true
}

// preparedOn reports whether Prepare last ran on snap as it is now (its
// keys are then snap's endpoints', by position).
func (t *PrefixTracker) preparedOn(snap *Snapshot) bool {
	return t.snap == snap && t.n == len(snap.Endpoints) && (t.n == 0 || t.first == &snap.Endpoints[0])
}

// affinity is PrefixAffinityFilter.Filter over cands (not empty), given
// the indexes of those holding part of the prompt, their outstanding
// requests' total, the best match and how many have the filter's
// capacity: the indexes of those it keeps, in order (one for a
// consistent choice).
func (fp *fusedPrefix) affinity(c *Cycle, t *PrefixTracker, cands []fusedCand, holders []int32, total, seen, pool int) []int32 {
	f := fp.f
	if t == nil {
		c.SetPath(PathPrefixNone)
		return fp.all(cands, 0)
	}
	minMatch := max(f.MinMatchBlocks, 1)
	f.observe(seen >= minMatch)
	if seen < minMatch && f.ConsistentHashing && f.Reuse() < f.MinReuse {
		c.SetPath(PathPrefixUnshared)
		return fp.all(cands, 0)
	}
	if pool == 0 {
		c.SetPath(PathPrefixSaturated)
		return fp.all(cands, 0)
	}
	bound := max(f.MinCapacity, int(math.Ceil(f.BalanceFactor*float64(total+1)/float64(len(cands)))))
	best := 0
	for _, i := range holders {
		if e := &cands[i]; e.narrow&fusedCap != 0 && e.w+e.r < bound {
			best = max(best, e.matched)
		}
	}
	if best >= minMatch {
		c.SetPath(PathPrefixAffinity)
		keep := int(math.Ceil(f.KeepRatio * float64(best)))
		sel := fp.sel[:0]
		for _, i := range holders {
			if e := &cands[i]; e.narrow&fusedCap != 0 && e.w+e.r < bound && e.matched >= keep {
				sel = append(sel, i)
			}
		}
		fp.sel = sel
		return sel
	}
	c.SetPath(PathPrefixConsistent)
	sel := fp.all(cands, fusedCap)
	if !f.ConsistentHashing || len(sel) == 1 {
		return sel
	}
	// A new prefix: the filter's narrowing steps, then its rendezvous.
	target := c.TargetModel()
	for _, i := range sel {
		e := &cands[i]
		m := &c.Snapshot.Endpoints[e.pos].Metrics
		if e.w+e.r < bound {
			e.narrow |= fusedUnder
		}
		if m.HasActiveModel(target) {
			e.narrow |= fusedActive
		}
		if m.MaxActiveModels > 0 && len(m.ActiveModels)+len(m.WaitingModels) < m.MaxActiveModels {
			e.narrow |= fusedFree
		}
	}
	for _, bit := range [...]uint8{fusedUnder, fusedActive, fusedFree} {
		sel = narrowFused(cands, sel, bit)
	}
	ids, loads := fp.ids[:0], fp.loads[:0]
	for _, i := range sel {
		ids = append(ids, t.keys[cands[i].pos])
		loads = append(loads, cands[i].w+cands[i].r)
	}
	fp.ids, fp.loads = ids, loads
	f.rz.Factor, f.rz.MinCapacity = f.BalanceFactor, f.MinCapacity
	sel[0] = sel[f.rz.Pick(t.key, ids, loads)]
	return sel[:1]
}

// all lists the candidates with every bit of need (0: all of them).
func (fp *fusedPrefix) all(cands []fusedCand, need uint8) []int32 {
	sel := fp.sel[:0]
	for i := range cands {
		if cands[i].narrow&need == need {
			sel = append(sel, int32(i))
		}
	}
	fp.sel = sel
	return sel
}

// narrowFused is narrow over sel: those with bit, unless none or all.
func narrowFused(cands []fusedCand, sel []int32, bit uint8) []int32 {
	n := 0
	for _, i := range sel {
		if cands[i].narrow&bit != 0 {
			n++
		}
	}
	if n == 0 || n == len(sel) {
		return sel
	}
	k := 0
	for _, i := range sel {
		if cands[i].narrow&bit != 0 {
			sel[k] = i
			k++
		}
	}
	return sel[:k]
}

// pick is the profile's scorers and MaxScorePicker over sel (more than
// one): the index in sel of the choice. It adds the scorers' shares term
// by term over every candidate, in the profile's order, so each score
// gets the same additions in the same order as scoreSpec.score makes
// them (and the plugins, scorer by scorer), in one loop per term without
// scoreSpec.score's call and switch per candidate and term: with many
// candidates (no prompt, a prompt nobody holds, a saturated pool) those
// cost the guest more than the plugins' loops did (BENCHMARKS.md, "The
// prefix-aware decision under churn").
func (fp *fusedPrefix) pick(c *Cycle, t *PrefixTracker, cands []fusedCand, sel []int32) int {
	nu := norm{loQ: math.MaxInt, hiQ: math.MinInt, loR: math.MaxInt, hiR: math.MinInt}
	for _, i := range sel {
		e := &cands[i]
		nu.loQ, nu.hiQ = min(nu.loQ, e.w), max(nu.hiQ, e.w)
		nu.loR, nu.hiR = min(nu.loR, e.r), max(nu.hiR, e.r)
	}
	target := c.TargetModel()
	eps := c.Snapshot.Endpoints
	scores := growFloats(fp.scores, len(sel))
	fp.scores = scores
	clear(scores)
	for _, term := range fp.spec.terms {
		wt := term.weight
		switch term.kind {
		case scoreLoRA:
			for k, i := range sel {
				scores[k] += weighted(wt, loraAffinityScore(&eps[cands[i].pos].Metrics, target))
			}
		case scoreQueue:
			for k, i := range sel {
				scores[k] += weighted(wt, minMaxValue(cands[i].w, nu.loQ, nu.hiQ))
			}
		case scoreKV:
			for k, i := range sel {
				scores[k] += weighted(wt, 1-cands[i].kv)
			}
		case scoreRunning:
			for k, i := range sel {
				scores[k] += weighted(wt, minMaxValue(cands[i].r, nu.loR, nu.hiR))
			}
		case scorePrefix:
			if t == nil {
				// The scorer gives 0: weighted(wt, 0) is +0 for the finite
				// positive weights every profile has (config.go), and adding
				// +0 leaves a score as it is (none is -0: they start at +0).
				continue
			}
			blocks := float64(len(t.blocks))
			for k, i := range sel {
				scores[k] += weighted(wt, float64(cands[i].matched)/blocks)
			}
		}
	}
	for k := range scores {
		scores[k] /= fp.spec.weightSum
	}
	return maxScoreIndex(c, scores)
}
