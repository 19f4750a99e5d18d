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
// returns data allocates at most once [cpp-host src/exports.cc,
// WasmBase::copyToPointerSize], so the table usually holds 0 or 1 entries.
type hostBuffers struct {
	pinned map[uintptr][]byte
}

func newHostBuffers() *hostBuffers {
	return &hostBuffers{pinned: make(map[uintptr][]byte, 4)}
}

// alloc returns the address of a fresh zeroed buffer of size bytes (at least
// one byte, so every allocation has a distinct non-zero address).
func (h *hostBuffers) alloc(size uint32) uintptr {
	b := make([]byte, max(size, 1))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	h.pinned[p] = b
	return p
}

// take hands over the buffer at ptr holding size bytes written by the host and
// unpins it. Size 0 is empty data with no error, whatever ptr is.
func (h *hostBuffers) take(ptr uintptr, size uint32) ([]byte, error) {
	if size == 0 {
		if ptr != 0 {
			delete(h.pinned, ptr)
		}
		return nil, nil
	}
	b, ok := h.pinned[ptr]
	if !ok || uint64(size) > uint64(len(b)) {
		return nil, ErrHostBuffer
	}
	delete(h.pinned, ptr)
	return b[:size:size], nil
}

// releaseAll drops buffers nobody took (the host allocated, then failed the
// call). Called when the outermost callback returns, when no host call is in
// flight.
func (h *hostBuffers) releaseAll() {
	if len(h.pinned) > 0 {
		clear(h.pinned)
	}
}

// size reports how many buffers are pinned (tests).
func (h *hostBuffers) size() int { return len(h.pinned) }
