package filter

import (
	"encoding/binary"
	"math/bits"
)

// This file is a strict, iterative JSON validator (RFC 8259, what
// encoding/json.Valid accepts) that also reports the members of the
// top-level object in the same pass.
//
// Why not gjson.ValidBytes: it recurses once per nesting level, so a 1 MiB
// body of "[" grows the goroutine stack to ~128 MiB before failing (measured)
// — inside every Envoy worker VM that receives it. This scanner keeps its
// container stack in a fixed bitset and refuses nesting deeper than
// maxJSONDepth, and because it already walks every byte it hands back the
// top-level members, so the request path never walks the body twice.

// maxJSONDepth bounds nesting. Real chat requests (tool schemas included)
// stay far below it; Python's json module, which vLLM uses, gives up near
// 1000 levels anyway.
const maxJSONDepth = 512

// jsonErrorKind says why a document is not acceptable JSON.
type jsonErrorKind uint8

const (
	jsonSyntax   jsonErrorKind = iota + 1 // not JSON, or truncated
	jsonTrailing                          // a complete value followed by more data
	jsonTooDeep                           // nested deeper than maxJSONDepth
)

// jsonError locates the first problem.
type jsonError struct {
	kind   jsonErrorKind
	offset int
}

// member is one key/value pair of the top-level object: [keyStart, keyEnd)
// is the raw key between its quotes (escapes not decoded), [start, end) the
// raw value token.
type member struct {
	keyStart, keyEnd int
	keyEscaped       bool
	start, end       int
	pending          bool // key seen, value not finished yet
}

