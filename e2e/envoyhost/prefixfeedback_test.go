package envoyhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// sharedIndexStore reads the module's shared data for a native
// prefix.Index: the view of the index every worker VM syncs with. It never
// writes.
type sharedIndexStore struct{ h *harness }

func (s sharedIndexStore) Get(key string, dst []byte) ([]byte, uint32, error) {
	v, cas, res := s.h.host.shared.get("test-vm", key)
	if res == ResultNotFound {
		return dst[:0], 0, prefix.ErrNotFound
	}
	return append(dst[:0], v...), cas, nil
}

func (sharedIndexStore) Set(string, []byte, uint32) error {
	return errors.New("the test's view of the shared index is read-only")
}

// feedbackTwin is what the plugin's prefix tracking does, natively: the same
// hashing, an index of the same configuration, the same record and judge
// steps. The real module's shared index must say what the twin's says.
type feedbackTwin struct {
	t     *testing.T
	cfg   *config.Config
	h     *prefix.Hasher
	index *prefix.Index
	view  *prefix.Index
	now   time.Time
}

func newFeedbackTwin(t *testing.T, h *harness, cfg *config.Config) *feedbackTwin {
	hasher, err := prefix.NewHasher(cfg.PrefixConfig.Hash)
	require.NoError(t, err)
	icfg := cfg.PrefixConfig.Index
	icfg.KeyPrefix = cfg.SharedDataKeyPrefix
	index, err := prefix.NewIndex(icfg, nil)
	require.NoError(t, err)
	view, err := prefix.NewIndex(icfg, sharedIndexStore{h})
	require.NoError(t, err)
	return &feedbackTwin{t: t, cfg: cfg, h: hasher, index: index, view: view, now: time.Now()}
}

// blocks hashes a chat body as the plugin does (target "chat", no tools,
// no cache_salt).
func (w *feedbackTwin) blocks(body []byte) []uint64 {
	var req struct {
		Messages json.RawMessage `json:"messages"`
	}
	require.NoError(w.t, json.Unmarshal(body, &req))
	require.NoError(w.t, w.h.HashMessages("chat", nil, nil, req.Messages))
	return w.h.Blocks()
}

// endpointKey is the index key of the snapshot endpoint (benchSnapshot) at
// destination "ip:port".
func endpointKey(t *testing.T, dest string) uint32 {
	host, port, err := net.SplitHostPort(dest)
	require.NoError(t, err)
	ip := net.ParseIP(host).To4()
	require.NotNil(t, ip, dest)
	i := int(ip[2])*200 + int(ip[3]) - 1
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return prefix.EndpointKey("llm", fmt.Sprintf("vllm-%03d", i), host, p)
}

// routed records a request the module sent to dest, returning the blocks
// it predicts held there and what the request keeps for its response.
func (w *feedbackTwin) routed(blocks []uint64, dest string) (ep uint32, predicted int, kept []uint64) {
	ep = endpointKey(w.t, dest)
	var m prefix.Match
	w.index.Lookup(blocks, &m)
	predicted = m.Blocks(ep)
	w.now = w.now.Add(time.Second)
	w.index.Record(blocks, ep, predicted, w.now)
	return ep, predicted, append([]uint64(nil), blocks[:predicted]...)
}

// responded judges the response's usage (reported false: none) and
// corrects the twin's index as the plugin does.
func (w *feedbackTwin) responded(blocks []uint64, ep uint32, predicted int, kept []uint64, reported bool, promptTokens, cachedTokens int64) (mispredicted bool) {
	if !reported {
		return false
	}
	_, forget := prefix.Judge(len(blocks), predicted, promptTokens, cachedTokens, w.index.Config().RecordEvery)
	if forget >= 0 {
		w.index.Forget(kept, ep, forget, w.now)
	}
	return forget >= 0
}

