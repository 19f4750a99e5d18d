package stack

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeBin writes executable scripts standing in for the stack's binaries.
func fakeBin(t *testing.T, scripts map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{SimBinary, AgentBinary, EnvoyHostBinary} {
		body, ok := scripts[name]
		if !ok {
			body = "sleep 60"
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, WasmFile), []byte("\x00asm"), 0o644))
	return dir
}

func testConfig(t *testing.T, bin string) Config {
	return Config{
		BinDir:     bin,
		Bootstrap:  filepath.Join("..", "..", "envoy", "envoy.yaml"),
		Gateway:    GatewayEnvoyHost,
		Replicas:   2,
		ClientAddr: "127.0.0.1:0", PushAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
		ReadyTimeout: 20 * time.Second,
		StopGrace:    time.Second,
	}
}

func TestStartReportsAProcessThatDies(t *testing.T) {
	bin := fakeBin(t, map[string]string{SimBinary: `echo "listen tcp $2: address already in use" >&2; exit 1`})
	cfg := testConfig(t, bin)
	cfg.WorkDir = t.TempDir()
	_, err := Start(context.Background(), cfg)
	var exit *ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, "replica-0", exit.Name)
	require.Contains(t, err.Error(), "address already in use")
	require.Contains(t, err.Error(), "exit status 1")
}

func TestStartTimesOutAndStopsWhatItStarted(t *testing.T) {
	// The replicas never answer /health: Start gives up at its deadline and
	// stops them (the scripts would otherwise sleep for a minute).
	bin := fakeBin(t, nil)
	cfg := testConfig(t, bin)
	cfg.ReadyTimeout = 300 * time.Millisecond
	cfg.WorkDir = t.TempDir()
	_, err := Start(context.Background(), cfg)
	require.ErrorContains(t, err, "replica-0: not ready")
	logs, _ := filepath.Glob(filepath.Join(cfg.WorkDir, "*.log"))
	require.Len(t, logs, 2, "both replicas were started")
}

func TestStartChecksBinaries(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	_, err := Start(context.Background(), cfg)
	require.ErrorContains(t, err, "run `make build`")

	bin := fakeBin(t, nil)
	require.NoError(t, os.Remove(filepath.Join(bin, EnvoyHostBinary)))
	cfg = testConfig(t, bin)
	_, err = Start(context.Background(), cfg)
	require.ErrorContains(t, err, EnvoyHostBinary+" missing")

	cfg = testConfig(t, fakeBin(t, nil))
	cfg.Gateway = "nginx"
	_, err = Start(context.Background(), cfg)
	require.ErrorContains(t, err, `unknown gateway "nginx"`)
}

func TestStartRemovesItsOwnWorkDir(t *testing.T) {
	bin := fakeBin(t, map[string]string{SimBinary: "exit 2"})
	cfg := testConfig(t, bin)
	t.Setenv("TMPDIR", t.TempDir())
	_, err := Start(context.Background(), cfg)
	require.Error(t, err)
	left, _ := filepath.Glob(filepath.Join(os.Getenv("TMPDIR"), "wasm-epp-stack-*"))
	require.Empty(t, left)
}

func TestSeveralGatewaysNeedFreePorts(t *testing.T) {
	cfg := testConfig(t, fakeBin(t, nil))
	cfg.Gateways = 2
	cfg.PushAddr = "127.0.0.1:9002"
	_, err := Start(context.Background(), cfg)
	require.ErrorContains(t, err, `2 gateways need every listener and admin address with port 0, got "127.0.0.1:9002"`)
	cfg.PushAddr = "" // the template's own port
	_, err = Start(context.Background(), cfg)
	require.ErrorContains(t, err, "2 gateways need")
}
