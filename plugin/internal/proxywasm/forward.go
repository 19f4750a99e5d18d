//go:build !wasip1

package proxywasm

import (
	"errors"

	sdk "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Native build: every function forwards to the SDK, whose proxytest emulator
// then plays the host. See the package doc for the few normalisations.

type (
	// MetricCounter is the SDK's counter.
	MetricCounter = sdk.MetricCounter
	// MetricGauge is the SDK's gauge.
	MetricGauge = sdk.MetricGauge
	// MetricHistogram is the SDK's histogram.
	MetricHistogram = sdk.MetricHistogram
)

// emptyIfNotFound turns the SDK's NotFound for an empty buffer or map into
// empty data with no error, which is what Envoy returns.
func emptyIfNotFound[T any](v T, err error) (T, error) {
	if errors.Is(err, types.ErrorStatusNotFound) {
		var zero T
		return zero, nil
	}
	return v, err
}

// SetVMContext registers the plugin with the SDK (and so with proxytest).
func SetVMContext(ctx types.VMContext) { sdk.SetVMContext(ctx) }

// GetVMConfiguration forwards to the SDK.
func GetVMConfiguration() ([]byte, error) { return emptyIfNotFound(sdk.GetVMConfiguration()) }

// GetPluginConfiguration forwards to the SDK.
func GetPluginConfiguration() ([]byte, error) {
	return emptyIfNotFound(sdk.GetPluginConfiguration())
}

// SetTickPeriodMilliSeconds forwards to the SDK.
func SetTickPeriodMilliSeconds(millSec uint32) error { return sdk.SetTickPeriodMilliSeconds(millSec) }

// SetEffectiveContext forwards to the SDK.
func SetEffectiveContext(contextID uint32) error { return sdk.SetEffectiveContext(contextID) }

// PluginDone forwards to the SDK.
func PluginDone() { sdk.PluginDone() }

// GetLogLevel reports LogLevelTrace: the emulator records every level.
func GetLogLevel() (LogLevel, error) { return LogLevelTrace, nil }

// LogTrace forwards to the SDK.
func LogTrace(msg string) { sdk.LogTrace(msg) }

// LogTracef forwards to the SDK.
func LogTracef(format string, args ...any) { sdk.LogTracef(format, args...) }

// LogDebug forwards to the SDK.
func LogDebug(msg string) { sdk.LogDebug(msg) }

// LogDebugf forwards to the SDK.
func LogDebugf(format string, args ...any) { sdk.LogDebugf(format, args...) }

// LogInfo forwards to the SDK.
func LogInfo(msg string) { sdk.LogInfo(msg) }

// LogInfof forwards to the SDK.
func LogInfof(format string, args ...any) { sdk.LogInfof(format, args...) }

// LogWarn forwards to the SDK.
func LogWarn(msg string) { sdk.LogWarn(msg) }

// LogWarnf forwards to the SDK.
func LogWarnf(format string, args ...any) { sdk.LogWarnf(format, args...) }

// LogError forwards to the SDK.
func LogError(msg string) { sdk.LogError(msg) }

// LogErrorf forwards to the SDK.
func LogErrorf(format string, args ...any) { sdk.LogErrorf(format, args...) }

// LogCritical forwards to the SDK.
func LogCritical(msg string) { sdk.LogCritical(msg) }

// LogCriticalf forwards to the SDK.
func LogCriticalf(format string, args ...any) { sdk.LogCriticalf(format, args...) }

// GetHttpRequestBody forwards to the SDK (empty body: nil, nil).
func GetHttpRequestBody(start, maxSize int) ([]byte, error) {
	return emptyIfNotFound(sdk.GetHttpRequestBody(start, maxSize))
}

// AppendHttpRequestBody forwards to the SDK.
func AppendHttpRequestBody(data []byte) error { return sdk.AppendHttpRequestBody(data) }

// PrependHttpRequestBody forwards to the SDK.
func PrependHttpRequestBody(data []byte) error { return sdk.PrependHttpRequestBody(data) }

// ReplaceHttpRequestBody forwards to the SDK.
func ReplaceHttpRequestBody(data []byte) error { return sdk.ReplaceHttpRequestBody(data) }

// GetHttpResponseBody forwards to the SDK (empty body: nil, nil).
func GetHttpResponseBody(start, maxSize int) ([]byte, error) {
	return emptyIfNotFound(sdk.GetHttpResponseBody(start, maxSize))
}

// AppendHttpResponseBody forwards to the SDK.
func AppendHttpResponseBody(data []byte) error { return sdk.AppendHttpResponseBody(data) }

// PrependHttpResponseBody forwards to the SDK.
func PrependHttpResponseBody(data []byte) error { return sdk.PrependHttpResponseBody(data) }

// ReplaceHttpResponseBody forwards to the SDK.
func ReplaceHttpResponseBody(data []byte) error { return sdk.ReplaceHttpResponseBody(data) }

// into returns data in buf's storage when it fits, as the wasip1 build's
// *Into functions do (there the host writes it there directly).
func into(buf, data []byte) []byte {
	if len(data) == 0 || len(data) > cap(buf) {
		return data
	}
	return append(buf[:0], data...)
}

// GetHttpRequestBodyInto is GetHttpRequestBody, copied into buf's storage
// when it fits.
func GetHttpRequestBodyInto(buf []byte, start, maxSize int) ([]byte, error) {
	b, err := GetHttpRequestBody(start, maxSize)
	return into(buf, b), err
}

// GetHttpResponseBodyInto is GetHttpResponseBody, copied into buf's storage
// when it fits.
func GetHttpResponseBodyInto(buf []byte, start, maxSize int) ([]byte, error) {
	b, err := GetHttpResponseBody(start, maxSize)
	return into(buf, b), err
}

// GetHttpCallResponseBody forwards to the SDK (empty body: nil, nil).
func GetHttpCallResponseBody(start, maxSize int) ([]byte, error) {
	return emptyIfNotFound(sdk.GetHttpCallResponseBody(start, maxSize))
}

// GetHttpRequestHeaders forwards to the SDK.
func GetHttpRequestHeaders() ([][2]string, error) {
	return emptyIfNotFound(sdk.GetHttpRequestHeaders())
}

// ReplaceHttpRequestHeaders checks the host limits, then forwards to the SDK.
func ReplaceHttpRequestHeaders(headers [][2]string) error {
	if err := checkPairs(headers); err != nil {
		return err
	}
	return sdk.ReplaceHttpRequestHeaders(headers)
}

// GetHttpRequestHeader forwards to the SDK.
func GetHttpRequestHeader(key string) (string, error) { return sdk.GetHttpRequestHeader(key) }

// GetHttpRequestHeaderInto is GetHttpRequestHeader as bytes, copied into
// buf's storage when they fit.
func GetHttpRequestHeaderInto(buf []byte, key string) ([]byte, error) {
	v, err := sdk.GetHttpRequestHeader(key)
	if err != nil {
		return nil, err
	}
	return into(buf, []byte(v)), nil
}

// RemoveHttpRequestHeader forwards to the SDK.
func RemoveHttpRequestHeader(key string) error { return sdk.RemoveHttpRequestHeader(key) }

// ReplaceHttpRequestHeader forwards to the SDK.
func ReplaceHttpRequestHeader(key, value string) error {
	return sdk.ReplaceHttpRequestHeader(key, value)
}

// AddHttpRequestHeader forwards to the SDK.
func AddHttpRequestHeader(key, value string) error { return sdk.AddHttpRequestHeader(key, value) }

// GetHttpRequestTrailers forwards to the SDK.
func GetHttpRequestTrailers() ([][2]string, error) {
	return emptyIfNotFound(sdk.GetHttpRequestTrailers())
}

// ReplaceHttpRequestTrailers checks the host limits, then forwards to the SDK.
func ReplaceHttpRequestTrailers(trailers [][2]string) error {
	if err := checkPairs(trailers); err != nil {
		return err
	}
	return sdk.ReplaceHttpRequestTrailers(trailers)
}

// GetHttpRequestTrailer forwards to the SDK.
func GetHttpRequestTrailer(key string) (string, error) { return sdk.GetHttpRequestTrailer(key) }

// RemoveHttpRequestTrailer forwards to the SDK.
func RemoveHttpRequestTrailer(key string) error { return sdk.RemoveHttpRequestTrailer(key) }

// ReplaceHttpRequestTrailer forwards to the SDK.
func ReplaceHttpRequestTrailer(key, value string) error {
	return sdk.ReplaceHttpRequestTrailer(key, value)
}

// AddHttpRequestTrailer forwards to the SDK.
func AddHttpRequestTrailer(key, value string) error { return sdk.AddHttpRequestTrailer(key, value) }

// GetHttpResponseHeaders forwards to the SDK.
func GetHttpResponseHeaders() ([][2]string, error) {
	return emptyIfNotFound(sdk.GetHttpResponseHeaders())
}

// ReplaceHttpResponseHeaders checks the host limits, then forwards to the SDK.
func ReplaceHttpResponseHeaders(headers [][2]string) error {
	if err := checkPairs(headers); err != nil {
		return err
	}
	return sdk.ReplaceHttpResponseHeaders(headers)
}

// GetHttpResponseHeader forwards to the SDK.
func GetHttpResponseHeader(key string) (string, error) { return sdk.GetHttpResponseHeader(key) }

// RemoveHttpResponseHeader forwards to the SDK.
func RemoveHttpResponseHeader(key string) error { return sdk.RemoveHttpResponseHeader(key) }

// ReplaceHttpResponseHeader forwards to the SDK.
func ReplaceHttpResponseHeader(key, value string) error {
	return sdk.ReplaceHttpResponseHeader(key, value)
}

// AddHttpResponseHeader forwards to the SDK.
func AddHttpResponseHeader(key, value string) error { return sdk.AddHttpResponseHeader(key, value) }

// GetHttpResponseTrailers forwards to the SDK.
func GetHttpResponseTrailers() ([][2]string, error) {
	return emptyIfNotFound(sdk.GetHttpResponseTrailers())
}

// ReplaceHttpResponseTrailers checks the host limits, then forwards to the SDK.
func ReplaceHttpResponseTrailers(trailers [][2]string) error {
	if err := checkPairs(trailers); err != nil {
		return err
	}
	return sdk.ReplaceHttpResponseTrailers(trailers)
}

// GetHttpResponseTrailer forwards to the SDK.
func GetHttpResponseTrailer(key string) (string, error) { return sdk.GetHttpResponseTrailer(key) }

// RemoveHttpResponseTrailer forwards to the SDK.
func RemoveHttpResponseTrailer(key string) error { return sdk.RemoveHttpResponseTrailer(key) }

// ReplaceHttpResponseTrailer forwards to the SDK.
func ReplaceHttpResponseTrailer(key, value string) error {
	return sdk.ReplaceHttpResponseTrailer(key, value)
}

// AddHttpResponseTrailer forwards to the SDK.
func AddHttpResponseTrailer(key, value string) error {
	return sdk.AddHttpResponseTrailer(key, value)
}

// GetHttpCallResponseHeaders forwards to the SDK.
func GetHttpCallResponseHeaders() ([][2]string, error) {
	return emptyIfNotFound(sdk.GetHttpCallResponseHeaders())
}

// GetHttpCallResponseTrailers forwards to the SDK.
func GetHttpCallResponseTrailers() ([][2]string, error) {
	return emptyIfNotFound(sdk.GetHttpCallResponseTrailers())
}

// ResumeHttpRequest forwards to the SDK.
func ResumeHttpRequest() error { return sdk.ResumeHttpRequest() }

// ResumeHttpResponse forwards to the SDK.
func ResumeHttpResponse() error { return sdk.ResumeHttpResponse() }

// SendHttpResponse checks the host limits, then forwards to the SDK.
func SendHttpResponse(statusCode uint32, headers [][2]string, body []byte, gRPCStatus int32) error {
	if err := checkPairs(headers); err != nil {
		return err
	}
	return sdk.SendHttpResponse(statusCode, headers, body, gRPCStatus)
}

// DispatchHttpCall checks the host limits, then forwards to the SDK. A nil
// callBack drops the response, as in the wasip1 build.
func DispatchHttpCall(cluster string, headers [][2]string, body []byte, trailers [][2]string,
	timeoutMillisecond uint32, callBack func(numHeaders, bodySize, numTrailers int)) (calloutID uint32, err error) {
	if err := checkPairs(headers); err != nil {
		return 0, err
	}
	if err := checkPairs(trailers); err != nil {
		return 0, err
	}
	if callBack == nil {
		callBack = func(int, int, int) {}
	}
	return sdk.DispatchHttpCall(cluster, headers, body, trailers, timeoutMillisecond, callBack)
}

// GetSharedData forwards to the SDK.
func GetSharedData(key string) (value []byte, cas uint32, err error) { return sdk.GetSharedData(key) }

// GetSharedDataInto is GetSharedData, copied into buf's storage when it
// fits.
func GetSharedDataInto(buf []byte, key string) (value []byte, cas uint32, err error) {
	value, cas, err = sdk.GetSharedData(key)
	return into(buf, value), cas, err
}

// SetSharedData forwards to the SDK. Envoy treats cas 0 as "write
// unconditionally" (proxy-wasm-cpp-host checks cas only when it is not
// 0; e2e/envoyhost emulates it), while the SDK's emulator refuses cas 0 on an existing
// key; fetching the current cas first gives plugins Envoy's semantics here.
func SetSharedData(key string, data []byte, cas uint32) error {
	if cas == 0 {
		if _, current, err := sdk.GetSharedData(key); err == nil {
			cas = current
		}
	}
	return sdk.SetSharedData(key, data, cas)
}

// GetProperty forwards to the SDK.
func GetProperty(path []string) ([]byte, error) {
	if len(path) == 0 {
		return nil, ErrEmptyPropertyPath
	}
	return sdk.GetProperty(path)
}

// GetPropertyInto is GetProperty, copied into buf's storage when it fits.
func GetPropertyInto(buf []byte, path []string) ([]byte, error) {
	b, err := GetProperty(path)
	return into(buf, b), err
}

// GetPropertyMap forwards to the SDK.
func GetPropertyMap(path []string) ([][2]string, error) {
	b, err := GetProperty(path)
	if err != nil {
		return nil, err
	}
	return decodePairs(b)
}

// SetProperty forwards to the SDK.
func SetProperty(path []string, data []byte) error {
	if len(path) == 0 {
		return ErrEmptyPropertyPath
	}
	if len(data) == 0 {
		return ErrEmptyPropertyValue
	}
	return sdk.SetProperty(path, data)
}

// DefineCounterMetric forwards to the SDK.
func DefineCounterMetric(name string) MetricCounter { return sdk.DefineCounterMetric(name) }

// DefineGaugeMetric forwards to the SDK.
func DefineGaugeMetric(name string) MetricGauge { return sdk.DefineGaugeMetric(name) }

// DefineHistogramMetric forwards to the SDK.
func DefineHistogramMetric(name string) MetricHistogram { return sdk.DefineHistogramMetric(name) }
