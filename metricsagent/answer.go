package metricsagent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// answerHead is what the agent needs of an HTTP/1.x answer's head.
//
// The agent reads it itself instead of with http.ReadResponse, which builds
// a Response, a header map and a string per header for every answer: at
// 2000 scrapes a second that was a sixth of the agent's CPU and most of its
// allocations. The rules are net/http's (ReadResponse, its transfer
// coding rules, textproto's ReadMIMEHeader) for everything the agent
// reads; FuzzReadAnswerHead holds the two to the same answers. Where this
// reader is stricter its error wraps errStricter; it is never more lenient.
type answerHead struct {
	status int
	// contentType is the first Content-Type value, in the reader's own
	// storage (valid until the next head is read); nil when absent.
	contentType []byte
	// contentLength is the body length, or -1 when the body is chunked or
	// runs to the end of the connection.
	contentLength int64
	chunked       bool
	// close: the server ends the connection after this answer (it said
	// so, or HTTP/1.0 without keep-alive, or a body that runs to the end).
	close bool

	fields headFields // storage reused from answer to answer
}

// maxHeadBytes bounds an answer's head. A model server's is a few hundred
// bytes; net/http's client allows 10 MB (Transport.MaxResponseHeaderBytes'
// default), far beyond what any metrics endpoint sends.
const maxHeadBytes = 64 << 10

// errMalformedAnswer is an answer that is not HTTP/1.x as net/http reads it.
var errMalformedAnswer = errors.New("malformed HTTP answer")

// errStricter marks the answers this reader refuses though net/http reads
// them: a folded field line (a line beginning with a blank; no model
// server folds), and heads, trailers or lines over this reader's bounds.
var errStricter = fmt.Errorf("%w (stricter than net/http)", errMalformedAnswer)

func stricter(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errStricter}, args...)...)
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errMalformedAnswer}, args...)...)
}

// readAnswerHead reads the status line and header fields of one answer
// from br into h.
func readAnswerHead(br *bufio.Reader, h *answerHead) error {
	*h = answerHead{contentLength: -1, fields: h.fields}
	budget := maxHeadBytes
	line, err := readHeadLine(br, &budget)
	if err != nil {
		return err
	}
	// "HTTP/1.1 200 OK": the version, one space, then the code after any
	// further spaces (ReadResponse trims them), then anything.
	proto, status, ok := bytes.Cut(line, []byte(" "))
	if !ok {
		return malformed("status line %q", line)
	}
	status = bytes.TrimLeft(status, " ")
	code, _, _ := bytes.Cut(status, []byte(" "))
	major, minor, ok := parseHTTPVersion(proto)
	if len(code) != 3 || !ok {
		return malformed("status line %q", line)
	}
	n, err := strconv.Atoi(string(code))
	if err != nil || n < 0 {
		return malformed("status code %q", code)
	}
	h.status = n

	f := &h.fields
	if err := readFields(br, &budget, f, false); err != nil {
		return err
	}
	// Transfer codings need HTTP/1.1; net/http ignores them before, but
	// reads an "HTTP/0.0" answer's as 1.1 (transfer.go readTransfer).
	atLeast11 := major > 1 || major == 1 && minor >= 1 || major == 0 && minor == 0
	if f.encodings > 0 && atLeast11 {
		if f.encodings > 1 || !asciiEqualFold(f.encoding, "chunked") {
			return malformed("Transfer-Encoding %q: only a single chunked is read", f.encoding)
		}
		h.chunked = true
	}
	if f.badTrailer && h.chunked {
		return malformed("Trailer names a field that cannot be a trailer")
	}
	// Content-Length is checked even where chunked overrides it.
	if f.lengths > 0 {
		n, err := parseContentLength(f.length)
		if err != nil {
			return err
		}
		if !h.chunked {
			h.contentLength = n
		}
	}
	if f.haveType {
		h.contentType = f.contentType
	}
	// net/http's shouldClose: before 1.0 always; 1.0 unless keep-alive;
	// later if the server says close. A body that runs to the end of the
	// connection closes it too.
	switch {
	case major < 1:
		h.close = true
	case major == 1 && minor == 0:
		h.close = f.closeToken || !f.keepAliveToken
	default:
		h.close = f.closeToken
	}
	if !h.chunked && h.contentLength < 0 {
		h.close = true
	}
	return nil
}

// headFields is what readFields gathers from a field section.
type headFields struct {
	lengths, encodings         int
	length, encoding           []byte // the first values (copied)
	contentType                []byte // the first value (copied)
	haveType                   bool
	closeToken, keepAliveToken bool // in Connection
	badTrailer                 bool // Trailer names Content-Length, Transfer-Encoding or Trailer
}

