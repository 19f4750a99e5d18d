package envoyhost

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Body buffering, Pause semantics with and without
// allow_on_headers_stop_iteration, buffer limits and Content-Length.

// chunkedRequest sends the body in pieces (Transfer-Encoding: chunked), a
// pause between pieces, so the host sees several body callbacks.
func (h *harness) chunkedRequest(path string, headers map[string]string, pieces ...string) (*http.Response, string) {
	h.t.Helper()
	pr, pw := io.Pipe()
	go func() {
		for _, p := range pieces {
			_, _ = pw.Write([]byte(p))
			time.Sleep(30 * time.Millisecond)
		}
		pw.Close()
	}()
	resp := h.request("POST", path, pr, headers)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return resp, string(b)
}

func TestBodyBufferingSeesWholeBody(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.chunkedRequest("/b", map[string]string{"X-Tp-Body": "buffer"}, "aaaa", "bbbb", "cc")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	calls := strings.Split(resp.Header.Get("X-Tp-Req-Body-Calls"), ",")
	require.GreaterOrEqual(t, len(calls), 2, "several body callbacks")
	// While the filter buffers, each call's size is everything so far.
	last := 0
	for i, c := range calls {
		size, eos, _ := strings.Cut(c, ":")
		n, err := strconv.Atoi(size)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, n, last, "call %d", i)
		last = n
		assert.Equal(t, i == len(calls)-1, eos == "true")
	}
	assert.Equal(t, "10", resp.Header.Get("X-Tp-Req-Body-Len"))
	// on_request_headers returned Continue: the header map is gone.
	assert.Equal(t, "bad_argument", resp.Header.Get("X-Tp-Req-Header-After-Body"))
	assert.Equal(t, "aaaabbbbcc", string(h.up.last(t).Body))
}

func TestBodyModesChangeWhatGoesUpstream(t *testing.T) {
	cases := []struct {
		mode, want string
	}{
		{"replace:NEW", "NEW"},
		{"append:++", "hello++"},
		{"prepend:>>", ">>hello"},
	}
	h := newHarness(t, testPluginPkg)
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			resp, body := h.do("POST", "/m", "hello", map[string]string{"X-Tp-Body": c.mode})
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			got := h.up.last(t)
			assert.Equal(t, c.want, string(got.Body))
			assert.Equal(t, int64(-1), got.ContentLength, "the plugin removed content-length: chunked upstream")
		})
	}
}

// The filter buffers the body and answers with it. on_request_headers
// continued, so, as in Envoy, the router has already started the upstream
// request with the headers; the body is never forwarded, and the local
// reply resets that upstream request. The client sends its body only once
// the upstream has seen the headers, so every run checks the same order of
// events.
func TestBodyEcho(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	arrived := h.headersArrived()
	pr, pw := io.Pipe()
	go func() {
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
		}
		_, _ = pw.Write([]byte(`{"model":"m"}`))
		pw.Close()
	}()
	resp := h.request("POST", "/e", pr, map[string]string{"X-Tp-Body": "echo"})
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `{"model":"m"}`, string(body))
	h.requireResetWithoutBody(t, arrived)
}

