//go:build wasip1

package proxywasm

import (
	"fmt"
	"unsafe"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Out-parameters of host calls (see imports_wasip1.go for why they are not
// locals). One VM runs one call at a time.
var (
	retData  uint32
	retSize  uint32
	retCas   uint32
	retU32   uint32
	retValue uint64
)

// scratch holds pairs and property paths while the host reads them; it is
// reused so encoding allocates nothing in the steady state.
var scratch []byte

// maxScratchKept caps the scratch buffer kept between calls.
const maxScratchKept = 64 << 10

func releaseScratch(buf []byte) {
	if cap(buf) <= maxScratchKept {
		scratch = buf[:0]
	} else {
		scratch = nil
	}
}

// SetVMContext registers the plugin. Call it from init (it makes no host call).
func SetVMContext(ctx types.VMContext) { vm.vm = ctx }

func stringData(s string) unsafe.Pointer { return unsafe.Pointer(unsafe.StringData(s)) }
func bytesData(b []byte) unsafe.Pointer  { return unsafe.Pointer(unsafe.SliceData(b)) }

// takeReturned unpins and returns the data the host reported in retData/retSize.
func takeReturned() ([]byte, error) {
	return buffers.take(uintptr(retData), retSize)
}

// --- Configuration, timers, lifecycle ---

// GetVMConfiguration returns vm_config.configuration. Envoy makes it readable
// during OnVMStart only.
func GetVMConfiguration() ([]byte, error) {
	return getBuffer(bufferVMConfiguration, 0, wholeBuffer)
}

// GetPluginConfiguration returns config.configuration. Envoy makes it readable
// during OnPluginStart only (NotFound elsewhere).
func GetPluginConfiguration() ([]byte, error) {
	return getBuffer(bufferPluginConfiguration, 0, wholeBuffer)
}

// SetTickPeriodMilliSeconds sets the OnTick period of the active root
// context; 0 stops the timer.
func SetTickPeriodMilliSeconds(millSec uint32) error {
	return statusToError(proxySetTickPeriodMilliseconds(millSec))
}

// SetEffectiveContext makes later host calls act on contextID.
func SetEffectiveContext(contextID uint32) error {
	return statusToError(proxySetEffectiveContext(contextID))
}

// PluginDone tells the host a root context that returned false from
// OnPluginDone has finished.
func PluginDone() { proxyDone() }

// --- Logging ---

func logMessage(level LogLevel, msg string) {
	proxyLog(uint32(level), stringData(msg), uint32(len(msg)))
}

// GetLogLevel returns the host's current log level (ABI 0.2.1).
func GetLogLevel() (LogLevel, error) {
	if err := statusToError(proxyGetLogLevel(&retU32)); err != nil {
		return 0, err
	}
	return LogLevel(retU32), nil
}

// LogTrace logs msg at trace level.
func LogTrace(msg string) { logMessage(LogLevelTrace, msg) }

// LogTracef formats and logs at trace level.
func LogTracef(format string, args ...any) { logMessage(LogLevelTrace, fmt.Sprintf(format, args...)) }

// LogDebug logs msg at debug level.
func LogDebug(msg string) { logMessage(LogLevelDebug, msg) }

// LogDebugf formats and logs at debug level.
func LogDebugf(format string, args ...any) { logMessage(LogLevelDebug, fmt.Sprintf(format, args...)) }

// LogInfo logs msg at info level.
func LogInfo(msg string) { logMessage(LogLevelInfo, msg) }

// LogInfof formats and logs at info level.
func LogInfof(format string, args ...any) { logMessage(LogLevelInfo, fmt.Sprintf(format, args...)) }

// LogWarn logs msg at warn level.
func LogWarn(msg string) { logMessage(LogLevelWarn, msg) }

// LogWarnf formats and logs at warn level.
func LogWarnf(format string, args ...any) { logMessage(LogLevelWarn, fmt.Sprintf(format, args...)) }

// LogError logs msg at error level.
func LogError(msg string) { logMessage(LogLevelError, msg) }

// LogErrorf formats and logs at error level.
func LogErrorf(format string, args ...any) { logMessage(LogLevelError, fmt.Sprintf(format, args...)) }

// LogCritical logs msg at critical level.
func LogCritical(msg string) { logMessage(LogLevelCritical, msg) }

// LogCriticalf formats and logs at critical level.
func LogCriticalf(format string, args ...any) {
	logMessage(LogLevelCritical, fmt.Sprintf(format, args...))
}

// --- Buffers ---

func getBuffer(bufferType uint32, start, maxSize int) ([]byte, error) {
	s, okStart := clampSize(start)
	n, okSize := clampSize(maxSize)
	if !okStart || !okSize {
		return nil, types.ErrorStatusBadArgument
	}
	if err := statusToError(proxyGetBufferBytes(bufferType, s, n, &retData, &retSize)); err != nil {
		return nil, err
	}
	return takeReturned()
}

// setBuffer calls proxy_set_buffer_bytes: (0, wholeBuffer) replaces, (0, 0)
// prepends, (wholeBuffer, 0) appends, as Envoy's set_buffer_bytes reads
// them (e2e/envoyhost emulates it).
func setBuffer(bufferType, start, size uint32, data []byte) error {
	return statusToError(proxySetBufferBytes(bufferType, start, size, bytesData(data), uint32(len(data))))
}

// GetHttpRequestBody returns up to maxSize bytes of the buffered request body
// from start. Available in OnHttpRequestBody.
func GetHttpRequestBody(start, maxSize int) ([]byte, error) {
	return getBuffer(bufferHttpRequestBody, start, maxSize)
}

// AppendHttpRequestBody appends data to the request body. Remove
// content-length in OnHttpRequestHeaders when the body may change size.
func AppendHttpRequestBody(data []byte) error {
	return setBuffer(bufferHttpRequestBody, wholeBuffer, 0, data)
}

// PrependHttpRequestBody prepends data to the request body.
func PrependHttpRequestBody(data []byte) error {
	return setBuffer(bufferHttpRequestBody, 0, 0, data)
}

// ReplaceHttpRequestBody replaces the whole request body buffered so far.
func ReplaceHttpRequestBody(data []byte) error {
	return setBuffer(bufferHttpRequestBody, 0, wholeBuffer, data)
}

// GetHttpResponseBody returns up to maxSize bytes of the buffered response body
// from start. Available in OnHttpResponseBody.
func GetHttpResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(bufferHttpResponseBody, start, maxSize)
}

// AppendHttpResponseBody appends data to the response body.
func AppendHttpResponseBody(data []byte) error {
	return setBuffer(bufferHttpResponseBody, wholeBuffer, 0, data)
}

// PrependHttpResponseBody prepends data to the response body.
func PrependHttpResponseBody(data []byte) error {
	return setBuffer(bufferHttpResponseBody, 0, 0, data)
}

// ReplaceHttpResponseBody replaces the whole response body buffered so far.
func ReplaceHttpResponseBody(data []byte) error {
	return setBuffer(bufferHttpResponseBody, 0, wholeBuffer, data)
}

// GetHttpRequestBodyInto is GetHttpRequestBody reading into buf's storage
// when the data fits in cap(buf): the result then aliases buf and nothing is
// allocated (else it is a fresh slice, as from GetHttpRequestBody). A plugin
// that reads every request body passes the same buffer each time, so a
// request touches memory that is already warm instead of a new allocation.
func GetHttpRequestBodyInto(buf []byte, start, maxSize int) ([]byte, error) {
	buffers.offer(buf)
	b, err := getBuffer(bufferHttpRequestBody, start, maxSize)
	buffers.offer(nil) // no defer: a panic traps the VM anyway
	return b, err
}

// GetHttpResponseBodyInto is GetHttpResponseBody into buf's storage when it
// fits (see GetHttpRequestBodyInto).
func GetHttpResponseBodyInto(buf []byte, start, maxSize int) ([]byte, error) {
	buffers.offer(buf)
	b, err := getBuffer(bufferHttpResponseBody, start, maxSize)
	buffers.offer(nil)
	return b, err
}

// GetHttpCallResponseBody returns the body of the HTTP call response; only in
// the DispatchHttpCall callback.
func GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return getBuffer(bufferHttpCallResponseBody, start, maxSize)
}

