package fleet

import (
	"fmt"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Saturation measurement, with vllmsim.Saturation (the calibration the
// replica model is checked with): one replica overloaded for SaturationWarmup
// and measured for SaturationWindow.
const (
	SaturationRate   = 45.0 // req/s offered, well above one replica's capacity
	SaturationWarmup = 60 * time.Second
	SaturationWindow = 300 * time.Second
)

// Capacity is a scenario's saturation throughput.
type Capacity struct {
	// Replica is one replica of the scenario overloaded with a mix of
	// min(MaxLoRAs, adapters) equally shared adapters: the best case a
	// router can reach, every replica serving only adapters it holds.
	Replica vllmsim.Throughput
	// FleetRPS is Replicas × Replica.RequestsPerSecond: 100% load.
	FleetRPS float64
	// HitRate is the prefix hit rate of that best case (0 without shared
	// prefixes).
	HitRate float64
}

// MeasureCapacity measures a scenario's saturation throughput with the
// replica model. Load fractions in a sweep are relative to FleetRPS.
//
// The best case differs by traffic: with ShareGPT traffic, one replica
// serving min(MaxLoRAs, adapters) equally shared adapters (vllmsim's
// calibration, Saturation); with shared prefixes, one replica serving its
// share of them (1/Replicas of the contexts, whole conversations, at most
// MaxLoRAs adapters and their system prompts), driven by the fleet
// simulation itself with one replica, every request sent to it.
func MeasureCapacity(sc Scenario, seed uint64) (Capacity, error) {
	if err := sc.Validate(); err != nil {
		return Capacity{}, err
	}
	if !sc.SharesPrefixes() {
		wl := vllmsim.WorkloadConfig{Rate: SaturationRate, Input: sc.Input, Output: sc.Output, Seed: seed}
		wl.Adapters = sc.traffic().share(sc.Replicas, sc.Replica.MaxLoRAs).(shareGPT).adapters
		th, err := vllmsim.Saturation(sc.Replica, wl, SaturationWarmup, SaturationWindow)
		if err != nil {
			return Capacity{}, fmt.Errorf("fleet: saturation of scenario %q: %w", sc.Name, err)
		}
		return Capacity{Replica: th, FleetRPS: float64(sc.Replicas) * th.RequestsPerSecond}, nil
	}
	one := sc
	one.Replicas = 1
	one.Traffic = sc.Traffic.share(sc.Replicas, sc.Replica.MaxLoRAs)
	one.Criticality = AllCritical
	run := func(rate float64) (Result, error) {
		r, err := runOnce(RunConfig{
			Scenario: one, Policy: onlyReplica, Rate: rate, Seed: seed,
			Warmup: max(SaturationWarmup, sc.MinWarmup), Window: SaturationWindow, ScrapeInterval: DefaultScrapeInterval, capacity: true,
		}, &samples{})
		if err != nil {
			return r, fmt.Errorf("fleet: saturation of scenario %q: %w", sc.Name, err)
		}
		return r, nil
	}
	// Overloaded, the replica's throughput is an upper bound; but a backlog
	// of new requests delays the ones that would hit, and a conversation's
	// later, longer turns come late, so the capacity is the highest rate
	// just below it that the replica keeps up with (95% served in the
	// window), stepping down by 5%.
	best, err := run(SaturationRate)
	if err != nil {
		return Capacity{}, err
	}
	for rate, pass := best.ThroughputRPS, 0; pass < 20; pass, rate = pass+1, rate*0.95 {
		r, err := run(rate)
		if err != nil {
			return Capacity{}, err
		}
		if r.ThroughputRPS >= capacityKeepUp*rate {
			best = r
			break
		}
	}
	th := vllmsim.Throughput{
		RequestsPerSecond:     best.ThroughputRPS,
		OutputTokensPerSecond: best.OutputTokPS,
		Completed:             int64(best.ThroughputRPS * SaturationWindow.Seconds()),
		Preemptions:           best.Preemptions,
		MeanRunning:           best.meanRunning,
		MeanKVUsage:           best.meanKVUsage,
	}
	return Capacity{Replica: th, FleetRPS: float64(sc.Replicas) * th.RequestsPerSecond, HitRate: best.replicaHitRate}, nil
}

// capacityKeepUp is the share of the offered rate a replica must serve to
// keep up with it.
const capacityKeepUp = 0.95

// onlyReplica sends every request to replica 0.
var onlyReplica = PolicySpec{Name: "only-replica", New: func(uint64, func() time.Time) (Policy, error) {
	return policyFunc(func(*scheduler.Request, *View) (int, scheduler.Outcome) { return 0, scheduler.Routed }), nil
}}

// policyFunc is a Policy made of a function.
type policyFunc func(req *scheduler.Request, v *View) (int, scheduler.Outcome)

func (f policyFunc) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) { return f(req, v) }

// RealityCheck is the simulation's calibration figure: one Llama-2-7B H100
// replica, base model only, saturated with ShareGPT (published ≈26 req/s,
// ≈6.0k output tok/s, GAIE sample.json). Same call as vllmsim's
// calibration test.
func RealityCheck(seed uint64) (vllmsim.Throughput, error) {
	return vllmsim.Saturation(vllmsim.DefaultReplicaConfig(vllmsim.Llama2_7B),
		vllmsim.ShareGPTWorkload(SaturationRate, seed), SaturationWarmup, SaturationWindow)
}
