package metricsagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// EnvoyTargets lists the Envoy replicas ("ip:port") to push to this cycle.
type EnvoyTargets interface {
	Targets(ctx context.Context) []string
}

// StaticEnvoys is a fixed list of host:port.
type StaticEnvoys []string

// ParseStaticEnvoys parses "host:port,host:port".
func ParseStaticEnvoys(spec string) (StaticEnvoys, error) {
	var out StaticEnvoys
	for entry := range strings.SplitSeq(spec, ",") {
		if entry = strings.TrimSpace(entry); entry == "" {
			continue
		}
		host, port, err := net.SplitHostPort(entry)
		if err != nil || host == "" {
			return nil, fmt.Errorf("envoy target %q: want host:port", entry)
		}
		if _, err := parsePort(port); err != nil {
			return nil, fmt.Errorf("envoy target %q: %w", entry, err)
		}
		if slices.Contains(out, entry) {
			return nil, fmt.Errorf("envoy target %q listed twice", entry)
		}
		out = append(out, entry)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no envoy targets in %q", spec)
	}
	return out, nil
}

// Targets returns the list.
func (s StaticEnvoys) Targets(context.Context) []string { return s }

// DNSEnvoys pushes to every address behind a name, typically a headless
// Service whose A/AAAA records are the Envoy pods.
type DNSEnvoys struct {
	Name     string
	Port     uint16
	Resolver Resolver
	// Refresh is the least time between two lookups. The name is looked up
	// again every cycle once this has passed; 0 looks up every cycle. A
	// lookup per 50 ms cycle per node would put thousands of queries a
	// second on the cluster DNS for no gain: replicas come and go in seconds.
	Refresh time.Duration
	Timeout time.Duration
	Now     func() time.Time
	Log     *slog.Logger
	Errors  interface{ Inc() }

	last   time.Time
	cached []string
}

// ParseEnvoyDNS parses "name:port".
func ParseEnvoyDNS(spec string) (string, uint16, error) {
	host, port, err := net.SplitHostPort(spec)
	if err != nil || host == "" {
		return "", 0, fmt.Errorf("envoy dns %q: want name:port", spec)
	}
	p, err := parsePort(port)
	if err != nil {
		return "", 0, fmt.Errorf("envoy dns %q: %w", spec, err)
	}
	return host, p, nil
}

// Targets resolves the name when Refresh has passed; on failure it keeps
// the previous addresses (and counts and logs the failure).
func (d *DNSEnvoys) Targets(ctx context.Context) []string {
	now := d.Now()
	if d.cached != nil && now.Sub(d.last) < d.Refresh {
		return d.cached
	}
	d.last = now
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	addrs, err := d.Resolver.LookupNetIP(ctx, "ip", d.Name)
	if err != nil || len(addrs) == 0 {
		d.Errors.Inc()
		d.Log.Warn("envoy DNS lookup failed; keeping previous targets", "name", d.Name, "err", err, "kept", len(d.cached))
		return d.cached
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, netip.AddrPortFrom(a.Unmap(), d.Port).String())
	}
	slices.Sort(out)
	d.cached = slices.Compact(out)
	return d.cached
}

// TokenSource yields the push bearer token: from a file (a mounted Secret,
// re-read at most every Refresh so a rotated Secret is picked up) or a
// fixed value (from the environment). The token is never logged.
type TokenSource struct {
	File    string
	Value   string
	Refresh time.Duration

	mu     sync.Mutex
	readAt time.Time
	cached string
}

