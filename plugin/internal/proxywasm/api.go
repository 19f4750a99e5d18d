package proxywasm

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

// The public API, checked at compile time in both builds: if the wasip1 and
// the forwarding build ever disagree on a signature, one of them fails to build.
var (
	_ func(types.VMContext)                          = SetVMContext
	_ func() ([]byte, error)                         = GetVMConfiguration
	_ func() ([]byte, error)                         = GetPluginConfiguration
	_ func(uint32) error                             = SetTickPeriodMilliSeconds
	_ func(uint32) error                             = SetEffectiveContext
	_ func()                                         = PluginDone
	_ func() (LogLevel, error)                       = GetLogLevel
	_ func(string)                                   = LogTrace
	_ func(string)                                   = LogDebug
	_ func(string)                                   = LogInfo
	_ func(string)                                   = LogWarn
	_ func(string)                                   = LogError
	_ func(string)                                   = LogCritical
	_ func(string, ...any)                           = LogTracef
	_ func(string, ...any)                           = LogDebugf
	_ func(string, ...any)                           = LogInfof
	_ func(string, ...any)                           = LogWarnf
	_ func(string, ...any)                           = LogErrorf
	_ func(string, ...any)                           = LogCriticalf
	_ func(int, int) ([]byte, error)                 = GetHttpRequestBody
	_ func([]byte) error                             = AppendHttpRequestBody
	_ func([]byte) error                             = PrependHttpRequestBody
	_ func([]byte) error                             = ReplaceHttpRequestBody
	_ func(int, int) ([]byte, error)                 = GetHttpResponseBody
	_ func([]byte) error                             = AppendHttpResponseBody
	_ func([]byte) error                             = PrependHttpResponseBody
	_ func([]byte) error                             = ReplaceHttpResponseBody
	_ func(int, int) ([]byte, error)                 = GetHttpCallResponseBody
	_ func([]byte, int, int) ([]byte, error)         = GetHttpRequestBodyInto
	_ func([]byte, int, int) ([]byte, error)         = GetHttpResponseBodyInto
	_ func() ([][2]string, error)                    = GetHttpRequestHeaders
	_ func([][2]string) error                        = ReplaceHttpRequestHeaders
	_ func(string) (string, error)                   = GetHttpRequestHeader
	_ func([]byte, string) ([]byte, error)           = GetHttpRequestHeaderInto
	_ func(string) error                             = RemoveHttpRequestHeader
	_ func(string, string) error                     = ReplaceHttpRequestHeader
	_ func(string, string) error                     = AddHttpRequestHeader
	_ func() ([][2]string, error)                    = GetHttpRequestTrailers
	_ func([][2]string) error                        = ReplaceHttpRequestTrailers
	_ func(string) (string, error)                   = GetHttpRequestTrailer
	_ func(string) error                             = RemoveHttpRequestTrailer
	_ func(string, string) error                     = ReplaceHttpRequestTrailer
	_ func(string, string) error                     = AddHttpRequestTrailer
	_ func() ([][2]string, error)                    = GetHttpResponseHeaders
	_ func([][2]string) error                        = ReplaceHttpResponseHeaders
	_ func(string) (string, error)                   = GetHttpResponseHeader
	_ func(string) error                             = RemoveHttpResponseHeader
	_ func(string, string) error                     = ReplaceHttpResponseHeader
	_ func(string, string) error                     = AddHttpResponseHeader
	_ func() ([][2]string, error)                    = GetHttpResponseTrailers
	_ func([][2]string) error                        = ReplaceHttpResponseTrailers
	_ func(string) (string, error)                   = GetHttpResponseTrailer
	_ func(string) error                             = RemoveHttpResponseTrailer
	_ func(string, string) error                     = ReplaceHttpResponseTrailer
	_ func(string, string) error                     = AddHttpResponseTrailer
	_ func() ([][2]string, error)                    = GetHttpCallResponseHeaders
	_ func() ([][2]string, error)                    = GetHttpCallResponseTrailers
	_ func() error                                   = ResumeHttpRequest
	_ func() error                                   = ResumeHttpResponse
	_ func(uint32, [][2]string, []byte, int32) error = SendHttpResponse
	_ func(string) ([]byte, uint32, error)           = GetSharedData
	_ func([]byte, string) ([]byte, uint32, error)   = GetSharedDataInto
	_ func(string, []byte, uint32) error             = SetSharedData
	_ func([]string) ([]byte, error)                 = GetProperty
	_ func([]string) ([][2]string, error)            = GetPropertyMap
	_ func([]string, []byte) error                   = SetProperty
	_ func(string) MetricCounter                     = DefineCounterMetric
	_ func(string) MetricGauge                       = DefineGaugeMetric
	_ func(string) MetricHistogram                   = DefineHistogramMetric
	_ func(MetricCounter) uint64                     = MetricCounter.Value
	_ func(MetricCounter, uint64)                    = MetricCounter.Increment
	_ func(MetricGauge) int64                        = MetricGauge.Value
	_ func(MetricGauge, int64)                       = MetricGauge.Add
	_ func(MetricHistogram) uint64                   = MetricHistogram.Value
	_ func(MetricHistogram, uint64)                  = MetricHistogram.Record
	_ func(string, [][2]string, []byte, [][2]string, uint32,
		func(int, int, int)) (uint32, error) = DispatchHttpCall
)
