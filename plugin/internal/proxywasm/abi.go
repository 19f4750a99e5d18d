package proxywasm

import (
	"math"
	"strconv"
)

// LogLevel is a proxy-wasm log level, as returned by GetLogLevel.
type LogLevel uint32

// Log levels, as the proxy-wasm ABI 0.2.1 numbers them (proxy_log).
const (
	LogLevelTrace LogLevel = iota
	LogLevelDebug
	LogLevelInfo
	LogLevelWarn
	LogLevelError
	LogLevelCritical
)

func (l LogLevel) String() string {
	switch l {
	case LogLevelTrace:
		return "trace"
	case LogLevelDebug:
		return "debug"
	case LogLevelInfo:
		return "info"
	case LogLevelWarn:
		return "warn"
	case LogLevelError:
		return "error"
	case LogLevelCritical:
		return "critical"
	}
	return "level(" + strconv.FormatUint(uint64(l), 10) + ")"
}

// ABI enumerations, as the proxy-wasm ABI 0.2.1 and proxy-wasm-cpp-host
// number them (buffer, header map, stream and metric types; e2e/envoyhost
// emulates the host, citing its source).
const (
	bufferHttpRequestBody      = 0
	bufferHttpResponseBody     = 1
	bufferHttpCallResponseBody = 4
	bufferVMConfiguration      = 6
	bufferPluginConfiguration  = 7

	mapHttpRequestHeaders       = 0
	mapHttpRequestTrailers      = 1
	mapHttpResponseHeaders      = 2
	mapHttpResponseTrailers     = 3
	mapHttpCallResponseHeaders  = 6
	mapHttpCallResponseTrailers = 7

	streamRequest  = 0
	streamResponse = 1

	metricCounter   = 0
	metricGauge     = 1
	metricHistogram = 2
)

// wholeBuffer is the length meaning "to the end" in buffer calls, and the start
// meaning "append"; the SDK uses the same value.
const wholeBuffer = math.MaxInt32

// clampSize converts a caller's int offset or length to the ABI's u32, capping
// at wholeBuffer. Negative values are the caller's error.
func clampSize(n int) (uint32, bool) {
	if n < 0 {
		return 0, false
	}
	if n > wholeBuffer {
		return wholeBuffer, true
	}
	return uint32(n), true
}
