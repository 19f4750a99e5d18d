// Package h2c has what tests need to speak HTTP/2 to a cleartext listener:
// a client using HTTP/2 with prior knowledge (what Envoy's codec_type AUTO
// detects without TLS) and a request body written in pieces.
package h2c

import (
	"io"
	"net/http"
	"time"
)

// Client is an HTTP client that speaks only HTTP/2 with prior knowledge.
func Client(timeout time.Duration) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Timeout: timeout, Transport: &http.Transport{Protocols: &p, DisableCompression: true}}
}

// PiecewiseBody is a request body whose pieces are written one at a time,
// with pause between them, so the server reads it in several parts.
func PiecewiseBody(pause time.Duration, pieces ...string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		for _, p := range pieces {
			_, _ = pw.Write([]byte(p))
			time.Sleep(pause)
		}
		pw.Close()
	}()
	return pr
}
