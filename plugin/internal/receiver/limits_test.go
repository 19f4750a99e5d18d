package receiver

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPushLimitBoundary: with maxPushBytes equal to a valid push's size the
// push is accepted, and with the limit one byte smaller the same push is a
// 413 — from its Content-Length before any body, or while buffering when
// it has none — and nothing is stored.
func TestPushLimitBoundary(t *testing.T) {
	body := push(t, "node-a", 1, "pod-1", "pod-2")
	n := len(body)
	cfg := func(limit int) string {
		return `{"role":"receiver","receiver":{"maxPushBytes":` + strconv.Itoa(limit) + `}}`
	}
	for _, tc := range []struct {
		name    string
		declare bool
		chunk   int
	}{
		{"content-length, one chunk", true, 0},
		{"content-length, many chunks", true, 16},
		{"buffered, one chunk", false, 0},
		{"buffered, many chunks", false, 16},
		{"buffered, the last byte reaches the limit", false, n - 1},
	} {
		length := -1
		if tc.declare {
			length = n
		}
		t.Run("exactly the limit: "+tc.name, func(t *testing.T) {
			host := newHost(t, cfg(n))
			r := send(t, host, pushHeaders(testToken, length), body, tc.chunk)
			require.Equal(t, uint32(204), r.status, r.code)
			s, _ := stored(t, host)
			require.NotNil(t, s)
			assert.Equal(t, map[string][]string{"node-a": {"pod-1", "pod-2"}}, agents(s))
		})
		t.Run("one byte over: "+tc.name, func(t *testing.T) {
			host := newHost(t, cfg(n-1))
			r := send(t, host, pushHeaders(testToken, length), body, tc.chunk)
			assert.Equal(t, uint32(413), r.status)
			assert.Equal(t, "too_large", r.code)
			s, _ := stored(t, host)
			assert.Nil(t, s, "nothing stored")
		})
	}

	// The declared size alone decides: no body has been delivered yet.
	for _, tc := range []struct {
		limit int
		reply bool
	}{{n, false}, {n - 1, true}} {
		t.Run("content-length "+strconv.Itoa(n)+", limit "+strconv.Itoa(tc.limit)+", headers only", func(t *testing.T) {
			host := newHost(t, cfg(tc.limit))
			id := host.InitializeHttpContext()
			host.CallOnRequestHeaders(id, pushHeaders(testToken, n), false)
			local := host.GetSentLocalResponse(id)
			if !tc.reply {
				assert.Nil(t, local, "a declared size at the limit waits for the body")
				return
			}
			require.NotNil(t, local, "a declared size over the limit is refused from the headers")
			assert.Equal(t, uint32(413), local.StatusCode)
		})
	}
}
