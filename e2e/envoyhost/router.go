package envoyhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cluster is an upstream cluster: STATIC (round robin over endpoints) or
// ORIGINAL_DST reading a request header (envoy source/extensions/clusters/
// original_dst/original_dst_cluster.cc).
type cluster struct {
	host        *Host
	cfg         ClusterConfig
	rr          atomic.Uint64
	transport   *http.Transport
	invalid     *stat
	noneHealthy *stat
	rqTotal     *stat
}

func newCluster(h *Host, cfg ClusterConfig) *cluster {
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	c := &cluster{
		host: h,
		cfg:  cfg,
		transport: &http.Transport{
			DialContext:         dialer.DialContext,
			DisableCompression:  true, // Envoy does not ask for gzip on its own
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     time.Hour,
		},
	}
	tag := [2]string{"envoy_cluster_name", cfg.Name}
	c.invalid = h.stats.builtin(statCounter, "cluster."+cfg.Name+".original_dst_host_invalid",
		"envoy_cluster_original_dst_host_invalid", tag)
	c.noneHealthy = h.stats.builtin(statCounter, "cluster."+cfg.Name+".upstream_cx_none_healthy",
		"envoy_cluster_upstream_cx_none_healthy", tag)
	c.rqTotal = h.stats.builtin(statCounter, "cluster."+cfg.Name+".upstream_rq_total",
		"envoy_cluster_upstream_rq_total", tag)
	return c
}

// pick chooses the upstream address for a request, or "" when there is
// none. For ORIGINAL_DST only the first value of the header counts (it is
// untrusted); it must be ip:port or [ipv6]:port, anything else is counted
// as original_dst_host_invalid and yields no host.
func (c *cluster) pick(headers *HeaderMap) string {
	if c.cfg.Type == ClusterStatic {
		eps := c.cfg.Endpoints
		return eps[int(c.rr.Add(1)-1)%len(eps)]
	}
	if headers == nil {
		return ""
	}
	v, ok := headers.Get(c.cfg.OriginalDstHeader)
	if !ok {
		return ""
	}
	ap, err := parseInternetAddressAndPort(v)
	if err != nil {
		c.host.stats.add(c.invalid, 1)
		return ""
	}
	return ap.String()
}

// parseInternetAddressAndPort accepts what Envoy's
// Network::Utility::parseInternetAddressAndPortNoThrow(v, false) accepts:
// a numeric IPv4 address or a bracketed IPv6 address, then a port.
func parseInternetAddressAndPort(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, errors.New("zoned address")
	}
	if ap.Addr().Is6() && !strings.HasPrefix(s, "[") {
		return netip.AddrPort{}, errors.New("ipv6 without brackets")
	}
	return ap, nil
}

// upstreamCall is the router's request to the chosen host.
type upstreamCall struct {
	gen       int
	cancel    context.CancelFunc
	body      *chunkPipe
	permit    chan struct{}
	gotHeader bool
}

// chunkPipe is the request body on its way upstream: the stream writes
// chunks without blocking, the transport reads them.
//
// With a declared Content-Length (limit >= 0) it behaves like the upstream
// reading an HTTP/1 body of that length: bytes past the limit are not part
// of this request (they are dropped here; Envoy would have written them on
// the connection, where they break the next request), and a body that ends
// short leaves the upstream waiting for the rest (until the route timeout).
// Envoy never fixes Content-Length when a filter changes the body.
type chunkPipe struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte
	closed bool
	err    error
	limit  int64 // remaining declared bytes, -1 = none declared
}

func newChunkPipe(limit int64) *chunkPipe {
	p := &chunkPipe{limit: limit}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *chunkPipe) write(b []byte, eos bool) {
	p.mu.Lock()
	if len(b) > 0 && !p.closed {
		p.chunks = append(p.chunks, append([]byte(nil), b...))
	}
	if eos {
		p.closed = true
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *chunkPipe) abort(err error) {
	p.mu.Lock()
	p.closed = true
	p.err = err
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *chunkPipe) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.err != nil {
			return 0, p.err
		}
		if p.limit == 0 {
			return 0, io.EOF
		}
		if len(p.chunks) > 0 {
			break
		}
		if p.closed && p.limit < 0 {
			return 0, io.EOF
		}
		// Short of the declared length the upstream keeps waiting.
		p.cond.Wait()
	}
	if p.limit >= 0 && int64(len(b)) > p.limit {
		b = b[:p.limit]
	}
	n := copy(b, p.chunks[0])
	if n == len(p.chunks[0]) {
		p.chunks = p.chunks[1:]
	} else {
		p.chunks[0] = p.chunks[0][n:]
	}
	if p.limit >= 0 {
		p.limit -= int64(n)
	}
	return n, nil
}

