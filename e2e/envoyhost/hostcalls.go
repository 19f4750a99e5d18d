package envoyhost

import (
	"encoding/binary"
	"strings"
	"time"
)

// The proxy_* host functions. Argument checks and results follow cpp-host
// src/exports.cc; what they do follows envoy source/extensions/common/wasm/
// context.cc (Context::getHeaderMapValue and friends).

type hostImpl func(vm *VM, s []uint64)

func u32(v uint64) uint32 { return uint32(v) }

func ret(s []uint64, r WasmResult) { s[0] = uint64(r) }

var proxyImpls = map[string]hostImpl{
	"pthread_equal": func(vm *VM, s []uint64) {
		if u32(s[0]) == u32(s[1]) {
			s[0] = 1
		} else {
			s[0] = 0
		}
	},
	"emscripten_notify_memory_growth": func(vm *VM, s []uint64) {},

	"proxy_log": func(vm *VM, s []uint64) {
		level := u32(s[0])
		if level > logMax {
			ret(s, ResultBadArgument)
			return
		}
		msg, ok := vm.readString(u32(s[1]), u32(s[2]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		vm.logGuest(level, msg)
		ret(s, ResultOK)
	},
	"proxy_get_log_level": func(vm *VM, s []uint64) {
		if !vm.mem.WriteUint32Le(u32(s[0]), uint32(*vm.host.cfg.LogLevel)) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_get_status": func(vm *VM, s []uint64) {
		root := vm.context().root
		if !vm.mem.WriteUint32Le(u32(s[0]), root.statusCode) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		if !vm.copyOut([]byte(root.statusMessage), u32(s[1]), u32(s[2])) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_set_property": func(vm *VM, s []uint64) {
		key, ok1 := vm.readString(u32(s[0]), u32(s[1]))
		value, ok2 := vm.read(u32(s[2]), u32(s[3]))
		if !ok1 || !ok2 {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, vm.context().setProperty(key, value))
	},
	"proxy_get_property": func(vm *VM, s []uint64) {
		path, ok := vm.readString(u32(s[0]), u32(s[1]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		value, r := vm.context().getProperty(path)
		if r != ResultOK {
			ret(s, r)
			return
		}
		if !vm.copyOut(value, u32(s[2]), u32(s[3])) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_get_configuration": func(vm *VM, s []uint64) {
		c := vm.context()
		value := vm.group.vmConfig
		if c.tempPlugin != nil {
			value = c.tempPlugin.config
		}
		if !vm.copyOut(value, u32(s[0]), u32(s[1])) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_send_local_response": func(vm *VM, s []uint64) {
		details, ok1 := vm.readString(u32(s[1]), u32(s[2]))
		body, ok2 := vm.read(u32(s[3]), u32(s[4]))
		pairs, ok3 := vm.read(u32(s[5]), u32(s[6]))
		if !ok1 || !ok2 || !ok3 {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		vm.context().sendLocalResponse(u32(s[0]), body, decodePairs(pairs), u32(s[7]), details)
		vm.stopNext = true
		ret(s, ResultOK)
	},
	"proxy_clear_route_cache": func(vm *VM, s []uint64) { ret(s, ResultOK) },
	"proxy_continue_request": func(vm *VM, s []uint64) {
		ret(s, vm.context().continueStream(streamRequest))
	},
	"proxy_continue_response": func(vm *VM, s []uint64) {
		ret(s, vm.context().continueStream(streamResponse))
	},
	"proxy_continue_stream": func(vm *VM, s []uint64) {
		if u32(s[0]) > streamMax {
			ret(s, ResultBadArgument)
			return
		}
		ret(s, vm.context().continueStream(u32(s[0])))
	},
	"proxy_close_stream": func(vm *VM, s []uint64) {
		if u32(s[0]) > streamMax {
			ret(s, ResultBadArgument)
			return
		}
		ret(s, vm.context().closeStream(u32(s[0])))
	},
	"proxy_set_effective_context": func(vm *VM, s []uint64) {
		id := u32(s[0])
		if _, ok := vm.contexts[id]; !ok {
			ret(s, ResultBadArgument)
			return
		}
		vm.effect = id
		ret(s, ResultOK)
	},
	"proxy_done": func(vm *VM, s []uint64) {
		// A root context whose on_done answered false at shutdown finishes
		// with proxy_done; on_delete follows after the call (cpp-host
		// WasmBase::done). Anything else is NotFound.
		root := vm.context().rootCtx()
		if !vm.pendingDone[root.id] {
			ret(s, ResultNotFound)
			return
		}
		delete(vm.pendingDone, root.id)
		vm.after = append(vm.after, func() {
			if root.created && vm.has("proxy_on_delete") {
				vm.callback(root, "proxy_on_delete", uint64(root.id))
			}
		})
		ret(s, ResultOK)
	},
	"proxy_call_foreign_function": func(vm *VM, s []uint64) {
		_, ok1 := vm.read(u32(s[0]), u32(s[1]))
		_, ok2 := vm.read(u32(s[2]), u32(s[3]))
		if !ok1 || !ok2 {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		// No foreign functions are registered in this host.
		ret(s, ResultNotFound)
	},

	// Shared data and queues (cpp-host src/shared_data.cc, shared_queue.cc).
	"proxy_get_shared_data": func(vm *VM, s []uint64) {
		key, ok := vm.readString(u32(s[0]), u32(s[1]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		value, cas, r := vm.host.shared.get(vm.group.vmID, key)
		if r != ResultOK {
			ret(s, r)
			return
		}
		if !vm.copyOut(value, u32(s[2]), u32(s[3])) || !vm.mem.WriteUint32Le(u32(s[4]), cas) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_set_shared_data": func(vm *VM, s []uint64) {
		key, ok1 := vm.readString(u32(s[0]), u32(s[1]))
		value, ok2 := vm.read(u32(s[2]), u32(s[3]))
		if !ok1 || !ok2 {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, vm.host.shared.set(vm.group.vmID, key, value, u32(s[4])))
	},
	"proxy_register_shared_queue": func(vm *VM, s []uint64) {
		name, ok := vm.readString(u32(s[0]), u32(s[1]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		c := vm.context()
		rootID := c.id
		if !c.isRoot() {
			rootID = c.parentID
		}
		tok := vm.host.queues.register(vm.group.vmID, name, vm, rootID)
		if !vm.mem.WriteUint32Le(u32(s[2]), tok) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_resolve_shared_queue": func(vm *VM, s []uint64) {
		vmID, ok1 := vm.readString(u32(s[0]), u32(s[1]))
		name, ok2 := vm.readString(u32(s[2]), u32(s[3]))
		if !ok1 || !ok2 {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		if vmID == "" {
			vmID = vm.group.vmID
		}
		tok := vm.host.queues.resolve(vmID, name)
		if tok == 0 {
			ret(s, ResultNotFound)
			return
		}
		if !vm.mem.WriteUint32Le(u32(s[4]), tok) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_dequeue_shared_queue": func(vm *VM, s []uint64) {
		data, r := vm.host.queues.dequeue(u32(s[0]))
		if r != ResultOK {
			ret(s, r)
			return
		}
		if !vm.copyOut(data, u32(s[1]), u32(s[2])) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_enqueue_shared_queue": func(vm *VM, s []uint64) {
		data, ok := vm.read(u32(s[1]), u32(s[2]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		token := u32(s[0])
		owner, rootID, r := vm.host.queues.enqueue(token, data)
		if r == ResultOK {
			// Delivered on the owner's thread later (call_on_thread).
			go owner.queueReady(rootID, token)
		}
		ret(s, r)
	},

	// Header maps.
	"proxy_get_header_map_value": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > mapMax {
			ret(s, ResultBadArgument)
			return
		}
		key, ok := vm.readString(u32(s[1]), u32(s[2]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		value, r := vm.context().getHeaderMapValue(typ, key)
		if r != ResultOK {
			ret(s, r)
			return
		}
		if !vm.copyOut([]byte(value), u32(s[3]), u32(s[4])) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_add_header_map_value": func(vm *VM, s []uint64) {
		headerMutation(vm, s, func(m *HeaderMap, k, v string) { m.Add(k, v) })
	},
	"proxy_replace_header_map_value": func(vm *VM, s []uint64) {
		headerMutation(vm, s, func(m *HeaderMap, k, v string) { m.Set(k, v) })
	},
	"proxy_remove_header_map_value": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > mapMax {
			ret(s, ResultBadArgument)
			return
		}
		key, ok := vm.readString(u32(s[1]), u32(s[2]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		m := vm.context().mutableMap(typ)
		if m == nil {
			ret(s, ResultBadArgument)
			return
		}
		m.Remove(key)
		ret(s, ResultOK)
	},
	"proxy_get_header_map_pairs": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > mapMax {
			ret(s, ResultBadArgument)
			return
		}
		var pairs []Pair
		if m := vm.context().constMap(typ); m != nil {
			pairs = m.Pairs()
		}
		// An empty map comes back as (0, 0), not a 4-byte "0 pairs".
		var data []byte
		if len(pairs) > 0 {
			data = encodePairs(pairs)
		}
		if !vm.copyOut(data, u32(s[1]), u32(s[2])) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_set_header_map_pairs": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > mapMax {
			ret(s, ResultBadArgument)
			return
		}
		data, ok := vm.read(u32(s[1]), u32(s[2]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		m := vm.context().mutableMap(typ)
		if m == nil {
			ret(s, ResultBadArgument)
			return
		}
		m.SetPairs(decodePairs(data))
		ret(s, ResultOK)
	},
	"proxy_get_header_map_size": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > mapMax {
			ret(s, ResultBadArgument)
			return
		}
		m := vm.context().mutableMap(typ)
		if m == nil {
			ret(s, ResultBadArgument)
			return
		}
		if !vm.mem.WriteUint32Le(u32(s[1]), uint32(m.ByteSize())) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},

	// Buffers.
	"proxy_get_buffer_bytes": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > bufferMax {
			ret(s, ResultBadArgument)
			return
		}
		buf, found := vm.context().buffer(typ)
		if !found {
			ret(s, ResultNotFound)
			return
		}
		data := buf.bytes()
		// Word arithmetic is 64-bit in cpp-host, so start+length cannot
		// overflow for 32-bit arguments; reads are clipped to the buffer.
		start, length := uint64(u32(s[1])), uint64(u32(s[2]))
		size := uint64(len(data))
		if start > size {
			length = 0
		} else if start+length > size {
			length = size - start
		}
		var out []byte
		if length > 0 {
			out = data[start : start+length]
		}
		// Copied straight from the buffer, as cpp-host copyToPointerSize
		// does: the allocator that runs meanwhile cannot change it (the
		// buffer calls are not on its allow-list, and vm.mu is held).
		if !vm.copyOut(out, u32(s[3]), u32(s[4])) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_get_buffer_status": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > bufferMax {
			ret(s, ResultBadArgument)
			return
		}
		buf, found := vm.context().buffer(typ)
		if !found {
			ret(s, ResultNotFound)
			return
		}
		if !vm.mem.WriteUint32Le(u32(s[1]), uint32(len(buf.bytes()))) || !vm.mem.WriteUint32Le(u32(s[2]), 0) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_set_buffer_bytes": func(vm *VM, s []uint64) {
		typ := u32(s[0])
		if typ > bufferMax {
			ret(s, ResultBadArgument)
			return
		}
		buf, found := vm.context().buffer(typ)
		if !found {
			ret(s, ResultNotFound)
			return
		}
		data, ok := vm.read(u32(s[3]), u32(s[4]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, buf.copyFrom(int(u32(s[1])), int(u32(s[2])), data))
	},

	// HTTP callouts.
	"proxy_http_call": func(vm *VM, s []uint64) {
		root := vm.context().root
		uri, ok1 := vm.readString(u32(s[0]), u32(s[1]))
		hdrs, ok2 := vm.read(u32(s[2]), u32(s[3]))
		body, ok3 := vm.read(u32(s[4]), u32(s[5]))
		trls, ok4 := vm.read(u32(s[6]), u32(s[7]))
		if !ok1 || !ok2 || !ok3 || !ok4 {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		tokenPtr := u32(s[9])
		// Write the token slot first to verify the memory, as cpp-host does.
		if !vm.mem.WriteUint32Le(tokenPtr, 0) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		token, r := vm.httpCall(root, uri, decodePairs(hdrs), body, decodePairs(trls), int32(u32(s[8])))
		vm.mem.WriteUint32Le(tokenPtr, token)
		ret(s, r)
	},
	"proxy_grpc_call": func(vm *VM, s []uint64) {
		grpcUnsupported(vm, s, [][2]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}})
	},
	"proxy_grpc_stream": func(vm *VM, s []uint64) {
		grpcUnsupported(vm, s, [][2]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}})
	},
	"proxy_grpc_close":  func(vm *VM, s []uint64) { grpcToken(s, false) },
	"proxy_grpc_cancel": func(vm *VM, s []uint64) { grpcToken(s, false) },
	"proxy_grpc_send": func(vm *VM, s []uint64) {
		if _, ok := vm.read(u32(s[1]), u32(s[2])); !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		grpcToken(s, true)
	},

	// Timers and time.
	"proxy_set_tick_period_milliseconds": func(vm *VM, s []uint64) {
		root := vm.context().root
		vm.setTickPeriod(root.id, time.Duration(u32(s[0]))*time.Millisecond)
		ret(s, ResultOK)
	},
	"proxy_get_current_time_nanoseconds": func(vm *VM, s []uint64) {
		if !vm.mem.WriteUint64Le(u32(s[0]), uint64(vm.host.clock.Now().UnixNano())) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},

	// Metrics (envoy context.cc defineMetric, incrementMetric, recordMetric,
	// getMetric).
	"proxy_define_metric": func(vm *VM, s []uint64) {
		name, ok := vm.readString(u32(s[1]), u32(s[2]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		id, r := vm.defineMetric(u32(s[0]), name)
		if r != ResultOK {
			ret(s, r)
			return
		}
		if !vm.mem.WriteUint32Le(u32(s[3]), id) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
	"proxy_increment_metric": func(vm *VM, s []uint64) {
		ret(s, vm.incrementMetric(u32(s[0]), int64(s[1])))
	},
	"proxy_record_metric": func(vm *VM, s []uint64) {
		ret(s, vm.recordMetric(u32(s[0]), s[1]))
	},
	"proxy_get_metric": func(vm *VM, s []uint64) {
		v, r := vm.getMetric(u32(s[0]))
		if r != ResultOK {
			ret(s, r)
			return
		}
		if !vm.mem.WriteUint64Le(u32(s[1]), v) {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		ret(s, ResultOK)
	},
}

func headerMutation(vm *VM, s []uint64, f func(m *HeaderMap, k, v string)) {
	typ := u32(s[0])
	if typ > mapMax {
		ret(s, ResultBadArgument)
		return
	}
	key, ok1 := vm.readString(u32(s[1]), u32(s[2]))
	value, ok2 := vm.readString(u32(s[3]), u32(s[4]))
	if !ok1 || !ok2 {
		ret(s, ResultInvalidMemoryAccess)
		return
	}
	m := vm.context().mutableMap(typ)
	if m == nil {
		ret(s, ResultBadArgument)
		return
	}
	f(m, key, value)
	ret(s, ResultOK)
}

// grpcUnsupported: envoy treats a service that is not a serialised
// GrpcService as a cluster name and answers ParseFailure for an unknown
// cluster; this host makes no gRPC calls at all, so a known cluster gets
// InternalFailure (and a log line).
func grpcUnsupported(vm *VM, s []uint64, ranges [][2]int) {
	var service string
	for i, r := range ranges {
		b, ok := vm.read(u32(s[r[0]]), u32(s[r[1]]))
		if !ok {
			ret(s, ResultInvalidMemoryAccess)
			return
		}
		if i == 0 {
			service = string(b)
		}
	}
	if _, ok := vm.host.clusters[service]; !ok {
		ret(s, ResultParseFailure)
		return
	}
	vm.log.Warn("envoyhost does not implement gRPC callouts", "cluster", service)
	ret(s, ResultInternalFailure)
}

// grpcToken answers grpc_close/cancel/send for tokens that cannot exist
// here: NotFound for gRPC-typed ids, BadArgument otherwise.
func grpcToken(s []uint64, streamOnly bool) {
	typ := u32(s[0]) & 0x3
	if typ == 2 || (!streamOnly && typ == 1) {
		ret(s, ResultNotFound)
		return
	}
	ret(s, ResultBadArgument)
}

// constMap is envoy context.cc getConstMap: what get_header_map_value and
// get_header_map_pairs read.
func (c *wasmContext) constMap(typ uint32) *HeaderMap {
	st := c.stream
	switch typ {
	case mapRequestHeaders:
		if st == nil {
			return nil
		}
		if st.accessLogPhase {
			return st.logReqHeaders
		}
		return st.reqHeaders
	case mapRequestTrailers:
		if st == nil || st.accessLogPhase {
			return nil
		}
		return st.reqTrailers
	case mapResponseHeaders:
		if st == nil {
			return nil
		}
		if st.accessLogPhase {
			return st.logRespHeaders
		}
		return st.respHeaders
	case mapResponseTrailers:
		if st == nil {
			return nil
		}
		if st.accessLogPhase {
			return st.logRespTrailers
		}
		return st.respTrailers
	case mapHTTPCallResponseHeaders:
		if r := c.rootCtx().callResponse; r != nil {
			return r.headers
		}
	case mapHTTPCallResponseTrailers:
		if r := c.rootCtx().callResponse; r != nil {
			return r.trailers
		}
	}
	return nil
}

// mutableMap is envoy context.cc getMap: what add, replace, remove,
// set_pairs and get_size act on. Call-response maps are not mutable.
func (c *wasmContext) mutableMap(typ uint32) *HeaderMap {
	st := c.stream
	if st == nil {
		return nil
	}
	switch typ {
	case mapRequestHeaders:
		return st.reqHeaders
	case mapRequestTrailers:
		// Adding trailers is possible in the last body callback (envoy
		// getMap: addDecodedTrailers).
		if st.reqTrailers == nil && st.reqBody != nil && st.endOfStream && !st.accessLogPhase {
			st.reqTrailers = NewHeaderMap()
			st.reqTrailersAdded = true
		}
		return st.reqTrailers
	case mapResponseHeaders:
		return st.respHeaders
	case mapResponseTrailers:
		if st.respTrailers == nil && st.respBody != nil && st.endOfStream && !st.accessLogPhase {
			st.respTrailers = NewHeaderMap()
		}
		return st.respTrailers
	}
	return nil
}

func (c *wasmContext) rootCtx() *wasmContext {
	if c.root != nil {
		return c.root
	}
	return c
}

// getHeaderMapValue: a missing map is BadArgument, except in the access-log
// phase where it is NotFound; a missing key is NotFound (ABI 0.2; 0.1.0
// answers an empty value).
func (c *wasmContext) getHeaderMapValue(typ uint32, key string) (string, WasmResult) {
	m := c.constMap(typ)
	if m == nil {
		if c.stream != nil && c.stream.accessLogPhase {
			if c.vm.abi == ABI010 {
				return "", ResultOK
			}
			return "", ResultNotFound
		}
		return "", ResultBadArgument
	}
	v, ok := m.Get(key)
	if !ok {
		if c.vm.abi == ABI010 {
			return "", ResultOK
		}
		return "", ResultNotFound
	}
	return v, ResultOK
}

// bodyBuffer is a buffer as host calls see it: mutable body bytes (a chunk
// or the buffered body), or an immutable view.
type bodyBuffer struct {
	data    *[]byte // mutable Envoy Buffer::Instance, or nil
	view    []byte  // immutable string view
	mutable bool
}

func (b bodyBuffer) bytes() []byte {
	if b.data != nil {
		return *b.data
	}
	return b.view
}

// copyFrom is envoy context.cc Buffer::copyFrom: start 0 drains length bytes
// then prepends; start at or past the end appends; anything else, and any
// immutable buffer, is BadArgument.
func (b bodyBuffer) copyFrom(start, length int, data []byte) WasmResult {
	if !b.mutable || b.data == nil {
		return ResultBadArgument
	}
	cur := *b.data
	switch {
	case start == 0:
		if length > len(cur) {
			length = len(cur)
		}
		rest := cur[length:]
		out := make([]byte, 0, len(data)+len(rest))
		out = append(append(out, data...), rest...)
		*b.data = out
		return ResultOK
	case start >= len(cur):
		*b.data = append(cur, data...)
		return ResultOK
	}
	return ResultBadArgument
}

// buffer is envoy context.cc getBuffer; found is false where Envoy returns
// nullptr (NotFound).
func (c *wasmContext) buffer(typ uint32) (bodyBuffer, bool) {
	switch typ {
	case bufferCallData:
		return bodyBuffer{view: c.rootCtx().callData}, true
	case bufferVMConfiguration:
		return bodyBuffer{view: c.vm.group.vmConfig}, true
	case bufferPluginConfiguration:
		if c.tempPlugin != nil {
			return bodyBuffer{view: c.tempPlugin.config}, true
		}
		return bodyBuffer{}, false
	case bufferHTTPRequestBody:
		if c.stream != nil && c.stream.reqBody != nil {
			return bodyBuffer{data: c.stream.reqBody, mutable: true}, true
		}
		return bodyBuffer{}, true
	case bufferHTTPResponseBody:
		if c.stream != nil && c.stream.respBody != nil {
			return bodyBuffer{data: c.stream.respBody, mutable: true}, true
		}
		return bodyBuffer{}, true
	case bufferDownstreamData, bufferUpstreamData, bufferGrpcReceive:
		return bodyBuffer{}, true
	case bufferHTTPCallResponseBody:
		if r := c.rootCtx().callResponse; r != nil {
			return bodyBuffer{view: r.body}, true
		}
	}
	return bodyBuffer{}, false
}

// sendLocalResponse records the reply; it is sent when the callback
// returns (envoy context.cc: addAfterVmCallAction), only on stream contexts.
func (c *wasmContext) sendLocalResponse(code uint32, body []byte, headers []Pair, grpcStatus uint32, details string) {
	st := c.stream
	if st == nil {
		return
	}
	reply := &localReply{
		code:    int(code),
		body:    body,
		headers: headers,
		details: replaceAllEmptySpace(details),
	}
	// gRPC status outside 0..16 means none (SDKs pass -1).
	if grpcStatus <= 16 {
		g := int(grpcStatus)
		reply.grpcStatus = &g
	}
	c.vm.after = append(c.vm.after, func() { st.queueLocalReply(reply) })
}

// replaceAllEmptySpace is Envoy StringUtil::replaceAllEmptySpace: every
// whitespace character becomes '_'.
func replaceAllEmptySpace(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\f', '\v', '\n', '\r':
			return '_'
		}
		return r
	}, s)
}

// continueStream is envoy context.cc Context::continueStream: continuing is
// deferred to after the call, and the request maps and body become
// unavailable at once (for either direction, as in Envoy).
func (c *wasmContext) continueStream(typ uint32) WasmResult {
	st := c.stream
	switch typ {
	case streamRequest:
		if st != nil {
			c.vm.after = append(c.vm.after, func() { st.queueContinue(streamRequest) })
		}
	case streamResponse:
		if st != nil {
			c.vm.after = append(c.vm.after, func() { st.queueContinue(streamResponse) })
		}
	case streamDownstream:
		return ResultOK
	case streamUpstream:
		return ResultUnimplemented
	default:
		return ResultBadArgument
	}
	if st != nil {
		st.reqHeaders = nil
		st.reqBody = nil
		st.reqTrailers = nil
	}
	return ResultOK
}

// closeStream resets the stream after the call with details
// wasm_close_stream (envoy context.cc Context::closeStream).
func (c *wasmContext) closeStream(typ uint32) WasmResult {
	st := c.stream
	switch typ {
	case streamRequest, streamResponse:
		if st != nil {
			if st.details == "" {
				st.details = "wasm_close_stream"
			}
			c.vm.after = append(c.vm.after, func() { st.queueReset() })
		}
		return ResultOK
	case streamDownstream, streamUpstream:
		return ResultOK
	}
	return ResultBadArgument
}

// setProperty stores a filter-state value under "wasm.<path>" on the
// stream (envoy context.cc Context::setProperty); without a stream it is
// NotFound.
func (c *wasmContext) setProperty(path string, value []byte) WasmResult {
	if c.stream == nil {
		return ResultNotFound
	}
	c.stream.filterState["wasm."+path] = append([]byte(nil), value...)
	return ResultOK
}

// queueReady delivers on_queue_ready to the root context that registered
// the queue.
func (vm *VM) queueReady(rootID, token uint32) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	root := vm.contexts[rootID]
	if root == nil || !vm.has("proxy_on_queue_ready") {
		return
	}
	vm.callback(root, "proxy_on_queue_ready", uint64(rootID), uint64(token))
}

func (vm *VM) defineMetric(typ uint32, name string) (uint32, WasmResult) {
	if typ > metricMax {
		return 0, ResultBadArgument
	}
	key := string(rune('0'+typ)) + name
	if id, ok := vm.metricIDs[key]; ok {
		return id, ResultOK
	}
	st, ok := vm.host.stats.custom(statKind(typ), name)
	if !ok {
		// Envoy's store cannot hold two kinds under one name.
		return 0, ResultBadArgument
	}
	id := vm.nextMetricID[typ]
	vm.nextMetricID[typ] += metricIDIncrement
	vm.metricIDs[key] = id
	vm.metrics[id] = st
	return id, ResultOK
}

func (vm *VM) incrementMetric(id uint32, offset int64) WasmResult {
	st, ok := vm.metrics[id]
	switch id & metricTypeMask {
	case metricCounter:
		if !ok {
			return ResultNotFound
		}
		if offset <= 0 {
			return ResultBadArgument
		}
		vm.host.stats.add(st, uint64(offset))
		return ResultOK
	case metricGauge:
		if !ok {
			return ResultNotFound
		}
		if offset > 0 {
			vm.host.stats.add(st, uint64(offset))
		} else {
			vm.host.stats.sub(st, uint64(-offset))
		}
		return ResultOK
	}
	return ResultBadArgument
}

func (vm *VM) recordMetric(id uint32, value uint64) WasmResult {
	st, ok := vm.metrics[id]
	if !ok {
		return ResultNotFound
	}
	switch id & metricTypeMask {
	case metricCounter:
		vm.host.stats.add(st, value)
	case metricGauge:
		vm.host.stats.set(st, value)
	case metricHistogram:
		vm.host.stats.record(st, value)
	default:
		return ResultNotFound
	}
	return ResultOK
}

func (vm *VM) getMetric(id uint32) (uint64, WasmResult) {
	switch id & metricTypeMask {
	case metricCounter, metricGauge:
		st, ok := vm.metrics[id]
		if !ok {
			return 0, ResultNotFound
		}
		return vm.host.stats.get(st), ResultOK
	}
	return 0, ResultBadArgument
}

func le64(v uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, v)
	return b
}
