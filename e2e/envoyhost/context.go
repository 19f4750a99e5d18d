package envoyhost

import "strings"

// What the host calls do to a context, mirroring envoy
// source/extensions/common/wasm/context.cc: the maps (getMap, getConstMap),
// buffers (getBuffer, Buffer::copyFrom), local replies, continuing and
// closing streams, properties set by the plugin, metrics. The ABI layer in
// hostcalls.go reads the arguments from guest memory and calls these; the
// stream side (what the filter manager does with a status or a queued
// action) is in filter.go, properties in properties.go, callouts in
// httpcall.go.

// wasmContext is a Proxy-Wasm context: the VM context (id 0), a root
// context per plugin, or a stream context per HTTP request.
type wasmContext struct {
	vm       *VM
	id       uint32
	parentID uint32
	root     *wasmContext
	plugin   *Plugin
	// tempPlugin makes the plugin configuration readable: set during the
	// root's on_context_create in onStart and during on_configure (envoy
	// context.cc getBuffer(PluginConfiguration)).
	tempPlugin *Plugin
	created    bool // in_vm_context_created_
	stream     *stream

	// Root context only.
	statusCode    uint32
	statusMessage string
	callResponse  *httpCallResult // set during on_http_call_response
	callData      []byte
}

func (c *wasmContext) isRoot() bool { return c.stream == nil && c.id != 0 }

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

// addHeaderMapValue is envoy context.cc Context::addHeaderMapValue: the
// value is appended, other values of the key stay.
func (c *wasmContext) addHeaderMapValue(typ uint32, key, value string) WasmResult {
	m := c.mutableMap(typ)
	if m == nil {
		return ResultBadArgument
	}
	m.Add(key, value)
	return ResultOK
}

// replaceHeaderMapValue is Context::replaceHeaderMapValue (setCopy): one
// value is left.
func (c *wasmContext) replaceHeaderMapValue(typ uint32, key, value string) WasmResult {
	m := c.mutableMap(typ)
	if m == nil {
		return ResultBadArgument
	}
	m.Set(key, value)
	return ResultOK
}

// removeHeaderMapValue is Context::removeHeaderMapValue: every value goes;
// an absent key is OK.
func (c *wasmContext) removeHeaderMapValue(typ uint32, key string) WasmResult {
	m := c.mutableMap(typ)
	if m == nil {
		return ResultBadArgument
	}
	m.Remove(key)
	return ResultOK
}

// getHeaderMapPairs is Context::getHeaderMapPairs: a missing map is no
// pairs, and OK.
func (c *wasmContext) getHeaderMapPairs(typ uint32) []Pair {
	if m := c.constMap(typ); m != nil {
		return m.Pairs()
	}
	return nil
}

// setHeaderMapPairs is Context::setHeaderMapPairs: the map's entries are
// replaced by pairs.
func (c *wasmContext) setHeaderMapPairs(typ uint32, pairs []Pair) WasmResult {
	m := c.mutableMap(typ)
	if m == nil {
		return ResultBadArgument
	}
	m.SetPairs(pairs)
	return ResultOK
}

// getHeaderMapSize is Context::getHeaderMapSize: the map's byteSize (keys
// and values), not its number of entries.
func (c *wasmContext) getHeaderMapSize(typ uint32) (uint32, WasmResult) {
	m := c.mutableMap(typ)
	if m == nil {
		return 0, ResultBadArgument
	}
	return uint32(m.ByteSize()), ResultOK
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
		// While buffering (the last body callback answered Pause) it is
		// the decoding buffer, in later callbacks too (trailers, a tick
		// with the effective context); otherwise the current chunk.
		if c.stream != nil && c.stream.dec.buffering {
			return bodyBuffer{data: &c.stream.dec.buffered, mutable: true}, true
		}
		if c.stream != nil && c.stream.reqBody != nil {
			return bodyBuffer{data: c.stream.reqBody, mutable: true}, true
		}
		return bodyBuffer{}, true
	case bufferHTTPResponseBody:
		if c.stream != nil && c.stream.enc.buffering {
			return bodyBuffer{data: &c.stream.enc.buffered, mutable: true}, true
		}
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
			st.setDetailsIfUnset("wasm_close_stream")
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

// Metrics: envoy context.cc defineMetric, incrementMetric, recordMetric,
// getMetric (ids carry the type in their low bits, envoy
// source/extensions/common/wasm/wasm.h).

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
