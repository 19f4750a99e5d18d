package endtoend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// The fault tests behind BENCHMARKS.md's "Faults survived" table. Each
// runs the real processes, asserts what must hold (no request lost but
// those in flight on a killed process, no wrong answer, recovery), with
// time bounds only where the configuration implies one, and logs its
// measured figures on one line starting "fault:", which the table quotes
// over several runs.

// faultLine logs the figures of one run as "fault: <row> key=value ...".
func faultLine(t *testing.T, row string, kv ...any) {
	t.Helper()
	var b strings.Builder
	b.WriteString("fault: " + row)
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if d, ok := v.(time.Duration); ok {
			v = d.Round(time.Millisecond)
		}
		fmt.Fprintf(&b, " %s=%v", kv[i], v)
	}
	t.Log(b.String())
}

// completionText checks a non-streamed completion body from a simulated
// replica: the text the simulator generates for n tokens.
func completionText(body []byte, n int) error {
	var v struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("not a completion: %w: %q", err, body)
	}
	if len(v.Choices) != 1 || v.Choices[0].Text != simText(n) {
		return fmt.Errorf("wrong completion text: %q", body)
	}
	return nil
}

// checkServed checks that a 200 came from the replica the gateway names,
// with the right text: a wrong answer fails it.
func checkServed(s *stack.Stack, r reply, n int) error {
	rep := replicaByAddr(s, r.served(s))
	if rep == nil {
		return fmt.Errorf("served by %q, not a replica", r.served(s))
	}
	if got := r.Header.Get("x-vllm-sim-replica"); got != rep.Name {
		return fmt.Errorf("the gateway names %s but %q answered", rep.Name, got)
	}
	return completionText(r.Body, n)
}

// streamResult is how one streamed completion ended.
type streamResult struct {
	served  string    // the gateway's served-by header
	replica string    // the replica's own name header
	ended   time.Time // when its last byte (or error) was read
	text    string
	done    bool  // [DONE] arrived
	err     error // reading failed (the stream was cut)
}

// startStream sends a streamed completion to url and returns once the
// response headers arrived (the replica is generating). A non-empty prompt
// replaces completion's.
func startStream(ctx context.Context, url, model string, maxTokens int, prompt string) (*http.Response, error) {
	body := completion(model, maxTokens)
	body["stream"] = true
	if prompt != "" {
		body["prompt"] = prompt
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return resp, nil
}

// readStream reads an SSE completion to its end.
func readStream(s *stack.Stack, resp *http.Response) streamResult {
	defer resp.Body.Close()
	res := streamResult{served: resp.Header.Get(s.Info().Router.ServedByHeader), replica: resp.Header.Get("x-vllm-sim-replica")}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			res.done = true
			continue
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			res.err = fmt.Errorf("bad chunk %q: %w", data, err)
			break
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Text)
		}
	}
	if res.err == nil {
		res.err = sc.Err()
	}
	res.text = text.String()
	res.ended = time.Now()
	return res
}

// intact reports whether a stream of n tokens arrived whole and right.
func (r streamResult) intact(s *stack.Stack, n int) error {
	switch {
	case r.err != nil:
		return fmt.Errorf("cut: %w", r.err)
	case !r.done:
		return errors.New("ended without [DONE]")
	case r.text != simText(n):
		return fmt.Errorf("wrong text %q", r.text)
	}
	if rep := replicaByAddr(s, r.served); rep == nil || rep.Name != r.replica {
		return fmt.Errorf("served by %q but %q answered", r.served, r.replica)
	}
	return nil
}

// gatewayStat reads one stat from gateway i's admin /stats.
func gatewayStat(t *testing.T, s *stack.Stack, i int, name string) uint64 {
	t.Helper()
	return statAt(t, s.GatewayAdminURL(i), name)
}

// quantiles returns the median and the maximum of ds (0 when empty).
func quantiles(ds []time.Duration) (p50, max time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], s[len(s)-1]
}

// load runs workers that each send completions one after another until
// stopped, recording every outcome.
type load struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	out  []loadResult
	t0   time.Time
}

type loadResult struct {
	start, end time.Duration // since load.t0
	reply      reply
	err        error
}