// Token returns the current token, or an error when there is none.
func (t *TokenSource) Token() (string, error) {
	if t.File == "" {
		if t.Value == "" {
			return "", errors.New("no push token configured")
		}
		return t.Value, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cached != "" && time.Since(t.readAt) < t.Refresh {
		return t.cached, nil
	}
	b, err := os.ReadFile(t.File)
	if err != nil {
		if t.cached != "" {
			return t.cached, nil // keep the last token through a transient error
		}
		return "", fmt.Errorf("push token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("push token file %s is empty", t.File)
	}
	if strings.ContainsAny(tok, "\r\n\x00") {
		return "", fmt.Errorf("push token file %s holds more than one line", t.File)
	}
	t.cached, t.readAt = tok, time.Now()
	return tok, nil
}

// Pusher sends each payload to every Envoy target. Every target has its own
// goroutine and a one-slot mailbox holding the newest payload: a slow or
// dead Envoy only ever delays itself, and when it comes back it gets the
// newest state, not a backlog.
type Pusher struct {
	Client  *http.Client
	Path    string
	Timeout time.Duration
	Token   *TokenSource
	Log     *slog.Logger
	Metrics *Metrics
	// Sent, if set, is called after every attempt (tests use it).
	Sent func(target string, err error)
	// Delivered, if set, names non-2xx statuses that still count as
	// delivered: the receiver read the payload and kept what it had (409 to
	// a configuration record older than its own).
	Delivered func(status int) bool
	// Held, when set, records each target's wire.ConfigHeldHeader from its
	// answers (ConfigPublisher reads it).
	Held *HeldTables

	mu      sync.Mutex
	workers map[string]*pushWorker
	wg      sync.WaitGroup
}

type pushWorker struct {
	target  string
	mailbox chan []byte
	ctx     context.Context // cancelled when the target goes away or on Close
	cancel  context.CancelFunc
	failing bool // only the worker goroutine touches it
	// last is the payload last handed over (under Pusher.mu); lastFailed
	// says its latest attempt failed (RetryFailing resends it then).
	last       []byte
	lastFailed atomic.Bool
	attempted  []byte // the payload of the latest attempt (worker goroutine only)
}

// NewPushClient returns the HTTP client for pushes: kept-alive connections
// to each Envoy, no proxy from the environment, socket reads and writes
// made as the scrapes make them (see rawSocket).
func NewPushClient() *http.Client {
	dialer := &net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &rawSocketConn{Conn: c, sock: newRawSocket(c)}, nil
		},
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// rawSocketConn is a net.Conn whose Read and Write go through rawSocket.
type rawSocketConn struct {
	net.Conn
	sock rawSocket
}

func (c *rawSocketConn) Read(b []byte) (int, error) { return c.sock.read(b, false) }

func (c *rawSocketConn) Write(b []byte) (int, error) { return c.sock.write(b) }

// Publish hands payload to the workers of targets, starting workers for new
// targets and stopping those of targets no longer listed. It never blocks on
// the network. payload must not be modified afterwards.
func (p *Pusher) Publish(targets []string, payload []byte) { p.PublishTo(targets, payload, nil) }

// PublishTo is Publish, handing payload only to the targets to accepts
// (nil: all); the others keep their workers and their last payload.
func (p *Pusher) PublishTo(targets []string, payload []byte, to func(target string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.workers == nil {
		p.workers = map[string]*pushWorker{}
	}
	for t, w := range p.workers {
		if !slices.Contains(targets, t) {
			w.cancel()
			delete(p.workers, t)
			p.Held.forget(t)
			p.Metrics.forgetTarget(t)
			p.Log.Info("envoy target removed", "target", t)
		}
	}
	for _, t := range targets {
		w := p.worker(t)
		if to != nil && !to(t) {
			continue
		}
		w.last = payload
		w.handOver(payload)
	}
}

// worker returns target's worker, starting it if new. Called under mu.
func (p *Pusher) worker(t string) *pushWorker {
	if w, ok := p.workers[t]; ok {
		return w
	}
	w := &pushWorker{target: t, mailbox: make(chan []byte, 1)}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	p.workers[t] = w
	p.wg.Add(1)
	go p.run(w)
	p.Log.Info("envoy target added", "target", t)
	return w
}

// handOver puts payload in the worker's mailbox, replacing the payload it
// has not taken yet (this one is newer). Called under Pusher.mu.
func (w *pushWorker) handOver(payload []byte) {
	select {
	case <-w.mailbox:
	default:
	}
	w.mailbox <- payload
}

// RetryFailing hands each target whose latest attempt failed its last
// payload again: an agent that skips a cycle (nothing moved beyond its send
// thresholds) still retries, every cycle, the targets that missed its last
// state. A retry answered 409 (the target holds that sequence already: the
// failed attempt got through) counts as delivered.
func (p *Pusher) RetryFailing() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.workers {
		if w.last != nil && w.lastFailed.Load() && len(w.mailbox) == 0 {
			w.handOver(w.last)
		}
	}
}

// Close stops every worker and waits for them; a push in flight is
// abandoned at its timeout at the latest.
func (p *Pusher) Close() {
	p.mu.Lock()
	for t, w := range p.workers {
		w.cancel()
		delete(p.workers, t)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Pusher) run(w *pushWorker) {
	defer p.wg.Done()
	for {
		select {
		case <-w.ctx.Done():
			return
		case b := <-w.mailbox:
			// A retry is the same payload again after a failed attempt.
			retry := w.lastFailed.Load() && len(b) > 0 && len(b) == len(w.attempted) && &b[0] == &w.attempted[0]
			w.attempted = b
			p.send(w, b, retry)
		}
	}
}

// send pushes payload once and records whether it was delivered (before
// Sent hears of it); a retry (the previous attempt failed) answered 409 was
// delivered before.
func (p *Pusher) send(w *pushWorker, payload []byte, retry bool) {
	start := time.Now()
	reason, held, err := p.post(w, payload)
	if w.ctx.Err() != nil {
		return // target removed or closing: its series are gone, do not bring them back
	}
	if err == nil {
		p.Held.set(w.target, held)
	}
	if retry && reason == "http_409" {
		reason, err = "", nil
	}
	w.lastFailed.Store(err != nil)
	p.Metrics.PushDuration.WithLabelValues(w.target).Observe(time.Since(start).Seconds())
	if err != nil {
		p.Metrics.PushErrors.WithLabelValues(w.target, reason).Inc()
		if !w.failing {
			w.failing = true
			hint := ""
			if reason == "http_409" {
				hint = "the receiver has a newer sequence from this agent id: is another agent using the same --agent-id?"
			}
			p.Log.Warn("push failing", "target", w.target, "reason", reason, "err", err, "hint", hint)
		} else {
			p.Log.Debug("push failed", "target", w.target, "reason", reason, "err", err)
		}
	} else if w.failing {
		w.failing = false
		p.Log.Info("push recovered", "target", w.target)
	}
	if p.Sent != nil {
		p.Sent(w.target, err)
	}
}

// maxReplyBytes bounds how much of an error reply is read into the log.
const maxReplyBytes = 512

func (p *Pusher) post(w *pushWorker, payload []byte) (reason, held string, err error) {
	return postPayload(w.ctx, p.Client, "http://"+w.target+p.Path, p.Token, p.Timeout, payload, p.Delivered)
}

// postPayload POSTs one payload with the bearer token and returns why it
// failed ("" when the answer was 2xx, or a status delivered accepts): the
// reason is a metric label (token, request, timeout, connect, http_<code>).
// held is the answer's wire.ConfigHeldHeader ("" when absent).
func postPayload(parent context.Context, client *http.Client, url string, token *TokenSource, timeout time.Duration,
	payload []byte, delivered func(int) bool) (reason, held string, err error) {
	tok, err := token.Token()
	if err != nil {
		return "token", "", err
	}
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return "request", "", err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", wire.ContentType)
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "timeout", "", err
		}
		return "connect", "", err
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	if resp.StatusCode/100 != 2 && (delivered == nil || !delivered(resp.StatusCode)) {
		return "http_" + strconv.Itoa(resp.StatusCode), "", fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(reply)))
	}
	return "", resp.Header.Get(wire.ConfigHeldHeader), nil
}

