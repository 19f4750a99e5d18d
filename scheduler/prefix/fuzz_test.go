package prefix

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// FuzzHash feeds any bytes to both renderers: the filter only hands them
// validated JSON, but nothing may panic or loop on other bytes, MaxBlocks
// holds, and on valid JSON the hashes do not depend on insignificant
// whitespace, nor on "role" and "content" being written with an escape
// (which takes the member iterator instead of the plain role-then-content
// path).
func FuzzHash(f *testing.F) {
	for _, s := range []string{
		`[{"role":"user","content":"hi"}]`, `[{"role":"system","content":"a"},{"content":"b","role":"user"},{"role":"user","name":"n","content":"c","role":"x"}]`,
		`[{"role":"user","content":[{"type":"text","text":"a\u00e9\ud83d\ude00"},{"type":"image_url","image_url":{"url":"data:x"}}]}]`,
		`[{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"42"}]`,
		`[{"role":"user","content": "spaced value"},{"role":"user","content":"x","name":"n"},{"role":"user" ,"content":"y"}]`,
		`[{"role":"system","content":"0123456789012345678901234567890123456789012345678901234567890123456789\"q\"0123456789012345678901234567890123456789012345678901234567890123456789"}]`,
		`[{"role":"user","content":"` + strings.Repeat("plain text without any escape. ", 9) + `"},{"role":"user","content":"` + strings.Repeat("more: ", 30) + `"}]`,
		`"` + strings.Repeat("a prompt string that is long enough. ", 8) + `"`,
		`"plain prompt"`, `[1,2,3]`, `[[1,2],[3]]`, `["a","b"]`, `[`, `"\u12`, `[{"role":"u","content":[{"type":"x","v":[[[[]]]]}]}]`,
	} {
		f.Add([]byte(s))
	}
	h, err := NewHasher(HashConfig{BlockBytes: 8, MaxBlocks: 64})
	if err != nil {
		f.Fatal(err)
	}
	// The default 64-byte blocks take the one-pass block loop for long
	// strings: the same checks with it.
	h64, err := NewHasher(HashConfig{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkChatForms(t, h64, data)
		errChat := h.HashMessages("m", nil, nil, data)
		chat := slices.Clone(h.Blocks())
		errPrompt := h.HashPrompt("m", nil, data)
		prompt := slices.Clone(h.Blocks())
		if len(chat) > 64 || len(prompt) > 64 {
			t.Fatalf("%d and %d blocks, over MaxBlocks 64", len(chat), len(prompt))
		}
		if !json.Valid(data) {
			return
		}
		spaced := spaceOut(data)
		if !json.Valid(spaced) {
			t.Fatalf("spaceOut broke the JSON: %q", spaced)
		}
		errChat2 := h.HashMessages("m", nil, nil, spaced)
		if (errChat == nil) != (errChat2 == nil) || (errChat == nil && !slices.Equal(chat, h.Blocks())) {
			t.Fatalf("messages: whitespace changed the result: %v/%v\n%q\n%q", errChat, errChat2, data, spaced)
		}
		escaped := bytes.ReplaceAll(bytes.ReplaceAll(data, []byte(`"role"`), []byte(`"rol\u0065"`)), []byte(`"content"`), []byte(`"conten\u0074"`))
		errChat3 := h.HashMessages("m", nil, nil, escaped)
		if (errChat == nil) != (errChat3 == nil) || (errChat == nil && !slices.Equal(chat, h.Blocks())) {
			t.Fatalf("messages: escaped keys changed the result: %v/%v\n%q\n%q", errChat, errChat3, data, escaped)
		}
		errPrompt2 := h.HashPrompt("m", nil, spaced)
		if (errPrompt == nil) != (errPrompt2 == nil) || (errPrompt == nil && !slices.Equal(prompt, h.Blocks())) {
			t.Fatalf("prompt: whitespace changed the result: %v/%v\n%q\n%q", errPrompt, errPrompt2, data, spaced)
		}
	})
}

// checkChatForms checks that a chat's hashes do not depend on whitespace
// nor on escaped "role" and "content" keys (the compact, general and
// member-iterator paths of writeMessage).
func checkChatForms(t *testing.T, h *Hasher, data []byte) {
	t.Helper()
	err := h.HashMessages("m", nil, nil, data)
	want := slices.Clone(h.Blocks())
	if !json.Valid(data) {
		return
	}
	escaped := bytes.ReplaceAll(bytes.ReplaceAll(data, []byte(`"role"`), []byte(`"rol\u0065"`)), []byte(`"content"`), []byte(`"conten\u0074"`))
	for _, other := range [][]byte{spaceOut(data), escaped} {
		err2 := h.HashMessages("m", nil, nil, other)
		if (err == nil) != (err2 == nil) || (err == nil && !slices.Equal(want, h.Blocks())) {
			t.Fatalf("messages (%d-byte blocks): the form changed the result: %v/%v\n%q\n%q", h.cfg.BlockBytes, err, err2, data, other)
		}
	}
	// Told that there is no backslash (as the filter's parser says of a
	// body without one), the hasher looks for quotes alone: the same
	// hashes, for a chat and a prompt.
	if !bytes.Contains(data, []byte{'\\'}) {
		errPrompt := h.HashPrompt("m", nil, data)
		prompt := slices.Clone(h.Blocks())
		h.SetNoEscapes(true)
		defer h.SetNoEscapes(false)
		err2 := h.HashMessages("m", nil, nil, data)
		if (err == nil) != (err2 == nil) || (err == nil && !slices.Equal(want, h.Blocks())) {
			t.Fatalf("messages (%d-byte blocks): no-escape scanning changed the result: %v/%v\n%q", h.cfg.BlockBytes, err, err2, data)
		}
		errPrompt2 := h.HashPrompt("m", nil, data)
		if (errPrompt == nil) != (errPrompt2 == nil) || (errPrompt == nil && !slices.Equal(prompt, h.Blocks())) {
			t.Fatalf("prompt (%d-byte blocks): no-escape scanning changed the result: %v/%v\n%q", h.cfg.BlockBytes, errPrompt, errPrompt2, data)
		}
	}
}

// spaceOut inserts a space after every structural character outside
// strings of valid JSON.
func spaceOut(data []byte) []byte {
	out := make([]byte, 0, 2*len(data)+1)
	out = append(out, ' ')
	inString, escaped := false, false
	for _, c := range data {
		out = append(out, c)
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString:
		case c == '"':
			inString = true
		case c == ',' || c == ':' || c == '[' || c == '{':
			out = append(out, ' ', '\n')
		}
	}
	return out
}
