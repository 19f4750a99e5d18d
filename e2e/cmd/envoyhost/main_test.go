package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
)

// syncBuffer is a goroutine-safe stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestHelpDocumentsFlags(t *testing.T) {
	var out bytes.Buffer
	assert.Equal(t, 0, run(context.Background(), []string{"-h"}, &out))
	for _, f := range []string{"-c", "-concurrency", "-wasm", "-failure-policy", "-allow-on-headers-stop-iteration",
		"-wasi-profile", "-original-dst-header", "-admin", "-plugin-config", "-env"} {
		assert.Regexp(t, `(?m)^  `+f+`( |$)`, out.String(), f)
	}
	assert.Contains(t, out.String(), `(default "x-gateway-destination-endpoint")`)
	assert.Contains(t, out.String(), `(default "127.0.0.1:9901")`)
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-c", "a.yaml", "-wasm", "b.wasm"},
		{"-wasm", "x.wasm", "-log-level", "loud"},
		{"-wasm", "x.wasm", "extra"},
	} {
		var out bytes.Buffer
		assert.Equal(t, 2, run(context.Background(), args, &out), "%v", args)
	}
	var out bytes.Buffer
	assert.Equal(t, 1, run(context.Background(), []string{"-wasm", "/nonexistent.wasm"}, &out))
	assert.Contains(t, out.String(), "nonexistent.wasm")
}

// The command serves a plugin and stops cleanly when its context ends
// (main ties that to SIGINT and SIGTERM).
func TestRunServesAndShutsDown(t *testing.T) {
	wasm := wasmbuild.Build(t, "./plugin/internal/testplugin")
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"-wasm", wasm, "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
			"-concurrency", "1", "-plugin-config", `{}`, "-log-format", "json"}, &stderr)
	}()
	re := regexp.MustCompile(`"msg":"listening","listener":"main","address":"([^"]+)"`)
	var addr string
	require.Eventually(t, func() bool {
		m := re.FindStringSubmatch(stderr.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, 3*time.Minute, 20*time.Millisecond, stderr.String())
	resp, err := http.Get("http://" + addr + "/tp/property?path=plugin_name")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "plugin", string(body))
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("no clean shutdown")
	}
	assert.Contains(t, stderr.String(), "shutting down")
}
