package envoyhost

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// One HTTP stream through [wasm filter] -> router, emulating envoy's
// FilterManager (source/common/http/filter_manager.cc) for a single
// decoder/encoder filter and the Wasm filter glue (source/extensions/
// common/wasm/context.cc decodeHeaders, decodeData, encodeHeaders,
// encodeData, log, onDestroy). Every event of a stream is handled on the
// stream's own goroutine, one at a time, as on an Envoy worker; calls into
// the VM hold the VM's lock. In Envoy a VM's tick runs on the same worker
// dispatcher as the streams' callbacks (source/extensions/common/wasm/
// wasm.cc setTickPeriod: dispatcher_.createTimer), so nothing a tick does
// through the effective context can interleave with a stream event. Here
// the tick is a timer goroutine, so what a host call can reach of a stream
// (header maps, body buffers, the fields below marked vm.mu) is read and
// written under the VM's lock on the stream goroutine too.

// readChunkSize is how much one downstream or upstream read may deliver.
const readChunkSize = 16 * 1024

type evKind int

const (
	evWake evKind = iota // actions queued by a VM callback (continue, reply, reset)
	evReqData
	evReqTrailers
	evReqError
	evUpHeaders
	evUpData
	evUpError
	evRouteTimeout
	evIdleTimeout
)

type streamEvent struct {
	kind     evKind
	data     []byte
	eos      bool
	trailers *HeaderMap
	resp     *http.Response
	err      error
	gen      int
}

// localReply is a pending sendLocalReply.
type localReply struct {
	code       int
	body       []byte
	headers    []Pair
	grpcStatus *int
	details    string
}

// iteration states of the filter for one direction.
type iterState int

const (
	iterContinue iterState = iota
	iterStopSingle
	iterStopAllBuffer
	iterStopAllWatermark
)

func (s iterState) stoppedAll() bool { return s == iterStopAllBuffer || s == iterStopAllWatermark }

// direction is the filter-manager state of one direction (decode or
// encode).
type direction struct {
	iter         iterState
	headersDone  bool       // headers_continued_: headers passed the filter
	buffered     []byte     // buffered_request_data_ / buffered_response_data_
	hasBuffer    bool       // the buffer exists (bufferedData() != nullptr)
	streaming    bool       // decoder_filters_streaming_: over the limit pauses, not 413
	complete     bool       // all data from the peer arrived
	endSent      bool       // end of stream passed to the next stage
	chunk        []byte     // the data of the current callback
	buffering    bool       // buffering_request_body_ of the Wasm context
	trailers     *HeaderMap // request_trailers_ of the filter manager, once they came
	trailersDone bool       // trailers passed the filter
}

type stream struct {
	host   *Host
	lis    *listener
	w      http.ResponseWriter
	r      *http.Request
	plugin *Plugin
	vm     *VM
	wctx   *wasmContext // nil unless the filter is active
	mode   filterMode
	events chan streamEvent
	done   chan struct{}

	// State the guest can see through host calls (guarded by vm.mu).
	reqHeaders, reqTrailers, respHeaders, respTrailers *HeaderMap
	reqBody, respBody                                  *[]byte
	endOfStream                                        bool
	accessLogPhase                                     bool
	logReqHeaders, logRespHeaders, logRespTrailers     *HeaderMap
	filterState                                        map[string][]byte
	// details is the response code details; guarded by pmu, since a host
	// call on another goroutine (a tick acting on this stream) may set it.
	details string

	// Actions queued by callbacks (possibly of other contexts).
	pmu             sync.Mutex
	pendingReply    *localReply
	pendingContinue [2]bool
	pendingReset    bool

	streamFailed     bool // CHECK_FAIL's stream_failed_
	failureReplySent bool // failure_local_reply_sent_
	destroyed        bool

	reqMap, respMap *HeaderMap // the real header maps
	dec, enc        direction
	localReplySent  bool // local_complete_: decoding ends
	headersWritten  bool
	finished        bool
	reset           bool
	reqPermit       chan struct{}
	readPaused      bool
	readerBusy      atomic.Bool   // the body reader may be inside Body.Read
	readerDone      chan struct{} // closed when the body reader returns

	route       *RouteConfig
	up          *upstreamCall
	upGen       int
	routeTimer  Timer
	idleTimer   Timer
	idleGen     int
	upstreamRTT time.Time

	// Stream info. What properties read while a host call on another
	// goroutine may act on this stream (a tick through the effective
	// context) is atomic or written under vm.mu.
	startTime     time.Time
	remoteAddr    string
	localAddr     string
	connID        uint64
	bytesReceived atomic.Int64
	bytesSent     atomic.Int64
	responseCode  atomic.Int64
	upstreamHost  string        // vm.mu
	clusterName   string        // vm.mu
	routeName     string        // vm.mu
	completeAfter time.Duration // vm.mu
}

