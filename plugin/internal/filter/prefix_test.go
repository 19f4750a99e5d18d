package filter

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// prefixConfig re-reads the snapshot on the prefix index's own period, so
// every host.Tick runs the prefix sync.
const prefixConfig = `{"models": [{"name": "chat", "criticality": "Critical"}], "scheduler": {"profile": "prefix-aware"}, "snapshotRefreshInterval": "50ms"}`

func fourPods() []pod {
	return []pod{{name: "a", addr: "10.0.0.1"}, {name: "b", addr: "10.0.0.2"}, {name: "c", addr: "10.0.0.3"}, {name: "d", addr: "10.0.0.4"}}
}

func chatBody(msgs ...string) string {
	var m []map[string]string
	for i, c := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		m = append(m, map[string]string{"role": role, "content": c})
	}
	b, _ := json.Marshal(map[string]any{"model": "chat", "messages": m, "max_tokens": 8})
	return string(b)
}

// respond finishes request r with a response body in the given chunks.
func (e *env) respond(r result, chunks ...string) {
	e.t.Helper()
	e.host.CallOnResponseHeaders(r.id, [][2]string{{":status", "200"}}, len(chunks) == 0)
	for i, c := range chunks {
		e.host.CallOnResponseBody(r.id, []byte(c), i == len(chunks)-1)
	}
	e.host.CompleteHttpContext(r.id)
}

func TestPrefixConversationStaysOnItsEndpoint(t *testing.T) {
	e := newEnv(t, prefixConfig)
	e.setPods(fourPods()...)
	doc := strings.Repeat("The attached contract covers payment terms and penalties. ", 20)
	first := e.post("/v1/chat/completions", nil, chatBody(doc))
	require.NotEmpty(t, first.dest())
	e.respond(first, `{"usage":{"prompt_tokens":300,"prompt_tokens_details":{"cached_tokens":0}}}`)
	msgs := []string{doc}
	for turn := range 5 {
		msgs = append(msgs, fmt.Sprintf("answer %d", turn), fmt.Sprintf("question %d", turn))
		r := e.post("/v1/chat/completions", nil, chatBody(msgs...))
		assert.Equal(t, first.dest(), r.dest(), "turn %d", turn)
		e.respond(r)
	}
	e.host.Tick() // the tracker's counters are published on the tick
	assert.Equal(t, uint64(5), e.counter("wasm_epp.path.prefix.affinity"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.path.prefix.consistent"))
	assert.Equal(t, uint64(6), e.counter("wasm_epp.prefix.hashed_requests"))
	assert.Greater(t, e.counter("wasm_epp.prefix.hashed_bytes"), uint64(6*len(doc)))
}

func TestPrefixBadShapesAreRefusedAndWriteNothing(t *testing.T) {
	e := newEnv(t, prefixConfig)
	e.setPods(fourPods()...)
	for _, body := range []string{
		`{"model":"chat","messages":[{"content":"no role"}]}`,
		`{"model":"chat","messages":[{"role":"user","content":5}]}`,
		`{"model":"chat","messages":[{"role":"user","content":[7]}]}`,
		`{"model":"chat","messages":["plain"]}`,
		`{"model":"chat","prompt":[1.5,2]}`,
		`{"model":"chat","prompt":[-1]}`,
		`{"model":"chat","prompt":[{"a":1}]}`,
	} {
		r := e.post("/v1/completions", nil, body)
		require.NotNil(t, r.local, body)
		assert.Equal(t, uint32(400), r.local.StatusCode, body)
		_, _, code := r.errorJSON(t)
		assert.Equal(t, string(ReasonInvalidField), code, body)
	}
	e.host.Tick()
	_, _, err := proxywasm.GetSharedData(e.cfg.SharedDataKeyPrefix + "v2.prefix.dir")
	assert.True(t, errors.Is(err, types.ErrorStatusNotFound), "refused requests wrote the index: %v", err)

	// Accepted shapes with defined handling: images are opaque bytes, an
	// empty prompt hashes nothing, token ids are hashed, nesting is fine.
	for _, body := range []string{
		`{"model":"chat","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"what is it?"}]}]}`,
		`{"model":"chat","prompt":""}`,
		`{"model":"chat","prompt":[]}`,
		`{"model":"chat","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`,
		`{"model":"chat","messages":[{"role":"user","content":[{"type":"x","deep":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}]}]}`,
	} {
		r := e.post("/v1/completions", nil, body)
		assert.Nil(t, r.local, body)
		assert.NotEmpty(t, r.dest(), body)
	}
	e.host.Tick()
	_, _, err = proxywasm.GetSharedData(e.cfg.SharedDataKeyPrefix + "v2.prefix.dir")
	assert.NoError(t, err, "routed requests reach the shared index on the tick")
}

func TestPrefixFeedbackFromResponses(t *testing.T) {
	e := newEnv(t, prefixConfig)
	e.setPods(fourPods()...)
	doc := strings.Repeat("Shared retrieval context paragraph. ", 40)
	body := chatBody(doc)
	first := e.post("/v1/chat/completions", nil, body)
	e.respond(first, `{"choices":[],"usage":{"prompt_tokens":400,"prompt_tokens_details":{"cached_tokens":0}}}`)
	// Predicted a hit; the server reports it cached nothing (split usage).
	second := e.post("/v1/chat/completions", nil, body)
	require.Equal(t, first.dest(), second.dest())
	e.respond(second, `{"id":"x","choices":[{"message":{"content":"ok"}}],"usage":{"prompt_to`, `kens":400,"prompt_tokens_details":{"cached_tok`, `ens":0}}}`)
	e.host.Tick()
	assert.Equal(t, uint64(1), e.counter("wasm_epp.prefix.responses.mispredicted"))
	assert.Greater(t, e.counter("wasm_epp.prefix.predicted_cached_tokens"), uint64(300))
	// The entries are gone: the next request is a cold prefix again.
	third := e.post("/v1/chat/completions", nil, body)
	e.respond(third)
	e.host.Tick()
	assert.Equal(t, uint64(2), e.counter("wasm_epp.path.prefix.consistent"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.prefix.responses.unreported"), "a response without usage is not judged")

	// A stream asking for usage is scanned; one that does not is not.
	stream := strings.TrimSuffix(body, "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
	r := e.post("/v1/chat/completions", nil, stream)
	e.respond(r, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":400,\"prompt_tokens_details\":{\"cached_tokens\":380}}}\n\ndata: [DONE]\n\n")
	e.host.Tick()
	assert.Equal(t, uint64(3), e.counter("wasm_epp.prefix.responses.judged"))
	assert.Equal(t, uint64(380), e.counter("wasm_epp.prefix.reported_cached_tokens"))
	plain := strings.TrimSuffix(body, "}") + `,"stream":true}`
	r = e.post("/v1/chat/completions", nil, plain)
	e.respond(r, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	e.host.Tick()
	assert.Equal(t, uint64(3), e.counter("wasm_epp.prefix.responses.judged"))
	assert.Equal(t, uint64(1), e.counter("wasm_epp.prefix.responses.unreported"))
}
