package envoyhost

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Holding a request and releasing it from the root context's tick, as
// in-proxy flow control does (the hold guest, testdata/guests/hold): the
// effective context (cpp-host src/exports.cc set_effective_context,
// contextOrEffectiveContext), continue/close/local reply on a paused
// stream (envoy source/extensions/common/wasm/context.cc continueStream,
// closeStream, sendLocalResponse, run after the callback), and a client
// that goes away while held (on_log, on_done, on_delete, then nothing).

const holdGuestPkg = "./e2e/envoyhost/testdata/guests/hold"

// holdLines returns the hold guest's log lines, without the "hold: "
// prefix, in order.
func (h *harness) holdLines() []string {
	var out []string
	for _, r := range h.logs.Records() {
		if m, ok := strings.CutPrefix(r.Message, "hold: "); ok {
			out = append(out, m)
		}
	}
	return out
}

// holdLine waits for a guest log line starting with prefix and returns its
// fields.
func (h *harness) holdLine(prefix string) []string {
	h.t.Helper()
	var fields []string
	require.Eventually(h.t, func() bool {
		for _, l := range h.holdLines() {
			if strings.HasPrefix(l, prefix) {
				fields = strings.Fields(l)
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "no %q in %v", prefix, h.holdLines())
	return fields
}

// heldID is the context id of the (single) held stream.
func (h *harness) heldID() string { return h.holdLine("held ")[1] }

// holdRequest sends a request without the destination header: only the
// guest's release sets it.
func (h *harness) holdRequest(ctx context.Context, method, path, body string, headers map[string]string) (*http.Response, string, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.url+path, r)
	require.NoError(h.t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func TestHeldStreamResumedFromTickHeadersPause(t *testing.T) {
	h := newHarness(t, holdGuestPkg)
	resp, body, err := h.holdRequest(context.Background(), "POST", "/held", "the body",
		map[string]string{"X-Hold": "headers", "X-Release": "continue", "X-Hold-Dest": h.up.addr(), "X-Release-After": "3"})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "upstream saw /held body=the body", body)
	got := h.up.last(t)
	assert.Equal(t, h.up.addr(), got.Header.Get(DefaultOriginalDstHeader), "the destination header was set at release")

	id := h.heldID()
	assert.Equal(t, []string{"effective", id, "0"}, h.holdLine("effective "+id))
	assert.Equal(t, []string{"replace", id, "0"}, h.holdLine("replace "+id), "headers paused in on_request_headers are writable from the tick")
	assert.Equal(t, []string{"continue", id, "0"}, h.holdLine("continue "+id))
	assert.Equal(t, []string{"after_continue", id, "2"}, h.holdLine("after_continue "+id),
		"continuing drops the header map at once: BadArgument")
	// Without allow_on_headers_stop_iteration the body came only after the
	// resume, in one callback.
	assert.Equal(t, []string{"request_body", id, "8", "1"}, h.holdLine("request_body "+id))
}

func TestHeldStreamResumedFromTickBodyPause(t *testing.T) {
	h := newHarness(t, holdGuestPkg, withAllowStopIteration())
	resp, body, err := h.holdRequest(context.Background(), "POST", "/held", `{"model":"m"}`,
		map[string]string{"X-Hold": "body", "X-Release": "continue", "X-Hold-Dest": h.up.addr()})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, `upstream saw /held body={"model":"m"}`, body)
	assert.Equal(t, h.up.addr(), h.up.last(t).Header.Get(DefaultOriginalDstHeader))
	id := h.heldID()
	assert.Equal(t, []string{"replace", id, "0"}, h.holdLine("replace "+id), "with the flag the headers are still writable")
	assert.Equal(t, []string{"body", id, "13"}, h.holdLine("body "+id), "the buffered body is readable from the tick")
	// Continuing drops the request maps, not the body: while buffering,
	// the body is the decoding buffer (envoy context.cc getBuffer, and
	// continueStream leaves buffering_request_body_ set).
	assert.Equal(t, []string{"body_after_continue", id, "13"}, h.holdLine("body_after_continue "+id))
}

func TestHeldStreamClosedFromTick(t *testing.T) {
	h := newHarness(t, holdGuestPkg)
	_, _, err := h.holdRequest(context.Background(), "GET", "/held", "",
		map[string]string{"X-Hold": "headers", "X-Release": "close"})
	require.Error(t, err, "proxy_close_stream resets the stream: no response")
	id := h.heldID()
	assert.Equal(t, []string{"close", id, "0"}, h.holdLine("close "+id))
	h.holdLine("on_delete " + id)
	assert.Empty(t, h.up.requests())
	require.Eventually(t, func() bool { return len(h.access.all()) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, "wasm_close_stream", h.access.all()[0].Details)
}

func TestHeldStreamAnsweredFromTick(t *testing.T) {
	h := newHarness(t, holdGuestPkg)
	resp, body, err := h.holdRequest(context.Background(), "GET", "/held", "",
		map[string]string{"X-Hold": "headers", "X-Release": "reply"})
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "held", body)
	id := h.heldID()
	h.holdLine("response_headers " + id) // the local reply went through the filter
	require.Eventually(t, func() bool { return len(h.access.all()) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, "held_too_long", h.access.all()[0].Details)
	assert.Empty(t, h.up.requests())
}

// A client that goes away while its request is held: the stream ends with
// on_log, on_done, on_delete (envoy conn_manager_impl.cc
// doDeferredStreamDestroy), no other callback reports it, none comes for
// that context afterwards, and the id is gone from the VM's context table
// (set_effective_context: BadArgument).
func TestHeldStreamResetByClient(t *testing.T) {
	// Held at the headers without the flag (StopAll), or at the end of the
	// body with it.
	for mode, opts := range map[string][]harnessOpt{"headers": nil, "body": {withAllowStopIteration()}} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, holdGuestPkg, opts...)
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, _, err := h.holdRequest(ctx, "POST", "/held", "body", map[string]string{"X-Hold": mode, "X-Release": "never"})
				errc <- err
			}()
			id := h.heldID()
			time.Sleep(30 * time.Millisecond) // a few ticks while held
			cancel()
			require.Error(t, <-errc)
			assert.Equal(t, []string{"effective_after_done", id, "2"}, h.holdLine("effective_after_done "+id))
			time.Sleep(30 * time.Millisecond) // more ticks after the end
			var order []string
			for _, l := range h.holdLines() {
				f := strings.Fields(l)
				if len(f) >= 2 && f[1] == id && (f[0] == "on_log" || f[0] == "on_done" || f[0] == "on_delete") {
					order = append(order, f[0])
				}
				assert.NotEqual(t, "callback_after_done", f[0], l)
				assert.NotEqual(t, "response_headers", f[0], "no callback reports the reset: %s", l)
			}
			assert.Equal(t, []string{"on_log", "on_done", "on_delete"}, order)
			assert.Empty(t, h.up.requests())
			infos := h.host.VMInfo("main")
			require.Len(t, infos, 3, "main thread and two workers")
			for _, vi := range infos {
				assert.Zero(t, vi.Streams, "%s: the reset stream left the context table", vi.Thread)
				assert.Equal(t, 1, vi.Roots, vi.Thread)
				assert.NotZero(t, vi.MemoryBytes, vi.Thread)
			}
		})
	}
}

