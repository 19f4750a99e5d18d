package scale

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Mode is how metrics reach the gateway.
type Mode string

const (
	// ModeDirectV1: every agent pushes wire version 1 to the receiver
	// (the first design, for plugins that still store version 1).
	ModeDirectV1 Mode = "direct-v1"
	// ModeDirectV2: every agent pushes wire version 2 to the receiver.
	ModeDirectV2 Mode = "direct-v2"
	// ModeRelay: one relay push per interval holding every agent's latest
	// block, built in process: what the aggregator tier sends each Envoy.
	ModeRelay Mode = "relay"
	// ModeAggregator: agents push to aggregator processes, which relay to
	// the receiver (RunConfig.Aggregators).
	ModeAggregator Mode = "aggregator"
)

// RunConfig is one measurement.
type RunConfig struct {
	Gateway   GatewayOptions
	Mode      Mode
	Endpoints int
	PerNode   int
	Interval  time.Duration
	Change    float64
	// Send is when each agent pushes (zero: every scrape); RelayFullEvery
	// how often a relay carries every block again (ModeRelay; 0: every
	// relay).
	Send           wire.SendThresholds
	RelayFullEvery time.Duration
	// RelayInterval is the time between two relays (ModeRelay; 0:
	// Interval, the scrape interval).
	RelayInterval time.Duration
	// Rate is the request load (req/s) in the windows with requests.
	Rate   float64
	Conns  int
	Window time.Duration
	Warmup time.Duration
	// Aggregators, for ModeAggregator, is how many aggregator processes
	// run (default 2).
	Aggregators int
	// Windows lists the phases to measure, in order (default all of them
	// but soak).
	Windows []Phase
	// Sample, when set, samples memory every Sample within each window.
	Sample time.Duration
	// ConfigResend is how often each agent resends its configuration
	// record while pushes run (0: every second, the agent's default;
	// negative: never).
	ConfigResend time.Duration
	// ConfigPeriodic makes the agents resend their records every
	// ConfigResend whatever the gateway holds, as agents did before they
	// read its answers (wire.ConfigHeldHeader); by default they send a
	// record only when the answers name another table.
	ConfigPeriodic bool
	Logf           func(string, ...any) `json:"-"`
}

// Phase is one measured window.
type Phase string

const (
	// PhaseBoth: pushes and requests.
	PhaseBoth Phase = "pushes+requests"
	// PhasePushes: pushes only.
	PhasePushes Phase = "pushes"
	// PhaseRequests: requests only, metrics unchanged.
	PhaseRequests Phase = "requests"
	// PhaseIdle: nothing.
	PhaseIdle Phase = "idle"
	// PhaseStaleness: pushes and requests, and the staleness probe (its
	// polls are requests too, so CPU is measured in the other phases).
	PhaseStaleness Phase = "staleness"
	// PhaseSoak: pushes and requests for a long window, memory sampled.
	PhaseSoak Phase = "soak"
)

// Window is what one phase measured.
type Window struct {
	Phase    Phase
	Duration time.Duration
	// CPU is the gateway process's CPU time over the window;
	// AggregatorCPU the aggregator processes' (ModeAggregator).
	CPU, AggregatorCPU time.Duration
	// Pushes, configuration records and requests answered, by status.
	Pushes     map[int]int64
	Configs    map[int]int64
	PushBytes  int64
	PushErrors int64
	// RelayBlocks counts the agent blocks the relays carried (ModeRelay).
	RelayBlocks  int64
	Requests     map[int]int64
	RequestsSent int64
	// From the plugin's own metrics: receiver time in Apply, request
	// time in the filter callbacks, CAS retries, contention answers.
	ApplyCount, RequestCount int64
	ApplyMicros, RequestUs   float64
	// ConfigCount and ConfigMicros: the receiver's time on configuration
	// records.
	ConfigCount            int64
	ConfigMicros           float64
	CASRetries, Contention int64
	Refreshes              int64
	RefreshMicros          float64
	// DecideCount and DecideMicros: the scheduler's time per decision
	// (inside RequestUs).
	DecideCount  int64
	DecideMicros float64
	// Staleness probes (push sent -> visible to a router).
	Lags          []time.Duration
	Missed, Polls int
	PollTime      time.Duration // the polls' mean round trip
	RSS           int64
	GuestMemory   int64
	// Memory samples over the window (RunConfig.Sample).
	Memory []MemorySample
}

// MemorySample is the gateway's memory at one moment of a window. The
// guest readings are sums over every VM (package plugin/internal/vmmem).
type MemorySample struct {
	At    time.Duration // since the window began
	Guest int64         // wasm_epp.vm.memory_bytes: every VM's Go runtime memory
	RSS   int64
	// HeapObjects, HeapLive and HeapGoal are the guests' heap in objects,
	// live at the last collection, and the collectors' goals; GCCycles the
	// collections completed.
	HeapObjects, HeapLive, HeapGoal, GCCycles int64
}

