package scheduler

import (
	"math"
	"slices"
)

// The scoring fast path: a profile of weighted queue, KV-cache, LoRA
// affinity and running-requests scorers and a max-score picker (the
// built-in "scoring"), with or without a shed-filter in front, decided
// from the index with the scan's exact scores and tie-break.
//
// Only two things make one endpoint's score differ from another's beyond
// its own values: the queue and running scorers' min-max normalisation
// over the candidates (norm), and the LoRA scorer's target adapter. For a
// given norm every endpoint that does not hold the target scores what its
// values and free slot say (defaultScore), so the index keeps the
// candidates sorted by that score (a keyScore order, re-sorted when the
// norm moves). A decision computes the exact score of the target's
// holders, takes the best of them and of the first non-holder in the
// order, and picks among the ties in snapshot order as MaxScorePicker
// does. Cost: O(log N + holders of the target).

// scoreSpec is a profile's scorers as the fast path computes them.
type scoreSpec struct {
	terms     []scoreTerm
	weightSum float64
	lora      bool // a LoRA affinity scorer is among them
	running   bool // a running-requests scorer is among them
	prefix    bool // a prefix-cache scorer is among them
}

type scoreTerm struct {
	kind   scorerKind
	weight float64
}

type scorerKind uint8

const (
	scoreLoRA scorerKind = iota
	scoreQueue
	scoreKV
	scoreRunning
	scorePrefix
)

// norm is the candidates' range of waiting queues and running batches.
type norm struct{ loQ, hiQ, loR, hiR int }

// newScoreSpec returns p's scorers as a spec, or nil when one of them is
// not a kind the fast path computes.
func newScoreSpec(p *Profile) *scoreSpec {
	sp := &scoreSpec{weightSum: p.weightSum}
	for _, ws := range p.Scorers {
		var k scorerKind
		switch ws.Scorer.(type) {
		case *LoRAAffinityScorer:
			k, sp.lora = scoreLoRA, true
		case *QueueScorer:
			k = scoreQueue
		case *KVCacheScorer:
			k = scoreKV
		case *RunningRequestsScorer:
			k, sp.running = scoreRunning, true
		case *PrefixCacheScorer:
			k, sp.prefix = scorePrefix, true
		default:
			return nil
		}
		sp.terms = append(sp.terms, scoreTerm{k, ws.Weight})
	}
	return sp
}

// score is Scheduler.score's weighted mean for one endpoint, operation for
// operation (so the float result is the same); lora and prefix are the
// LoRA affinity and prefix-cache scorers' values for it.
func (sp *scoreSpec) score(nu *norm, v indexed, lora, prefix float64) float64 {
	total := 0.0
	for _, t := range sp.terms {
		var s float64
		switch t.kind {
		case scoreLoRA:
			s = lora
		case scoreQueue:
			s = minMaxValue(v.w, nu.loQ, nu.hiQ)
		case scoreKV:
			s = 1 - v.kv
		case scoreRunning:
			s = minMaxValue(v.r, nu.loR, nu.hiR)
		case scorePrefix:
			s = prefix
		}
		total += weighted(t.weight, s)
	}
	return total / sp.weightSum
}

// minMaxValue is minMaxInverse's value for one endpoint.
func minMaxValue(v, lo, hi int) float64 {
	if hi == lo {
		return 1
	}
	return float64(hi-v) / float64(hi-lo)
}

// defaultScore is the score of an endpoint that holds neither the target
// adapter nor any of the prompt: the LoRA scorer gives it the free-slot
// score or nothing, the prefix-cache scorer nothing.
func (sp *scoreSpec) defaultScore(nu *norm, v indexed) float64 {
	lora := 0.0
	if v.flags&flagFree != 0 {
		lora = LoRAScoreFreeSlot
	}
	return sp.score(nu, v, lora, 0)
}

// scoreEntry orders scores highest first, then by position.
func scoreEntry(score float64, i int) entry { return entry{0, int32(i), ^kvKey(score)} }

// scoreClass is one candidate class's orders for a scoring spec: the
// (waiting, KV) order (the queue range, and membership), the running order
// (the running range, when a running scorer needs it) and the score order.
type scoreClass struct{ load, run, score int }

func newScoreClass(x *snapIndex, spec *scoreSpec, cap int) scoreClass {
	cl := scoreClass{load: x.orderOf(keyLoad, cap, false), score: x.scoreOrderOf(cap, spec)}
	if spec.running {
		cl.run = x.orderOf(keyRunning, cap, false)
	}
	return cl
}

// norm reads the class's normalisation off its orders, which must not be
// empty, and brings the score order to it.
func (cl scoreClass) norm(x *snapIndex, spec *scoreSpec) norm {
	load := x.ord(cl.load).es
	nu := norm{loQ: x.w[load[0].i], hiQ: x.w[load[len(load)-1].i]}
	if spec.running {
		run := x.ord(cl.run).es
		nu.loR, nu.hiR = x.r[run[0].i], x.r[run[len(run)-1].i]
	}
	if so := &x.orders[cl.score]; so.nu != nu {
		so.nu, so.built = nu, false // every default score moved
	}
	return nu
}

// holderScore is a candidate whose score differs from its default (it
// holds the target adapter, or the prompt's prefix), and that score.
type holderScore struct {
	i     int32
	score float64
}

// scorePick is what a profile's scorers and MaxScorePicker choose among a
// class's members: the best of the specials' exact scores and of the
// first non-special in score order, then the k-th tie in snapshot order.
type scorePick struct {
	ex     []holderScore // specials inside the best non-special run
	posBuf []int32
}

