package filter

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bodyOfSize is a valid completion body for model "base" of exactly n bytes.
func bodyOfSize(t *testing.T, n int) string {
	t.Helper()
	const head, tail = `{"model":"base","prompt":"`, `"}`
	require.GreaterOrEqual(t, n, len(head)+len(tail))
	b := head + strings.Repeat("x", n-len(head)-len(tail)) + tail
	require.Len(t, b, n)
	return b
}

// chunks splits s into pieces of at most n bytes.
func chunks(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// TestBodyLimitBoundary: a body of exactly maxBodyBytes is routed and one
// byte more is a 413, whether the size is declared (Content-Length, refused
// from the headers alone) or only found while buffering (no Content-Length;
// the limit is crossed in the last chunk or in the only one).
func TestBodyLimitBoundary(t *testing.T) {
	const limit = 1024
	cfg := `{"maxBodyBytes": ` + strconv.Itoa(limit) + `, "models": [{"name": "base"}]}`
	exact, over := bodyOfSize(t, limit), bodyOfSize(t, limit+1)
	cl := func(n int) [][2]string { return [][2]string{{"content-length", strconv.Itoa(n)}} }

	accepted := []struct {
		name   string
		extra  [][2]string
		chunks []string
	}{
		{"content-length, one chunk", cl(limit), []string{exact}},
		{"content-length, many chunks", cl(limit), chunks(exact, 100)},
		{"buffered, one chunk", nil, []string{exact}},
		{"buffered, many chunks", nil, chunks(exact, 100)},
		{"buffered, the last chunk reaches the limit", nil, []string{exact[:limit-1], exact[limit-1:]}},
	}
	for _, tc := range accepted {
		t.Run("exactly the limit: "+tc.name, func(t *testing.T) {
			e := newEnv(t, cfg)
			e.setPods(pod{name: "a", addr: "10.0.0.7"})
			r := e.post("/v1/completions", tc.extra, tc.chunks...)
			require.Nil(t, r.local, "local reply %+v", r.local)
			assert.Equal(t, "10.0.0.7:8000", r.dest())
			assert.Equal(t, exact, r.body, "the whole body goes upstream")
			assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.routed"))
		})
	}

	refused := []struct {
		name   string
		extra  [][2]string
		chunks []string
	}{
		{"buffered, one chunk", nil, []string{over}},
		{"buffered, the last byte crosses", nil, []string{over[:limit], over[limit:]}},
		{"buffered, many chunks", nil, chunks(over, 100)},
	}
	for _, tc := range refused {
		t.Run("one byte over: "+tc.name, func(t *testing.T) {
			e := newEnv(t, cfg)
			e.setPods(pod{name: "a"})
			r := e.post("/v1/completions", tc.extra, tc.chunks...)
			require.NotNil(t, r.local, "expected a 413")
			assert.Equal(t, uint32(413), r.local.StatusCode)
			_, _, code := r.errorJSON(t)
			assert.Equal(t, "request_too_large", code)
			assert.Empty(t, r.dest())
			assert.Equal(t, uint64(1), e.counter("wasm_epp.requests.too_large"))
		})
	}

	// By Content-Length the decision needs no body: the headers alone get
	// the answer (a client sending Expect: 100-continue sends nothing more).
	for _, tc := range []struct {
		declared int
		reply    bool
	}{{limit, false}, {limit + 1, true}} {
		t.Run("content-length "+strconv.Itoa(tc.declared)+", headers only", func(t *testing.T) {
			e := newEnv(t, cfg)
			e.setPods(pod{name: "a"})
			id := e.host.InitializeHttpContext()
			hdrs := append([][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gw"}}, cl(tc.declared)...)
			e.host.CallOnRequestHeaders(id, hdrs, false)
			local := e.host.GetSentLocalResponse(id)
			if !tc.reply {
				assert.Nil(t, local, "a declared size at the limit waits for the body")
				return
			}
			require.NotNil(t, local, "a declared size over the limit is refused from the headers")
			assert.Equal(t, uint32(413), local.StatusCode)
		})
	}
}
