// Command scalebench measures the metrics path at fleet sizes (package
// e2e/scale): simulated agents or the aggregator tier push real wire
// messages into the real .wasm in envoyhost while router workers serve
// requests, and it prints the gateway's CPU per phase, the plugin's own
// costs, CAS retries, contention and staleness.
//
//	scalebench -modes direct-v2,relay -sizes 100,1000 -per-node 2 -window 15s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/fleet"
	"github.com/wasm-epp/wasm-epp/e2e/scale"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

var verboseMemory = flag.Bool("memory-samples", false, "print every memory sample of a window with -sample (guest heap, collector goal, GC cycles)")

func main() {
	var (
		binDir    = flag.String("bin", "bin", "directory with envoyhost")
		bootstrap = flag.String("bootstrap", "envoy/envoy.yaml", "bootstrap template")
		wasm      = flag.String("wasm", "bin/wasm-epp.wasm", "plugin under test")
		baseWasm  = flag.String("base-wasm", "", "plugin for the direct-v1 mode (a build storing wire version 1); default -wasm")
		modes     = flag.String("modes", "direct-v2,relay", "comma-separated: direct-v1, direct-v2, relay (the aggregator tier's output built in process), aggregator (2 metricsagent --mode aggregator processes)")
		sizes     = flag.String("sizes", "100,1000", "comma-separated endpoint counts")
		perNode   = flag.Int("per-node", 2, "endpoints per node (one agent each)")
		reps      = flag.Int("reps", 1, "repetitions; variants are interleaved within each")
		window    = flag.Duration("window", 10*time.Second, "length of each measured phase")
		warmup    = flag.Duration("warmup", 5*time.Second, "pushes and requests before the first phase")
		rate      = flag.Float64("rate", 200, "requests per second in the phases with requests")
		change    = flag.Float64("change", 1, "fraction of endpoints whose values move each scrape")
		phases    = flag.String("phases", "", "phases in order (default pushes+requests,staleness,pushes,requests,idle)")
		out       = flag.String("out", "", "write every result as JSON lines to this file")
		cache     = flag.String("compilation-cache", filepath.Join(os.TempDir(), "wasm-epp-scalebench-cache"), "wazero compilation cache")
		verbose   = flag.Bool("v", false, "log progress")
		workDir   = flag.String("workdir", "", "keep each gateway's log and bootstrap under this directory")
		sample    = flag.Duration("sample", 0, "sample the gateway's memory this often within each phase (soak)")
		heartbeat = flag.Duration("heartbeat", 0, "agents push only what moved beyond the -send-* thresholds, and at least this often (the agent's --heartbeat); 0: every scrape, thresholds off")
		waitDelta = flag.Uint("send-waiting-delta", uint(wire.DefaultSendThresholds().Waiting), "with -heartbeat: the agent's --send-waiting-delta")
		runDelta  = flag.Uint("send-running-delta", uint(wire.DefaultSendThresholds().Running), "with -heartbeat: the agent's --send-running-delta")
		kvDelta   = flag.Float64("send-kv-delta", wire.DefaultSendThresholds().KVCacheUsage, "with -heartbeat: the agent's --send-kv-delta")
		relayEvry = flag.String("relay-interval", "", "relay mode: comma-separated times between two relays (the aggregator's --relay-interval), interleaved within each repetition; empty: the scrape interval (50ms)")
		fullEvery = flag.Duration("relay-full-every", 10*time.Second, "relay mode: carry every agent's block again this often (the aggregator's --relay-full-every); in between, only the blocks sent since the last relay")
		changes   = flag.String("changes", "", "instead of the bench: measure how often the fleet simulator's replicas move beyond the -send-* thresholds, for these scenarios (e2e/fleet names, comma-separated), at -change-loads under -change-policy, -per-node replicas to an agent")
		chLoads   = flag.String("change-loads", "0.5,0.8,1", "with -changes: loads as fractions of saturation (1 = the fleet reports' knee)")
		chPolicy  = flag.String("change-policy", "scoring", "with -changes: the routing policy (a scheduler profile)")
		chWindow  = flag.Duration("change-window", time.Minute, "with -changes: simulated time measured, after as much again of warm-up")
		resend    = flag.Duration("config-resend", time.Second, "each agent resends its configuration record this often while pushing when the gateway does not say which table it holds, or with -config-periodic (the agent's --config-resend; negative: never)")
		periodic  = flag.Bool("config-periodic", false, "the agents resend their configuration records every -config-resend whatever the gateway holds (agents before they read its answers); by default a record goes only when the gateway's answers to the metrics pushes name another table")
	)
	flag.Parse()
	send := wire.SendThresholds{Heartbeat: *heartbeat, Waiting: uint32(*waitDelta), Running: uint32(*runDelta), KVCacheUsage: *kvDelta}
	if err := send.Validate(); err != nil {
		fail(fmt.Errorf("-heartbeat, -send-*: %w", err))
	}
	for _, p := range []*string{binDir, bootstrap, wasm, baseWasm} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				fail(err)
			}
			*p = abs
		}
	}
	if *changes != "" {
		if send.Heartbeat == 0 {
			send.Heartbeat = wire.DefaultSendThresholds().Heartbeat
		}
		measureChanges(split(*changes), split(*chLoads), *chPolicy, *perNode, *reps, *chWindow, send)
		return
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	logf := func(string, ...any) {}
	if *verbose {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	}
	var enc *json.Encoder
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		enc = json.NewEncoder(f)
	}
	relayIntervals := []time.Duration{0}
	if *relayEvry != "" {
		relayIntervals = relayIntervals[:0]
		for _, d := range split(*relayEvry) {
			ri, err := time.ParseDuration(d)
			if err != nil || ri <= 0 {
				fail(fmt.Errorf("-relay-interval %q: want positive durations", d))
			}
			relayIntervals = append(relayIntervals, ri)
		}
	}
	var phaseList []scale.Phase
	for _, p := range split(*phases) {
		phaseList = append(phaseList, scale.Phase(p))
	}
	for r := 0; r < *reps; r++ {
		for _, size := range split(*sizes) {
			n, err := strconv.Atoi(size)
			if err != nil {
				fail(err)
			}
			for _, m := range split(*modes) {
				for _, ri := range relayIntervals {
					w := *wasm
					if scale.Mode(m) == scale.ModeDirectV1 && *baseWasm != "" {
						w = *baseWasm
					}
					cfg := scale.RunConfig{
						Gateway: scale.GatewayOptions{BinDir: *binDir, Bootstrap: *bootstrap, Wasm: w, CompilationCache: *cache},
						Mode:    scale.Mode(m), Endpoints: n, PerNode: *perNode, Change: *change, Rate: *rate,
						Window: *window, Warmup: *warmup, Windows: phaseList, Sample: *sample, ConfigResend: *resend, ConfigPeriodic: *periodic, Logf: logf,
						Send: send, RelayFullEvery: *fullEvery, RelayInterval: ri,
					}
					if *workDir != "" {
						cfg.Gateway.WorkDir = filepath.Join(*workDir, fmt.Sprintf("%s-%d-rep%d", m, n, r))
						if ri > 0 {
							cfg.Gateway.WorkDir += "-relay-" + ri.String()
						}
					}
					res, err := scale.Run(ctx, cfg)
					if err != nil {
						fail(fmt.Errorf("%s at %d: %w", m, n, err))
					}
					report(res)
					if enc != nil {
						if err := enc.Encode(res); err != nil {
							fail(err)
						}
					}
				}
			}
		}
	}
}

