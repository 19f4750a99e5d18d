package filter

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/tidwall/gjson"

	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// Kind is the OpenAI API a request body belongs to, judged by its fields.
type Kind uint8

const (
	// KindOther: neither "messages" nor "prompt" (e.g. /v1/embeddings with
	// "input"); routed on its model alone.
	KindOther Kind = iota
	// KindCompletion: /v1/completions, with "prompt".
	KindCompletion
	// KindChat: /v1/chat/completions, with "messages".
	KindChat
)

func (k Kind) String() string {
	switch k {
	case KindCompletion:
		return "completion"
	case KindChat:
		return "chat"
	}
	return "other"
}

// Parsed is what the filter needs from a request body. Offsets index the
// body ParseRequest was given.
type Parsed struct {
	// Model is the decoded "model" string: non-empty, bounded, no control
	// characters (config.ValidModelName).
	Model string
	// ModelStart and ModelEnd delimit the raw JSON string token of "model",
	// quotes included: the bytes to replace when rewriting the model.
	ModelStart, ModelEnd int
	// Stream is "stream": true; any other value (false, null, "yes", 1)
	// counts as not streaming for the router's own purposes.
	Stream bool
	Kind   Kind
	// PromptBytes is the raw size of "messages" or "prompt" (0 if absent),
	// for the decision log.
	PromptBytes int
	// Prompt, Messages, Tools and CacheSalt are the raw JSON values of
	// those fields ([start, end) into the body; start < 0 when absent),
	// for prefix hashing.
	Prompt, Messages, Tools, CacheSalt [2]int
	// StreamUsage is "stream_options": {"include_usage": true}: a stream
	// that ends with a usage chunk.
	StreamUsage bool
	// NoEscapes: no string of the body holds a backslash escape, so the
	// body holds no backslash at all (the prefix hasher then looks for
	// quotes alone).
	NoEscapes bool
}

// Raw returns the value of span s in body, nil when absent.
func Raw(body []byte, s [2]int) []byte {
	if s[0] < 0 {
		return nil
	}
	return body[s[0]:s[1]]
}

// Reason names why a body was refused. Its string is the "code" of the
// 400 reply, so clients can tell cases apart without parsing messages.
type Reason string

// The reasons ParseRequest returns; every error it returns carries one.
const (
	ReasonEmptyBody      Reason = "empty_body"
	ReasonInvalidJSON    Reason = "invalid_json"
	ReasonTrailingData   Reason = "trailing_data"
	ReasonTooDeep        Reason = "too_deeply_nested"
	ReasonNotObject      Reason = "not_an_object"
	ReasonMissingModel   Reason = "missing_model"
	ReasonModelNotString Reason = "model_not_a_string"
	ReasonDuplicateKey   Reason = "duplicate_key"
	ReasonEmptyModel     Reason = "empty_model"
	ReasonModelTooLong   Reason = "model_too_long"
	ReasonInvalidModel   Reason = "invalid_model_name"
	ReasonInvalidField   Reason = "invalid_field"
)

// Reasons lists every Reason, for tests and documentation.
var Reasons = []Reason{ReasonEmptyBody, ReasonInvalidJSON, ReasonTrailingData, ReasonTooDeep,
	ReasonNotObject, ReasonMissingModel, ReasonModelNotString, ReasonDuplicateKey, ReasonEmptyModel,
	ReasonModelTooLong, ReasonInvalidModel, ReasonInvalidField}

// RequestError is a body the filter refuses with 400. Msg is safe to send
// back and to log: it never contains the client's bytes unescaped.
type RequestError struct {
	Reason Reason
	Msg    string
}

func (e *RequestError) Error() string { return e.Msg }

// badRequest builds a refusal; ParseRequest's only way to make one.
func badRequest(r Reason, format string, args ...any) *RequestError {
	return &RequestError{Reason: r, Msg: fmt.Sprintf(format, args...)}
}