// pick chooses among cl's members (not empty); hs are the specials in
// ascending position with their exact scores.
func (sp *scorePick) pick(c *Cycle, x *snapIndex, cl scoreClass, hs []holderScore) int {
	so := &x.orders[cl.score]
	es := x.ord(cl.score).es
	var mark uint32
	if len(hs) > 0 {
		pos := slices.Grow(sp.posBuf[:0], len(hs))
		for _, h := range hs {
			pos = append(pos, h.i)
		}
		sp.posBuf = pos
		mark = x.markAll(pos)
	}
	best := math.Inf(-1)
	for _, h := range hs {
		best = max(best, h.score)
	}
	p := 0
	for p < len(es) && mark != 0 && x.marks[es[p].i] == mark {
		p++
	}
	run0, run1 := 0, 0 // the non-specials' run of the best score, in es
	if p < len(es) {
		if d := entryScore(es[p]); d >= best {
			best = d
			run0 = es.search(entry{0, math.MinInt32, es[p].b})
			run1 = es.searchAfter(entry{0, math.MaxInt32, es[p].b})
		}
	}
	// Specials inside the run do not count there (their own score does).
	ex := sp.ex[:0]
	ties := run1 - run0
	if run1 > run0 {
		for _, h := range hs {
			if so.keyOf(x.values(int(h.i)), int(h.i)).b == es[run0].b {
				ex = append(ex, h)
				ties--
			}
		}
	}
	sp.ex = ex
	for _, h := range hs {
		if h.score == best {
			ties++
		}
	}
	k := 0
	if ties > 1 {
		k = c.Rand.IntN(ties)
	}
	return nthTie(es, run0, run1, ex, hs, best, k)
}

// loraScore is the LoRA affinity scorer's value for endpoint i, a holder
// of adapter a.
func (x *snapIndex) loraScore(c *Cycle, i, a int32) float64 {
	switch {
	case x.runs(c, i, a):
		return LoRAScoreActive
	case x.flags[i]&flagFree != 0:
		return LoRAScoreFreeSlot
	}
	return LoRAScoreWaiting // it lists the adapter, not as active
}

// runs reports whether endpoint i, a holder of adapter a, lists a among
// its active adapters (Metrics.HasActiveModel, by id: the name's first
// listing is the one counted as a, and active adapters are listed
// first).
func (x *snapIndex) runs(c *Cycle, i, a int32) bool {
	na := len(c.Snapshot.Endpoints[i].Metrics.ActiveModels)
	for k, r := range x.ads[i] {
		if r.id == a {
			return k < na
		}
	}
	return false
}

// fastScoring decides a scoring profile on the index.
type fastScoring struct {
	spec *scoreSpec
	// Per candidate class (0: every fresh endpoint; 1: those with the
	// shed-filter's capacity).
	classes [2]scoreClass
	shed    bool

	hs []holderScore
	scorePick
}

func newFastScoring(p *Profile, x *snapIndex) *fastScoring {
	spec := newScoreSpec(p)
	if spec == nil || spec.prefix {
		return nil
	}
	f := &fastScoring{spec: spec}
	switch len(p.Filters) {
	case 0:
	case 1:
		sh, ok := p.Filters[0].(*ShedFilter)
		if !ok {
			return nil
		}
		f.shed = true
		f.classes[1] = newScoreClass(x, spec, x.capacityClass(sh.QueueThreshold, sh.KVCacheThreshold))
	default:
		return nil
	}
	f.classes[0] = newScoreClass(x, spec, -1)
	return f
}

func (f *fastScoring) decide(c *Cycle, x *snapIndex) int {
	cl := f.classes[0]
	if f.shed && c.Request.shed() {
		cl = f.classes[1]
	}
	if len(x.ord(cl.load).es) == 0 {
		c.Drop() // shed-filter: nothing has capacity
		return -1
	}
	nu := cl.norm(x, f.spec)
	// The target's holders among the candidates, with their exact score.
	hs := f.hs[:0]
	if f.spec.lora {
		target := c.TargetModel()
		if a := x.adapter(target); a >= 0 {
			cand := &x.orders[cl.load]
			for _, h := range x.holders[a] {
				if x.member(cand, int(h)) {
					hs = append(hs, holderScore{h, f.spec.score(&nu, x.values(int(h)), x.loraScore(c, h, a), 0)})
				}
			}
		}
	}
	f.hs = hs
	return f.pick(c, x, cl, hs)
}

// nthTie returns the position of the k-th tie in snapshot order: the
// ties are the run es[run0:run1] (one score, so in position order) less
// the holders ex in it, and the holders hs scoring best.
func nthTie(es sortedEntries, run0, run1 int, ex, hs []holderScore, best float64, k int) int {
	cur, e := run0, 0
	var b uint64
	if run1 > run0 {
		b = es[run0].b
	}
	for _, h := range hs { // ascending positions
		inRun := e < len(ex) && ex[e].i == h.i
		tie := h.score == best
		if !inRun && !tie {
			continue
		}
		end := cur
		if run1 > run0 {
			end = max(cur, es[run0:run1].search(entry{0, h.i, b})+run0)
		}
		if seg := end - cur; k < seg {
			return int(es[cur+k].i)
		} else {
			k -= seg
		}
		cur = end
		if inRun {
			e++
			cur++ // the holder's own place in the run
		}
		if tie {
			if k == 0 {
				return int(h.i)
			}
			k--
		}
	}
	return int(es[cur+k].i)
}

// entryScore is the score a keyScore entry was made from.
func entryScore(e entry) float64 {
	return math.Float64frombits(^e.b &^ (1 << 63))
}
