package filter

import (
	"time"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// clock reads the time for the router with as few host calls as a request
// allows: in the .wasm every clock read is a host call (WASI
// clock_time_get), time.Now is two (wall and monotonic clock) and
// time.Since one. So callbacks are timed on the monotonic clock alone
// (Since), and the wall clock is read once per decision (Decide), for
// staleness and the snapshot-age gauge.
type clock struct {
	// epoch is a reading taken at start; Since is the time after it.
	epoch time.Time
	// inject replaces the wall clock (tests); nil means time.Now.
	inject func() time.Time
	// injectMono replaces Since (tests); nil means time.Since(epoch).
	injectMono func() time.Duration
	// now is the wall-clock time of the decision being made: what the
	// scheduler's clock returns. mono is Since at that moment.
	now  time.Time
	mono time.Duration
}

func newClock(inject func() time.Time, mono func() time.Duration) clock {
	return clock{epoch: time.Now(), inject: inject, injectMono: mono}
}

// Since is the monotonic time since the router started: one host call.
func (c *clock) Since() time.Duration {
	if c.injectMono != nil {
		return c.injectMono()
	}
	return time.Since(c.epoch)
}

// Decide reads the clock for the decision about to be made (Now, Mono)
// and returns Mono.
func (c *clock) Decide() time.Duration {
	now := time.Now()
	c.now, c.mono = now, now.Sub(c.epoch)
	if c.injectMono != nil {
		c.mono = c.injectMono()
	}
	if c.inject != nil {
		c.now = c.inject()
	}
	return c.mono
}

// Now is the time of the current decision (Decide).
func (c *clock) Now() time.Time { return c.now }

// Mono is Since at the current decision (Decide).
func (c *clock) Mono() time.Duration { return c.mono }

// logLevelRefresh is how long the host's answer about its log level is
// kept: a change of Envoy's log level (admin /logging) shows within it.
const logLevelRefresh = time.Second

// logLevel caches the host's log level, so that the decision log costs
// nothing unless debug logging is on: asking is a host call, and Envoy's
// level changes rarely.
type logLevel struct {
	// ask asks the host (proxywasm.GetLogLevel in the .wasm).
	ask   func() (proxywasm.LogLevel, error)
	level proxywasm.LogLevel
	known bool
	at    time.Duration
}

// Debug reports whether the host logs at debug level; now is a monotonic
// reading (clock.Mono). The host is asked at most once per logLevelRefresh.
func (l *logLevel) Debug(now time.Duration) bool {
	if !l.known || now-l.at >= logLevelRefresh || now < l.at {
		lvl, err := l.ask()
		if err != nil {
			return false
		}
		l.level, l.known, l.at = lvl, true, now
	}
	return l.level <= proxywasm.LogLevelDebug
}
