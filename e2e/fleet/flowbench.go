package fleet

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

// The flow-control benchmark: scenario (a) with the mixed criticality mix
// at loads past saturation, and a burst scenario, each under today's
// immediate 429 and the flow-control variant of the same profile.

// FlowBenchConfig configures RunFlowBench.
type FlowBenchConfig struct {
	// Base is the profile whose immediate 429 is compared with its
	// flow-control variant (decision-tree by default).
	Base PolicySpec
	// Extra are more profiles measured both ways, to tell what the queue
	// does from what the profile's own capacity test does.
	Extra []PolicySpec
	Flow  flowcontrol.Config
	// Loads are the overload points (fractions of saturation).
	Loads []float64
	// BurstLoad is the base load of the burst scenario, Burst its bursts.
	BurstLoad float64
	Burst     Burst
	// VMLoad is the load of the cross-VM admission comparison with VMs
	// gateway VMs.
	VMLoad float64
	VMs    int

	Seed                   uint64
	Seeds                  int
	Warmup, Window, Scrape time.Duration
	Parallel               int
	Progress               io.Writer
}

// DefaultFlowBench is the benchmark.
func DefaultFlowBench() FlowBenchConfig {
	return FlowBenchConfig{
		Loads:     []float64{1.1, 1.3, 1.5},
		BurstLoad: 0.8,
		Burst:     Burst{Every: time.Minute, Length: 10 * time.Second, Offset: 30 * time.Second, Factor: 2},
		VMLoad:    1.1, VMs: 4,
		Seed: 1, Seeds: 10, Warmup: time.Minute, Window: 5 * time.Minute, Scrape: DefaultScrapeInterval,
		Parallel: 2,
	}
}

// FlowBenchRow is one policy at one point.
type FlowBenchRow struct {
	Point  string // "110%", "burst", "4 VMs"
	Load   float64
	Policy string
	Result Result
	// ServedOfBaseRefused, in the burst rows: of the non-critical requests
	// the base policy refused, how many this policy completed (by arrival,
	// same seeds); BaseRefused is their number.
	ServedOfBaseRefused, BaseRefused int
}

// FlowReport is what RunFlowBench measured.
type FlowReport struct {
	Config   FlowBenchConfig
	Scenario Scenario
	Capacity Capacity
	Rows     []FlowBenchRow
	Elapsed  time.Duration
}