// A filter changing the body without removing Content-Length sends the
// stale length upstream: the host, like Envoy, does not fix it, so the
// upstream reads only the declared bytes.
func TestContentLengthIsNotFixed(t *testing.T) {
	h := newHarness(t, rewriteGuestPkg)
	resp, body := h.do("POST", "/stale", "hello", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	got := h.up.last(t)
	assert.Equal(t, int64(5), got.ContentLength)
	assert.Equal(t, "hello", string(got.Body), "the appended bytes are past the declared length")
}

// Over the listener's buffer limit while the filter buffers, the host
// answers 413. on_request_headers continued (the test plugin's "buffer"
// mode), so, as in Envoy, the router has already started the upstream
// request with the headers: the upstream sees them, never a body byte, and
// the local reply resets it. The order is fixed: the client sends body
// bytes only once the upstream has seen the headers, and only 2 KiB of the
// 4 KiB it declares, so the filter buffers them (end of stream not
// reached; a whole body in one chunk would be continued, not buffered) and
// crosses the 1 KiB limit. Sending the body at once raced with both.
func TestPayloadTooLargeWhenBuffering(t *testing.T) {
	h := newHarness(t, testPluginPkg, func(c *Config, _ *PluginConfig) {
		c.Listeners[0].BufferLimitBytes = 1024
	})
	arrived := h.headersArrived()
	const declared, sent = 4096, 2048
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
		}
		_, _ = pw.Write([]byte(strings.Repeat("x", sent)))
	}()
	req, err := http.NewRequest("POST", h.url+"/big", pr)
	require.NoError(t, err)
	req.ContentLength = declared
	req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
	req.Header.Set("X-Tp-Body", "buffer")
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	assert.Equal(t, "Payload Too Large", string(b))
	// The 413 went through the filter's response callbacks.
	assert.NotEmpty(t, resp.Header.Get("X-Tp-Vm-Nonce"))
	h.requireResetWithoutBody(t, arrived)
	require.Eventually(t, func() bool { return len(h.access.all()) > 0 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "request_payload_too_large", h.access.all()[0].Details)

	// Not buffering, the same body streams through.
	resp, _ = h.do("POST", "/big", strings.Repeat("x", declared), nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// headersArrived is closed when the upstream first sees request headers.
func (h *harness) headersArrived() <-chan struct{} {
	arrived := make(chan struct{})
	var once sync.Once
	h.up.mu.Lock()
	h.up.arrived = func(*http.Request) { once.Do(func() { close(arrived) }) }
	h.up.mu.Unlock()
	return arrived
}

// requireResetWithoutBody: the upstream saw the request headers, never a
// body byte, and the request was reset.
func (h *harness) requireResetWithoutBody(t *testing.T, arrived <-chan struct{}) {
	t.Helper()
	select {
	case <-arrived:
	default:
		t.Fatal("the upstream never saw the request headers")
	}
	require.Eventually(t, func() bool { return len(h.up.requests()) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the upstream handler finishes once the reset reaches it")
	got := h.up.requests()[0]
	assert.Empty(t, got.Body, "no body byte went upstream")
	assert.Error(t, got.BodyErr, "the upstream request was reset, not completed")
}

// answerCalloutOnceRequestIn makes the upstream answer the callout on
// /callout only once the host has the whole request (the last body chunk or
// the trailers), so a resume from the callout comes after all of it
// arrived; other paths are echoed.
func (h *harness) answerCalloutOnceRequestIn() {
	requestIn := make(chan struct{})
	var once sync.Once
	hook := func(_ string, _ int, eos bool) {
		if eos {
			once.Do(func() { close(requestIn) })
		}
	}
	h.host.testHookRequestData.Store(&hook)
	h.up.reply = func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == "/callout" {
			<-requestIn
			_, _ = w.Write([]byte("called"))
			return
		}
		_, _ = w.Write(body)
	}
}

// Without allow_on_headers_stop_iteration, Pause in on_request_headers is
// StopAllIterationAndWatermark: no body callback until the plugin resumes;
// then the buffered body arrives in one callback and the headers can no
// longer be changed.
func TestPauseWithoutFlagHoldsBodyUntilResume(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	h.answerCalloutOnceRequestIn()
	resp, body := h.chunkedRequest("/tp/http-call?cluster=static&path=/callout&resume=1",
		nil, "part1-", "part2-", "part3")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	// One body callback, after the resume, with the whole body.
	assert.Equal(t, "17:true", resp.Header.Get("X-Tp-Req-Body-Calls"))
	reqs := h.up.requests()
	require.Len(t, reqs, 2, "the callout and the resumed request")
	assert.Equal(t, "/callout", reqs[0].Path)
	assert.Equal(t, "200", reqs[1].Header.Get("X-Tp-Call-Status"), "added while stopped, before resume")
	assert.Equal(t, "part1-part2-part3", string(reqs[1].Body))
}

// With the flag, Pause is StopIteration: body callbacks come while the
// headers wait, and the first body Continue releases them.
func TestPauseWithFlagDeliversBodyWhileHeadersWait(t *testing.T) {
	h := newHarness(t, testPluginPkg, withAllowStopIteration())
	resp, body := h.chunkedRequest("/p", map[string]string{"X-Tp-Headers-Action": "pause", "X-Tp-Body": "buffer"},
		"part1-", "part2-", "part3")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	calls := strings.Split(resp.Header.Get("X-Tp-Req-Body-Calls"), ",")
	assert.GreaterOrEqual(t, len(calls), 2)
	assert.Equal(t, "17:true", calls[len(calls)-1])
	// Headers were still writable in the last body callback.
	assert.Equal(t, "ok", resp.Header.Get("X-Tp-Req-Header-After-Body"))
	assert.Equal(t, "17", h.up.last(t).Header.Get("X-Tp-Body-Seen"))
}

// Without the flag and without anything to resume it, a paused request
// never sees its body: the host holds it (the client gives up).
func TestPauseWithoutFlagNeverDeliversBody(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	req, err := http.NewRequest("POST", h.url+"/p", strings.NewReader("body"))
	require.NoError(t, err)
	req.Header.Set("X-Tp-Headers-Action", "pause")
	req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
	client := &http.Client{Timeout: 500 * time.Millisecond}
	_, err = client.Do(req)
	require.Error(t, err, "the request stays stopped")
	assert.Empty(t, h.up.requests())
}

func TestResponseBodyModes(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	resp, body := h.do("GET", "/r", "", map[string]string{"X-Tp-Resp-Body": "replace:REPLACED"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "REPLACED", body)
	resp, body = h.do("GET", "/r", "", map[string]string{"X-Tp-Resp-Body": "append:!"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "upstream saw /r body=!", body)
}

// Streamed (SSE) responses pass chunk by chunk: the client reads the first
// event before the upstream has written the last.
func TestStreamingResponse(t *testing.T) {
	h := newHarness(t, testPluginPkg)
	release := make(chan struct{})
	h.up.reply = func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "data: two\n\n")
	}
	resp := h.request("GET", "/stream", nil, nil)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: one\n", line)
	close(release)
	rest, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: two\n\n", string(rest))
}
