package stack

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/envoy"
	"github.com/wasm-epp/wasm-epp/envoy/bootstrap"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

func template(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "envoy", "envoy.yaml"))
	require.NoError(t, err)
	return b
}

func TestRenderBootstrap(t *testing.T) {
	tmpl := template(t)
	orig, err := InspectBootstrap(tmpl)
	require.NoError(t, err)

	tests := []struct {
		name  string
		opts  BootstrapOptions
		check func(t *testing.T, info *BootstrapInfo, rendered []byte)
	}{
		{
			name: "no options keeps the template",
			check: func(t *testing.T, info *BootstrapInfo, _ []byte) {
				require.Equal(t, orig.Listeners, info.Listeners)
				require.Equal(t, orig.AdminAddr, info.AdminAddr)
				require.Equal(t, orig.Router, info.Router)
				require.Equal(t, orig.Receiver, info.Receiver)
			},
		},
		{
			name: "addresses and wasm path",
			opts: BootstrapOptions{
				WasmPath: "bin/wasm-epp.wasm", ClientAddr: "127.0.0.1:20001",
				PushAddr: "127.0.0.1:20002", AdminAddr: "127.0.0.1:20003",
			},
			check: func(t *testing.T, info *BootstrapInfo, rendered []byte) {
				require.Equal(t, "127.0.0.1:20001", info.Listeners[info.ClientListener])
				require.Equal(t, "127.0.0.1:20002", info.Listeners[info.PushListener])
				require.Equal(t, "127.0.0.1:20003", info.AdminAddr)
				abs, err := filepath.Abs("bin/wasm-epp.wasm")
				require.NoError(t, err)
				b, err := bootstrap.Load(rendered)
				require.NoError(t, err)
				require.NoError(t, envoy.Check(b, envoy.Rules{WasmFile: abs, PushOnLoopback: true}))
			},
		},
		{
			name: "router and receiver patches",
			opts: BootstrapOptions{
				RouterPatch:   map[string]any{"staleAfter": "300ms", "whenNoFreshEndpoint": "reject", "servedByHeader": nil},
				ReceiverPatch: map[string]any{"receiver": map[string]any{"maxEndpoints": 8}},
			},
			check: func(t *testing.T, info *BootstrapInfo, _ []byte) {
				require.Equal(t, config.Duration(300*time.Millisecond), info.Router.StaleAfter)
				require.Equal(t, config.NoFreshReject, info.Router.WhenNoFreshEndpoint)
				require.Empty(t, info.Router.ServedByHeader)
				require.Equal(t, orig.Router.Models, info.Router.Models)
				require.Equal(t, 8, info.Receiver.Receiver.MaxEndpoints)
				require.Equal(t, orig.Receiver.Receiver.Path, info.Receiver.Receiver.Path, "merge keeps sibling keys")
			},
		},
		{
			name: "extra router listener",
			opts: BootstrapOptions{
				ClientAddr:   "127.0.0.1:20001",
				RouterPatch:  map[string]any{"staleAfter": "300ms"},
				ExtraRouters: []RouterListener{{Name: "strict", Addr: "127.0.0.1:20004", Patch: map[string]any{"whenNoFreshEndpoint": "reject"}}},
			},
			check: func(t *testing.T, info *BootstrapInfo, rendered []byte) {
				require.Equal(t, "127.0.0.1:20004", info.Listeners["strict"])
				require.Equal(t, "127.0.0.1:20001", info.Listeners[info.ClientListener])
				b, err := bootstrap.Load(rendered)
				require.NoError(t, err)
				plugins, err := envoy.Plugins(b)
				require.NoError(t, err)
				var strict *config.Config
				for _, p := range plugins {
					if p.Listener.GetName() == "strict" {
						strict = p.Config
					}
				}
				require.NotNil(t, strict)
				require.Equal(t, config.NoFreshReject, strict.WhenNoFreshEndpoint)
				require.Equal(t, config.Duration(300*time.Millisecond), strict.StaleAfter, "copies start from the patched router")
				require.Equal(t, config.NoFreshFailOpen, info.Router.WhenNoFreshEndpoint)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := RenderBootstrap(tmpl, tt.opts)
			require.NoError(t, err)
			info, err := InspectBootstrap(out)
			require.NoError(t, err)
			tt.check(t, info, out)
		})
	}
}

func TestRenderBootstrapRejects(t *testing.T) {
	tmpl := template(t)
	tests := []struct {
		name string
		opts BootstrapOptions
		want string
	}{
		{"invalid plugin patch", BootstrapOptions{RouterPatch: map[string]any{"staleAfter": "soon"}}, `staleAfter: expected a duration such as "2s", got "soon"`},
		{"unknown plugin field", BootstrapOptions{RouterPatch: map[string]any{"nonsense": true}}, "nonsense"},
		{"bad address", BootstrapOptions{ClientAddr: "localhost"}, "missing port"},
		{"extra router without address", BootstrapOptions{ExtraRouters: []RouterListener{{Name: "x"}}}, "needs a name and an address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := RenderBootstrap(tmpl, tt.opts)
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := RenderBootstrap([]byte("admin: {}\n"), BootstrapOptions{})
	require.Error(t, err)
}

func TestMergePatch(t *testing.T) {
	dst := map[string]any{"a": 1, "b": map[string]any{"c": 2, "d": 3}, "e": "x"}
	mergePatch(dst, map[string]any{"a": nil, "b": map[string]any{"c": nil, "f": 4}, "e": map[string]any{"g": 5}})
	require.Equal(t, map[string]any{"b": map[string]any{"d": 3, "f": 4}, "e": map[string]any{"g": 5}}, dst)
}
