package endtoend

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/e2e/stack"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// TestStack runs the make-run shape — 4 replicas serving the 10 adapters of
// envoy/envoy.yaml with max_loras 4 — and checks it through the gateway.
// The replicas run at most 4 sequences each (so a burst saturates them) at 4x
// speed. Subtests share the stack and run in order; overload is last.
func TestStack(t *testing.T) {
	bin, _ := binaries(t)
	root, err := wasmbuild.ModuleRoot()
	require.NoError(t, err)
	local, err := stack.LocalConfig(bin, filepath.Join(root, "envoy", "envoy.yaml"))
	require.NoError(t, err)
	s := startStack(t, stack.Config{
		Replicas:    4,
		Adapters:    local.Adapters,
		MaxLoRAs:    4,
		TimeScale:   4,
		ReplicaArgs: []string{"--max-num-seqs", "4"},
	})
	require.Len(t, local.Adapters, 10)

	t.Run("streaming responses arrive intact", func(t *testing.T) { testStreaming(t, s) })
	t.Run("client cannot choose the replica", func(t *testing.T) { testDestinationHeader(t, s) })
	t.Run("push with a wrong token is rejected and routing is unchanged", func(t *testing.T) { testWrongToken(t, s) })
	t.Run("lora affinity keeps an adapter on the replica running it", func(t *testing.T) { testAffinity(t, s) })
	t.Run("demo command", func(t *testing.T) { testDemoCommand(t, s) })
	t.Run("overload sheds sheddable and serves critical", func(t *testing.T) { testOverload(t, s) })
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	for _, ev := range strings.Split(strings.TrimRight(string(body), "\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		require.True(t, ok, "event without data: %q", ev)
		out = append(out, data)
	}
	return out
}

func testStreaming(t *testing.T, s *stack.Stack) {
	const n = 24
	tests := []struct {
		name, path string
		body       map[string]any
		text       func(choice map[string]any) string
	}{
		{"completions", "/v1/completions",
			map[string]any{"model": "sql-lora-2", "prompt": "Count the orders.", "max_tokens": n, "stream": true},
			func(c map[string]any) string { s, _ := c["text"].(string); return s }},
		{"chat", "/v1/chat/completions",
			map[string]any{"model": "sql-lora-5", "messages": []map[string]string{{"role": "user", "content": "Count the orders."}}, "max_tokens": n, "stream": true},
			func(c map[string]any) string {
				d, _ := c["delta"].(map[string]any)
				s, _ := d["content"].(string)
				return s
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := send(t, http.MethodPost, s.ClientURL()+tt.path, tt.body, nil)
			require.Equal(t, http.StatusOK, r.Status, r.String())
			require.Equal(t, "text/event-stream", r.Header.Get("Content-Type"))
			served := r.served(s)
			rep := replicaByAddr(s, served)
			require.NotNil(t, rep, "served by %q, not a replica", served)
			require.Equal(t, rep.Name, r.Header.Get("x-vllm-sim-replica"), "the gateway names the replica that answered")

			events := sseEvents(t, r.Body)
			require.Equal(t, "[DONE]", events[len(events)-1], "the stream ends with [DONE]")
			var text strings.Builder
			tokens, usage := 0, 0
			finished := false
			for _, ev := range events[:len(events)-1] {
				var chunk struct {
					Model   string           `json:"model"`
					Choices []map[string]any `json:"choices"`
					Usage   *struct {
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
				}
				require.NoError(t, json.Unmarshal([]byte(ev), &chunk), "chunk %q", ev)
				require.Equal(t, tt.body["model"], chunk.Model)
				if chunk.Usage != nil {
					usage = chunk.Usage.CompletionTokens
				}
				for _, c := range chunk.Choices {
					part := tt.text(c)
					text.WriteString(part)
					if part != "" {
						tokens++
					}
					if c["finish_reason"] == "length" {
						finished = true
					}
				}
			}
			require.Equal(t, n, tokens)
			require.Equal(t, simText(n), text.String(), "every token arrived, in order")
			require.True(t, finished, "the last token carries finish_reason")
			require.Equal(t, n, usage, "the usage chunk arrived")
		})
	}
}

// trap is a loopback server that must never be reached through the
// gateway; it answers like a replica so that a leak would look like success.
func trap(t *testing.T, name string) (addr string, hits *atomic.Int64) {
	hits = &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("x-vllm-sim-replica", name)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"text_completion","model":"trap","choices":[{"text":"trapped"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), hits
}

func testDestinationHeader(t *testing.T, s *stack.Stack) {
	trapAddr, hits := trap(t, "trap")
	replicas := replicaAddrs(s)
	dest := s.Info().Router.DestinationHeader
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		header http.Header
	}{
		{"destination header on a completion", http.MethodPost, "/v1/completions", completion("sql-lora-1", 2), http.Header{http.CanonicalHeaderKey(dest): {trapAddr}}},
		{"envoy original-dst header on a completion", http.MethodPost, "/v1/completions", completion("sql-lora-1", 2), http.Header{"X-Envoy-Original-Dst-Host": {trapAddr}}},
		{"both headers, repeated", http.MethodPost, "/v1/completions", completion(stackModel, 2),
			http.Header{http.CanonicalHeaderKey(dest): {trapAddr, trapAddr}, "X-Envoy-Original-Dst-Host": {trapAddr}}},
		{"destination header on GET /v1/models", http.MethodGet, "/v1/models", nil, http.Header{http.CanonicalHeaderKey(dest): {trapAddr}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 8 {
				r := send(t, tt.method, s.ClientURL()+tt.path, tt.body, tt.header)
				require.Equal(t, http.StatusOK, r.Status, r.String())
				require.Contains(t, replicas, r.served(s))
				require.NotEqual(t, "trap", r.Header.Get("x-vllm-sim-replica"))
			}
		})
	}
	require.Zero(t, hits.Load(), "the client-chosen destination was reached")
}

const stackModel = stack.DefaultModel

// intruderPush is a well-formed push from another agent. With an address
// it reports one idle endpoint there, scraped just now; without one it
// reports nothing (withdrawing what the agent sent before).
func intruderPush(t *testing.T, addr string, seq uint64) []byte {
	t.Helper()
	var eps []wire.EndpointState
	if addr != "" {
		ap, err := netip.ParseAddrPort(addr)
		require.NoError(t, err)
		eps = []wire.EndpointState{{
			Name: "intruder", Address: ap.Addr(), Port: ap.Port(), MaxAdapters: 4, ScrapeTime: time.Now(),
		}}
	}
	b, err := wire.EncodePush(&wire.Push{AgentID: "intruder-agent", Seq: seq, SendTime: time.Now(), Endpoints: eps}, wire.DefaultLimits())
	require.NoError(t, err)
	return b
}

func push(t *testing.T, s *stack.Stack, payload []byte, auth string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.PushURL(), bytes.NewReader(payload))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/octet-stream")
	// A fresh connection per push: the receiver may answer before it has
	// read the body, and the gateway then closes the connection, as Envoy
	// does.
	req.Close = true
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func testWrongToken(t *testing.T, s *stack.Stack) {
	trapAddr, hits := trap(t, "intruder")
	payload := intruderPush(t, trapAddr, 1)
	require.Equal(t, http.StatusMethodNotAllowed, send(t, http.MethodGet, s.PushURL(), nil, nil).Status,
		"pushes are POSTs")
	for _, auth := range []string{"", "Bearer wrong-" + s.Token()[:8], "Bearer " + s.Token() + "x", "Basic " + s.Token(), s.Token()} {
		r := push(t, s, payload, auth)
		require.Equal(t, http.StatusUnauthorized, r.Status, "Authorization %q: %s", auth, r)
	}
	// Routing is unchanged: only the real replicas serve.
	replicas := replicaAddrs(s)
	for i := range 40 {
		r := complete(t, s, stackModel, 1)
		require.Equal(t, http.StatusOK, r.Status, r.String())
		require.Contains(t, replicas, r.served(s), "request %d", i)
	}
	require.Zero(t, hits.Load())

	// Control: the same kind of payload with the right token does change
	// routing, so the 401s above were what kept the intruder out. It is
	// pushed again while waiting: its endpoint goes stale like any other.
	seq := uint64(1)
	poll(t, func() bool {
		r := push(t, s, intruderPush(t, trapAddr, seq), "Bearer "+s.Token())
		require.Equal(t, http.StatusNoContent, r.Status, r.String())
		seq++
		for range 10 {
			// The served-by header carries the endpoint's name as its
			// agent reported it (the real agent names static targets by
			// host:port).
			if complete(t, s, stackModel, 1).served(s) == "intruder" {
				return true
			}
		}
		return false
	}, "an accepted push never routed to its endpoint")
	// Withdraw it: the same agent, a newer push without endpoints.
	r := push(t, s, intruderPush(t, "", seq), "Bearer "+s.Token())
	require.Equal(t, http.StatusNoContent, r.Status, r.String())
	awaitRouters()
	for i := range 30 {
		r := complete(t, s, stackModel, 1)
		require.Equal(t, http.StatusOK, r.Status, r.String())
		require.Contains(t, replicas, r.served(s), "request %d after the withdrawal", i)
	}
	require.Positive(t, hits.Load(), "the intruder's endpoint was reached while it was accepted")
}

func testAffinity(t *testing.T, s *stack.Stack) {
	const adapter = "sql-lora-3"
	// The requests share a prompt of several KV blocks, as an adapter's
	// requests usually share their instructions. (A prompt shorter than one
	// block gives the index nothing to hold: the default profile then
	// routes by its scorers' weights, which may spread an adapter over every
	// replica with a free slot when the one running it is busier.)
	body := func(maxTokens int) map[string]any {
		return map[string]any{"model": adapter, "max_tokens": maxTokens, "prompt": "You are a careful SQL assistant " +
			"for the sales database: tables users, orders and items. Answer with one query only. " +
			"Write a SQL query that lists users."}
	}
	// A long stream keeps the adapter running on one replica (about 30k
	// steps of simulated time: far longer than this subtest).
	stream := openStreamOf(t, s, body(3000))
	home := stream.Header.Get(s.Info().Router.ServedByHeader)
	require.NotNil(t, replicaByAddr(s, home), "served by %q", home)
	poll(t, func() bool { return runningAdapter(t, home, adapter) },
		"%s should show %s running", home, adapter)
	// Once the agent has scraped and pushed that, requests for the
	// adapter follow it.
	waitPushes(t, s, 3)

	const n = 40
	served := map[string]int{}
	for range n {
		r := send(t, http.MethodPost, s.ClientURL()+"/v1/completions", body(2), nil)
		require.Equal(t, http.StatusOK, r.Status, r.String())
		served[r.served(s)]++
	}
	// The default profile (prefix-aware, with the scoring profile's LoRA
	// weights) keeps an adapter where it runs; it may add a second replica
	// when the first is the busier one (the home runs the long stream), as
	// the seed's tree spreads an adapter only when it must. Never more.
	assert.LessOrEqual(t, len(served), 2, "requests for %s spread over %v, home %s", adapter, served, home)

	// An adapter nobody runs spreads to replicas with free slots: every
	// replica has room here, so it may land anywhere but must succeed.
	r := complete(t, s, "sql-lora-8", 2)
	require.Equal(t, http.StatusOK, r.Status, r.String())
	stream.Body.Close()
}

func testOverload(t *testing.T, s *stack.Stack) {
	// 96 long critical requests against 4 replicas x 4 sequences: about 20
	// waiting per replica, far over the seed's queue threshold (5). They
	// are sent in waves a scrape interval apart: a burst inside one
	// interval would all see the same snapshot and go to the one replica
	// that looked least loaded (see the report on herding).
	const flood, wave = 96, 8
	var wg sync.WaitGroup
	results := make(chan reply, flood)
	for i := range flood {
		if i > 0 && i%wave == 0 {
			time.Sleep(testInterval + 10*time.Millisecond)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := trySend(t.Context(), http.MethodPost, s.ClientURL()+"/v1/completions", completion(stackModel, 400), nil)
			if err != nil {
				r = reply{Status: -1, Body: []byte(err.Error())}
			}
			results <- r
		}()
	}
	t.Cleanup(wg.Wait)

	// Sheddable requests are refused once every replica is saturated.
	var dropped reply
	poll(t, func() bool {
		dropped = complete(t, s, "sql-lora-9", 1)
		return dropped.Status == http.StatusTooManyRequests
	}, "no sheddable request was dropped under overload")
	require.Equal(t, "application/json", dropped.Header.Get("Content-Type"))
	var e errorBody
	require.NoError(t, json.Unmarshal(dropped.Body, &e), dropped.String())
	assert.Equal(t, "rate_limit_error", e.Error.Type)
	assert.Equal(t, "capacity_exhausted", e.Error.Code)
	assert.NotEmpty(t, e.Error.Message)

	// Critical requests keep succeeding meanwhile (they queue).
	for _, m := range []string{"sql-lora-0", stackModel} {
		r := complete(t, s, m, 1)
		require.Equal(t, http.StatusOK, r.Status, "critical %s under overload: %s", m, r)
	}
	wg.Wait()
	close(results)
	ok := 0
	for r := range results {
		if assert.Equal(t, http.StatusOK, r.Status, "critical flood request: %s", r) {
			ok++
		}
	}
	require.Equal(t, flood, ok)
	require.Positive(t, stat(t, s, pluginStat("requests.dropped")))
}

// testDemoCommand runs bin/wasm-epp-demo briefly against the stack.
func testDemoCommand(t *testing.T, s *stack.Stack) {
	bin, _ := binaries(t)
	root, err := wasmbuild.ModuleRoot()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "wasm-epp-demo"),
		"--url", s.ClientURL(), "--start", "never", "--config", filepath.Join(root, "envoy", "envoy.yaml"),
		"--duration", "2s", "--rate", "20", "--progress", "line", "--seed", "3", "--drain", "30s")
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	text := string(out)
	for _, want := range []string{"Summary:", "Requests per replica", "Requests per model / adapter", "Adapter hit rate:", "p50", "Drops:"} {
		require.Contains(t, text, want)
	}
	// Every replica address shows up in the per-replica table.
	for _, a := range replicaAddrs(s) {
		require.Contains(t, text, a)
	}
	// Nothing failed (no 5xx, no transport errors).
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "Summary:") {
			require.Contains(t, sc.Text(), " 0 failed", sc.Text())
			fields := strings.Fields(sc.Text())
			n, err := strconv.Atoi(fields[1])
			require.NoError(t, err)
			require.Positive(t, n)
		}
	}
	t.Logf("demo output:\n%s", text)
}
