package prefix

import (
	"encoding/binary"
	"math/bits"
)

// UsageScanner finds usage.prompt_tokens and
// usage.prompt_tokens_details.cached_tokens in an OpenAI response body as
// its chunks pass, without keeping them: a JSON body, or a server-sent
// event stream whose final chunk carries the usage (vLLM sends it with
// stream_options.include_usage, before "data: [DONE]"). Its state is a few
// words whatever the body's size; a body that never mentions usage costs
// one pass over its bytes and yields nothing. The last usage object seen
// wins (a stream with continuous usage statistics reports one per chunk).
//
// It is a tolerant tokenizer, not a validator: bytes outside JSON values
// ("data: " prefixes) are skipped, and a raw newline inside a string (which
// JSON forbids, so it can only be the end of a broken event) resets it.
//
// Outside a usage object it does not tokenize at all: it searches for the
// raw bytes "usage" (quotes included) not preceded by a backslash, which in
// valid JSON can only be a string token, and tokenizes from there until
// that value ends. Tokenizing every byte was most of the cost of reading a
// response in a Wasm guest, and a response's usage is its last few dozen
// bytes.
type UsageScanner struct {
	// tokenizing: at a "usage" string, until its value ends; else
	// searching. tail holds the last bytes searched (a key split across
	// chunks) and before the byte preceding them.
	tokenizing bool
	// everywhere tokenizes every byte, never searching (tests compare
	// the search with it).
	everywhere bool
	tail       [len(usageToken) - 1]byte
	tailLen    int
	before     byte

	inString, escaped bool
	depth             int
	// key holds the start of the last string (to compare with the keys of
	// interest when a ':' follows it).
	key     [24]byte
	keyLen  int
	keyLong bool
	// pending is the key of interest whose value comes next.
	pending      int
	usageDepth   int // depth inside the usage object, 0 outside
	detailsDepth int // depth inside prompt_tokens_details, 0 outside
	openPending  int // key whose object opens at the next '{'
	inNumber     bool
	number       int64
	numberFor    int

	prompt, cached         int64
	havePrompt, haveCached bool
}

const (
	keyNone = iota
	keyUsage
	keyPromptTokens
	keyDetails
	keyCachedTokens
)

// Reset prepares for a new body.
func (s *UsageScanner) Reset() { *s = UsageScanner{} }

// Result returns what was found: prompt tokens and cached tokens, each
// with whether it was reported.
func (s *UsageScanner) Result() (prompt, cached int64, havePrompt, haveCached bool) {
	return s.prompt, s.cached, s.havePrompt, s.haveCached
}

// usageToken is the key searched for.
const usageToken = `"usage"`

// Write scans the next chunk.
func (s *UsageScanner) Write(p []byte) {
	for i := 0; i < len(p); {
		if !s.tokenizing && !s.everywhere {
			i = s.search(p, i)
			continue
		}
		if s.inString {
			i = s.scanString(p, i)
			continue
		}
		c := p[i]
		i++
		if s.inNumber {
			if c >= '0' && c <= '9' {
				if s.number < 1<<40 {
					s.number = s.number*10 + int64(c-'0')
				}
				continue
			}
			s.endNumber()
		}
		switch c {
		case '"':
			s.inString, s.escaped, s.keyLen, s.keyLong = true, false, 0, false
		case ':':
			s.pending = keyNone
			if !s.keyLong {
				s.pending = s.keyOfInterest()
			}
			s.keyLen = 0
			if s.pending == keyUsage || s.pending == keyDetails {
				s.openPending, s.pending = s.pending, keyNone
			}
		case '{':
			s.depth++
			switch s.openPending {
			case keyUsage:
				s.usageDepth, s.detailsDepth = s.depth, 0
				s.prompt, s.cached, s.havePrompt, s.haveCached = 0, 0, false, false
			case keyDetails:
				s.detailsDepth = s.depth
			}
			s.openPending, s.pending = keyNone, keyNone
		case '}':
			if s.depth == s.detailsDepth {
				s.detailsDepth = 0
			}
			if s.depth == s.usageDepth {
				s.usageDepth = 0
			}
			s.depth = max(s.depth-1, 0)
			s.pending, s.openPending = keyNone, keyNone
			s.searchAgain(c)
		case '[':
			s.depth++
			s.pending, s.openPending = keyNone, keyNone
		case ']':
			s.depth = max(s.depth-1, 0)
			s.searchAgain(c)
		case ',':
			s.pending, s.openPending, s.keyLen = keyNone, keyNone, 0
			s.searchAgain(c)
		case ' ', '\t', '\r':
		case '\n':
			if s.depth == 0 {
				s.keyLen = 0
			}
		default:
			if c >= '0' && c <= '9' && (s.pending == keyPromptTokens || s.pending == keyCachedTokens) {
				s.inNumber, s.number, s.numberFor = true, int64(c-'0'), s.pending
			}
			s.pending, s.openPending = keyNone, keyNone
			s.searchAgain(c)
		}
	}
}

