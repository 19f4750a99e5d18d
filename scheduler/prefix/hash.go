package prefix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Hashing defaults.
const (
	// DefaultBlockBytes approximates vLLM's default 16-token KV block at
	// about 4 bytes of text per token (the estimate llm-d's router and
	// Higress also use).
	DefaultBlockBytes = 64
	// DefaultMaxBlocks caps the hashed prefix at 512 KiB of canonical
	// bytes (about 131,072 tokens, llm-d's default match cap); later bytes
	// are not hashed, so a huge prompt costs a bounded time.
	DefaultMaxBlocks = 8192
	// MaxBlockBytes bounds BlockBytes.
	MaxBlockBytes = 4096
)

// HashConfig configures a Hasher; zero fields take the defaults.
type HashConfig struct {
	// BlockBytes is the canonical bytes per block.
	BlockBytes int `json:"blockBytes,omitempty"`
	// MaxBlocks caps the blocks hashed per request.
	MaxBlocks int `json:"maxBlocks,omitempty"`
}

// WithDefaults returns c with zero fields set to the defaults.
func (c HashConfig) WithDefaults() HashConfig {
	if c.BlockBytes == 0 {
		c.BlockBytes = DefaultBlockBytes
	}
	if c.MaxBlocks == 0 {
		c.MaxBlocks = DefaultMaxBlocks
	}
	return c
}

// Validate reports a field out of range (after WithDefaults).
func (c HashConfig) Validate() error {
	switch {
	case c.BlockBytes < 8 || c.BlockBytes > MaxBlockBytes:
		return fmt.Errorf("blockBytes must be in [8, %d], got %d", MaxBlockBytes, c.BlockBytes)
	case c.MaxBlocks < 1 || c.MaxBlocks > 1<<20:
		return fmt.Errorf("maxBlocks must be in [1, %d], got %d", 1<<20, c.MaxBlocks)
	}
	return nil
}

// Mode says what kind of prompt a chain hashes; it is part of the seed, so
// a chat and a completion with the same text never share hashes.
type Mode uint8

const (
	ModeText   Mode = iota + 1 // "prompt" as text
	ModeTokens                 // "prompt" as token ids
	ModeChat                   // "messages" (and "tools")
)

// Errors of malformed prompts. The request parser has validated the JSON;
// these are OpenAI shapes the hasher cannot render, which vLLM refuses too.
var (
	// ErrPromptShape: "prompt" holds something other than a string, token
	// ids (integers in [0, 2^32)), or an array of either.
	ErrPromptShape = errors.New("prefix: \"prompt\" must be a string, an array of strings, an array of token ids (integers in [0, 4294967295]) or an array of such arrays")
	// ErrMessageShape: a message is not an object with a string "role",
	// or its "content" is not a string, an array of parts or null, or a
	// part is not an object or a string.
	ErrMessageShape = errors.New("prefix: each message must be an object with a string \"role\" and a \"content\" that is a string, an array of content parts (objects) or null")
	// errTruncated: the value ends early (the input was not validated JSON).
	errTruncated = errors.New("prefix: truncated JSON value")
)

// seedBase starts every seed: a version of the stream format, so a change
// of rendering never matches hashes of an older one.
var seedBase = hashBytes(0, []byte("wasm-epp/prefix/1"))

// Seed is the chain's seed for a target model or adapter, a mode and the
// request's cache_salt (raw JSON string token, or nil).
func Seed(target string, mode Mode, salt []byte) uint64 {
	s := hashBytes(seedBase^uint64(mode), unsafe.Slice(unsafe.StringData(target), len(target)))
	if len(salt) > 0 {
		s = hashBytes(s, salt)
	}
	return s
}

// Hasher renders prompts into the canonical stream and hashes its blocks.
// Reuse one per goroutine (per Proxy-Wasm VM): its buffers are kept.
type Hasher struct {
	cfg HashConfig
	// buf holds the current, unfinished block.
	buf    []byte
	fill   int
	prev   uint64
	blocks []uint64
	// full: MaxBlocks reached; later bytes are dropped.
	full bool
	// noEscapes: the caller vouches that the JSON being hashed holds no
	// backslash (SetNoEscapes).
	noEscapes bool
	// bytes counts the canonical bytes written (dropped ones included).
	bytes int
	// msgKeys and partKeys decode escaped keys of a message and of a
	// content part (members).
	msgKeys, partKeys [64]byte
}

// NewHasher returns a Hasher; cfg is validated after defaults.
func NewHasher(cfg HashConfig) (*Hasher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Hasher{cfg: cfg, buf: make([]byte, cfg.BlockBytes), blocks: make([]uint64, 0, 64)}, nil
}