func (s *stream) filterActive() bool { return s.mode == filterActive && s.wctx != nil }

// wake asks the stream goroutine to look at queued actions.
func (s *stream) wake() {
	select {
	case s.events <- streamEvent{kind: evWake}:
	default:
	}
}

func (s *stream) setDetails(d string) {
	s.pmu.Lock()
	s.details = d
	s.pmu.Unlock()
}

// setDetailsIfUnset is streamInfo().setResponseCodeDetails guarded by
// !responseCodeDetails().has_value().
func (s *stream) setDetailsIfUnset(d string) {
	s.pmu.Lock()
	if s.details == "" {
		s.details = d
	}
	s.pmu.Unlock()
}

func (s *stream) getDetails() string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.details
}

func (s *stream) queueLocalReply(r *localReply) {
	s.pmu.Lock()
	if s.pendingReply == nil {
		s.pendingReply = r
	}
	s.pmu.Unlock()
	s.wake()
}

func (s *stream) queueContinue(typ uint32) {
	s.pmu.Lock()
	s.pendingContinue[typ] = true
	s.pmu.Unlock()
	s.wake()
}

func (s *stream) queueReset() {
	s.pmu.Lock()
	s.pendingReset = true
	s.pmu.Unlock()
	s.wake()
}

// takeUrgent returns a queued reset or local reply: these take effect
// before the status of the callback that queued them.
func (s *stream) takeUrgent() (reset bool, reply *localReply) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	reset, reply = s.pendingReset, s.pendingReply
	s.pendingReset, s.pendingReply = false, nil
	return
}

func (s *stream) takeContinues() [2]bool {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	c := s.pendingContinue
	s.pendingContinue = [2]bool{}
	return c
}

// handleUrgent applies a queued reset or local reply; true if it did.
func (s *stream) handleUrgent() bool {
	reset, reply := s.takeUrgent()
	if reset {
		s.resetStream()
		return true
	}
	if reply != nil {
		s.sendLocalReply(reply)
		return true
	}
	return false
}

func (s *stream) processPending() {
	for !s.finished {
		if s.handleUrgent() {
			continue
		}
		c := s.takeContinues()
		if !c[0] && !c[1] {
			return
		}
		if c[0] {
			s.continueDecoding()
		}
		if c[1] {
			s.continueEncoding()
		}
	}
}

// --- VM calls with cpp-host's CHECK_FAIL around them ------------------

// failStream is cpp-host CHECK_FAIL + envoy Context::failStream: on a
// failed VM, fail-open continues, otherwise a 503 with empty body and
// details wasm_fail_stream is sent once.
func (s *stream) checkFail() (failed bool) {
	if s.mode == filterActive && !s.vm.isFailedLocked() {
		return false
	}
	if s.plugin.failurePolicy == FailOpen {
		return true
	}
	if !s.streamFailed {
		s.streamFailed = true
		if !s.failureReplySent {
			s.failureReplySent = true
			r := &localReply{code: http.StatusServiceUnavailable, details: "wasm_fail_stream"}
			grpc := 14 // Unavailable
			r.grpcStatus = &grpc
			s.pmu.Lock()
			s.pendingReply = r
			s.pmu.Unlock()
		}
	}
	return true
}

func (vm *VM) isFailedLocked() bool { return vm == nil || vm.fail != FailOK || vm.closed }

