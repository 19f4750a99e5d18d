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
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// acceptHeader asks for the classic text format, the one expfmt's
// TextParser reads (prometheus_client's exposition honours it; vLLM's
// /metrics route sends that format whatever is asked).
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
	// families read, so a server that honours them renders only those:
	// prometheus_client's own handlers do (through a restricted
	// registry), and a 30-100 KB page shrinks to about 1 KB, which saves
	// the pod most of its rendering work. Current vLLM does not: its
	// /metrics is prometheus-fastapi-instrumentator's route, which renders
	// the whole registry; it is matched before prometheus_client's ASGI
	// mount. Whole pages cost the agent a line filter before the parser
	// (a few µs per 26 KB page), so the agent asks anyway.
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
// is used by one goroutine at a time.
//
// It does not use http.Client: a client round trip hands the request and
// response between three goroutines, and at 2000 scrapes a second those
// wake-ups cost the agent more CPU than everything else together. Here the
// caller writes a prepared request and parses the response with the
// standard library's http.ReadResponse on the pod's own connection, with
// the scrape's deadline on the socket. Scraper.Sweep goes further and
// scrapes many pods from one goroutine.
type PodScraper struct {
	s       *Scraper
	addr    string // host:port to dial
	request []byte // the whole GET request, prepared once
	conn    net.Conn
	src     *connReader // what br reads from: conn, waiting or not
	br      *bufio.Reader
	parser  *Parser // remembers this pod's page between scrapes
	head    answerHead
	// acceptedType is the last Content-Type value found to be text/plain.
	acceptedType string
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
		p.conn, p.br, p.src = nil, nil, nil // a body being closed still reads the old ones: it fails
	}
}

// readBufferBytes: a whole vLLM page (20-100 KB) arrives in one or two
// reads instead of a dozen 4 KB ones; a loopback or veth segment carries
// up to 64 KB. The buffer is per pod connection: 100 pods hold 3.2 MB.
const readBufferBytes = 32 << 10

// growForBodyBytes bounds the room made for a body from its Content-Length
// alone (vLLM pages are tens of KB); a longer body grows the buffer as it
// arrives.
const growForBodyBytes = 256 << 10

// keepBufferBytes: body buffers that grew beyond this go back to the
// garbage collector instead of the pool, so one huge page does not pin memory.
const keepBufferBytes = 1 << 20

// Scrape fetches the pod's metrics and parses them, within the scrape
// timeout from now. Errors are *ScrapeError. Any failure to fetch closes
// the connection; the next scrape dials afresh.
func (p *PodScraper) Scrape(ctx context.Context) (PodMetrics, error) {
	return p.ScrapeBy(ctx, time.Now().Add(p.s.Timeout))
}

// ScrapeBy is Scrape with the deadline given: connect to last byte.
func (p *PodScraper) ScrapeBy(ctx context.Context, deadline time.Time) (PodMetrics, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// A kept-alive connection the server closed while idle fails on first
	// use without an answer; one retry on a fresh connection covers it, as
	// http.Transport does for idempotent requests.
	for attempt := 0; ; attempt++ {
		reused := p.conn != nil
		err := p.dial(ctx)
		if err == nil {
			err = p.send(deadline)
		}
		if err == nil {
			var m PodMetrics
			if m, err = p.receive(deadline, false); err == nil || isParseFailure(err) {
				return m, err
			}
		}
		p.Close()
		var se *ScrapeError
		if errors.As(err, &se) || !reused || attempt > 0 || ctx.Err() != nil {
			return PodMetrics{}, classify(ctx, err)
		}
	}
}

// isParseFailure tells a page that was fetched but not accepted (the
// connection is fine) from a failed fetch.
func isParseFailure(err error) bool {
	var se *ScrapeError
	return errors.As(err, &se) && se.fetched
}