// Config returns the configuration with defaults applied.
func (h *Hasher) Config() HashConfig { return h.cfg }

// Reset starts a new chain with the given seed.
func (h *Hasher) Reset(seed uint64) {
	h.prev = seed
	h.fill, h.blocks, h.full, h.bytes = 0, h.blocks[:0], false, 0
}

// SetNoEscapes tells the hasher whether the JSON values it hashes next
// hold no backslash at all, as the caller's parser found: then long
// strings are scanned for their closing quote alone, which in a Wasm
// guest is a quarter less work per block of prompt. The hashes are the
// same; only a caller that is wrong about it gets others (escapes hashed
// raw). Reset keeps it.
func (h *Hasher) SetNoEscapes(v bool) { h.noEscapes = v }

// Blocks returns the hashes of the full blocks written since Reset. The
// slice is reused by the next Reset.
func (h *Hasher) Blocks() []uint64 { return h.blocks }

// Bytes is the number of canonical bytes written since Reset, including
// those past MaxBlocks.
func (h *Hasher) Bytes() int { return h.bytes }

// Truncated reports whether MaxBlocks was reached.
func (h *Hasher) Truncated() bool { return h.full }

// Key is the hash a consistent choice is made on: the first block's hash,
// or, for a prompt shorter than one block, the hash of what was written
// (the seed alone for an empty prompt). Prompts that share their first
// block share their key.
func (h *Hasher) Key() uint64 {
	if len(h.blocks) > 0 {
		return h.blocks[0]
	}
	return chain(h.prev, hashBytes(0, h.buf[:h.fill]))
}

// Write appends canonical bytes. Whole blocks are hashed straight from p;
// only a block that straddles calls is copied. The loop keeps the chain
// in locals: in a Wasm guest every store of the slice header into the
// Hasher is a write-barrier check, and the loop is the hot path.
func (h *Hasher) Write(p []byte) {
	h.bytes += len(p)
	if h.full {
		return
	}
	bs := h.cfg.BlockBytes
	if h.fill > 0 {
		n := copy(h.buf[h.fill:], p)
		h.fill += n
		p = p[n:]
		if h.fill < bs {
			return
		}
		h.fill = 0
		h.endBlock(h.buf)
		if h.full {
			return
		}
	}
	if len(p) >= bs {
		blocks, prev, limit := h.blocks, h.prev, h.cfg.MaxBlocks
		for len(p) >= bs && len(blocks) < limit {
			if bs == 64 {
				prev = mixBlock64(prev, (*[64]byte)(p))
			} else {
				prev = chain(prev, hashBytes(0, p[:bs]))
			}
			blocks = append(blocks, prev)
			p = p[bs:]
		}
		h.blocks, h.prev = blocks, prev
		if len(blocks) >= limit {
			h.full = true
			return
		}
	}
	h.fill = copy(h.buf, p)
}

// endBlock chains one full block (the buffered one).
func (h *Hasher) endBlock(b []byte) {
	if len(b) == 64 {
		h.prev = mixBlock64(h.prev, (*[64]byte)(b))
	} else {
		h.prev = chain(h.prev, hashBytes(0, b))
	}
	h.blocks = append(h.blocks, h.prev)
	if len(h.blocks) >= h.cfg.MaxBlocks {
		h.full = true
	}
}

// WriteByte appends one canonical byte.
func (h *Hasher) WriteByte(c byte) error {
	h.bytes++
	if h.full {
		return nil
	}
	h.buf[h.fill] = c
	h.fill++
	if h.fill == h.cfg.BlockBytes {
		h.fill = 0
		h.endBlock(h.buf)
	}
	return nil
}

// Canonical stream markers (see the package documentation).
const (
	markOpaque    = 0x1C // FS: opaque JSON bytes follow
	markPart      = 0x1D // GS: between content parts
	markMessage   = 0x1E // RS: a message starts
	markField     = 0x1F // US: ends the role and the name
	markToolCalls = 0x1A // SUB
	markToolID    = 0x19 // EM
)

// HashPrompt hashes a "prompt" value (raw JSON, validated) for a target
// model or adapter and the request's cache_salt (raw token or nil).
func (h *Hasher) HashPrompt(target string, salt, raw []byte) error {
	mode, err := PromptMode(raw)
	if err != nil {
		return err
	}
	h.Reset(Seed(target, mode, salt))
	return h.writePrompt(raw)
}