func (p *chunkPipe) Close() error { return nil }

// routerHeaders is the router's decodeHeaders: pick the route for the
// (filtered) headers, answer a direct response, or choose a host (503 "no
// healthy upstream" when there is none) and start the upstream request.
func (s *stream) routerHeaders(eos bool) {
	if s.localReplySent || s.finished {
		return
	}
	// The headers are read under the VM's lock: a host call on another
	// goroutine (a tick acting on this stream through the effective
	// context) may still reach them.
	unlock := s.lockVM()
	c, req, reply := s.pickUpstream(eos)
	unlock()
	if reply != nil {
		s.sendLocalReply(reply)
		return
	}
	s.upGen++
	ctx, cancel := context.WithCancel(s.host.ctx)
	up := &upstreamCall{gen: s.upGen, cancel: cancel, permit: make(chan struct{}, 1)}
	if !eos || req.ContentLength > 0 {
		up.body = newChunkPipe(req.ContentLength)
		req.Body = up.body
		req.GetBody = nil
		if eos {
			up.body.write(nil, true)
		}
	}
	s.up = up
	s.upstreamRTT = time.Now()
	req = req.WithContext(ctx)
	go s.runUpstream(c, req, up)
	if eos {
		s.startRouteTimer()
	}
}

// pickUpstream chooses the route and the host and builds the upstream
// request, or returns the local reply the router answers with.
func (s *stream) pickUpstream(eos bool) (*cluster, *http.Request, *localReply) {
	route := s.lis.route(s.reqMap)
	if route == nil {
		return nil, nil, &localReply{code: http.StatusNotFound, details: "route_not_found"}
	}
	s.route = route
	s.routeName = route.Name
	if dr := route.DirectResponse; dr != nil {
		// Router::Filter::decodeHeaders: the router answers with a local
		// reply, details "direct_response" (StreamInfo::ResponseCodeDetails
		// DirectResponse), which goes through the encoder filters; no
		// upstream host is ever set.
		return nil, nil, &localReply{code: dr.Status, body: []byte(dr.Body),
			headers: route.ResponseHeadersToAdd, details: "direct_response"}
	}
	c := s.host.clusters[route.Cluster]
	s.clusterName = c.cfg.Name
	addr := c.pick(s.reqMap)
	if addr == "" {
		s.host.stats.add(c.noneHealthy, 1)
		return nil, nil, &localReply{code: http.StatusServiceUnavailable,
			body: []byte("no healthy upstream"), details: "no_healthy_upstream"}
	}
	s.upstreamHost = addr
	s.host.stats.add(c.rqTotal, 1)
	req, err := s.upstreamRequest(addr, eos)
	if err != nil {
		return nil, nil, &localReply{code: http.StatusBadRequest, body: []byte("Bad Request"),
			details: "envoyhost_bad_upstream_request{" + replaceAllEmptySpace(err.Error()) + "}"}
	}
	return c, req, nil
}

// route finds the virtual host by :authority and the first route whose
// prefix or exact path matches :path without its query (envoy
// source/common/router/config_impl.cc).
func (l *listener) route(m *HeaderMap) *RouteConfig {
	authority, _ := m.Get(":authority")
	path, _ := m.Get(":path")
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	vh := l.virtualHost(authority)
	if vh == nil {
		return nil
	}
	for i := range vh.Routes {
		r := &vh.Routes[i]
		if (r.Prefix != "" && strings.HasPrefix(path, r.Prefix)) || (r.Path != "" && path == r.Path) {
			return r
		}
	}
	return nil
}

