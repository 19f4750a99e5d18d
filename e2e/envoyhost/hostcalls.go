package envoyhost

import (
	"fmt"
	"reflect"
	"time"
)

// The ABI table: every env.* function cpp-host offers a module, with the
// ABI versions that have it (cpp-host include/proxy-wasm/exports.h
// FOR_ALL_HOST_FUNCTIONS and FOR_ALL_HOST_FUNCTIONS_ABI_SPECIFIC, src/wasm.cc
// registerCallbacks) and its implementation. Parameters carry cpp-host's
// names. Each function does what cpp-host src/exports.cc does at the ABI
// level (argument ranges, reading and writing guest memory, one allocation
// for returned data) and leaves the behaviour to the context (context.go,
// after envoy source/extensions/common/wasm/context.cc). Its Go signature
// is its Wasm signature: every uint32 is an i32 (cpp-host's Word), a uint64
// or int64 is an i64, and the result is the WasmResult the guest sees.

// proxyCall is one row of the table.
type proxyCall struct {
	name string
	abis []ABIVersion
	fn   any // a func(*VM, ...) of one of the shapes adaptProxyCall knows
}

var (
	abi01  = []ABIVersion{ABI010}
	abi02x = []ABIVersion{ABI020, ABI021}
	abi021 = []ABIVersion{ABI021}
)

var proxyABI = []proxyCall{
	// Emscripten helpers cpp-host always registers.
	{"pthread_equal", allABIs, pthreadEqual},
	{"emscripten_notify_memory_growth", allABIs, emscriptenNotifyMemoryGrowth},

	{"proxy_log", allABIs, proxyLog},
	{"proxy_get_status", allABIs, proxyGetStatus},
	{"proxy_set_property", allABIs, proxySetProperty},
	{"proxy_get_property", allABIs, proxyGetProperty},
	{"proxy_send_local_response", allABIs, proxySendLocalResponse},
	{"proxy_get_shared_data", allABIs, proxyGetSharedData},
	{"proxy_set_shared_data", allABIs, proxySetSharedData},
	{"proxy_register_shared_queue", allABIs, proxyRegisterSharedQueue},
	{"proxy_resolve_shared_queue", allABIs, proxyResolveSharedQueue},
	{"proxy_dequeue_shared_queue", allABIs, proxyDequeueSharedQueue},
	{"proxy_enqueue_shared_queue", allABIs, proxyEnqueueSharedQueue},
	{"proxy_get_header_map_value", allABIs, proxyGetHeaderMapValue},
	{"proxy_add_header_map_value", allABIs, proxyAddHeaderMapValue},
	{"proxy_replace_header_map_value", allABIs, proxyReplaceHeaderMapValue},
	{"proxy_remove_header_map_value", allABIs, proxyRemoveHeaderMapValue},
	{"proxy_get_header_map_pairs", allABIs, proxyGetHeaderMapPairs},
	{"proxy_set_header_map_pairs", allABIs, proxySetHeaderMapPairs},
	{"proxy_get_header_map_size", allABIs, proxyGetHeaderMapSize},
	{"proxy_get_buffer_status", allABIs, proxyGetBufferStatus},
	{"proxy_get_buffer_bytes", allABIs, proxyGetBufferBytes},
	{"proxy_set_buffer_bytes", allABIs, proxySetBufferBytes},
	{"proxy_http_call", allABIs, proxyHTTPCall},
	{"proxy_grpc_call", allABIs, proxyGrpcCall},
	{"proxy_grpc_stream", allABIs, proxyGrpcStream},
	{"proxy_grpc_close", allABIs, proxyGrpcClose},
	{"proxy_grpc_cancel", allABIs, proxyGrpcCancel},
	{"proxy_grpc_send", allABIs, proxyGrpcSend},
	{"proxy_set_tick_period_milliseconds", allABIs, proxySetTickPeriodMilliseconds},
	{"proxy_get_current_time_nanoseconds", allABIs, proxyGetCurrentTimeNanoseconds},
	{"proxy_define_metric", allABIs, proxyDefineMetric},
	{"proxy_increment_metric", allABIs, proxyIncrementMetric},
	{"proxy_record_metric", allABIs, proxyRecordMetric},
	{"proxy_get_metric", allABIs, proxyGetMetric},
	{"proxy_set_effective_context", allABIs, proxySetEffectiveContext},
	{"proxy_done", allABIs, proxyDone},
	{"proxy_call_foreign_function", allABIs, proxyCallForeignFunction},

	// ABI-specific.
	{"proxy_get_configuration", abi01, proxyGetConfiguration},
	{"proxy_continue_request", abi01, proxyContinueRequest},
	{"proxy_continue_response", abi01, proxyContinueResponse},
	{"proxy_clear_route_cache", abi01, proxyClearRouteCache},
	{"proxy_continue_stream", abi02x, proxyContinueStream},
	{"proxy_close_stream", abi02x, proxyCloseStream},
	{"proxy_get_log_level", abi021, proxyGetLogLevel},
}