// stream_idle_timeout ends a held request with a local reply through the
// filter: 504 once the request was complete, 408 while it was still coming
// (envoy conn_manager_impl.cc onIdleTimeout, Utility::maybeRequestTimeoutCode).
func TestHeldStreamIdleTimeout(t *testing.T) {
	idle := func(c *Config, _ *PluginConfig) { c.Listeners[0].StreamIdleTimeout = 200 * time.Millisecond }
	t.Run("complete", func(t *testing.T) {
		h := newHarness(t, holdGuestPkg, withAllowStopIteration(), idle)
		resp, body, err := h.holdRequest(context.Background(), "POST", "/held", "body",
			map[string]string{"X-Hold": "body", "X-Release": "never"})
		require.NoError(t, err)
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
		assert.Equal(t, "stream timeout", body)
		h.holdLine("response_headers " + h.heldID())
		require.Eventually(t, func() bool { return len(h.access.all()) == 1 }, 5*time.Second, 5*time.Millisecond)
		assert.Equal(t, "stream_idle_timeout", h.access.all()[0].Details)
	})
	t.Run("incomplete", func(t *testing.T) {
		h := newHarness(t, holdGuestPkg, idle)
		pr, pw := io.Pipe()
		defer pw.Close()
		go func() { _, _ = pw.Write([]byte("part")) }() // then nothing
		req, err := http.NewRequest("POST", h.url+"/held", pr)
		require.NoError(t, err)
		req.Header.Set("X-Hold", "headers")
		req.Header.Set("X-Release", "never")
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	})
}