// dial connects if there is no connection.
func (p *PodScraper) dial(ctx context.Context) error {
	if p.conn != nil {
		return nil
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return classify(ctx, err)
	}
	p.conn, p.src = conn, &connReader{sock: newRawSocket(conn)}
	p.br = bufio.NewReaderSize(p.src, readBufferBytes)
	return nil
}

// send puts the deadline on the connection and writes the request. The
// request is a few hundred bytes into a socket whose previous answer was
// read to its end, so the write does not wait.
func (p *PodScraper) send(deadline time.Time) error {
	if err := p.conn.SetDeadline(deadline); err != nil {
		return err
	}
	_, err := p.src.sock.write(p.request)
	return err
}

// receive reads the answer to the request sent and parses it. With
// arrivedOnly it waits for nothing: it takes what the pod sent so far and
// fails with a timeout if that is not the whole answer (Sweep uses it once
// the deadline has passed, for pods whose answers were not read yet). It
// returns a *ScrapeError for answers it refuses or cannot parse, and plain
// I/O errors (which a retry may cure) otherwise.
func (p *PodScraper) receive(deadline time.Time, arrivedOnly bool) (PodMetrics, error) {
	p.src.arrivedOnly = arrivedOnly
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
	if err := p.readBody(buf); err != nil {
		return PodMetrics{}, err
	}
	m, err := p.parser.Parse(buf.Bytes())
	if se := (*ScrapeError)(nil); errors.As(err, &se) {
		se.fetched = true
	}
	return m, err
}

// readBody reads a 200 text/plain answer's body into buf.
func (p *PodScraper) readBody(buf *bytes.Buffer) error {
	// On any failure the connection is dropped; on a refusal without
	// reading the body, which may be endless.
	refuse := func(err error) error {
		p.Close()
		return err
	}
	h := &p.head
	if err := readAnswerHead(p.br, h); err != nil {
		return refuse(err) // a plain I/O or format error: the caller may retry
	}
	if h.status != http.StatusOK {
		return refuse(scrapeErr(wire.ScrapeHTTPStatus, "GET %s: status %d", p.addr, h.status))
	}
	if !p.textPlain(h.contentType) {
		return refuse(scrapeErr(wire.ScrapeBadContentType, "GET %s: content type %q, want text/plain", p.addr, h.contentType))
	}
	var body io.Reader
	switch {
	case h.chunked:
		body = httputil.NewChunkedReader(p.br)
	case h.contentLength > p.s.MaxBodyBytes:
		return refuse(scrapeErr(wire.ScrapeBodyTooLarge, "GET %s: body of %d bytes, over %d", p.addr, h.contentLength, p.s.MaxBodyBytes))
	case h.contentLength >= 0:
		// Room for the announced body, up to what a real page needs: the
		// head alone must not decide how much is allocated.
		buf.Grow(int(min(h.contentLength, growForBodyBytes)))
		body = io.LimitReader(p.br, h.contentLength)
	default:
		body = p.br // to the end of the connection
	}
	// Read one byte past the cap to tell "exactly the cap" from "more".
	if _, err := buf.ReadFrom(io.LimitReader(body, p.s.MaxBodyBytes+1)); err != nil {
		return refuse(classify(context.Background(), err)) // a body cut short is not retried
	}
	if int64(buf.Len()) > p.s.MaxBodyBytes {
		return refuse(scrapeErr(wire.ScrapeBodyTooLarge, "GET %s: body over %d bytes", p.addr, p.s.MaxBodyBytes))
	}
	if h.contentLength >= 0 && int64(buf.Len()) < h.contentLength {
		return refuse(classify(context.Background(), io.ErrUnexpectedEOF))
	}
	if h.chunked {
		// The chunk reader stops after the last chunk's size line; the
		// trailer fields and the empty line that ends them follow.
		if err := readTrailer(p.br); err != nil {
			return refuse(classify(context.Background(), err))
		}
	}
	// Bytes past the answer are an answer nobody asked for (net/http drops
	// such a connection too): left in the reader, they would pass for the
	// next cycle's answer.
	if h.close || p.br.Buffered() > 0 {
		p.Close() // or the server said so, or the body ran to the end
	}
	return nil
}

