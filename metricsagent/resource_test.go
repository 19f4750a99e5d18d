package metricsagent

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// TestResourceUsage measures the real agent binary scraping 100 loopback
// pods (each serving the 26 KB vLLM v1 golden page with changing values)
// and pushing to one loopback Envoy stand-in every 50 ms: CPU share of one
// core and RSS of the agent process alone, read from /proc. Target: under
// 10% and 50 MiB.
//
// The pods answer as current vLLM does, with the whole page whatever
// name[] asks (its /metrics is prometheus-fastapi-instrumentator's route);
// WASM_EPP_RESOURCE_PAGES=restricted makes them honour name[] as
// prometheus_client's own handlers do (about 1 KB per page).
//
// On the 2-core development VM (syscalls are costly there: a loopback
// write or read costs the agent ~10 µs of system time) the agent measured
// 8-10% of one core with whole pages and 7-8% with restricted ones, RSS
// ~36 MiB; BENCHMARKS.md has the figures and how they came down from 16-23%.
// Set WASM_EPP_RESOURCE_MAX_CPU to assert another bound.
//
// Opt-in, because it takes ~15 s and only means something on a quiet
// machine:
//
//	make cmds && WASM_EPP_RESOURCE_TEST=1 WASM_EPP_BIN=$PWD/bin \
//	  go test -run TestResourceUsage -v -count=1 ./metricsagent/
//
// WASM_EPP_RESOURCE_SECONDS changes the measured window (default 10);
// WASM_EPP_RESOURCE_ARGS adds agent flags. The CPU bound is checked on the
// median of the window's five parts, the RSS bound at the end, and both
// only with the default flags.
func TestResourceUsage(t *testing.T) {
	if os.Getenv("WASM_EPP_RESOURCE_TEST") != "1" {
		t.Skip("set WASM_EPP_RESOURCE_TEST=1 to measure the agent's CPU and RSS")
	}
	window := 10 * time.Second
	if s := os.Getenv("WASM_EPP_RESOURCE_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		window = time.Duration(n) * time.Second
	}
	bin := agentBinary(t)
	var honourNames bool
	switch pages := os.Getenv("WASM_EPP_RESOURCE_PAGES"); pages {
	case "", "whole":
	case "restricted":
		honourNames = true
	default:
		t.Fatalf("WASM_EPP_RESOURCE_PAGES=%q: want whole or restricted", pages)
	}

	// Pages are rendered up front (97 variants, whole and restricted) so the
	// servers, which share the machine with the agent, stay cheap.
	page := livePage(golden(t, "vllm-v1.txt"))
	const variants = 97
	var whole, restricted [variants][]byte
	names := (&Scraper{Names: DefaultMetricNames()}).Names
	asked := append([]string{names.Waiting, names.Running, names.LoRAInfo}, names.KVUsage...)
	for i := range variants {
		whole[i] = page(int64(i))
		restricted[i] = restrict(whole[i], asked)
	}
	var scrapes atomic.Int64
	var targets []string
	for range 100 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := scrapes.Add(1) % variants
			body := whole[n]
			if honourNames && strings.Contains(r.URL.RawQuery, "name") {
				body = restricted[n] // as prometheus_client's handlers do for name[]
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			w.Header().Set("Content-Length", strconv.Itoa(len(body))) // as vLLM's server sends it
			_, _ = w.Write(body)
		}))
		t.Cleanup(srv.Close)
		targets = append(targets, strings.TrimPrefix(srv.URL, "http://"))
	}
	var pushes, full atomic.Int64
	envoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p, err := wire.DecodeAgentPush(b, wire.Limits{})
		if err != nil || r.Header.Get("Authorization") != "Bearer bench" {
			http.Error(w, "bad push", http.StatusBadRequest)
			return
		}
		pushes.Add(1)
		if len(p.Endpoints) == 100 {
			full.Add(1)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(envoy.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port for the agent's /metrics
	require.NoError(t, err)
	listen := ln.Addr().String()
	require.NoError(t, ln.Close())
	cmd := exec.Command(bin, "--targets", strings.Join(targets, ","),
		"--envoy-targets", strings.TrimPrefix(envoy.URL, "http://"),
		"--listen", listen, "--log-level", "warn")
	cmd.Args = append(cmd.Args, strings.Fields(os.Getenv("WASM_EPP_RESOURCE_ARGS"))...) // e.g. "--interval 100ms --scrape-timeout 90ms"
	cmd.Env = append(os.Environ(), TokenEnv+"=bench")
	var stderr lockedWriter
	stderr.w = &strings.Builder{}
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)

	deadline := time.Now().Add(30 * time.Second)
	for full.Load() == 0 {
		require.True(t, time.Now().Before(deadline), "no push with 100 endpoints; agent said: %s", stderr.w)
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // warm up: connections open, buffers pooled

	pid := cmd.Process.Pid
	user0, sys0 := cpuTicks(t, pid)
	scrapes0, pushes0, full0 := scrapes.Load(), pushes.Load(), full.Load()
	failed0 := failedScrapes(t, listen)
	// The window is measured in five parts too: the machine's noise comes
	// in bursts, and the bound is checked on the median part (the figures
	// in BENCHMARKS.md are medians as well).
	const parts = 5
	start := time.Now()
	var shares []float64
	lastTicks, lastAt := user0+sys0, start
	for range parts {
		time.Sleep(window / parts)
		u, s := cpuTicks(t, pid)
		now := time.Now()
		shares = append(shares, float64(u+s-lastTicks)/100/now.Sub(lastAt).Seconds()) // USER_HZ is 100
		lastTicks, lastAt = u+s, now
	}
	user1, sys1 := cpuTicks(t, pid)
	elapsed := time.Since(start)
	slices.Sort(shares)
	medianShare := shares[parts/2]
	cpu0, cpu1 := user0+sys0, user1+sys1
	rss, hwm := procStatusKiB(t, pid, "VmRSS:"), procStatusKiB(t, pid, "VmHWM:")
	nScrapes, nPushes, nFull := scrapes.Load()-scrapes0, pushes.Load()-pushes0, full.Load()-full0
	nFailed := failedScrapes(t, listen) - failed0

	// USER_HZ is 100 on every Linux architecture Go supports.
	cpuShare := float64(cpu1-cpu0) / 100 / elapsed.Seconds()
	perScrape := func(ticks int64) float64 { return float64(ticks) * 1e4 / float64(max(nScrapes, 1)) } // µs
	mode := "whole pages"
	if honourNames {
		mode = "restricted pages"
	}
	t.Logf("agent (%s) over %.1fs: CPU %.1f%% of one core (parts %.1f–%.1f%%, median %.1f%%), RSS %.1f MiB (peak %.1f MiB); %d scrapes (%.0f/s, %.0f µs CPU each: %.0f user, %.0f system; %d failed), %d pushes (%d with all 100 endpoints, %.1f/s)",
		mode, elapsed.Seconds(), 100*cpuShare, 100*shares[0], 100*shares[parts-1], 100*medianShare, float64(rss)/1024, float64(hwm)/1024,
		nScrapes, float64(nScrapes)/elapsed.Seconds(), perScrape(cpu1-cpu0), perScrape(user1-user0), perScrape(sys1-sys0), nFailed,
		nPushes, nFull, float64(nPushes)/elapsed.Seconds())
	stop()
	require.Equal(t, 0, cmd.ProcessState.ExitCode(), "graceful exit on SIGTERM; agent said: %s", stderr.w)
	if os.Getenv("WASM_EPP_RESOURCE_ARGS") == "" {
		maxCPU := 0.10
		if s := os.Getenv("WASM_EPP_RESOURCE_MAX_CPU"); s != "" { // e.g. 0.35 on a VM with slow syscalls
			var err error
			maxCPU, err = strconv.ParseFloat(s, 64)
			require.NoError(t, err)
		}
		require.Less(t, medianShare, maxCPU, "CPU share of one core, median of the window's parts")
		require.Less(t, float64(rss)/1024, 50.0, "RSS MiB")
	}
}

// livePage returns a function rendering the golden page with the gauges
// the agent reads changed on every call, as on a loaded vLLM server, so no
// layer can get away with work it skipped on an unchanged page.
func livePage(golden []byte) func(n int64) []byte {
	const (
		waiting = `vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0`
		running = `vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 31.0`
		kv      = `vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.8125`
	)
	text := string(golden)
	if !strings.Contains(text, waiting) || !strings.Contains(text, running) || !strings.Contains(text, kv) {
		panic("golden page changed: update livePage")
	}
	return func(n int64) []byte {
		return []byte(strings.NewReplacer(
			waiting, strings.TrimSuffix(waiting, "7.0")+strconv.FormatInt(n%13, 10)+".0",
			running, strings.TrimSuffix(running, "31.0")+strconv.FormatInt(n%50, 10)+".0",
			kv, strings.TrimSuffix(kv, "0.8125")+strconv.FormatFloat(float64(n%1000)/1000, 'f', -1, 64),
		).Replace(text))
	}
}

// agentBinary returns $WASM_EPP_BIN/metricsagent (make cmds), or builds it.
func agentBinary(t *testing.T) string {
	if dir := os.Getenv("WASM_EPP_BIN"); dir != "" {
		p := filepath.Join(dir, "metricsagent")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p := filepath.Join(t.TempDir(), "metricsagent")
	out, err := exec.Command("go", "build", "-trimpath", "-o", p, "./cmd/metricsagent").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return p
}

// failedScrapes sums wasm_epp_agent_scrape_errors_total from the agent.
func failedScrapes(t *testing.T, listen string) int64 {
	resp, err := http.Get("http://" + listen + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var n float64
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "wasm_epp_agent_scrape_errors_total{") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			require.NoError(t, err)
			n += v
		}
	}
	return int64(n)
}

// cpuTicks reads utime and stime of pid in clock ticks (/proc/pid/stat
// fields 14 and 15, counted after the parenthesised command name).
func cpuTicks(t *testing.T, pid int) (user, system int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	require.NoError(t, err)
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	user, err = strconv.ParseInt(fields[11], 10, 64)
	require.NoError(t, err)
	system, err = strconv.ParseInt(fields[12], 10, 64)
	require.NoError(t, err)
	return user, system
}

func procStatusKiB(t *testing.T, pid int, key string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("%s not in /proc/%d/status", key, pid)
	return 0
}
