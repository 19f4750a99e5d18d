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

var jsonContentType = [][2]string{{"content-type", "application/json"}}

// sendError sends a local reply with an OpenAI-style JSON error body.
func sendError(status uint32, details, typ, code, msg string) {
	if err := proxywasm.SendHttpResponseWithDetails(status, details, jsonContentType, errorBody(msg, typ, code), -1); err != nil {
		proxywasm.LogErrorf("wasm-epp: cannot send the %d reply: %v", status, err)
	}
}
