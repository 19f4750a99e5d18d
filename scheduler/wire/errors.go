package wire

import (
	"errors"
	"strconv"
)

// Kinds of failure. Every error this package returns wraps exactly one of
// them, so callers branch with errors.Is (the receiver maps them to HTTP
// statuses) and still get a message naming the field.
var (
	// ErrFormat: the payload does not start with the expected magic (not a
	// wire payload, or a stored value given where a push is expected).
	ErrFormat = errors.New("not a wasm-epp wire payload of this kind")
	// ErrVersion: the magic is right but the version is not one this build reads.
	ErrVersion = errors.New("unsupported wire version")
	// ErrTruncated: the payload ends in the middle of a field.
	ErrTruncated = errors.New("truncated payload")
	// ErrTrailing: bytes follow a complete message.
	ErrTrailing = errors.New("trailing bytes after message")
	// ErrLimit: a count, length or size exceeds the configured Limits.
	ErrLimit = errors.New("limit exceeded")
	// ErrInvalidField: a field holds a value outside its domain (NaN, a
	// negative or >1 KV usage, a bad address or port, an unsorted or
	// duplicate list, a non-shortest varint, a control character, ...).
	ErrInvalidField = errors.New("invalid field")
	// ErrStaleSequence: Merge got a push whose sequence number is not newer
	// than the last one accepted from that agent (the receiver answers 409).
	ErrStaleSequence = errors.New("sequence number not newer than the last accepted")
	// ErrClockSkew: a push's send time is further ahead of the receiver's
	// clock than Limits.MaxClockSkew allows (the receiver answers 400).
	ErrClockSkew = errors.New("send time ahead of the receiver's clock")
	// ErrStoredCorrupt wraps a failure to decode a stored configuration
	// record (DecideConfig), so the receiver can tell its own state apart
	// from a bad record (and replace it instead of refusing every record).
	ErrStoredCorrupt = errors.New("stored value unreadable")
)

// Error says what is wrong and where. Kind is one of the Err* values above.
type Error struct {
	Kind error
	// Where names the field, e.g. "push.endpoints[3].kv_cache_usage".
	Where string
	// Offset is the byte offset of the field when decoding, -1 when encoding.
	Offset int
	// Detail is a human-readable explanation with the offending value.
	Detail string
}

func (e *Error) Error() string {
	msg := "wire: " + e.Where + ": " + e.Detail + " (" + e.Kind.Error()
	if e.Offset >= 0 {
		msg += " at byte " + strconv.Itoa(e.Offset)
	}
	return msg + ")"
}

// Unwrap makes errors.Is(err, ErrLimit) and friends work.
func (e *Error) Unwrap() error { return e.Kind }

// errf builds an *Error; it is only called on failure paths.
func errf(kind error, where string, offset int, detail string) *Error {
	return &Error{Kind: kind, Where: where, Offset: offset, Detail: detail}
}

// at prefixes e.Where with a location and returns e, for errors found by a
// helper that only knows the field name.
func (e *Error) at(prefix string) *Error {
	if e.Where == "" {
		e.Where = prefix
	} else {
		e.Where = prefix + "." + e.Where
	}
	return e
}