// searchAgain goes back to searching once the tokenized usage value (or
// the "usage" string that was not a key) has ended; c is the byte just
// read.
func (s *UsageScanner) searchAgain(c byte) {
	if s.usageDepth == 0 && s.openPending == keyNone && !s.inNumber {
		s.tokenizing, s.tailLen, s.before = false, 0, c
	}
}

// search looks for the "usage" string from p[i:], also where it straddles
// the previous chunk, and returns where tokenizing starts (len(p) when
// not found).
func (s *UsageScanner) search(p []byte, i int) int {
	// A token that began in the tail: at most len(tail) starts to try.
	for q := 0; q < s.tailLen; q++ {
		if s.tokenAt(p[i:], q) {
			head, n := s.tail, s.tailLen
			s.startTokenizing()
			s.Write(head[q:n]) // then p, tokenizing
			return i
		}
	}
	for off := i; ; {
		k := indexUsageToken(p, off)
		if k < 0 {
			break
		}
		prev := s.before
		switch {
		case k > i:
			prev = p[k-1]
		case s.tailLen > 0:
			prev = s.tail[s.tailLen-1]
		}
		if prev != '\\' {
			if end, ok := s.readUsage(p, k); ok {
				return end // read whole: search on from its end
			}
			s.startTokenizing()
			return k
		}
		off = k + 1
	}
	s.keepTail(p[i:])
	return len(p)
}

// indexUsageToken returns the offset of the first usageToken in p from
// i, or -1. It looks a word at a time for quotes, and in a word that has
// some, for a quote followed by a 'u' (the masks of the word and of the
// word a byte on, and-ed), so other strings' quotes cost little, and no
// byte loop runs: bytes.Index has no vector code in a Wasm guest and
// cost as much as tokenizing. The masks may flag extra bytes above a
// real one, never miss one; each candidate is compared.
func indexUsageToken(p []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for ; i+9 <= len(p); i += 8 {
		q := binary.LittleEndian.Uint64(p[i:]) ^ (ones * '"')
		m := (q - ones) &^ q & highs
		if m == 0 {
			continue // no quote: most words of a long completion
		}
		u := binary.LittleEndian.Uint64(p[i+1:]) ^ (ones * 'u')
		for m &= (u - ones) &^ u; m != 0; m &= m - 1 {
			k := i + bits.TrailingZeros64(m)>>3
			if k+len(usageToken) <= len(p) && string(p[k:k+len(usageToken)]) == usageToken {
				return k
			}
		}
	}
	for ; i+len(usageToken) <= len(p); i++ {
		if p[i] == '"' && string(p[i:i+len(usageToken)]) == usageToken {
			return i
		}
	}
	return -1
}

// readUsage reads the usage value after the "usage" string at p[k] when
// this chunk holds all of it and it has the usual shape: an object of
// numbers, plain strings, literals and a prompt_tokens_details object of
// the same. It sets what the tokenizer would have found and returns the
// offset past the object; ok is false (nothing changed) for anything
// else, which the tokenizer then reads: a value cut by the chunk's end,
// another nested value, an escape or a raw newline in a string, a
// newline before the colon (which the tokenizer reads as a new event), a
// nested "usage" key, or a usage that is not an object. A JSON response's
// usage is then read without the tokenizer's per-byte steps.
func (s *UsageScanner) readUsage(p []byte, k int) (end int, ok bool) {
	j := k + len(usageToken)
	for j < len(p) && (p[j] == ' ' || p[j] == '\t' || p[j] == '\r') {
		j++
	}
	if j >= len(p) || p[j] != ':' {
		return 0, false
	}
	j = skipSpace(p, j+1)
	if j >= len(p) || p[j] != '{' {
		return 0, false
	}
	var r usageRead
	if j, ok = r.object(p, j, false); !ok {
		return 0, false
	}
	s.prompt, s.cached, s.havePrompt, s.haveCached = r.prompt, r.cached, r.havePrompt, r.haveCached
	s.tailLen, s.before = 0, '}'
	return j, true
}

