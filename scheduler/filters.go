package scheduler

import "math"

// Built-in filters. The first five reproduce the seed's filters (upstream's
// scheduler, see doc.go); the rest serve other policies.

var (
	_ Filter = (*LowQueueFilter)(nil)
	_ Filter = (*HasCapacityFilter)(nil)
	_ Filter = (*LoRAAffinityFilter)(nil)
	_ Filter = (*LeastQueueFilter)(nil)
	_ Filter = (*LeastKVCacheFilter)(nil)
	_ Filter = (*LeastRequestFilter)(nil)
	_ Filter = (*ShedFilter)(nil)

	_ NonEmptyFilter = (*LeastQueueFilter)(nil)
	_ NonEmptyFilter = (*LeastKVCacheFilter)(nil)
	_ NonEmptyFilter = (*LeastRequestFilter)(nil)
)

// Defaults of the seed's thresholds, upstream's.
const (
	DefaultLoRAAffinityThreshold  = 0.999
	DefaultQueueingThresholdLoRA  = 128
	DefaultQueueThresholdCritical = 5
	DefaultKVCacheThreshold       = 0.8
)

// LowQueueFilter keeps endpoints whose waiting queue is at most Threshold
// (upstream "low queueing filter", threshold QueueingThresholdLoRA).
type LowQueueFilter struct {
	PluginName string
	Threshold  int
}

func (f *LowQueueFilter) Name() string { return f.PluginName }

func (f *LowQueueFilter) Filter(_ *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	for _, e := range candidates {
		if e.Metrics.WaitingQueueSize <= f.Threshold {
			dst = append(dst, e)
		}
	}
	return dst
}

// HasCapacityFilter keeps endpoints that can take a sheddable request
// without hurting critical ones: waiting queue at most QueueThreshold and
// KV-cache usage at most KVCacheThreshold (upstream "has capacity for
// sheddable requests").
type HasCapacityFilter struct {
	PluginName       string
	QueueThreshold   int
	KVCacheThreshold float64
}

func (f *HasCapacityFilter) Name() string { return f.PluginName }

func (f *HasCapacityFilter) Filter(_ *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	for _, e := range candidates {
		if f.hasCapacity(e) {
			dst = append(dst, e)
		}
	}
	return dst
}

func (f *HasCapacityFilter) hasCapacity(e *Endpoint) bool {
	return e.Metrics.WaitingQueueSize <= f.QueueThreshold && kvUsage(e) <= f.KVCacheThreshold
}

// LoRAAffinityFilter is upstream's LoRA soft-affinity filter. It splits the
// candidates into an affinity group (the target adapter is active or
// waiting) and an available group (no affinity, but a free adapter slot:
// active+waiting < MaxActiveModels). When both groups are non-empty it keeps
// the affinity group with probability Threshold, else the available group,
// so adapters spread before one endpoint becomes a hot spot. When only one
// group is non-empty it keeps that one; when both are empty it keeps
// nothing.
//
// ActiveModels and WaitingModels are assumed to hold distinct names each
// (the snapshot wire format guarantees it); an adapter present in both
// lists takes two slots, as in upstream where they are separate maps.
type LoRAAffinityFilter struct {
	PluginName string
	Threshold  float64
}

func (f *LoRAAffinityFilter) Name() string { return f.PluginName }

func (f *LoRAAffinityFilter) Filter(c *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	target := c.TargetModel()
	// Two passes instead of two group slices: count, choose, then collect.
	affinity, available := 0, 0
	for _, e := range candidates {
		switch loraGroup(&e.Metrics, target) {
		case loraAffinity:
			affinity++
		case loraAvailable:
			available++
		}
	}
	want := loraAffinity
	switch {
	case affinity > 0 && available > 0:
		if c.Rand.Float64() >= f.Threshold {
			want = loraAvailable
		}
	case affinity == 0:
		want = loraAvailable
	}
	for _, e := range candidates {
		if loraGroup(&e.Metrics, target) == want {
			dst = append(dst, e)
		}
	}
	return dst
}

