package bootstrap

import (
	"os"
	"path/filepath"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// bootstraps are the repository's bootstrap files; every one must survive a
// Load, Marshal, Load round trip unchanged.
var bootstraps = []string{"../envoy.yaml", "../../build/k8s/base/envoy.yaml"}

func load(t *testing.T, path string) []byte {
	t.Helper()
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	return doc
}

func TestRoundTrip(t *testing.T) {
	for _, f := range bootstraps {
		t.Run(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), func(t *testing.T) {
			b, err := Load(load(t, f))
			require.NoError(t, err)
			out, err := Marshal(b)
			require.NoError(t, err)
			again, err := Load(out)
			require.NoError(t, err)
			require.True(t, proto.Equal(b, again), "Marshal then Load changed the bootstrap:\n%s", out)
			out2, err := Marshal(again)
			require.NoError(t, err)
			require.Equal(t, string(out), string(out2), "Marshal is deterministic")
		})
	}
}

func TestLoadRejects(t *testing.T) {
	for name, bad := range map[string]string{
		"unknown field":  "admin:\n  nonsense: 1\n",
		"duplicate key":  "admin: {}\nadmin: {}\n",
		"not a proto":    "static_resources: [1]\n",
		"validation":     "static_resources:\n  clusters:\n  - name: \"\"\n",
		"bad typed_conf": "static_resources:\n  listeners:\n  - name: l\n    address: {socket_address: {address: 127.0.0.1, port_value: 1}}\n    filter_chains:\n    - filters:\n      - name: f\n        typed_config:\n          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          stat_prefix: \"\"\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load([]byte(bad))
			require.Error(t, err)
			if name == "bad typed_conf" {
				require.ErrorContains(t, err, "HttpConnectionManager", "the Any's contents are validated")
			}
		})
	}
}

// TestStoreKeepsEdits: editing two filters of one connection manager and
// storing each keeps both edits, and the edit survives Marshal and Load.
func TestStoreKeepsEdits(t *testing.T) {
	b, err := Load(load(t, "../envoy.yaml"))
	require.NoError(t, err)
	filters, err := WasmFilters(b)
	require.NoError(t, err)
	require.NotEmpty(t, filters)
	for i, w := range filters {
		w.Wasm.GetConfig().Name = "edited-" + w.Wasm.GetConfig().GetName()
		require.NoError(t, w.Store(), "filter %d", i)
	}
	out, err := Marshal(b)
	require.NoError(t, err)
	again, err := Load(out)
	require.NoError(t, err)
	edited, err := WasmFilters(again)
	require.NoError(t, err)
	require.Len(t, edited, len(filters))
	for _, w := range edited {
		assert.Contains(t, w.Wasm.GetConfig().GetName(), "edited-")
	}
}

func TestSocketAddress(t *testing.T) {
	a := &corev3.Address{}
	require.NoError(t, SetSocketAddress(a, "[::1]:8080"))
	got, err := SocketAddress(a)
	require.NoError(t, err)
	assert.Equal(t, "[::1]:8080", got)
	assert.Error(t, SetSocketAddress(a, "localhost"))
	assert.Error(t, SetSocketAddress(a, "h:99999"))
	assert.Error(t, SetSocketAddress(nil, "h:1"))
	_, err = SocketAddress(&corev3.Address{})
	assert.Error(t, err)
}