// PromptMode tells whether a "prompt" value is text or token ids.
func PromptMode(raw []byte) (Mode, error) {
	i := skipSpace(raw, 0)
	if i >= len(raw) {
		return 0, errTruncated
	}
	switch raw[i] {
	case '"':
		return ModeText, nil
	case '[':
	default:
		return 0, ErrPromptShape
	}
	j := skipSpace(raw, i+1)
	if j >= len(raw) {
		return 0, errTruncated
	}
	switch c := raw[j]; {
	case c == ']' || c == '"':
		return ModeText, nil
	case c == '[' || c == '-' || (c >= '0' && c <= '9'):
		return ModeTokens, nil
	}
	return 0, ErrPromptShape
}

func (h *Hasher) writePrompt(raw []byte) error {
	open := skipSpace(raw, 0)
	if raw[open] == '"' {
		_, err := h.writeString(raw, open)
		return err
	}
	// An array: of strings, of token ids, or of token arrays.
	i := skipSpace(raw, open+1)
	switch c := raw[i]; {
	case c == ']':
		return nil
	case c == '"':
		// A batch of prompts: the first one is hashed; the others must be
		// strings too.
		end, err := h.writeString(raw, i)
		if err != nil {
			return err
		}
		return checkElements(raw, end, '"')
	case c == '[':
		end, err := h.writeTokenList(raw, i)
		if err != nil {
			return err
		}
		return checkElements(raw, end, '[')
	}
	_, err := h.writeTokenList(raw, open)
	return err
}

// writeTokenList writes the token ids of the array starting at raw[i]
// ('['), 4 little-endian bytes each.
func (h *Hasher) writeTokenList(raw []byte, i int) (int, error) {
	i++
	var tok [4]byte
	for {
		i = skipSpace(raw, i)
		if i >= len(raw) {
			return 0, errTruncated
		}
		if raw[i] == ']' {
			return i + 1, nil
		}
		var v uint64
		start := i
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > 0xFFFFFFFF {
				return 0, ErrPromptShape
			}
			i++
		}
		if i == start || (i < len(raw) && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E')) {
			return 0, ErrPromptShape // negative, fractional, or not a number
		}
		binary.LittleEndian.PutUint32(tok[:], uint32(v))
		h.Write(tok[:])
		i = skipSpace(raw, i)
		if i < len(raw) && raw[i] == ',' {
			i++
		}
	}
}

// checkElements checks that the array elements after end (just past the
// first element) all start with first, skipping them.
func checkElements(raw []byte, end int, first byte) error {
	i := end
	for {
		i = skipSpace(raw, i)
		if i >= len(raw) {
			return errTruncated
		}
		switch raw[i] {
		case ']':
			return nil
		case ',':
			i = skipSpace(raw, i+1)
			if i >= len(raw) {
				return errTruncated
			}
			if raw[i] != first {
				return ErrPromptShape
			}
			if first == '[' {
				// Token arrays: check the ids without hashing them.
				var err error
				if i, err = checkTokenList(raw, i); err != nil {
					return err
				}
				continue
			}
			var err error
			if i, err = skipValue(raw, i); err != nil {
				return err
			}
		default:
			return errTruncated
		}
	}
}

func checkTokenList(raw []byte, i int) (int, error) {
	end, err := skipValue(raw, i)
	if err != nil {
		return 0, err
	}
	var scratch Hasher // a full hasher drops bytes: only the checks run
	scratch.full = true
	if _, err := scratch.writeTokenList(raw, i); err != nil {
		return 0, err
	}
	return end, nil
}

// HashMessages hashes a chat request for a target model or adapter and the
// request's cache_salt (raw token or nil): the "tools" value (raw JSON, or
// nil) then the "messages" array.
func (h *Hasher) HashMessages(target string, salt, tools, messages []byte) error {
	h.Reset(Seed(target, ModeChat, salt))
	if len(tools) > 0 {
		i := skipSpace(tools, 0)
		if i < len(tools) && tools[i] != 'n' { // null: no tools
			_ = h.WriteByte(markOpaque)
			if _, err := h.writeOpaque(tools, i); err != nil {
				return err
			}
		}
	}
	i := skipSpace(messages, 0)
	if i >= len(messages) || messages[i] != '[' {
		return ErrMessageShape
	}
	i++
	for {
		i = skipSpace(messages, i)
		if i >= len(messages) {
			return errTruncated
		}
		switch messages[i] {
		case ']':
			return nil
		case ',':
			i++
			continue
		case '{':
		default:
			return ErrMessageShape
		}
		end, err := h.writeMessage(messages, i)
		if err != nil {
			return err
		}
		i = end
	}
}

