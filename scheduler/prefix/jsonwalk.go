package prefix

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unicode/utf8"
)

// This file walks JSON values the request parser has already validated
// (strictly: the filter's scanner runs before anything reads fields). It
// never recurses, so nesting depth costs nothing, and on bytes that are not
// valid JSON it returns errTruncated or ErrMessageShape/ErrPromptShape
// rather than panic (fuzzed: FuzzHash).

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

// quoteOrBackslash is non-zero when one of the eight bytes of x
// (little-endian) is '"' or '\\' (the "has zero byte" trick; it may flag
// bytes after a real one, which only sends that word to the byte loop).
func quoteOrBackslash(x uint64) uint64 { return specialWord(x) & 0x8080808080808080 }

// specialWord is quoteOrBackslash before its mask: the high bit of each
// byte of the result, and only that bit, says the byte may be a quote or
// a backslash, so results of several words can be or-ed and masked once.
// For a byte below 0x80 the subtractions borrow into the high bit only at
// a zero byte of q or b (or after one); for a byte at or above 0x80, q and
// b both have the high bit, which the last and clears.
func specialWord(x uint64) uint64 {
	const ones = 0x0101010101010101
	q := x ^ (ones * '"')
	b := x ^ (ones * '\\')
	return ((q - ones) | (b - ones)) &^ (q & b)
}