const loadTokens = 4

func startLoad(t *testing.T, s *stack.Stack, workers int) *load {
	l := &load{stop: make(chan struct{}), t0: time.Now()}
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Since(l.t0)
				r, err := trySend(context.Background(), http.MethodPost, s.ClientURL()+"/v1/completions", completion(stackModel, loadTokens), nil)
				l.mu.Lock()
				l.out = append(l.out, loadResult{start: start, end: time.Since(l.t0), reply: r, err: err})
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(l.halt)
	return l
}

func (l *load) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

func (l *load) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.out)
}

// waitMore waits until n more requests have finished.
func (l *load) waitMore(t *testing.T, n int) {
	t.Helper()
	start := l.count()
	poll(t, func() bool { return l.count() >= start+n }, "the load stopped making progress")
}

// check halts the load and requires every request to have been served
// right; it returns how many were sent and their latencies.
func (l *load) check(t *testing.T, s *stack.Stack) (n int, latencies []time.Duration) {
	t.Helper()
	l.halt()
	for i, r := range l.out {
		require.NoError(t, r.err, "load request %d", i)
		require.Equal(t, http.StatusOK, r.reply.Status, "load request %d: %s", i, r.reply)
		require.NoError(t, checkServed(s, r.reply, loadTokens), "load request %d", i)
		latencies = append(latencies, r.end-r.start)
	}
	return len(l.out), latencies
}

// TestFaultGatewayKilled: two gateway replicas share the load; one is
// killed with SIGKILL and later restarted on its ports. The client is one
// a demanding user would run in front of two replicas: one connection per
// request, round robin, and when a replica refuses the connection (nothing
// was sent) the same request goes to the other replica; a request cut
// after it was sent is an error (a completion is not idempotent). Only
// requests whose connection the killed process had accepted may fail; the
// restarted replica routes again once the agent's next push reaches it.
func TestFaultGatewayKilled(t *testing.T) {
	s := startStack(t, stack.Config{Replicas: 2, Gateways: 2, TimeScale: 4})
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	type result struct {
		gateway     int // the replica that answered (or cut it)
		retried     bool
		start       time.Duration
		connectedAt time.Duration // when its connection was accepted (-1: never)
		reply       reply
		err         error
	}
	t0 := time.Now()
	send := func(gw int) (r reply, connectedAt time.Duration, err error) {
		var connected atomic.Int64
		connected.Store(-1)
		defer func() { connectedAt = time.Duration(connected.Load()) }()
		trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(int64(time.Since(t0))) }}
		ctx := httptrace.WithClientTrace(context.Background(), trace)
		b, _ := json.Marshal(completion(stackModel, loadTokens))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.GatewayClientURL(gw)+"/v1/completions", bytes.NewReader(b))
		if err != nil {
			return reply{}, 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return reply{}, 0, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return reply{Status: resp.StatusCode, Header: resp.Header, Body: body}, 0, err
	}
	refused := func(err error) bool {
		var op *net.OpError
		return errors.As(err, &op) && op.Op == "dial"
	}

	var (
		mu      sync.Mutex
		results []result
		next    atomic.Uint64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				gw := int(next.Add(1) % 2)
				res := result{gateway: gw, start: time.Since(t0)}
				res.reply, res.connectedAt, res.err = send(gw)
				if refused(res.err) {
					res.gateway, res.retried = 1-gw, true
					res.reply, res.connectedAt, res.err = send(1 - gw)
				}
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
			}
		}()
	}
	stopLoad := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	t.Cleanup(stopLoad)
	served := func(gw int, after time.Duration) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range results {
			if r.gateway == gw && r.start > after && r.err == nil && r.reply.Status == http.StatusOK {
				n++
			}
		}
		return n
	}

	// Both replicas carry the load before the kill.
	poll(t, func() bool { return served(0, 0) >= 30 && served(1, 0) >= 30 })
	killAt := time.Since(t0)
	s.KillGateway(1)
	killed := time.Since(t0)
	// The survivor carries it alone for a while.
	poll(t, func() bool { return served(0, killed) >= 100 })

	restartAt := time.Since(t0)
	require.NoError(t, s.StartGateway(t.Context(), 1))
	listening := time.Since(t0)
	// Its first accepted push gives it a snapshot.
	poll(t, func() bool { return gatewayStat(t, s, 1, pluginStat("receiver.accepted")) > 0 }, "no push reached the restarted gateway")
	pushed := time.Since(t0)
	poll(t, func() bool { return served(1, pushed) >= 30 }, "the restarted gateway does not route")
	stopLoad()

	var lost, noEndpoint, retried int
	var backAt time.Duration = -1
	for i, r := range results {
		if r.retried {
			retried++
		}
		if r.err == nil && r.reply.Status == http.StatusOK {
			require.NoError(t, checkServed(s, r.reply, loadTokens), "request %d", i)
			if r.gateway == 1 && r.start > restartAt && (backAt < 0 || r.start < backAt) {
				backAt = r.start
			}
			continue
		}
		// A request that started before the kill and whose connection
		// the killed process had accepted (none can be accepted after it
		// died): in flight on it.
		if r.gateway == 1 && r.connectedAt >= 0 && r.start < killed {
			lost++
			continue
		}
		// The restarted replica before its first push knows no endpoint
		// and says so; nothing else may fail.
		if r.gateway == 1 && r.err == nil && r.reply.Status == http.StatusServiceUnavailable && r.start >= restartAt && r.start < pushed {
			var e errorBody
			require.NoError(t, json.Unmarshal(r.reply.Body, &e), r.reply.String())
			require.Equal(t, "no_endpoint", e.Error.Code)
			noEndpoint++
			continue
		}
		t.Fatalf("request %d (gateway %d, started %s, kill at %s..%s, restart at %s, first push at %s, retried %v) failed: %v %s",
			i, r.gateway, r.start, killAt, killed, restartAt, pushed, r.retried, r.err, r.reply)
	}
	require.Positive(t, retried, "some requests met the dead replica and moved to the other")
	faultLine(t, "gateway-killed", "requests", len(results), "lost_in_flight", lost, "refused_then_sent_to_the_other", retried,
		"no_endpoint_after_restart", noEndpoint, "restart_to_listening", listening-restartAt, "restart_to_first_push_seen", pushed-restartAt,
		"restart_to_first_routed", backAt-restartAt)
}