// onCreate runs on_context_create for the stream (ContextBase::onCreate).
func (s *stream) onCreate() {
	if s.mode != filterActive || s.wctx.created {
		return
	}
	vm := s.vm
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if !vm.isFailedLocked() && vm.has("proxy_on_context_create") {
		vm.callback(s.wctx, "proxy_on_context_create", uint64(s.wctx.id), uint64(s.wctx.parentID))
	}
	s.wctx.created = true
}

// created reports in_vm_context_created_.
func (s *stream) created() bool { return s.wctx != nil && s.wctx.created }

// callHeaders runs on_request_headers/on_response_headers and converts the
// result (cpp-host ContextBase::onRequestHeaders and
// convertVmCallResultToFilterHeadersStatus). vm.mu must be held.
func (s *stream) callHeaders(name string, m *HeaderMap, eos bool) int {
	failOpen := s.plugin != nil && s.plugin.failurePolicy == FailOpen
	if s.checkFail() {
		if failOpen {
			return headersContinue
		}
		return headersStopAllIterationAndWatermark
	}
	vm := s.vm
	if !vm.has(name) {
		return headersContinue
	}
	args := []uint64{uint64(s.wctx.id), uint64(m.Len())}
	if vm.abi != ABI010 {
		args = append(args, boolArg(eos))
	}
	res, stopped, _ := vm.callback(s.wctx, name, args...)
	if s.checkFail() {
		if failOpen {
			return headersContinue
		}
		return headersStopAllIterationAndWatermark
	}
	r := uint32(res)
	if stopped || r > headersStopAllIterationAndWatermark {
		return headersStopAllIterationAndWatermark
	}
	if r == headersStopIteration && !s.plugin.allowStopIter {
		// Proxy-Wasm 0.2.* StopIteration becomes StopAllIterationAndWatermark
		// unless allow_on_headers_stop_iteration (cpp-host src/context.cc,
		// onRequestHeaders).
		return headersStopAllIterationAndWatermark
	}
	return int(r)
}

// callData runs on_request_body/on_response_body and converts the result.
func (s *stream) callData(name string, size int, eos bool) int {
	failOpen := s.plugin != nil && s.plugin.failurePolicy == FailOpen
	if s.checkFail() {
		if failOpen {
			return dataContinue
		}
		return dataStopIterationNoBuffer
	}
	vm := s.vm
	if !vm.has(name) {
		return dataContinue
	}
	res, stopped, _ := vm.callback(s.wctx, name, uint64(s.wctx.id), uint64(size), boolArg(eos))
	if s.checkFail() {
		if failOpen {
			return dataContinue
		}
		return dataStopIterationNoBuffer
	}
	r := uint32(res)
	if stopped || r > dataStopIterationNoBuffer {
		return dataStopIterationNoBuffer
	}
	return int(r)
}

