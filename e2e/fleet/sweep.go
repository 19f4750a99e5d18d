package fleet

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
)

// SweepConfig is a grid of runs: every scenario at every load under every
// policy.
type SweepConfig struct {
	Scenarios []Scenario
	// Loads are fractions of each scenario's FleetRPS (1 = saturation).
	Loads    []float64
	Policies []PolicySpec
	// Seed is the first seed; each point pools Seeds seeds from it
	// (RunSeeds; 0 means 1).
	Seed  uint64
	Seeds int
	// Warmup, Window, ScrapeInterval, Gateways and GatewayVMs as in
	// RunConfig.
	Warmup, Window, ScrapeInterval time.Duration
	Gateways, GatewayVMs           int
	// PolicySalt as in RunConfig.
	PolicySalt uint64
	// LoRAFIFOAt, when positive, also runs every policy at that load on
	// the scenarios with adapters with the replicas' LoRA admission changed
	// to pure FIFO (ScenarioResult.FIFO): what vLLM's skip rule costs or
	// saves.
	LoRAFIFOAt float64
	// Parallel runs that many simulations at once (at least 1). Results do
	// not depend on it.
	Parallel int
	// Progress, when set, gets one line per finished run.
	Progress io.Writer
}

// ScenarioResult is one scenario's capacity and runs, ordered by load then
// policy as configured.
type ScenarioResult struct {
	Scenario Scenario
	Capacity Capacity
	Runs     []Result
	// FIFO are the LoRAFIFOAt runs, by policy as configured.
	FIFO []Result
}

// Sweep runs the grid. Each run gets the sweep's seed, so at one load every
// policy sees the same requests.
func Sweep(cfg SweepConfig) ([]ScenarioResult, error) {
	if len(cfg.Scenarios) == 0 || len(cfg.Loads) == 0 || len(cfg.Policies) == 0 {
		return nil, errors.New("fleet: a sweep needs scenarios, loads and policies")
	}
	for _, l := range cfg.Loads {
		if !(l > 0) {
			return nil, fmt.Errorf("fleet: load %v must be positive", l)
		}
	}
	out := make([]ScenarioResult, len(cfg.Scenarios))
	type job struct {
		dst    *Result
		config RunConfig
	}
	var jobs []job
	for si, sc := range cfg.Scenarios {
		capa, err := MeasureCapacity(sc, cfg.Seed)
		if err != nil {
			return nil, err
		}
		sr := &out[si]
		sr.Scenario, sr.Capacity = sc, capa
		sr.Runs = make([]Result, len(cfg.Loads)*len(cfg.Policies))
		run := func(sc Scenario, p PolicySpec, load float64) RunConfig {
			return RunConfig{
				Scenario: sc, Policy: p, Rate: load * capa.FleetRPS, Load: load, Seed: cfg.Seed,
				Warmup: cfg.Warmup, Window: cfg.Window, ScrapeInterval: cfg.ScrapeInterval,
				Gateways: cfg.Gateways, GatewayVMs: cfg.GatewayVMs, PolicySalt: cfg.PolicySalt,
			}
		}
		for li, load := range cfg.Loads {
			for pi, p := range cfg.Policies {
				jobs = append(jobs, job{dst: &sr.Runs[li*len(cfg.Policies)+pi], config: run(sc, p, load)})
			}
		}
		if cfg.LoRAFIFOAt > 0 && len(sc.Adapters) > 0 {
			fifo := sc
			fifo.Replica.LoRAAdmission = vllmsim.LoRAFIFO
			sr.FIFO = make([]Result, len(cfg.Policies))
			for pi, p := range cfg.Policies {
				jobs = append(jobs, job{dst: &sr.FIFO[pi], config: run(fifo, p, cfg.LoRAFIFOAt)})
			}
		}
	}

	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	work := make(chan job)
	for range max(cfg.Parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				start := time.Now()
				r, err := RunSeeds(j.config, max(cfg.Seeds, 1))
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				*j.dst = r
				if cfg.Progress != nil && err == nil {
					rule := ""
					if j.config.Scenario.Replica.LoRAAdmission == vllmsim.LoRAFIFO {
						rule = " (LoRA FIFO)"
					}
					fmt.Fprintf(cfg.Progress, "%-2s %4.0f%% %-22s %6.1f req/s  p90 TTFT %9.1f ms  p90 TPOT %7.1f ms  p90 NTPOT %8.1f ms  hit %5.1f%%  (%.1fs)%s\n",
						r.Scenario, 100*r.Load, r.Policy, r.Rate, ms(r.TTFT.P90), ms(r.TPOT.P90), ms(r.NTPOT.P90), 100*r.HitRate(), time.Since(start).Seconds(), rule)
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		work <- j
	}
	close(work)
	wg.Wait()
	return out, firstErr
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
