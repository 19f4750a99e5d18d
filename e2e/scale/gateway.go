package scale

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Upstream is one HTTP server on all interfaces: every simulated endpoint
// (127.x.y.z:port) reaches it.
type Upstream struct {
	Port uint16
	srv  *http.Server
}

// StartUpstream starts the upstream on a free port.
func StartUpstream() (*Upstream, error) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{Port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	body := []byte(`{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":"hello"}}]}`)
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

// Close stops the upstream.
func (u *Upstream) Close() { _ = u.srv.Close() }

// GatewayOptions choose the gateway process for a run.
type GatewayOptions struct {
	BinDir    string
	Bootstrap string // envoy/envoy.yaml
	Wasm      string // the plugin under test
	Workers   int
	// RouterPatch and ReceiverPatch are merged into the plugin
	// configurations (the bench's are added).
	RouterPatch, ReceiverPatch map[string]any
	CompilationCache           string
	// WorkDir keeps the gateway's log and rendered bootstrap (default: a
	// temporary directory, removed at Stop).
	WorkDir string
	Logf    func(string, ...any) `json:"-"`
}

// Gateway is a running envoyhost process with the real .wasm.
type Gateway struct {
	Stack *stack.Stack
	proc  *stack.Process
}

// StartGateway starts envoyhost with opts' bootstrap and plugin, with
// the router naming the chosen endpoint (ServedByHeader), unknown models
// passed through (the probe's adapters) and metrics never going stale
// during a run.
func StartGateway(ctx context.Context, o GatewayOptions) (*Gateway, error) {
	router := map[string]any{
		"models":         []any{map[string]any{"name": "chat"}},
		"unknownModels":  "passthrough",
		"servedByHeader": ServedByHeader,
		"staleAfter":     "1h",
	}
	for k, v := range o.RouterPatch {
		router[k] = v
	}
	receiver := map[string]any{"staleAfter": "1h"}
	for k, v := range o.ReceiverPatch {
		receiver[k] = v
	}
	workers := o.Workers
	if workers == 0 {
		workers = 4
	}
	s, err := stack.Start(ctx, stack.Config{
		BinDir: o.BinDir, WasmPath: o.Wasm, Bootstrap: o.Bootstrap, Gateway: stack.GatewayEnvoyHost,
		GatewayArgs: []string{"--concurrency", strconv.Itoa(workers), "--log-level", "warn"},
		NoAgent:     true, RouterPatch: router, ReceiverPatch: receiver,
		// The stack wants something for an agent to scrape; none runs.
		ExtraTargets: []string{"127.0.0.1:9"},
		ClientAddr:   "127.0.0.1:0", PushAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
		CompilationCache: o.CompilationCache, WorkDir: o.WorkDir, Logf: o.Logf,
	})
	if err != nil {
		return nil, err
	}
	g := &Gateway{Stack: s}
	for _, p := range s.Processes() {
		g.proc = p // the only process: no replicas, no agent
	}
	if g.proc == nil {
		s.Stop()
		return nil, fmt.Errorf("scale: no gateway process")
	}
	return g, nil
}

// Stop stops the gateway.
func (g *Gateway) Stop() { g.Stack.Stop() }

// Pid is the gateway process.
func (g *Gateway) Pid() int { return g.proc.Pid() }

// CPU is the gateway process's user+system CPU time so far.
func (g *Gateway) CPU() (time.Duration, error) { return processCPU(g.Pid()) }

// RSS is the gateway process's resident memory.
func (g *Gateway) RSS() (int64, error) { return processRSS(g.Pid()) }

// processCPU reads utime+stime of pid from /proc.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) start past ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc stat %q", s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat %q", s)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected /proc stat %q", s)
	}
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

func processRSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// Stats are the gateway's /stats: counters and gauges by name, and
// histograms as count and sum.
type Stats struct {
	Values    map[string]int64
	HistCount map[string]int64
	HistSum   map[string]float64
	ReadAt    time.Time
}

// ReadStats fetches the admin /stats text.
func (g *Gateway) ReadStats(ctx context.Context) (*Stats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.Stack.AdminURL()+"/stats", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	st := &Stats{Values: map[string]int64{}, HistCount: map[string]int64{}, HistSum: map[string]float64{}, ReadAt: time.Now()}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		if c, ok := strings.CutPrefix(val, "count="); ok {
			cnt, sum, _ := strings.Cut(c, " sum=")
			n, _ := strconv.ParseInt(cnt, 10, 64)
			f, _ := strconv.ParseFloat(sum, 64)
			st.HistCount[name], st.HistSum[name] = n, f
			continue
		}
		if v, err := strconv.ParseInt(val, 10, 64); err == nil {
			st.Values[name] = v
		}
	}
	return st, sc.Err()
}

// Delta is b minus a for a counter.
func (b *Stats) Delta(a *Stats, name string) int64 { return b.Values[name] - a.Values[name] }

// HistDelta is b minus a for a histogram: count and sum.
func (b *Stats) HistDelta(a *Stats, name string) (int64, float64) {
	return b.HistCount[name] - a.HistCount[name], b.HistSum[name] - a.HistSum[name]
}

// Aggregators are metricsagent processes in aggregator mode relaying to
// one gateway.
type Aggregators struct {
	URLs  []string // their push endpoints, for the agents
	procs []*exec.Cmd
}

// StartAggregators starts n aggregators relaying to the gateway's push
// listener every interval.
func StartAggregators(binDir string, g *Gateway, n int, interval time.Duration) (*Aggregators, error) {
	a := &Aggregators{}
	push := strings.TrimPrefix(strings.TrimSuffix(g.Stack.PushURL(), g.Stack.Info().Receiver.Receiver.Path), "http://")
	for i := 0; i < n; i++ {
		addr, err := freeLoopback()
		if err != nil {
			a.Stop()
			return nil, err
		}
		health, err := freeLoopback()
		if err != nil {
			a.Stop()
			return nil, err
		}
		cmd := exec.Command(filepath.Join(binDir, "metricsagent"), "--mode", "aggregator", "--agent-id", fmt.Sprintf("aggregator-%d", i),
			"--aggregator-listen", addr, "--listen", health, "--envoy-targets", push, "--interval", interval.String(), "--log-level", "warn")
		cmd.Env = append(os.Environ(), "WASM_EPP_AGENT_PUSH_TOKEN="+g.Stack.Token())
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			a.Stop()
			return nil, err
		}
		a.procs = append(a.procs, cmd)
		a.URLs = append(a.URLs, "http://"+addr+wire.PushPath)
		if err := waitListening(addr, 10*time.Second); err != nil {
			a.Stop()
			return nil, err
		}
	}
	return a, nil
}

// Pids are the aggregators' processes.
func (a *Aggregators) Pids() []int {
	var out []int
	for _, c := range a.procs {
		out = append(out, c.Process.Pid)
	}
	return out
}

// CPU is the aggregators' CPU time so far, together.
func (a *Aggregators) CPU() time.Duration {
	var total time.Duration
	for _, pid := range a.Pids() {
		c, _ := processCPU(pid)
		total += c
	}
	return total
}

// Stop ends the aggregators.
func (a *Aggregators) Stop() {
	for _, c := range a.procs {
		_ = c.Process.Signal(syscall.SIGTERM)
		_ = c.Wait()
	}
	a.procs = nil
}

func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func waitListening(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scale: %s not listening after %v: %w", addr, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
