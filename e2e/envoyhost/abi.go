package envoyhost

import "fmt"

// Proxy-Wasm enumerations, as numbered by proxy-wasm-cpp-sdk
// proxy_wasm_common.h and proxy_wasm_enums.h (which cpp-host includes).

// WasmResult is the status a host call returns to the guest.
type WasmResult uint32

// Host call results.
const (
	ResultOK                   WasmResult = 0
	ResultNotFound             WasmResult = 1
	ResultBadArgument          WasmResult = 2
	ResultSerializationFailure WasmResult = 3
	ResultParseFailure         WasmResult = 4
	ResultBadExpression        WasmResult = 5
	ResultInvalidMemoryAccess  WasmResult = 6
	ResultEmpty                WasmResult = 7
	ResultCasMismatch          WasmResult = 8
	ResultResultMismatch       WasmResult = 9
	ResultInternalFailure      WasmResult = 10
	ResultBrokenConnection     WasmResult = 11
	ResultUnimplemented        WasmResult = 12
)

var resultNames = [...]string{"Ok", "NotFound", "BadArgument", "SerializationFailure",
	"ParseFailure", "BadExpression", "InvalidMemoryAccess", "Empty", "CasMismatch",
	"ResultMismatch", "InternalFailure", "BrokenConnection", "Unimplemented"}

func (r WasmResult) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("WasmResult(%d)", uint32(r))
}

// Header map types.
const (
	mapRequestHeaders           = 0
	mapRequestTrailers          = 1
	mapResponseHeaders          = 2
	mapResponseTrailers         = 3
	mapGrpcInitialMetadata      = 4
	mapGrpcTrailingMetadata     = 5
	mapHTTPCallResponseHeaders  = 6
	mapHTTPCallResponseTrailers = 7
	mapMax                      = 7
)

// Buffer types.
const (
	bufferHTTPRequestBody      = 0
	bufferHTTPResponseBody     = 1
	bufferDownstreamData       = 2
	bufferUpstreamData         = 3
	bufferHTTPCallResponseBody = 4
	bufferGrpcReceive          = 5
	bufferVMConfiguration      = 6
	bufferPluginConfiguration  = 7
	bufferCallData             = 8
	bufferMax                  = 8
)

// Stream types.
const (
	streamRequest    = 0
	streamResponse   = 1
	streamDownstream = 2
	streamUpstream   = 3
	streamMax        = 3
)

// Log levels (spdlog numbering, which Envoy uses for proxy_log).
const (
	logTrace    = 0
	logDebug    = 1
	logInfo     = 2
	logWarn     = 3
	logError    = 4
	logCritical = 5
	logMax      = logCritical
)

// Filter statuses as returned by the guest and converted by cpp-host
// src/context.cc (convertVmCallResultTo*).
const (
	headersContinue                     = 0
	headersStopIteration                = 1
	headersContinueAndEndStream         = 2
	headersStopAllIterationAndBuffer    = 3
	headersStopAllIterationAndWatermark = 4

	dataContinue                  = 0
	dataStopIterationAndBuffer    = 1
	dataStopIterationAndWatermark = 2
	dataStopIterationNoBuffer     = 3

	trailersContinue      = 0
	trailersStopIteration = 1
)

// Metric types and the id scheme of envoy source/extensions/common/wasm/wasm.h
// (the low two bits of an id carry the type, ids step by 4).
const (
	metricCounter   = 0
	metricGauge     = 1
	metricHistogram = 2
	metricMax       = 2

	metricTypeMask    = 0x3
	metricIDIncrement = 0x4
)

// ABIVersion is the Proxy-Wasm ABI a module declares through its
// proxy_abi_version_* export (cpp-host src/bytecode_util.cc).
type ABIVersion int

// Known ABI versions.
const (
	ABIUnknown ABIVersion = iota
	ABI010
	ABI020
	ABI021
)

func (a ABIVersion) String() string {
	switch a {
	case ABI010:
		return "0.1.0"
	case ABI020:
		return "0.2.0"
	case ABI021:
		return "0.2.1"
	}
	return "unknown"
}

// abiExportNames maps the marker export names to versions.
var abiExportNames = map[string]ABIVersion{
	"proxy_abi_version_0_1_0": ABI010,
	"proxy_abi_version_0_2_0": ABI020,
	"proxy_abi_version_0_2_1": ABI021,
}
