package envoyhost

import (
	"context"
	"sync"

	"github.com/tetratelabs/wazero/experimental"
)

// Linear memory the way V8 provides it. V8 reserves the whole address range
// a Wasm memory may ever use when the memory is created and commits pages in
// place as it grows, so memory.grow never moves or copies a VM's memory
// (v8 src/wasm/wasm-memory.cc, BackingStore::TryAllocateWasmMemory). wazero's
// default backs a memory with a Go slice that is reallocated and copied
// whenever it outgrows its capacity: with a Go guest growing from 6 to 9 MB
// that was a 50-70 ms stall (copy plus page faults on the fresh slice) in
// the middle of an ordinary request, several times per VM. reservedMemory
// keeps V8's behaviour where the platform allows it (memory_linux.go).

// reserveLinearMemory switches reservations on (tests compare both ways).
var reserveLinearMemory = true

// memoryPool keeps reservations of VMs that were closed, for the next VM:
// their pages are released to the OS (reads as zero again) but the address
// range stays mapped, so a stale access after Close reads zeros instead of
// faulting, and tests that start hundreds of VMs reuse a few ranges.
type memoryPool struct {
	mu   sync.Mutex
	free map[uint64][][]byte // reservation size -> released reservations
}

var reservations = &memoryPool{free: map[uint64][][]byte{}}

func (p *memoryPool) get(size uint64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.free[size]
	if len(l) == 0 {
		return nil
	}
	b := l[len(l)-1]
	p.free[size] = l[:len(l)-1]
	return b
}

func (p *memoryPool) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free[uint64(len(b))] = append(p.free[uint64(len(b))], b)
}

// reservedMemory is a linear memory inside one reservation of its maximum
// size: growing only lengthens the slice.
type reservedMemory struct {
	region []byte
}

func (m *reservedMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.region)) {
		return nil // beyond the maximum: memory.grow fails
	}
	return m.region[:size]
}

func (m *reservedMemory) Free() {
	if m.region == nil {
		return
	}
	releasePages(m.region)
	reservations.put(m.region)
	m.region = nil
}

// sliceMemory is wazero's own strategy, the fallback when no reservation
// can be made: a Go slice, reallocated (copied) when it outgrows its
// capacity.
type sliceMemory struct {
	buf []byte
}

func (m *sliceMemory) Reallocate(size uint64) []byte {
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	m.buf = append(m.buf[:cap(m.buf)], make([]byte, size-uint64(cap(m.buf)))...)[:size]
	return m.buf
}

func (m *sliceMemory) Free() { m.buf = nil }

// allocateMemory creates the linear memory of one instance: a reservation
// of max bytes when possible, else a Go slice.
func allocateMemory(capacity, max uint64) experimental.LinearMemory {
	if max > 0 {
		if region := reservations.get(max); region != nil {
			return &reservedMemory{region: region}
		}
		if region := reservePages(max); region != nil {
			return &reservedMemory{region: region}
		}
	}
	return &sliceMemory{buf: make([]byte, 0, capacity)}
}

// withReservedMemory makes instantiations under ctx use allocateMemory.
func withReservedMemory(ctx context.Context) context.Context {
	return experimental.WithMemoryAllocator(ctx, experimental.MemoryAllocatorFunc(allocateMemory))
}
