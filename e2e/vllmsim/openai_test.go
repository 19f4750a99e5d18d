package vllmsim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPromptTokenEstimate(t *testing.T) {
	tests := []struct {
		kind apiKind
		body string
		want int
	}{
		{apiCompletions, `{"model":"m","prompt":"abcd"}`, 1},
		{apiCompletions, `{"model":"m","prompt":"abcde"}`, 2},
		{apiCompletions, `{"model":"m","prompt":""}`, 1},
		{apiCompletions, `{"model":"m","prompt":"ééééé"}`, 2}, // runes, not bytes
		{apiCompletions, `{"model":"m","prompt":[5,6,7]}`, 3},
		{apiCompletions, `{"model":"m","prompt":["abcdefgh"]}`, 2},
		{apiCompletions, `{"model":"m","prompt":[[1,2]]}`, 2},
		{apiCompletions, `{"model":"m","prompt":"abcd","sim_prompt_tokens":77}`, 77},
		{apiChat, `{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}`, 2 + 3},
		{apiChat, `{"model":"m","messages":[{"role":"assistant","content":null},{"role":"user","content":[{"type":"image_url"},{"type":"text","text":"abcd"}]}]}`, 1 + 6},
	}
	for _, tc := range tests {
		g, err := parseGenerationRequest(tc.kind, []byte(tc.body))
		require.NoError(t, err, tc.body)
		assert.Equal(t, tc.want, g.PromptTokens, tc.body)
	}
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
		if g.Model == "" || g.PromptTokens < 1 || g.MaxTokens < 0 {
			t.Fatalf("accepted %q as %+v", body, g)
		}
	})
}
