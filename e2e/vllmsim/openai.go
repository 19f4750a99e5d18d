package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// CharsPerToken is how the simulator estimates prompt tokens from text when
// the request carries no sim_prompt_tokens hint.
const CharsPerToken = 4

// chatTemplateTokens is added per chat message for the role markers a chat
// template wraps around it (Llama-2's [INST] ... [/INST] is a few tokens).
const chatTemplateTokens = 3

// apiKind tells the two OpenAI endpoints apart.
type apiKind int

const (
	apiCompletions apiKind = iota
	apiChat
)

// generationRequest is what the simulator needs from an OpenAI request.
type generationRequest struct {
	Model        string
	PromptTokens int
	// MaxTokens is 0 when the request did not set it.
	MaxTokens int
	Stream    bool
	// IncludeUsage is false only when stream_options.include_usage is
	// explicitly false (see writeStream).
	IncludeUsage bool
}

// openAIBody lists the request fields the simulator reads; others are
// accepted and ignored, as vLLM ignores unknown fields.
type openAIBody struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	// SimPromptTokens overrides the prompt-length estimate (simulator only).
	SimPromptTokens *int `json:"sim_prompt_tokens"`
}

// badRequestError is a client error that becomes a 400 response.
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &badRequestError{msg: fmt.Sprintf(format, args...)}
}

// parseGenerationRequest decodes a /v1/completions or /v1/chat/completions
// body. Errors are *badRequestError.
func parseGenerationRequest(kind apiKind, body []byte) (generationRequest, error) {
	var b openAIBody
	if err := json.Unmarshal(body, &b); err != nil {
		return generationRequest{}, badRequest("invalid JSON body: %v", err)
	}
	if b.Model == "" {
		return generationRequest{}, badRequest("the model field is required")
	}
	if b.N != nil && *b.N != 1 {
		return generationRequest{}, badRequest("n=%d is not supported by the simulator (only n=1)", *b.N)
	}
	g := generationRequest{Model: b.Model, Stream: b.Stream, IncludeUsage: true}
	if b.StreamOptions != nil && b.StreamOptions.IncludeUsage != nil {
		g.IncludeUsage = *b.StreamOptions.IncludeUsage
	}
	var err error
	switch kind {
	case apiCompletions:
		g.PromptTokens, err = completionPromptTokens(b.Prompt)
		if b.MaxTokens != nil {
			g.MaxTokens = *b.MaxTokens
			if g.MaxTokens < 1 {
				return generationRequest{}, badRequest("max_tokens must be at least 1, got %d", g.MaxTokens)
			}
		}
	case apiChat:
		g.PromptTokens, err = chatPromptTokens(b.Messages)
		limit := b.MaxCompletionTokens
		if limit == nil {
			limit = b.MaxTokens
		}
		if limit != nil {
			g.MaxTokens = *limit
			if g.MaxTokens < 1 {
				return generationRequest{}, badRequest("max_completion_tokens must be at least 1, got %d", g.MaxTokens)
			}
		}
	}
	if err != nil {
		return generationRequest{}, err
	}
	if b.SimPromptTokens != nil {
		if *b.SimPromptTokens < 1 {
			return generationRequest{}, badRequest("sim_prompt_tokens must be at least 1, got %d", *b.SimPromptTokens)
		}
		g.PromptTokens = *b.SimPromptTokens
	}
	return g, nil
}

// estimateTokens is ⌈chars/CharsPerToken⌉, at least 1.
func estimateTokens(chars int) int {
	return max(1, (chars+CharsPerToken-1)/CharsPerToken)
}

// completionPromptTokens accepts a string, a list of token ids, or a
// one-element list of either (vLLM also takes batches; the simulator does
// not).
func completionPromptTokens(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, badRequest("the prompt field is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return estimateTokens(utf8.RuneCountInString(s)), nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return 0, badRequest("prompt must not be empty")
		}
		return len(ids), nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return 0, badRequest("batched prompts (%d) are not supported by the simulator", len(list))
		}
		var inner []json.RawMessage
		if json.Unmarshal(list[0], &inner) == nil || json.Unmarshal(list[0], &s) == nil {
			return completionPromptTokens(list[0])
		}
	}
	return 0, badRequest("prompt must be a string, a list of token ids, or a one-element list of those")
}

// chatPromptTokens estimates the tokens of the messages after the chat
// template: their text plus a few tokens per message.
func chatPromptTokens(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, badRequest("the messages field is required")
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return 0, badRequest("messages must be a list of {role, content}: %v", err)
	}
	if len(msgs) == 0 {
		return 0, badRequest("messages must not be empty")
	}
	chars := 0
	for i, m := range msgs {
		if m.Role == "" {
			return 0, badRequest("messages[%d].role is required", i)
		}
		n, err := contentChars(m.Content)
		if err != nil {
			return 0, badRequest("messages[%d].content: %v", i, err)
		}
		chars += n
	}
	return estimateTokens(chars) + chatTemplateTokens*len(msgs), nil
}

// contentChars counts the text of a message content: a string, or a list of
// parts of which the text parts count.
func contentChars(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil // assistant messages with tool calls have no content
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return utf8.RuneCountInString(s), nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, errors.New("must be a string or a list of content parts")
	}
	n := 0
	for _, p := range parts {
		if p.Type == "text" {
			n += utf8.RuneCountInString(p.Text)
		}
	}
	return n, nil
}

// tokenWords is the text the simulator "generates": token i is
// tokenWords[i%len]. Deterministic so tests can check streams arrive intact.
var tokenWords = [...]string{" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."}

// TokenText is the text of the i-th generated token (from 0).
func TokenText(i int) string { return tokenWords[i%len(tokenWords)] }

// GeneratedText is the full text of a response of n tokens.
func GeneratedText(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(TokenText(i))
	}
	return b.String()
}

// OpenAI-shaped response bodies.

type usageInfo struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason"`
}

type responseBody struct {
	ID      string     `json:"id"`
	Object  string     `json:"object"`
	Created int64      `json:"created"`
	Model   string     `json:"model"`
	Choices any        `json:"choices"`
	Usage   *usageInfo `json:"usage,omitempty"`
}

// errorBody is vLLM's ErrorResponse (vllm/entrypoints/openai/protocol.py):
// {"error": {"message", "type", "param", "code"}} with code the HTTP status.
type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}