// usageRead is what readUsage found.
type usageRead struct {
	prompt, cached         int64
	havePrompt, haveCached bool
}

// object reads the object at p[j] == '{' (the usage object, or details
// within it) and returns the offset past it.
func (r *usageRead) object(p []byte, j int, details bool) (int, bool) {
	j++
	for {
		j = skipSpace(p, j)
		if j >= len(p) {
			return 0, false
		}
		switch p[j] {
		case '}':
			return j + 1, true
		case ',':
			j++
			continue
		case '"':
		default:
			return 0, false
		}
		kend, ok := plainString(p, j)
		if !ok {
			return 0, false
		}
		key := p[j+1 : kend-1]
		j = skipSpace(p, kend)
		if j >= len(p) || p[j] != ':' {
			return 0, false
		}
		j = skipSpace(p, j+1)
		if j >= len(p) {
			return 0, false
		}
		switch c := p[j]; {
		case string(key) == "usage":
			return 0, false // the tokenizer starts over there
		case c == '{' && !details && string(key) == "prompt_tokens_details":
			if j, ok = r.object(p, j, true); !ok {
				return 0, false
			}
			continue
		case c == '"':
			if j, ok = plainString(p, j); !ok {
				return 0, false
			}
			continue
		case c == '{' || c == '[':
			return 0, false
		}
		// A number or a literal: the digits it starts with count for
		// the keys of interest, as the tokenizer reads them.
		start := j
		var v int64
		for j < len(p) && p[j] >= '0' && p[j] <= '9' {
			if v < 1<<40 {
				v = v*10 + int64(p[j]-'0')
			}
			j++
		}
		if j > start {
			switch {
			case !details && string(key) == "prompt_tokens":
				r.prompt, r.havePrompt = v, true
			case details && string(key) == "cached_tokens":
				r.cached, r.haveCached = v, true
			}
		}
		for j < len(p) && (p[j] == '.' || p[j] == '-' || p[j] == '+' || (p[j] >= '0' && p[j] <= '9') || (p[j] >= 'a' && p[j] <= 'z') || (p[j] >= 'A' && p[j] <= 'Z')) {
			j++
		}
		if j == start {
			return 0, false
		}
	}
}

// plainString returns the offset past the string token at p[j] == '"'
// when it ends in p with no escape and no raw newline. Words are tested
// at once, and the first flagged byte found without a byte loop.
func plainString(p []byte, j int) (int, bool) {
	for j++; j+8 <= len(p); j += 8 {
		w := binary.LittleEndian.Uint64(p[j:])
		if m := quoteOrBackslash(w) | newlineBits(w); m != 0 {
			j += bits.TrailingZeros64(m) >> 3
			if p[j] == '"' {
				return j + 1, true
			}
			return 0, false
		}
	}
	for ; j < len(p); j++ {
		switch p[j] {
		case '"':
			return j + 1, true
		case '\\', '\n':
			return 0, false
		}
	}
	return 0, false
}

// tokenAt reports whether the stream tail[q:tailLen] + p holds the token
// at q, not escaped.
func (s *UsageScanner) tokenAt(p []byte, q int) bool {
	for j := range len(usageToken) {
		x := q + j
		var c byte
		switch {
		case x < s.tailLen:
			c = s.tail[x]
		case x-s.tailLen < len(p):
			c = p[x-s.tailLen]
		default:
			return false // the rest may come with the next chunk
		}
		if c != usageToken[j] {
			return false
		}
	}
	prev := s.before
	if q > 0 {
		prev = s.tail[q-1]
	}
	return prev != '\\'
}

// keepTail keeps the last bytes of the stream searched so far (tail, then
// p), and the byte before them.
func (s *UsageScanner) keepTail(p []byte) {
	n := len(s.tail)
	if len(p) >= n {
		if len(p) > n {
			s.before = p[len(p)-n-1]
		} else if s.tailLen > 0 {
			s.before = s.tail[s.tailLen-1]
		}
		s.tailLen = copy(s.tail[:], p[len(p)-n:])
		return
	}
	var w [2 * len(s.tail)]byte
	m := copy(w[:], s.tail[:s.tailLen])
	m += copy(w[m:], p)
	if m > n {
		s.before = w[m-n-1]
		s.tailLen = copy(s.tail[:], w[m-n:m])
		return
	}
	s.tailLen = copy(s.tail[:], w[:m])
}

