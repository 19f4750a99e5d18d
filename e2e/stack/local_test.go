package stack

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/plugin/config"
)

func TestLocalConfigIsTheMakeRunShape(t *testing.T) {
	cfg, err := LocalConfig("bin", filepath.Join("..", "..", "envoy", "envoy.yaml"))
	require.NoError(t, err)
	require.Equal(t, 4, cfg.Replicas)
	require.Equal(t, 4, cfg.MaxLoRAs)
	require.Len(t, cfg.Adapters, 10, "make run serves 10 adapters")
	require.NotContains(t, cfg.Adapters, DefaultModel)
	require.NotContains(t, cfg.Adapters, "sql-assistant", "a traffic-split name is not an adapter")
	require.Contains(t, cfg.Adapters, "sql-lora-0")
}

func TestAdapters(t *testing.T) {
	c := &config.Config{Models: []config.Model{
		{Name: "base"},
		{Name: "b"},
		{Name: "split", Targets: []config.Target{{Name: "a", Weight: 1}, {Name: "c", Weight: 1}, {Name: "base", Weight: 1}}},
		{Name: "a"},
	}}
	require.Equal(t, []string{"a", "b", "c"}, Adapters(c, "base"))
}