// --- Header maps ---

func getMap(mapType uint32) ([][2]string, error) {
	if err := statusToError(proxyGetHeaderMapPairs(mapType, &retData, &retSize)); err != nil {
		return nil, err
	}
	b, err := takeReturned()
	if err != nil {
		return nil, err
	}
	return decodePairs(b)
}

func setMap(mapType uint32, pairs [][2]string) error {
	buf, err := appendPairs(scratch[:0], pairs)
	if err != nil {
		return err
	}
	st := proxySetHeaderMapPairs(mapType, bytesData(buf), uint32(len(buf)))
	releaseScratch(buf)
	return statusToError(st)
}

func getMapValue(mapType uint32, key string) (string, error) {
	if err := statusToError(proxyGetHeaderMapValue(mapType, stringData(key), uint32(len(key)), &retData, &retSize)); err != nil {
		return "", err
	}
	b, err := takeReturned()
	if err != nil {
		return "", err
	}
	return bytesToString(b), nil
}

func addMapValue(mapType uint32, key, value string) error {
	return statusToError(proxyAddHeaderMapValue(mapType, stringData(key), uint32(len(key)), stringData(value), uint32(len(value))))
}

func replaceMapValue(mapType uint32, key, value string) error {
	return statusToError(proxyReplaceHeaderMapValue(mapType, stringData(key), uint32(len(key)), stringData(value), uint32(len(value))))
}

