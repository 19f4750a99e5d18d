package scheduler

import (
	"math"
	"slices"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// The prefix-aware fast path: [shed-filter,] prefix-affinity-filter,
// scorers of the five kinds, max-score picker (the built-in
// "prefix-aware"), decided from the index exactly as the plugins decide.
//
// The filter's sums and pools are read off orders (the candidates'
// outstanding requests, the pool of those with the filter's capacity, its
// members under the bound, those with a free slot), the prompt's matches
// come from the tracker's match list by position, and:
//   - affinity: the holders kept are listed from the matches, and the
//     profile's own scorers and picker run on that list;
//   - a new prefix: the consistent choice ranks the pool's members by
//     prefix.Weight in one pass over the pool (O(pool), the one step that
//     still visits many endpoints: rendezvous hashing weighs every
//     endpoint it may choose);
//   - no prompt, a saturated pool, or a prompt nobody holds where prompts
//     are rarely reused (the filter's reuse share, updated here as the
//     scan updates it): the scoring fast path over all the candidates,
//     the target's holders and the prompt's holders scored exactly.
//
// Request.Prefix must be a *PrefixTracker prepared on the snapshot being
// scheduled; any other PrefixInfo makes the decision scan.

// prefixMatch is one endpoint holding part of the prompt.
type prefixMatch struct {
	i      int32
	blocks int
}

// keyPos maps an endpoint key to a snapshot position.
type keyPos struct {
	key uint32
	i   int32
}

type fastPrefix struct {
	prof *Profile
	f    *PrefixAffinityFilter
	spec *scoreSpec
	shed bool
	// Per candidate class (0: every fresh endpoint; 1: those with the
	// shed-filter's capacity): the candidates C, the filter's pool P (C
	// with the filter's capacity too), and P by outstanding requests, all
	// of it and free-slot only.
	cands, pools [2]scoreClass
	poolOut      [2][2]int

	byKey    []keyPos // the tracker's keys by key, for the snapshot below
	byKeyFor struct {
		t    *PrefixTracker
		read uint64 // t.keysRead
	}
	matches []prefixMatch
	hs      []holderScore
	list    []*Endpoint
	active  []int32
	scores  []float64
	scratch []float64
	scorePick
}

// prefixProfile recognises the prefix-aware shape: [shed-filter,]
// prefix-affinity-filter, scorers of the kinds scoreSpec computes,
// max-score picker. f is nil when p is not of it.
func prefixProfile(p *Profile) (sh *ShedFilter, f *PrefixAffinityFilter, spec *scoreSpec) {
	if _, ok := p.Picker.(*MaxScorePicker); !ok {
		return nil, nil, nil
	}
	if spec = newScoreSpec(p); spec == nil {
		return nil, nil, nil
	}
	filters := p.Filters
	if len(filters) == 2 {
		var ok bool
		if sh, ok = filters[0].(*ShedFilter); !ok {
			return nil, nil, nil
		}
		filters = filters[1:]
	}
	if len(filters) != 1 {
		return nil, nil, nil
	}
	if f, _ = filters[0].(*PrefixAffinityFilter); f == nil {
		return nil, nil, nil
	}
	// Both fast paths look only at endpoints holding the prompt, which is
	// the filter's result only for a ratio in (0, 1] (the registry's
	// range); a filter built in Go with another goes to the plugins.
	if !(f.KeepRatio > 0 && f.KeepRatio <= 1) {
		return nil, nil, nil
	}
	return sh, f, spec
}

// declined is a fast path's answer when it cannot decide this request
// (before it has drawn or set anything): the Scheduler scans instead.
const declined = -2

func newFastPrefix(p *Profile, x *snapIndex) *fastPrefix {
	sh, f, spec := prefixProfile(p)
	if f == nil {
		return nil
	}
	fp := &fastPrefix{prof: p, spec: spec, f: f, shed: sh != nil}
	shedCap := -1
	if sh != nil {
		shedCap = x.capacityClass(sh.QueueThreshold, sh.KVCacheThreshold)
	}
	for k, c := range []int{-1, shedCap} {
		if k == 1 && !fp.shed {
			break
		}
		fp.cands[k] = newScoreClass(x, spec, c)
		q, kv := f.QueueThreshold, f.KVCacheThreshold
		if c >= 0 {
			q, kv = min(q, x.caps[c].queue), min(kv, x.caps[c].kv)
		}
		pc := x.capacityClass(q, kv)
		fp.pools[k] = newScoreClass(x, spec, pc)
		fp.poolOut[k] = [2]int{x.orderOf(keyOutstanding, pc, false), x.orderOf(keyOutstanding, pc, true)}
	}
	return fp
}

func (fp *fastPrefix) decide(c *Cycle, x *snapIndex) int {
	k := 0
	if fp.shed && c.Request.shed() {
		k = 1
	}
	info := c.Request.Prefix
	var t *PrefixTracker
	if info != nil && info.PromptBlocks() > 0 {
		var ok bool
		if t, ok = info.(*PrefixTracker); !ok || !fp.matchesIn(t, c.Snapshot) {
			return declined
		}
	}
	cands := x.ord(fp.cands[k].load)
	if len(cands.es) == 0 {
		c.Drop() // shed-filter: nothing has capacity
		return -1
	}
	if t == nil {
		c.SetPath(PathPrefixNone)
		fp.matches = fp.matches[:0]
		return fp.scored(c, x, fp.cands[k], 0)
	}
	f := fp.f
	// The filter's running reuse share counts every prompt, as the scan
	// does, before any outcome.
	seen := 0
	for _, m := range fp.matches {
		if x.member(cands, int(m.i)) {
			seen = max(seen, m.blocks)
		}
	}
	minMatch := max(f.MinMatchBlocks, 1)
	f.observe(seen >= minMatch)
	if seen < minMatch && f.ConsistentHashing && f.Reuse() < f.MinReuse {
		c.SetPath(PathPrefixUnshared)
		return fp.scored(c, x, fp.cands[k], t.PromptBlocks())
	}
	bound := max(f.MinCapacity, int(math.Ceil(f.BalanceFactor*float64(cands.sum+1)/float64(len(cands.es)))))
	pool := x.ord(fp.pools[k].load)
	best := 0
	for _, m := range fp.matches {
		if x.member(pool, int(m.i)) && x.w[m.i]+x.r[m.i] < bound {
			best = max(best, m.blocks)
		}
	}
	if len(pool.es) == 0 {
		c.SetPath(PathPrefixSaturated)
		return fp.scored(c, x, fp.cands[k], t.PromptBlocks())
	}
	if best >= minMatch {
		c.SetPath(PathPrefixAffinity)
		keep := int(math.Ceil(f.KeepRatio * float64(best)))
		list := fp.list[:0]
		for _, m := range fp.matches {
			if x.member(pool, int(m.i)) && x.w[m.i]+x.r[m.i] < bound && m.blocks >= keep {
				list = append(list, x.endpoint(c, m.i))
			}
		}
		fp.list = list
		return fp.scoreList(c, x, list)
	}
	c.SetPath(PathPrefixConsistent)
	if len(pool.es) == 1 {
		return int(pool.es[0].i)
	}
	if !f.ConsistentHashing {
		return fp.scored(c, x, fp.pools[k], t.PromptBlocks())
	}
	return fp.consistent(c, x, k, t, bound)
}

// consistent is the filter's choice for a new prefix: the pool's members
// under the bound, those running the target adapter (else those with a
// free slot), each narrowing applied only when it keeps some and leaves
// some, then the rendezvous choice among them.
func (fp *fastPrefix) consistent(c *Cycle, x *snapIndex, k int, t *PrefixTracker, bound int) int {
	out := x.ord(fp.poolOut[k][0]).es
	end := len(out)
	limit := maxEntry                    // the outstanding bound applied, as an entry
	bound = min(bound, 2*badMagnitude+1) // every indexed endpoint's outstanding is below it
	if under := out.search(keyFrom(wKey(bound))); under > 0 && under < end {
		end, limit = under, keyAbove(wKey(bound-1))
	}
	inPool := func(i int32) bool {
		o := &x.orders[fp.poolOut[k][0]]
		return x.member(o, int(i)) && !limit.less(o.keyOf(x.values(int(i)), int(i)))
	}
	// Those running the target adapter.
	target := c.TargetModel()
	active := fp.active[:0]
	if a := x.adapter(target); a >= 0 {
		for _, h := range x.holders[a] {
			if inPool(h) && x.runs(c, h, a) {
				active = append(active, h)
			}
		}
	}
	fp.active = active
	if len(active) > 0 && len(active) < end {
		// Those of them with a free slot.
		n := 0
		for _, i := range active {
			if x.flags[i]&flagFree != 0 {
				n++
			}
		}
		if n > 0 && n < len(active) {
			k := 0
			for _, i := range active {
				if x.flags[i]&flagFree != 0 {
					active[k] = i
					k++
				}
			}
			active = active[:k]
		}
		return fp.rendezvous(x, t, active, nil)
	}
	free := x.ord(fp.poolOut[k][1]).es
	endFree := free.searchAfter(limit)
	if endFree > 0 && endFree < end {
		return fp.rendezvous(x, t, nil, free[:endFree])
	}
	return fp.rendezvous(x, t, nil, out[:end])
}

// rendezvous is prefix.Rendezvous.Pick over the endpoints at positions (or
// of entries): the heaviest under the capacity, the lowest position among
// equal weights (endpoints whose keys collide).
func (fp *fastPrefix) rendezvous(x *snapIndex, t *PrefixTracker, positions []int32, entries sortedEntries) int {
	n, total := len(positions)+len(entries), 0
	for _, i := range positions {
		total += max(x.w[i]+x.r[i], 0)
	}
	for _, e := range entries {
		total += max(x.w[e.i]+x.r[e.i], 0)
	}
	rz := prefix.Rendezvous{Factor: fp.f.BalanceFactor, MinCapacity: fp.f.MinCapacity}
	capacity := rz.Capacity(total, n)
	key := t.AffinityKey()
	best, bestW := int32(-1), uint64(0)
	consider := func(i int32) {
		if x.w[i]+x.r[i] >= capacity {
			return
		}
		if w := prefix.Weight(key, t.keys[i]); w > bestW || (w == bestW && i < best) {
			best, bestW = i, w
		}
	}
	for _, i := range positions {
		consider(i)
	}
	for _, e := range entries {
		consider(e.i)
	}
	return int(best)
}

// matchesIn lists the tracker's matches by snapshot position (ascending)
// into fp.matches, and reports whether the tracker was prepared on snap.
func (fp *fastPrefix) matchesIn(t *PrefixTracker, snap *Snapshot) bool {
	if !t.preparedOn(snap) {
		return false
	}
	b := &fp.byKeyFor
	if b.t != t || b.read != t.keysRead {
		byKey := fp.byKey[:0]
		for i, k := range t.keys {
			byKey = append(byKey, keyPos{k, int32(i)})
		}
		slices.SortFunc(byKey, func(p, q keyPos) int {
			if p.key != q.key {
				if p.key < q.key {
					return -1
				}
				return 1
			}
			return int(p.i - q.i)
		})
		fp.byKey = byKey
		b.t, b.read = t, t.keysRead
	}
	ms := fp.matches[:0]
	for j := range t.match.Len() {
		key, blocks := t.match.At(j)
		p, _ := slices.BinarySearchFunc(fp.byKey, key, func(kp keyPos, k uint32) int {
			switch {
			case kp.key < k:
				return -1
			case kp.key > k:
				return 1
			}
			return 0
		})
		for ; p < len(fp.byKey) && fp.byKey[p].key == key; p++ {
			ms = append(ms, prefixMatch{fp.byKey[p].i, blocks})
		}
	}
	slices.SortFunc(ms, func(p, q prefixMatch) int { return int(p.i - q.i) })
	fp.matches = ms
	return true
}

// scored is the profile's scorers and picker over class cl's members:
// the target's holders and the prompt's holders (fp.matches, over
// promptBlocks blocks) are scored exactly, the others by the score order.
func (fp *fastPrefix) scored(c *Cycle, x *snapIndex, cl scoreClass, promptBlocks int) int {
	nu := cl.norm(x, fp.spec)
	cand := &x.orders[cl.load]
	a := x.adapter(c.TargetModel())
	var holders []int32
	if a >= 0 && fp.spec.lora {
		holders = x.holders[a]
	}
	hs := fp.hs[:0]
	h, m := 0, 0
	for h < len(holders) || m < len(fp.matches) {
		// The next special position of either list (both ascending).
		var i int32
		switch {
		case m == len(fp.matches) || (h < len(holders) && holders[h] < fp.matches[m].i):
			i = holders[h]
		default:
			i = fp.matches[m].i
		}
		lora := 0.0
		if x.flags[i]&flagFree != 0 {
			lora = LoRAScoreFreeSlot
		}
		if h < len(holders) && holders[h] == i {
			lora = x.loraScore(c, i, a)
			h++
		}
		share := 0.0
		for m < len(fp.matches) && fp.matches[m].i == i {
			share = float64(fp.matches[m].blocks) / float64(promptBlocks)
			m++
		}
		if x.member(cand, int(i)) {
			hs = append(hs, holderScore{i, fp.spec.score(&nu, x.values(int(i)), lora, share)})
		}
	}
	fp.hs = hs
	return fp.pick(c, x, cl, hs)
}

// scoreList runs the profile's own scorers and picker on list.
func (fp *fastPrefix) scoreList(c *Cycle, x *snapIndex, list []*Endpoint) int {
	n := len(list)
	fp.scores, fp.scratch = growFloats(fp.scores, n), growFloats(fp.scratch, n)
	scores := scoreInto(c, fp.prof, list, fp.scores[:n], fp.scratch[:n])
	return x.positionOf(list[fp.prof.Picker.Pick(c, list, scores)])
}