type loraClass int

const (
	loraNone loraClass = iota
	loraAffinity
	loraAvailable
)

func loraGroup(m *Metrics, target string) loraClass {
	if m.HasActiveModel(target) || m.HasWaitingModel(target) {
		return loraAffinity
	}
	if len(m.ActiveModels)+len(m.WaitingModels) < m.MaxActiveModels {
		return loraAvailable
	}
	return loraNone
}

// LeastQueueFilter keeps the endpoints whose waiting queue lies in the
// lowest of len(candidates) equal bands between the minimum and maximum
// queue, [min, min+(max-min)/n] with integer division, as upstream's
// leastQueuingFilterFunc: several nearly-idle endpoints stay candidates for
// the next step instead of only the single least-loaded one. The maximum
// starts at 0 as upstream's does. Never empty on a non-empty input.
type LeastQueueFilter struct {
	PluginName string
}

func (f *LeastQueueFilter) Name() string { return f.PluginName }

func (*LeastQueueFilter) KeepsAtLeastOne() {}

func (f *LeastQueueFilter) Filter(_ *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	lo, hi := math.MaxInt, 0
	for _, e := range candidates {
		q := e.Metrics.WaitingQueueSize
		lo, hi = min(lo, q), max(hi, q)
	}
	if len(candidates) == 0 {
		return dst
	}
	limit := lo + (hi-lo)/len(candidates)
	for _, e := range candidates {
		if q := e.Metrics.WaitingQueueSize; q >= lo && q <= limit {
			dst = append(dst, e)
		}
	}
	return dst
}

// LeastKVCacheFilter keeps the endpoints whose KV-cache usage lies in
// [min, min+(max-min)/n], as upstream's leastKVCacheFilterFunc (maximum
// starting at 0). Never empty on a non-empty input.
type LeastKVCacheFilter struct {
	PluginName string
}

func (f *LeastKVCacheFilter) Name() string { return f.PluginName }

func (*LeastKVCacheFilter) KeepsAtLeastOne() {}

func (f *LeastKVCacheFilter) Filter(_ *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	lo, hi := math.MaxFloat64, 0.0
	for _, e := range candidates {
		u := kvUsage(e)
		lo, hi = min(lo, u), max(hi, u)
	}
	limit := lo + (hi-lo)/float64(len(candidates))
	for _, e := range candidates {
		if u := kvUsage(e); u >= lo && u <= limit {
			dst = append(dst, e)
		}
	}
	return dst
}

// LeastRequestFilter keeps the endpoints with the fewest outstanding
// requests (waiting + running): the classic least-request balancer when
// followed by a random picker.
type LeastRequestFilter struct {
	PluginName string
}

func (f *LeastRequestFilter) Name() string { return f.PluginName }

func (*LeastRequestFilter) KeepsAtLeastOne() {}

func (f *LeastRequestFilter) Filter(_ *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	best := math.MaxInt
	for _, e := range candidates {
		best = min(best, outstanding(e))
	}
	for _, e := range candidates {
		if outstanding(e) == best {
			dst = append(dst, e)
		}
	}
	return dst
}

func outstanding(e *Endpoint) int { return e.Metrics.WaitingQueueSize + e.Metrics.RunningQueueSize }

// ShedFilter applies upstream's shedding rule outside the decision tree:
// Standard and Sheddable requests keep only endpoints with capacity (as
// HasCapacityFilter) and are dropped (429) when none has any; Critical
// requests, and requests flow control admitted (Request.Admitted), pass
// untouched.
type ShedFilter struct {
	HasCapacityFilter
}

func (f *ShedFilter) Filter(c *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	if !c.Request.shed() {
		return append(dst, candidates...)
	}
	n := len(dst)
	dst = f.HasCapacityFilter.Filter(c, dst, candidates)
	if len(dst) == n && len(candidates) > 0 {
		c.Drop()
	}
	return dst
}
