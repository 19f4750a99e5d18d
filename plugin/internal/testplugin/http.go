package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// httpContext is one HTTP stream. It records what the request callbacks saw
// and reports it in on_response_headers.
type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
	id     uint32

	panicIn      string
	bodyMode     string
	respBodyMode string
	respCall     string
	trailerAdd   string
	respProperty string

	bodyCalls       []string
	bodyLen         int // -1 until the body is read at end of stream
	headerAfterBody string
	got, gotErr     string
	reqTrailers     string
	// In on_request_trailers: the request body length read there, or the
	// error name, and the status of a request header replace.
	trailersBody, trailersHeader string
}

func (h *httpContext) maybePanic(callback string) {
	if h.panicIn == callback {
		panic("testplugin: x-tp-panic-in: " + callback)
	}
}

// mutates reports whether a body mode changes the body's size.
func mutates(mode string) bool {
	for _, p := range []string{"replace:", "append:", "prepend:"} {
		if strings.HasPrefix(mode, p) {
			return true
		}
	}
	return false
}

func requestHeader(key string) string {
	v, _ := proxywasm.GetHttpRequestHeader(key)
	return v
}

func (h *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	h.plugin.vm.requests++
	h.plugin.metrics.requests.Increment(1)
	h.panicIn = requestHeader("x-tp-panic-in")
	h.maybePanic("request_headers")

	h.applyHeaderEdits()
	h.bodyMode = requestHeader("x-tp-body")
	if mutates(h.bodyMode) {
		h.logErr("remove content-length", proxywasm.RemoveHttpRequestHeader("content-length"))
	}
	h.respBodyMode = requestHeader("x-tp-resp-body")
	h.respCall = requestHeader("x-tp-resp-call")
	h.trailerAdd = requestHeader("x-tp-trailer-add")
	h.respProperty = requestHeader("x-tp-resp-property")

	if status := requestHeader("x-tp-local-reply"); status != "" {
		return h.localReplyFromHeaders(status)
	}
	path := requestHeader(":path")
	if route, query, _ := strings.Cut(path, "?"); strings.HasPrefix(route, "/tp/") {
		return h.endpoint(route, query)
	}
	if requestHeader("x-tp-headers-action") == "pause" && !endOfStream {
		return types.ActionPause
	}
	return types.ActionContinue
}

// applyHeaderEdits runs the x-tp-add/replace/remove/set-pairs/get controls.
func (h *httpContext) applyHeaderEdits() {
	if v := requestHeader("x-tp-add"); v != "" {
		k, val := splitKV(v)
		h.logErr("add header", proxywasm.AddHttpRequestHeader(k, val))
	}
	if v := requestHeader("x-tp-replace"); v != "" {
		k, val := splitKV(v)
		h.logErr("replace header", proxywasm.ReplaceHttpRequestHeader(k, val))
	}
	if v := requestHeader("x-tp-remove"); v != "" {
		h.logErr("remove header", proxywasm.RemoveHttpRequestHeader(strings.TrimSpace(v)))
	}
	if v := requestHeader("x-tp-set-pairs"); v != "" {
		pairs, err := proxywasm.GetHttpRequestHeaders()
		if err == nil {
			k, val := splitKV(v)
			err = proxywasm.ReplaceHttpRequestHeaders(append(pairs, [2]string{k, val}))
		}
		h.logErr("set header pairs", err)
	}
	if k := requestHeader("x-tp-get"); k != "" {
		v, err := proxywasm.GetHttpRequestHeader(strings.TrimSpace(k))
		if err != nil {
			h.gotErr = errName(err)
		} else {
			h.got = v
		}
	}
}

func (h *httpContext) localReplyFromHeaders(status string) types.Action {
	code, err := strconv.ParseUint(status, 10, 32)
	if err != nil {
		return h.reply(400, "x-tp-error", "bad x-tp-local-reply", nil)
	}
	var headers [][2]string
	if kv := requestHeader("x-tp-local-reply-header"); kv != "" {
		k, v := splitKV(kv)
		headers = append(headers, [2]string{k, v})
	}
	grpc := int64(-1)
	if g := requestHeader("x-tp-local-reply-grpc"); g != "" {
		if grpc, err = strconv.ParseInt(g, 10, 32); err != nil {
			return h.reply(400, "x-tp-error", "bad x-tp-local-reply-grpc", nil)
		}
	}
	body := requestHeader("x-tp-local-reply-body")
	if details := requestHeader("x-tp-local-reply-details"); details != "" {
		h.logErr("local reply", proxywasm.SendHttpResponseWithDetails(uint32(code), details, headers, []byte(body), int32(grpc)))
		return types.ActionPause
	}
	h.logErr("local reply", proxywasm.SendHttpResponse(uint32(code), headers, []byte(body), int32(grpc)))
	return types.ActionPause
}

