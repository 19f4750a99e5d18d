package filter

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

const baseConfig = `{
  "seed": 7,
  "models": [
    {"name": "base", "criticality": "Critical"},
    {"name": "sql-lora", "criticality": "Critical"},
    {"name": "chat", "criticality": "Standard"},
    {"name": "batch", "criticality": "Sheddable"},
    {"name": "sql", "criticality": "Critical", "targets": [{"name": "sql-v1", "weight": 80}, {"name": "sql-v2", "weight": 20}]}
  ]
}`

func TestRoutesToTheAdaptersPod(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(
		pod{name: "with-adapter", addr: "10.0.0.1", active: []string{"sql-lora"}, max: 1},
		pod{name: "other-adapter", addr: "10.0.0.2", active: []string{"tweets"}, max: 1},
	)
	for i := 0; i < 50; i++ {
		r := e.post("/v1/chat/completions", nil, chat("sql-lora"))
		require.Nil(t, r.local)
		assert.Equal(t, types.ActionContinue, r.action)
		assert.Equal(t, "10.0.0.1:8000", r.dest(), "request %d", i)
		assert.Equal(t, chat("sql-lora"), r.body, "no target: body untouched")
	}
	assert.Equal(t, uint64(50), e.counter("wasm_epp.requests.routed"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.snapshot.decodes"), "decoded once, not per request")
}