// plainRun returns the end of the run of bytes from i that are neither a
// quote nor a backslash.
func plainRun(doc []byte, i int) int {
	for i+32 <= len(doc) {
		w := doc[i : i+32 : i+32]
		if quoteOrBackslash(binary.LittleEndian.Uint64(w))|quoteOrBackslash(binary.LittleEndian.Uint64(w[8:]))|
			quoteOrBackslash(binary.LittleEndian.Uint64(w[16:]))|quoteOrBackslash(binary.LittleEndian.Uint64(w[24:])) != 0 {
			break
		}
		i += 32
	}
	for i+8 <= len(doc) {
		if m := quoteOrBackslash(binary.LittleEndian.Uint64(doc[i:])); m != 0 {
			// The lowest flagged byte is a real quote or backslash (flags
			// only spread upwards): no byte loop, which in a Wasm guest
			// cost more than the words before it.
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(doc) && doc[i] != '"' && doc[i] != '\\' {
		i++
	}
	return i
}

// skipString returns the offset past the string token at doc[i] == '"'.
func skipString(doc []byte, i int) (int, error) {
	i++
	for {
		i = plainRun(doc, i)
		if i >= len(doc) {
			return 0, errTruncated
		}
		if doc[i] == '"' {
			return i + 1, nil
		}
		i += 2 // an escape: the next byte cannot end the string
	}
}

// skipValue returns the offset past the value starting at doc[i].
func skipValue(doc []byte, i int) (int, error) {
	if i >= len(doc) {
		return 0, errTruncated
	}
	switch doc[i] {
	case '"':
		return skipString(doc, i)
	case '{', '[':
	default: // a number or a literal
		j := i
		for j < len(doc) {
			if c := doc[j]; c == ',' || c == ']' || c == '}' || c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				break
			}
			j++
		}
		if j == i {
			return 0, errTruncated
		}
		return j, nil
	}
	depth := 0
	for i < len(doc) {
		switch doc[i] {
		case '"':
			end, err := skipString(doc, i)
			if err != nil {
				return 0, err
			}
			i = end
		case '{', '[':
			depth++
			i++
		case '}', ']':
			depth--
			i++
			if depth == 0 {
				return i, nil
			}
		default:
			i++
		}
	}
	return 0, errTruncated
}

// members iterates over the members of the object at doc[i] == '{'
// (newMembers). next returns each key (decoded into kbuf when short and
// escaped; a longer key is passed raw: no field of interest is that long)
// and where its value starts; the caller then either calls value, or
// consumes the value itself and calls consumed with the offset past it.
// After the loop, err is the first problem, or end is the offset past the
// object. The key buffer is the caller's (the Hasher's): an iterator is
// made per message and per content part, and in a Wasm guest clearing
// and copying a buffer inside it cost more than the rest of a short
// message's rendering.
type members struct {
	doc  []byte
	i    int
	end  int
	err  error
	kbuf *[64]byte
}

func newMembers(doc []byte, i int, kbuf *[64]byte) members {
	return members{doc: doc, i: i + 1, kbuf: kbuf}
}

func (m *members) next() (key []byte, start int, ok bool) {
	doc := m.doc
	for {
		m.i = skipSpace(doc, m.i)
		if m.i >= len(doc) {
			m.err = errTruncated
			return nil, 0, false
		}
		switch doc[m.i] {
		case '}':
			m.end = m.i + 1
			return nil, 0, false
		case ',':
			m.i++
			continue
		case '"':
		default:
			m.err = ErrMessageShape
			return nil, 0, false
		}
		// A key without escapes (nearly all) ends at the first quote.
		kend := plainRun(doc, m.i+1)
		if kend < len(doc) && doc[kend] == '"' {
			key, kend = doc[m.i+1:kend], kend+1
		} else {
			var err error
			if kend, err = skipString(doc, m.i); err != nil {
				m.err = err
				return nil, 0, false
			}
			key = doc[m.i+1 : kend-1]
			if dec, ok := decodeSmall(doc[m.i:kend], m.kbuf[:0]); ok {
				key = dec
			}
		}
		i := skipSpace(doc, kend)
		if i >= len(doc) || doc[i] != ':' {
			m.err = errTruncated
			return nil, 0, false
		}
		i = skipSpace(doc, i+1)
		if i >= len(doc) {
			m.err = errTruncated
			return nil, 0, false
		}
		m.i = i
		return key, i, true
	}
}

// value skips the current member's value and returns its span.
func (m *members) value() (span, bool) {
	end, err := skipValue(m.doc, m.i)
	if err != nil {
		m.err = err
		return span{}, false
	}
	v := span{m.i, end}
	m.i = end
	return v, true
}

// consumed moves past a value the caller read itself.
func (m *members) consumed(end int) { m.i = end }

// decodeSmall decodes the JSON string token tok into dst (capacity 64)
// when it has escapes and decodes to at most 64 bytes; ok is false
// otherwise.
func decodeSmall(tok []byte, dst []byte) ([]byte, bool) {
	body := tok[1 : len(tok)-1]
	if len(body) > 6*64 || plainRun(body, 0) == len(body) {
		return nil, false
	}
	var esc [utf8.UTFMax]byte
	for i := 0; i < len(body); {
		j := plainRun(body, i)
		dst = append(dst, body[i:j]...)
		if j >= len(body) {
			break
		}
		n, used := unescape(body, j, &esc)
		if used == 0 {
			return nil, false
		}
		dst = append(dst, esc[:n]...)
		i = j + used
		if len(dst) > 64 {
			return nil, false
		}
	}
	return dst, len(dst) <= 64
}

// writeString writes the decoded text of the string token at doc[i] ==
// '"' and returns the offset past it.
func (h *Hasher) writeString(doc []byte, i int) (int, error) {
	if h.full {
		end, err := skipString(doc, i)
		if err == nil {
			h.bytes += end - i - 2 // an estimate: escapes counted raw
		}
		return end, err
	}
	i++
	// A short plain string (a role, a name, most keys' values) is one
	// scan and one write; plainBlocks is for the long ones.
	j := plainRun(doc[:min(len(doc), i+64)], i)
	if j < len(doc) && doc[j] == '"' {
		h.Write(doc[i:j])
		return j + 1, nil
	}
	plainTo := j // doc[i:j] holds no quote and no backslash
	var esc [utf8.UTFMax]byte
	for {
		if h.cfg.BlockBytes == 64 {
			i = h.plainBlocks(doc, i, plainTo)
		}
		j := plainRun(doc, i)
		if j > i {
			h.Write(doc[i:j])
		}
		if j >= len(doc) {
			return 0, errTruncated
		}
		if doc[j] == '"' {
			return j + 1, nil
		}
		n, used := unescape(doc, j, &esc)
		if used == 0 {
			return 0, errTruncated
		}
		h.Write(esc[:n])
		i = j + used
	}
}

// plainBlocks hashes whole 64-byte blocks of plain string bytes (no quote,
// no backslash) from doc[i] in the same pass that checks them, and returns
// where it stopped: at the first block holding a quote or a backslash, or
// with less than a block left. A block the hasher has partly filled is
// completed first (doc[i:plainTo] is known to be plain: not scanned
// again). Scanning for the string's end and hashing were two passes over
// a prompt; in a Wasm guest one pass costs about half.
func (h *Hasher) plainBlocks(doc []byte, i, plainTo int) int {
	if h.full {
		return i
	}
	if h.fill > 0 {
		k := i + 64 - h.fill
		if k > len(doc) || (k > plainTo && plainRun(doc[:k], i) != k) {
			return i
		}
		h.Write(doc[i:k])
		i = k
		if h.full {
			return i
		}
	}
	n := min((len(doc)-i)/64, h.cfg.MaxBlocks-len(h.blocks))
	if n <= 0 {
		return i
	}
	// The loop is one basic block but for its exit: no call, no append, one
	// bounds check per block. In Go's Wasm code every jump goes through the
	// function's dispatch table, so each branch and call removed here is
	// paid once per 64 bytes of prompt (BENCHMARKS.md).
	blocks := slices.Grow(h.blocks, n)
	out := blocks[len(blocks) : len(blocks)+n]
	prev, start, k := h.prev, i, 0
	if h.noEscapes {
		k, i, prev = quoteBlocks(doc, i, prev, out)
	} else {
		for ; k < len(out); k++ {
			b := (*[64]byte)(doc[i : i+64])
			// Each word is checked and mixed as it is loaded, so that few
			// values are live (Go's Wasm code spills what does not fit its
			// registers); the mix is mixWords64, written out, and kept only
			// when no word held a quote or a backslash.
			x, bad := prev^prime5, uint64(0)
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[0:8]))
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[8:16]))
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[16:24]))
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[24:32]))
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[32:40]))
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[40:48]))
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[48:56]))
			x, bad = plainStep(x, bad, binary.LittleEndian.Uint64(b[56:64]))
			if bad&0x8080808080808080 != 0 {
				break
			}
			prev = avalanche(x)
			out[k] = prev
			i += 64
		}
	}
	h.blocks, h.prev = blocks[:len(blocks)+k], prev
	h.bytes += i - start
	if len(h.blocks) >= h.cfg.MaxBlocks {
		h.full = true
	}
	return i
}

