package scale

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ServedByHeader is the response header the bench configures the router to
// name the chosen endpoint in.
const ServedByHeader = "x-served-by"

// LoadStats counts requests by outcome.
type LoadStats struct {
	Sent, OK, Failed atomic.Int64
	mu               sync.Mutex
	byStatus         map[int]int64
}

func (s *LoadStats) status(code int) {
	s.mu.Lock()
	if s.byStatus == nil {
		s.byStatus = map[int]int64{}
	}
	s.byStatus[code]++
	s.mu.Unlock()
}

// Statuses returns the answers by HTTP status.
func (s *LoadStats) Statuses() map[int]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]int64, len(s.byStatus))
	for k, v := range s.byStatus {
		out[k] = v
	}
	return out
}

func newRequestClient(conns int) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     time.Minute,
	}}
}

func chatBody(model string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":8}`
}

// send posts one chat request for model and returns the status and the
// endpoint the router named.
func send(ctx context.Context, c *http.Client, url, model string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody(model)))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(ServedByHeader), nil
}

// RunLoad sends rate requests per second for model through url, open loop
// (a request is started on schedule whatever the others do, up to conns at
// once), until ctx ends.
func RunLoad(ctx context.Context, url, model string, rate float64, conns int, st *LoadStats) {
	if rate <= 0 {
		<-ctx.Done()
		return
	}
	c := newRequestClient(conns)
	defer c.CloseIdleConnections()
	sem := make(chan struct{}, conns)
	var wg sync.WaitGroup
	defer wg.Wait()
	period := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for {
		next = next.Add(period)
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		select {
		case <-ctx.Done():
			return
		case sem <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st.Sent.Add(1)
			code, _, err := send(ctx, c, url, model)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					st.Failed.Add(1)
				}
			case code == http.StatusOK:
				st.OK.Add(1)
				st.status(code)
			default:
				st.Failed.Add(1)
				st.status(code)
			}
		}()
	}
}

// Probe measures staleness: the probe endpoint reports a new adapter with
// every push (Fleet.Probe), each push's adapter arrives as an event, and
// the prober polls the router continuously for the oldest adapter not yet
// seen until a response names the probe endpoint, recording how long
// after the push was sent that response came (an upper bound: the push
// became visible between the previous poll's decision and this one's;
// a poll is one request through the gateway, whose mean round trip
// PollTime tells). The next
// adapter is polled for at once, so the pushes that became visible
// together are all recorded. An event not seen within probeKeep pushes
// (its adapter is gone by then) counts as missed.
type Probe struct {
	mu     sync.Mutex
	lags   []time.Duration
	missed int
	polls  int
	polled time.Duration // the polls' round trips, together
	on     atomic.Bool
}

// PollTime is the polls' mean round trip: the probe's resolution.
func (p *Probe) PollTime() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.polls == 0 {
		return 0
	}
	return p.polled / time.Duration(p.polls)
}

// Enable turns the polling on or off (events are consumed either way).
func (p *Probe) Enable(on bool) { p.on.Store(on) }

// Lags returns the measured staleness values, the misses and the polls.
func (p *Probe) Lags() ([]time.Duration, int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.lags...), p.missed, p.polls
}

// Reset forgets what was measured (a new window).
func (p *Probe) Reset() {
	p.mu.Lock()
	p.lags, p.missed, p.polls, p.polled = nil, 0, 0, 0
	p.mu.Unlock()
}

// Run consumes events until ctx ends, polling every pollEvery while an
// event waits to be seen. An event waits at most horizon (the time the
// probe keeps its adapter running).
func (p *Probe) Run(ctx context.Context, url string, events <-chan ProbeEvent, pollEvery, horizon time.Duration) {
	c := newRequestClient(1)
	defer c.CloseIdleConnections()
	want := "llm/" + ProbeName
	var pending []ProbeEvent
	take := func(ev ProbeEvent) {
		if p.on.Load() {
			pending = append(pending, ev)
		} else {
			pending = pending[:0]
		}
	}
	for ctx.Err() == nil {
		if len(pending) == 0 {
			select {
			case <-ctx.Done():
				return
			case ev := <-events:
				take(ev)
			}
			continue
		}
	drain:
		for {
			select {
			case ev := <-events:
				take(ev)
			default:
				break drain
			}
		}
		if len(pending) == 0 {
			continue
		}
		ev := pending[0]
		if time.Since(ev.Sent) > horizon {
			p.mu.Lock()
			p.missed++
			p.mu.Unlock()
			pending = pending[1:]
			continue
		}
		start := time.Now()
		code, by, err := send(ctx, c, url, ev.Adapter)
		p.mu.Lock()
		p.polls++
		p.polled += time.Since(start)
		if err == nil && code == http.StatusOK && by == want {
			p.lags = append(p.lags, time.Since(ev.Sent))
			pending = pending[1:]
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		time.Sleep(pollEvery)
	}
}
