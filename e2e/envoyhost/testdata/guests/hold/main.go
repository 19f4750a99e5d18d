//go:build wasip1

// Command hold is a raw Proxy-Wasm filter that holds requests and lets its
// root context's tick release them, the way in-proxy flow control does. It
// logs (at info, "hold: ...") every step, so tests can check what the host
// answered and in which order the callbacks came.
//
// Request headers:
//
//	x-hold: headers        on_request_headers answers Pause and the stream is held
//	x-hold: body           on_request_headers answers Pause, on_request_body buffers
//	                       (Pause) and the stream is held at end of stream
//	x-release: continue    the tick sets x-gateway-destination-endpoint to x-hold-dest,
//	                       then calls proxy_continue_stream(request)
//	x-release: close       the tick calls proxy_close_stream(request)
//	x-release: reply       the tick sends a local reply 429 "held", details held_too_long
//	x-release: never       the stream stays held (the client or a timeout ends it)
//	x-release-after: N     release at the Nth tick after the hold (default 1)
//	x-release-held: now    this stream's on_request_headers releases every held
//	                       stream (each as its x-release says), sets the effective
//	                       context back to itself, then answers Continue for itself
//
// Each tick first calls proxy_set_effective_context for every stream that
// already had on_done and logs the answer once ("effective_after_done"),
// then releases what is due. A callback for a context after its on_done
// logs "callback_after_done". The tick period is 5 ms.
package main

import (
	"strconv"
	"unsafe"
)

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg *byte, size uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType uint32, key *byte, keySize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(mapType uint32, key *byte, keySize uint32, value *byte, valueSize uint32) uint32

//go:wasmimport env proxy_get_buffer_status
func proxyGetBufferStatus(bufType uint32, length, flags *uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(ms uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_close_stream
func proxyCloseStream(streamType uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(code uint32, details *byte, detailsSize uint32, body *byte, bodySize uint32,
	pairs *byte, pairsSize uint32, grpcStatus int32) uint32

var allocations [][]byte

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	b := make([]byte, size)
	allocations = append(allocations, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

const (
	mapRequestHeaders = 0
	bufferRequestBody = 0
	streamRequest     = 0
	logInfo           = 2
)

func logf(parts ...string) {
	msg := "hold:"
	for _, p := range parts {
		msg += " " + p
	}
	b := []byte(msg)
	proxyLog(logInfo, &b[0], uint32(len(b)))
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

func header(key string) string {
	k := []byte(key)
	var data, size uint32
	if proxyGetHeaderMapValue(mapRequestHeaders, &k[0], uint32(len(k)), &data, &size) != 0 || size == 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(uintptr(data))), size))
}

func replaceHeader(key, value string) uint32 {
	k, v := []byte(key), []byte(value+"\x00")
	return proxyReplaceHeaderMapValue(mapRequestHeaders, &k[0], uint32(len(k)), &v[0], uint32(len(v)-1))
}

type stream struct {
	mode, release, dest string
	after, ticks        int
	held                bool
}

var (
	streams  = map[uint32]*stream{}
	held     []uint32
	done     = map[uint32]bool{} // had on_done
	reported = map[uint32]bool{} // effective_after_done logged
)

func checkAlive(callback string, id uint32) {
	if done[id] {
		logf("callback_after_done", callback, itoa(id))
	}
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) { checkAlive("on_context_create", id) }

//go:wasmexport proxy_on_vm_start
func onVMStart(rootID, size uint32) uint32 { return 1 }

//go:wasmexport proxy_on_configure
func onConfigure(rootID, size uint32) uint32 {
	proxySetTickPeriodMilliseconds(5)
	return 1
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	checkAlive("on_request_headers", id)
	s := &stream{mode: header("x-hold"), release: header("x-release"), dest: header("x-hold-dest"), after: 1}
	if v, err := strconv.Atoi(header("x-release-after")); err == nil && v > 0 {
		s.after = v
	}
	streams[id] = s
	if header("x-release-held") == "now" {
		for _, h := range held {
			release(h, streams[h])
		}
		held = nil
		logf("own_effective", itoa(id), itoa(proxySetEffectiveContext(id)))
		logf("own_replace", itoa(id), itoa(replaceHeader("x-released-others", "1")))
		return 0 // Continue
	}
	switch s.mode {
	case "headers":
		hold(id, s)
		return 1 // Pause
	case "body":
		if eos == 0 {
			return 1
		}
		hold(id, s)
		return 1
	}
	return 0
}

func hold(id uint32, s *stream) {
	s.held = true
	held = append(held, id)
	logf("held", itoa(id))
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	checkAlive("on_request_body", id)
	logf("request_body", itoa(id), itoa(size), itoa(eos))
	s := streams[id]
	if s == nil || s.mode != "body" {
		return 0
	}
	if eos != 0 && !s.held {
		hold(id, s)
	}
	return 1 // StopIterationAndBuffer
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	checkAlive("on_response_headers", id)
	logf("response_headers", itoa(id))
	return 0
}

//go:wasmexport proxy_on_response_body
func onResponseBody(id, size, eos uint32) uint32 {
	checkAlive("on_response_body", id)
	return 0
}

//go:wasmexport proxy_on_log
func onLog(id uint32) {
	checkAlive("on_log", id)
	logf("on_log", itoa(id))
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 {
	checkAlive("on_done", id)
	logf("on_done", itoa(id))
	if _, ok := streams[id]; ok {
		done[id] = true
		delete(streams, id)
		for i, h := range held {
			if h == id {
				held = append(held[:i], held[i+1:]...)
				break
			}
		}
	}
	return 1
}

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	logf("on_delete", itoa(id))
}

//go:wasmexport proxy_on_tick
func onTick(rootID uint32) {
	for id := range done {
		if !reported[id] {
			reported[id] = true
			logf("effective_after_done", itoa(id), itoa(proxySetEffectiveContext(id)))
		}
	}
	var keep []uint32
	for _, id := range held {
		s := streams[id]
		s.ticks++
		if s.release == "never" || s.ticks < s.after {
			keep = append(keep, id)
			continue
		}
		release(id, s)
	}
	held = keep
}

func release(id uint32, s *stream) {
	r := proxySetEffectiveContext(id)
	logf("effective", itoa(id), itoa(r))
	if r != 0 {
		return
	}
	switch s.release {
	case "continue":
		logf("replace", itoa(id), itoa(replaceHeader("x-gateway-destination-endpoint", s.dest)))
		var length, flags uint32
		proxyGetBufferStatus(bufferRequestBody, &length, &flags)
		logf("body", itoa(id), itoa(length))
		logf("continue", itoa(id), itoa(proxyContinueStream(streamRequest)))
		logf("after_continue", itoa(id), itoa(replaceHeader("x-late", "1")))
		proxyGetBufferStatus(bufferRequestBody, &length, &flags)
		logf("body_after_continue", itoa(id), itoa(length))
	case "close":
		logf("close", itoa(id), itoa(proxyCloseStream(streamRequest)))
	case "reply":
		details, body := []byte("held_too_long"), []byte("held")
		logf("reply", itoa(id), itoa(proxySendLocalResponse(429, &details[0], uint32(len(details)),
			&body[0], uint32(len(body)), nil, 0, -1)))
	}
}

func main() {}
