package proxywasm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Limits the host applies when it parses pairs from the guest; beyond them it
// silently uses an empty map (proxy-wasm-cpp-host's pair limits).
const (
	MaxPairsCount = 1024
	MaxPairsBytes = 1 << 20
)

var (
	// ErrTooManyPairs is returned instead of sending more than MaxPairsCount
	// header pairs, which the host would replace by an empty map.
	ErrTooManyPairs = errors.New("proxywasm: more than 1024 header pairs")
	// ErrPairsTooLarge is returned instead of sending pairs whose encoding
	// exceeds MaxPairsBytes, which the host would replace by an empty map.
	ErrPairsTooLarge = errors.New("proxywasm: header pairs encode to more than 1 MiB")
	// ErrMalformedPairs reports host data that is not a valid pairs encoding.
	ErrMalformedPairs = errors.New("proxywasm: malformed header pairs from host")
	// ErrEmptyPropertyPath is returned for a property path with no segments.
	ErrEmptyPropertyPath = errors.New("proxywasm: property path must not be empty")
	// ErrEmptyPropertyValue is returned by SetProperty for empty data, as the
	// SDK does.
	ErrEmptyPropertyValue = errors.New("proxywasm: property value must not be empty")
)

// pairsSize is the encoded size of pairs: u32 count, (u32 key len, u32 value
// len) per pair, then every key and value NUL-terminated.
func pairsSize(pairs [][2]string) int {
	size := 4
	for i := range pairs {
		size += 8 + len(pairs[i][0]) + 1 + len(pairs[i][1]) + 1
	}
	return size
}

// checkPairs rejects pairs the host would silently drop.
func checkPairs(pairs [][2]string) error {
	if len(pairs) > MaxPairsCount {
		return ErrTooManyPairs
	}
	if pairsSize(pairs) > MaxPairsBytes {
		return ErrPairsTooLarge
	}
	return nil
}

// appendPairs appends the little-endian pairs encoding of pairs to dst.
func appendPairs(dst []byte, pairs [][2]string) ([]byte, error) {
	if err := checkPairs(pairs); err != nil {
		return dst, err
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs)))
	for i := range pairs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs[i][0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs[i][1])))
	}
	for i := range pairs {
		dst = append(dst, pairs[i][0]...)
		dst = append(dst, 0)
		dst = append(dst, pairs[i][1]...)
		dst = append(dst, 0)
	}
	return dst, nil
}

// decodePairs parses the pairs encoding as strictly as the host does (sizes in
// bounds, NUL terminators, no trailing bytes). Empty input is an empty map: the
// host sends (0, 0) for a map without entries. The returned strings alias b
// without copying, so b must never be modified afterwards.
func decodePairs(b []byte) ([][2]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 4 {
		return nil, malformed("shorter than the count", len(b))
	}
	count := uint64(binary.LittleEndian.Uint32(b))
	sizesEnd := 4 + count*8
	if sizesEnd > uint64(len(b)) {
		return nil, malformed("sizes past the end for count", int(count))
	}
	out := make([][2]string, count)
	data := int(sizesEnd)
	for i := range out {
		keyLen := uint64(binary.LittleEndian.Uint32(b[4+i*8:]))
		valueLen := uint64(binary.LittleEndian.Uint32(b[8+i*8:]))
		var err error
		if out[i][0], data, err = nulTerminated(b, data, keyLen); err != nil {
			return nil, err
		}
		if out[i][1], data, err = nulTerminated(b, data, valueLen); err != nil {
			return nil, err
		}
	}
	if data != len(b) {
		return nil, malformed("trailing bytes", len(b)-data)
	}
	return out, nil
}

// nulTerminated reads n bytes at off followed by a NUL, returning them as a
// string aliasing b and the offset after the NUL.
func nulTerminated(b []byte, off int, n uint64) (string, int, error) {
	if uint64(off)+n+1 > uint64(len(b)) {
		return "", 0, malformed("string past the end at offset", off)
	}
	end := off + int(n)
	if b[end] != 0 {
		return "", 0, malformed("missing NUL at offset", end)
	}
	return bytesToString(b[off:end]), end + 1, nil
}

func malformed(what string, n int) error {
	return fmt.Errorf("%w: %s %d", ErrMalformedPairs, what, n)
}

// appendPropertyPath appends the property path encoding: segments joined by
// NUL, as the proxy-wasm ABI defines for proxy_get_property.
func appendPropertyPath(dst []byte, path []string) ([]byte, error) {
	if len(path) == 0 {
		return dst, ErrEmptyPropertyPath
	}
	for i, segment := range path {
		if i > 0 {
			dst = append(dst, 0)
		}
		dst = append(dst, segment...)
	}
	return dst, nil
}

// bytesToString views b as a string without copying; b must never change.
func bytesToString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