func removeMapValue(mapType uint32, key string) error {
	return statusToError(proxyRemoveHeaderMapValue(mapType, stringData(key), uint32(len(key))))
}

// GetHttpRequestHeaders returns all request headers (nil when there are none).
func GetHttpRequestHeaders() ([][2]string, error) { return getMap(mapHttpRequestHeaders) }

// ReplaceHttpRequestHeaders replaces the whole request header map.
func ReplaceHttpRequestHeaders(headers [][2]string) error {
	return setMap(mapHttpRequestHeaders, headers)
}

// GetHttpRequestHeader returns the first value of key ("" with nil error for an
// empty value; ErrorStatusNotFound when absent).
func GetHttpRequestHeader(key string) (string, error) { return getMapValue(mapHttpRequestHeaders, key) }

// GetHttpRequestHeaderInto is GetHttpRequestHeader returning the value as
// bytes, read into buf's storage when it fits (see GetHttpRequestBodyInto):
// a header read on every request then allocates nothing.
func GetHttpRequestHeaderInto(buf []byte, key string) ([]byte, error) {
	buffers.offer(buf)
	st := proxyGetHeaderMapValue(mapHttpRequestHeaders, stringData(key), uint32(len(key)), &retData, &retSize)
	buffers.offer(nil)
	if err := statusToError(st); err != nil {
		return nil, err
	}
	return takeReturned()
}

// RemoveHttpRequestHeader removes every value of key (no error when absent).
func RemoveHttpRequestHeader(key string) error { return removeMapValue(mapHttpRequestHeaders, key) }

// ReplaceHttpRequestHeader sets key to the single value value.
func ReplaceHttpRequestHeader(key, value string) error {
	return replaceMapValue(mapHttpRequestHeaders, key, value)
}

// AddHttpRequestHeader appends a value for key.
func AddHttpRequestHeader(key, value string) error {
	return addMapValue(mapHttpRequestHeaders, key, value)
}

