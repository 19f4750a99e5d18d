package scheduler

import (
	"math"
	"time"
	"unsafe"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// PrefixInfo is what the routing index knows about a request's prompt
// (Request.Prefix). PrefixTracker implements it over a prefix.Index; the
// plugins below only read it.
type PrefixInfo interface {
	// PromptBlocks is the prompt's length in blocks (0: nothing hashed).
	PromptBlocks() int
	// MatchedBlocks is how many leading blocks of the prompt e is
	// believed to hold in its prefix cache.
	MatchedBlocks(e *Endpoint) int
	// AffinityKey is the key consistent choices are made on: the same for
	// every prompt that starts with the same block.
	AffinityKey() uint64
	// EndpointKey is e's identity for consistent choices, the same on
	// every gateway replica and worker.
	EndpointKey(e *Endpoint) uint32
}

var (
	_ Scorer     = (*PrefixCacheScorer)(nil)
	_ Filter     = (*PrefixAffinityFilter)(nil)
	_ PathLister = (*PrefixAffinityFilter)(nil)
	_ PrefixInfo = (*PrefixTracker)(nil)
)

// PrefixCacheScorer scores the share of the prompt an endpoint is believed
// to hold: matched blocks / prompt blocks, in [0,1]; 0 for every endpoint
// when the request carries no prefix information.
type PrefixCacheScorer struct {
	PluginName string
}

func (s *PrefixCacheScorer) Name() string { return s.PluginName }

func (s *PrefixCacheScorer) Score(c *Cycle, candidates []*Endpoint, scores []float64) {
	info := c.Request.Prefix
	if info == nil || info.PromptBlocks() == 0 {
		clear(scores)
		return
	}
	total := float64(info.PromptBlocks())
	for i, e := range candidates {
		scores[i] = float64(info.MatchedBlocks(e)) / total
	}
}

// Paths of the prefix-affinity filter.
const (
	// PathPrefixAffinity: an endpoint with capacity holds the prompt's
	// prefix; the request goes to the consistent choice among those that
	// hold the most of it.
	PathPrefixAffinity = "prefix/affinity"
	// PathPrefixConsistent: no endpoint with capacity holds any of it; the
	// consistent choice among those with capacity.
	PathPrefixConsistent = "prefix/consistent"
	// PathPrefixSaturated: no endpoint has capacity (the load guard); the
	// profile's scorers spread the request over all of them.
	PathPrefixSaturated = "prefix/saturated"
	// PathPrefixNone: the request has no prompt to match (scorers decide).
	PathPrefixNone = "prefix/none"
	// PathPrefixUnshared: no endpoint holds the prompt's prefix and recent
	// prompts rarely started like an earlier one (below MinReuse): the
	// scorers choose among every candidate, as for a request without a
	// prompt.
	PathPrefixUnshared = "prefix/unshared"
)

// Prefix-affinity defaults.
const (
	DefaultPrefixQueueThreshold   = 8
	DefaultPrefixKVCacheThreshold = 0.9
	DefaultPrefixKeepRatio        = 0.8
	DefaultPrefixMinMatchBlocks   = 4
	DefaultPrefixBalanceFactor    = 1.25
	DefaultPrefixMinCapacity      = 16
	DefaultPrefixMinReuse         = 0.05
)

// prefixReuseWindow is how many recent requests (with a prompt) the
// affinity filter's reuse share averages over, per filter instance (one
// per worker VM in the plugin).
const prefixReuseWindow = 128

// PrefixAffinityFilter sends a request where its prompt's prefix is
// cached, while that endpoint has capacity, and otherwise to the endpoint
// every gateway replica and worker would choose. In order:
//
//  1. Load guard: an endpoint has capacity while its waiting queue is at
//     most QueueThreshold and its KV-cache use at most KVCacheThreshold.
//     When none has, every candidate is kept (PathPrefixSaturated): the
//     profile's load scorers spread the requests, so affinity never piles
//     onto a hot replica.
//  2. Affinity: among endpoints with capacity and fewer outstanding
//     requests than the bounded load of the fleet (BalanceFactor × the
//     mean, at least MinCapacity), those holding at least KeepRatio of the
//     best match (when the best is at least MinMatchBlocks blocks) are
//     kept (PathPrefixAffinity); with no such match, all with capacity
//     (PathPrefixConsistent).
//  3. With affinity, every holder kept goes to the profile's scorers
//     (load, LoRA, the match itself).
//  4. A new prefix (no holder): the endpoints already running the target
//     adapter are kept if any, else those with a free adapter slot, and
//     rendezvous hashing with bounded loads (prefix.Rendezvous; load =
//     waiting + running requests, bound BalanceFactor × the mean, at least
//     MinCapacity) on the prompt's affinity key picks one of them. The
//     same new prefix therefore lands on the same endpoint from every
//     replica and worker, whose indexes differ, and an endpoint joining or
//     leaving moves only its share. ConsistentHashing off keeps them all
//     for the scorers.
//  5. The consistent choice costs balance: it ignores load up to the
//     bound. It pays only when later prompts start like this one (a
//     conversation's next turn arriving at another gateway, a document
//     sent again), so it is made only while at least MinReuse of the
//     recent prompts (an average over the last prefixReuseWindow) found
//     a prefix the index knows. Below that, a prompt nobody holds keeps
//     every candidate for the scorers (PathPrefixUnshared), exactly as
//     the scoring profile would route it. A fresh worker counts one
//     reused prompt before its first: its share is the plain average of
//     that and the prompts seen so far until there are prefixReuseWindow
//     of them, so it makes consistent choices from the start (two gateways
//     agree on a conversation's first turns) and stops within about
//     1/MinReuse prompts (20 by default) where nothing is reused. A share
//     that started at 1 and decayed over the window took about 380
//     prompts per worker, long enough to unbalance a fleet near
//     saturation: scenario (a) at its knee, 3 % on its p90s
//     (BENCHMARKS.md).
//
// Requests without prefix information keep every candidate
// (PathPrefixNone).
type PrefixAffinityFilter struct {
	PluginName        string
	QueueThreshold    int
	KVCacheThreshold  float64
	KeepRatio         float64
	MinMatchBlocks    int
	ConsistentHashing bool
	BalanceFactor     float64
	MinCapacity       int
	MinReuse          float64

	// unseen is the running share of recent prompts whose prefix no
	// candidate held; observed counts the prompts averaged (capped).
	unseen   float64
	observed int
	rz       prefix.Rendezvous
	pool     []*Endpoint
	ids      []uint32
	loads    []int
}

func (f *PrefixAffinityFilter) Name() string { return f.PluginName }

// Paths lists the paths the filter sets.
func (f *PrefixAffinityFilter) Paths() []string {
	return []string{PathPrefixAffinity, PathPrefixConsistent, PathPrefixSaturated, PathPrefixNone, PathPrefixUnshared}
}

// Reuse is the running share of recent prompts that found a prefix the
// index knows (1 before any request: one reused prompt is assumed).
func (f *PrefixAffinityFilter) Reuse() float64 { return 1 - f.unseen }

// observe adds one prompt to the running reuse share.
func (f *PrefixAffinityFilter) observe(seen bool) {
	x := 1.0
	if seen {
		x = 0
	}
	f.observed = min(f.observed+1, prefixReuseWindow-1)
	f.unseen += (x - f.unseen) / float64(f.observed+1)
}

func (f *PrefixAffinityFilter) hasCapacity(e *Endpoint) bool {
	return e.Metrics.WaitingQueueSize <= f.QueueThreshold && kvUsage(e) <= f.KVCacheThreshold
}

func (f *PrefixAffinityFilter) Filter(c *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	info := c.Request.Prefix
	if info == nil || info.PromptBlocks() == 0 {
		c.SetPath(PathPrefixNone)
		return append(dst, candidates...)
	}
	// An endpoint holds affinity only below the bounded load of the whole
	// fleet (BalanceFactor × the mean outstanding requests, at least
	// MinCapacity): a hot prefix spreads before its holder is a hot spot,
	// not only once it is full.
	total, seen := 0, 0
	for _, e := range candidates {
		total += outstanding(e)
		seen = max(seen, info.MatchedBlocks(e))
	}
	minMatch := max(f.MinMatchBlocks, 1)
	f.observe(seen >= minMatch)
	if seen < minMatch && f.ConsistentHashing && f.Reuse() < f.MinReuse {
		// A prompt nobody holds, where prompts are rarely reused: a
		// consistent choice would cost balance for nothing.
		c.SetPath(PathPrefixUnshared)
		return append(dst, candidates...)
	}
	bound := max(f.MinCapacity, int(math.Ceil(f.BalanceFactor*float64(total+1)/float64(len(candidates)))))
	pool := f.pool[:0]
	best := 0
	for _, e := range candidates {
		if f.hasCapacity(e) {
			pool = append(pool, e)
			if outstanding(e) < bound {
				best = max(best, info.MatchedBlocks(e))
			}
		}
	}
	if len(pool) == 0 {
		f.pool = pool
		c.SetPath(PathPrefixSaturated)
		return append(dst, candidates...)
	}
	path := PathPrefixConsistent
	if best >= minMatch {
		path = PathPrefixAffinity
		keep := int(math.Ceil(f.KeepRatio * float64(best)))
		n := 0
		for _, e := range pool {
			if outstanding(e) < bound && info.MatchedBlocks(e) >= keep {
				pool[n] = e
				n++
			}
		}
		pool = pool[:n]
	}
	f.pool = pool
	c.SetPath(path)
	if path == PathPrefixAffinity || !f.ConsistentHashing || len(pool) == 1 {
		// Every endpoint kept holds the prefix: the scorers (load, LoRA,
		// the match itself) choose among them.
		return append(dst, pool...)
	}
	// A new prefix (or one whose holders are all past the bound): the
	// endpoints under the bound, the adapter where it runs (else where a
	// slot is free), then the consistent choice among those.
	pool = narrow(pool, func(e *Endpoint) bool { return outstanding(e) < bound })
	pool = narrow(pool, func(e *Endpoint) bool { return e.Metrics.HasActiveModel(c.TargetModel()) })
	pool = narrow(pool, func(e *Endpoint) bool {
		m := &e.Metrics
		return m.MaxActiveModels > 0 && len(m.ActiveModels)+len(m.WaitingModels) < m.MaxActiveModels
	})
	f.ids, f.loads = f.ids[:0], f.loads[:0]
	for _, e := range pool {
		f.ids = append(f.ids, info.EndpointKey(e))
		f.loads = append(f.loads, outstanding(e))
	}
	f.rz.Factor, f.rz.MinCapacity = f.BalanceFactor, f.MinCapacity
	return append(dst, pool[f.rz.Pick(info.AffinityKey(), f.ids, f.loads)])
}

// narrow keeps, in place, the endpoints of pool that pass keep, unless
// none or all do.
func narrow(pool []*Endpoint, keep func(*Endpoint) bool) []*Endpoint {
	n := 0
	for _, e := range pool {
		if keep(e) {
			n++
		}
	}
	if n == 0 || n == len(pool) {
		return pool
	}
	k := 0
	for _, e := range pool {
		if keep(e) {
			pool[k] = e
			k++
		}
	}
	return pool[:k]
}

// PrefixTracker connects one VM's (or one simulated gateway worker's)
// prefix.Index to its scheduling: Prepare looks a request's blocks up and
// hands the result to the plugins as Request.Prefix, Routed records where
// the request went. It caches each endpoint's key per snapshot, and reads
// them again when the snapshot is another, or its owner rewrote it in
// place and said so with Snapshot.Changed. Not safe for concurrent use.
type PrefixTracker struct {
	Index *prefix.Index

	snap  *Snapshot
	id    uint64 // snap.identity()
	all   uint64 // snap's Changed generation when keys were read
	first *Endpoint
	n     int
	// keysRead counts the times keys were read (for caches of them).
	keysRead uint64
	keys     []uint32
	match    prefix.Match
	blocks   []uint64
	key      uint64
}

// NewPrefixTracker returns a tracker over idx.
func NewPrefixTracker(idx *prefix.Index) *PrefixTracker { return &PrefixTracker{Index: idx} }

// Prepare looks blocks up in the index for a request scheduled on snap and
// sets req.Prefix. key is the prompt's affinity key (prefix.Hasher.Key).
// blocks must stay unchanged until Routed.
func (t *PrefixTracker) Prepare(req *Request, snap *Snapshot, blocks []uint64, key uint64) {
	t.useSnapshot(snap)
	t.blocks, t.key = blocks, key
	t.Index.Lookup(blocks, &t.match)
	req.Prefix = t
}

// Routed records that the request Prepare saw went to snapshot endpoint
// index i, and returns the blocks the index predicted it holds (to compare
// with what the endpoint reports).
func (t *PrefixTracker) Routed(i int, now time.Time) (predicted int) {
	if t.snap == nil || i < 0 || i >= len(t.keys) {
		return 0
	}
	k := t.keys[i]
	predicted = t.match.Blocks(k)
	t.Index.Record(t.blocks, k, predicted, now)
	return predicted
}

// KeyOf is the index key of snapshot endpoint i (0 when out of range).
func (t *PrefixTracker) KeyOf(i int) uint32 {
	if i < 0 || i >= len(t.keys) {
		return 0
	}
	return t.keys[i]
}

// Match is the last lookup's result.
func (t *PrefixTracker) Match() *prefix.Match { return &t.match }

func (t *PrefixTracker) useSnapshot(snap *Snapshot) {
	var first *Endpoint
	if len(snap.Endpoints) > 0 {
		first = &snap.Endpoints[0]
	}
	// identity turns the snapshot's change log on, so Changed reaches us
	// even where no Scheduler indexes the snapshot.
	id := snap.identity()
	if snap == t.snap && id == t.id && snap.changes.all == t.all && first == t.first && len(snap.Endpoints) == t.n {
		return
	}
	t.snap, t.id, t.all, t.first, t.n = snap, id, snap.changes.all, first, len(snap.Endpoints)
	t.keysRead++
	t.keys = t.keys[:0]
	for i := range snap.Endpoints {
		e := &snap.Endpoints[i]
		t.keys = append(t.keys, prefix.EndpointKey(e.ID.Namespace, e.ID.Name, e.Address, e.Port))
	}
}

// indexIn is e's position in t.snap.Endpoints, or -1.
func (t *PrefixTracker) indexIn(e *Endpoint) int {
	if t.n == 0 || e == nil {
		return -1
	}
	size := unsafe.Sizeof(*e)
	off := uintptr(unsafe.Pointer(e)) - uintptr(unsafe.Pointer(t.first))
	i := int(off / size)
	if off%size != 0 || i < 0 || i >= t.n || &t.snap.Endpoints[i] != e {
		return -1
	}
	return i
}

func (t *PrefixTracker) PromptBlocks() int   { return len(t.blocks) }
func (t *PrefixTracker) AffinityKey() uint64 { return t.key }

func (t *PrefixTracker) EndpointKey(e *Endpoint) uint32 {
	if i := t.indexIn(e); i >= 0 {
		return t.keys[i]
	}
	return prefix.EndpointKey(e.ID.Namespace, e.ID.Name, e.Address, e.Port)
}

func (t *PrefixTracker) MatchedBlocks(e *Endpoint) int {
	return t.match.Blocks(t.EndpointKey(e))
}