// A held stream can be released from another stream's request callback,
// not only from the tick: set_effective_context looks the id up in the
// VM's whole context table from any callback (cpp-host src/exports.cc
// set_effective_context), and continueStream queues continueDecoding on
// the VM's after-call actions (envoy context.cc Context::continueStream,
// wasm()->addAfterVmCallAction), which run when the calling callback
// returns (cpp-host src/context.cc DeferAfterCallActions). The caller acts
// on its own stream again after setting the effective context back.
func TestHeldStreamResumedFromAnotherStreamsCallback(t *testing.T) {
	h := newHarness(t, holdGuestPkg, withWorkers(1)) // one VM: one context table
	held := make(chan string, 1)
	go func() {
		resp, body, err := h.holdRequest(context.Background(), "POST", "/held", "A",
			map[string]string{"X-Hold": "headers", "X-Release": "continue", "X-Hold-Dest": h.up.addr(), "X-Release-After": "1000000"})
		if err != nil {
			held <- err.Error()
			return
		}
		held <- resp.Status + " " + body
	}()
	a := h.heldID()
	resp, body, err := h.holdRequest(context.Background(), "POST", "/releaser", "B",
		map[string]string{"X-Release-Held": "now", DefaultOriginalDstHeader: h.up.addr()})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "200 OK upstream saw /held body=A", <-held)
	assert.Equal(t, []string{"continue", a, "0"}, h.holdLine("continue "+a))
	own := h.holdLine("own_effective ")
	assert.Equal(t, "0", own[2], "the caller's own context is in the table")
	assert.Equal(t, []string{"own_replace", own[1], "0"}, h.holdLine("own_replace "+own[1]))
	for _, r := range h.up.requests() {
		switch r.Path {
		case "/held":
			assert.Equal(t, h.up.addr(), r.Header.Get(DefaultOriginalDstHeader), "set on the held stream through the effective context")
			assert.Empty(t, r.Header.Get("X-Released-Others"))
		case "/releaser":
			assert.Equal(t, "1", r.Header.Get("X-Released-Others"), "the caller's header went on its own stream")
		}
	}
	assert.Len(t, h.up.requests(), 2)
}

// A local reply sent to another stream from a request callback also stops
// the calling stream: send_local_response sets the VM's stop-iteration
// flag (cpp-host src/exports.cc send_local_response: stopNextIteration,
// one flag per WasmBase), which the calling callback's own status meets
// when it returns (cpp-host src/context.cc
// convertVmCallResultToFilterHeadersStatus: StopAllIterationAndWatermark)
// before the after-call actions reset it. So a release from a request
// callback must only continue streams, never answer them.
func TestLocalReplyToAnotherStreamStopsTheCaller(t *testing.T) {
	h := newHarness(t, holdGuestPkg, withWorkers(1))
	held := make(chan int, 1)
	go func() {
		resp, _, err := h.holdRequest(context.Background(), "GET", "/held", "",
			map[string]string{"X-Hold": "headers", "X-Release": "reply", "X-Release-After": "1000000"})
		if err != nil {
			held <- -1
			return
		}
		held <- resp.StatusCode
	}()
	h.heldID()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := h.holdRequest(ctx, "POST", "/releaser", "B",
		map[string]string{"X-Release-Held": "now", DefaultOriginalDstHeader: h.up.addr()})
	require.Error(t, err, "the caller answered Continue, but its status became a stop")
	assert.Equal(t, http.StatusTooManyRequests, <-held, "the held stream got the reply")
	assert.Empty(t, h.up.requests(), "the caller never went upstream")
}