// reply sends a local reply with at most one extra header (name "" for none).
func (h *httpContext) reply(status uint32, name, value string, body []byte) types.Action {
	var headers [][2]string
	if name != "" {
		headers = [][2]string{{name, value}}
	}
	return h.replyHeaders(status, headers, body)
}

func (h *httpContext) replyHeaders(status uint32, headers [][2]string, body []byte) types.Action {
	h.logErr("local reply", proxywasm.SendHttpResponse(status, headers, body, -1))
	return types.ActionPause
}

func (h *httpContext) replyJSON(v any) types.Action {
	body, err := json.Marshal(v)
	if err != nil {
		return h.reply(500, "x-tp-error", err.Error(), nil)
	}
	return h.reply(200, "content-type", "application/json", body)
}

// replyErr answers 404 for NotFound, 409 for a CAS mismatch and 500 otherwise.
func (h *httpContext) replyErr(err error) types.Action {
	status := uint32(500)
	switch {
	case errors.Is(err, types.ErrorStatusNotFound):
		status = 404
	case errors.Is(err, types.ErrorStatusCasMismatch):
		status = 409
	}
	return h.reply(status, "x-tp-error", errName(err), nil)
}

func (h *httpContext) logErr(what string, err error) {
	if err != nil {
		proxywasm.LogWarnf("testplugin: context %d: %s: %v", h.id, what, err)
	}
}

// endpoint answers the /tp/ local-reply endpoints.
func (h *httpContext) endpoint(route, rawQuery string) types.Action {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return h.reply(400, "x-tp-error", "bad query", nil)
	}
	switch route {
	case "/tp/echo":
		headers, err := proxywasm.GetHttpRequestHeaders()
		if err != nil {
			return h.replyErr(err)
		}
		return h.replyJSON(map[string]any{"headers": headers})
	case "/tp/start-info":
		return h.startInfo()
	case "/tp/config":
		cfg, err := proxywasm.GetPluginConfiguration()
		if err != nil {
			return h.reply(500, "x-tp-error", errName(err), nil)
		}
		return h.reply(200, "", "", cfg)
	case "/tp/shared/get":
		value, cas, err := proxywasm.GetSharedData(q.Get("key"))
		if err != nil {
			return h.replyErr(err)
		}
		return h.reply(200, "x-tp-cas", strconv.FormatUint(uint64(cas), 10), value)
	case "/tp/shared/set":
		return h.sharedSet(q)
	case "/tp/shared/incr":
		n, err := incrementShared(q.Get("key"))
		if errors.Is(err, errCasRetries) {
			return h.reply(503, "x-tp-error", errName(err), nil)
		}
		if err != nil {
			return h.replyErr(err)
		}
		return h.reply(200, "", "", []byte(strconv.FormatUint(n, 10)))
	case "/tp/property":
		value, err := proxywasm.GetProperty(strings.Split(q.Get("path"), "."))
		if err != nil {
			return h.replyErr(err)
		}
		return h.reply(200, "x-tp-property-len", strconv.Itoa(len(value)), value)
	case "/tp/property-map":
		pairs, err := proxywasm.GetPropertyMap(strings.Split(q.Get("path"), "."))
		if err != nil {
			return h.replyErr(err)
		}
		return h.replyJSON(pairs)
	case "/tp/set-property":
		if err := proxywasm.SetProperty(strings.Split(q.Get("path"), "."), []byte(q.Get("value"))); err != nil {
			return h.replyErr(err)
		}
		return h.reply(200, "", "", nil)
	case "/tp/metrics":
		m := h.plugin.metrics
		return h.replyJSON(map[string]any{
			"requests_total": m.requests.Value(),
			"active_streams": m.active.Value(),
			"ticks_total":    m.ticks.Value(),
		})
	case "/tp/log":
		return h.logAllLevels()
	case "/tp/stdout":
		fmt.Fprintln(os.Stdout, "testplugin stdout")
		fmt.Fprintln(os.Stderr, "testplugin stderr")
		return h.reply(200, "", "", nil)
	case "/tp/env":
		return h.reply(200, "", "", []byte(os.Getenv(q.Get("name"))))
	case "/tp/time":
		return h.reply(200, "", "", []byte(strconv.FormatInt(time.Now().UnixNano(), 10)))
	case "/tp/random":
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return h.reply(500, "x-tp-error", err.Error(), nil)
		}
		return h.reply(200, "", "", []byte(hex.EncodeToString(b[:])))
	case "/tp/gc":
		if err := gcStress(); err != nil {
			return h.reply(500, "x-tp-error", err.Error(), nil)
		}
		return h.reply(200, "", "", []byte("ok"))
	case "/tp/panic":
		panic("testplugin: /tp/panic")
	case "/tp/http-call":
		return h.httpCall(q)
	}
	return h.reply(404, "x-tp-error", "unknown endpoint "+route, nil)
}