// TestFaultAgentRestarted: the agent is stopped while requests flow and
// started again. With the default fail-open policy no request fails:
// once the metrics are older than staleAfter the router routes on the
// last-known endpoints (counted), and when the agent is back and has
// pushed, decisions are fresh again.
func TestFaultAgentRestarted(t *testing.T) {
	s := startStack(t, stack.Config{Replicas: 2, TimeScale: 4})
	failOpen := pluginStat("requests.fail_open")
	l := startLoad(t, s, 4)
	l.waitMore(t, 40)
	require.Zero(t, stat(t, s, failOpen))

	stoppedAt := time.Now()
	s.StopAgent()
	poll(t, func() bool { return stat(t, s, failOpen) > 0 }, "metrics never went stale")
	staleAfterStop := time.Since(stoppedAt)
	// Staleness comes staleAfter after the last push's scrapes, which were
	// stamped within an interval before the stop (a second interval is
	// slack for the agent's scheduling): not sooner.
	require.GreaterOrEqual(t, staleAfterStop, testStaleAfter-2*testInterval)
	l.waitMore(t, 40)

	// Fail-open decisions go on until the agent's first push; watch when
	// they stop.
	last := stat(t, s, failOpen)
	startedAt := time.Now()
	lastChange := startedAt
	require.NoError(t, s.StartAgent(t.Context()))
	watch := func() {
		if n := stat(t, s, failOpen); n != last {
			last, lastChange = n, time.Now()
		}
	}
	poll(t, func() bool {
		watch()
		r := send(t, http.MethodGet, s.AgentURL()+"/readyz", nil, nil)
		return r.Status == http.StatusOK
	}, "the agent never completed a cycle")
	// Two more pushes, then no decision may fail open.
	waitPushes(t, s, 2)
	watch()
	settled := stat(t, s, failOpen)
	l.waitMore(t, 40)
	require.Equal(t, settled, stat(t, s, failOpen), "decisions still fail open after the agent pushed again")

	n, lat := l.check(t, s)
	p50, maxLat := quantiles(lat)
	faultLine(t, "agent-restarted", "requests", n, "lost", 0, "errors", 0, "fail_open_decisions", settled,
		"stop_to_stale", staleAfterStop, "start_to_fresh", lastChange.Sub(startedAt), "latency_p50", p50, "latency_max", maxLat)
}

