package envoyhost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// listener is one HTTP listener with its filter chain.
type listener struct {
	host   *Host
	cfg    ListenerConfig
	plugin *Plugin
	ln     net.Listener
	srv    *http.Server
	rr     atomic.Uint64
	connID atomic.Uint64
}

func newListener(h *Host, cfg ListenerConfig, p *Plugin) *listener {
	return &listener{host: h, cfg: cfg, plugin: p}
}

type connIDKey struct{}

func (l *listener) start() error {
	ln, err := net.Listen("tcp", l.cfg.Address)
	if err != nil {
		return fmt.Errorf("listener %q: %w", l.cfg.Name, err)
	}
	l.ln = ln
	l.srv = &http.Server{
		Handler:           l,
		ReadHeaderTimeout: time.Minute,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connIDKey{}, l.connID.Add(1))
		},
		Protocols: l.cfg.Codec.protocols(),
	}
	l.host.bg.Add(1)
	go func() {
		defer l.host.bg.Done()
		if err := l.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			l.host.log.Error("listener stopped", "listener", l.cfg.Name, "err", err)
		}
	}()
	l.host.log.Info("listening", "listener", l.cfg.Name, "address", ln.Addr().String())
	return nil
}

// protocols is what the listener's codec accepts on a cleartext connection
// (envoy conn_manager_impl.cc createCodec: AUTO looks for the HTTP/2
// preface, source/common/http/utility.cc; net/http's unencrypted HTTP/2 is
// prior knowledge only, like Envoy's).
func (c Codec) protocols() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(c != CodecHTTP2)
	p.SetUnencryptedHTTP2(c != CodecHTTP1)
	return &p
}

func (l *listener) stop(ctx context.Context) {
	if l.srv != nil {
		if err := l.srv.Shutdown(ctx); err != nil {
			// Streams still running (a plugin that never resumes): cut them.
			_ = l.srv.Close()
		}
	}
}

// ServeHTTP runs one stream on the next worker, round robin.
func (l *listener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := l.host
	s := &stream{
		host:        h,
		lis:         l,
		w:           w,
		r:           r,
		plugin:      l.plugin,
		mode:        filterSkipped,
		events:      make(chan streamEvent, 16),
		done:        make(chan struct{}),
		filterState: map[string][]byte{},
		startTime:   h.clock.Now(),
		remoteAddr:  r.RemoteAddr,
		routeName:   "",
	}
	if v, ok := r.Context().Value(connIDKey{}).(uint64); ok {
		s.connID = v
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		s.localAddr = a.String()
	}
	if l.plugin != nil {
		thread := 1 + int(l.rr.Add(1)-1)%h.cfg.Workers
		vm, root, mode := l.plugin.contextFor(thread)
		s.mode = mode
		switch mode {
		case filterActive:
			s.vm = vm
			vm.mu.Lock()
			s.wctx = &wasmContext{vm: vm, id: vm.allocContextID(), parentID: root.id, root: root,
				plugin: l.plugin, stream: s}
			vm.contexts[s.wctx.id] = s.wctx
			vm.mu.Unlock()
		case filterFailed:
			s.vm = nil
		}
	}
	s.run()
}

func (s *stream) run() {
	var once sync.Once
	closeDone := func() { once.Do(func() { close(s.done) }) }
	defer closeDone()
	rc := http.NewResponseController(s.w)
	_ = rc.EnableFullDuplex()
	s.reqMap = requestHeaderMap(s.r)
	s.lis.mutateRequestHeaders(s.reqMap, s.remoteAddr)
	// A request declaring trailers is not over at its headers even with
	// Content-Length: 0 (HTTP/2: HEADERS, then trailers).
	eos := s.r.Body == nil || s.r.Body == http.NoBody ||
		(s.r.ContentLength == 0 && !(s.r.ProtoMajor == 2 && len(s.r.Trailer) > 0))
	if !eos {
		s.reqPermit = make(chan struct{}, 1)
		s.readerDone = make(chan struct{})
		s.readerBusy.Store(true)
		go s.readRequestBody()
	}
	s.resetIdleTimer()
	s.decodeHeaders(eos)
	s.grantRead()
	for !s.finished {
		select {
		case ev := <-s.events:
			s.handle(ev)
		case <-s.r.Context().Done():
			// Downstream went away: the stream is reset.
			s.resetStream()
		}
	}
	// Goroutines feeding the loop stop now.
	closeDone()
	s.complete()
	// The response may have finished before the request body did: stop the
	// body reader (a read deadline in the past ends a blocked Read) and let
	// net/http close the connection gracefully, since the rest of the body
	// is never read.
	if s.readerDone != nil {
		if !s.dec.complete {
			_ = rc.SetReadDeadline(time.Now())
		}
		// The reader may still be on its way out after the last chunk; it
		// must be gone before net/http reads the next request.
		<-s.readerDone
	}
	if s.reset {
		panic(http.ErrAbortHandler)
	}
}