// span is a raw JSON value [start, end); start < 0 means absent.
type span struct{ start, end int }

var absent = span{-1, -1}

// writeMessage renders the message object at doc[i] == '{'. When "role"
// comes before "content" (as clients write them) the content is rendered
// in the same pass that finds it; otherwise its span is kept and rendered
// after the loop.
func (h *Hasher) writeMessage(doc []byte, i int) (int, error) {
	role, name, content, toolCalls, toolID := absent, absent, absent, absent, absent
	rendered := false
	it := newMembers(doc, i, &h.msgKeys)
	// The usual message starts with a plain "role" then "content":
	// rendered without the iterator, which then goes on from there.
	if r, c, ok := roleThenContent(doc, i); ok {
		h.writePlainHead(doc[r.start+1 : r.end-1])
		end, err := h.writeContent(doc, c)
		if err != nil {
			return 0, err
		}
		if end < len(doc) && doc[end] == '}' {
			return end + 1, nil // nothing after the content: what the iterator would find
		}
		role, rendered = r, true
		it.consumed(end)
	}
	for key, start, ok := it.next(); ok; key, start, ok = it.next() {
		if string(key) == "content" && role.start >= 0 && !rendered {
			if err := h.writeHead(doc, role); err != nil {
				return 0, err
			}
			end, err := h.writeContent(doc, start)
			if err != nil {
				return 0, err
			}
			it.consumed(end)
			rendered = true
			continue
		}
		v, ok := it.value()
		if !ok {
			break
		}
		switch string(key) {
		case "role":
			if !rendered {
				role = v
			}
		case "name":
			name = v
		case "content":
			if !rendered {
				content = v
			}
		case "tool_calls":
			toolCalls = v
		case "tool_call_id":
			toolID = v
		}
	}
	if it.err != nil {
		return 0, it.err
	}
	if !rendered {
		if err := h.writeHead(doc, role); err != nil {
			return 0, err
		}
		if content.start >= 0 {
			if _, err := h.writeContent(doc, content.start); err != nil {
				return 0, err
			}
		}
	}
	if name.start >= 0 && doc[name.start] == '"' {
		_ = h.WriteByte(markField)
		if _, err := h.writeString(doc, name.start); err != nil {
			return 0, err
		}
	}
	if toolCalls.start >= 0 && doc[toolCalls.start] != 'n' {
		_ = h.WriteByte(markToolCalls)
		if _, err := h.writeOpaque(doc, toolCalls.start); err != nil {
			return 0, err
		}
	}
	if toolID.start >= 0 && doc[toolID.start] == '"' {
		_ = h.WriteByte(markToolID)
		if _, err := h.writeString(doc, toolID.start); err != nil {
			return 0, err
		}
	}
	return it.end, nil
}

// roleThenContent recognizes a message object at doc[i] == '{' whose
// first member is "role" with a string holding no escape, and whose
// second is "content" (keys written plainly): it returns the role's span
// and where the content's value starts. Anything else is left to the
// member iterator, which reads the same message the same way.
func roleThenContent(doc []byte, i int) (role span, content int, ok bool) {
	// Compact JSON (no whitespace between the tokens) is matched a word
	// at a time; anything else goes the general way below.
	if i+9 <= len(doc) && binary.LittleEndian.Uint64(doc[i+1:]) == roleColonQuote {
		j := i + 9
		end := plainRun(doc, j)
		if end+12 < len(doc) && doc[end] == '"' && binary.LittleEndian.Uint64(doc[end+1:]) == commaContent &&
			binary.LittleEndian.Uint16(doc[end+9:]) == tQuote && doc[end+11] == ':' {
			c := end + 12
			if doc[c] <= ' ' {
				if c = skipSpace(doc, c); c >= len(doc) {
					return span{}, 0, false
				}
			}
			return span{j - 1, end + 1}, c, true
		}
	}
	j, ok := token(doc, i+1, `"role"`)
	if ok {
		j, ok = token(doc, j, ":")
	}
	if !ok {
		return span{}, 0, false
	}
	if j = skipSpace(doc, j); j >= len(doc) || doc[j] != '"' {
		return span{}, 0, false
	}
	end := plainRun(doc, j+1)
	if end >= len(doc) || doc[end] != '"' {
		return span{}, 0, false
	}
	role = span{j, end + 1}
	if j, ok = token(doc, end+1, ","); ok {
		if j, ok = token(doc, j, `"content"`); ok {
			j, ok = token(doc, j, ":")
		}
	}
	if j = skipSpace(doc, j); !ok || j >= len(doc) {
		return span{}, 0, false
	}
	return role, j, true
}