func memorySample(at time.Duration, st *Stats, rss int64) MemorySample {
	return MemorySample{At: at, Guest: st.Values["wasm_epp.vm.memory_bytes"], RSS: rss,
		HeapObjects: st.Values["wasm_epp.vm.heap_objects_bytes"], HeapLive: st.Values["wasm_epp.vm.heap_live_bytes"],
		HeapGoal: st.Values["wasm_epp.vm.heap_goal_bytes"], GCCycles: st.Values["wasm_epp.vm.gc_cycles"]}
}

// Result is one run.
type Result struct {
	Config  RunConfig
	Agents  int
	Windows []Window
}

// Run performs one measurement: start the gateway, warm up, then measure
// each phase for Window.
func Run(ctx context.Context, cfg RunConfig) (*Result, error) {
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if cfg.Interval == 0 {
		cfg.Interval = 50 * time.Millisecond
	}
	if cfg.Conns == 0 {
		cfg.Conns = 8
	}
	if cfg.ConfigResend == 0 {
		cfg.ConfigResend = time.Second
	}
	if len(cfg.Windows) == 0 {
		cfg.Windows = []Phase{PhaseBoth, PhaseStaleness, PhasePushes, PhaseRequests, PhaseIdle}
	}
	up, err := StartUpstream()
	if err != nil {
		return nil, err
	}
	defer up.Close()
	gw, err := StartGateway(ctx, cfg.Gateway)
	if err != nil {
		return nil, err
	}
	defer gw.Stop()
	var aggs *Aggregators
	if cfg.Mode == ModeAggregator {
		n := cfg.Aggregators
		if n == 0 {
			n = 2
		}
		if aggs, err = StartAggregators(cfg.Gateway.BinDir, gw, n, cfg.Interval); err != nil {
			return nil, err
		}
		defer aggs.Stop()
	}
	fleet := NewFleet(cfg.Endpoints, cfg.PerNode, up.Port, 1, true)
	res := &Result{Config: cfg, Agents: len(fleet.Agents)}
	token, push, client := gw.Stack.Token(), gw.Stack.PushURL(), gw.Stack.ClientURL()

	configURL := push[:strings.Index(push[len("http://"):], "/")+len("http://")] + wire.ConfigPath
	probeEvents := make(chan ProbeEvent, 64)
	pushStats, configStats := &PushStats{}, &PushStats{}
	loadStats := &LoadStats{}
	probe := &Probe{}

	// Pushers (with the prober) and the load start and stop as the phases
	// need them; the fleet keeps its state (sequences) across restarts.
	var pushWG, loadWG sync.WaitGroup
	stopPush, stopLoad := func() {}, func() {}
	startPush := func() {
		pctx, cancel := context.WithCancel(ctx)
		stopPush = func() { cancel(); pushWG.Wait(); stopPush = func() {} }
		pushWG.Add(3)
		go func() {
			defer pushWG.Done()
			RunConfigResends(pctx, fleet, ConfigOptions{URL: configURL, Token: token, Resend: cfg.ConfigResend,
				OnDemand: !cfg.ConfigPeriodic, Pushes: pushStats, Interval: cfg.Interval, Stats: configStats})
		}()
		go func() {
			defer pushWG.Done()
			switch cfg.Mode {
			case ModeDirectV1, ModeDirectV2:
				v := 2
				if cfg.Mode == ModeDirectV1 {
					v = 1
				}
				RunDirect(pctx, fleet, DirectOptions{URLs: []string{push}, Token: token, Interval: cfg.Interval, Version: v,
					Change: cfg.Change, Send: cfg.Send, Probe: probeEvents, Stats: pushStats})
			case ModeRelay:
				RunRelay(pctx, fleet, RelayOptions{URLs: []string{push}, Token: token, Interval: cfg.Interval, RelayInterval: cfg.RelayInterval,
					Change: cfg.Change, Send: cfg.Send, FullEvery: cfg.RelayFullEvery, Probe: probeEvents, Stats: pushStats})
			case ModeAggregator:
				RunDirect(pctx, fleet, DirectOptions{URLs: aggs.URLs, Token: token, Interval: cfg.Interval, Version: 2,
					Change: cfg.Change, Send: cfg.Send, Probe: probeEvents, Stats: pushStats})
			}
		}()
		go func() {
			defer pushWG.Done()
			probe.Run(pctx, client, probeEvents, time.Millisecond, probeKeep*cfg.Interval)
		}()
	}
	startLoad := func() {
		lctx, cancel := context.WithCancel(ctx)
		stopLoad = func() { cancel(); loadWG.Wait(); stopLoad = func() {} }
		loadWG.Add(1)
		go func() { defer loadWG.Done(); RunLoad(lctx, client, "chat", cfg.Rate, cfg.Conns, loadStats) }()
	}
	defer func() { stopPush(); stopLoad() }()

	logf("%s %d endpoints (%d agents): warming up %v", cfg.Mode, cfg.Endpoints, len(fleet.Agents), cfg.Warmup)
	startPush()
	startLoad()
	if err := sleep(ctx, cfg.Warmup); err != nil {
		return nil, err
	}
	pushing, loading := true, true
	for _, ph := range cfg.Windows {
		wantPush := ph == PhaseBoth || ph == PhasePushes || ph == PhaseStaleness || ph == PhaseSoak
		wantLoad := ph == PhaseBoth || ph == PhaseRequests || ph == PhaseStaleness || ph == PhaseSoak
		probe.Enable(ph == PhaseStaleness)
		switch {
		case pushing && !wantPush:
			stopPush()
		case !pushing && wantPush:
			startPush()
		}
		switch {
		case loading && !wantLoad:
			stopLoad()
		case !loading && wantLoad:
			startLoad()
		}
		pushing, loading = wantPush, wantLoad
		_ = sleep(ctx, time.Second) // let the previous phase drain
		aggCPU := func() time.Duration { return 0 }
		if aggs != nil {
			aggCPU = aggs.CPU
		}
		w, err := measure(ctx, gw, ph, cfg.Window, cfg.Sample, pushStats, configStats, loadStats, probe, aggCPU)
		if err != nil {
			return nil, err
		}
		logf("  %-16s cpu %6.1f ms/s  pushes %v  requests %v  lags %d missed %d", ph,
			float64(w.CPU.Microseconds())/1e3/w.Duration.Seconds(), w.Pushes, w.Requests, len(w.Lags), w.Missed)
		res.Windows = append(res.Windows, w)
	}
	return res, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

type snapshot struct {
	at      time.Time
	cpu     time.Duration
	stats   *Stats
	pushes  map[int]int64
	configs map[int]int64
	bytes   int64
	perr    int64
	blocks  int64
	reqs    map[int]int64
	reqSent int64
}

func take(ctx context.Context, gw *Gateway, ps, cs *PushStats, ls *LoadStats) (snapshot, error) {
	var s snapshot
	var err error
	if s.stats, err = gw.ReadStats(ctx); err != nil {
		return s, err
	}
	if s.cpu, err = gw.CPU(); err != nil {
		return s, err
	}
	s.at = time.Now()
	s.pushes, s.bytes, s.perr, s.blocks = ps.Statuses(), ps.Bytes.Load(), ps.Errors.Load(), ps.Blocks.Load()
	s.configs = cs.Statuses()
	s.reqs, s.reqSent = ls.Statuses(), ls.Sent.Load()
	return s, nil
}

func measure(ctx context.Context, gw *Gateway, ph Phase, d, sample time.Duration, ps, cs *PushStats, ls *LoadStats, probe *Probe, aggCPU func() time.Duration) (Window, error) {
	agg0 := aggCPU()
	a, err := take(ctx, gw, ps, cs, ls)
	if err != nil {
		return Window{}, err
	}
	probe.Reset()
	var mem []MemorySample
	if sample > 0 {
		for at := time.Duration(0); at < d; at += sample {
			st, err := gw.ReadStats(ctx)
			if err != nil {
				return Window{}, err
			}
			rss, _ := gw.RSS()
			mem = append(mem, memorySample(at, st, rss))
			if err := sleep(ctx, min(sample, d-at)); err != nil {
				return Window{}, err
			}
		}
	} else if err := sleep(ctx, d); err != nil {
		return Window{}, err
	}
	b, err := take(ctx, gw, ps, cs, ls)
	if err != nil {
		return Window{}, err
	}
	w := Window{Phase: ph, Duration: b.at.Sub(a.at), CPU: b.cpu - a.cpu, AggregatorCPU: aggCPU() - agg0,
		Pushes: diff(b.pushes, a.pushes), Configs: diff(b.configs, a.configs), PushBytes: b.bytes - a.bytes, PushErrors: b.perr - a.perr, RelayBlocks: b.blocks - a.blocks,
		Requests: diff(b.reqs, a.reqs), RequestsSent: b.reqSent - a.reqSent}
	w.ApplyCount, w.ApplyMicros = b.stats.HistDelta(a.stats, "wasm_epp.receiver.apply_us")
	w.RequestCount, w.RequestUs = b.stats.HistDelta(a.stats, "wasm_epp.request_us")
	w.ConfigCount, w.ConfigMicros = b.stats.HistDelta(a.stats, "wasm_epp.receiver.config_apply_us")
	w.Refreshes, w.RefreshMicros = b.stats.HistDelta(a.stats, "wasm_epp.snapshot.refresh_us")
	w.DecideCount, w.DecideMicros = b.stats.HistDelta(a.stats, "wasm_epp.schedule_us")
	w.CASRetries = b.stats.Delta(a.stats, "wasm_epp.receiver.cas_retries")
	w.Contention = b.stats.Delta(a.stats, "wasm_epp.receiver.contention")
	w.GuestMemory = b.stats.Values["wasm_epp.vm.memory_bytes"]
	w.Lags, w.Missed, w.Polls = probe.Lags()
	w.PollTime = probe.PollTime()
	w.RSS, _ = gw.RSS()
	w.Memory = mem
	return w, nil
}

func diff(b, a map[int]int64) map[int]int64 {
	out := map[int]int64{}
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
