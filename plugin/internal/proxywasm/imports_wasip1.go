//go:build wasip1

package proxywasm

import "unsafe"

// Host calls, ABI 0.2.1. Signatures are proxy-wasm-cpp-host's (every Word
// is an i32 in wasm32; metric values are i64), the import table
// e2e/envoyhost holds a module to. Out-parameters are *uint32 because the host writes 32-bit words,
// while Go's int and uintptr are 64-bit on GOARCH=wasm.
//
// Out-parameters always point at package-level variables (hostcalls_wasip1.go),
// never at the goroutine stack: the host writes them after it has called
// proxy_on_memory_allocate, which runs Go code that may grow, and so move, the
// stack. Inputs are read by the host before it allocates, so they may live
// anywhere; go:noescape keeps them from being moved to the heap.

//go:wasmimport env proxy_log
//go:noescape
func proxyLog(level uint32, message unsafe.Pointer, messageSize uint32) uint32

//go:wasmimport env proxy_get_log_level
//go:noescape
func proxyGetLogLevel(returnLevel *uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(period uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(contextID uint32) uint32

//go:wasmimport env proxy_done
func proxyDone() uint32

//go:wasmimport env proxy_get_buffer_bytes
//go:noescape
func proxyGetBufferBytes(bufferType, start, maxSize uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_set_buffer_bytes
//go:noescape
func proxySetBufferBytes(bufferType, start, size uint32, data unsafe.Pointer, dataSize uint32) uint32

//go:wasmimport env proxy_get_header_map_value
//go:noescape
func proxyGetHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_add_header_map_value
//go:noescape
func proxyAddHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
//go:noescape
func proxyReplaceHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_remove_header_map_value
//go:noescape
func proxyRemoveHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
//go:noescape
func proxyGetHeaderMapPairs(mapType uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_set_header_map_pairs
//go:noescape
func proxySetHeaderMapPairs(mapType uint32, data unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_close_stream
func proxyCloseStream(streamType uint32) uint32

//go:wasmimport env proxy_send_local_response
//go:noescape
func proxySendLocalResponse(statusCode uint32, details unsafe.Pointer, detailsSize uint32,
	body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_get_shared_data
//go:noescape
func proxyGetSharedData(key unsafe.Pointer, keySize uint32, returnData, returnSize, returnCas *uint32) uint32

//go:wasmimport env proxy_set_shared_data
//go:noescape
func proxySetSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_get_property
//go:noescape
func proxyGetProperty(path unsafe.Pointer, pathSize uint32, returnData, returnSize *uint32) uint32

//go:wasmimport env proxy_set_property
//go:noescape
func proxySetProperty(path unsafe.Pointer, pathSize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_http_call
//go:noescape
func proxyHttpCall(upstream unsafe.Pointer, upstreamSize uint32, headers unsafe.Pointer, headersSize uint32,
	body unsafe.Pointer, bodySize uint32, trailers unsafe.Pointer, trailersSize uint32,
	timeoutMilliseconds uint32, returnToken *uint32) uint32

//go:wasmimport env proxy_define_metric
//go:noescape
func proxyDefineMetric(metricType uint32, name unsafe.Pointer, nameSize uint32, returnID *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(metricID uint32, offset int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(metricID uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
//go:noescape
func proxyGetMetric(metricID uint32, returnValue *uint64) uint32