// The compact message start `{"role":"...","content":` as little-endian
// words: `"role":"`, `,"conten` and `t"`.
const (
	roleColonQuote = 0x223a22656c6f7222
	commaContent   = 0x6e65746e6f63222c
	tQuote         = 0x2274
)

// token reports whether doc holds tok at j after whitespace, and returns
// the offset past it (ok false: the offset is meaningless).
func token(doc []byte, j int, tok string) (int, bool) {
	j = skipSpace(doc, j)
	return j + len(tok), j+len(tok) <= len(doc) && string(doc[j:j+len(tok)]) == tok
}

// writeHead writes a message's start and role (a string, else the message
// is malformed).
func (h *Hasher) writeHead(doc []byte, role span) error {
	if role.start < 0 || doc[role.start] != '"' {
		return ErrMessageShape
	}
	_ = h.WriteByte(markMessage)
	if _, err := h.writeString(doc, role.start); err != nil {
		return err
	}
	return h.WriteByte(markField)
}

// writePlainHead is writeHead for a role string without escapes (its
// bytes between the quotes): usually one copy into the open block.
func (h *Hasher) writePlainHead(role []byte) {
	if n := len(role) + 2; !h.full && h.fill+n < len(h.buf) {
		b := h.buf[h.fill : h.fill+n]
		b[0] = markMessage
		copy(b[1:], role)
		b[n-1] = markField
		h.fill += n
		h.bytes += n
		return
	}
	_ = h.WriteByte(markMessage)
	h.Write(role)
	_ = h.WriteByte(markField)
}

// writeContent renders a message's content value at doc[i] and returns
// the offset past it.
func (h *Hasher) writeContent(doc []byte, i int) (int, error) {
	switch doc[i] {
	case 'n': // null: no content (an assistant message with tool calls)
		return skipValue(doc, i)
	case '"':
		return h.writeString(doc, i)
	case '[':
	default:
		return 0, ErrMessageShape
	}
	i++
	first := true
	for {
		i = skipSpace(doc, i)
		if i >= len(doc) {
			return 0, errTruncated
		}
		c := doc[i]
		switch c {
		case ']':
			return i + 1, nil
		case ',':
			i++
			continue
		case '"', '{':
		default:
			return 0, ErrMessageShape
		}
		if !first {
			_ = h.WriteByte(markPart)
		}
		first = false
		var err error
		if c == '"' {
			i, err = h.writeString(doc, i)
		} else {
			i, err = h.writePart(doc, i)
		}
		if err != nil {
			return 0, err
		}
	}
}

// writePart renders one content part object at doc[i] == '{': a text part
// as its text, any other as opaque bytes.
func (h *Hasher) writePart(doc []byte, i int) (int, error) {
	typ, text := absent, absent
	it := newMembers(doc, i, &h.partKeys)
	for key, _, ok := it.next(); ok; key, _, ok = it.next() {
		v, ok := it.value()
		if !ok {
			break
		}
		switch string(key) {
		case "type":
			typ = v
		case "text":
			text = v
		}
	}
	if it.err != nil {
		return 0, it.err
	}
	end := it.end
	if typ.start >= 0 && text.start >= 0 && doc[text.start] == '"' && stringEquals(doc[typ.start:typ.end], "text") {
		if _, err := h.writeString(doc, text.start); err != nil {
			return 0, err
		}
		return end, nil
	}
	_ = h.WriteByte(markOpaque)
	return h.writeOpaque(doc, i)
}

// stringEquals reports whether the JSON string token tok decodes to s
// (short tokens only: escapes are decoded in a stack buffer).
func stringEquals(tok []byte, s string) bool {
	if len(tok) < 2 || tok[0] != '"' {
		return false
	}
	if string(tok[1:len(tok)-1]) == s {
		return true
	}
	var buf [64]byte
	dec, ok := decodeSmall(tok, buf[:0])
	return ok && string(dec) == s
}

// HashTokens hashes a prompt given as token ids (the fleet benchmark's
// requests; the same stream as a "prompt" array of ids).
func (h *Hasher) HashTokens(target string, salt []byte, tokens []uint32) {
	h.Reset(Seed(target, ModeTokens, salt))
	var buf [64]byte
	for len(tokens) > 0 {
		n := min(len(tokens), len(buf)/4)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		h.Write(buf[:4*n])
		tokens = tokens[n:]
		if h.full {
			h.bytes += 4 * len(tokens)
			return
		}
	}
}