// agentCounter sums an agent metric's samples (all label sets) from its
// /metrics page.
func agentCounter(t *testing.T, s *stack.Stack, name string) float64 {
	t.Helper()
	r := send(t, http.MethodGet, s.AgentURL()+"/metrics", nil, nil)
	require.Equal(t, http.StatusOK, r.Status)
	var n float64
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			var v float64
			_, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			require.NoError(t, err, line)
			n += v
		}
	}
	return n
}

// TestFaultPushFlood: while requests are routed and the agent pushes, the
// push port takes 1,000 wrong-token pushes a second, each a well-formed
// push on its own connection naming an endpoint that must never be
// reached. Every one is refused with 401, no routed request fails, and the
// agent's own pushes still land.
func TestFaultPushFlood(t *testing.T) {
	s := startStack(t, stack.Config{Replicas: 2, TimeScale: 4})
	trapAddr, hits := trap(t, "intruder")
	payload := intruderPush(t, trapAddr, 1)
	failOpen, accepted := pluginStat("requests.fail_open"), pluginStat("receiver.accepted")

	// Routing alone first, for comparison.
	calm := startLoad(t, s, 4)
	calm.waitMore(t, 200)
	_, calmLat := calm.check(t, s)

	const rate, floodFor = 1000, 3 * time.Second
	floodClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	var sent, unauthorized atomic.Int64
	var otherMu sync.Mutex
	var other []string
	jobs := make(chan struct{}, 256)
	var floodWG sync.WaitGroup
	for range 32 {
		floodWG.Add(1)
		go func() {
			defer floodWG.Done()
			for range jobs {
				req, _ := http.NewRequest(http.MethodPost, s.PushURL(), bytes.NewReader(payload))
				req.Header.Set("Content-Type", "application/octet-stream")
				req.Header.Set("Authorization", "Bearer wrong-"+s.Token()[:16])
				resp, err := floodClient.Do(req)
				sent.Add(1)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusUnauthorized {
						unauthorized.Add(1)
						continue
					}
				}
				otherMu.Lock()
				other = append(other, fmt.Sprintf("%v %v", err, resp))
				otherMu.Unlock()
			}
		}()
	}

	acceptedBefore, pushErrBefore := stat(t, s, accepted), agentCounter(t, s, "wasm_epp_agent_push_errors_total")
	busy := startLoad(t, s, 4)
	start := time.Now()
	// Paced at rate: each push has its slot; a late one goes at once, so
	// the rate is kept unless the pool of senders is exhausted.
	for i := range int(rate * floodFor / time.Second) {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
			time.Sleep(d)
		}
		jobs <- struct{}{}
	}
	close(jobs)
	floodWG.Wait()
	flood := time.Since(start)
	nBusy, busyLat := busy.check(t, s)

	otherMu.Lock()
	require.Empty(t, other, "every wrong-token push is a 401")
	otherMu.Unlock()
	require.Equal(t, sent.Load(), unauthorized.Load())
	require.Zero(t, hits.Load(), "the intruder's endpoint was reached")
	// The flood does not lock the agent out: its pushes still land, at
	// least one per staleAfter of flood on average. Whether none went
	// stale at all depends on the CPU left to the agent (on an idle
	// machine none does; with three busy loops on the 2 cores, a few
	// decisions failed open): a figure, not a property.
	agentPushes := stat(t, s, accepted) - acceptedBefore
	require.GreaterOrEqual(t, agentPushes, uint64((flood+testStaleAfter-1)/testStaleAfter),
		"the agent's pushes during %s of flood", flood.Round(time.Millisecond))
	failedOpen := stat(t, s, failOpen)
	// A push of the agent's may still time out (200 ms) on a starved
	// machine; the next one carries the same state, and freshness, checked
	// above, is what matters. The count is a figure, not a property.
	pushErrors := agentCounter(t, s, "wasm_epp_agent_push_errors_total") - pushErrBefore

	calm50, calmMax := quantiles(calmLat)
	busy50, busyMax := quantiles(busyLat)
	faultLine(t, "push-flood", "wrong_token_pushes", sent.Load(), "achieved_per_s", int(float64(sent.Load())/flood.Seconds()),
		"all_401", sent.Load() == unauthorized.Load(), "routed", nBusy, "lost", 0, "errors", 0, "fail_open", failedOpen,
		"agent_pushes_accepted", agentPushes, "agent_push_errors", pushErrors,
		"latency_p50_calm", calm50, "latency_p50_flood", busy50, "latency_max_calm", calmMax, "latency_max_flood", busyMax)
}

