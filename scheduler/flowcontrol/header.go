package flowcontrol

import (
	"math"
	"time"
)

// TTLStatus is what ParseTTL made of a TTL header value.
type TTLStatus uint8

const (
	// TTLAbsent: no value; the configured TTL applies.
	TTLAbsent TTLStatus = iota
	// TTLValid: a decimal number of milliseconds, capped at the configured
	// TTL (a header may shorten the wait, never lengthen it). 0 means "do
	// not wait": the request is refused at once, as without flow control.
	TTLValid
	// TTLMalformed: anything else (signs, units, spaces inside, fractions,
	// non-ASCII). It is ignored: the configured TTL applies, and the caller
	// counts it. A malformed header never changes what happens to a
	// request, and refusing it only when the request would have waited
	// would turn a client bug into an error that shows only under load.
	TTLMalformed
)

// ParseTTL reads a TTL header value: ASCII digits only, milliseconds. Huge
// numbers saturate (and are then capped at limit). It returns the TTL to
// use: limit unless the status is TTLValid. It allocates nothing.
func ParseTTL(v []byte, limit time.Duration) (time.Duration, TTLStatus) {
	if len(v) == 0 {
		return limit, TTLAbsent
	}
	const maxMillis = math.MaxInt64 / int64(time.Millisecond)
	var ms int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return limit, TTLMalformed
		}
		if ms <= maxMillis {
			ms = ms*10 + int64(c-'0')
		}
	}
	if ms > maxMillis {
		return limit, TTLValid
	}
	return min(time.Duration(ms)*time.Millisecond, limit), TTLValid
}

// FlowKeyStatus is what FlowKey made of a flow header value.
type FlowKeyStatus uint8

const (
	// FlowKeyOK: the value names the flow.
	FlowKeyOK FlowKeyStatus = iota
	// FlowKeyMissing: no value; the request joins the anonymous flow.
	FlowKeyMissing
	// FlowKeyTooLong: longer than the configured bound; the request joins
	// the anonymous flow (and the caller counts it), so no client can
	// spend the flow table's memory on long keys or claim a flow of its
	// own by varying a long value's tail.
	FlowKeyTooLong
)

// FlowKey bounds a flow header value: it returns the key to queue under
// (v itself, or the anonymous flow's empty key).
func FlowKey(v []byte, maxBytes int) ([]byte, FlowKeyStatus) {
	switch {
	case len(v) == 0:
		return nil, FlowKeyMissing
	case len(v) > maxBytes:
		return nil, FlowKeyTooLong
	}
	return v, FlowKeyOK
}

// LogLimiter lets a message through at most once per interval and counts
// what it held back, so a log line can say how many were suppressed.
type LogLimiter struct {
	Interval time.Duration
	last     time.Duration
	started  bool
	held     uint64
}

// Allow reports whether a message may be logged at now (a monotonic
// time), and how many were held back since the last one allowed.
func (l *LogLimiter) Allow(now time.Duration) (ok bool, suppressed uint64) {
	if l.started && now-l.last < l.Interval && now >= l.last {
		l.held++
		return false, 0
	}
	l.started, l.last = true, now
	suppressed, l.held = l.held, 0
	return true, suppressed
}
