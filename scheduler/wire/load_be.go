//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package wire

import (
	"encoding/binary"
	"unsafe"
)

// Big-endian hosts read fields byte by byte (see load_le.go).

func ld16(p unsafe.Pointer, off int) uint16 {
	return binary.LittleEndian.Uint16(unsafe.Slice((*byte)(unsafe.Add(p, off)), 2))
}
func ld32(p unsafe.Pointer, off int) uint32 {
	return binary.LittleEndian.Uint32(unsafe.Slice((*byte)(unsafe.Add(p, off)), 4))
}
func ld64(p unsafe.Pointer, off int) uint64 {
	return binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(p, off)), 8))
}
func st32(p unsafe.Pointer, off int, v uint32) {
	binary.LittleEndian.PutUint32(unsafe.Slice((*byte)(unsafe.Add(p, off)), 4), v)
}
func st64(p unsafe.Pointer, off int, v uint64) {
	binary.LittleEndian.PutUint64(unsafe.Slice((*byte)(unsafe.Add(p, off)), 8), v)
}