// The top-level fields the filter reads. "model" decides the route, and
// "prompt" and "messages" what the prompt is: a duplicate of any of them is
// refused, since JSON parsers disagree on which copy wins (Python's json,
// in vLLM, takes the last), and routing on one copy while the server reads
// the other would let a client pick its own adapter or dodge shedding.
// "stream" only informs the router (the decision log), so it is read as
// vLLM reads it: the last copy wins, and any value but true is "not
// streaming" here while the body goes upstream unchanged, for vLLM's own
// (lax) parsing to judge. "tools", "cache_salt" and "stream_options" only
// feed the prefix-cache prediction; the last copy wins, as in vLLM.
const (
	fieldModel = iota
	fieldPrompt
	fieldMessages
	fieldStream // the first field whose last copy wins
	fieldTools
	fieldCacheSalt
	fieldStreamOptions
	numFields
)

var fieldNames = [numFields]string{"model", "prompt", "messages", "stream", "tools", "cache_salt", "stream_options"}

// ParseRequest validates an OpenAI-style request body and extracts what
// routing needs. It is a pure function: the body is strictly validated as
// JSON (and must be an object) before any field is trusted, "model" must be
// a JSON string accepted by config.ValidModelName with maxModelLen, and
// "prompt" and "messages" must have their OpenAI types when present;
// "stream" is read, never refused (see fieldStream). Every error is a *RequestError. The body is never unmarshalled:
// one pass validates it and finds the top-level fields, and only the model
// string is decoded.
func ParseRequest(body []byte, maxModelLen int) (Parsed, error) {
	return parseRequest(body, maxModelLen, nil)
}

// parseRequest is ParseRequest. known, when not nil, returns a string equal
// to an unescaped model name the caller already holds (the configured
// names), so that the usual request allocates nothing for it.
func parseRequest(body []byte, maxModelLen int, known func([]byte) (string, bool)) (Parsed, error) {
	if len(body) == 0 {
		return Parsed{}, badRequest(ReasonEmptyBody, "the request body is empty: expected a JSON object with a \"model\" field")
	}
	var spans [numFields]member
	var seen [numFields]bool
	var dup = -1
	ok, escapes, jerr := scanJSON(body, func(m member) bool {
		f := fieldOf(body, m)
		if f < 0 {
			return true
		}
		if seen[f] && f < fieldStream {
			dup = f
			return false
		}
		seen[f], spans[f] = true, m
		return true
	})
	switch {
	case dup >= 0:
		return Parsed{}, badRequest(ReasonDuplicateKey, "the field %q appears more than once in the request body", fieldNames[dup])
	case jerr != nil:
		switch jerr.kind {
		case jsonTrailing:
			return Parsed{}, badRequest(ReasonTrailingData, "the request body has data after the JSON value (at byte %d)", jerr.offset)
		case jsonTooDeep:
			return Parsed{}, badRequest(ReasonTooDeep, "the request body nests deeper than %d levels", maxJSONDepth)
		}
		return Parsed{}, badRequest(ReasonInvalidJSON, "the request body is not valid JSON (error at byte %d of %d)", jerr.offset, len(body))
	case !ok:
		return Parsed{}, errors.New("unreachable: scan stopped without a reason")
	}
	if body[skipSpace(body, 0)] != '{' {
		return Parsed{}, badRequest(ReasonNotObject, "the request body must be a JSON object")
	}
	if !seen[fieldModel] {
		return Parsed{}, badRequest(ReasonMissingModel, "the request body has no \"model\" field")
	}

	p := Parsed{Prompt: absentSpan, Messages: absentSpan, Tools: absentSpan, CacheSalt: absentSpan, NoEscapes: !escapes}
	m := spans[fieldModel]
	raw := body[m.start:m.end]
	if raw[0] != '"' {
		return Parsed{}, badRequest(ReasonModelNotString, "\"model\" must be a string, not %s", jsonType(raw[0]))
	}
	// A decoded string is at least a sixth of its escaped form (\uXXXX is
	// 6 bytes for at most 3), so a long token is refused before decoding.
	if len(raw)-2 > 6*maxModelLen {
		return Parsed{}, badRequest(ReasonModelTooLong, "\"model\" is longer than %d bytes", maxModelLen)
	}
	escaped := bytes.IndexByte(raw, '\\') >= 0
	var isKnown bool
	if known != nil && !escaped {
		p.Model, isKnown = known(raw[1 : len(raw)-1])
	}
	if !isKnown {
		p.Model = decodeString(raw, escaped)
	}
	p.ModelStart, p.ModelEnd = m.start, m.end
	if err := config.ValidModelName(p.Model, maxModelLen); err != nil {
		switch {
		case errors.Is(err, config.ErrNameEmpty):
			return Parsed{}, badRequest(ReasonEmptyModel, "\"model\" must not be empty")
		case errors.Is(err, config.ErrNameTooLong):
			return Parsed{}, badRequest(ReasonModelTooLong, "\"model\" is longer than %d bytes", maxModelLen)
		}
		// Never echo the name: it holds control characters.
		return Parsed{}, badRequest(ReasonInvalidModel, "\"model\" contains a control character or invalid UTF-8")
	}

	if seen[fieldStream] {
		s := spans[fieldStream]
		p.Stream = string(body[s.start:s.end]) == "true"
	}
	if seen[fieldMessages] {
		s := spans[fieldMessages]
		if body[s.start] != '[' {
			return Parsed{}, badRequest(ReasonInvalidField, "\"messages\" must be an array, not %s", jsonType(body[s.start]))
		}
		p.Kind, p.PromptBytes = KindChat, s.end-s.start
		p.Messages = [2]int{s.start, s.end}
	}
	if seen[fieldPrompt] {
		s := spans[fieldPrompt]
		if c := body[s.start]; c != '"' && c != '[' {
			return Parsed{}, badRequest(ReasonInvalidField, "\"prompt\" must be a string or an array, not %s", jsonType(c))
		}
		if p.Kind == KindOther {
			p.Kind, p.PromptBytes = KindCompletion, s.end-s.start
		}
		p.Prompt = [2]int{s.start, s.end}
	}
	if seen[fieldTools] {
		p.Tools = [2]int{spans[fieldTools].start, spans[fieldTools].end}
	}
	if seen[fieldCacheSalt] && body[spans[fieldCacheSalt].start] == '"' {
		p.CacheSalt = [2]int{spans[fieldCacheSalt].start, spans[fieldCacheSalt].end}
	}
	if seen[fieldStreamOptions] {
		s := spans[fieldStreamOptions]
		p.StreamUsage = includesUsage(body[s.start:s.end])
	}
	return p, nil
}