// HeldTables remembers, for each push target, which model table its latest
// accepted answer said it holds (wire.ConfigHeldHeader). A target whose
// answers carry no header (an older receiver or aggregator) has no entry.
// Safe for concurrent use; a nil *HeldTables records nothing.
type HeldTables struct {
	mu sync.Mutex
	m  map[string]string
}

func (h *HeldTables) set(target, held string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if held == "" || len(held) > 64 {
		delete(h.m, target)
		return
	}
	if h.m == nil {
		h.m = map[string]string{}
	}
	h.m[target] = held
}

func (h *HeldTables) forget(target string) { h.set(target, "") }

// Get is target's latest answer; ok is false when it gave none.
func (h *HeldTables) Get(target string) (held string, ok bool) {
	if h == nil {
		return "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	held, ok = h.m[target]
	return held, ok
}

// Summary is what an aggregator tells its agents of the Envoys among
// targets: their common answer, wire.ConfigHeldMixed when they differ, ""
// when one of them has not given one (an older receiver, or not yet
// answered: the agents then resend on their timer).
func (h *HeldTables) Summary(targets []string) string {
	if h == nil || len(targets) == 0 {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := ""
	for _, t := range targets {
		v, ok := h.m[t]
		switch {
		case !ok:
			return ""
		case out == "":
			out = v
		case v != out:
			out = wire.ConfigHeldMixed
		}
	}
	return out
}
