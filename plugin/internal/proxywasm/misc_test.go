package proxywasm

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

func unsafeStringData(s string) *byte { return unsafe.StringData(s) }

func TestStatusToError(t *testing.T) {
	for _, tc := range []struct {
		status uint32
		want   error
	}{
		{0, nil},
		{1, types.ErrorStatusNotFound},
		{2, types.ErrorStatusBadArgument},
		{3, ErrorStatusSerializationFailure},
		{4, ErrorStatusParseFailure},
		{5, ErrorStatusBadExpression},
		{6, ErrorStatusInvalidMemoryAccess},
		{7, types.ErrorStatusEmpty},
		{8, types.ErrorStatusCasMismatch},
		{9, ErrorStatusResultMismatch},
		{10, types.ErrorInternalFailure},
		{11, ErrorStatusBrokenConnection},
		{12, types.ErrorUnimplemented},
	} {
		err := statusToError(tc.status)
		assert.Equal(t, tc.want, err, "status %d", tc.status)
		if tc.want != nil {
			assert.True(t, errors.Is(err, tc.want))
		}
	}
	err := statusToError(99)
	assert.Equal(t, StatusError(99), err)
	assert.Contains(t, err.Error(), "(99)")
	assert.Contains(t, ErrorStatusParseFailure.Error(), "parse failure (4)")
}

func TestHostBuffers(t *testing.T) {
	h := newHostBuffers()
	p := h.alloc(10)
	require.NotZero(t, p)
	assert.Equal(t, 1, h.size())

	// The host writes into the buffer; take returns exactly size bytes.
	copy(h.buffer(p), "0123456789")
	b, err := h.take(p, 4)
	require.NoError(t, err)
	assert.Equal(t, "0123", string(b))
	assert.Equal(t, 4, cap(b), "callers cannot append into the rest of the host buffer")
	assert.Equal(t, 0, h.size())

	// Taking twice, an unknown pointer or too many bytes is a host error.
	_, err = h.take(p, 4)
	assert.ErrorIs(t, err, ErrHostBuffer)
	q := h.alloc(3)
	_, err = h.take(q, 4)
	assert.ErrorIs(t, err, ErrHostBuffer)
	_, err = h.take(q+1, 1)
	assert.ErrorIs(t, err, ErrHostBuffer)

	// Size 0 is empty whatever the pointer; a pinned one is released.
	b, err = h.take(0, 0)
	require.NoError(t, err)
	assert.Nil(t, b)
	b, err = h.take(q, 0)
	require.NoError(t, err)
	assert.Nil(t, b)
	assert.Equal(t, 0, h.size())

	// alloc(0) still yields a distinct non-zero address.
	z1, z2 := h.alloc(0), h.alloc(0)
	assert.NotZero(t, z1)
	assert.NotEqual(t, z1, z2)
	h.releaseAll()
	assert.Equal(t, 0, h.size())
}

// Storage offered for a result is used by the next allocation that fits,
// once; a result that does not fit gets a fresh buffer.
func TestHostBuffersOffered(t *testing.T) {
	h := newHostBuffers()
	own := make([]byte, 0, 16)
	h.offer(own)
	p := h.alloc(5)
	assert.Equal(t, uintptr(unsafe.Pointer(unsafe.SliceData(own))), p)
	copy(h.buffer(p), "hello")
	b, err := h.take(p, 5)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b))
	assert.Equal(t, unsafe.SliceData(own), unsafe.SliceData(b))

	// Used once: the next allocation is fresh.
	q := h.alloc(5)
	assert.NotEqual(t, p, q)

	// Too small, or a zero-size allocation: fresh buffers, offer kept.
	h.offer(own[:0:4])
	r := h.alloc(5)
	assert.NotEqual(t, uintptr(unsafe.Pointer(unsafe.SliceData(own))), r)
	z := h.alloc(0)
	assert.NotEqual(t, uintptr(unsafe.Pointer(unsafe.SliceData(own))), z)
	assert.Equal(t, 4, cap(h.offered))
	assert.Equal(t, 3, h.size())

	h.releaseAll()
	assert.Equal(t, 0, h.size())
	assert.Nil(t, h.offered)
}

func TestClampSize(t *testing.T) {
	for _, tc := range []struct {
		in   int
		want uint32
		ok   bool
	}{{0, 0, true}, {5, 5, true}, {-1, 0, false}, {wholeBuffer, wholeBuffer, true}, {wholeBuffer + 1, wholeBuffer, true}} {
		got, ok := clampSize(tc.in)
		assert.Equal(t, tc.want, got, tc.in)
		assert.Equal(t, tc.ok, ok, tc.in)
	}
}

func TestLogLevelString(t *testing.T) {
	assert.Equal(t, "trace", LogLevelTrace.String())
	assert.Equal(t, "critical", LogLevelCritical.String())
	assert.Equal(t, "level(9)", LogLevel(9).String())
}
