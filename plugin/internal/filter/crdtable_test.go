package filter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// setTable stores a configuration record and its version key, as the
// receiver does.
func (e *env) setTable(tb wire.ModelTable) {
	e.t.Helper()
	b, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "node-1", PoolNamespace: "llm", PoolName: "pool",
		Revision: wire.ConfigRevision{Pools: e.version, Objectives: e.version, Rewrites: e.version}, Table: tb}, wire.ConfigLimits{})
	require.NoError(e.t, err)
	e.setRecord(b)
}

func (e *env) setRecord(b []byte) {
	e.t.Helper()
	e.version++
	setShared(e.t, e.cfg.ConfigKey(), b)
	e.setConfigGen(wire.ConfigGenOf(b))
}

// setConfigGen names the stored record's generation in the directory, as
// the receiver does after storing it (0: no record).
func (e *env) setConfigGen(gen uint64) {
	e.t.Helper()
	w := wire.NewWriter(wire.NewKeys(e.cfg.SharedDataKeyPrefix), wire.Limits{}, time.Hour)
	_, err := w.SetConfigGen(shareddata.Store{}, gen)
	require.NoError(e.t, err)
	e.refreshed()
}

func targets(ts ...any) []wire.WeightedTarget {
	var out []wire.WeightedTarget
	for i := 0; i < len(ts); i += 2 {
		out = append(out, wire.WeightedTarget{Model: ts[i].(string), Weight: uint32(ts[i+1].(int))})
	}
	return out
}

// modelOf is the model a forwarded body names.
func modelOf(t *testing.T, r result) string {
	t.Helper()
	require.Nil(t, r.local, "routed, not answered")
	p, err := ParseRequest([]byte(r.body), 256)
	require.NoError(t, err, "body %q", r.body)
	return p.Model
}

// TestKubernetesTableReplacesBootstrapModels: without a record the
// bootstrap's models apply; a record's table replaces them on the next
// request (llm-d's semantics: every model served, rewrites by weight, a
// default rule); a new record moves requests at once; an empty table or a
// removed record brings the bootstrap back.
func TestKubernetesTableReplacesBootstrapModels(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", max: 4})
	assert.Equal(t, "sql-lora", modelOf(t, e.post("/v1/chat/completions", nil, chat("sql-lora"))))
	r := e.post("/v1/chat/completions", nil, chat("llama"))
	require.NotNil(t, r.local)
	assert.Equal(t, uint32(404), r.local.StatusCode, "bootstrap: unknown models refused")

	e.setTable(wire.ModelTable{Rewrites: []wire.ModelRewrite{{Model: "llama", Targets: targets("llama-a", 100, "llama-b", 0)}}})
	for range 20 {
		r := e.post("/v1/chat/completions", [][2]string{{"content-length", "67"}}, chat("llama"))
		assert.Equal(t, "llama-a", modelOf(t, r))
		assert.NotContains(t, r.headers, "content-length", "the body changed: Content-Length must go")
	}
	assert.Equal(t, "sql-lora", modelOf(t, e.post("/v1/chat/completions", nil, chat("sql-lora"))), "a model no rule names is served unchanged")
	assert.Equal(t, "sql", modelOf(t, e.post("/v1/chat/completions", nil, chat("sql"))), "the bootstrap's split no longer applies")
	assert.Equal(t, uint64(1), e.counter("wasm_epp.config.applied"))

	// 100/0 -> 0/100: the next request goes to the new target.
	e.setTable(wire.ModelTable{Rewrites: []wire.ModelRewrite{{Model: "llama", Targets: targets("llama-a", 0, "llama-b", 100)}}})
	for range 20 {
		assert.Equal(t, "llama-b", modelOf(t, e.post("/v1/chat/completions", nil, chat("llama"))))
	}
	assert.Equal(t, uint64(2), e.counter("wasm_epp.config.applied"), "applied once per change, not per request")

	// A default rule takes every other model.
	e.setTable(wire.ModelTable{Default: targets("base", 1)})
	assert.Equal(t, "base", modelOf(t, e.post("/v1/chat/completions", nil, chat("anything"))))

	// An empty table: the bootstrap models again.
	e.setTable(wire.ModelTable{})
	assert.Equal(t, "sql-lora", modelOf(t, e.post("/v1/chat/completions", nil, chat("sql-lora"))))
	r = e.post("/v1/chat/completions", nil, chat("llama"))
	require.NotNil(t, r.local)
	assert.Equal(t, uint32(404), r.local.StatusCode)
}