// TestFaultPushWhileInFlight: 100 requests are in flight — 80 streams
// generating on the replicas and 20 whose bodies are still arriving, so
// the plugin is buffering them — when a push from a second agent adds an
// idle endpoint. Every stream completes whole on the replica that started
// it, the 20 are routed on the new snapshot, and the next requests reach
// the new endpoint.
func TestFaultPushWhileInFlight(t *testing.T) {
	s := startStack(t, stack.Config{Replicas: 3, TimeScale: 4})
	newcomer := newFakeReplica(t, "newcomer", false)
	// The streams last about 2 s at the test's speed, far longer than it
	// takes to open them and push; the figure logged says how many were
	// still open when the push landed.
	const streams, buffering, tokens = 80, 20, 600

	// 80 streams, each with its headers in (a replica is generating it).
	results := make(chan streamResult, streams)
	var opened sync.WaitGroup
	var openErr atomic.Value
	for range streams {
		opened.Add(1)
		go func() {
			resp, err := startStream(t.Context(), s.ClientURL(), stackModel, tokens, "")
			opened.Done()
			if err != nil {
				openErr.Store(err)
				results <- streamResult{err: err}
				return
			}
			results <- readStream(s, resp)
		}()
	}
	opened.Wait()
	if err, _ := openErr.Load().(error); err != nil {
		t.Fatalf("opening a stream: %v", err)
	}

	// 20 requests with half their body sent: the plugin holds them.
	body, err := json.Marshal(completion(stackModel, loadTokens))
	require.NoError(t, err)
	type held struct {
		conn net.Conn
		rd   *bufio.Reader
	}
	var pending []held
	for i := range buffering {
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.ClientURL(), "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		require.NoError(t, conn.SetDeadline(time.Now().Add(waitLong)))
		_, err = fmt.Fprintf(conn, "POST /v1/completions?held=%d HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n",
			i, len(body)/2, body[:len(body)/2])
		require.NoError(t, err)
		pending = append(pending, held{conn, bufio.NewReader(conn)})
	}
	// Whether or not the gateway has read the first halves yet, the rest
	// of each body comes after the push: each is decided after it.

	ap := newcomer.addr()
	r := push(t, s, intruderPush(t, ap, 1), "Bearer "+s.Token())
	require.Equal(t, http.StatusNoContent, r.Status, r.String())
	pushed := time.Now()
	// The second agent keeps pushing every interval, as an agent does, so
	// its endpoint stays fresh however slowly the rest of the test runs.
	stopPushing := keepPushing(t, s, func(seq uint64) []byte { return intruderPush(t, ap, seq) })
	awaitRouters() // the routers decide on the push from here on
	// intruderPush names its endpoint "intruder"; the served-by header
	// carries that name.
	const newName = "intruder"

	heldToNew := 0
	for i, h := range pending {
		rest := body[len(body)/2:]
		_, err := fmt.Fprintf(h.conn, "%x\r\n%s\r\n0\r\n\r\n", len(rest), rest)
		require.NoError(t, err)
		resp, err := http.ReadResponse(h.rd, nil)
		require.NoError(t, err, "held request %d", i)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		rep := reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
		require.Equal(t, http.StatusOK, rep.Status, "held request %d: %s", i, rep)
		if rep.served(s) == newName {
			require.Equal(t, "newcomer", rep.Header.Get("x-vllm-sim-replica"))
			heldToNew++
			continue
		}
		require.NoError(t, checkServed(s, rep, loadTokens), "held request %d", i)
	}

	// The new endpoint is the only idle one (every replica runs about 27
	// streams), so requests decided on the new snapshot go there: the held
	// ones were.
	require.Positive(t, heldToNew, "no held request was routed on the new snapshot")

	// The next requests see the new endpoint (idle, while every replica
	// runs about 27 streams).
	until := 0
	var effect time.Duration
	poll(t, func() bool {
		r := complete(t, s, stackModel, loadTokens)
		require.Equal(t, http.StatusOK, r.Status, r.String())
		until++
		if r.served(s) == newName {
			effect = time.Since(pushed)
			return true
		}
		require.NoError(t, checkServed(s, r, loadTokens))
		return false
	}, "no request reached the pushed endpoint")
	stopPushing()

	perReplica := map[string]int{}
	open := 0
	for range streams {
		res := <-results
		require.NoError(t, res.intact(s, tokens), "a stream in flight during the push")
		perReplica[res.replica]++
		if !res.ended.Before(pushed) {
			open++
		}
	}
	require.Positive(t, open, "every stream had ended before the push")
	faultLine(t, "push-while-in-flight", "in_flight", open+buffering, "lost", 0, "errors", 0,
		"streams_per_replica", fmt.Sprint(perReplica), "held_to_new_endpoint", heldToNew, "requests_until_new_endpoint", until, "push_to_new_endpoint", effect)
}

