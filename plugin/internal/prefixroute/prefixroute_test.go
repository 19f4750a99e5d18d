package prefixroute

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

var t0 = time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)

// withHost runs f against the SDK's emulated host: one shared-data table,
// as one Envoy's worker VMs share.
func withHost(t *testing.T) proxytest.HostEmulator {
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().WithVMContext(&types.DefaultVMContext{}))
	t.Cleanup(reset)
	return host
}

func snapshot(n int) *scheduler.Snapshot {
	s := &scheduler.Snapshot{}
	for i := range n {
		s.Endpoints = append(s.Endpoints, scheduler.Endpoint{ID: scheduler.EndpointID{Namespace: "ns", Name: fmt.Sprint("pod-", i)},
			Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8000})
	}
	return s
}

func chat(turns ...string) []byte {
	var msgs []map[string]string
	for i, c := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": c})
	}
	b, _ := json.Marshal(msgs)
	return b
}

func newVM(t *testing.T, shared bool) *Tracker {
	cfg := scheduler.DefaultPrefixConfig()
	cfg.Shared = shared
	tr, err := New(cfg, "wasm-epp.")
	require.NoError(t, err)
	return tr
}

func route(t *testing.T, tr *Tracker, snap *scheduler.Snapshot, msgs []byte, to int, now time.Time, p *Pending) int {
	t.Helper()
	require.NoError(t, tr.Hash("m", Prompt{Messages: msgs}))
	var req scheduler.Request
	tr.Prepare(&req, snap)
	tr.Routed(to, now, p)
	return p.predicted
}

func TestSharedAcrossVMs(t *testing.T) {
	withHost(t)
	snap := snapshot(4)
	a, b := newVM(t, true), newVM(t, true)
	turn1 := chat(strings.Repeat("Summarise the attached design document. ", 30))
	var p Pending
	assert.Zero(t, route(t, a, snap, turn1, 2, t0, &p))
	a.Tick()
	b.Tick()
	require.NoError(t, b.Hash("m", Prompt{Messages: turn1}))
	var req scheduler.Request
	b.Prepare(&req, snap)
	assert.Equal(t, 0, req.Prefix.MatchedBlocks(&snap.Endpoints[1]))
	assert.Greater(t, req.Prefix.MatchedBlocks(&snap.Endpoints[2]), 0, "VM b sees what VM a routed after both synced")

	// A per-VM index does not.
	c, d := newVM(t, false), newVM(t, false)
	route(t, c, snap, turn1, 3, t0, &p)
	c.Tick()
	d.Tick()
	require.NoError(t, d.Hash("m", Prompt{Messages: turn1}))
	d.Prepare(&req, snap)
	assert.Zero(t, req.Prefix.MatchedBlocks(&snap.Endpoints[3]))
}

func TestFeedbackCorrectsTheIndex(t *testing.T) {
	host := withHost(t)
	snap := snapshot(2)
	tr := newVM(t, true)
	msgs := chat(strings.Repeat("A long shared context paragraph. ", 60))
	var p Pending
	route(t, tr, snap, msgs, 0, t0, &p)
	pred := route(t, tr, snap, msgs, 0, t0.Add(time.Second), &p)
	require.Greater(t, pred, 0)

	// The stream carries a usage chunk: vLLM cached nothing.
	stream := "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":500,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n"
	for i := 0; i < len(stream); i += 17 {
		p.ResponseBody([]byte(stream[i:min(i+17, len(stream))]))
	}
	tr.ResponseDone(&p, t0.Add(2*time.Second))
	require.NoError(t, tr.Hash("m", Prompt{Messages: msgs}))
	var req scheduler.Request
	tr.Prepare(&req, snap)
	assert.Zero(t, req.Prefix.MatchedBlocks(&snap.Endpoints[0]), "the mispredicted entries are gone")
	tr.Tick() // counters are published on the tick
	m, err := host.GetCounterMetric("wasm_epp.prefix.responses.mispredicted")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), m)
	pt, _ := host.GetCounterMetric("wasm_epp.prefix.predicted_cached_tokens")
	assert.Greater(t, pt, uint64(0))

	// A stream without usage changes nothing.
	route(t, tr, snap, msgs, 1, t0.Add(3*time.Second), &p)
	pred = route(t, tr, snap, msgs, 1, t0.Add(4*time.Second), &p)
	p.ResponseBody([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n"))
	tr.ResponseDone(&p, t0.Add(5*time.Second))
	tr.Tick()
	tr.Prepare(&req, snap)
	assert.Equal(t, pred, req.Prefix.MatchedBlocks(&snap.Endpoints[1]))
	un, _ := host.GetCounterMetric("wasm_epp.prefix.responses.unreported")
	assert.Equal(t, uint64(1), un)

	// A correct prediction forgets nothing.
	body := fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":500,"prompt_tokens_details":{"cached_tokens":%d}}}`, 500*pred/p.blocks)
	route(t, tr, snap, msgs, 1, t0.Add(6*time.Second), &p)
	p.ResponseBody([]byte(body))
	tr.ResponseDone(&p, t0.Add(7*time.Second))
	tr.Prepare(&req, snap)
	assert.Equal(t, pred, req.Prefix.MatchedBlocks(&snap.Endpoints[1]))
}

func TestBadShapesAreRefused(t *testing.T) {
	withHost(t)
	tr := newVM(t, true)
	assert.Error(t, tr.Hash("m", Prompt{Messages: []byte(`[{"content":"no role"}]`)}))
	assert.Error(t, tr.Hash("m", Prompt{Prompt: []byte(`[1.5]`)}))
	assert.NoError(t, tr.Hash("m", Prompt{}))
	assert.Zero(t, tr.Blocks())
}