// virtualHost matches domains in Envoy's order: exact, then the longest
// suffix wildcard, then the longest prefix wildcard, then "*".
func (l *listener) virtualHost(authority string) *VirtualHostConfig {
	host := strings.ToLower(authority)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	var best *VirtualHostConfig
	bestRank, bestLen := 4, -1
	for i := range l.cfg.VirtualHosts {
		vh := &l.cfg.VirtualHosts[i]
		for _, d := range vh.Domains {
			d = strings.ToLower(d)
			rank, n := 4, 0
			switch {
			case d == host || d == strings.ToLower(authority):
				rank, n = 0, len(d)
			case d == "*":
				rank = 3
			case strings.HasPrefix(d, "*") && strings.HasSuffix(host, d[1:]) && len(host) > len(d)-1:
				rank, n = 1, len(d)
			case strings.HasSuffix(d, "*") && strings.HasPrefix(host, d[:len(d)-1]) && len(host) > len(d)-1:
				rank, n = 2, len(d)
			}
			if rank < bestRank || (rank == bestRank && n > bestLen) {
				best, bestRank, bestLen = vh, rank, n
			}
		}
	}
	return best
}

// upstreamRequest turns the (filtered) header map into a request for the
// upstream. Content-Length is sent as the map has it: Envoy does not fix
// it when a filter changes the body.
func (s *stream) upstreamRequest(addr string, eos bool) (*http.Request, error) {
	path, _ := s.reqMap.Get(":path")
	method, _ := s.reqMap.Get(":method")
	authority, _ := s.reqMap.Get(":authority")
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return nil, fmt.Errorf("bad :path %q", path)
	}
	u.Scheme = "http"
	u.Host = addr
	req := &http.Request{Method: method, URL: u, Host: authority, Header: http.Header{},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Body: http.NoBody}
	req.ContentLength = -1
	if eos {
		req.ContentLength = 0
	}
	for _, p := range s.reqMap.Pairs() {
		if strings.HasPrefix(p.Key, ":") || hopByHop[p.Key] {
			continue
		}
		if p.Key == "content-length" {
			n, err := strconv.ParseInt(p.Value, 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("bad content-length %q", p.Value)
			}
			req.ContentLength = n
			continue
		}
		k := http.CanonicalHeaderKey(p.Key)
		req.Header[k] = append(req.Header[k], p.Value)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // keep Go from adding its own
	}
	if t := s.route.Timeout; t > 0 {
		req.Header.Set("X-Envoy-Expected-Rq-Timeout-Ms", strconv.FormatInt(t.Milliseconds(), 10))
	}
	return req, nil
}

func (s *stream) runUpstream(c *cluster, req *http.Request, up *upstreamCall) {
	resp, err := c.transport.RoundTrip(req)
	if err != nil {
		s.send(streamEvent{kind: evUpError, err: err, gen: up.gen})
		return
	}
	s.send(streamEvent{kind: evUpHeaders, resp: resp, gen: up.gen})
	defer resp.Body.Close()
	if resp.Body == http.NoBody || resp.ContentLength == 0 || req.Method == http.MethodHead {
		return
	}
	var total int64
	buf := make([]byte, readChunkSize)
	for {
		select {
		case <-up.permit:
		case <-s.done:
			return
		case <-req.Context().Done():
			return
		}
		var n int
		for n == 0 && err == nil {
			n, err = resp.Body.Read(buf)
		}
		total += int64(n)
		eos := err == io.EOF || (resp.ContentLength >= 0 && total >= resp.ContentLength)
		if err != nil && err != io.EOF {
			s.send(streamEvent{kind: evUpError, err: err, gen: up.gen})
			return
		}
		s.send(streamEvent{kind: evUpData, data: append([]byte(nil), buf[:n]...), eos: eos, gen: up.gen})
		if eos {
			return
		}
	}
}

// routerData forwards request body upstream.
func (s *stream) routerData(data []byte, eos bool) {
	if s.up == nil || s.up.body == nil || s.localReplySent {
		return
	}
	s.up.body.write(data, eos)
	if eos {
		s.startRouteTimer()
	}
}