func (h *httpContext) startInfo() types.Action {
	level, err := proxywasm.GetLogLevel()
	levelName := level.String()
	if err != nil {
		levelName = errName(err)
	}
	v := h.plugin.vm
	return h.replyJSON(map[string]any{
		"vm_configuration":             v.vmConfiguration,
		"vm_start_plugin_config_error": v.vmStartPluginConfigErr,
		"plugin_configuration":         h.plugin.rawConfig,
		"root_context_id":              h.plugin.id,
		"log_level":                    levelName,
		"vm_nonce":                     v.nonce,
	})
}

func (h *httpContext) sharedSet(q url.Values) types.Action {
	cas, err := strconv.ParseUint(q.Get("cas"), 10, 32)
	if q.Get("cas") == "" {
		cas, err = 0, nil
	}
	if err != nil {
		return h.reply(400, "x-tp-error", "bad cas", nil)
	}
	key := q.Get("key")
	if err := proxywasm.SetSharedData(key, []byte(q.Get("value")), uint32(cas)); err != nil {
		return h.replyErr(err)
	}
	_, newCas, err := proxywasm.GetSharedData(key)
	if err != nil {
		return h.replyErr(err)
	}
	return h.reply(200, "x-tp-cas", strconv.FormatUint(uint64(newCas), 10), nil)
}

func (h *httpContext) logAllLevels() types.Action {
	proxywasm.LogTrace("testplugin level trace")
	proxywasm.LogDebugf("testplugin level %s", "debug")
	proxywasm.LogInfo("testplugin level info")
	proxywasm.LogWarnf("testplugin level %s", "warn")
	proxywasm.LogError("testplugin level error")
	proxywasm.LogCriticalf("testplugin level %s", "critical")
	level, err := proxywasm.GetLogLevel()
	if err != nil {
		return h.reply(500, "x-tp-error", errName(err), nil)
	}
	return h.reply(200, "x-tp-log-level", level.String(), nil)
}

// gcStress reads host data while the collector runs between and during host
// calls (the allocator may trigger it), and checks every read agrees.
func gcStress() error {
	want, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		return err
	}
	pattern := make([]byte, 4096)
	for i := range pattern {
		pattern[i] = byte(i * 7)
	}
	if err := proxywasm.SetSharedData("testplugin/gc", pattern, 0); err != nil {
		return err
	}
	var garbage [][]byte
	for i := range 16 {
		for range 8 {
			garbage = append(garbage, make([]byte, 64<<10))
		}
		if i%2 == 0 {
			garbage = nil
			runtime.GC()
		}
		got, err := proxywasm.GetHttpRequestHeaders()
		if err != nil {
			return err
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("round %d: headers changed", i)
		}
		path, err := proxywasm.GetHttpRequestHeader(":path")
		if err != nil || path != headerValue(want, ":path") {
			return fmt.Errorf("round %d: :path %q, %v", i, path, err)
		}
		value, _, err := proxywasm.GetSharedData("testplugin/gc")
		if err != nil || !bytes.Equal(value, pattern) {
			return fmt.Errorf("round %d: shared data differs (%v)", i, err)
		}
	}
	runtime.KeepAlive(garbage)
	return nil
}

