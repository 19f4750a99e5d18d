package receiver

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

func configHeaders(token string, n int) [][2]string {
	h := pushHeaders(token, n)
	for i := range h {
		if h[i][0] == ":path" {
			h[i][1] = config.DefaultConfigPath
		}
	}
	return h
}

func record(t *testing.T, agent string, rev uint64, weight uint32) []byte {
	t.Helper()
	b, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: agent, PoolNamespace: "llm", PoolName: "pool",
		Revision: wire.ConfigRevision{Pools: rev, Objectives: rev, Rewrites: rev},
		Table: wire.ModelTable{
			Rewrites:   []wire.ModelRewrite{{Model: "chat", Targets: []wire.WeightedTarget{{Model: "a", Weight: weight}, {Model: "b", Weight: 100 - weight}}}},
			Objectives: []wire.Objective{{Name: "batch", Priority: -1}},
		}}, wire.ConfigLimits{})
	require.NoError(t, err)
	return b
}

// storedConfig returns the stored record (nil when absent) and the
// generation the directory names.
func storedConfig(t *testing.T) ([]byte, uint64) {
	t.Helper()
	cfg, _ := config.Decode(nil)
	dir, _, err := proxywasm.GetSharedData(wire.NewKeys(cfg.SharedDataKeyPrefix).Dir)
	require.NoError(t, err)
	gen, ok := wire.DirConfigGen(dir)
	require.True(t, ok)
	rec, _, err := proxywasm.GetSharedData(cfg.ConfigKey())
	if err != nil {
		require.Zero(t, gen)
		return nil, 0
	}
	require.Equal(t, wire.ConfigGenOf(rec), gen, "the directory names the stored record")
	return rec, gen
}

func TestConfigRecordStoredOnlyWhenNewer(t *testing.T) {
	host := newHost(t, `{"role":"receiver"}`)
	first := record(t, "node-a", 10, 100)
	r := send(t, host, configHeaders(testToken, len(first)), first, 5)
	require.Equal(t, uint32(204), r.status)
	rec, gen := storedConfig(t)
	assert.Equal(t, first, rec, "the record is stored whole")
	assert.NotZero(t, gen)

	// Another agent, same table, later revisions: nothing is written.
	same := record(t, "node-b", 11, 100)
	assert.Equal(t, uint32(204), send(t, host, configHeaders(testToken, -1), same, 0).status)
	rec2, gen2 := storedConfig(t)
	assert.Equal(t, first, rec2)
	assert.Equal(t, gen, gen2)

	// A lagging agent with an older table: 409, nothing written.
	older := record(t, "node-c", 9, 50)
	r = send(t, host, configHeaders(testToken, -1), older, 0)
	assert.Equal(t, uint32(409), r.status)
	assert.Equal(t, "config_not_newer", r.code)
	rec2, gen2 = storedConfig(t)
	assert.Equal(t, first, rec2)
	assert.Equal(t, gen, gen2)

	// A newer table replaces it, and its version changes.
	newer := record(t, "node-b", 12, 0)
	assert.Equal(t, uint32(204), send(t, host, configHeaders(testToken, -1), newer, 0).status)
	rec3, gen3 := storedConfig(t)
	assert.Equal(t, newer, rec3)
	assert.NotEqual(t, gen, gen3)

	counts := map[string]uint64{}
	for _, o := range configOutcomes {
		v, err := host.GetCounterMetric("wasm_epp.receiver." + o)
		require.NoError(t, err)
		counts[o] = v
	}
	assert.Equal(t, map[string]uint64{"config_stored": 2, "config_unchanged": 1, "config_not_newer": 1, "config_bad_request": 0, "config_stored_reset": 0}, counts)

	// Metrics pushes still go to their own path and key.
	body := push(t, "node-a", 1, "pod-1")
	assert.Equal(t, uint32(204), send(t, host, pushHeaders(testToken, len(body)), body, 0).status)
	s, _ := stored(t, host)
	assert.Equal(t, map[string][]string{"node-a": {"pod-1"}}, agents(s))
	rec4, _ := storedConfig(t)
	assert.Equal(t, newer, rec4)
}

