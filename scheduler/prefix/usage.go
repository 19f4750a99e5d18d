package prefix

import "encoding/binary"

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
type UsageScanner struct {
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

// Write scans the next chunk.
func (s *UsageScanner) Write(p []byte) {
	for i := 0; i < len(p); {
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
		case '[':
			s.depth++
			s.pending, s.openPending = keyNone, keyNone
		case ']':
			s.depth = max(s.depth-1, 0)
		case ',':
			s.pending, s.openPending, s.keyLen = keyNone, keyNone, 0
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
		}
	}
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
			*s = UsageScanner{prompt: s.prompt, cached: s.cached, havePrompt: s.havePrompt, haveCached: s.haveCached}
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