// RunFlowBench runs the benchmark.
func RunFlowBench(cfg FlowBenchConfig) (*FlowReport, error) {
	if cfg.Base.New == nil {
		var err error
		if cfg.Base, err = PolicyByName(scheduler.ProfileDecisionTree); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	sc := SeedScenario()
	sc.Criticality = CriticalityMix{Critical: 0.6, Standard: 0.2, Sheddable: 0.2}
	capa, err := MeasureCapacity(sc, cfg.Seed)
	if err != nil {
		return nil, err
	}
	rep := &FlowReport{Config: cfg, Scenario: sc, Capacity: capa}
	bases := append([]PolicySpec{cfg.Base}, cfg.Extra...)
	type job struct {
		row *FlowBenchRow
		run RunConfig
	}
	var jobs []job
	add := func(point string, load float64, p PolicySpec, mod func(*RunConfig)) {
		// Arrivals go on for a TTL after the window, for every policy (the
		// same arrivals), so a queue holding requests at the window's end
		// is not emptied into an idle fleet (RunConfig.Cooldown).
		rc := RunConfig{Scenario: sc, Policy: p, Rate: load * capa.FleetRPS, Load: load, Seed: cfg.Seed,
			Warmup: cfg.Warmup, Window: cfg.Window, ScrapeInterval: cfg.Scrape, Cooldown: cfg.Flow.WithDefaults().TTL}
		if mod != nil {
			mod(&rc)
		}
		rep.Rows = append(rep.Rows, FlowBenchRow{Point: point, Load: load, Policy: p.Name})
		jobs = append(jobs, job{run: rc})
	}
	for _, load := range cfg.Loads {
		for _, b := range bases {
			add(pct(load), load, b, nil)
			add(pct(load), load, FlowPolicySpec(b, cfg.Flow), nil)
		}
	}
	// The critical load alone (every non-critical request refused, as it
	// were): the floor of critical TTFT that admitting non-critical
	// requests can only raise.
	alone := func(rc *RunConfig) {
		rc.Scenario.Criticality = CriticalityMix{Critical: 1}
		rc.Rate *= sc.Criticality.Critical / (sc.Criticality.Critical + sc.Criticality.Standard + sc.Criticality.Sheddable)
	}
	for _, load := range cfg.Loads {
		add(pct(load)+aloneSuffix, load, cfg.Base, alone)
	}
	burst := func(rc *RunConfig) { rc.Burst, rc.RecordOutcomes = cfg.Burst, true }
	for _, b := range bases {
		add("burst", cfg.BurstLoad, b, burst)
		add("burst", cfg.BurstLoad, FlowPolicySpec(b, cfg.Flow), burst)
	}
	vms := func(rc *RunConfig) { rc.GatewayVMs = cfg.VMs }
	vmPoint := fmt.Sprintf("%s, %d VMs", pct(cfg.VMLoad), cfg.VMs)
	flow := FlowPolicySpec(cfg.Base, cfg.Flow)
	add(vmPoint, cfg.VMLoad, cfg.Base, vms)
	add(vmPoint, cfg.VMLoad, flow, vms)
	add(vmPoint, cfg.VMLoad, FlowLocalAdmission(flow), vms)
	for i := range jobs {
		jobs[i].row = &rep.Rows[i]
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		firstEr error
		work    = make(chan job)
	)
	for range max(cfg.Parallel, 1) {
		wg.Go(func() {
			for j := range work {
				r, err := RunSeeds(j.run, max(cfg.Seeds, 1))
				mu.Lock()
				if err != nil && firstEr == nil {
					firstEr = err
				}
				j.row.Result = r
				if cfg.Progress != nil {
					fmt.Fprintf(cfg.Progress, "flowbench: %s %s done\n", j.row.Point, j.row.Policy)
				}
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	if firstEr != nil {
		return nil, firstEr
	}
	// Burst rows: compare request by request with the base policy's run.
	for i := range rep.Rows {
		row := &rep.Rows[i]
		if row.Point != "burst" {
			continue
		}
		base := rep.find("burst", strings.TrimSuffix(row.Policy, FlowSuffix))
		if base == nil {
			continue
		}
		row.BaseRefused, row.ServedOfBaseRefused = servedOf(base.Result.Outcomes, row.Result.Outcomes)
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// servedOf counts the arrivals refused in base and how many of them
// completed in other (the same arrivals in the same order). Critical
// requests are never refused, so every refusal is non-critical.
func servedOf(base, other []ArrivalOutcome) (refused, served int) {
	for i, o := range base {
		if o != OutcomeRefused || i >= len(other) {
			continue
		}
		refused++
		if other[i] == OutcomeCompleted {
			served++
		}
	}
	return refused, served
}

func (r *FlowReport) find(point, policy string) *FlowBenchRow {
	for i := range r.Rows {
		if r.Rows[i].Point == point && r.Rows[i].Policy == policy {
			return &r.Rows[i]
		}
	}
	return nil
}

func pct(load float64) string { return fmt.Sprintf("%.0f%%", 100*load) }

// aloneSuffix marks the points of the critical load alone.
const aloneSuffix = " critical alone"

// refusedShare is the fraction of measured non-critical requests refused.
func refusedShare(classes [3]ClassResult) float64 {
	a, b := classes[scheduler.Standard], classes[scheduler.Sheddable]
	if m := a.Measured + b.Measured; m > 0 {
		return float64(a.Refused+b.Refused) / float64(m)
	}
	return 0
}

// leastRefusedShare is the least share of non-critical requests any
// gateway must refuse at load when the fleet serves capacity req/s and
// every critical request is served: what exceeds it cannot be served,
// however it is queued.
func (r *FlowReport) leastRefusedShare(load, capacity float64) float64 {
	mix := r.Scenario.Criticality
	total := mix.Critical + mix.Standard + mix.Sheddable
	offered := load * r.Capacity.FleetRPS
	crit := offered * mix.Critical / total
	nonCrit := offered - crit
	room := max(capacity-crit, 0)
	if nonCrit <= room {
		return 0
	}
	return (nonCrit - room) / nonCrit
}

// FlowCapacity is what the fleet serves with flow control's admission: the
// throughput of the flow-control variant of the base profile at the
// highest overload point, where its queue is never empty (0 without one).
func (r *FlowReport) FlowCapacity() float64 {
	best, load := 0.0, 0.0
	for _, row := range r.Rows {
		if row.Policy == r.Config.Base.Name+FlowSuffix && !strings.Contains(row.Point, "VMs") && row.Point != "burst" && row.Load > load {
			best, load = row.Result.ThroughputRPS, row.Load
		}
	}
	return best
}

// spread is a median and range over seeds.
type spread struct {
	med, lo, hi float64
	n           int
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	v = slices.Clone(v)
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{med: m, lo: v[0], hi: v[len(v)-1], n: len(v)}
}

func (s spread) format(f func(float64) string) string {
	if s.n == 0 {
		return "—"
	}
	if s.n == 1 {
		return f(s.med)
	}
	return fmt.Sprintf("%s (%s – %s)", f(s.med), f(s.lo), f(s.hi))
}

// perSeed pairs row's seeds with base's (the same arrivals) and applies f
// to each pair.
func perSeed(base, row *FlowBenchRow, f func(b, r *SeedResult) (float64, bool)) spread {
	var v []float64
	for k := range row.Result.PerSeed {
		if base == nil || k >= len(base.Result.PerSeed) {
			break
		}
		if x, ok := f(&base.Result.PerSeed[k], &row.Result.PerSeed[k]); ok {
			v = append(v, x)
		}
	}
	return spreadOf(v)
}

func fewer(b, r *SeedResult) (float64, bool) {
	rb, rr := refusedShare(b.Classes), refusedShare(r.Classes)
	if rr == 0 {
		return 0, false
	}
	return rb / rr, true
}

func critP90Change(b, r *SeedResult) (float64, bool) {
	pb, pr := b.Classes[scheduler.Critical].TTFT.P90, r.Classes[scheduler.Critical].TTFT.P90
	if pb == 0 {
		return 0, false
	}
	return float64(pr)/float64(pb) - 1, true
}

func times(x float64) string   { return fmt.Sprintf("%.2f×", x) }
func percent(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }
func change(x float64) string  { return fmt.Sprintf("%+.0f%%", 100*x) }

// Markdown writes the report.
func (r *FlowReport) Markdown(w io.Writer, command string) {
	c := r.Config
	seeds := max(c.Seeds, 1)
	fmt.Fprintf(w, "# Flow control in the fleet simulation\n\n")
	fmt.Fprintf(w, "Generated by `%s` (deterministic: the same command gives the same numbers; virtual time, so the shared machine does not change them).\n\n", command)
	fmt.Fprintf(w, "Scenario (a): %s; criticality mix %s. Fleet saturation %.1f req/s (replica %.1f req/s, overloaded). Seeds %d..%d; %v warmup, %v window, scrapes every %v. ",
		r.Scenario.Title, r.Scenario.Criticality, r.Capacity.FleetRPS, r.Capacity.Replica.RequestsPerSecond, c.Seed, c.Seed+uint64(seeds)-1, c.Warmup, c.Window, c.Scrape)
	fc := c.Flow.WithDefaults()
	fmt.Fprintf(w, "Flow control: the plugin's queue and room test (scheduler/flowcontrol) per gateway VM, %d requests / %d MiB, TTL %v, released every %v and on each new snapshot, an endpoint taking a Standard or Sheddable request while waiting ≤ %d and KV-cache usage ≤ %.2f; `X%s` is policy X with it, X's own 429 otherwise.\n\n",
		fc.MaxRequests, fc.MaxBytes>>20, fc.TTL, fc.ReleaseInterval, fc.Admit.MaxWaiting, fc.Admit.MaxKVCacheUsage, FlowSuffix)
	fmt.Fprintf(w, "Refused = answered 429 (at once, queue full, or expired in the queue). TTFT of a request that waited counts its wait. Pooled figures are over every seed's requests; \"per seed\" is the median (min – max) of the seeds' own figures, each against today's on the same seed.\n\n")

	flowCap := r.FlowCapacity()
	fmt.Fprintf(w, "## Overload\n\n")
	fmt.Fprintf(w, "| load | policy | non-critical refused | fewer than today, per seed | critical TTFT p50 / p90 | critical p90 vs today, per seed | standard / sheddable TTFT p90 | req/s | queued / released / expired | wait p90 |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---|---:|---:|---:|---|---:|\n")
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Point == "burst" || strings.Contains(row.Point, "VMs") || strings.HasSuffix(row.Point, aloneSuffix) {
			continue
		}
		base := r.find(row.Point, strings.TrimSuffix(row.Policy, FlowSuffix))
		if base == row {
			base = nil
		}
		res := &row.Result
		nc := res.NonCritical()
		ratio, worse := "today", "—"
		if base != nil {
			ratio, worse = perSeed(base, row, fewer).format(times), perSeed(base, row, critP90Change).format(change)
		}
		fmt.Fprintf(w, "| %s | %s | %d (%.1f%%) | %s | %s / %s | %s | %s | %.1f | %d / %d / %d | %s |\n",
			row.Point, row.Policy, nc.Refused, 100*refusedShare(res.Classes), ratio,
			dur(res.Classes[scheduler.Critical].TTFT.P50), dur(res.Classes[scheduler.Critical].TTFT.P90), worse,
			dur(res.Classes[scheduler.Standard].TTFT.P90)+" / "+dur(res.Classes[scheduler.Sheddable].TTFT.P90), res.ThroughputRPS, res.Flow.Queued, res.Flow.Released, res.Flow.Expired, dur(res.Flow.Wait.P90))
	}
	fmt.Fprintf(w, "\n### Critical requests against the critical load alone\n\n")
	fmt.Fprintf(w, "The same fleet with only the critical arrivals (%s at the critical share of each load's rate): the critical TTFT no admission of non-critical requests can beat, since those share the replicas' batches.\n\n", c.Base.Name)
	fmt.Fprintf(w, "| load | critical alone p90 (per seed) | %s p90 | %s%s p90 |\n|---|---:|---:|---:|\n", c.Base.Name, c.Base.Name, FlowSuffix)
	for _, load := range c.Loads {
		a := r.find(pct(load)+aloneSuffix, c.Base.Name)
		today, flow := r.find(pct(load), c.Base.Name), r.find(pct(load), c.Base.Name+FlowSuffix)
		if a == nil || today == nil || flow == nil {
			continue
		}
		var p90s []float64
		for _, sr := range a.Result.PerSeed {
			p90s = append(p90s, float64(sr.Classes[scheduler.Critical].TTFT.P90))
		}
		fmt.Fprintf(w, "| %s | %s (%s) | %s | %s |\n", pct(load), dur(a.Result.Classes[scheduler.Critical].TTFT.P90),
			spreadOf(p90s).format(func(x float64) string { return dur(time.Duration(x)) }),
			dur(today.Result.Classes[scheduler.Critical].TTFT.P90), dur(flow.Result.Classes[scheduler.Critical].TTFT.P90))
	}
	fmt.Fprintf(w, "\n### What any gateway must refuse\n\n")
	fmt.Fprintf(w, "Past saturation some non-critical requests cannot be served at all, however they are queued: the offered load beyond what the fleet serves once every critical request is. Two capacities: the fleet saturation above (%.1f req/s, one replica measured overloaded, with the preemptions that brings), and what the fleet served with flow control's admission at the highest load, where its queue never empties (%.1f req/s: replicas fed only while a request starts at once, without preemption). The second is the higher, so it bounds what any admission can do here.\n\n", r.Capacity.FleetRPS, flowCap)
	fmt.Fprintf(w, "| load | offered (critical / non-critical) req/s | least refused at %.1f req/s | at %.1f req/s | today refused | most \"× fewer\" possible (at %.1f) |\n|---|---|---:|---:|---:|---:|\n", r.Capacity.FleetRPS, flowCap, flowCap)
	mix := r.Scenario.Criticality
	for _, load := range c.Loads {
		base := r.find(pct(load), c.Base.Name)
		if base == nil {
			continue
		}
		offered := load * r.Capacity.FleetRPS
		crit := offered * mix.Critical / (mix.Critical + mix.Standard + mix.Sheddable)
		least := r.leastRefusedShare(load, flowCap)
		today := refusedShare(base.Result.Classes)
		most := "any"
		if least > 0 {
			most = fmt.Sprintf("%.2f×", today/least)
		}
		fmt.Fprintf(w, "| %s | %.1f (%.1f / %.1f) | %.1f%% | %.1f%% | %.1f%% | %s |\n", pct(load), offered, crit, offered-crit,
			100*r.leastRefusedShare(load, r.Capacity.FleetRPS), 100*least, 100*today, most)
	}

	fmt.Fprintf(w, "\n## Burst: %s base load, %.0f× the rate for %v every %v\n\n", pct(c.BurstLoad), c.Burst.Factor, c.Burst.Length, c.Burst.Every)
	fmt.Fprintf(w, "| policy | non-critical refused | seeds with refusals | critical TTFT p50 / p90 | critical p90 vs today, per seed | of today's refused, served within TTL | per seed (seeds with refusals today) | queued / released / expired | wait p90 |\n|---|---:|---:|---|---:|---:|---:|---|---:|\n")
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Point != "burst" {
			continue
		}
		res := &row.Result
		base := r.find("burst", strings.TrimSuffix(row.Policy, FlowSuffix))
		served, servedSeeds, worse := "—", "—", "—"
		if base != nil && base != row {
			worse = perSeed(base, row, critP90Change).format(change)
			if row.BaseRefused > 0 {
				served = fmt.Sprintf("%d of %d (%.1f%%)", row.ServedOfBaseRefused, row.BaseRefused, 100*float64(row.ServedOfBaseRefused)/float64(row.BaseRefused))
			}
			servedSeeds = perSeed(base, row, func(b, f *SeedResult) (float64, bool) {
				ref, sv := servedOf(b.Outcomes, f.Outcomes)
				return float64(sv) / float64(max(ref, 1)), ref > 0
			}).format(percent)
		}
		refusing := 0
		for _, sr := range res.PerSeed {
			if refusedShare(sr.Classes) > 0 {
				refusing++
			}
		}
		fmt.Fprintf(w, "| %s | %d (%.1f%%) | %d of %d | %s / %s | %s | %s | %s | %d / %d / %d | %s |\n", row.Policy, res.NonCritical().Refused, 100*refusedShare(res.Classes),
			refusing, len(res.PerSeed), dur(res.Classes[scheduler.Critical].TTFT.P50), dur(res.Classes[scheduler.Critical].TTFT.P90), worse, served, servedSeeds,
			res.Flow.Queued, res.Flow.Released, res.Flow.Expired, dur(res.Flow.Wait.P90))
	}
	fmt.Fprintf(w, "\nA request released from the queue waited less than its TTL by construction, so \"served within TTL\" counts the requests today's 429 refused that this run completed (same arrivals, matched by arrival order).\n\n")

	fmt.Fprintf(w, "## Cross-VM admission: %s load, %d gateway VMs\n\n", pct(c.VMLoad), c.VMs)
	fmt.Fprintf(w, "Each VM has its own queue and snapshot copy; `%s` shares admissions through one CAS record (the plugin's), `%s` counts only its own.\n\n", FlowSuffix, FlowSuffix+LocalAdmissionSuffix)
	fmt.Fprintf(w, "| policy | non-critical refused | critical TTFT p50 / p90 | released | released where the room was already taken (waiting > %d) | released onto a queue over the decision tree's limit (waiting > %d) | CAS contention put-offs |\n|---|---:|---|---:|---:|---:|---:|\n",
		fc.Admit.MaxWaiting, scheduler.DefaultQueueThresholdCritical)
	for _, row := range r.Rows {
		if !strings.Contains(row.Point, "VMs") {
			continue
		}
		res := &row.Result
		share := func(n int) string {
			if res.Flow.Released == 0 {
				return "—"
			}
			return fmt.Sprintf("%d (%.1f%%)", n, 100*float64(n)/float64(res.Flow.Released))
		}
		fmt.Fprintf(w, "| %s | %d (%.1f%%) | %s / %s | %d | %s | %s | %d |\n", row.Policy, res.NonCritical().Refused, 100*refusedShare(res.Classes),
			dur(res.Classes[scheduler.Critical].TTFT.P50), dur(res.Classes[scheduler.Critical].TTFT.P90), res.Flow.Released,
			share(res.Flow.OverRoom), share(res.Flow.OverThreshold), res.Flow.Contention)
	}
	fmt.Fprintf(w, "\n(%d runs in %.0f s of wall time.)\n", len(r.Rows)*seeds, r.Elapsed.Seconds())
}

func dur(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}