// TestConfigRecordRejected: every refusal, each with its status and code,
// and nothing written by any of them.
func TestConfigRecordRejected(t *testing.T) {
	good := record(t, "node-a", 10, 100)
	longModel := func() []byte {
		b, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "a", PoolNamespace: "llm", PoolName: "pool", Table: wire.ModelTable{
			Rewrites: []wire.ModelRewrite{{Model: strings.Repeat("m", 300), Targets: []wire.WeightedTarget{{Model: "t", Weight: 1}}}}}},
			wire.ConfigLimits{MaxModelNameLen: 4096})
		require.NoError(t, err)
		return b
	}()
	tests := []struct {
		name    string
		cfg     string
		headers [][2]string
		body    []byte
		status  uint32
		code    string
	}{
		{"no token", `{"role":"receiver"}`, configHeaders("", -1), good, 401, "unauthorized"},
		{"wrong token", `{"role":"receiver"}`, configHeaders("wrong", -1), good, 401, "unauthorized"},
		{"GET", `{"role":"receiver"}`, func() [][2]string { h := configHeaders(testToken, -1); h[0][1] = "GET"; return h }(), good, 405, "method_not_allowed"},
		{"too large by Content-Length", `{"role":"receiver","receiver":{"maxConfigBytes":64}}`, configHeaders(testToken, len(good)), good, 413, "too_large"},
		{"too large while buffering", `{"role":"receiver","receiver":{"maxConfigBytes":64}}`, configHeaders(testToken, -1), good, 413, "too_large"},
		{"a metrics push on the config path", `{"role":"receiver"}`, configHeaders(testToken, -1), push(t, "a", 1, "p"), 400, "config_bad_request"},
		{"truncated", `{"role":"receiver"}`, configHeaders(testToken, -1), good[:len(good)-2], 400, "config_bad_request"},
		{"trailing bytes", `{"role":"receiver"}`, configHeaders(testToken, -1), append(bytes.Clone(good), 0), 400, "config_bad_request"},
		{"unknown version", `{"role":"receiver"}`, configHeaders(testToken, -1), append([]byte("WC\x02"), good[3:]...), 400, "config_bad_request"},
		{"model name longer than maxModelNameLength", `{"role":"receiver"}`, configHeaders(testToken, -1), longModel, 400, "config_bad_request"},
		{"weights that add up to 0", `{"role":"receiver"}`, configHeaders(testToken, -1), bytes.Replace(good, []byte{1, 'a', 100}, []byte{1, 'a', 0}, 1), 400, "config_bad_request"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := newHost(t, tc.cfg)
			r := send(t, host, tc.headers, tc.body, 16)
			assert.Equal(t, tc.status, r.status)
			assert.Equal(t, tc.code, r.code)
			rec, gen := storedConfig(t)
			assert.Nil(t, rec, "nothing written")
			assert.Zero(t, gen)
		})
	}
}

func TestConfigRecordReplacesUnreadableState(t *testing.T) {
	host := newHost(t, `{"role":"receiver"}`)
	cfg, _ := config.Decode(nil)
	require.NoError(t, proxywasm.SetSharedData(cfg.ConfigKey(), []byte("WC\x01garbage"), 0))
	good := record(t, "node-a", 10, 100)
	assert.Equal(t, uint32(204), send(t, host, configHeaders(testToken, -1), good, 0).status)
	rec, _ := storedConfig(t)
	assert.Equal(t, good, rec)
	v, err := host.GetCounterMetric("wasm_epp.receiver.config_stored_reset")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), v)
}

func TestConfigPathConfiguration(t *testing.T) {
	host := newHost(t, `{"role":"receiver","receiver":{"configPath":"/cfg"}}`)
	good := record(t, "node-a", 10, 100)
	h := configHeaders(testToken, -1)
	assert.Equal(t, uint32(404), send(t, host, h, good, 0).status, "the default path is no longer served")
	h[1][1] = "/cfg"
	assert.Equal(t, uint32(204), send(t, host, h, good, 0).status)
	_, err := config.Decode([]byte(`{"receiver":{"configPath":"/wasm-epp/v1/push"}}`))
	assert.ErrorContains(t, err, "receiver.configPath: must start with / and differ from receiver.path")
	_, err = config.Decode([]byte(`{"receiver":{"maxConfigBytes":` + strconv.Itoa(17<<20) + `}}`))
	assert.ErrorContains(t, err, "receiver.maxConfigBytes")
}