var absentSpan = [2]int{-1, -1}

// includesUsage reports whether a stream_options value (validated JSON)
// sets "include_usage": true. The value is small; a plain search for the
// key followed by true is enough, since a string value cannot contain an
// unescaped quote.
func includesUsage(v []byte) bool {
	i := bytes.Index(v, includeUsageKey)
	if i < 0 || v[0] != '{' {
		return false
	}
	j := skipSpace(v, i+len(includeUsageKey))
	if j >= len(v) || v[j] != ':' {
		return false
	}
	j = skipSpace(v, j+1)
	return hasLiteral(v, j, "true")
}

var includeUsageKey = []byte(`"include_usage"`)

// fieldOf says which field of interest a member is, or -1.
func fieldOf(body []byte, m member) int {
	key := body[m.keyStart:m.keyEnd]
	if m.keyEscaped {
		// "mod\u0065l" is "model" to every JSON parser: decode before
		// comparing so an escaped duplicate cannot slip through.
		if len(key) > 6*len("stream_options") {
			return -1
		}
		s := gjson.ParseBytes(body[m.keyStart-1 : m.keyEnd+1]).Str
		for f, name := range fieldNames {
			if s == name {
				return f
			}
		}
		return -1
	}
	switch string(key) { // no allocation: the compiler compares in place
	case "model":
		return fieldModel
	case "stream":
		return fieldStream
	case "prompt":
		return fieldPrompt
	case "messages":
		return fieldMessages
	case "tools":
		return fieldTools
	case "cache_salt":
		return fieldCacheSalt
	case "stream_options":
		return fieldStreamOptions
	}
	return -1
}

// decodeString returns the value of a valid JSON string token.
func decodeString(tok []byte, escaped bool) string {
	if !escaped {
		return string(tok[1 : len(tok)-1])
	}
	// gjson decodes escapes (invalid surrogates become U+FFFD, which
	// ValidModelName refuses).
	return gjson.ParseBytes(tok).Str
}

// jsonType names the JSON type of a value from its first byte.
func jsonType(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}