// TestFaultReplicaVanishesMidStream: a replica is killed with SIGKILL
// while streams run on it and on the others. The streams it was generating
// are cut (the client sees the stream end without [DONE], after a prefix
// of the right text); every other stream completes whole; new requests
// stop failing within killAndFailOver's bound and are answered right.
// Its busy last metrics make the dead replica less attractive than in
// TestReplicaKilled, so failures usually stop sooner than the bound.
//
// Nothing here assumes how fast the machine is: the streams are long
// (about 2 s of generation at the test's speed), each is read from the
// moment it opens, and a stream of the victim that ended whole before the
// kill (possible only on a starved machine) is told apart by when its end
// was read; at least one must have been cut.
func TestFaultReplicaVanishesMidStream(t *testing.T) {
	s := startStack(t, stack.Config{Replicas: 3, TimeScale: 4})
	victim := s.Replicas()[0]
	everyReplicaServes(t, s) // the victim included

	// Streams run on the victim (two at least) and elsewhere, each with its
	// own prompt so that no prefix affinity keeps them on one replica.
	const streamTokens, maxStreams = 1000, 24
	results := make(chan streamResult, maxStreams)
	opened, onVictim := 0, 0
	poll(t, func() bool {
		require.Less(t, opened, maxStreams, "%d streams opened, %d on the victim", opened, onVictim)
		resp, err := startStream(t.Context(), s.ClientURL(), stackModel, streamTokens, fmt.Sprintf("Stream %d: write a SQL query that lists users.", opened))
		require.NoError(t, err)
		opened++
		if resp.Header.Get(s.Info().Router.ServedByHeader) == victim.Addr {
			onVictim++
		}
		go func() { results <- readStream(s, resp) }()
		return onVictim >= 2 && opened-onVictim >= 2
	}, "streams never reached the victim and the others")

	killedAt := time.Now()
	f := killAndFailOver(t, s, 0)

	cut, endedBefore := 0, 0
	for range opened {
		res := <-results
		if res.served != victim.Addr {
			require.NoError(t, res.intact(s, streamTokens), "a stream on a surviving replica")
			continue
		}
		if res.intact(s, streamTokens) == nil && res.ended.Before(killedAt) {
			endedBefore++ // not in flight at the kill
			continue
		}
		require.False(t, res.done, "a stream of the killed replica ended with [DONE] after the kill")
		require.Error(t, res.intact(s, streamTokens), "a stream of the killed replica ended as if whole")
		require.True(t, strings.HasPrefix(simText(streamTokens), res.text), "a cut stream carries a prefix of the right text: %q", res.text)
		cut++
	}
	require.Positive(t, cut, "no stream of the victim was in flight at the kill (%d had ended)", endedBefore)
	faultLine(t, "replica-killed-mid-stream", "streams", opened, "cut_in_flight", cut, "ended_before_kill", endedBefore, "streams_intact", opened-cut,
		"requests_failed_before_bound", f.failed, "requests_before_bound", f.sent, "last_failure_after_kill", f.lastFailure, "bound", f.bound)
}