// startTokenizing starts the tokenizer at a "usage" string: depths count
// from there.
func (s *UsageScanner) startTokenizing() {
	s.tokenizing, s.tailLen = true, 0
	s.depth, s.usageDepth, s.detailsDepth = 0, 0, 0
	s.pending, s.openPending, s.inString, s.inNumber = keyNone, keyNone, false, false
}

func (s *UsageScanner) endNumber() {
	s.inNumber = false
	switch s.numberFor {
	case keyPromptTokens:
		s.prompt, s.havePrompt = s.number, true
	case keyCachedTokens:
		s.cached, s.haveCached = s.number, true
	}
}

// Finish ends the body (a number at its very end is complete).
func (s *UsageScanner) Finish() {
	if s.inNumber {
		s.endNumber()
	}
}

// keyOfInterest tells which key the last string was, at its depth.
func (s *UsageScanner) keyOfInterest() int {
	k := string(s.key[:s.keyLen]) // compared in place, no allocation
	switch {
	case k == "usage":
		return keyUsage
	case s.usageDepth > 0 && s.depth == s.usageDepth && k == "prompt_tokens":
		return keyPromptTokens
	case s.usageDepth > 0 && s.depth == s.usageDepth && k == "prompt_tokens_details":
		return keyDetails
	case s.detailsDepth > 0 && s.depth == s.detailsDepth && k == "cached_tokens":
		return keyCachedTokens
	}
	return keyNone
}

// scanString consumes string bytes from p[i:], keeping the first bytes
// for key comparison, and returns where it stopped. Plain bytes are
// skipped a word at a time and kept with one copy: a byte-at-a-time loop
// was most of the cost of reading a response for its usage in a Wasm
// guest.
func (s *UsageScanner) scanString(p []byte, i int) int {
	for i < len(p) {
		if s.escaped {
			s.escaped = false
			s.keyLong = true // keys of interest have no escapes
			i++
			continue
		}
		j := i
		for j+8 <= len(p) && quoteOrBackslash(binary.LittleEndian.Uint64(p[j:]))|newlineBits(binary.LittleEndian.Uint64(p[j:])) == 0 {
			j += 8
		}
		for j < len(p) && p[j] != '"' && p[j] != '\\' && p[j] != '\n' {
			j++
		}
		if !s.keyLong {
			if n := j - i; s.keyLen+n <= len(s.key) {
				copy(s.key[s.keyLen:], p[i:j])
				s.keyLen += n
			} else {
				s.keyLong = true
			}
		}
		if j >= len(p) {
			return j
		}
		c := p[j]
		i = j + 1
		switch c {
		case '"':
			s.inString = false
			return i
		case '\\':
			s.escaped = true
		default: // '\n': not JSON, a broken event. Start over.
			*s = UsageScanner{prompt: s.prompt, cached: s.cached, havePrompt: s.havePrompt, haveCached: s.haveCached, everywhere: s.everywhere}
			return i
		}
	}
	return i
}

// newlineBits is non-zero when a byte of x is '\n'.
func newlineBits(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	n := x ^ (ones * '\n')
	return (n - ones) &^ n & highs
}

// Judge compares a routing prediction with what the endpoint reported. The
// request had promptBlocks blocks, the index predicted predictedBlocks of
// them cached, and the server reported cachedTokens of promptTokens. It
// returns the predicted cached tokens (the prediction scaled to the
// server's token count) and, when the server reported clearly fewer
// blocks than predicted, the block from which the prediction was wrong
// (forget >= 0); forget is -1 otherwise. slack is the blocks of rounding
// forgiven (vLLM caches only full blocks and always computes the last
// token; a block here is an estimate of tokens from bytes).
func Judge(promptBlocks, predictedBlocks int, promptTokens, cachedTokens int64, slack int) (predictedTokens int64, forget int) {
	if promptBlocks <= 0 || promptTokens <= 0 {
		return 0, -1
	}
	cachedTokens = min(max(cachedTokens, 0), promptTokens)
	predictedTokens = int64(predictedBlocks) * promptTokens / int64(promptBlocks)
	reportedBlocks := int(cachedTokens * int64(promptBlocks) / promptTokens)
	if predictedBlocks > reportedBlocks+max(slack, predictedBlocks/10) {
		return predictedTokens, reportedBlocks
	}
	return predictedTokens, -1
}
