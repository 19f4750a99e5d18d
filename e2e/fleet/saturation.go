package fleet

import (
	"fmt"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
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
}

// MeasureCapacity measures a scenario's saturation throughput with the
// replica model. Load fractions in a sweep are relative to FleetRPS.
func MeasureCapacity(sc Scenario, seed uint64) (Capacity, error) {
	if err := sc.Validate(); err != nil {
		return Capacity{}, err
	}
	wl := vllmsim.WorkloadConfig{Rate: SaturationRate, Input: sc.Input, Output: sc.Output, Seed: seed}
	if n := min(sc.Replica.MaxLoRAs, len(sc.Adapters)); n > 0 {
		names := make([]string, n)
		for i := range names {
			names[i] = sc.Adapters[i].Name
		}
		wl.Adapters = vllmsim.EqualShares(names...)
	}
	th, err := vllmsim.Saturation(sc.Replica, wl, SaturationWarmup, SaturationWindow)
	if err != nil {
		return Capacity{}, fmt.Errorf("fleet: saturation of scenario %q: %w", sc.Name, err)
	}
	return Capacity{Replica: th, FleetRPS: float64(sc.Replicas) * th.RequestsPerSecond}, nil
}

// RealityCheck is the calibration figure of issue 8: one Llama-2-7B H100
// replica, base model only, saturated with ShareGPT (published ≈26 req/s,
// ≈6.0k output tok/s, GAIE sample.json). Same call as vllmsim's
// calibration test.
func RealityCheck(seed uint64) (vllmsim.Throughput, error) {
	return vllmsim.Saturation(vllmsim.DefaultReplicaConfig(vllmsim.Llama2_7B),
		vllmsim.ShareGPTWorkload(SaturationRate, seed), SaturationWarmup, SaturationWindow)
}