// textPlain reports whether a Content-Type is text/plain (parameters
// allowed). The media type is parsed only when the pod sends another value
// than the last accepted one: it sends the same every time.
func (p *PodScraper) textPlain(ct []byte) bool {
	if p.acceptedType != "" && string(ct) == p.acceptedType {
		return true
	}
	mt, _, err := mime.ParseMediaType(string(ct))
	if err != nil || mt != "text/plain" {
		return false
	}
	p.acceptedType = string(ct)
	return true
}

// Scraped is one pod's outcome in a Sweep.
type Scraped struct {
	Metrics PodMetrics
	Err     error     // a *ScrapeError, or nil
	At      time.Time // when the answer was read (or the scrape failed)
}

// Sweep scrapes pods concurrently and mostly from the calling goroutine,
// all by deadline, and writes pods[i]'s outcome to out[i]. Each pod must be
// used by this call only.
//
// It first writes the request on every open connection, then reads the
// answers in order: the pods answer in parallel while the requests go
// out, so when Sweep comes to a pod its answer has usually arrived and is
// read without the goroutine ever waiting, where a goroutine per pod would
// find the socket empty, sleep and be woken for each one. If a pod is slow,
// Sweep waits for it, at most until the deadline; answers of the pods after
// it keep arriving meanwhile, and once the deadline has passed Sweep takes
// what each remaining pod has sent without waiting any longer: a pod fails
// for being late only if its answer is not complete when Sweep comes to it
// (an answer that completed just after the deadline, while Sweep was busy
// with others, is taken). Pods without an open connection, and pods whose
// kept-alive connection the pod closed (looked for with a peek before the
// request goes out), are scraped in a goroutine of their own (dial, send,
// receive), within the same deadline.
func (s *Scraper) Sweep(ctx context.Context, pods []*PodScraper, deadline time.Time, out []Scraped) {
	var wg sync.WaitGroup
	alone := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := pods[i].ScrapeBy(ctx, deadline)
			out[i] = Scraped{Metrics: m, Err: err, At: time.Now()}
		}()
	}
	sent := make([]bool, len(pods))
	for i, p := range pods {
		if p.conn == nil {
			alone(i)
			continue
		}
		// A connection the pod closed while idle (a restart, a keep-alive
		// timeout) takes the request without complaint and only fails
		// when its answer is read, which may be after the deadline if an
		// earlier pod is slow: look for it now, and scrape such a pod on
		// a fresh connection right away.
		if p.src.sock.closedByPeer() {
			p.Close()
			alone(i)
			continue
		}
		if err := p.send(deadline); err != nil {
			p.Close()
			alone(i) // the retry on a fresh connection
			continue
		}
		sent[i] = true
	}
	for i, p := range pods {
		if !sent[i] {
			continue
		}
		late := !time.Now().Before(deadline)
		m, err := p.receive(deadline, late)
		if err != nil && !isParseFailure(err) {
			p.Close()
			var se *ScrapeError
			if !errors.As(err, &se) && !late && !errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
				alone(i) // closed while idle: one retry on a fresh connection
				continue
			}
			err = classify(ctx, err)
		}
		out[i] = Scraped{Metrics: m, Err: err, At: time.Now()}
	}
	wg.Wait()
}

// connReader is what a pod's bufio.Reader reads from: the connection,
// waiting for data up to the deadline, or with arrivedOnly, taking only the
// bytes already received and failing with os.ErrDeadlineExceeded when
// there are none.
type connReader struct {
	sock        rawSocket
	arrivedOnly bool
}

func (r *connReader) Read(b []byte) (int, error) {
	if !r.arrivedOnly {
		n, err := r.sock.read(b, false)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		// The deadline passed while waiting, or before this read of an
		// answer already under way (a large page takes several reads):
		// what has arrived by now still counts, and nothing more is
		// awaited.
		r.arrivedOnly = true
	}
	return r.sock.read(b, true)
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