// failover is what killAndFailOver measured.
type failover struct {
	bound        time.Duration // staleAfter + 3 intervals
	failed, sent int           // requests that failed / were sent before the bound
	lastFailure  time.Duration // when the last failing request started, after the kill
}

// killAndFailOver kills replica i with SIGKILL and sends requests one at a
// time until 60 have started later than the bound, staleAfter plus three
// scrape intervals after the kill; each of those must succeed, be answered
// right and not reach the killed replica. The bound follows from the
// configuration: the agent keeps a failed pod's last good values and their
// scrape time, so the router finds the pod stale staleAfter after that
// time. The time is stamped when the pod's sweep ends, within one interval
// of its last answer; two more are slack for the agent's scheduling on a
// loaded machine (a test under the whole suite has seen 614 ms against
// staleAfter's 600). Only requests that start before the bound may fail.
func killAndFailOver(t *testing.T, s *stack.Stack, i int) failover {
	t.Helper()
	victim := s.Replicas()[i]
	failOpen := pluginStat("requests.fail_open")
	failOpenBefore := stat(t, s, failOpen)
	f := failover{bound: testStaleAfter + 3*testInterval}
	killed := time.Now()
	s.KillReplica(i)
	for after := 0; after < 60; {
		start := time.Since(killed)
		r, err := trySend(t.Context(), http.MethodPost, s.ClientURL()+"/v1/completions", completion(stackModel, 1), nil)
		bad := err != nil || r.Status != http.StatusOK || r.served(s) == victim.Addr
		if bad {
			f.failed++
			f.lastFailure = start
		}
		if start <= f.bound {
			f.sent++
			continue
		}
		after++
		require.False(t, bad, "request %d started %s after the kill (bound %s: staleAfter %s + 3 x interval %s) failed or reached the killed replica: %v %s; fail-open decisions since the kill: %d",
			after, start.Round(time.Millisecond), f.bound, testStaleAfter, testInterval, err, r, stat(t, s, failOpen)-failOpenBefore)
		require.NoError(t, checkServed(s, r, 1))
	}
	return f
}

// everyReplicaServes sends requests until each replica has served one.
func everyReplicaServes(t *testing.T, s *stack.Stack) {
	t.Helper()
	seen := map[string]bool{}
	poll(t, func() bool {
		r := complete(t, s, stackModel, 1)
		require.Equal(t, http.StatusOK, r.Status, r.String())
		seen[r.served(s)] = true
		return len(seen) == len(s.Replicas())
	}, "seen %v", seen)
}

// keepPushing pushes payload(2), payload(3), ... with the stack's token
// every scrape interval until the returned stop is called; stop fails the
// test if a push was not accepted. The payloads are encoded up front (20 s
// worth), in the test goroutine.
func keepPushing(t *testing.T, s *stack.Stack, payload func(seq uint64) []byte) (stop func()) {
	t.Helper()
	payloads := make([][]byte, int(waitLong/testInterval))
	for i := range payloads {
		payloads[i] = payload(uint64(i + 2))
	}
	quit, done := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(testInterval)
		defer tick.Stop()
		for _, b := range payloads {
			select {
			case <-quit:
				done <- nil
				return
			case <-tick.C:
			}
			req, _ := http.NewRequest(http.MethodPost, s.PushURL(), bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+s.Token())
			req.Close = true
			resp, err := httpClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					err = fmt.Errorf("push answered %d", resp.StatusCode)
				}
			}
			if err != nil {
				done <- err
				return
			}
		}
		<-quit
		done <- nil
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(quit)
			require.NoError(t, <-done, "a push of the second agent")
		})
	}
	t.Cleanup(func() {
		once.Do(func() { close(quit); <-done })
	})
	return stop
}