// GetHttpRequestTrailers returns all request trailers.
func GetHttpRequestTrailers() ([][2]string, error) { return getMap(mapHttpRequestTrailers) }

// ReplaceHttpRequestTrailers replaces the whole request trailer map.
func ReplaceHttpRequestTrailers(trailers [][2]string) error {
	return setMap(mapHttpRequestTrailers, trailers)
}

// GetHttpRequestTrailer returns the first value of a request trailer.
func GetHttpRequestTrailer(key string) (string, error) {
	return getMapValue(mapHttpRequestTrailers, key)
}

// RemoveHttpRequestTrailer removes every value of a request trailer.
func RemoveHttpRequestTrailer(key string) error { return removeMapValue(mapHttpRequestTrailers, key) }

// ReplaceHttpRequestTrailer sets a request trailer to one value.
func ReplaceHttpRequestTrailer(key, value string) error {
	return replaceMapValue(mapHttpRequestTrailers, key, value)
}

// AddHttpRequestTrailer appends a value for a request trailer.
func AddHttpRequestTrailer(key, value string) error {
	return addMapValue(mapHttpRequestTrailers, key, value)
}

// GetHttpResponseHeaders returns all response headers.
func GetHttpResponseHeaders() ([][2]string, error) { return getMap(mapHttpResponseHeaders) }

// ReplaceHttpResponseHeaders replaces the whole response header map.
func ReplaceHttpResponseHeaders(headers [][2]string) error {
	return setMap(mapHttpResponseHeaders, headers)
}

// GetHttpResponseHeader returns the first value of a response header.
func GetHttpResponseHeader(key string) (string, error) {
	return getMapValue(mapHttpResponseHeaders, key)
}

// RemoveHttpResponseHeader removes every value of a response header.
func RemoveHttpResponseHeader(key string) error { return removeMapValue(mapHttpResponseHeaders, key) }

// ReplaceHttpResponseHeader sets a response header to one value.
func ReplaceHttpResponseHeader(key, value string) error {
	return replaceMapValue(mapHttpResponseHeaders, key, value)
}

// AddHttpResponseHeader appends a value for a response header.
func AddHttpResponseHeader(key, value string) error {
	return addMapValue(mapHttpResponseHeaders, key, value)
}

// GetHttpResponseTrailers returns all response trailers.
func GetHttpResponseTrailers() ([][2]string, error) { return getMap(mapHttpResponseTrailers) }

// ReplaceHttpResponseTrailers replaces the whole response trailer map.
func ReplaceHttpResponseTrailers(trailers [][2]string) error {
	return setMap(mapHttpResponseTrailers, trailers)
}

// GetHttpResponseTrailer returns the first value of a response trailer.
func GetHttpResponseTrailer(key string) (string, error) {
	return getMapValue(mapHttpResponseTrailers, key)
}

// RemoveHttpResponseTrailer removes every value of a response trailer.
func RemoveHttpResponseTrailer(key string) error {
	return removeMapValue(mapHttpResponseTrailers, key)
}

// ReplaceHttpResponseTrailer sets a response trailer to one value.
func ReplaceHttpResponseTrailer(key, value string) error {
	return replaceMapValue(mapHttpResponseTrailers, key, value)
}

// AddHttpResponseTrailer appends a value for a response trailer.
func AddHttpResponseTrailer(key, value string) error {
	return addMapValue(mapHttpResponseTrailers, key, value)
}

// GetHttpCallResponseHeaders returns the HTTP call response headers; only in
// the DispatchHttpCall callback.
func GetHttpCallResponseHeaders() ([][2]string, error) { return getMap(mapHttpCallResponseHeaders) }

// GetHttpCallResponseTrailers returns the HTTP call response trailers.
func GetHttpCallResponseTrailers() ([][2]string, error) {
	return getMap(mapHttpCallResponseTrailers)
}

// --- Stream control ---

// ResumeHttpRequest continues a request paused by an earlier callback.
func ResumeHttpRequest() error { return statusToError(proxyContinueStream(streamRequest)) }

