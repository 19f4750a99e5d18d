package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

func TestConfigFromFlags(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	bootstrap := filepath.Join(root, "envoy", "envoy.yaml")
	logs := t.TempDir()
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, c stack.Config)
		err   string
	}{
		{"defaults are the make run shape", []string{"--config", bootstrap, "--log-dir", logs}, func(t *testing.T, c stack.Config) {
			require.Equal(t, 4, c.Replicas)
			require.Equal(t, 4, c.MaxLoRAs)
			require.Len(t, c.Adapters, 10)
			require.Equal(t, 8001, c.FirstReplicaPort)
			require.Equal(t, stack.GatewayAuto, c.Gateway)
			require.Equal(t, logs, c.WorkDir)
		}, ""},
		{"overrides", []string{"--config", bootstrap, "--log-dir", logs, "--replicas", "2", "--adapters", "x, y", "--gateway", "envoyhost", "--replica-port", "0"},
			func(t *testing.T, c stack.Config) {
				require.Equal(t, 2, c.Replicas)
				require.Equal(t, []string{"x", "y"}, c.Adapters)
				require.Equal(t, stack.GatewayEnvoyHost, c.Gateway)
				require.Zero(t, c.FirstReplicaPort)
			}, ""},
		{"bad gateway", []string{"--config", bootstrap, "--log-dir", logs, "--gateway", "nginx"}, nil, "--gateway"},
		{"missing bootstrap", []string{"--config", filepath.Join(logs, "absent.yaml"), "--log-dir", logs}, nil, "absent.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args)
			require.NoError(t, err)
			c, err := config(o)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestRunFailsClearlyWithoutBinaries(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	empty := t.TempDir()
	err = run([]string{"--bin", empty, "--config", filepath.Join(root, "envoy", "envoy.yaml"), "--log-dir", t.TempDir()}, os.Stderr)
	require.ErrorContains(t, err, "make build")
}