// quoteBlocks is plainBlocks' loop where no backslash can occur
// (Hasher.SetNoEscapes): only quotes end the run, half the tests per
// word, the same hashes. A function of its own, so that the other loop's
// code stays as it was. It returns the blocks written, the offset and the
// chain after them.
func quoteBlocks(doc []byte, i int, prev uint64, out []uint64) (int, int, uint64) {
	k := 0
	for ; k < len(out); k++ {
		b := (*[64]byte)(doc[i : i+64])
		x, bad := prev^prime5, uint64(0)
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[0:8]))
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[8:16]))
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[16:24]))
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[24:32]))
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[32:40]))
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[40:48]))
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[48:56]))
		x, bad = quoteStep(x, bad, binary.LittleEndian.Uint64(b[56:64]))
		if bad&0x8080808080808080 != 0 {
			break
		}
		prev = avalanche(x)
		out[k] = prev
		i += 64
	}
	return k, i, prev
}

// quoteStep is plainStep where no backslash can occur: only a quote
// sets a high bit of bad (the exact "has zero byte" test).
func quoteStep(x, bad, w uint64) (uint64, uint64) {
	const ones = 0x0101010101010101
	q := w ^ (ones * '"')
	return bits.RotateLeft64(x^w, 31) * prime1, bad | (q-ones)&^q
}

// plainStep is one word of plainBlocks: mixWords64's step, and the word's
// specialWord bits added to bad. It inlines.
func plainStep(x, bad, w uint64) (uint64, uint64) {
	return bits.RotateLeft64(x^w, 31) * prime1, bad | specialWord(w)
}

// unescape decodes the escape at doc[j] == '\\' into out and returns the
// bytes written and the bytes consumed (0 when malformed).
func unescape(doc []byte, j int, out *[utf8.UTFMax]byte) (n, used int) {
	if j+1 >= len(doc) {
		return 0, 0
	}
	switch c := doc[j+1]; c {
	case '"', '\\', '/':
		out[0] = c
	case 'b':
		out[0] = '\b'
	case 'f':
		out[0] = '\f'
	case 'n':
		out[0] = '\n'
	case 'r':
		out[0] = '\r'
	case 't':
		out[0] = '\t'
	case 'u':
		r, used := decodeUnicodeEscape(doc, j)
		if used == 0 {
			return 0, 0
		}
		return utf8.EncodeRune(out[:], r), used
	default:
		return 0, 0
	}
	return 1, 2
}

// decodeUnicodeEscape decodes \uXXXX (and a following low surrogate) at
// doc[j] == '\\'. It returns the rune (U+FFFD for a lone surrogate, as Go
// and Python's "surrogatepass"-less decoders read them) and the bytes
// consumed, 0 when malformed.
func decodeUnicodeEscape(doc []byte, j int) (rune, int) {
	r, ok := hex4(doc, j+2)
	if !ok {
		return 0, 0
	}
	if r >= 0xD800 && r < 0xDC00 {
		if j+12 <= len(doc) && doc[j+6] == '\\' && doc[j+7] == 'u' {
			if lo, ok := hex4(doc, j+8); ok && lo >= 0xDC00 && lo < 0xE000 {
				return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), 12
			}
		}
		return utf8.RuneError, 6
	}
	if r >= 0xDC00 && r < 0xE000 {
		return utf8.RuneError, 6
	}
	return r, 6
}

func hex4(doc []byte, i int) (rune, bool) {
	if i+4 > len(doc) {
		return 0, false
	}
	var r rune
	for _, c := range doc[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// writeOpaque writes the value at doc[i] without insignificant whitespace
// (strings raw, escapes kept) and returns the offset past it.
func (h *Hasher) writeOpaque(doc []byte, i int) (int, error) {
	end, err := skipValue(doc, i)
	if err != nil {
		return 0, err
	}
	if h.full {
		h.bytes += end - i
		return end, nil
	}
	for i < end {
		switch c := doc[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			send, err := skipString(doc, i)
			if err != nil || send > end {
				return 0, errTruncated
			}
			h.Write(doc[i:send])
			i = send
		default:
			j := i + 1
			for j < end {
				if c := doc[j]; c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '"' {
					break
				}
				j++
			}
			h.Write(doc[i:j])
			i = j
		}
	}
	return end, nil
}
