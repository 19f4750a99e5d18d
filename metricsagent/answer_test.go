package metricsagent

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// netHTTPBody is the oracle for readBody: the same checks made on what
// net/http's ReadResponse gives (the agent read answers that way before).
func netHTTPBody(data []byte, maxBody int64) (body []byte, closeAfter bool, err error) {
	// The agent's buffer size: net/http bounds a trailer by its buffer.
	resp, err := http.ReadResponse(bufio.NewReaderSize(bytes.NewReader(data), readBufferBytes), nil)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, true, scrapeErr(wire.ScrapeHTTPStatus, "status %d", resp.StatusCode)
	}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "text/plain" {
		return nil, true, scrapeErr(wire.ScrapeBadContentType, "content type")
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, true, err
	}
	if int64(len(b)) > maxBody {
		return nil, true, scrapeErr(wire.ScrapeBodyTooLarge, "too large")
	}
	return b, resp.Close, nil
}

// agentBody runs the agent's readBody over data.
func agentBody(data []byte, maxBody int64) (body []byte, closeAfter bool, err error) {
	s := &Scraper{MaxBodyBytes: maxBody, Names: DefaultMetricNames()}
	p := &PodScraper{s: s, addr: "pod", br: bufio.NewReaderSize(bytes.NewReader(data), readBufferBytes)}
	p.conn = nopConn{} // readBody closes on refusal or "close": p.conn turns nil
	var buf bytes.Buffer
	err = p.readBody(&buf)
	return buf.Bytes(), p.conn == nil, err
}

func TestReadBodyAgreesWithNetHTTP(t *testing.T) {
	const max = 64
	for _, tc := range []struct {
		name   string
		answer string
		status wire.ScrapeStatus // of a refused answer; ScrapeOK when read
		body   string
		close  bool
	}{
		{"content length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 5\r\n\r\nhello", wire.ScrapeOK, "hello", false},
		{"bare LF lines", "HTTP/1.1 200 OK\nContent-Type: text/plain\nContent-Length: 2\n\nhi", wire.ScrapeOK, "hi", false},
		{"chunked with trailer", "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n", wire.ScrapeOK, "abcde", false},
		{"connection close", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive, Close\r\nContent-Length: 1\r\n\r\nx", wire.ScrapeOK, "x", true},
		{"HTTP/1.0 without keep-alive", "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\nx", wire.ScrapeOK, "x", true},
		{"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx", wire.ScrapeOK, "x", false},
		{"body to the end", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close", wire.ScrapeOK, "until close", true},
		{"same length twice", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", wire.ScrapeOK, "x", false},
		{"not found", "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 1\r\n\r\nx", wire.ScrapeHTTPStatus, "", true},
		{"JSON", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", wire.ScrapeBadContentType, "", true},
		{"no content type", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", wire.ScrapeBadContentType, "", true},
		{"over the cap by length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 65\r\n\r\n" + strings.Repeat("x", 65), wire.ScrapeBodyTooLarge, "", true},
		{"over the cap to the end", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + strings.Repeat("x", 65), wire.ScrapeBodyTooLarge, "", true},
		{"exactly the cap", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 64\r\n\r\n" + strings.Repeat("x", 64), wire.ScrapeOK, strings.Repeat("x", 64), false},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nabc", wire.ScrapeConnectFailed, "", true},
		{"two different lengths", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy", wire.ScrapeConnectFailed, "", true},
		{"gzip coding", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip\r\n\r\n", wire.ScrapeConnectFailed, "", true},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: -1\r\n\r\n", wire.ScrapeConnectFailed, "", true},
		{"HTTP/0.0 is read as 1.1 for transfer codings", "HTTP/0.0 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", wire.ScrapeOK, "hello", true},
		{"trailer fields are not read as fields", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", wire.ScrapeOK, "x", false},
		{"HTTP/0.0 with gzip coding", "HTTP/0.0 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip\r\n\r\n", wire.ScrapeConnectFailed, "", true},
		{"SSH banner", "SSH-2.0-OpenSSH_9.6\r\n", wire.ScrapeConnectFailed, "", true},
		{"nothing", "", wire.ScrapeConnectFailed, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, closed, err := agentBody([]byte(tc.answer), max)
			wantBody, wantClose, werr := netHTTPBody([]byte(tc.answer), max)
			if tc.status == wire.ScrapeOK {
				require.NoError(t, err)
				require.NoError(t, werr)
				require.Equal(t, tc.body, string(body))
				require.Equal(t, string(wantBody), string(body))
				require.Equal(t, tc.close, closed, "connection closed after")
				require.Equal(t, wantClose, closed)
				return
			}
			require.Error(t, werr, "net/http refuses it too")
			require.Error(t, err)
			require.Equal(t, tc.status, StatusOf(classify(t.Context(), err)), "%v", err)
			require.True(t, closed, "a refused answer drops the connection")
		})
	}
}

// FuzzReadAnswerHead: whatever the bytes, the agent reads an answer exactly
// when net/http reads it (but for folded header lines, which it refuses),
// with the same body and the same decision to close the connection.
func FuzzReadAnswerHead(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: 3\r\n\r\nabc"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 200  OK\nContent-Type: text/plain\nConnection: keep-alive\nContent-Length: 0\n\n"))
	f.Add([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"))
	f.Add([]byte("HTTP/0.0 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		body, closed, err := agentBody(data, 64)
		wantBody, wantClose, werr := netHTTPBody(data, 64)
		if err == nil {
			require.NoError(t, werr, "the agent read an answer net/http refuses")
			require.Equal(t, string(wantBody), string(body))
			require.Equal(t, wantClose, closed, "close after")
			return
		}
		if werr == nil && !errors.Is(err, errStricter) {
			t.Fatalf("net/http reads %q but the agent refuses it: %v", data, err)
		}
		require.True(t, closed, "a refused answer drops the connection")
	})
}

// nopConn stands in for a connection in readBody tests: it only gets closed.
type nopConn struct{ net.Conn }

func (nopConn) Close() error { return nil }