// readFields reads header fields up to the empty line that ends them, as
// net/textproto's ReadMIMEHeader does: "Name: value" lines, the line's
// surrounding blanks trimmed, a name of token characters (spaces allowed,
// but such a name matches no field: textproto does not canonicalize it),
// a value of visible characters, blanks and obs-text.
//
// In a trailer (trailer true) only the line rules apply: net/http merges
// trailer fields without reading them.
func readFields(br *bufio.Reader, budget *int, f *headFields, trailer bool) error {
	*f = headFields{length: f.length[:0], encoding: f.encoding[:0], contentType: f.contentType[:0]}
	for {
		line, err := readHeadLine(br, budget)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			// net/textproto refuses it before the first field and folds
			// it into the previous one after; no model server folds,
			// and this reader refuses both.
			return stricter("header line %q begins with a blank", line)
		}
		line = bytes.TrimRight(line, " \t")
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !validFieldName(name) {
			return malformed("header line %q", line)
		}
		for _, c := range value {
			if !validFieldValueByte(c) {
				return malformed("header line %q", line)
			}
		}
		value = bytes.TrimLeft(value, " \t")
		if trailer {
			continue
		}
		switch {
		case asciiEqualFold(name, "Content-Length"):
			// Several are allowed only if they agree (transfer.go fixLength).
			if f.lengths > 0 && !bytes.Equal(f.length, value) {
				return malformed("Content-Length given twice, %q and %q", f.length, value)
			}
			f.lengths++
			f.length = append(f.length[:0], value...)
		case asciiEqualFold(name, "Transfer-Encoding"):
			f.encodings++
			if f.encodings == 1 {
				f.encoding = append(f.encoding[:0], value...)
			}
		case asciiEqualFold(name, "Connection"):
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				tok = bytes.Trim(tok, " \t")
				f.closeToken = f.closeToken || asciiEqualFold(tok, "close")
				f.keepAliveToken = f.keepAliveToken || asciiEqualFold(tok, "keep-alive")
			}
		case asciiEqualFold(name, "Content-Type"):
			if !f.haveType {
				f.haveType = true
				f.contentType = append(f.contentType[:0], value...)
			}
		case asciiEqualFold(name, "Trailer"):
			for key := range bytes.SplitSeq(value, []byte(",")) {
				key = bytes.Trim(key, " \t\r\n")
				if asciiEqualFold(key, "Content-Length") || asciiEqualFold(key, "Transfer-Encoding") || asciiEqualFold(key, "Trailer") {
					f.badTrailer = true
				}
			}
		}
	}
}

// readTrailer reads what follows a chunked body's last chunk, as net/http's
// body.readTrailer does: a bare CRLF, or trailer fields ending in an empty
// line, which must already be in sight (net/http refuses to read an
// unbounded trailer).
func readTrailer(br *bufio.Reader) error {
	buf, err := br.Peek(2)
	if string(buf) == "\r\n" {
		_, _ = br.Discard(2)
		return nil
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err // a timeout stays a timeout
	}
	if len(buf) < 2 {
		return io.ErrUnexpectedEOF
	}
	for size := 4; ; size++ {
		buf, err := br.Peek(size)
		if bytes.HasSuffix(buf, []byte("\r\n\r\n")) {
			break
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, bufio.ErrBufferFull):
			return malformed("trailer after the chunked body does not end in sight")
		default:
			return err
		}
	}
	budget := maxHeadBytes
	return readFields(br, &budget, &headFields{}, true)
}

// readHeadLine returns the next line of the head without its "\n" or
// "\r\n" (net/textproto accepts both), charging it to budget. The line is
// only valid until the next read from br.
func readHeadLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, stricter("head line longer than %d bytes", br.Size())
	}
	if err != nil {
		return nil, err // io.EOF before the head ended included: a plain I/O error
	}
	if *budget -= len(line); *budget < 0 {
		return nil, stricter("head over %d bytes", maxHeadBytes)
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseHTTPVersion reads "HTTP/x.y" with one digit each, as net/http's
// ParseHTTPVersion does.
func parseHTTPVersion(v []byte) (major, minor int, ok bool) {
	if len(v) != 8 || string(v[:5]) != "HTTP/" || v[6] != '.' {
		return 0, 0, false
	}
	if v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9' {
		return 0, 0, false
	}
	return int(v[5] - '0'), int(v[7] - '0'), true
}

// parseContentLength accepts only digits, as net/http does (no sign, no
// blanks inside, at most MaxInt64).
func parseContentLength(v []byte) (int64, error) {
	if len(v) == 0 {
		return 0, malformed("empty Content-Length")
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, malformed("Content-Length %q", v)
		}
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, malformed("Content-Length %q", v)
	}
	return n, nil
}

// validFieldName: a header name is a non-empty token (RFC 9110 5.1), or
// one with spaces, which net/textproto takes without canonicalizing it.
func validFieldName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if !isTokenByte(c) && c != ' ' {
			return false
		}
	}
	return true
}

// validFieldValueByte: visible ASCII, space, tab, or obs-text (>= 0x80).
func validFieldValueByte(c byte) bool {
	return c == '\t' || (c >= 0x20 && c != 0x7f)
}

func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// asciiEqualFold compares b with the ASCII string s ignoring ASCII case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
