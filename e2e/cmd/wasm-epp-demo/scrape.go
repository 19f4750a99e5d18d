package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/metricsagent"
)

// scraper reads every known replica's /metrics on its own, to judge after
// the fact whether a request's replica already had its adapter: the demo's
// adapter hit rate. Replicas become known when the gateway names them in
// its served-by header (or up front, for a stack the demo started).
type scraper struct {
	client   *http.Client
	interval time.Duration
	history  int // samples kept per replica
	names    metricsagent.MetricNames

	mu      sync.Mutex
	samples map[string][]adapterSample // by ip:port, oldest first
}

// adapterSample is one scrape: the adapters running or queued at At.
type adapterSample struct {
	At       time.Time
	Adapters []string // sorted
}

func newScraper(interval time.Duration, keep time.Duration) *scraper {
	return &scraper{
		client:   &http.Client{Timeout: interval * 5},
		interval: interval,
		history:  int(keep/interval) + 1,
		names:    metricsagent.DefaultMetricNames(),
		samples:  map[string][]adapterSample{},
	}
}

// observe makes an endpoint known. The served-by header carries the name
// the agent gave the endpoint, which is host:port for static targets (the
// local stack) but may be a pod name elsewhere: only addresses are scraped.
func (s *scraper) observe(endpoint string) {
	if _, _, err := net.SplitHostPort(endpoint); err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.samples[endpoint]; !ok {
		s.samples[endpoint] = nil
	}
}

func (s *scraper) endpoints() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for e := range s.samples {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// run scrapes every interval until ctx ends.
func (s *scraper) run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		for _, e := range s.endpoints() {
			wg.Add(1)
			go func() { defer wg.Done(); s.scrape(ctx, e) }()
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *scraper) scrape(ctx context.Context, endpoint string) {
	at := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/metrics", nil)
	if err != nil {
		return
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return
	}
	m, err := metricsagent.ParseMetrics(body, s.names)
	if err != nil {
		return
	}
	adapters := slices.Concat(m.ActiveAdapters, m.WaitingAdapters)
	slices.Sort(adapters)
	s.add(endpoint, adapterSample{At: at, Adapters: slices.Compact(adapters)})
}

func (s *scraper) add(endpoint string, a adapterSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := append(s.samples[endpoint], a)
	if len(h) > s.history {
		h = h[len(h)-s.history:]
	}
	s.samples[endpoint] = h
}

// had says whether the latest scrape of endpoint taken at or before at
// listed adapter; unknown when there is no such scrape or it is older than
// a few intervals (scrapes failing, or the history too short).
func (s *scraper) had(endpoint, adapter string, at time.Time) hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.samples[endpoint]
	i, _ := slices.BinarySearchFunc(h, at, func(a adapterSample, t time.Time) int { return a.At.Compare(t) })
	// h[i-1] is the last sample at or before at (At == at sorts before).
	if i < len(h) && h[i].At.Equal(at) {
		i++
	}
	if i == 0 || at.Sub(h[i-1].At) > 4*s.interval {
		return hitUnknown
	}
	if _, ok := slices.BinarySearch(h[i-1].Adapters, adapter); ok {
		return hitYes
	}
	return hitNo
}