// measureChanges prints, per scenario and load, how often the simulated
// replicas' metrics moved and how often their agents would push.
func measureChanges(scenarios, loads []string, policy string, perNode, reps int, window time.Duration, send wire.SendThresholds) {
	pol, err := fleet.PolicyByName(policy)
	if err != nil {
		fail(err)
	}
	fmt.Printf("send thresholds: heartbeat %v, waiting %d, running %d, kv %.3f; policy %s; %v measured after %v\n",
		send.Heartbeat, send.Waiting, send.Running, send.KVCacheUsage, policy, window, window)
	for _, name := range scenarios {
		sc, err := fleet.ScenarioByName(name)
		if err != nil {
			fail(err)
		}
		for _, l := range loads {
			load, err := strconv.ParseFloat(l, 64)
			if err != nil {
				fail(err)
			}
			for seed := 1; seed <= max(reps, 1); seed++ {
				r, err := scale.MeasureChanges(scale.ChangeConfig{Scenario: sc, Load: load, Policy: pol, Seed: uint64(seed),
					Warmup: window, Window: window, PerNode: perNode, Send: send})
				if err != nil {
					fail(err)
				}
				fmt.Printf("seed %d: %v\n", seed, r)
			}
		}
	}
}

func report(r *scale.Result) {
	relay := ""
	if r.Config.RelayInterval > 0 {
		relay = " relay-interval=" + r.Config.RelayInterval.String()
	}
	fmt.Printf("%-10s endpoints=%d agents=%d per-node=%d%s\n", r.Config.Mode, r.Config.Endpoints, r.Agents, r.Config.PerNode, relay)
	for _, w := range r.Windows {
		sec := w.Duration.Seconds()
		line := fmt.Sprintf("  %-16s cpu %7.1f ms/s", w.Phase, float64(w.CPU.Microseconds())/1e3/sec)
		if w.AggregatorCPU > 0 {
			line += fmt.Sprintf(" (aggregators %.1f ms/s)", float64(w.AggregatorCPU.Microseconds())/1e3/sec)
		}
		if n := sum(w.Pushes); n > 0 {
			line += fmt.Sprintf("  pushes %6.0f/s %v", float64(n)/sec, w.Pushes)
		}
		if w.RelayBlocks > 0 {
			line += fmt.Sprintf("  blocks %.0f/s", float64(w.RelayBlocks)/sec)
		}
		if w.ApplyCount > 0 {
			line += fmt.Sprintf("  apply %.0f µs", w.ApplyMicros/float64(w.ApplyCount))
		}
		if n := sum(w.Configs); n > 0 {
			line += fmt.Sprintf("  configs %4.0f/s %v", float64(n)/sec, w.Configs)
		}
		if w.ConfigCount > 0 {
			line += fmt.Sprintf(" %.0f µs", w.ConfigMicros/float64(w.ConfigCount))
		}
		if w.RequestCount > 0 {
			line += fmt.Sprintf("  req %.0f µs (%d)", w.RequestUs/float64(w.RequestCount), w.RequestCount)
		}
		if w.DecideCount > 0 {
			line += fmt.Sprintf("  decide %.0f µs", w.DecideMicros/float64(w.DecideCount))
		}
		if w.Refreshes > 0 {
			line += fmt.Sprintf("  refresh %.0f µs ×%d", w.RefreshMicros/float64(w.Refreshes), w.Refreshes)
		}
		if w.CASRetries > 0 || w.Contention > 0 {
			line += fmt.Sprintf("  cas-retries %d contention %d", w.CASRetries, w.Contention)
		}
		if len(w.Lags) > 0 || w.Missed > 0 {
			p := scale.Percentiles(w.Lags, 0.5, 0.99)
			line += fmt.Sprintf("  staleness p50 %v p99 %v (n=%d, missed %d, %d polls of %v)", p[0].Round(100*time.Microsecond), p[1].Round(100*time.Microsecond), len(w.Lags), w.Missed, w.Polls, w.PollTime.Round(100*time.Microsecond))
		}
		line += fmt.Sprintf("  rss %d MiB", w.RSS>>20)
		if w.GuestMemory > 0 {
			line += fmt.Sprintf("  guest %.1f MiB", float64(w.GuestMemory)/(1<<20))
		}
		fmt.Println(line)
		if n := len(w.Memory); n > 0 {
			first, last := w.Memory[0], w.Memory[n-1]
			maxG := int64(0)
			for _, m := range w.Memory {
				maxG = max(maxG, m.Guest)
			}
			fmt.Printf("  memory over %v: guest %.1f -> %.1f MiB (max %.1f), rss %d -> %d MiB, %d samples\n", w.Duration.Round(time.Second),
				float64(first.Guest)/(1<<20), float64(last.Guest)/(1<<20), float64(maxG)/(1<<20), first.RSS>>20, last.RSS>>20, n)
			if *verboseMemory {
				for _, m := range w.Memory {
					fmt.Printf("    %6v guest %7.1f MiB  objects %7.1f  live %7.1f  goal %7.1f MiB  gc cycles %d  rss %d MiB\n", m.At.Round(time.Second),
						mib(m.Guest), mib(m.HeapObjects), mib(m.HeapLive), mib(m.HeapGoal), m.GCCycles, m.RSS>>20)
				}
			}
		}
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func sum(m map[int]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scalebench:", err)
	os.Exit(1)
}
