package envoyhost

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// proxy_http_call (envoy source/extensions/common/wasm/context.cc
// Context::httpCall, onHttpCallSuccess, onHttpCallFailure).

// httpCallout is an HTTP call in flight.
type httpCallout struct {
	token uint32
	root  *wasmContext
}

// httpCallResult is what on_http_call_response gets to read.
type httpCallResult struct {
	headers  *HeaderMap
	body     []byte
	trailers *HeaderMap
	failed   bool // reset: (token, 0, 0, 0) and status BrokenConnection
}

// httpCall validates and starts a callout from a root context. vm.mu is
// held.
func (vm *VM) httpCall(root *wasmContext, clusterName string, headers []Pair, body []byte,
	trailers []Pair, timeoutMs int32) (uint32, WasmResult) {
	if timeoutMs < 0 {
		return 0, ResultBadArgument
	}
	c, ok := vm.host.clusters[clusterName]
	if !ok {
		return 0, ResultBadArgument
	}
	m := NewHeaderMap(headers...)
	for _, k := range []string{":path", ":method", ":authority"} {
		if _, ok := m.Get(k); !ok {
			return 0, ResultBadArgument
		}
	}
	if len(body) > 0 {
		m.Set("content-length", strconv.Itoa(len(body)))
	}
	vm.nextHTTPCall += 4 // CalloutType::HttpCall ids: 4, 8, 12, ...
	token := vm.nextHTTPCall
	vm.httpCalls[token] = &httpCallout{token: token, root: root}
	timeout := time.Duration(timeoutMs) * time.Millisecond
	h := vm.host
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		res := c.roundTripBuffered(h.ctx, m, body, timeout)
		vm.deliverHTTPCall(token, res)
	}()
	return token, ResultOK
}

// deliverHTTPCall calls on_http_call_response on the root context that
// made the call; the response is readable only during that call.
func (vm *VM) deliverHTTPCall(token uint32, res *httpCallResult) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	call, ok := vm.httpCalls[token]
	if !ok {
		return
	}
	delete(vm.httpCalls, token)
	if vm.isFailedLocked() || !vm.has("proxy_on_http_call_response") {
		return
	}
	root := call.root
	if res.failed {
		root.statusCode = uint32(ResultBrokenConnection)
		root.statusMessage = "reset"
		vm.callback(root, "proxy_on_http_call_response", uint64(root.id), uint64(token), 0, 0, 0)
		root.statusMessage = ""
		return
	}
	root.callResponse = res
	ntrailers := 0
	if res.trailers != nil {
		ntrailers = res.trailers.Len()
	}
	vm.callback(root, "proxy_on_http_call_response", uint64(root.id), uint64(token),
		uint64(res.headers.Len()), uint64(len(res.body)), uint64(ntrailers))
	root.callResponse = nil
}

// roundTripBuffered sends a callout through the cluster and buffers the
// response. Failures before response headers become local replies (503,
// 504 on timeout) delivered as responses, as Envoy's async client does;
// a reset after headers is a failure.
func (c *cluster) roundTripBuffered(ctx context.Context, m *HeaderMap, body []byte, timeout time.Duration) *httpCallResult {
	local := func(code int, text string) *httpCallResult {
		hm := NewHeaderMap(Pair{":status", strconv.Itoa(code)},
			Pair{"content-length", strconv.Itoa(len(text))}, Pair{"content-type", "text/plain"})
		return &httpCallResult{headers: hm, body: []byte(text)}
	}
	addr := c.pick(m)
	if addr == "" {
		c.host.stats.add(c.noneHealthy, 1)
		return local(http.StatusServiceUnavailable, "no healthy upstream")
	}
	path, _ := m.Get(":path")
	method, _ := m.Get(":method")
	authority, _ := m.Get(":authority")
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return local(http.StatusBadRequest, "Bad Request")
	}
	u.Scheme, u.Host = "http", addr
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(body))
	if err != nil {
		return local(http.StatusBadRequest, "Bad Request")
	}
	req.Host = authority
	req.ContentLength = int64(len(body))
	for _, p := range m.Pairs() {
		if strings.HasPrefix(p.Key, ":") || hopByHop[p.Key] || p.Key == "content-length" {
			continue
		}
		k := http.CanonicalHeaderKey(p.Key)
		req.Header[k] = append(req.Header[k], p.Value)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""}
	}
	c.host.stats.add(c.rqTotal, 1)
	resp, err := c.transport.RoundTrip(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return local(http.StatusGatewayTimeout, "upstream request timeout")
		}
		reason := "connection termination"
		var opErr *net.OpError
		if errors.As(err, &opErr) && opErr.Op == "dial" {
			reason = "connection failure"
		}
		return local(http.StatusServiceUnavailable,
			"upstream connect error or disconnect/reset before headers. reset reason: "+reason)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return local(http.StatusGatewayTimeout, "upstream request timeout")
		}
		return &httpCallResult{failed: true}
	}
	hm := responseHeaderMap(resp)
	if _, ok := hm.Get("content-length"); !ok && resp.ContentLength >= 0 {
		hm.Add("content-length", strconv.FormatInt(resp.ContentLength, 10))
	}
	var trailers *HeaderMap
	if len(resp.Trailer) > 0 {
		trailers = NewHeaderMap()
		for k, vs := range resp.Trailer {
			for _, v := range vs {
				trailers.Add(k, v)
			}
		}
	}
	return &httpCallResult{headers: hm, body: data, trailers: trailers}
}