// hostImpl is a host function as wazero calls it: arguments in s, the
// result written to s[0].
type hostImpl func(vm *VM, s []uint64)

func u32(v uint64) uint32 { return uint32(v) }

// adaptProxyCall turns a typed implementation into a hostImpl and gives its
// Wasm signature. The switch keeps calls free of reflection.
func adaptProxyCall(fn any) (hostImpl, FuncType, error) {
	var impl hostImpl
	switch f := fn.(type) {
	case func(*VM) WasmResult:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm)) }
	case func(*VM, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm, u32(s[0]))) }
	case func(*VM, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm, u32(s[0]), u32(s[1]))) }
	case func(*VM, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]))) }
	case func(*VM, uint32, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]))) }
	case func(*VM, uint32, uint32, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) {
			s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]), u32(s[4])))
		}
	case func(*VM, uint32, uint32, uint32, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) {
			s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]), u32(s[4]), u32(s[5])))
		}
	case func(*VM, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) {
			s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]), u32(s[4]), u32(s[5]), u32(s[6]), u32(s[7])))
		}
	case func(*VM, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) {
			s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]), u32(s[4]), u32(s[5]), u32(s[6]), u32(s[7]), u32(s[8])))
		}
	case func(*VM, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) {
			s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]), u32(s[4]), u32(s[5]), u32(s[6]), u32(s[7]), u32(s[8]), u32(s[9])))
		}
	case func(*VM, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32, uint32) WasmResult:
		impl = func(vm *VM, s []uint64) {
			s[0] = uint64(f(vm, u32(s[0]), u32(s[1]), u32(s[2]), u32(s[3]), u32(s[4]), u32(s[5]), u32(s[6]), u32(s[7]), u32(s[8]), u32(s[9]), u32(s[10]), u32(s[11])))
		}
	case func(*VM, uint32, int64) WasmResult:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm, u32(s[0]), int64(s[1]))) }
	case func(*VM, uint32, uint64) WasmResult:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm, u32(s[0]), s[1])) }
	case func(*VM, uint32, uint32) uint32:
		impl = func(vm *VM, s []uint64) { s[0] = uint64(f(vm, u32(s[0]), u32(s[1]))) }
	case func(*VM, uint32):
		impl = func(vm *VM, s []uint64) { f(vm, u32(s[0])) }
	default:
		return nil, FuncType{}, fmt.Errorf("no adapter for %T", fn)
	}
	return impl, wasmSignature(reflect.TypeOf(fn)), nil
}

// wasmSignature maps a Go implementation's type to its Wasm type, skipping
// the *VM receiver argument.
func wasmSignature(t reflect.Type) FuncType {
	val := func(k reflect.Kind) byte {
		if k == reflect.Uint64 || k == reflect.Int64 {
			return valI64
		}
		return valI32
	}
	var ft FuncType
	for i := 1; i < t.NumIn(); i++ {
		ft.Params = append(ft.Params, val(t.In(i).Kind()))
	}
	for i := 0; i < t.NumOut(); i++ {
		ft.Results = append(ft.Results, val(t.Out(i).Kind()))
	}
	return ft
}

// Emscripten helpers.

func pthreadEqual(_ *VM, left, right uint32) uint32 {
	if left == right {
		return 1
	}
	return 0
}

func emscriptenNotifyMemoryGrowth(*VM, uint32) {}

// Logging, status, configuration.

func proxyLog(vm *VM, level, address, size uint32) WasmResult {
	if level > logMax {
		return ResultBadArgument
	}
	msg, ok := vm.readString(address, size)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	vm.logGuest(level, msg)
	return ResultOK
}