func (s *stream) callTrailers(name string, m *HeaderMap) int {
	failOpen := s.plugin != nil && s.plugin.failurePolicy == FailOpen
	if s.checkFail() {
		if failOpen {
			return trailersContinue
		}
		return trailersStopIteration
	}
	vm := s.vm
	if !vm.has(name) {
		return trailersContinue
	}
	res, stopped, _ := vm.callback(s.wctx, name, uint64(s.wctx.id), uint64(m.Len()))
	if s.checkFail() {
		if failOpen {
			return trailersContinue
		}
		return trailersStopIteration
	}
	if stopped || uint32(res) > trailersStopIteration {
		return trailersStopIteration
	}
	return int(res)
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// lockVM locks the stream's VM if there is one; the returned func unlocks.
func (s *stream) lockVM() func() {
	if s.vm == nil {
		return func() {}
	}
	s.vm.mu.Lock()
	return s.vm.mu.Unlock
}

// --- decode path --------------------------------------------------------

// decodeHeaders is the filter's decodeHeaders then, depending on the
// status, the router's.
func (s *stream) decodeHeaders(eos bool) {
	s.dec.complete = eos
	if s.mode == filterSkipped {
		s.dec.headersDone = true
		s.routerHeaders(eos)
		return
	}
	s.onCreate()
	unlock := s.lockVM()
	s.reqHeaders = s.reqMap
	s.endOfStream = eos
	status := s.callHeaders("proxy_on_request_headers", s.reqMap, eos)
	if status == headersContinue {
		s.reqHeaders = nil
	}
	unlock()
	if s.handleUrgent() || s.finished {
		return
	}
	s.applyHeadersStatus(&s.dec, status, eos, s.routerHeaders)
	s.processPending()
}

// applyHeadersStatus is FilterManager's commonHandleAfterHeadersCallback
// followed by passing headers on when iteration continues.
func (s *stream) applyHeadersStatus(d *direction, status int, eos bool, next func(bool)) {
	switch status {
	case headersStopIteration:
		d.iter = iterStopSingle
	case headersStopAllIterationAndBuffer:
		d.iter = iterStopAllBuffer
		d.streaming = false
	case headersStopAllIterationAndWatermark:
		d.iter = iterStopAllWatermark
	case headersContinueAndEndStream:
		d.headersDone = true
		next(true)
		d.endSent = true
	default:
		d.headersDone = true
		if eos {
			d.endSent = true
		}
		next(eos)
	}
}

// onRequestData handles one downstream body chunk.
func (s *stream) onRequestData(data []byte, eos bool) {
	if eos {
		s.dec.complete = true
	}
	if s.localReplySent || s.finished {
		return // later body data is dropped after a local reply
	}
	if s.mode == filterSkipped {
		s.routerData(data, eos)
		return
	}
	s.filterData(&s.dec, data, eos, false)
}

// onRequestTrailers handles the downstream request trailers: the request
// is complete (conn_manager_impl.cc decodeTrailers: maybeEndDecode(true)),
// then FilterManager::decodeTrailers.
func (s *stream) onRequestTrailers(m *HeaderMap) {
	s.dec.complete = true
	if s.localReplySent || s.finished {
		return
	}
	s.dec.trailers = m
	if s.mode == filterSkipped {
		s.dec.trailersDone = true
		s.routerTrailers()
		return
	}
	s.filterTrailers(&s.dec)
}

// filterTrailers is FilterManager::decodeTrailers for our one filter plus
// the Wasm glue (context.cc decodeTrailers). A filter that stopped all
// iteration gets the trailers only when it continues (commonContinue). The
// body it buffered stays readable here: getBuffer returns the decoding
// buffer while buffering_request_body_ is set, and only decodeData clears
// it. Request headers stay writable if on_request_headers did not
// continue.
func (s *stream) filterTrailers(d *direction) {
	if d.iter.stoppedAll() {
		return
	}
	if !s.created() {
		d.trailersDone = true
		s.routerTrailers()
		return
	}
	unlock := s.lockVM()
	s.reqTrailers = d.trailers
	status := s.callTrailers("proxy_on_request_trailers", d.trailers)
	if status == trailersContinue {
		s.reqTrailers = nil
	}
	unlock()
	if s.handleUrgent() || s.finished {
		return
	}
	// commonHandleAfterTrailersCallback.
	if status == trailersContinue {
		if d.iter == iterStopSingle {
			s.commonContinue(d, false)
		} else {
			d.trailersDone = true
			s.routerTrailers()
		}
	} else if d.iter == iterContinue {
		d.iter = iterStopSingle
	}
	s.processPending()
}

// filterData is FilterManager::decodeData/encodeData for our one filter
// plus the Wasm glue (context.cc decodeData/encodeData).
func (s *stream) filterData(d *direction, data []byte, eos bool, response bool) {
	limit := s.lis.cfg.BufferLimitBytes
	if d.iter.stoppedAll() {
		// The filter is not called: the filter manager buffers (under the
		// VM's lock, as every write of the body).
		unlock := s.lockVM()
		d.buffered = append(d.buffered, data...)
		d.hasBuffer = true
		over := len(d.buffered) > limit
		unlock()
		if over {
			s.bufferOverLimit(d, response)
		}
		return
	}
	if !s.created() || (response && s.failureReplySent) {
		// The Wasm context never started (or failed with a reply sent):
		// the filter passes data through.
		s.passData(d, data, eos, response)
		return
	}
	unlock := s.lockVM()
	if d.buffering {
		// addDecodedData: the chunk joins the buffer, the callback sees it all.
		d.buffered = append(d.buffered, data...)
		d.hasBuffer = true
		d.chunk = nil
		if len(d.buffered) > limit && !d.streaming {
			unlock()
			s.bufferOverLimit(d, response)
			return
		}
		s.setBodyRef(response, &d.buffered)
	} else {
		d.chunk = data
		s.setBodyRef(response, &d.chunk)
	}
	s.endOfStream = eos
	name := "proxy_on_request_body"
	if response {
		name = "proxy_on_response_body"
	}
	status := s.callData(name, len(*s.bodyRef(response)), eos)
	d.buffering = false
	switch status {
	case dataContinue:
		s.setBodyRef(response, nil)
	case dataStopIterationAndBuffer:
		d.buffering = true
	}
	over := false
	if status == dataStopIterationAndBuffer || status == dataStopIterationAndWatermark {
		// commonHandleBufferData, under the VM's lock: while buffering the
		// body is readable and writable from other goroutines (a tick with
		// the effective context), so its size is taken here too. In Envoy
		// the check follows the callback on the same dispatcher thread, with
		// nothing in between.
		d.buffered = append(d.buffered, d.chunk...)
		d.hasBuffer = true
		d.chunk = nil
		over = len(d.buffered) > limit
	}
	unlock()
	if s.handleUrgent() || s.finished {
		return
	}
	switch status {
	case dataContinue:
		if d.iter == iterStopSingle {
			d.buffered = append(d.buffered, d.chunk...)
			d.hasBuffer = true
			d.chunk = nil
			s.commonContinue(d, response)
		} else {
			s.passData(d, d.chunk, eos, response)
			d.chunk = nil
		}
	case dataStopIterationAndBuffer, dataStopIterationAndWatermark:
		d.iter = iterStopSingle
		d.streaming = status == dataStopIterationAndWatermark
		if over {
			s.bufferOverLimit(d, response)
			return
		}
	default: // StopIterationNoBuffer: the filter keeps (drops) the data
		d.iter = iterStopSingle
		d.chunk = nil
		if d.complete && !d.hasBuffer {
			d.hasBuffer = true // an empty buffer carries end_stream on continue
		}
	}
	s.processPending()
}

func (s *stream) setBodyRef(response bool, b *[]byte) {
	if response {
		s.respBody = b
	} else {
		s.reqBody = b
	}
}

func (s *stream) bodyRef(response bool) *[]byte {
	if response {
		return s.respBody
	}
	return s.reqBody
}

// bufferOverLimit: a buffering filter over the limit gets 413 on requests
// and 500 on responses (requestDataTooLarge/responseDataTooLarge); a
// watermark-buffered stream stops reading instead.
func (s *stream) bufferOverLimit(d *direction, response bool) {
	if d.iter == iterStopAllWatermark || (d.iter == iterStopSingle && d.streaming) {
		if !response {
			s.readPaused = true
		}
		return
	}
	if response {
		s.sendLocalReply(&localReply{code: http.StatusInternalServerError,
			body: []byte("Internal Server Error"), details: "response_payload_too_large"})
		return
	}
	s.sendLocalReply(&localReply{code: http.StatusRequestEntityTooLarge,
		body: []byte("Payload Too Large"), details: "request_payload_too_large"})
}

// passData hands data past the filter to the next stage.
func (s *stream) passData(d *direction, data []byte, eos bool, response bool) {
	if eos {
		d.endSent = true
	}
	if response {
		s.writeData(data, eos)
	} else {
		s.routerData(data, eos)
	}
}

// commonContinue is ActiveStreamFilterBase::commonContinue: headers first
// (end_stream if nothing else will follow), then buffered data — through
// this filter again if it had stopped everything.
func (s *stream) commonContinue(d *direction, response bool) {
	if (!response && s.localReplySent) || s.finished || d.iter == iterContinue {
		return
	}
	fromThis := d.iter.stoppedAll()
	d.iter = iterContinue
	hasTrailers := d.trailers != nil && !d.trailersDone
	if !d.headersDone {
		d.headersDone = true
		eos := d.complete && !d.hasBuffer && !hasTrailers
		if eos {
			d.endSent = true
		}
		if response {
			s.writeHeaders(eos)
		} else {
			s.routerHeaders(eos)
		}
	}
	if d.hasBuffer && !s.finished {
		// Under the VM's lock: the body may be read through the effective
		// context from another goroutine while buffering.
		unlock := s.lockVM()
		data := d.buffered
		d.buffered, d.hasBuffer = nil, false
		unlock()
		if fromThis {
			s.filterData(d, data, d.complete && !hasTrailers, response)
		} else {
			s.passData(d, data, d.complete && !hasTrailers, response)
		}
	}
	if hasTrailers && !response && !s.finished && !s.localReplySent {
		// doTrailers: through this filter again if it had stopped
		// everything (it has not seen them), else on to the router.
		if fromThis {
			s.filterTrailers(d)
		} else {
			d.trailersDone = true
			s.routerTrailers()
		}
	}
	if !response && s.readPaused {
		s.readPaused = false
		s.grantRead()
	}
}

func (s *stream) continueDecoding() { s.commonContinue(&s.dec, false) }
func (s *stream) continueEncoding() { s.commonContinue(&s.enc, true) }

// grantRead lets the body reader deliver the next chunk.
func (s *stream) grantRead() {
	if s.dec.complete || s.readPaused || s.reqPermit == nil {
		return
	}
	select {
	case s.reqPermit <- struct{}{}:
	default:
	}
}

// readRequestBody delivers the downstream body one chunk per permit.
func (s *stream) readRequestBody() {
	defer close(s.readerDone)
	defer s.readerBusy.Store(false)
	var total int64
	buf := make([]byte, readChunkSize)
	cl := s.r.ContentLength
	// Trailers end an HTTP/2 request; they are known only at the body's
	// EOF. net/http keeps only trailers the request declared (Trailer
	// header). Envoy's HTTP/1 codec drops trailers (http_protocol_options
	// enable_trailers is off by default), and so does this host.
	withTrailers := s.r.ProtoMajor == 2 && len(s.r.Trailer) > 0
	if withTrailers {
		cl = -1
	}
	for {
		select {
		case <-s.reqPermit:
		case <-s.done:
			return
		}
		var n int
		var err error
		for n == 0 && err == nil {
			n, err = s.r.Body.Read(buf)
		}
		total += int64(n)
		eos := err == io.EOF || (cl >= 0 && total >= cl)
		if err != nil && err != io.EOF {
			s.send(streamEvent{kind: evReqError, err: err})
			return
		}
		if eos && withTrailers {
			if m := requestTrailerMap(s.r.Trailer); m.Len() > 0 {
				if n > 0 {
					s.send(streamEvent{kind: evReqData, data: append([]byte(nil), buf[:n]...)})
				}
				s.send(streamEvent{kind: evReqTrailers, trailers: m})
				return
			}
		}
		s.send(streamEvent{kind: evReqData, data: append([]byte(nil), buf[:n]...), eos: eos})
		if eos {
			return
		}
	}
}

func (s *stream) send(ev streamEvent) {
	select {
	case s.events <- ev:
	case <-s.done:
	}
}

// --- encode path --------------------------------------------------------

// encodeHeaders passes response headers through the filter (context.cc
// encodeHeaders: skipped if the context never started or failed with its
// reply already sent).
func (s *stream) encodeHeaders(m *HeaderMap, eos bool) {
	s.respMap = m
	s.enc.complete = eos
	if !s.filterActive() || !s.created() || s.failureReplySent {
		s.enc.headersDone = true
		s.writeHeaders(eos)
		return
	}
	unlock := s.lockVM()
	s.respHeaders = m
	s.endOfStream = eos
	status := s.callHeaders("proxy_on_response_headers", m, eos)
	if status == headersContinue {
		s.respHeaders = nil
	}
	unlock()
	if s.handleUrgent() || s.finished {
		return
	}
	s.applyHeadersStatus(&s.enc, status, eos, s.writeHeaders)
	s.processPending()
}

// encodeData passes one response chunk through the filter.
func (s *stream) encodeData(data []byte, eos bool) {
	if eos {
		s.enc.complete = true
	}
	if s.finished {
		return
	}
	if !s.filterActive() {
		s.passData(&s.enc, data, eos, true)
		return
	}
	s.filterData(&s.enc, data, eos, true)
}

// writeHeaders sends the response headers downstream.
func (s *stream) writeHeaders(eos bool) {
	if s.headersWritten || s.finished {
		return
	}
	s.headersWritten = true
	// The map is read under the VM's lock: a tick acting on this stream
	// through the effective context may still write the response headers.
	unlock := s.lockVM()
	resp := NewHeaderMap(s.respMap.Pairs()...)
	unlock()
	status := http.StatusOK
	if v, ok := resp.Get(":status"); ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 100 && n <= 999 {
			status = n
		}
	}
	s.responseCode.Store(int64(status))
	h := s.w.Header()
	for _, p := range resp.Pairs() {
		if strings.HasPrefix(p.Key, ":") || hopByHop[p.Key] {
			continue
		}
		h[http.CanonicalHeaderKey(p.Key)] = append(h[http.CanonicalHeaderKey(p.Key)], p.Value)
	}
	if _, ok := resp.Get("server"); !ok {
		h.Set("Server", "envoy") // the connection manager's server_name
	}
	if !s.dec.complete && s.r.ProtoMajor == 1 {
		// An HTTP/1 response sent before the request ended closes the
		// connection (the connection manager drains it); HTTP/2 resets
		// just the stream.
		h.Set("Connection", "close")
	}
	if _, ok := resp.Get("content-length"); !ok && eos && !isBodilessStatus(status) {
		h.Set("Content-Length", "0")
	}
	s.w.WriteHeader(status)
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	if eos {
		s.enc.endSent = true
		s.finish()
	}
}