func (s *stream) handle(ev streamEvent) {
	switch ev.kind {
	case evWake:
		s.processPending()
	case evReqData:
		s.resetIdleTimer()
		s.bytesReceived.Add(int64(len(ev.data)))
		s.onRequestData(ev.data, ev.eos)
		s.grantRead()
		if hook := s.host.testHookRequestData.Load(); hook != nil {
			(*hook)(s.lis.cfg.Name, len(ev.data), ev.eos)
		}
	case evReqTrailers:
		s.resetIdleTimer()
		s.onRequestTrailers(ev.trailers)
		if hook := s.host.testHookRequestData.Load(); hook != nil {
			(*hook)(s.lis.cfg.Name, 0, true)
		}
	case evReqError:
		s.resetStream()
	case evIdleTimeout:
		s.onIdleTimeout(ev.gen)
	case evUpHeaders:
		if s.up != nil && ev.gen == s.up.gen {
			s.resetIdleTimer()
			s.onUpstreamHeaders(ev.resp)
		} else {
			ev.resp.Body.Close()
		}
	case evUpData:
		if s.up != nil && ev.gen == s.up.gen {
			s.resetIdleTimer()
			s.encodeData(ev.data, ev.eos)
			s.grantUpstreamRead()
		}
	case evUpError:
		if s.up != nil && ev.gen == s.up.gen {
			s.onUpstreamError(ev.err)
		}
	case evRouteTimeout:
		if s.up != nil && ev.gen == s.up.gen {
			s.onRouteTimeout()
		}
	}
}

// requestHeaderMap builds the request header map the way Envoy's HTTP/1
// codec and connection manager present it to filters: pseudo-headers
// :authority, :path, :method, :scheme first, then the request headers
// lower-cased (net/http does not keep their order, so they come sorted),
// then x-forwarded-proto and x-request-id added by the connection manager
// when absent.
func requestHeaderMap(r *http.Request) *HeaderMap {
	m := NewHeaderMap(
		Pair{":authority", r.Host},
		Pair{":path", r.URL.RequestURI()},
		Pair{":method", r.Method},
		Pair{":scheme", "http"},
	)
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		// Envoy answers "Expect: 100-continue" itself and removes the header
		// (net/http sends the 100 when the body is first read).
		if lk == "host" || hopByHop[lk] || (lk == "expect" && strings.EqualFold(r.Header.Get(k), "100-continue")) {
			continue
		}
		for _, v := range r.Header[k] {
			m.Add(lk, v)
		}
	}
	if r.ContentLength > 0 {
		if _, ok := m.Get("content-length"); !ok {
			m.Add("content-length", fmt.Sprint(r.ContentLength))
		}
	}
	if _, ok := m.Get("x-forwarded-proto"); !ok {
		m.Add("x-forwarded-proto", "http")
	}
	if _, ok := m.Get("x-request-id"); !ok {
		m.Add("x-request-id", newUUID())
	}
	return m
}

// requestTrailerMap is the trailers as Envoy's HTTP/2 codec presents them:
// keys lower-cased (sorted: net/http does not keep their order); declared
// trailers that never came are absent.
func requestTrailerMap(t http.Header) *HeaderMap {
	keys := make([]string, 0, len(t))
	for k, vs := range t {
		if len(vs) > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	m := NewHeaderMap()
	for _, k := range keys {
		for _, v := range t[k] {
			m.Add(strings.ToLower(k), v)
		}
	}
	return m
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// mutateRequestHeaders applies the connection manager's options before the
// filters see the request (envoy source/common/http/conn_manager_utility.cc:
// x-forwarded-for with use_remote_address, path normalisation).
func (l *listener) mutateRequestHeaders(m *HeaderMap, remote string) {
	if l.cfg.UseRemoteAddress {
		if host, _, err := net.SplitHostPort(remote); err == nil {
			if prev, ok := m.Get("x-forwarded-for"); ok {
				m.Set("x-forwarded-for", prev+","+host)
			} else {
				m.Add("x-forwarded-for", host)
			}
		}
	}
	if !l.cfg.NormalizePath && !l.cfg.MergeSlashes {
		return
	}
	p, _ := m.Get(":path")
	path, query := p, ""
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		path, query = p[:i], p[i:]
	}
	if l.cfg.NormalizePath {
		path = removeDotSegments(path)
	}
	if l.cfg.MergeSlashes {
		for strings.Contains(path, "//") {
			path = strings.ReplaceAll(path, "//", "/")
		}
	}
	m.Set(":path", path+query)
}

// removeDotSegments is RFC 3986 section 5.2.4 on an absolute path (Envoy's
// normalize_path also decodes percent-encoded unreserved characters; this
// host does not).
func removeDotSegments(path string) string {
	if !strings.HasPrefix(path, "/") {
		return path
	}
	segs := strings.Split(path[1:], "/")
	out := make([]string, 0, len(segs))
	for i, seg := range segs {
		last := i == len(segs)-1
		switch seg {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, seg)
		}
	}
	return "/" + strings.Join(out, "/")
}