// ResumeHttpResponse continues a response paused by an earlier callback.
func ResumeHttpResponse() error { return statusToError(proxyContinueStream(streamResponse)) }

// SendHttpResponse sends a local reply. Envoy applies it when the current
// callback returns; headers are added to the reply; gRPCStatus outside 0..16
// (e.g. -1) means none.
func SendHttpResponse(statusCode uint32, headers [][2]string, body []byte, gRPCStatus int32) error {
	buf, err := appendPairs(scratch[:0], headers)
	if err != nil {
		return err
	}
	st := proxySendLocalResponse(statusCode, nil, 0,
		bytesData(body), uint32(len(body)), bytesData(buf), uint32(len(buf)), gRPCStatus)
	releaseScratch(buf)
	return statusToError(st)
}

// --- HTTP calls ---

// DispatchHttpCall sends an HTTP request to cluster; headers must include
// :method, :path and :authority. callBack runs, in the calling context, when
// the response arrives (numHeaders 0 means the call failed); then
// GetHttpCallResponseHeaders/Body/Trailers are available. A nil callBack
// drops the response.
func DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMillisecond uint32, callBack func(numHeaders, bodySize, numTrailers int)) (calloutID uint32, err error) {
	buf, err := appendPairs(scratch[:0], headers)
	if err != nil {
		return 0, err
	}
	split := len(buf)
	if buf, err = appendPairs(buf, trailers); err != nil {
		return 0, err
	}
	h, t := buf[:split], buf[split:]
	st := proxyHttpCall(stringData(cluster), uint32(len(cluster)),
		bytesData(h), uint32(len(h)), bytesData(body), uint32(len(body)),
		bytesData(t), uint32(len(t)), timeoutMillisecond, &retU32)
	releaseScratch(buf)
	if err := statusToError(st); err != nil {
		return 0, err
	}
	vm.registerCallout(retU32, callBack)
	return retU32, nil
}

// --- Shared data ---

// GetSharedData returns the value and CAS of key in the vm_id-wide table
// (ErrorStatusNotFound for an unknown key).
func GetSharedData(key string) (value []byte, cas uint32, err error) {
	if err := statusToError(proxyGetSharedData(stringData(key), uint32(len(key)), &retData, &retSize, &retCas)); err != nil {
		return nil, 0, err
	}
	cas = retCas
	value, err = takeReturned()
	if err != nil {
		return nil, 0, err
	}
	return value, cas, nil
}

// GetSharedDataInto is GetSharedData reading the value into buf's storage
// when it fits in cap(buf) (see GetHttpRequestBodyInto).
func GetSharedDataInto(buf []byte, key string) (value []byte, cas uint32, err error) {
	buffers.offer(buf)
	value, cas, err = GetSharedData(key)
	buffers.offer(nil)
	return value, cas, err
}

// SetSharedData stores data under key. A non-zero cas must match the stored
// CAS (else ErrorStatusCasMismatch); cas 0 always writes.
func SetSharedData(key string, data []byte, cas uint32) error {
	return statusToError(proxySetSharedData(stringData(key), uint32(len(key)), bytesData(data), uint32(len(data)), cas))
}

// --- Properties ---

// GetProperty returns the raw property at path (e.g. {"source", "address"}).
func GetProperty(path []string) ([]byte, error) {
	buf, err := appendPropertyPath(scratch[:0], path)
	if err != nil {
		return nil, err
	}
	st := proxyGetProperty(bytesData(buf), uint32(len(buf)), &retData, &retSize)
	releaseScratch(buf)
	if err := statusToError(st); err != nil {
		return nil, err
	}
	return takeReturned()
}