// TestContentLengthOnlyGoesWhenTheTableRewrites: with bootstrap models that
// never rewrite, Content-Length stays on requests the table leaves alone
// and goes from those it rewrites (in the body callback: the headers are
// still held there).
func TestContentLengthOnlyGoesWhenTheTableRewrites(t *testing.T) {
	e := newEnv(t, `{"models": [{"name": "m"}]}`)
	e.setPods(pod{name: "a", max: 4})
	e.setTable(wire.ModelTable{Rewrites: []wire.ModelRewrite{{Model: "llama", Targets: targets("llama-a", 1)}}})
	r := e.post("/v1/chat/completions", [][2]string{{"content-length", "63"}}, chat("other"))
	assert.Equal(t, "other", modelOf(t, r))
	assert.Equal(t, "63", r.headers["content-length"])
	r = e.post("/v1/chat/completions", [][2]string{{"content-length", "63"}}, chat("llama"))
	assert.Equal(t, "llama-a", modelOf(t, r))
	assert.NotContains(t, r.headers, "content-length")
}

// TestObjectiveHeaderSetsCriticality: a negative priority is sheddable
// (dropped when no endpoint has capacity), any other is not; the header's
// former name works too; no header or an unknown objective is critical.
func TestObjectiveHeaderSetsCriticality(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", waiting: 50, kv: 0.95}) // saturated: sheddable requests are dropped
	e.setTable(wire.ModelTable{Objectives: []wire.Objective{{Name: "batch", Priority: -1}, {Name: "chat", Priority: 0}, {Name: "vip", Priority: 10}}})
	for _, tc := range []struct {
		header, value string
		dropped       bool
	}{
		{objectiveHeader, "batch", true},
		{legacyObjectiveHeader, "batch", true},
		{objectiveHeader, "chat", false},
		{objectiveHeader, "vip", false},
		{objectiveHeader, "unknown", false},
		{"", "", false},
	} {
		var h [][2]string
		if tc.header != "" {
			h = [][2]string{{tc.header, tc.value}}
		}
		r := e.post("/v1/chat/completions", h, chat("any-model"))
		if tc.dropped {
			require.NotNil(t, r.local, "%s: %s", tc.header, tc.value)
			assert.Equal(t, uint32(429), r.local.StatusCode)
		} else {
			assert.Nil(t, r.local, "%s: %s", tc.header, tc.value)
		}
	}
	assert.Equal(t, scheduler.Sheddable, CriticalityOfPriority(-1))
	assert.Equal(t, scheduler.Critical, CriticalityOfPriority(0))
	assert.Equal(t, scheduler.Critical, CriticalityOfPriority(1<<31-1))
}

func TestUnreadableTableKeepsThePreviousOne(t *testing.T) {
	e := newEnv(t, baseConfig)
	e.setPods(pod{name: "a", max: 4})
	e.setTable(wire.ModelTable{Rewrites: []wire.ModelRewrite{{Model: "llama", Targets: targets("llama-a", 1)}}})
	assert.Equal(t, "llama-a", modelOf(t, e.post("/v1/chat/completions", nil, chat("llama"))))
	e.setRecord([]byte("WC\x01 not a record"))
	assert.Equal(t, "llama-a", modelOf(t, e.post("/v1/chat/completions", nil, chat("llama"))))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.config.decode_errors"))
}
