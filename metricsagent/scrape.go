package metricsagent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// acceptHeader asks for the classic text format, the one expfmt's
// TextParser reads (vLLM's prometheus_client honours it).
const acceptHeader = "text/plain;version=0.0.4"

// Scraper holds what every pod's scrape shares. PodScraper does the work.
type Scraper struct {
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
	// 1 KB, which saves the pod most of its rendering work. Servers that
	// ignore the parameters send the whole page and the agent filters it.
	AskForNames bool

	bufs sync.Pool // *bytes.Buffer, reused across scrapes
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

// PodScraper scrapes one pod over one kept-alive HTTP/1.1 connection. It
// is used by one goroutine at a time (the pod's scrape worker).
//
// It does not use http.Client: a client round trip hands the request and
// response between three goroutines, and at 2000 scrapes a second those
// wake-ups cost the agent more CPU than everything else together. Here the
// worker writes a prepared request and parses the response with the
// standard library's http.ReadResponse on its own connection, with the
// scrape's deadline on the socket.
type PodScraper struct {
	s       *Scraper
	addr    string // host:port to dial
	request []byte // the whole GET request, prepared once
	conn    net.Conn
	br      *bufio.Reader
	parser  *Parser // remembers this pod's page between scrapes
}

// ForURL returns a PodScraper for an http:// URL (as built by URL).
func (s *Scraper) ForURL(rawURL string) (*PodScraper, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("metrics URL %q: want http://host:port/path", rawURL)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	req := "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nAccept: " + acceptHeader +
		"\r\nUser-Agent: wasm-epp-metricsagent\r\n\r\n"
	return &PodScraper{s: s, addr: host, request: []byte(req), parser: NewParser(s.Names)}, nil
}

// Parses returns how many pages this pod's parser read in full (expfmt)
// and values only (see Parser).
func (p *PodScraper) Parses() (full, valuesOnly uint64) {
	return p.parser.FullParses, p.parser.ValueParses
}

// Close drops the connection.
func (p *PodScraper) Close() {
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn, p.br = nil, nil
	}
}

// readBufferBytes: a vLLM page (20-100 KB) arrives in a few reads instead
// of a dozen 4 KB ones; 16 KB per pod connection is cheap.
const readBufferBytes = 16 << 10

// keepBufferBytes: body buffers that grew beyond this go back to the
// garbage collector instead of the pool, so one huge page does not pin memory.
const keepBufferBytes = 1 << 20

// Scrape fetches the pod's metrics and parses them. Errors are *ScrapeError.
// Any failure closes the connection; the next scrape dials afresh.
func (p *PodScraper) Scrape(ctx context.Context) (PodMetrics, error) {
	ctx, cancel := context.WithTimeout(ctx, p.s.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	buf, _ := p.s.bufs.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	defer func() {
		if buf.Cap() <= keepBufferBytes {
			buf.Reset()
			p.s.bufs.Put(buf)
		}
	}()
	buf.Reset()

	// A kept-alive connection the server closed while idle fails on first
	// use without an answer; one retry on a fresh connection covers it, as
	// http.Transport does for idempotent requests.
	for attempt := 0; ; attempt++ {
		reused := p.conn != nil
		err := p.fetch(ctx, deadline, buf)
		if err == nil {
			return p.parser.Parse(buf.Bytes())
		}
		p.Close()
		var se *ScrapeError
		if errors.As(err, &se) || !reused || attempt > 0 || ctx.Err() != nil {
			return PodMetrics{}, classify(ctx, err)
		}
		buf.Reset()
	}
}

// fetch sends the request and reads a 200 text/plain body into buf. It
// returns a *ScrapeError for answers it refuses, and plain I/O errors
// (which a retry may cure) otherwise.
func (p *PodScraper) fetch(ctx context.Context, deadline time.Time, buf *bytes.Buffer) error {
	if p.conn == nil {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.addr)
		if err != nil {
			return classify(ctx, err)
		}
		p.conn, p.br = conn, bufio.NewReaderSize(conn, readBufferBytes)
	}
	if err := p.conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := p.conn.Write(p.request); err != nil {
		return err
	}
	resp, err := http.ReadResponse(p.br, nil)
	if err != nil {
		return err
	}
	// On any refusal the connection is dropped before the body is closed:
	// closing a response body reads it to its end, which for an endless
	// body would last until the deadline.
	refuse := func(err error) error {
		p.Close()
		_ = resp.Body.Close()
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return refuse(scrapeErr(wire.ScrapeHTTPStatus, "GET %s: status %d", p.addr, resp.StatusCode))
	}
	ct := resp.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "text/plain" {
		return refuse(scrapeErr(wire.ScrapeBadContentType, "GET %s: content type %q, want text/plain", p.addr, ct))
	}
	if n := resp.ContentLength; n > 0 && n <= p.s.MaxBodyBytes {
		buf.Grow(int(n) + 1) // +1: room for the probe byte past the cap
	}
	// Read one byte past the cap to tell "exactly the cap" from "more".
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, p.s.MaxBodyBytes+1)); err != nil {
		return refuse(classify(ctx, err)) // a body cut short is not retried
	}
	if int64(buf.Len()) > p.s.MaxBodyBytes {
		return refuse(scrapeErr(wire.ScrapeBodyTooLarge, "GET %s: body over %d bytes", p.addr, p.s.MaxBodyBytes))
	}
	_ = resp.Body.Close() // at its end already: reads nothing more
	if resp.Close {
		p.Close() // the server said so
	}
	return nil
}

// classify turns an I/O error into a *ScrapeError (kept as is if it is one).
func classify(ctx context.Context, err error) *ScrapeError {
	var se *ScrapeError
	if errors.As(err, &se) {
		return se
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return scrapeErr(wire.ScrapeTimeout, "%w", err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return scrapeErr(wire.ScrapeTimeout, "%w", err)
	}
	return scrapeErr(wire.ScrapeConnectFailed, "%w", err)
}
