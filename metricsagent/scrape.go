package metricsagent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// acceptHeader asks for the classic text format, the one expfmt's
// TextParser reads (vLLM's prometheus_client honours it).
const acceptHeader = "text/plain;version=0.0.4"

// Scraper fetches and parses one pod's /metrics.
type Scraper struct {
	Client *http.Client
	// Timeout bounds one scrape, connect to last byte; keep it below the
	// cycle interval so a slow pod cannot stretch the cycle.
	Timeout time.Duration
	// MaxBodyBytes caps the body read; a longer body fails the scrape.
	MaxBodyBytes int64
	Names        MetricNames
	// AskForNames adds Prometheus' name[] query parameters naming the
	// families read, so the server renders only those: prometheus_client,
	// which vLLM serves /metrics with, honours them (exposition.py
	// _bake_output, restricted_registry). A 30-100 KB page shrinks to about
	// 1 KB, which saves the pod and the agent most of the work. Servers that
	// ignore the parameters send the whole page and the agent filters it.
	AskForNames bool

	bufs sync.Pool // *bytes.Buffer, reused across scrapes
}

// NewScrapeClient returns an HTTP client tuned for scraping many pods
// often: kept-alive connections (one per pod), no compression (the bodies
// travel between pods of one node, and gunzipping 20 pages a second per pod
// would cost more CPU than the bytes saved).
func NewScrapeClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0, // no global cap: one idle connection per pod
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		// A vLLM page (20-60 KB) then arrives in a few reads instead of a
		// dozen 4 KB ones; 16 KB per pod connection is cheap.
		ReadBufferSize: 16 << 10,
	}}
}

// URL returns the URL to scrape for a target's metrics URL.
func (s *Scraper) URL(metricsURL string) string {
	if !s.AskForNames {
		return metricsURL
	}
	q := url.Values{}
	for _, n := range append([]string{s.Names.Waiting, s.Names.Running, s.Names.LoRAInfo}, s.Names.KVUsage...) {
		if n != "" {
			q.Add("name[]", n)
		}
	}
	sep := "?"
	if strings.Contains(metricsURL, "?") {
		sep = "&"
	}
	return metricsURL + sep + q.Encode()
}

// keepBufferBytes: buffers that grew beyond this go back to the garbage
// collector instead of the pool, so one huge page does not pin memory.
const keepBufferBytes = 1 << 20

// Scrape fetches url and parses it. Errors are *ScrapeError.
func (s *Scraper) Scrape(ctx context.Context, url string) (PodMetrics, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return PodMetrics{}, scrapeErr(wire.ScrapeConnectFailed, "request: %w", err)
	}
	req.Header.Set("Accept", acceptHeader)
	resp, err := s.Client.Do(req)
	if err != nil {
		return PodMetrics{}, transportErr(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return PodMetrics{}, scrapeErr(wire.ScrapeHTTPStatus, "GET %s: status %d", url, resp.StatusCode)
	}
	ct := resp.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "text/plain" {
		return PodMetrics{}, scrapeErr(wire.ScrapeBadContentType, "GET %s: content type %q, want text/plain", url, ct)
	}

	buf, _ := s.bufs.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	defer func() {
		if buf.Cap() <= keepBufferBytes {
			buf.Reset()
			s.bufs.Put(buf)
		}
	}()
	buf.Reset()
	if n := resp.ContentLength; n > 0 && n <= s.MaxBodyBytes {
		buf.Grow(int(n) + 1) // +1: room for the probe byte past the cap
	}
	// Read one byte past the cap to tell "exactly the cap" from "more".
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, s.MaxBodyBytes+1)); err != nil {
		return PodMetrics{}, transportErr(ctx, err)
	}
	if int64(buf.Len()) > s.MaxBodyBytes {
		return PodMetrics{}, scrapeErr(wire.ScrapeBodyTooLarge, "GET %s: body over %d bytes", url, s.MaxBodyBytes)
	}
	return ParseMetrics(buf.Bytes(), s.Names)
}

func transportErr(ctx context.Context, err error) *ScrapeError {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return scrapeErr(wire.ScrapeTimeout, "%w", err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return scrapeErr(wire.ScrapeTimeout, "%w", err)
	}
	return scrapeErr(wire.ScrapeConnectFailed, "%w", err)
}
