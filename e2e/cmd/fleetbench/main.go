// Command fleetbench is the routing-quality benchmark: it sweeps the
// fleet simulation (package e2e/fleet) over scenarios, loads and routing
// policies and writes RESULTS.md, results.csv and SVG plots.
//
//	fleetbench                          # the full sweep into e2e/results
//	fleetbench -scenarios a -loads 100 -policies decision-tree,round-robin -out /tmp/r
//	fleetbench -policies decision-tree,tuned=my-scheduler.json
//	fleetbench -qps 200 -warmup 0 -window 10m -scenarios a -policies decision-tree   # one run, no files
//	fleetbench -count-routed=false -gateway-vms 4 -out /tmp/r    # burst-herding variants
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/fleet"
	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fleetbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	var (
		scenarios   = fs.String("scenarios", "a,b,d,e,f", "comma-separated scenarios: a (seed: 8 replicas, max-lora 4, 10 equal adapters), b (regression: 10 replicas, max-lora 3, 15 skewed adapters), c (base model only: 8 replicas, no adapters), d (150 shared 6,000-token contexts), e (multi-turn chat), f (a's adapters with their own 1,000-token system prompts)")
		policies    = fs.String("policies", defaultPolicies(), "comma-separated policies: scheduler profiles, "+fleet.EnvoyLeastRequest+", or name=path/to/scheduler-config.json")
		loads       = fs.String("loads", "20,40,60,70,80,90,100,110,120,130", "offered loads in % of each scenario's measured fleet saturation")
		qps         = fs.Float64("qps", 0, "if set, one run per scenario and policy at this absolute rate (req/s), printed only; -loads is ignored")
		seed        = fs.Uint64("seed", 1, "first seed of the workload and of the policies' random choices")
		seeds       = fs.Int("seeds", 3, "seeds pooled per point (seed, seed+1, ...): latency percentiles over all their requests")
		warmup      = fs.Duration("warmup", time.Minute, "simulated warmup before the measurement window")
		window      = fs.Duration("window", 5*time.Minute, "simulated measurement window of arrivals")
		scrape      = fs.Duration("scrape", fleet.DefaultScrapeInterval, "metrics scrape interval seen by the policies")
		criticality = fs.String("criticality", "", "criticality mix for every scenario, e.g. critical=0.7,sheddable=0.3 (default: all critical)")
		knee        = fs.Float64("knee", 100, "load in % at which the report checks the targets")
		parallel    = fs.Int("parallel", runtime.GOMAXPROCS(0), "simulations run at once (results do not depend on it)")
		out         = fs.String("out", "e2e/results", "directory for RESULTS.md, results.csv and the SVG plots")
		quiet       = fs.Bool("quiet", false, "no progress lines")
		gatewayVMs  = fs.Int("gateway-vms", 1, "routing VMs (Envoy workers) per gateway, each with its own scheduler and snapshot copy")
		gateways    = fs.Int("gateways", 1, "Envoy replicas sharing the traffic, each with -gateway-vms VMs and its own in-flight counts")
		loraRule    = fs.String("lora-admission", "skip", "LoRA admission of every replica: skip (vLLM V1) or fifo (strict arrival order)")
		salt        = fs.Uint64("policy-salt", 0, "draw the policies' random choices (tie-breaks, random picks) from other streams, the traffic unchanged (0: the seed's own): what a seed's result owes to those draws")
		fifoAt      = fs.Float64("compare-lora-fifo", 100, "also run every policy at this load (%) with FIFO LoRA admission on the scenarios with adapters (0: off)")
		countRouted optionalBool
	)
	fs.Var(&countRouted, "count-routed", fmt.Sprintf("countRoutedSinceSnapshot for scheduler policies whose configuration leaves it out (default: the scheduler's, %t)", scheduler.DefaultCountRoutedSinceSnapshot))
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *gatewayVMs < 1 || *gateways < 1 {
		return fmt.Errorf("-gateways %d, -gateway-vms %d: want at least 1", *gateways, *gatewayVMs)
	}
	admission, err := vllmsim.ParseLoRAAdmission(*loraRule)
	if err != nil {
		return fmt.Errorf("-lora-admission: %w", err)
	}
	if *fifoAt < 0 {
		return fmt.Errorf("-compare-lora-fifo: %v, want a load in %% or 0", *fifoAt)
	}
	if admission == vllmsim.LoRAFIFO {
		*fifoAt = 0 // nothing to compare with
	}
	var scs []fleet.Scenario
	for _, name := range splitList(*scenarios) {
		sc, err := fleet.ScenarioByName(name)
		if err != nil {
			return err
		}
		if *criticality != "" {
			if sc.Criticality, err = fleet.ParseCriticalityMix(*criticality); err != nil {
				return err
			}
		}
		sc.Replica.LoRAAdmission = admission
		scs = append(scs, sc)
	}
	var pols []fleet.PolicySpec
	for _, arg := range splitList(*policies) {
		p, err := fleet.ParsePolicyWith(arg, fleet.PolicyOptions{CountRoutedSinceSnapshot: countRouted.value})
		if err != nil {
			return err
		}
		pols = append(pols, p)
	}
	if len(scs) == 0 || len(pols) == 0 {
		return errors.New("need at least one scenario and one policy")
	}
	if *qps > 0 {
		return single(scs, pols, *qps, *seed, *warmup, *window, *scrape, *gateways, *gatewayVMs)
	}
	var loadList []float64
	for _, s := range splitList(*loads) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !(v > 0) {
			return fmt.Errorf("-loads: %q is not a positive percentage", s)
		}
		loadList = append(loadList, v/100)
	}
	cfg := fleet.SweepConfig{
		Scenarios: scs, Loads: loadList, Policies: pols, Seed: *seed, Seeds: *seeds,
		Warmup: *warmup, Window: *window, ScrapeInterval: *scrape, Gateways: *gateways, GatewayVMs: *gatewayVMs, Parallel: *parallel,
		LoRAFIFOAt: *fifoAt / 100, PolicySalt: *salt,
	}
	if !*quiet {
		cfg.Progress = os.Stderr
	}
	start := time.Now()
	reality, err := fleet.RealityCheck(*seed)
	if err != nil {
		return err
	}
	results, err := fleet.Sweep(cfg)
	if err != nil {
		return err
	}
	rep := &fleet.Report{
		Command: "fleetbench " + strings.Join(args, " "),
		Config:  cfg, Reality: reality, Results: results, Knee: *knee / 100,
	}
	if err := rep.WriteFiles(*out); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%d runs in %.1fs)\n", filepath.Join(*out, "RESULTS.md"), len(scs)*len(loadList)*len(pols), time.Since(start).Seconds())
	return nil
}

