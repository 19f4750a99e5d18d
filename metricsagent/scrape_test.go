package metricsagent

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// countingServer serves the v1 golden page and counts connections.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(serveText(golden(t, "vllm-v1.txt")))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func TestPodScraperKeepsOneConnection(t *testing.T) {
	srv, conns := countingServer(t)
	s := &Scraper{Timeout: 5e9, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	ps, err := s.ForURL(srv.URL + "/metrics")
	require.NoError(t, err)
	defer ps.Close()
	for range 5 {
		m, err := ps.Scrape(context.Background())
		require.NoError(t, err)
		assert.Equal(t, uint32(31), m.Running)
	}
	assert.Equal(t, int64(1), conns.Load())

	// The server drops idle connections: the next scrape retries once on a
	// fresh connection instead of failing.
	srv.CloseClientConnections()
	_, err = ps.Scrape(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(2), conns.Load())

	// A server that closes after every answer ("Connection: close").
	srv.Config.SetKeepAlivesEnabled(false)
	for range 3 {
		_, err = ps.Scrape(context.Background())
		require.NoError(t, err)
	}
	assert.GreaterOrEqual(t, conns.Load(), int64(4))
}

func TestPodScraperErrors(t *testing.T) {
	s := &Scraper{Timeout: 5e9, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	for _, bad := range []string{"https://10.0.0.1/metrics", "10.0.0.1:80/metrics", "http:///metrics", "http://[::1"} {
		_, err := s.ForURL(bad)
		assert.Error(t, err, bad)
	}
	// Nothing listens: connect failure, no retry loop.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	ps, err := s.ForURL("http://" + addr + "/metrics")
	require.NoError(t, err)
	_, err = ps.Scrape(context.Background())
	assert.Equal(t, wire.ScrapeConnectFailed, StatusOf(err), "%v", err)

	// Not HTTP at all.
	garbage, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer garbage.Close()
	go func() {
		for {
			c, err := garbage.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			_ = c.Close()
		}
	}()
	ps, err = s.ForURL("http://" + garbage.Addr().String() + "/metrics")
	require.NoError(t, err)
	_, err = ps.Scrape(context.Background())
	assert.Equal(t, wire.ScrapeConnectFailed, StatusOf(err), "%v", err)
}

// sweepPods returns PodScrapers for the servers' URLs, closed at cleanup.
func sweepPods(t *testing.T, s *Scraper, srvs ...*httptest.Server) []*PodScraper {
	var pods []*PodScraper
	for _, srv := range srvs {
		ps, err := s.ForURL(srv.URL + "/metrics")
		require.NoError(t, err)
		t.Cleanup(ps.Close)
		pods = append(pods, ps)
	}
	return pods
}

func sweepStatuses(out []Scraped) []wire.ScrapeStatus {
	var st []wire.ScrapeStatus
	for _, o := range out {
		st = append(st, StatusOf(o.Err))
	}
	return st
}

// gatedServer serves the golden page, or, while gated, answers only once
// released (or never, for a partial answer: headers and half the body).
type gatedServer struct {
	*httptest.Server
	gated   atomic.Bool
	partial bool
	release chan struct{}
}

func newGatedServer(t *testing.T, partial bool) *gatedServer {
	body := golden(t, "vllm-v1.txt")
	g := &gatedServer{partial: partial, release: make(chan struct{})}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if g.gated.Load() {
			if g.partial {
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				_, _ = w.Write(body[:len(body)/2])
				w.(http.Flusher).Flush()
			}
			<-g.release
			if g.partial {
				return
			}
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(func() {
		close(g.release)
		g.Close()
	})
	return g
}

func TestSweepReadsAnswersThatArrivedWhileASlowPodWasAwaited(t *testing.T) {
	slow, partial := newGatedServer(t, false), newGatedServer(t, true)
	fast1, fast2 := newGatedServer(t, false), newGatedServer(t, false)
	s := &Scraper{Timeout: 5e9, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	pods := sweepPods(t, s, slow.Server, fast1.Server, partial.Server, fast2.Server)

	out := make([]Scraped, len(pods))
	s.Sweep(context.Background(), pods, time.Now().Add(5*time.Second), out) // connects every pod
	require.Equal(t, []wire.ScrapeStatus{wire.ScrapeOK, wire.ScrapeOK, wire.ScrapeOK, wire.ScrapeOK}, sweepStatuses(out))

	// The first pod now answers only after the deadline, the third sends
	// half its answer: the sweep waits on the first until the deadline,
	// then takes the answers that arrived meanwhile without waiting.
	slow.gated.Store(true)
	partial.gated.Store(true)
	s.Sweep(context.Background(), pods, time.Now().Add(300*time.Millisecond), out)
	require.Equal(t, []wire.ScrapeStatus{wire.ScrapeTimeout, wire.ScrapeOK, wire.ScrapeTimeout, wire.ScrapeOK}, sweepStatuses(out),
		"%v / %v / %v / %v", out[0].Err, out[1].Err, out[2].Err, out[3].Err)
	assert.Equal(t, uint32(31), out[1].Metrics.Running)
	assert.Equal(t, uint32(31), out[3].Metrics.Running)
	assert.Nil(t, pods[0].conn, "a timed-out pod's connection is dropped")
	assert.Nil(t, pods[2].conn)
	assert.NotNil(t, pods[1].conn, "the others keep theirs")

	// Next cycle: the failed pods reconnect, the others reuse.
	slow.gated.Store(false)
	partial.gated.Store(false)
	s.Sweep(context.Background(), pods, time.Now().Add(5*time.Second), out)
	require.Equal(t, []wire.ScrapeStatus{wire.ScrapeOK, wire.ScrapeOK, wire.ScrapeOK, wire.ScrapeOK}, sweepStatuses(out))
}

func TestSweepRetriesAConnectionClosedWhileIdle(t *testing.T) {
	srv, conns := countingServer(t)
	s := &Scraper{Timeout: 5e9, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	pods := sweepPods(t, s, srv)
	out := make([]Scraped, 1)
	for range 3 {
		s.Sweep(context.Background(), pods, time.Now().Add(5*time.Second), out)
		require.NoError(t, out[0].Err)
	}
	require.Equal(t, int64(1), conns.Load(), "one kept-alive connection")
	srv.CloseClientConnections()
	s.Sweep(context.Background(), pods, time.Now().Add(5*time.Second), out)
	require.NoError(t, out[0].Err, "retried once on a fresh connection")
	require.Equal(t, int64(2), conns.Load())
}

// sweepTwo starts two gated pods and sweeps them once, so that both have a
// kept-alive connection.
func sweepTwo(t *testing.T) (first, second *gatedServer, s *Scraper, pods []*PodScraper, out []Scraped) {
	first, second = newGatedServer(t, false), newGatedServer(t, false)
	s = &Scraper{Timeout: 5e9, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	pods = sweepPods(t, s, first.Server, second.Server)
	out = make([]Scraped, len(pods))
	s.Sweep(context.Background(), pods, time.Now().Add(5*time.Second), out)
	require.Equal(t, []wire.ScrapeStatus{wire.ScrapeOK, wire.ScrapeOK}, sweepStatuses(out))
	return first, second, s, pods, out
}

func TestSweepPastDeadlineFailsEveryPodAsTimeout(t *testing.T) {
	_, _, s, pods, out := sweepTwo(t)
	s.Sweep(context.Background(), pods, time.Now().Add(-time.Millisecond), out)
	require.Equal(t, []wire.ScrapeStatus{wire.ScrapeTimeout, wire.ScrapeTimeout}, sweepStatuses(out), "%v / %v", out[0].Err, out[1].Err)
}

// rawServer answers every request on a connection with answer, byte for
// byte, for answers no net/http server would write.
func rawServer(t *testing.T, answer []byte) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					for { // the request head
						line, err := br.ReadString('\n')
						if err != nil {
							return
						}
						if line == "\r\n" {
							break
						}
					}
					if _, err := c.Write(answer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestSweepRetriesAPodThatClosedWhileIdleBehindASlowPod(t *testing.T) {
	slow, idle, s, pods, out := sweepTwo(t)

	// The second pod's server drops its idle connection; the first pod is
	// slow this cycle and holds the sweep until the deadline. The second
	// is still scraped, on a fresh connection, in time.
	idle.CloseClientConnections()
	require.Eventually(t, pods[1].src.sock.closedByPeer, 5*time.Second, time.Millisecond, "the close reaches the agent's socket")
	slow.gated.Store(true)
	s.Sweep(context.Background(), pods, time.Now().Add(300*time.Millisecond), out)
	require.Equal(t, []wire.ScrapeStatus{wire.ScrapeTimeout, wire.ScrapeOK}, sweepStatuses(out), "%v / %v", out[0].Err, out[1].Err)
}

func TestTimeoutInAChunkedTrailerIsATimeout(t *testing.T) {
	body := string(golden(t, "vllm-v1.txt"))
	// The last chunk comes, the empty line that ends the trailer never does.
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n" +
		strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n")
	s := &Scraper{Timeout: 100 * time.Millisecond, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	p, err := s.ForURL("http://" + rawServer(t, answer) + "/metrics")
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Scrape(context.Background())
	require.Equal(t, wire.ScrapeTimeout, StatusOf(err), "%v", err)
}

func TestBytesPastTheAnswerAreNotTheNextAnswer(t *testing.T) {
	answer := func(running int) string {
		body := string(page(waiting2, "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running "+strconv.Itoa(running), kvV1))
		return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	// Every request gets its answer and, in the same write, one more that
	// nobody asked for.
	s := &Scraper{Timeout: 5 * time.Second, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	p, err := s.ForURL("http://" + rawServer(t, []byte(answer(1)+answer(2))) + "/metrics")
	require.NoError(t, err)
	defer p.Close()
	for range 3 {
		m, err := p.Scrape(context.Background())
		require.NoError(t, err)
		require.Equal(t, uint32(1), m.Running, "each scrape reads the answer to its own request")
	}
}
