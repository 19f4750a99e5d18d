package metricsagent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

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