// single runs each scenario and policy once at an absolute rate: the speed
// check (BenchmarkTenMinutesAt200QPS's run) and quick experiments.
func single(scs []fleet.Scenario, pols []fleet.PolicySpec, qps float64, seed uint64, warmup, window, scrape time.Duration, gateways, gatewayVMs int) error {
	for _, sc := range scs {
		for _, p := range pols {
			start := time.Now()
			r, err := fleet.Run(fleet.RunConfig{Scenario: sc, Policy: p, Rate: qps, Seed: seed, Warmup: warmup, Window: window, ScrapeInterval: scrape,
				Gateways: gateways, GatewayVMs: gatewayVMs})
			if err != nil {
				return err
			}
			fmt.Printf("%s %-20s %.0f req/s for %v: %d requests, %.1f req/s, %.0f tok/s; p90 TTFT %v TPOT %v NTPOT %v e2e %v; %d dropped; %d adapter loads; %d preemptions; prefix hit rate %.1f%%; simulated to %v in %.2fs\n",
				sc.Name, p.Name, qps, window, r.Arrivals, r.ThroughputRPS, r.OutputTokPS,
				r.TTFT.P90.Round(time.Millisecond), r.TPOT.P90.Round(100*time.Microsecond), r.NTPOT.P90.Round(100*time.Microsecond), r.E2E.P90.Round(time.Millisecond),
				r.Dropped, r.AdapterLoads, r.Preemptions, 100*r.HitRate(), r.End.Round(time.Second), time.Since(start).Seconds())
		}
	}
	return nil
}

// optionalBool is a boolean flag that remembers whether it was given.
type optionalBool struct{ value *bool }

func (b *optionalBool) String() string {
	if b == nil || b.value == nil {
		return ""
	}
	return strconv.FormatBool(*b.value)
}

func (b *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false, got %q", s)
	}
	b.value = &v
	return nil
}

func (b *optionalBool) IsBoolFlag() bool { return true }

func defaultPolicies() string {
	var names []string
	for _, p := range fleet.DefaultPolicies() {
		names = append(names, p.Name)
	}
	return strings.Join(names, ",")
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