// httpCall implements /tp/http-call.
func (h *httpContext) httpCall(q url.Values) types.Action {
	cluster := q.Get("cluster")
	get := func(k, def string) string {
		if v := q.Get(k); v != "" {
			return v
		}
		return def
	}
	var headers [][2]string
	for _, kv := range [][2]string{
		{":method", get("method", "GET")}, {":path", get("path", "/")}, {":authority", get("authority", cluster)},
	} {
		if kv[0] != q.Get("omit") {
			headers = append(headers, kv)
		}
	}
	timeout, err := strconv.ParseUint(get("timeout_ms", "5000"), 10, 32)
	if err != nil {
		return h.reply(400, "x-tp-error", "bad timeout_ms", nil)
	}
	resume := q.Get("resume") == "1"
	_, err = proxywasm.DispatchHttpCall(cluster, headers, nil, nil, uint32(timeout), func(numHeaders, bodySize, _ int) {
		status, body := "failed", []byte(nil)
		if numHeaders > 0 {
			status = headerValue(orZero(proxywasm.GetHttpCallResponseHeaders()), ":status")
			body, _ = proxywasm.GetHttpCallResponseBody(0, bodySize)
		}
		if resume {
			h.logErr("call status header", proxywasm.AddHttpRequestHeader("x-tp-call-status", status))
			h.logErr("resume request", proxywasm.ResumeHttpRequest())
			return
		}
		if numHeaders == 0 {
			h.reply(502, "x-tp-call", "failed", nil)
			return
		}
		h.replyHeaders(200, [][2]string{
			{"x-tp-call-status", status}, {"x-tp-call-headers", strconv.Itoa(numHeaders)},
		}, body)
	})
	if err != nil {
		return h.reply(500, "x-tp-error", errName(err), nil)
	}
	return types.ActionPause
}