// GetPropertyInto is GetProperty reading into buf's storage when the value
// fits in cap(buf) (see GetHttpRequestBodyInto).
func GetPropertyInto(buf []byte, path []string) ([]byte, error) {
	p, err := appendPropertyPath(scratch[:0], path)
	if err != nil {
		return nil, err
	}
	buffers.offer(buf)
	st := proxyGetProperty(bytesData(p), uint32(len(p)), &retData, &retSize)
	buffers.offer(nil)
	releaseScratch(p)
	if err := statusToError(st); err != nil {
		return nil, err
	}
	return takeReturned()
}

// GetPropertyMap returns a map-typed property decoded from the pairs format.
func GetPropertyMap(path []string) ([][2]string, error) {
	b, err := GetProperty(path)
	if err != nil {
		return nil, err
	}
	return decodePairs(b)
}

// SetProperty sets the property at path. Like the SDK, empty data is refused.
func SetProperty(path []string, data []byte) error {
	if len(data) == 0 {
		return ErrEmptyPropertyValue
	}
	buf, err := appendPropertyPath(scratch[:0], path)
	if err != nil {
		return err
	}
	st := proxySetProperty(bytesData(buf), uint32(len(buf)), bytesData(data), uint32(len(data)))
	releaseScratch(buf)
	return statusToError(st)
}

// --- Metrics ---

type (
	// MetricCounter is a counter; see DefineCounterMetric.
	MetricCounter uint32
	// MetricGauge is a gauge; see DefineGaugeMetric.
	MetricGauge uint32
	// MetricHistogram is a histogram; see DefineHistogramMetric.
	MetricHistogram uint32
)

func defineMetric(metricType uint32, name string) uint32 {
	if err := statusToError(proxyDefineMetric(metricType, stringData(name), uint32(len(name)), &retU32)); err != nil {
		panic("proxywasm: define metric " + name + ": " + err.Error())
	}
	return retU32
}

func metricValue(id uint32) uint64 {
	if err := statusToError(proxyGetMetric(id, &retValue)); err != nil {
		panic("proxywasm: get metric: " + err.Error())
	}
	return retValue
}

func incrementMetric(id uint32, offset int64) {
	if st := proxyIncrementMetric(id, offset); st != 0 {
		metricPanic("increment", st)
	}
}

// metricPanic is the SDK's reaction to a refused metric call, out of line
// so the metric calls on every request stay small.
//
//go:noinline
func metricPanic(what string, status uint32) {
	panic("proxywasm: " + what + " metric: " + statusToError(status).Error())
}

// DefineCounterMetric defines (or finds) a counter. Like the SDK it panics
// when the host refuses.
func DefineCounterMetric(name string) MetricCounter {
	return MetricCounter(defineMetric(metricCounter, name))
}

// Value returns this VM's view of the counter.
func (m MetricCounter) Value() uint64 { return metricValue(uint32(m)) }

// Increment adds offset (Envoy requires offset > 0 for counters).
func (m MetricCounter) Increment(offset uint64) { incrementMetric(uint32(m), int64(offset)) }

// DefineGaugeMetric defines (or finds) a gauge; panics when the host refuses.
func DefineGaugeMetric(name string) MetricGauge {
	return MetricGauge(defineMetric(metricGauge, name))
}

// Value returns this VM's view of the gauge.
func (m MetricGauge) Value() int64 { return int64(metricValue(uint32(m))) }

// Add adds offset (may be negative) to the gauge.
func (m MetricGauge) Add(offset int64) { incrementMetric(uint32(m), offset) }

// DefineHistogramMetric defines (or finds) a histogram; panics when the host
// refuses.
func DefineHistogramMetric(name string) MetricHistogram {
	return MetricHistogram(defineMetric(metricHistogram, name))
}

// Value returns the histogram's value where the host supports it (Envoy does
// not: it refuses, and this panics like the SDK).
func (m MetricHistogram) Value() uint64 { return metricValue(uint32(m)) }

// Record records value in the histogram.
func (m MetricHistogram) Record(value uint64) {
	if st := proxyRecordMetric(uint32(m), value); st != 0 {
		metricPanic("record", st)
	}
}
