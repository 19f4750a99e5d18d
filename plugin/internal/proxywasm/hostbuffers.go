package proxywasm

import (
	"errors"
	"unsafe"
)

// ErrHostBuffer reports a host that returned data in memory it did not obtain
// from proxy_on_memory_allocate for this call, or a size larger than it asked
// for: a host bug, reported instead of reading arbitrary memory.
var ErrHostBuffer = errors.New("proxywasm: host returned data outside a buffer it allocated")

// hostBuffers keeps every buffer the host asked the guest to allocate
// reachable by the garbage collector until the binding reads it. The host
// writes results into guest memory after proxy_on_memory_allocate returns and
// before the host call returns; nothing on the Go side points at that memory in
// between, so without this table the GC could reuse it. A host call that
// returns data allocates at most once (proxy-wasm-cpp-host copies each
// result with one allocation), so the table usually holds 0 or 1 entries: a
// short slice, searched linearly, costs far less than a map in a Wasm guest.
type hostBuffers struct {
	pinned []pinnedBuffer
	// offered is storage the caller of the host call in flight lends for
	// the result (the *Into functions); the next allocation that fits uses
	// it instead of a fresh buffer, so a result read on every request
	// reuses the same memory.
	offered []byte
}

type pinnedBuffer struct {
	addr uintptr
	buf  []byte
}

func newHostBuffers() *hostBuffers {
	return &hostBuffers{pinned: make([]pinnedBuffer, 0, 4)}
}

// alloc returns the address of a buffer of size bytes (at least one byte,
// so every allocation has a distinct non-zero address): the offered storage
// when it fits (used once), else a fresh zeroed buffer.
func (h *hostBuffers) alloc(size uint32) uintptr {
	var b []byte
	if size > 0 && uint64(size) <= uint64(cap(h.offered)) {
		b, h.offered = h.offered[:size], nil
	} else {
		b = make([]byte, max(size, 1))
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	h.pinned = append(h.pinned, pinnedBuffer{addr: p, buf: b})
	return p
}

// offer lends b's storage to the next allocation that fits; nil withdraws
// an offer nobody used.
func (h *hostBuffers) offer(b []byte) { h.offered = b }

// take hands over the buffer at ptr holding size bytes written by the host and
// unpins it. Size 0 is empty data with no error, whatever ptr is.
func (h *hostBuffers) take(ptr uintptr, size uint32) ([]byte, error) {
	i := h.find(ptr)
	if size == 0 {
		if i >= 0 {
			h.unpin(i)
		}
		return nil, nil
	}
	if i < 0 || uint64(size) > uint64(len(h.pinned[i].buf)) {
		return nil, ErrHostBuffer
	}
	b := h.pinned[i].buf
	h.unpin(i)
	return b[:size:size], nil
}

func (h *hostBuffers) find(ptr uintptr) int {
	if ptr == 0 {
		return -1
	}
	for i := range h.pinned {
		if h.pinned[i].addr == ptr {
			return i
		}
	}
	return -1
}

func (h *hostBuffers) unpin(i int) {
	last := len(h.pinned) - 1
	h.pinned[i] = h.pinned[last]
	h.pinned[last] = pinnedBuffer{} // no stale reference for the GC
	h.pinned = h.pinned[:last]
}

// releaseAll drops buffers nobody took (the host allocated, then failed the
// call) and any offer. Called when the outermost callback returns, when no
// host call is in flight.
func (h *hostBuffers) releaseAll() {
	clear(h.pinned)
	h.pinned = h.pinned[:0]
	h.offered = nil
}

// size reports how many buffers are pinned (tests).
func (h *hostBuffers) size() int { return len(h.pinned) }

// buffer returns the pinned buffer at ptr (tests).
func (h *hostBuffers) buffer(ptr uintptr) []byte {
	if i := h.find(ptr); i >= 0 {
		return h.pinned[i].buf
	}
	return nil
}