// routerTrailers is the router's decodeTrailers: the request is complete
// (the route timeout starts). The upstream is HTTP/1, whose codec ends the
// body and drops the trailers unless http_protocol_options.enable_trailers
// is set (envoy source/common/http/http1/codec_impl.cc encodeTrailersBase),
// which this host does not offer.
func (s *stream) routerTrailers() {
	if s.up == nil || s.localReplySent {
		return
	}
	if s.up.body != nil {
		s.up.body.write(nil, true)
	}
	s.startRouteTimer()
}

func (s *stream) grantUpstreamRead() {
	if s.up == nil || s.finished {
		return
	}
	if s.enc.iter.stoppedAll() && len(s.enc.buffered) > s.lis.cfg.BufferLimitBytes {
		return
	}
	select {
	case s.up.permit <- struct{}{}:
	default:
	}
}

// onUpstreamHeaders: the router adds x-envoy-upstream-service-time and
// hands the response to the encoder filters (envoy source/common/router/
// router.cc Filter::onUpstreamHeaders).
func (s *stream) onUpstreamHeaders(resp *http.Response) {
	s.up.gotHeader = true
	m := responseHeaderMap(resp)
	if resp.ContentLength >= 0 {
		if _, ok := m.Get("content-length"); !ok && resp.Request.Method != http.MethodHead {
			m.Add("content-length", strconv.FormatInt(resp.ContentLength, 10))
		}
	}
	m.Add("x-envoy-upstream-service-time", strconv.FormatInt(time.Since(s.upstreamRTT).Milliseconds(), 10))
	for _, p := range s.route.ResponseHeadersToAdd {
		m.Add(p.Key, p.Value)
	}
	eos := resp.Body == http.NoBody || resp.ContentLength == 0 || resp.Request.Method == http.MethodHead
	// Router::Filter::onUpstreamHeaders sets the details and the response
	// code before the encoder filters see the headers.
	s.setDetails("via_upstream")
	s.responseCode.Store(int64(resp.StatusCode))
	s.encodeHeaders(m, eos)
	s.grantUpstreamRead()
}

// onUpstreamError: before response headers the router answers 503 (reset
// reason in the body, as Envoy words it); afterwards the stream is reset.
func (s *stream) onUpstreamError(err error) {
	if s.up.gotHeader {
		s.resetStream()
		return
	}
	reason := "connection termination"
	detail := "connection_termination"
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		reason = "connection failure"
		detail = "connection_failure"
	}
	s.cancelUpstream()
	s.sendLocalReply(&localReply{code: http.StatusServiceUnavailable,
		body:    []byte("upstream connect error or disconnect/reset before headers. reset reason: " + reason + ", transport failure reason: " + err.Error()),
		details: "upstream_reset_before_response_started{" + detail + "}"})
}

func (s *stream) startRouteTimer() {
	if s.route == nil || s.up == nil || s.routeTimer != nil || s.route.Timeout <= 0 {
		return
	}
	t := s.route.Timeout
	gen := s.up.gen
	s.routeTimer = s.host.clock.AfterFunc(t, func() {
		s.send(streamEvent{kind: evRouteTimeout, gen: gen})
	})
}

// onRouteTimeout: 504 "upstream request timeout" before response headers,
// a reset after.
func (s *stream) onRouteTimeout() {
	if s.up.gotHeader {
		s.resetStream()
		return
	}
	s.cancelUpstream()
	s.sendLocalReply(&localReply{code: http.StatusGatewayTimeout,
		body: []byte("upstream request timeout"), details: "upstream_response_timeout"})
}

func (s *stream) cancelUpstream() {
	if s.up == nil {
		return
	}
	if s.up.body != nil {
		s.up.body.abort(context.Canceled)
	}
	s.up.cancel()
	s.up = nil
}

// responseHeaderMap turns an upstream response's headers into an Envoy
// header map: ":status" first, keys lower-cased and sorted (net/http does
// not keep their order), hop-by-hop headers dropped as Envoy's codec does.
func responseHeaderMap(resp *http.Response) *HeaderMap {
	m := NewHeaderMap(Pair{":status", strconv.Itoa(resp.StatusCode)})
	keys := make([]string, 0, len(resp.Header))
	for k := range resp.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopByHop[lk] {
			continue
		}
		for _, v := range resp.Header[k] {
			m.Add(lk, v)
		}
	}
	return m
}
