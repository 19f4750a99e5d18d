package fleet

import (
	"math"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Oracle is the policy that reads every replica's true state: its prefix
// cache, its live queues and batch, its adapters. It is the upper bound no
// real router reaches, the reference the gaps are stated against.
const Oracle = "oracle"

// OracleSpec builds the oracle policy.
func OracleSpec() PolicySpec {
	return PolicySpec{Name: Oracle, New: func(uint64, func() time.Time) (Policy, error) {
		return &oraclePolicy{}, nil
	}}
}

// oraclePolicy sends each request where it gets its first token soonest,
// by the replica model's own cost on the true state:
//
//   - its TTFT there: the replica's pending prefill (running prompts not
//     yet computed, waiting prompts less what their cache held) plus this
//     prompt less what the replica's cache holds of it now, in steps of
//     MaxNumBatchedTokens priced by the step-time formula with the
//     replica's current decode batch (D, ΣL) and LoRA factor;
//   - an adapter outside a full adapter set must wait for one to drain: a
//     replica where the adapter runs, or where a slot is free (one adapter
//     load), always goes first;
//   - ties go to the replica with fewer running requests.
//
// It is greedy (each request's first token, not the fleet's future) and
// ignores KV admission stalls beyond what the queues show. It bounds what
// routing can do for time to first token; a policy that smooths decode
// load can still beat it on time per output token (RESULTS.md).
type oraclePolicy struct{}

func (o *oraclePolicy) Route(_ *scheduler.Request, v *View) (int, scheduler.Outcome) {
	reps, req := v.Replicas, v.Request
	if len(reps) == 0 || req == nil {
		return -1, scheduler.NoEndpoint
	}
	best, bestCost, bestRunning := -1, math.Inf(1), 0
	for i, r := range reps {
		cost, running := oracleTTFT(r, req)
		if cost < bestCost || (cost == bestCost && running < bestRunning) {
			best, bestCost, bestRunning = i, cost, running
		}
	}
	return best, scheduler.Routed
}

// oracleWait ranks an adapter that must wait for a slot behind every
// replica where it can run now.
const oracleWait = 1e9 // µs

// oracleTTFT estimates req's time to first token on r, in µs, and returns
// r's running requests.
func oracleTTFT(r *vllmsim.Replica, req *vllmsim.Request) (float64, int) {
	cfg := r.Config()
	l := r.Load()
	left := l.PendingPrefillTokens + req.PromptTokens - r.CachedPrefixTokens(req)
	steps := (left + cfg.MaxNumBatchedTokens - 1) / cfg.MaxNumBatchedTokens
	lora := 1.0
	if req.Adapter != "" {
		lora += cfg.LoRASlowdownPerAdapter * float64(l.RunningAdapters)
	}
	us := float64(steps) * micro(cfg.Profile.StepTime(min(left, cfg.MaxNumBatchedTokens), l.DecodingSeqs, l.DecodeContextTokens)) * lora
	if req.Adapter != "" {
		if running, _ := r.AdapterRequests(req.Adapter); running == 0 {
			if l.RunningAdapters >= cfg.MaxLoRAs {
				us += oracleWait
			} else {
				lc := cfg.AdapterLoad
				us += micro(lc.Base) + float64(lc.SizeBytes)/math.Max(lc.BytesPerMicrosecond, 1)
			}
		}
	}
	return us, l.Running
}

func micro(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