// scanJSON validates doc and calls onMember for every member of the
// top-level object, in document order (nothing when the top level is not an
// object). onMember may return false to abandon the scan early; the result
// is then (false, false, nil) and the document is not fully validated.
// escapes reports whether any string (key or value) held a backslash
// escape: a valid document without one holds no backslash at all, which
// the prefix hasher can use.
func scanJSON(doc []byte, onMember func(m member) bool) (ok, escapes bool, err *jsonError) {
	// stack holds one bit per open container: 1 object, 0 array.
	var stack [maxJSONDepth / 64]uint64
	depth := 0
	isObject := func() bool { return stack[(depth-1)/64]&(1<<((depth-1)%64)) != 0 }
	push := func(obj bool) bool {
		if depth == maxJSONDepth {
			return false
		}
		w, b := depth/64, uint(depth%64)
		if obj {
			stack[w] |= 1 << b
		} else {
			stack[w] &^= 1 << b
		}
		depth++
		return true
	}

	n := len(doc)
	i := skipSpace(doc, 0)
	// The current top-level member, recorded when depth == 1 in an object.
	var cur member
	topObject := i < n && doc[i] == '{'

	// Each iteration parses one value at i, then handles what follows it.
	for {
		i = skipSpace(doc, i)
		if i >= n {
			return fail3(jsonSyntax, i)
		}
		switch c := doc[i]; {
		case c == '{':
			if !push(true) {
				return fail3(jsonTooDeep, i)
			}
			i = skipSpace(doc, i+1)
			if i < n && doc[i] == '}' {
				depth--
				i++
				break // an empty object is a complete value
			}
			var e *jsonError
			if i, e = scanKey(doc, i, depth == 1 && topObject, &cur, &escapes); e != nil {
				return false, false, e
			}
			continue // the member's value comes next
		case c == '[':
			if !push(false) {
				return fail3(jsonTooDeep, i)
			}
			i = skipSpace(doc, i+1)
			if i < n && doc[i] == ']' {
				depth--
				i++
				break // an empty array is a complete value
			}
			continue // the first element comes next
		case c == '"':
			end, esc := scanString(doc, i+1)
			escapes = escapes || esc
			if end < 0 {
				return fail3(jsonSyntax, -end-1)
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			end := scanNumber(doc, i)
			if end < 0 {
				return fail3(jsonSyntax, -end-1)
			}
			i = end
		case c == 't':
			if !hasLiteral(doc, i, "true") {
				return fail3(jsonSyntax, i)
			}
			i += 4
		case c == 'f':
			if !hasLiteral(doc, i, "false") {
				return fail3(jsonSyntax, i)
			}
			i += 5
		case c == 'n':
			if !hasLiteral(doc, i, "null") {
				return fail3(jsonSyntax, i)
			}
			i += 4
		default:
			return fail3(jsonSyntax, i)
		}

		// A value ended at i. Close containers and find the next value.
		for {
			if depth == 1 && topObject && cur.pending {
				cur.end = i
				cur.pending = false
				if !onMember(cur) {
					return false, escapes, nil
				}
			}
			if depth == 0 {
				i = skipSpace(doc, i)
				if i != n {
					return fail3(jsonTrailing, i)
				}
				return true, escapes, nil
			}
			i = skipSpace(doc, i)
			if i >= n {
				return fail3(jsonSyntax, i)
			}
			c := doc[i]
			if c == ',' {
				i = skipSpace(doc, i+1)
				if isObject() {
					var e *jsonError
					if i, e = scanKey(doc, i, depth == 1 && topObject, &cur, &escapes); e != nil {
						return false, false, e
					}
				}
				break // parse the next value
			}
			if (c == '}' && isObject()) || (c == ']' && !isObject()) {
				depth--
				i++
				continue // the container is a value that just ended
			}
			return fail3(jsonSyntax, i)
		}
	}
}

// fail3 is a failed scan of scanJSON.
func fail3(kind jsonErrorKind, at int) (bool, bool, *jsonError) {
	return false, false, &jsonError{kind: kind, offset: at}
}

// scanKey parses `"key" :` at i (which is past any whitespace) and returns
// the offset after the colon and its whitespace, where the value starts. When
// record is set it fills cur with the key and the value's start.
func scanKey(doc []byte, i int, record bool, cur *member, escapes *bool) (int, *jsonError) {
	n := len(doc)
	if i >= n || doc[i] != '"' {
		return 0, &jsonError{kind: jsonSyntax, offset: i}
	}
	end, escaped := scanString(doc, i+1)
	if end < 0 {
		return 0, &jsonError{kind: jsonSyntax, offset: -end - 1}
	}
	*escapes = *escapes || escaped
	keyStart, keyEnd := i+1, end-1
	i = skipSpace(doc, end)
	if i >= n || doc[i] != ':' {
		return 0, &jsonError{kind: jsonSyntax, offset: i}
	}
	i = skipSpace(doc, i+1)
	if record {
		*cur = member{keyStart: keyStart, keyEnd: keyEnd, keyEscaped: escaped, start: i, pending: true}
	}
	return i, nil
}

func skipSpace(doc []byte, i int) int {
	for i < len(doc) {
		switch doc[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func hasLiteral(doc []byte, i int, lit string) bool {
	return len(doc)-i >= len(lit) && string(doc[i:i+len(lit)]) == lit
}

// scanString scans a string body starting just after the opening quote. It
// returns the offset just past the closing quote and whether the string
// holds escapes, or -(offset+1) of the first invalid byte.
func scanString(doc []byte, i int) (int, bool) {
	escaped := false
	for i < len(doc) {
		// Skip plain bytes 64, then 8 at a time: most of a chat body is
		// string content, and a Wasm guest pays dearly per loop iteration
		// (Go's wasm code goes through a jump table on every back edge)
		// and per call, so the 64-byte step is written out (specialWord
		// inlines; its results are or-ed and masked once).
		for i+64 <= len(doc) {
			b := (*[64]byte)(doc[i : i+64])
			if (specialWord(binary.LittleEndian.Uint64(b[0:8]))|specialWord(binary.LittleEndian.Uint64(b[8:16]))|
				specialWord(binary.LittleEndian.Uint64(b[16:24]))|specialWord(binary.LittleEndian.Uint64(b[24:32]))|
				specialWord(binary.LittleEndian.Uint64(b[32:40]))|specialWord(binary.LittleEndian.Uint64(b[40:48]))|
				specialWord(binary.LittleEndian.Uint64(b[48:56]))|specialWord(binary.LittleEndian.Uint64(b[56:64])))&highBits != 0 {
				break
			}
			i += 64
		}
		for i+8 <= len(doc) {
			if m := specialBits(binary.LittleEndian.Uint64(doc[i:])); m != 0 {
				// The lowest flagged byte is a real one (flags only spread
				// upwards): go straight to it, not a byte at a time back
				// through the loops above.
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(doc) {
			break
		}
		c := doc[i]
		switch {
		case c == '"':
			return i + 1, escaped
		case c == '\\':
			escaped = true
			if i+1 >= len(doc) {
				return -(len(doc) + 1), escaped
			}
			switch doc[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(doc)-i < 6 || !isHex(doc[i+2]) || !isHex(doc[i+3]) || !isHex(doc[i+4]) || !isHex(doc[i+5]) {
					return -(i + 1), escaped
				}
				i += 6
			default:
				return -(i + 2), escaped
			}
		case c < 0x20:
			return -(i + 1), escaped
		default:
			i++
		}
	}
	return -(len(doc) + 1), escaped
}

// specialBits is non-zero when any of the eight bytes in x (little-endian)
// is a quote, a backslash or a control character (< 0x20): the bytes that
// end the plain run of a string. The classic "has zero byte" bit trick: it
// never misses such a byte; it may flag extra ones after a real one, which
// only sends that word to the byte-wise path. Non-zero results of several
// words can be or-ed to test them at once.
func specialBits(x uint64) uint64 { return specialWord(x) & highBits }

// highBits is the high bit of every byte of a word.
const highBits = 0x8080808080808080

// specialWord is specialBits before its mask: only the high bit of each
// byte says anything. For a byte below 0x80 the subtractions borrow into
// its high bit only at a quote (q zero), a backslash (b zero) or a control
// character (below 0x20), or after one; for a byte at or above 0x80, q, b
// and x all have the high bit, which the last and clears.
func specialWord(x uint64) uint64 {
	const ones = 0x0101010101010101
	q := x ^ (ones * '"')
	b := x ^ (ones * '\\')
	return ((q - ones) | (b - ones) | (x - ones*0x20)) &^ (q & b & x)
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// scanNumber scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at i and
// returns the offset after it, or -(offset+1) of the first invalid byte.
func scanNumber(doc []byte, i int) int {
	n := len(doc)
	if doc[i] == '-' {
		i++
	}
	switch {
	case i < n && doc[i] == '0':
		i++
	case i < n && doc[i] >= '1' && doc[i] <= '9':
		for i < n && doc[i] >= '0' && doc[i] <= '9' {
			i++
		}
	default:
		return -(i + 1)
	}
	if i < n && doc[i] == '.' {
		i++
		if i >= n || doc[i] < '0' || doc[i] > '9' {
			return -(i + 1)
		}
		for i < n && doc[i] >= '0' && doc[i] <= '9' {
			i++
		}
	}
	if i < n && (doc[i] == 'e' || doc[i] == 'E') {
		i++
		if i < n && (doc[i] == '+' || doc[i] == '-') {
			i++
		}
		if i >= n || doc[i] < '0' || doc[i] > '9' {
			return -(i + 1)
		}
		for i < n && doc[i] >= '0' && doc[i] <= '9' {
			i++
		}
	}
	return i
}

// special8 reports whether specialBits flags any byte of x.
func special8(x uint64) bool { return specialBits(x) != 0 }
