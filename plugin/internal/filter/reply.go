package filter

import (
	"unicode/utf8"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// errorBody renders {"error":{"message":…,"type":…,"code":…}}, OpenAI's
// error shape, escaping every string as JSON.
func errorBody(msg, typ, code string) []byte {
	b := make([]byte, 0, len(msg)+len(typ)+len(code)+48)
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"code":`...)
	b = appendJSONString(b, code)
	return append(b, "}}"...)
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// localReply is how the router answers a request it does not route: the
// table in doc.go.
type localReply struct {
	status uint32
	// details is the response code details (access log
	// %RESPONSE_CODE_DETAILS%).
	details string
	typ     string
	// code is the error code; a bad request's is its Reason.
	code string
}

var localReplies = [numOutcomes]localReply{
	outBadRequest:   {400, "wasm_epp_bad_request", "invalid_request_error", ""},
	outUnknownModel: {404, "wasm_epp_unknown_model", "invalid_request_error", "model_not_found"},
	outTooLarge:     {413, "wasm_epp_too_large", "invalid_request_error", "request_too_large"},
	outDropped:      {429, "wasm_epp_dropped", "rate_limit_error", "capacity_exhausted"},
	outNoEndpoint:   {503, "wasm_epp_no_endpoint", "service_unavailable", "no_endpoint"},
	outInternal:     {500, "wasm_epp_internal_error", "server_error", "internal_error"},
	outExpired:      {429, "wasm_epp_queue_expired", "rate_limit_error", "capacity_exhausted"},
}

var jsonContentType = [][2]string{{"content-type", "application/json"}}

// sendLocalReply sends outcome o's local reply with an OpenAI-style JSON
// error body; code, when not empty, replaces the outcome's error code.
func sendLocalReply(o outcome, code, msg string) {
	rp := localReplies[o]
	if code == "" {
		code = rp.code
	}
	if err := proxywasm.SendHttpResponseWithDetails(rp.status, rp.details, jsonContentType, errorBody(msg, rp.typ, code), -1); err != nil {
		proxywasm.LogErrorf("wasm-epp: cannot send the %d reply: %v", rp.status, err)
	}
}