func isBodilessStatus(code int) bool { return code == 204 || code == 304 || code < 200 }

// writeData sends response body downstream, flushing every chunk so
// streamed (SSE) responses reach the client as they come.
func (s *stream) writeData(data []byte, eos bool) {
	if s.finished {
		return
	}
	if !s.headersWritten {
		s.writeHeaders(false)
	}
	if len(data) > 0 {
		n, err := s.w.Write(data)
		s.bytesSent.Add(int64(n))
		if err != nil {
			s.resetStream()
			return
		}
		if f, ok := s.w.(http.Flusher); ok {
			f.Flush()
		}
	}
	if eos {
		s.enc.endSent = true
		s.finish()
	}
}

// hopByHop headers are connection-specific: the codec owns them.
var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "transfer-encoding": true,
	"upgrade": true, "proxy-connection": true, "te": true}

// --- stream idle timeout ------------------------------------------------

// resetIdleTimer re-arms stream_idle_timeout: bytes moved on the stream
// (envoy conn_manager_impl.cc ActiveStream::resetIdleTimer, called from
// the filter manager's decodeData and the encode path).
func (s *stream) resetIdleTimer() {
	d := s.lis.cfg.StreamIdleTimeout
	if d <= 0 || s.finished {
		return
	}
	if s.idleTimer != nil {
		s.idleTimer.Stop()
	}
	s.idleGen++
	gen := s.idleGen
	s.idleTimer = s.host.clock.AfterFunc(d, func() {
		s.send(streamEvent{kind: evIdleTimeout, gen: gen})
	})
}

