package scheduler

import (
	"math"
	"time"
)

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
// It decides exactly as the plugins do: the same candidates, filter
// steps, reuse share, scores (scoreSpec.score adds the same shares in the
// same order), pick and random draws; TestFusedPrefixAwareEqualsScanned
// checks it against the plugins over random snapshots and prompts of up
// to 40 endpoints with the index off; above the index's size, where
// indexed and fused decisions interleave on one filter's reuse share,
// nothing checks it yet.
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
	holders []int32 // indexes into cands of those holding some of the prompt
	sel     []int32 // indexes into cands
	scores  []float64
	ids     []uint32
	loads   []int
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

	// One pass over the snapshot: the fresh endpoints (as
	// Scheduler.collect lists them), those the shed-filter keeps, their
	// matches, and what the affinity filter sums over them.
	res := Result{Index: -1}
	var oldest time.Time
	staleness := s.staleAfter > 0
	if staleness {
		oldest = c.Now().Add(-s.staleAfter)
	}
	// Fresh is not Before(oldest), compared as the index's flat read does
	// (fastflat.go): without a monotonic reading in oldest, seconds then
	// nanoseconds, which in the guest costs less than Before's call.
	wall := oldest == oldest.Round(0)
	osec, onsec := oldest.Unix(), oldest.Nanosecond()
	shedding := fp.shed != nil && req.shed()
	f := fp.f
	matches := 0
	if t != nil {
		matches = t.match.Len()
	}
	cands, holders := fp.cands[:0], fp.holders[:0]
	nFresh, total, seen, pool := 0, 0, 0, 0
	for i := range snap.Endpoints {
		m := &snap.Endpoints[i].Metrics
		if staleness {
			fresh := 0
			if wall {
				sec := m.UpdateTime.Unix()
				fresh = one(sec > osec) | one(sec == osec)&one(m.UpdateTime.Nanosecond() >= onsec)
			} else {
				fresh = one(!m.UpdateTime.Before(oldest))
			}
			if fresh == 0 {
				res.Stale++
				continue
			}
		}
		nFresh++
		kv := m.KVCacheUsage
		if math.IsNaN(kv) {
			kv = 1 // kvUsage
		}
		w := m.WaitingQueueSize
		if shedding && (w > fp.shed.QueueThreshold || kv > fp.shed.KVCacheThreshold) {
			continue
		}
		e := fusedCand{pos: int32(i), w: w, r: m.RunningQueueSize, kv: kv}
		for j := range matches { // Match.Blocks: the key's first listing
			if k, blocks := t.match.At(j); k == t.keys[i] {
				e.matched = blocks
				break
			}
		}
		if w <= f.QueueThreshold && kv <= f.KVCacheThreshold {
			e.narrow = fusedCap
			pool++
		}
		total += w + e.r
		seen = max(seen, e.matched)
		if e.matched > 0 {
			holders = append(holders, int32(len(cands)))
		}
		cands = append(cands, e)
	}
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
// one): the index in sel of the choice.
func (fp *fusedPrefix) pick(c *Cycle, t *PrefixTracker, cands []fusedCand, sel []int32) int {
	nu := norm{loQ: math.MaxInt, hiQ: math.MinInt, loR: math.MaxInt, hiR: math.MinInt}
	for _, i := range sel {
		e := &cands[i]
		nu.loQ, nu.hiQ = min(nu.loQ, e.w), max(nu.hiQ, e.w)
		nu.loR, nu.hiR = min(nu.loR, e.r), max(nu.hiR, e.r)
	}
	target := c.TargetModel()
	scores := growFloats(fp.scores, len(sel))
	fp.scores = scores
	for k, i := range sel {
		e := &cands[i]
		lora, share := 0.0, 0.0
		if fp.spec.lora {
			lora = loraAffinityScore(&c.Snapshot.Endpoints[e.pos].Metrics, target)
		}
		if t != nil {
			share = float64(e.matched) / float64(len(t.blocks))
		}
		scores[k] = fp.spec.score(&nu, indexed{w: e.w, r: e.r, kv: e.kv}, lora, share)
	}
	return maxScoreIndex(c, scores)
}
