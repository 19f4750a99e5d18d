package scheduler

import "math"

// Built-in scorers, modelled on the queue, KV-cache utilization, LoRA
// affinity and running-requests scorers upstream added after the seed: each
// maps one signal to [0,1], higher better.

var (
	_ Scorer = (*QueueScorer)(nil)
	_ Scorer = (*KVCacheScorer)(nil)
	_ Scorer = (*LoRAAffinityScorer)(nil)
	_ Scorer = (*RunningRequestsScorer)(nil)
)

// QueueScorer scores the waiting queue min-max normalised over the
// candidates: the shortest queue scores 1, the longest 0, all equal 1.
type QueueScorer struct {
	PluginName string
}

func (s *QueueScorer) Name() string { return s.PluginName }

func (s *QueueScorer) Score(_ *Cycle, candidates []*Endpoint, scores []float64) {
	minMaxInverse(candidates, scores, func(e *Endpoint) int { return e.Metrics.WaitingQueueSize })
}

// RunningRequestsScorer scores the running batch size min-max normalised
// like QueueScorer.
type RunningRequestsScorer struct {
	PluginName string
}

func (s *RunningRequestsScorer) Name() string { return s.PluginName }

func (s *RunningRequestsScorer) Score(_ *Cycle, candidates []*Endpoint, scores []float64) {
	minMaxInverse(candidates, scores, func(e *Endpoint) int { return e.Metrics.RunningQueueSize })
}

func minMaxInverse(candidates []*Endpoint, scores []float64, value func(*Endpoint) int) {
	lo, hi := math.MaxInt, math.MinInt
	for _, e := range candidates {
		v := value(e)
		lo, hi = min(lo, v), max(hi, v)
	}
	for i, e := range candidates {
		if hi == lo {
			scores[i] = 1
			continue
		}
		scores[i] = float64(hi-value(e)) / float64(hi-lo)
	}
}

// KVCacheScorer scores free KV cache: 1 - usage (absolute, not normalised:
// a fleet that is 90% full everywhere should not look idle).
type KVCacheScorer struct {
	PluginName string
}

func (s *KVCacheScorer) Name() string { return s.PluginName }

func (s *KVCacheScorer) Score(_ *Cycle, candidates []*Endpoint, scores []float64) {
	for i, e := range candidates {
		scores[i] = 1 - kvUsage(e)
	}
}

// LoRAAffinityScorer prefers endpoints that can serve the target adapter
// soonest: adapter active 1.0, a free adapter slot 0.8, adapter only waiting
// (it is queued to load but no slot is free) 0.6, otherwise 0. The order
// is upstream's lora-affinity-scorer's.
type LoRAAffinityScorer struct {
	PluginName string
}

func (s *LoRAAffinityScorer) Name() string { return s.PluginName }

// LoRA affinity scores, exported for tests and documentation.
const (
	LoRAScoreActive   = 1.0
	LoRAScoreFreeSlot = 0.8
	LoRAScoreWaiting  = 0.6
)

func (s *LoRAAffinityScorer) Score(c *Cycle, candidates []*Endpoint, scores []float64) {
	target := c.TargetModel()
	for i, e := range candidates {
		scores[i] = loraAffinityScore(&e.Metrics, target)
	}
}

// loraAffinityScore is the LoRA affinity score of an endpoint with metrics m
// for the target adapter.
func loraAffinityScore(m *Metrics, target string) float64 {
	switch {
	case m.HasActiveModel(target):
		return LoRAScoreActive
	case len(m.ActiveModels)+len(m.WaitingModels) < m.MaxActiveModels:
		return LoRAScoreFreeSlot
	case m.HasWaitingModel(target):
		return LoRAScoreWaiting
	}
	return 0
}