// onIdleTimeout is ActiveStream::onIdleTimeout: a local reply, 408 while
// the request is still coming, 504 once it is complete
// (Utility::maybeRequestTimeoutCode), details stream_idle_timeout; a reset
// if the response has started.
func (s *stream) onIdleTimeout(gen int) {
	if gen != s.idleGen || s.finished {
		return
	}
	code := http.StatusRequestTimeout
	if s.dec.complete {
		code = http.StatusGatewayTimeout
	}
	s.sendLocalReply(&localReply{code: code, body: []byte("stream timeout"), details: "stream_idle_timeout"})
}

// --- local replies ------------------------------------------------------

// sendLocalReply is FilterManager::sendLocalReply with envoy's
// prepareLocalReply: through the filter if no response started yet,
// directly if response headers are being processed, a reset if they were
// already sent.
func (s *stream) sendLocalReply(r *localReply) {
	if s.finished {
		return
	}
	s.localReplySent = true
	s.setDetails(r.details)
	s.cancelUpstream()
	if s.headersWritten {
		s.resetStream()
		return
	}
	headers := NewHeaderMap(Pair{":status", strconv.Itoa(r.code)})
	for _, p := range r.headers {
		headers.Add(p.Key, p.Value)
	}
	if len(r.body) > 0 {
		headers.Set("content-length", strconv.Itoa(len(r.body)))
		if _, ok := headers.Get("content-type"); !ok {
			headers.Add("content-type", "text/plain")
		}
	} else {
		headers.Remove("content-length")
		headers.Remove("content-type")
	}
	body := r.body
	// The request map and the response state are guest-visible: a tick
	// acting on this stream may be reading or writing them.
	unlock := s.lockVM()
	if s.reqMap != nil {
		if m, _ := s.reqMap.Get(":method"); m == "HEAD" {
			body = nil
		}
	}
	direct := s.respMap != nil
	if direct {
		// sendDirectLocalReply: response headers already went through the
		// filters; the reply bypasses them.
		s.respMap = headers
	} else {
		s.enc = direction{}
	}
	unlock()
	if direct {
		s.writeHeaders(len(body) == 0)
		if len(body) > 0 {
			s.writeData(body, true)
		}
		return
	}
	s.encodeHeaders(headers, len(body) == 0)
	if len(body) > 0 && !s.finished {
		s.encodeData(body, true)
	}
}

