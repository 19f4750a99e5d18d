package envoyhost

import (
	"encoding/binary"
	"strings"
)

// Pair is one header (or trailer, or metadata) entry.
type Pair struct {
	Key, Value string
}

// Limits of the pairs format (cpp-host include/proxy-wasm/limits.h).
const (
	pairsMaxBytes = 1 << 20
	pairsMaxCount = 1024
)

// encodePairs serialises pairs as cpp-host src/pairs_util.cc marshalPairs:
// u32 count, (u32 key len, u32 value len) per pair, then every key and
// value NUL-terminated; little-endian.
func encodePairs(pairs []Pair) []byte {
	size := 4
	for _, p := range pairs {
		size += 8 + len(p.Key) + 1 + len(p.Value) + 1
	}
	out := make([]byte, size)
	binary.LittleEndian.PutUint32(out, uint32(len(pairs)))
	pos := 4
	for _, p := range pairs {
		binary.LittleEndian.PutUint32(out[pos:], uint32(len(p.Key)))
		binary.LittleEndian.PutUint32(out[pos+4:], uint32(len(p.Value)))
		pos += 8
	}
	for _, p := range pairs {
		pos += copy(out[pos:], p.Key) + 1
		pos += copy(out[pos:], p.Value) + 1
	}
	return out
}

// decodePairs parses the pairs format as cpp-host src/pairs_util.cc
// toPairs: any malformation (too big, too many pairs, overread, missing
// NUL, trailing bytes) yields no pairs at all, never an error.
func decodePairs(b []byte) []Pair {
	if len(b) > pairsMaxBytes || len(b) < 4 {
		return nil
	}
	n := binary.LittleEndian.Uint32(b)
	if n > pairsMaxCount {
		return nil
	}
	pos := 4
	if pos+int(n)*8 > len(b) {
		return nil
	}
	sizes := make([][2]int, n)
	for i := range sizes {
		sizes[i][0] = int(binary.LittleEndian.Uint32(b[pos:]))
		sizes[i][1] = int(binary.LittleEndian.Uint32(b[pos+4:]))
		pos += 8
	}
	pairs := make([]Pair, n)
	for i, s := range sizes {
		key, next, ok := nulString(b, pos, s[0])
		if !ok {
			return nil
		}
		value, next, ok := nulString(b, next, s[1])
		if !ok {
			return nil
		}
		pairs[i] = Pair{Key: key, Value: value}
		pos = next
	}
	if pos != len(b) {
		return nil
	}
	return pairs
}

func nulString(b []byte, pos, n int) (string, int, bool) {
	if n < 0 || pos+n+1 > len(b) || pos+n+1 < pos {
		return "", 0, false
	}
	if b[pos+n] != 0 {
		return "", 0, false
	}
	return string(b[pos : pos+n]), pos + n + 1, true
}

// HeaderMap is an ordered multi-map with lower-case keys, like Envoy's
// HeaderMapImpl as the Wasm context uses it (envoy
// source/extensions/common/wasm/context.cc: every key goes through
// LowerCaseString).
type HeaderMap struct {
	entries []Pair
}

// NewHeaderMap builds a map from pairs, lower-casing keys.
func NewHeaderMap(pairs ...Pair) *HeaderMap {
	m := &HeaderMap{entries: make([]Pair, 0, len(pairs))}
	for _, p := range pairs {
		m.Add(p.Key, p.Value)
	}
	return m
}

// Get returns the first value of key: the Wasm ABI returns only that one.
func (m *HeaderMap) Get(key string) (string, bool) {
	key = strings.ToLower(key)
	for _, e := range m.entries {
		if e.Key == key {
			return e.Value, true
		}
	}
	return "", false
}

// Values returns every value of key in order.
func (m *HeaderMap) Values(key string) []string {
	key = strings.ToLower(key)
	var out []string
	for _, e := range m.entries {
		if e.Key == key {
			out = append(out, e.Value)
		}
	}
	return out
}

// Add appends an entry (HeaderMap::addCopy).
func (m *HeaderMap) Add(key, value string) {
	m.entries = append(m.entries, Pair{Key: strings.ToLower(key), Value: value})
}

// Set removes every entry of key and appends one (HeaderMap::setCopy with
// envoy.reloadable_features.http_set_copy_replace_all_headers, the default).
func (m *HeaderMap) Set(key, value string) {
	m.Remove(key)
	m.Add(key, value)
}

// Remove deletes every entry of key; absent keys are fine.
func (m *HeaderMap) Remove(key string) {
	key = strings.ToLower(key)
	out := m.entries[:0]
	for _, e := range m.entries {
		if e.Key != key {
			out = append(out, e)
		}
	}
	m.entries = out
}

// Pairs returns a copy of the entries in order.
func (m *HeaderMap) Pairs() []Pair {
	return append([]Pair(nil), m.entries...)
}

// SetPairs replaces the whole map (context.cc setHeaderMapPairs).
func (m *HeaderMap) SetPairs(pairs []Pair) {
	m.entries = m.entries[:0]
	for _, p := range pairs {
		m.Add(p.Key, p.Value)
	}
}

// Len is the number of entries (HeaderMap::size), which Envoy passes as
// the header count to on_request_headers and friends.
func (m *HeaderMap) Len() int { return len(m.entries) }

// ByteSize is the sum of key and value lengths (HeaderMap::byteSize), what
// proxy_get_header_map_size returns.
func (m *HeaderMap) ByteSize() int {
	n := 0
	for _, e := range m.entries {
		n += len(e.Key) + len(e.Value)
	}
	return n
}

// Clone returns an independent copy.
func (m *HeaderMap) Clone() *HeaderMap {
	return &HeaderMap{entries: m.Pairs()}
}
