package vllmsim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPromptTokensFollowTheTokenizerRule(t *testing.T) {
	tests := []struct {
		kind apiKind
		body string
		want int
	}{
		{apiCompletions, `{"model":"m","prompt":"abcd"}`, 1},
		{apiCompletions, `{"model":"m","prompt":"abcde"}`, 2},
		{apiCompletions, `{"model":"m","prompt":""}`, 1},      // the BOS-like filler token
		{apiCompletions, `{"model":"m","prompt":"ééééé"}`, 3}, // 10 bytes
		{apiCompletions, `{"model":"m","prompt":[5,6,7]}`, 3},
		{apiCompletions, `{"model":"m","prompt":["abcdefgh"]}`, 2},
		{apiCompletions, `{"model":"m","prompt":[[1,2]]}`, 2},
		{apiCompletions, `{"model":"m","prompt":"abcd","sim_prompt_tokens":77}`, 77},
		{apiCompletions, `{"model":"m","prompt":"abcdefghijkl","sim_prompt_tokens":2}`, 2},
		// "<|user|>abcdefgh\n<|assistant|>": 8+8+1+13 = 30 bytes.
		{apiChat, `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}`, 8},
		// "<|assistant|>\n" 14, "<|user|><|image_url|>{"type":"image_url"}abcd\n" 46, "<|assistant|>" 13.
		{apiChat, `{"model":"m","messages":[{"role":"assistant","content":null},{"role":"user","content":[{"type":"image_url"},{"type":"text","text":"abcd"}]}]}`, 19},
	}
	for _, tc := range tests {
		g, err := parseGenerationRequest(tc.kind, []byte(tc.body))
		require.NoError(t, err, tc.body)
		assert.Equal(t, tc.want, g.PromptTokens, tc.body)
		assert.Len(t, g.Prompt, tc.want, tc.body)
	}
}

func TestTokenIDsArePiecesOfFourBytes(t *testing.T) {
	assert.Equal(t, []uint32{0x64636261, 0x65}, TextTokens(nil, "abcde"))
	assert.Equal(t, 2, TextTokenCount("abcde"))
	g, err := parseGenerationRequest(apiCompletions, []byte(`{"model":"m","prompt":[7,4294967295]}`))
	require.NoError(t, err)
	assert.Equal(t, []uint32{7, 4294967295}, g.Prompt, "token ids are used as given")

	// A shared text prefix gives a shared token prefix, up to the last whole
	// 4-byte piece; the same holds for a conversation and its next turn.
	long, err := parseGenerationRequest(apiCompletions, []byte(`{"model":"m","prompt":"You are a helpful assistant. Question one?"}`))
	require.NoError(t, err)
	other, err := parseGenerationRequest(apiCompletions, []byte(`{"model":"m","prompt":"You are a helpful assistant. Another?"}`))
	require.NoError(t, err)
	assert.Equal(t, long.Prompt[:7], other.Prompt[:7]) // 28 shared bytes
	assert.NotEqual(t, long.Prompt[7], other.Prompt[7])

	turn1, err := parseGenerationRequest(apiChat, []byte(`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}]}`))
	require.NoError(t, err)
	turn2, err := parseGenerationRequest(apiChat, []byte(`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"},{"role":"assistant","content":"Hello!"},{"role":"user","content":"Bye"}]}`))
	require.NoError(t, err)
	common := len("<|system|>Be brief.\n<|user|>Hi there\n<|assistant|>") / BytesPerToken
	assert.Equal(t, turn1.Prompt[:common], turn2.Prompt[:common])

	_, err = parseGenerationRequest(apiCompletions, []byte(`{"model":"m","prompt":[1,-2]}`))
	assert.ErrorContains(t, err, "out of range")
	_, err = parseGenerationRequest(apiCompletions, []byte(`{"model":"m","prompt":[4294967296]}`))
	assert.ErrorContains(t, err, "out of range")
	_, err = parseGenerationRequest(apiChat, []byte(`{"model":"m","messages":[{"role":"user","content":[1]}]}`))
	assert.ErrorContains(t, err, "content parts")
}

func TestMaxTokensFields(t *testing.T) {
	g, err := parseGenerationRequest(apiChat, []byte(`{"model":"m","messages":[{"role":"u","content":"x"}],"max_tokens":5,"max_completion_tokens":9}`))
	require.NoError(t, err)
	assert.Equal(t, 9, g.MaxTokens, "max_completion_tokens wins")
	g, err = parseGenerationRequest(apiCompletions, []byte(`{"model":"m","prompt":"x"}`))
	require.NoError(t, err)
	assert.Equal(t, 0, g.MaxTokens, "unset: the server default applies")
	assert.True(t, g.IncludeUsage)
}

func FuzzParseGenerationRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":3,"stream":true}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[["a"]]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream_options":{"include_usage":false}}`,
		`{"model":"m","prompt":"x","sim_prompt_tokens":-1}`,
		`[]`, `null`, `{"model":1}`,
	} {
		f.Add(false, []byte(s))
		f.Add(true, []byte(s))
	}
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		kind := apiCompletions
		if chat {
			kind = apiChat
		}
		g, err := parseGenerationRequest(kind, body)
		if err != nil {
			if _, ok := err.(*badRequestError); !ok {
				t.Fatalf("error %v is not a badRequestError", err)
			}
			return
		}
		if g.Model == "" || g.PromptTokens < 1 || g.PromptTokens != len(g.Prompt) || g.MaxTokens < 0 {
			t.Fatalf("accepted %q as %+v", body, g)
		}
	})
}
