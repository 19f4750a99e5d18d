package envoyhost

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/h2c"
)

// HTTP/2 with prior knowledge (what codec_type AUTO detects on a cleartext
// listener) and request trailers, delivered as Envoy delivers them: the
// last body callback has end_of_stream false, then on_request_trailers.

// h2cClient speaks HTTP/2 with prior knowledge.
var h2cClient = h2c.Client(30 * time.Second)

// h2Request sends body over HTTP/2 in pieces, then the trailers (declared
// up front, as Go's client always does).
func (h *harness) h2Request(path string, headers map[string]string, trailers map[string]string, pieces ...string) (*http.Response, string) {
	h.t.Helper()
	req, err := http.NewRequest("POST", h.url+path, h2c.PiecewiseBody(20*time.Millisecond, pieces...))
	require.NoError(h.t, err)
	req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	if len(trailers) > 0 {
		req.Trailer = http.Header{}
		for k, v := range trailers {
			req.Trailer.Set(k, v)
		}
	}
	resp, err := h2cClient.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	require.Equal(h.t, 2, resp.ProtoMajor, "the listener spoke HTTP/2")
	return resp, string(b)
}

func bodyCalls(resp *http.Response) []string {
	v := resp.Header.Get("X-Tp-Req-Body-Calls")
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func TestHTTP2PriorKnowledge(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	req, err := http.NewRequest("GET", h.url+"/tp/property?path=request.protocol", nil)
	require.NoError(t, err)
	resp, err := h2cClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, 2, resp.ProtoMajor)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "HTTP/2", string(body))
	assert.Empty(t, resp.Header.Values("Connection"))

	// HTTP/1.1 still works on the same AUTO listener.
	resp1, body1 := h.do("GET", "/tp/property?path=request.protocol", "", nil)
	assert.Equal(t, 1, resp1.ProtoMajor)
	assert.Equal(t, "HTTP/1.1", body1)

	// Proxied over HTTP/2: the upstream (HTTP/1) gets the request.
	resp2, body2 := h.h2Request("/up", nil, nil, "hello ", "world")
	assert.Equal(t, http.StatusOK, resp2.StatusCode)
	assert.Equal(t, "upstream saw /up body=hello world", body2)
}

// With allow_on_headers_stop_iteration and Pause in every body callback, a
// request with trailers ends in on_request_trailers: the buffered body is
// readable there and the request headers are still writable.
func TestHTTP2TrailersAfterBufferedBody(t *testing.T) {
	h := newHarness(t, testPluginPkg, withAllowStopIteration())
	resp, body := h.h2Request("/t", map[string]string{"X-Tp-Headers-Action": "pause", "X-Tp-Body": "buffer"},
		map[string]string{"X-Checksum": "abc"}, "part1-", "part2-", "part3")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	calls := bodyCalls(resp)
	require.NotEmpty(t, calls)
	for _, c := range calls {
		assert.True(t, strings.HasSuffix(c, ":false"), "no body callback ends the stream when trailers follow: %v", calls)
	}
	assert.Empty(t, resp.Header.Get("X-Tp-Req-Body-Len"), "the body callback never saw end_of_stream")
	assert.Equal(t, "1", resp.Header.Get("X-Tp-Req-Trailers"))
	assert.Equal(t, "17", resp.Header.Get("X-Tp-Trailers-Body-Len"), "the decoding buffer is readable in on_request_trailers")
	assert.Equal(t, "ok", resp.Header.Get("X-Tp-Trailers-Header"), "request headers are writable in on_request_trailers")
	got := h.up.last(t)
	assert.Equal(t, "part1-part2-part3", string(got.Body))
	assert.Equal(t, "1", got.Header.Get("X-Tp-Trailers-Seen"), "the header set in on_request_trailers went upstream")
	assert.Empty(t, got.Trailer, "the HTTP/1 upstream codec drops trailers")
}

// Without the flag, Pause in on_request_headers stops everything: body and
// trailers reach the filter only after the resume, the body callback still
// without end_of_stream, and the headers are gone by then.
func TestHTTP2TrailersAfterResume(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	h.answerCalloutOnceRequestIn()
	resp, body := h.h2Request("/tp/http-call?cluster=static&path=/callout&resume=1", map[string]string{"X-Tp-Body": "buffer"},
		map[string]string{"X-Checksum": "abc"}, "part1-", "part2")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, []string{"11:false"}, bodyCalls(resp), "one body callback after the resume")
	assert.Equal(t, "1", resp.Header.Get("X-Tp-Req-Trailers"))
	assert.Equal(t, "11", resp.Header.Get("X-Tp-Trailers-Body-Len"))
	assert.Equal(t, "bad_argument", resp.Header.Get("X-Tp-Trailers-Header"), "continuing dropped the request headers")
	assert.Equal(t, "part1-part2", body)
}

// A filter that continued everything still sees the trailers; there is no
// body left to read and the headers are gone.
func TestHTTP2TrailersAfterContinue(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.h2Request("/c", nil, map[string]string{"X-Checksum": "abc", "X-Other": "1"}, "abc", "def")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "upstream saw /c body=abcdef", body)
	assert.Equal(t, "2", resp.Header.Get("X-Tp-Req-Trailers"))
	assert.Equal(t, "bad_argument", resp.Header.Get("X-Tp-Trailers-Header"))
	assert.NotEqual(t, "6", resp.Header.Get("X-Tp-Trailers-Body-Len"), "nothing was buffered")
}

// HTTP/1.1 trailers are dropped by the codec (enable_trailers is off by
// default): the last body callback ends the stream.
func TestHTTP1TrailersAreDropped(t *testing.T) {
	h := newHarness(t, testPluginPkg, withAllowStopIteration())
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("abc"))
		pw.Close()
	}()
	req, err := http.NewRequest("POST", h.url+"/h1", pr)
	require.NoError(t, err)
	req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
	req.Header.Set("X-Tp-Body", "buffer")
	req.Trailer = http.Header{"X-Checksum": {"abc"}}
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 1, resp.ProtoMajor)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	calls := bodyCalls(resp)
	require.NotEmpty(t, calls)
	assert.True(t, strings.HasSuffix(calls[len(calls)-1], ":true"), calls)
	assert.Empty(t, resp.Header.Get("X-Tp-Req-Trailers"), "on_request_trailers is not called")
}

// codec_type HTTP1 refuses HTTP/2 and HTTP2 refuses HTTP/1.1.
func TestCodecTypeRestrictsProtocols(t *testing.T) {
	h1 := newHarness(t, trivialGuestPkg, func(c *Config, _ *PluginConfig) { c.Listeners[0].Codec = CodecHTTP1 })
	req, err := http.NewRequest("GET", h1.url+"/x", nil)
	require.NoError(t, err)
	_, err = h2cClient.Do(req)
	assert.Error(t, err, "an HTTP1 listener does not speak HTTP/2")

	h2 := newHarness(t, trivialGuestPkg, func(c *Config, _ *PluginConfig) { c.Listeners[0].Codec = CodecHTTP2 })
	req, err = http.NewRequest("GET", h2.url+"/x", nil)
	require.NoError(t, err)
	req.Header.Set(DefaultOriginalDstHeader, h2.up.addr())
	resp, err := h2cClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = httpClient.Do(req.Clone(req.Context()))
	var netErr net.Error
	assert.True(t, err != nil && (errors.As(err, &netErr) || errors.Is(err, io.EOF) || strings.Contains(err.Error(), "malformed")),
		"an HTTP2 listener does not speak HTTP/1.1: %v", err)
}
