package filtertest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// sizedBody is a valid completion body for model "base" of exactly n bytes.
func sizedBody(t *testing.T, n int) string {
	t.Helper()
	const head, tail = `{"model":"base","prompt":"`, `"}`
	b := head + strings.Repeat("x", n-len(head)-len(tail)) + tail
	require.Len(t, b, n)
	return b
}

func split(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// headersOnly writes a request head that declares a body and sends none,
// then reads the answer: only a filter that decides from the headers can
// answer before the body arrives. The read deadline bounds the wait; it is
// not the expected time.
func headersOnly(t *testing.T, addr, head string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = io.WriteString(conn, head)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "no answer before the body was sent")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestBodyLimitBoundaryInHost: in the real module, a body of exactly
// maxBodyBytes is routed whole and one byte more is the plugin's 413,
// found while buffering (chunked, no Content-Length) or from the declared
// Content-Length before any body is sent.
func TestBodyLimitBoundaryInHost(t *testing.T) {
	const limit = 4096
	s := startStack(t, `{"maxBodyBytes": `+strconv.Itoa(limit)+`, "models": [{"name": "base", "criticality": "Critical"}]}`, 1)
	s.setPods(podState{max: 4})
	exact, over := sizedBody(t, limit), sizedBody(t, limit+1)

	t.Run("exactly the limit, content-length", func(t *testing.T) {
		r := s.post("/v1/completions", exact)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		got := s.pods[0].requests()
		assert.Equal(t, exact, string(got[len(got)-1].Body))
	})
	t.Run("exactly the limit, chunked", func(t *testing.T) {
		for _, size := range []int{limit, 1000, limit - 1} {
			r := s.chunkedPost("/v1/completions", split(exact, size), 0)
			require.Equal(t, http.StatusOK, r.status, "chunks of %d: %s", size, r.body)
			got := s.pods[0].requests()
			assert.Equal(t, exact, string(got[len(got)-1].Body))
		}
	})
	t.Run("one byte over, chunked", func(t *testing.T) {
		for i, size := range []int{limit + 1, 1000, limit} {
			path := "/v1/completions?over=" + strconv.Itoa(i)
			r := s.chunkedPost(path, split(over, size), 0)
			assert.Equal(t, http.StatusRequestEntityTooLarge, r.status, "chunks of %d: %s", size, r.body)
			_, _, code := r.errorJSON(t)
			assert.Equal(t, "request_too_large", code)
			assert.Empty(t, r.pod)
			assert.Equal(t, "wasm_epp_too_large", s.routerAccessFor(path).Details, "the plugin's 413, not the host's")
		}
	})
	t.Run("one byte over, content-length, before the body", func(t *testing.T) {
		resp := headersOnly(t, strings.TrimPrefix(s.router, "http://"), fmt.Sprintf(
			"POST /v1/completions?declared HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", limit+1))
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		assert.Equal(t, "wasm_epp_too_large", s.routerAccessFor("/v1/completions?declared").Details)
	})
	assert.Equal(t, uint64(4), s.stat("wasm_epp.requests.routed"))
	assert.Equal(t, uint64(4), s.stat("wasm_epp.requests.too_large"))
}

// TestPushLimitBoundaryInHost: in the real module, with maxPushBytes equal
// to a valid push's size the push is stored, and with the limit one byte
// smaller the same push is a 413 — declared or found while buffering — and
// shared data is untouched.
func TestPushLimitBoundaryInHost(t *testing.T) {
	eps := []wire.EndpointState{{Namespace: "llm", Name: "pod-x", Address: netip.MustParseAddr("127.0.0.1"), Port: 8000, MaxAdapters: 4, ScrapeTime: t0}}
	payload, err := wire.EncodePush(&wire.Push{AgentID: "node-1", Seq: 1, SendTime: t0, Endpoints: eps}, wire.DefaultLimits())
	require.NoError(t, err)
	n := len(payload)
	withLimit := func(limit int) stackOpt {
		return func(c *envoyHostConfig) {
			for i := range c.Listeners {
				if c.Listeners[i].Name == "push" {
					c.Listeners[i].Plugin.Configuration = []byte(`{"role": "receiver", "receiver": {"maxPushBytes": ` + strconv.Itoa(limit) + `}}`)
				}
			}
		}
	}
	pushReq := func(t *testing.T, s *stack, chunked bool) int {
		t.Helper()
		var body io.Reader = bytes.NewReader(payload)
		if chunked {
			body = io.MultiReader(bytes.NewReader(payload[:n/2]), bytes.NewReader(payload[n/2:])) // no length known
		}
		req, err := http.NewRequest("POST", s.push+pushPath, body)
		require.NoError(t, err)
		if chunked {
			req.ContentLength = -1 // net/http sends it chunked
		}
		req.Header.Set("Authorization", "Bearer "+pushToken)
		req.Close = true
		resp, err := s.client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	t.Run("exactly the limit", func(t *testing.T) {
		for _, chunked := range []bool{false, true} {
			s := startStack(t, routerConfig, 0, withLimit(n))
			require.Equal(t, http.StatusNoContent, pushReq(t, s, chunked), "chunked %v", chunked)
			snap := s.snapshot()
			require.Len(t, snap.Endpoints, 1)
			assert.Equal(t, "pod-x", snap.Endpoints[0].ID.Name)
		}
	})
	t.Run("one byte over", func(t *testing.T) {
		s := startStack(t, routerConfig, 0, withLimit(n-1))
		for _, chunked := range []bool{false, true} {
			assert.Equal(t, http.StatusRequestEntityTooLarge, pushReq(t, s, chunked), "chunked %v", chunked)
		}
		resp := headersOnly(t, strings.TrimPrefix(s.push, "http://"), fmt.Sprintf(
			"POST %s HTTP/1.1\r\nHost: envoy\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", pushPath, pushToken, n))
		assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "refused from the declared length")
		assert.Equal(t, uint64(3), s.stat("wasm_epp.receiver.too_large"))
		assert.Empty(t, s.snapshot().Endpoints, "nothing stored")
	})
}