func (h *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	h.bodyCalls = append(h.bodyCalls, strconv.Itoa(bodySize)+":"+strconv.FormatBool(endOfStream))
	h.maybePanic("request_body")
	if h.bodyMode == "" || h.bodyMode == "none" {
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
	if err != nil {
		h.logErr("read request body", err)
	} else {
		h.bodyLen = len(body)
		h.plugin.metrics.requestBytes.Record(uint64(len(body)))
		h.headerAfterBody = errName(proxywasm.ReplaceHttpRequestHeader("x-tp-body-seen", strconv.Itoa(len(body))))
	}
	mode, arg, _ := strings.Cut(h.bodyMode, ":")
	switch mode {
	case "replace":
		h.logErr("replace body", proxywasm.ReplaceHttpRequestBody([]byte(arg)))
	case "append":
		h.logErr("append body", proxywasm.AppendHttpRequestBody([]byte(arg)))
	case "prepend":
		h.logErr("prepend body", proxywasm.PrependHttpRequestBody([]byte(arg)))
	case "echo":
		return h.reply(200, "", "", body)
	}
	return types.ActionContinue
}

// OnHttpRequestTrailers counts the trailers and applies x-tp-trailer-add.
func (h *httpContext) OnHttpRequestTrailers(int) types.Action {
	trailers, err := proxywasm.GetHttpRequestTrailers()
	if err != nil {
		h.reqTrailers = errName(err)
	} else {
		h.reqTrailers = strconv.Itoa(len(trailers))
	}
	if h.trailerAdd != "" {
		k, v := splitKV(h.trailerAdd)
		h.logErr("add trailer", proxywasm.AddHttpRequestTrailer(k, v))
	}
	// What a body-based filter would need here: the buffered body and
	// writable request headers.
	if body, err := proxywasm.GetHttpRequestBody(0, maxTrailersBodyRead); err != nil {
		h.trailersBody = errName(err)
	} else {
		h.trailersBody = strconv.Itoa(len(body))
	}
	h.trailersHeader = errName(proxywasm.ReplaceHttpRequestHeader("x-tp-trailers-seen", h.reqTrailers))
	return types.ActionContinue
}

// maxTrailersBodyRead bounds the body read in on_request_trailers (the host
// clips the read to the buffer).
const maxTrailersBodyRead = 1 << 24

func (h *httpContext) OnHttpResponseHeaders(numHeaders int, _ bool) types.Action {
	h.maybePanic("response_headers")
	v := h.plugin.vm
	add := func(k, val string) { h.logErr("add response header "+k, proxywasm.AddHttpResponseHeader(k, val)) }
	h.logErr("replace x-tp-vm-nonce", proxywasm.ReplaceHttpResponseHeader("x-tp-vm-nonce", v.nonce))
	add("x-tp-root-id", strconv.FormatUint(uint64(h.plugin.id), 10))
	add("x-tp-context-id", strconv.FormatUint(uint64(h.id), 10))
	add("x-tp-vm-requests", strconv.FormatUint(v.requests, 10))
	add("x-tp-req-body-calls", strings.Join(h.bodyCalls, ","))
	add("x-tp-resp-headers-count", strconv.Itoa(numHeaders))
	if h.bodyLen >= 0 {
		add("x-tp-req-body-len", strconv.Itoa(h.bodyLen))
	}
	if h.headerAfterBody != "" {
		add("x-tp-req-header-after-body", h.headerAfterBody)
	}
	if h.reqTrailers != "" {
		add("x-tp-req-trailers", h.reqTrailers)
		add("x-tp-trailers-body-len", h.trailersBody)
		add("x-tp-trailers-header", h.trailersHeader)
	}
	if h.gotErr != "" {
		add("x-tp-got-error", h.gotErr)
	} else if h.got != "" {
		add("x-tp-got", h.got)
	}
	if mutates(h.respBodyMode) {
		h.logErr("remove response content-length", proxywasm.RemoveHttpResponseHeader("content-length"))
	}
	for _, path := range strings.Split(h.respProperty, ",") {
		if path = strings.TrimSpace(path); path != "" {
			add("x-tp-resp-property-"+path, propertyText(path))
		}
	}
	if h.respCall != "" {
		return h.responseCall()
	}
	return types.ActionContinue
}

// responseCall implements x-tp-resp-call: pause the response until an HTTP
// call returns, then resume it.
func (h *httpContext) responseCall() types.Action {
	headers := [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", h.respCall}}
	_, err := proxywasm.DispatchHttpCall(h.respCall, headers, nil, nil, 5000, func(numHeaders, _, _ int) {
		status := "failed"
		if numHeaders > 0 {
			status = headerValue(orZero(proxywasm.GetHttpCallResponseHeaders()), ":status")
		}
		h.logErr("resp call header", proxywasm.ReplaceHttpResponseHeader("x-tp-resp-call-status", status))
		h.logErr("resume response", proxywasm.ResumeHttpResponse())
	})
	if err != nil {
		h.logErr("resp call header", proxywasm.AddHttpResponseHeader("x-tp-resp-call-error", errName(err)))
		return types.ActionContinue
	}
	return types.ActionPause
}

func (h *httpContext) OnHttpResponseBody(bodySize int, endOfStream bool) types.Action {
	h.maybePanic("response_body")
	if h.respBodyMode == "" || h.respBodyMode == "none" {
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	if _, err := proxywasm.GetHttpResponseBody(0, bodySize); err != nil {
		h.logErr("read response body", err)
	}
	mode, arg, _ := strings.Cut(h.respBodyMode, ":")
	switch mode {
	case "replace":
		h.logErr("replace response body", proxywasm.ReplaceHttpResponseBody([]byte(arg)))
	case "append":
		h.logErr("append response body", proxywasm.AppendHttpResponseBody([]byte(arg)))
	case "prepend":
		h.logErr("prepend response body", proxywasm.PrependHttpResponseBody([]byte(arg)))
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpStreamDone() {
	h.maybePanic("log")
	path := requestHeader(":path")
	status, _ := proxywasm.GetHttpResponseHeader(":status")
	proxywasm.LogInfof("testplugin log: path=%s status=%s", path, status)
	h.plugin.metrics.active.Add(-1)
}

// propertyText reads a property for a response header: the value if it is
// printable text, "int:N" for an 8-byte number, else "hex:..."; or the
// error name.
func propertyText(path string) string {
	value, err := proxywasm.GetProperty(strings.Split(path, "."))
	if err != nil {
		return errName(err)
	}
	for _, c := range value {
		if c < 0x20 || c > 0x7e {
			if len(value) == 8 {
				var n int64
				for i := 7; i >= 0; i-- {
					n = n<<8 | int64(value[i])
				}
				return "int:" + strconv.FormatInt(n, 10)
			}
			return "hex:" + hex.EncodeToString(value)
		}
	}
	return string(value)
}