// matches is what an index knows of blocks: endpoint key → blocks.
func matches(x *prefix.Index, blocks []uint64) map[uint32]int {
	var m prefix.Match
	x.Lookup(blocks, &m)
	out := map[uint32]int{}
	for i := range m.Len() {
		k, b := m.At(i)
		out[k] = b
	}
	return out
}

// sameIndex waits until the module's shared index (synced on its tick)
// says of blocks what the twin's says.
func (w *feedbackTwin) sameIndex(what string, blocks []uint64) map[uint32]int {
	w.t.Helper()
	want := matches(w.index, blocks)
	deadline := time.Now().Add(20 * time.Second)
	for {
		w.view.Sync()
		got := matches(w.view, blocks)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return got
		}
		if time.Now().After(deadline) {
			require.Equal(w.t, want, got, "%s: the module's shared index differs from the native one", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sse is a vLLM chat stream: content deltas, then (with usage) the chunk
// with empty choices and usage, then [DONE].
func sse(usage string) string {
	var b strings.Builder
	for _, w := range []string{"The", " answer", " is", " here."} {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", w)
	}
	if usage != "" {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":%s}\n\n", usage)
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// every cuts s into chunks of n bytes.
func every(s string, n int) [][]byte {
	var out [][]byte
	for i := 0; i < len(s); i += n {
		out = append(out, []byte(s[i:min(i+n, len(s))]))
	}
	return out
}

// TestPrefixStreamFeedbackInTheHost: streamed (server-sent event) and JSON
// responses pass through the real module, whose usage scan judges the
// prediction made at routing time and corrects the shared index exactly as
// the native tracking does: a usage chunk reporting a miss removes the
// predicted entries whether it comes whole or split across body chunks at
// any byte; a stream without a usage chunk, or whose request did not ask
// for usage, changes nothing; a reported hit keeps everything.
func TestPrefixStreamFeedbackInTheHost(t *testing.T) {
	h, cfg := prefixHarness(t, 1, 4, "prefix-aware")
	twin := newFeedbackTwin(t, h, cfg)
	stat := func(name string) uint64 {
		v, _ := h.host.StatValue("wasmcustom.wasm_epp." + name)
		return v
	}
	type counts struct{ judged, mispredicted, unreported, reportedCached uint64 }
	now := func() counts {
		return counts{stat("prefix.responses.judged"), stat("prefix.responses.mispredicted"),
			stat("prefix.responses.unreported"), stat("prefix.reported_cached_tokens")}
	}
	// The tracker's counters are published on the tick.
	waitCounts := func(what string, want counts) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for now() != want {
			require.True(t, time.Now().Before(deadline), "%s: counters %+v, want %+v", what, now(), want)
			time.Sleep(5 * time.Millisecond)
		}
	}
	missUsage := `{"prompt_tokens":600,"total_tokens":604,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}`
	usageStream := sse(missUsage)
	// Split points inside the usage chunk: at every byte of it, in
	// one-byte chunks, and in chunks of 7 and 64 bytes.
	usageAt := strings.Index(usageStream, `"usage"`)
	cases := []struct {
		name           string
		asks, stream   bool
		response       [][]byte
		reported       bool
		cached         int64
		wantUnreported bool
	}{
		{name: "usage chunk reports a miss", asks: true, stream: true, response: [][]byte{[]byte(usageStream)}, reported: true},
		{name: "usage chunk in 1-byte chunks", asks: true, stream: true, response: every(usageStream, 1), reported: true},
		{name: "usage chunk in 7-byte chunks", asks: true, stream: true, response: every(usageStream, 7), reported: true},
		{name: "usage chunk in 64-byte chunks", asks: true, stream: true, response: every(usageStream, 64), reported: true},
		{name: "split inside cached_tokens", asks: true, stream: true, reported: true, response: [][]byte{
			[]byte(usageStream[:strings.Index(usageStream, "cached_to")+5]), []byte(usageStream[strings.Index(usageStream, "cached_to")+5:])}},
		{name: "split between data: and the usage object", asks: true, stream: true, reported: true, response: [][]byte{
			[]byte(usageStream[:usageAt-60]), []byte(usageStream[usageAt-60 : usageAt+3]), []byte(usageStream[usageAt+3:])}},
		{name: "asked for usage, none sent", asks: true, stream: true, response: every(sse(""), 40), wantUnreported: true},
		{name: "did not ask for usage", stream: true, response: [][]byte{[]byte(usageStream)}},
		{name: "usage chunk reports the hit", asks: true, stream: true, reported: true, cached: -1,
			response: nil /* set below from the prediction */},
		{name: "JSON body split across chunks", reported: true, response: every(
			`{"id":"chatcmpl-2","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":`+missUsage+`}`, 11)},
	}
	for i, tc := range cases {
		system := fmt.Sprintf("Case %02d: %s", i, strings.Repeat("A shared manual paragraph that every turn repeats. ", 50))
		req := map[string]any{"model": "chat", "max_tokens": 64, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": "What does it say?"}}}
		if tc.stream {
			req["stream"] = true
		}
		if tc.asks {
			req["stream_options"] = map[string]any{"include_usage": true}
		}
		body, err := json.Marshal(req)
		require.NoError(t, err)
		blocks := twin.blocks(body)
		require.Greater(t, len(blocks), 16, tc.name)

		// Responses are scanned for usage unless the request is a stream
		// that did not ask for it (then nothing is counted either).
		scanned := !tc.stream || tc.asks
		bump := func(c counts, judged bool, cached uint64, mispredicted bool) counts {
			switch {
			case !scanned:
			case !judged:
				c.unreported++
			default:
				c.judged++
				c.reportedCached += cached
				if mispredicted {
					c.mispredicted++
				}
			}
			return c
		}

		// The first request records the prompt; its response reports
		// nothing cached, which contradicts no prediction.
		before := now()
		dest := routeChunksOn(t, h, cfg, 1, body, []byte(sse(missUsage)))
		ep, predicted, kept := twin.routed(blocks, dest)
		require.Zero(t, predicted, tc.name)
		require.False(t, twin.responded(blocks, ep, predicted, kept, scanned, 600, 0))
		afterFirst := bump(before, true, 0, false)
		waitCounts(tc.name+", first request", afterFirst)
		twin.sameIndex(tc.name+", first request", blocks)

		// The second is sent where the prefix is, predicted a hit.
		response := tc.response
		if tc.cached < 0 {
			// The reported share matches the prediction.
			_, pred, _ := twin.peek(blocks, dest)
			tc.cached = 600 * int64(pred) / int64(len(blocks))
			response = every(sse(fmt.Sprintf(`{"prompt_tokens":600,"total_tokens":604,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":%d}}`, tc.cached)), 13)
		}
		again := routeChunksOn(t, h, cfg, 1, body, response...)
		require.Equal(t, dest, again, "%s: the second request goes where the prefix is", tc.name)
		ep, predicted, kept = twin.routed(blocks, again)
		require.Greater(t, predicted, 0, tc.name)
		mispredicted := twin.responded(blocks, ep, predicted, kept, tc.reported, 600, tc.cached)
		waitCounts(tc.name, bump(afterFirst, !tc.wantUnreported, uint64(max(tc.cached, 0)), mispredicted))
		got := twin.sameIndex(tc.name, blocks)
		switch {
		case tc.reported && tc.cached == 0:
			require.True(t, mispredicted, tc.name)
			require.Zero(t, got[ep], "%s: the mispredicted entries are gone", tc.name)
		default:
			require.False(t, mispredicted, tc.name)
			require.Equal(t, predicted, got[ep], "%s: nothing is forgotten", tc.name)
		}
	}
}

// peek is the twin's prediction for blocks at dest, without recording.
func (w *feedbackTwin) peek(blocks []uint64, dest string) (uint32, int, []uint64) {
	ep := endpointKey(w.t, dest)
	var m prefix.Match
	w.index.Lookup(blocks, &m)
	p := m.Blocks(ep)
	return ep, p, blocks[:p]
}
