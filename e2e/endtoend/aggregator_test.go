package endtoend

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// proc is one process the test starts and kills itself.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
}

func startProc(t *testing.T, dir, name string, env []string, argv ...string) *proc {
	t.Helper()
	log := filepath.Join(dir, name+".log")
	f, err := os.Create(log)
	require.NoError(t, err)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	f.Close()
	p := &proc{name: name, cmd: cmd, log: log}
	t.Cleanup(func() { p.kill(syscall.SIGTERM) })
	return p
}

// kill signals the process group and waits for the process.
func (p *proc) kill(sig syscall.Signal) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// promValue reads one sample from a Prometheus text page ("" labels: the
// first sample of the name).
func promValue(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return -1
}

// The aggregation tier over real processes: two aggregators relay two
// agents' pushes to the gateway. Killing one changes nothing; killing both
// makes the agents push to the gateway themselves; bringing one back
// makes them use it again. Routing never fails and the router's metrics
// stay fresh in every phase.
func TestAggregatorFailoverEndToEnd(t *testing.T) {
	s := startStack(t, stack.Config{Replicas: 2, NoAgent: true})
	bin, _ := binaries(t)
	agentBin := filepath.Join(bin, stack.AgentBinary)
	dir := s.WorkDir()
	push := strings.TrimPrefix(strings.TrimSuffix(s.PushURL(), s.Info().Receiver.Receiver.Path), "http://")
	env := []string{"WASM_EPP_AGENT_PUSH_TOKEN=" + s.Token()}
	interval := testInterval.String()

	aggAddr := [2]string{freePort(t), freePort(t)}
	startAggregator := func(i int) *proc {
		return startProc(t, dir, fmt.Sprintf("aggregator-%d", i), env, agentBin, "--mode", "aggregator",
			"--agent-id", fmt.Sprintf("aggregator-%d", i), "--aggregator-listen", aggAddr[i], "--listen", freePort(t),
			"--envoy-targets", push, "--interval", interval, "--log-format", "text")
	}
	aggs := [2]*proc{startAggregator(0), startAggregator(1)}
	agentURL := [2]string{}
	for i, r := range s.Replicas() {
		addr := freePort(t)
		agentURL[i] = "http://" + addr
		startProc(t, dir, fmt.Sprintf("agent-%d", i), env, agentBin, "--agent-id", fmt.Sprintf("node-%d", i),
			"--targets", r.Addr, "--aggregators", aggAddr[0]+","+aggAddr[1], "--envoy-targets", push,
			"--fallback-after", "300ms", "--interval", interval, "--heartbeat", stack.AgentHeartbeat(testStaleAfter).String(),
			"--listen", addr, "--log-format", "text")
	}

	poll(t, func() bool {
		r, err := trySend(t.Context(), "POST", s.ClientURL()+"/v1/completions", completion(stack.DefaultModel, 4), nil)
		return err == nil && r.Status == 200
	}, "routing through the aggregators")

	// From now on, requests all along: every one must be routed to a
	// replica.
	var sent, failed atomic.Int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			r, err := trySend(t.Context(), "POST", s.ClientURL()+"/v1/completions", completion(stack.DefaultModel, 4), nil)
			sent.Add(1)
			if err != nil || r.Status != 200 || r.served(s) == "" {
				failed.Add(1)
				lastErr.Store(fmt.Sprintf("%v %v", err, r))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	// fresh waits until the router's snapshot is younger than staleAfter
	// and the receiver keeps accepting blocks.
	fresh := func(phase string) {
		t.Helper()
		accepted := stat(t, s, pluginStat("receiver.blocks_accepted"))
		poll(t, func() bool {
			return stat(t, s, pluginStat("receiver.blocks_accepted")) >= accepted+20 &&
				stat(t, s, pluginStat("snapshot.age_ms")) < uint64(testStaleAfter/time.Millisecond)
		}, "metrics stopped arriving: "+phase)
	}
	direct := func() [2]float64 {
		return [2]float64{promValue(t, agentURL[0], "wasm_epp_agent_direct_pushes"), promValue(t, agentURL[1], "wasm_epp_agent_direct_pushes")}
	}

	poll(t, func() bool { return stat(t, s, pluginStat("requests.routed")) > 10 }, "routing through the aggregators")
	require.Zero(t, failed.Load(), "before the first failover (last: %v)", lastErr.Load())
	fresh("both aggregators up")
	assert.Equal(t, [2]float64{0, 0}, direct(), "agents push to the aggregators only")

	aggs[0].kill(syscall.SIGKILL)
	t.Logf("aggregator 0 killed after %d requests", sent.Load())
	fresh("one aggregator left")
	time.Sleep(time.Second)
	assert.Equal(t, [2]float64{0, 0}, direct(), "the second aggregator serves: no fallback")

	aggs[1].kill(syscall.SIGKILL)
	t.Logf("aggregator 1 killed after %d requests", sent.Load())
	poll(t, func() bool { d := direct(); return d[0] == 1 && d[1] == 1 }, "agents fall back to pushing the gateway")
	fresh("no aggregator: direct pushes")

	aggs[0] = startAggregator(0)
	t.Logf("aggregator 0 restarted after %d requests", sent.Load())
	poll(t, func() bool { d := direct(); return d[0] == 0 && d[1] == 0 }, "agents use the aggregator again")
	fresh("aggregator back")

	require.Zero(t, failed.Load(), "requests failed during the failovers (last: %v)", lastErr.Load())
	t.Logf("%d requests, none failed", sent.Load())
}