// Every agent resends its record every few seconds: a resend with the
// stored table is answered without decoding it (one directory read and a
// hash), as is a lagging agent's; a new table is decoded and stored. When
// the directory lost the record's generation (rebuilt), the next resend
// decodes once and writes it back.
func TestConfigResendsCostWhatChanged(t *testing.T) {
	host, r := newHostReceiver(t, `{"role":"receiver"}`)
	post := func(b []byte) uint32 { return send(t, host, configHeaders(testToken, -1), b, 0).status }
	first := record(t, "node-0", 10, 100)
	require.Equal(t, uint32(204), post(first))
	require.Equal(t, 1, r.config.decodes)
	for round := range 5 {
		for i := range 50 {
			require.Equal(t, uint32(204), post(record(t, "node-"+strconv.Itoa(i), uint64(10+round), 100)))
		}
	}
	assert.Equal(t, 1, r.config.decodes, "250 resends of the stored table: none decoded")
	assert.Equal(t, uint32(409), post(record(t, "node-late", 9, 50)))
	assert.Equal(t, 1, r.config.decodes, "a lagging agent: refused without decoding")
	rec, gen := storedConfig(t)
	assert.Equal(t, first, rec)

	newer := record(t, "node-3", 20, 30)
	require.Equal(t, uint32(204), post(newer))
	assert.Equal(t, 2, r.config.decodes)
	rec, gen2 := storedConfig(t)
	assert.Equal(t, newer, rec)
	assert.NotEqual(t, gen, gen2)

	// The directory forgets the generation (as after a rebuild): routers
	// would fall back to the bootstrap models until a resend repairs it.
	w := wire.NewWriter(wire.NewKeys(config.DefaultSharedDataKeyPrefix), wire.Limits{}, time.Hour)
	_, err := w.SetConfigGen(shareddata.Store{}, 0)
	require.NoError(t, err)
	require.Equal(t, uint32(204), post(record(t, "node-9", 21, 30)))
	assert.Equal(t, 3, r.config.decodes)
	_, gen3 := storedConfig(t)
	assert.Equal(t, gen2, gen3, "the directory names the stored record again")
	require.Equal(t, uint32(204), post(record(t, "node-8", 21, 30)))
	assert.Equal(t, 3, r.config.decodes)
}

// TestPushAnswersNameTheHeldTable: every accepted metrics push is answered
// with the stored table (wire.ConfigHeldHeader), "none" before one; the
// answer comes from the directory the push read anyway, and the record
// itself is read once per generation, not per push.
func TestPushAnswersNameTheHeldTable(t *testing.T) {
	host, recv := newHostReceiver(t, `{"role":"receiver"}`)
	heldIn := func(r sent) string {
		for _, h := range r.headers {
			if h[0] == wire.ConfigHeldHeader {
				return h[1]
			}
		}
		return ""
	}
	p := push(t, "node-a", 1, "pod-1")
	r := send(t, host, pushHeaders(testToken, len(p)), p, 0)
	require.Equal(t, uint32(204), r.status)
	assert.Equal(t, wire.ConfigHeldNone, heldIn(r))

	rec := record(t, "node-a", 10, 100)
	r = send(t, host, configHeaders(testToken, len(rec)), rec, 0)
	require.Equal(t, uint32(204), r.status)
	assert.Empty(t, heldIn(r), "records' own answers say nothing")
	head, err := wire.PeekConfig(rec, wire.ConfigLimits{})
	require.NoError(t, err)
	for seq := uint64(2); seq < 12; seq++ {
		p = push(t, "node-a", seq, "pod-1")
		r = send(t, host, pushHeaders(testToken, len(p)), p, 0)
		require.Equal(t, uint32(204), r.status)
		assert.Equal(t, head.Held(), heldIn(r))
	}
	assert.Equal(t, 1, recv.config.heldReads, "the record is read once for its generation")

	// Another agent's record with the same table: the same answer.
	same := record(t, "node-b", 11, 100)
	sameHead, err := wire.PeekConfig(same, wire.ConfigLimits{})
	require.NoError(t, err)
	assert.Equal(t, head.Held(), sameHead.Held())

	// A newer table: the next answer names it.
	newer := record(t, "node-b", 12, 30)
	require.Equal(t, uint32(204), send(t, host, configHeaders(testToken, len(newer)), newer, 0).status)
	newerHead, err := wire.PeekConfig(newer, wire.ConfigLimits{})
	require.NoError(t, err)
	require.NotEqual(t, head.Held(), newerHead.Held())
	p = push(t, "node-a", 20, "pod-1")
	r = send(t, host, pushHeaders(testToken, len(p)), p, 0)
	assert.Equal(t, newerHead.Held(), heldIn(r))

	// A refused push says nothing (the pusher keeps what it knew).
	r = send(t, host, pushHeaders(testToken, len(p)), p, 0)
	assert.Equal(t, uint32(409), r.status)
	assert.Empty(t, heldIn(r))
}