// resetStream aborts the downstream connection without a response, or
// with a truncated one.
func (s *stream) resetStream() {
	if s.finished {
		return
	}
	s.reset = true
	s.cancelUpstream()
	s.finish()
}

// finish ends the stream: the loop stops and log, done, delete run.
func (s *stream) finish() {
	if s.finished {
		return
	}
	s.finished = true
	if s.routeTimer != nil {
		s.routeTimer.Stop()
	}
	if s.idleTimer != nil {
		s.idleTimer.Stop()
	}
}

// complete runs on_log, on_done and on_delete (context.cc log and
// onDestroy; the access log runs before the filters are destroyed).
func (s *stream) complete() {
	completeAfter := s.host.clock.Now().Sub(s.startTime)
	if s.vm == nil {
		s.completeAfter = completeAfter
	}
	if s.mode != filterSkipped && s.wctx != nil {
		s.onCreate()
		vm := s.vm
		vm.mu.Lock()
		s.completeAfter = completeAfter
		s.accessLogPhase = true
		s.logReqHeaders, s.logRespHeaders, s.logRespTrailers = s.reqMap, s.respMap, s.respTrailers
		if !vm.isFailedLocked() && vm.has("proxy_on_log") {
			vm.callback(s.wctx, "proxy_on_log", uint64(s.wctx.id))
		}
		s.accessLogPhase = false
		s.logReqHeaders, s.logRespHeaders, s.logRespTrailers = nil, nil, nil
		if s.wctx.created && !s.destroyed {
			s.destroyed = true
			if !vm.isFailedLocked() && vm.has("proxy_on_done") {
				vm.callback(s.wctx, "proxy_on_done", uint64(s.wctx.id))
			}
			if !vm.isFailedLocked() && vm.has("proxy_on_delete") {
				vm.callback(s.wctx, "proxy_on_delete", uint64(s.wctx.id))
			}
		}
		delete(vm.contexts, s.wctx.id)
		vm.mu.Unlock()
	}
	if s.host.cfg.AccessLog != nil {
		path := ""
		method := s.r.Method
		if s.reqMap != nil {
			path, _ = s.reqMap.Get(":path")
		}
		s.host.cfg.AccessLog(AccessLogEntry{Listener: s.lis.cfg.Name, Method: method, Path: path,
			Status: int(s.responseCode.Load()), Details: s.getDetails(), UpstreamHost: s.upstreamHost,
			BytesSent: s.bytesSent.Load(), Duration: s.completeAfter})
	}
}
