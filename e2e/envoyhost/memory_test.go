package envoyhost

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func memoryBase(t *testing.T, vm *VM) uintptr {
	t.Helper()
	b, ok := vm.mem.Read(0, 1)
	require.True(t, ok)
	return uintptr(unsafe.Pointer(&b[0]))
}

// A VM's memory grows in place, as V8's does: the base address stays, the
// old contents stay, the new pages read as zero, and growing past the
// maximum fails.
func TestLinearMemoryGrowsInPlace(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reservations are implemented on Linux only")
	}
	h := newHarness(t, trivialGuestPkg, withWorkers(1))
	vm, _, mode := h.host.listeners[0].plugin.contextFor(1)
	require.Equal(t, filterActive, mode)
	vm.mu.Lock()
	defer vm.mu.Unlock()

	base := memoryBase(t, vm)
	size := vm.mem.Size()
	require.True(t, vm.mem.WriteUint32Le(size-4, 0xfeedbeef))
	prev, ok := vm.mem.Grow(160) // 10 MiB
	require.True(t, ok)
	assert.Equal(t, size/65536, prev)
	assert.Equal(t, base, memoryBase(t, vm), "memory moved")
	v, ok := vm.mem.ReadUint32Le(size - 4)
	require.True(t, ok)
	assert.Equal(t, uint32(0xfeedbeef), v)
	grown, ok := vm.mem.Read(size, vm.mem.Size()-size)
	require.True(t, ok)
	assert.Equal(t, make([]byte, len(grown)), grown, "new pages are zero")

	_, ok = vm.mem.Grow(16384) // past the host's 1 GiB limit
	assert.False(t, ok)
}

// A closed VM's reservation is released (zeroed) and reused.
func TestLinearMemoryReservationReused(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reservations are implemented on Linux only")
	}
	m := allocateMemory(0, 1<<20)
	r, ok := m.(*reservedMemory)
	require.True(t, ok, "a reservation, not a Go slice")
	buf := m.Reallocate(1 << 16)
	require.Len(t, buf, 1<<16)
	buf[100] = 7
	assert.Nil(t, m.Reallocate(2<<20), "beyond the maximum")
	region := unsafe.SliceData(r.region)
	m.Free()
	m.Free() // idempotent

	again := allocateMemory(0, 1<<20)
	defer again.Free()
	buf = again.Reallocate(1 << 16)
	assert.Equal(t, region, unsafe.SliceData(buf), "the released reservation is reused")
	assert.Equal(t, byte(0), buf[100], "released pages read as zero")
}

// Without a reservation (another OS, or none possible) memories are Go
// slices that copy when they grow.
func TestSliceMemory(t *testing.T) {
	m := &sliceMemory{buf: make([]byte, 0, 4)}
	b := m.Reallocate(2)
	b[1] = 9
	b = m.Reallocate(100)
	require.Len(t, b, 100)
	assert.Equal(t, byte(9), b[1])
	assert.Len(t, m.Reallocate(3), 3)
	m.Free()
}
