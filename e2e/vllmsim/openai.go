package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// apiKind tells the two OpenAI endpoints apart.
type apiKind int

const (
	apiCompletions apiKind = iota
	apiChat
)

// generationRequest is what the simulator needs from an OpenAI request.
type generationRequest struct {
	Model string
	// Prompt is the prompt as token ids (see tokens.go for the rule);
	// PromptTokens is its length.
	Prompt       []uint32
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
	// SimPromptTokens overrides the prompt length (simulator only): the
	// text's tokens are cut to that length or padded with filler tokens.
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
		g.Prompt, err = completionPrompt(b.Prompt)
		if b.MaxTokens != nil {
			g.MaxTokens = *b.MaxTokens
			if g.MaxTokens < 1 {
				return generationRequest{}, badRequest("max_tokens must be at least 1, got %d", g.MaxTokens)
			}
		}
	case apiChat:
		g.Prompt, err = chatPrompt(b.Messages)
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
		n := *b.SimPromptTokens
		if n < 1 {
			return generationRequest{}, badRequest("sim_prompt_tokens must be at least 1, got %d", n)
		}
		if n > maxBodyBytes {
			return generationRequest{}, badRequest("sim_prompt_tokens %d is larger than any request the simulator takes", n)
		}
		if n < len(g.Prompt) {
			g.Prompt = g.Prompt[:n]
		}
		for i := len(g.Prompt); i < n; i++ {
			g.Prompt = append(g.Prompt, fillerToken(i))
		}
	}
	if len(g.Prompt) == 0 {
		// An empty text still costs the tokenizer's BOS token.
		g.Prompt = append(g.Prompt, fillerToken(0))
	}
	g.PromptTokens = len(g.Prompt)
	return g, nil
}

// completionPrompt accepts a string, a list of token ids, or a one-element
// list of either (vLLM also takes batches; the simulator does not).
func completionPrompt(raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("the prompt field is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return TextTokens(nil, s), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return nil, badRequest("prompt must not be empty")
		}
		out := make([]uint32, len(ids))
		for i, id := range ids {
			if id < 0 || id > math.MaxUint32 {
				return nil, badRequest("prompt token id %d at position %d is out of range", id, i)
			}
			out[i] = uint32(id)
		}
		return out, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return nil, badRequest("batched prompts (%d) are not supported by the simulator", len(list))
		}
		var inner []json.RawMessage
		if json.Unmarshal(list[0], &inner) == nil || json.Unmarshal(list[0], &s) == nil {
			return completionPrompt(list[0])
		}
	}
	return nil, badRequest("prompt must be a string, a list of token ids, or a one-element list of those")
}

// chatPrompt renders the messages with the simulator's chat template
// (RenderChat) and tokenizes the result.
func chatPrompt(raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("the messages field is required")
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badRequest("messages must be a list of {role, content}: %v", err)
	}
	if len(msgs) == 0 {
		return nil, badRequest("messages must not be empty")
	}
	rendered := make([]ChatMessage, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("messages[%d].role is required", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		rendered[i] = ChatMessage{Role: m.Role, Content: text}
	}
	return TextTokens(nil, RenderChat(rendered)), nil
}

// contentText flattens a message content for the template: a string as is;
// a list of parts as the text parts' text, with every other part (an image,
// audio) as "<|type|>" and its JSON, so that different media give different
// tokens and the same media the same ones.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil // assistant messages with tool calls have no content
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or a list of content parts")
	}
	var b strings.Builder
	for _, raw := range parts {
		var p struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return "", errors.New("content parts must be objects with a type")
		}
		if p.Type == "text" {
			b.WriteString(p.Text)
			continue
		}
		b.WriteString("<|")
		b.WriteString(p.Type)
		b.WriteString("|>")
		b.Write(raw)
	}
	return b.String(), nil
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
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// promptTokensDetails is vLLM's PromptTokenUsageInfo, sent with
// --enable-prompt-tokens-details.
type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
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