func proxyGetLogLevel(vm *VM, resultLevelUint32Ptr uint32) WasmResult {
	if !vm.mem.WriteUint32Le(resultLevelUint32Ptr, uint32(*vm.host.cfg.LogLevel)) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxyGetStatus(vm *VM, codePtr, valuePtrPtr, valueSizePtr uint32) WasmResult {
	root := vm.context().root
	if !vm.mem.WriteUint32Le(codePtr, root.statusCode) {
		return ResultInvalidMemoryAccess
	}
	if !vm.copyOut([]byte(root.statusMessage), valuePtrPtr, valueSizePtr) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

// proxyGetConfiguration is ABI 0.1.0's way to read the plugin (or, outside
// on_configure, the VM) configuration.
func proxyGetConfiguration(vm *VM, valuePtrPtr, valueSizePtr uint32) WasmResult {
	c := vm.context()
	value := vm.group.vmConfig
	if c.tempPlugin != nil {
		value = c.tempPlugin.config
	}
	if !vm.copyOut(value, valuePtrPtr, valueSizePtr) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

// Properties.

func proxySetProperty(vm *VM, keyPtr, keySize, valuePtr, valueSize uint32) WasmResult {
	key, ok1 := vm.readString(keyPtr, keySize)
	value, ok2 := vm.read(valuePtr, valueSize)
	if !ok1 || !ok2 {
		return ResultInvalidMemoryAccess
	}
	return vm.context().setProperty(key, value)
}

func proxyGetProperty(vm *VM, pathPtr, pathSize, valuePtrPtr, valueSizePtr uint32) WasmResult {
	path, ok := vm.readString(pathPtr, pathSize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	value, r := vm.context().getProperty(path)
	if r != ResultOK {
		return r
	}
	if !vm.copyOut(value, valuePtrPtr, valueSizePtr) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

// Stream control.

func proxySendLocalResponse(vm *VM, responseCode, responseCodeDetailsPtr, responseCodeDetailsSize,
	bodyPtr, bodySize, additionalResponseHeaderPairsPtr, additionalResponseHeaderPairsSize, grpcStatus uint32) WasmResult {
	details, ok1 := vm.readString(responseCodeDetailsPtr, responseCodeDetailsSize)
	body, ok2 := vm.read(bodyPtr, bodySize)
	pairs, ok3 := vm.read(additionalResponseHeaderPairsPtr, additionalResponseHeaderPairsSize)
	if !ok1 || !ok2 || !ok3 {
		return ResultInvalidMemoryAccess
	}
	vm.context().sendLocalResponse(responseCode, body, decodePairs(pairs), grpcStatus, details)
	// cpp-host src/exports.cc send_local_response: stopNextIteration(true)
	// on the VM (WasmBase), not on the stream: the status of the callback
	// running now becomes a stop (src/context.cc
	// convertVmCallResultTo*Status), also when the reply went to another
	// stream through the effective context.
	vm.stopNext = true
	return ResultOK
}

func proxyClearRouteCache(*VM) WasmResult { return ResultOK }

func proxyContinueRequest(vm *VM) WasmResult { return vm.context().continueStream(streamRequest) }

func proxyContinueResponse(vm *VM) WasmResult { return vm.context().continueStream(streamResponse) }

func proxyContinueStream(vm *VM, streamType uint32) WasmResult {
	if streamType > streamMax {
		return ResultBadArgument
	}
	return vm.context().continueStream(streamType)
}

func proxyCloseStream(vm *VM, streamType uint32) WasmResult {
	if streamType > streamMax {
		return ResultBadArgument
	}
	return vm.context().closeStream(streamType)
}

func proxySetEffectiveContext(vm *VM, contextID uint32) WasmResult {
	if _, ok := vm.contexts[contextID]; !ok {
		return ResultBadArgument
	}
	vm.effect = contextID
	return ResultOK
}

// proxyDone: a root context whose on_done answered false at shutdown
// finishes with proxy_done; on_delete follows after the call (cpp-host
// WasmBase::done). Anything else is NotFound.
func proxyDone(vm *VM) WasmResult {
	root := vm.context().rootCtx()
	if !vm.pendingDone[root.id] {
		return ResultNotFound
	}
	delete(vm.pendingDone, root.id)
	vm.after = append(vm.after, func() {
		if root.created && vm.has("proxy_on_delete") {
			vm.callback(root, "proxy_on_delete", uint64(root.id))
		}
	})
	return ResultOK
}

func proxyCallForeignFunction(vm *VM, functionName, functionNameSize, arguments, argumentsSize, results, resultsSize uint32) WasmResult {
	_, ok1 := vm.read(functionName, functionNameSize)
	_, ok2 := vm.read(arguments, argumentsSize)
	if !ok1 || !ok2 {
		return ResultInvalidMemoryAccess
	}
	// No foreign functions are registered in this host.
	return ResultNotFound
}

// Shared data and queues (cpp-host src/shared_data.cc, shared_queue.cc).

func proxyGetSharedData(vm *VM, keyPtr, keySize, valuePtrPtr, valueSizePtr, casPtr uint32) WasmResult {
	key, ok := vm.readString(keyPtr, keySize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	value, cas, r := vm.host.shared.get(vm.group.vmID, key)
	if r != ResultOK {
		return r
	}
	if !vm.copyOut(value, valuePtrPtr, valueSizePtr) || !vm.mem.WriteUint32Le(casPtr, cas) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxySetSharedData(vm *VM, keyPtr, keySize, valuePtr, valueSize, cas uint32) WasmResult {
	key, ok1 := vm.readString(keyPtr, keySize)
	value, ok2 := vm.read(valuePtr, valueSize)
	if !ok1 || !ok2 {
		return ResultInvalidMemoryAccess
	}
	return vm.host.shared.set(vm.group.vmID, key, value, cas)
}

func proxyRegisterSharedQueue(vm *VM, queueNamePtr, queueNameSize, tokenPtr uint32) WasmResult {
	name, ok := vm.readString(queueNamePtr, queueNameSize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	c := vm.context()
	rootID := c.id
	if !c.isRoot() {
		rootID = c.parentID
	}
	tok := vm.host.queues.register(vm.group.vmID, name, vm, rootID)
	if !vm.mem.WriteUint32Le(tokenPtr, tok) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxyResolveSharedQueue(vm *VM, vmIDPtr, vmIDSize, queueNamePtr, queueNameSize, tokenPtr uint32) WasmResult {
	vmID, ok1 := vm.readString(vmIDPtr, vmIDSize)
	name, ok2 := vm.readString(queueNamePtr, queueNameSize)
	if !ok1 || !ok2 {
		return ResultInvalidMemoryAccess
	}
	if vmID == "" {
		vmID = vm.group.vmID
	}
	tok := vm.host.queues.resolve(vmID, name)
	if tok == 0 {
		return ResultNotFound
	}
	if !vm.mem.WriteUint32Le(tokenPtr, tok) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxyDequeueSharedQueue(vm *VM, token, dataPtrPtr, dataSizePtr uint32) WasmResult {
	data, r := vm.host.queues.dequeue(token)
	if r != ResultOK {
		return r
	}
	if !vm.copyOut(data, dataPtrPtr, dataSizePtr) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxyEnqueueSharedQueue(vm *VM, token, dataPtr, dataSize uint32) WasmResult {
	data, ok := vm.read(dataPtr, dataSize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	owner, rootID, r := vm.host.queues.enqueue(token, data)
	if r == ResultOK {
		// Delivered on the owner's thread later (call_on_thread).
		go owner.queueReady(rootID, token)
	}
	return r
}

// Header maps.

// headerKeyValue checks the map type and reads a key and a value.
func headerKeyValue(vm *VM, typ, keyPtr, keySize, valuePtr, valueSize uint32) (key, value string, r WasmResult) {
	if typ > mapMax {
		return "", "", ResultBadArgument
	}
	key, ok1 := vm.readString(keyPtr, keySize)
	value, ok2 := vm.readString(valuePtr, valueSize)
	if !ok1 || !ok2 {
		return "", "", ResultInvalidMemoryAccess
	}
	return key, value, ResultOK
}

func proxyGetHeaderMapValue(vm *VM, typ, keyPtr, keySize, valuePtrPtr, valueSizePtr uint32) WasmResult {
	if typ > mapMax {
		return ResultBadArgument
	}
	key, ok := vm.readString(keyPtr, keySize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	value, r := vm.context().getHeaderMapValue(typ, key)
	if r != ResultOK {
		return r
	}
	if !vm.copyOut([]byte(value), valuePtrPtr, valueSizePtr) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxyAddHeaderMapValue(vm *VM, typ, keyPtr, keySize, valuePtr, valueSize uint32) WasmResult {
	key, value, r := headerKeyValue(vm, typ, keyPtr, keySize, valuePtr, valueSize)
	if r != ResultOK {
		return r
	}
	return vm.context().addHeaderMapValue(typ, key, value)
}

func proxyReplaceHeaderMapValue(vm *VM, typ, keyPtr, keySize, valuePtr, valueSize uint32) WasmResult {
	key, value, r := headerKeyValue(vm, typ, keyPtr, keySize, valuePtr, valueSize)
	if r != ResultOK {
		return r
	}
	return vm.context().replaceHeaderMapValue(typ, key, value)
}

func proxyRemoveHeaderMapValue(vm *VM, typ, keyPtr, keySize uint32) WasmResult {
	if typ > mapMax {
		return ResultBadArgument
	}
	key, ok := vm.readString(keyPtr, keySize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	return vm.context().removeHeaderMapValue(typ, key)
}

func proxyGetHeaderMapPairs(vm *VM, typ, ptrPtr, sizePtr uint32) WasmResult {
	if typ > mapMax {
		return ResultBadArgument
	}
	// An empty map comes back as (0, 0), not a 4-byte "0 pairs".
	var data []byte
	if pairs := vm.context().getHeaderMapPairs(typ); len(pairs) > 0 {
		data = encodePairs(pairs)
	}
	if !vm.copyOut(data, ptrPtr, sizePtr) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxySetHeaderMapPairs(vm *VM, typ, ptr, size uint32) WasmResult {
	if typ > mapMax {
		return ResultBadArgument
	}
	data, ok := vm.read(ptr, size)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	return vm.context().setHeaderMapPairs(typ, decodePairs(data))
}

func proxyGetHeaderMapSize(vm *VM, typ, resultPtr uint32) WasmResult {
	if typ > mapMax {
		return ResultBadArgument
	}
	n, r := vm.context().getHeaderMapSize(typ)
	if r != ResultOK {
		return r
	}
	if !vm.mem.WriteUint32Le(resultPtr, n) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

// Buffers.

// bufferOf checks the buffer type and finds the buffer (NotFound where
// Envoy's getBuffer has none).
func bufferOf(vm *VM, typ uint32) (bodyBuffer, WasmResult) {
	if typ > bufferMax {
		return bodyBuffer{}, ResultBadArgument
	}
	buf, found := vm.context().buffer(typ)
	if !found {
		return bodyBuffer{}, ResultNotFound
	}
	return buf, ResultOK
}

func proxyGetBufferBytes(vm *VM, typ, start, length, ptrPtr, sizePtr uint32) WasmResult {
	buf, r := bufferOf(vm, typ)
	if r != ResultOK {
		return r
	}
	data := buf.bytes()
	// Word arithmetic is 64-bit in cpp-host, so start+length cannot
	// overflow for 32-bit arguments; reads are clipped to the buffer.
	from, n := uint64(start), uint64(length)
	size := uint64(len(data))
	if from > size {
		n = 0
	} else if from+n > size {
		n = size - from
	}
	var out []byte
	if n > 0 {
		out = data[from : from+n]
	}
	// Copied straight from the buffer, as cpp-host copyToPointerSize
	// does: the allocator that runs meanwhile cannot change it (the
	// buffer calls are not on its allow-list, and vm.mu is held).
	if !vm.copyOut(out, ptrPtr, sizePtr) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxyGetBufferStatus(vm *VM, typ, lengthPtr, flagsPtr uint32) WasmResult {
	buf, r := bufferOf(vm, typ)
	if r != ResultOK {
		return r
	}
	if !vm.mem.WriteUint32Le(lengthPtr, uint32(len(buf.bytes()))) || !vm.mem.WriteUint32Le(flagsPtr, 0) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxySetBufferBytes(vm *VM, typ, start, length, dataPtr, dataSize uint32) WasmResult {
	buf, r := bufferOf(vm, typ)
	if r != ResultOK {
		return r
	}
	data, ok := vm.read(dataPtr, dataSize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	return buf.copyFrom(int(start), int(length), data)
}

// Callouts.

func proxyHTTPCall(vm *VM, uriPtr, uriSize, headerPairsPtr, headerPairsSize, bodyPtr, bodySize,
	trailerPairsPtr, trailerPairsSize, timeoutMilliseconds, tokenPtr uint32) WasmResult {
	root := vm.context().root
	uri, ok1 := vm.readString(uriPtr, uriSize)
	hdrs, ok2 := vm.read(headerPairsPtr, headerPairsSize)
	body, ok3 := vm.read(bodyPtr, bodySize)
	trls, ok4 := vm.read(trailerPairsPtr, trailerPairsSize)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return ResultInvalidMemoryAccess
	}
	// Write the token slot first to verify the memory, as cpp-host does.
	if !vm.mem.WriteUint32Le(tokenPtr, 0) {
		return ResultInvalidMemoryAccess
	}
	token, r := vm.httpCall(root, uri, decodePairs(hdrs), body, decodePairs(trls), int32(timeoutMilliseconds))
	vm.mem.WriteUint32Le(tokenPtr, token)
	return r
}

func proxyGrpcCall(vm *VM, servicePtr, serviceSize, serviceNamePtr, serviceNameSize, methodNamePtr, methodNameSize,
	initialMetadataPtr, initialMetadataSize, requestPtr, requestSize, timeoutMilliseconds, tokenPtr uint32) WasmResult {
	return grpcUnsupported(vm, [][2]uint32{{servicePtr, serviceSize}, {serviceNamePtr, serviceNameSize},
		{methodNamePtr, methodNameSize}, {initialMetadataPtr, initialMetadataSize}, {requestPtr, requestSize}})
}

func proxyGrpcStream(vm *VM, servicePtr, serviceSize, serviceNamePtr, serviceNameSize, methodNamePtr, methodNameSize,
	initialMetadataPtr, initialMetadataSize, tokenPtr uint32) WasmResult {
	return grpcUnsupported(vm, [][2]uint32{{servicePtr, serviceSize}, {serviceNamePtr, serviceNameSize},
		{methodNamePtr, methodNameSize}, {initialMetadataPtr, initialMetadataSize}})
}

func proxyGrpcClose(_ *VM, token uint32) WasmResult  { return grpcToken(token, false) }
func proxyGrpcCancel(_ *VM, token uint32) WasmResult { return grpcToken(token, false) }

func proxyGrpcSend(vm *VM, token, messagePtr, messageSize, endStream uint32) WasmResult {
	if _, ok := vm.read(messagePtr, messageSize); !ok {
		return ResultInvalidMemoryAccess
	}
	return grpcToken(token, true)
}

// grpcUnsupported: envoy treats a service that is not a serialised
// GrpcService as a cluster name and answers ParseFailure for an unknown
// cluster; this host makes no gRPC calls at all, so a known cluster gets
// InternalFailure (and a log line).
func grpcUnsupported(vm *VM, ranges [][2]uint32) WasmResult {
	var service string
	for i, r := range ranges {
		b, ok := vm.read(r[0], r[1])
		if !ok {
			return ResultInvalidMemoryAccess
		}
		if i == 0 {
			service = string(b)
		}
	}
	if _, ok := vm.host.clusters[service]; !ok {
		return ResultParseFailure
	}
	vm.log.Warn("envoyhost does not implement gRPC callouts", "cluster", service)
	return ResultInternalFailure
}

// grpcToken answers grpc_close/cancel/send for tokens that cannot exist
// here: NotFound for gRPC-typed ids, BadArgument otherwise.
func grpcToken(token uint32, streamOnly bool) WasmResult {
	typ := token & 0x3
	if typ == 2 || (!streamOnly && typ == 1) {
		return ResultNotFound
	}
	return ResultBadArgument
}

// Timers and time.

func proxySetTickPeriodMilliseconds(vm *VM, tickPeriodMilliseconds uint32) WasmResult {
	root := vm.context().root
	vm.setTickPeriod(root.id, time.Duration(tickPeriodMilliseconds)*time.Millisecond)
	return ResultOK
}

func proxyGetCurrentTimeNanoseconds(vm *VM, resultUint64Ptr uint32) WasmResult {
	if !vm.mem.WriteUint64Le(resultUint64Ptr, uint64(vm.host.clock.Now().UnixNano())) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

// Metrics.

func proxyDefineMetric(vm *VM, metricType, namePtr, nameSize, metricIDPtr uint32) WasmResult {
	name, ok := vm.readString(namePtr, nameSize)
	if !ok {
		return ResultInvalidMemoryAccess
	}
	id, r := vm.defineMetric(metricType, name)
	if r != ResultOK {
		return r
	}
	if !vm.mem.WriteUint32Le(metricIDPtr, id) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}

func proxyIncrementMetric(vm *VM, metricID uint32, offset int64) WasmResult {
	return vm.incrementMetric(metricID, offset)
}

func proxyRecordMetric(vm *VM, metricID uint32, value uint64) WasmResult {
	return vm.recordMetric(metricID, value)
}

func proxyGetMetric(vm *VM, metricID, resultUint64Ptr uint32) WasmResult {
	v, r := vm.getMetric(metricID)
	if r != ResultOK {
		return r
	}
	if !vm.mem.WriteUint64Le(resultUint64Ptr, v) {
		return ResultInvalidMemoryAccess
	}
	return ResultOK
}
