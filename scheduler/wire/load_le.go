//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package wire

import "unsafe"

// Field loads for the hot loops over records (reading a block's values,
// checking a pushed block). The caller has checked that off+size is within
// the bytes p points into. In the Wasm guest, a bounds-checked
// binary.LittleEndian read costs about 2.5 times an unaligned load
// (BENCHMARKS.md, "Inside the guest"); on little-endian hosts both mean
// the same bytes.

func ld16(p unsafe.Pointer, off int) uint16 { return *(*uint16)(unsafe.Add(p, off)) }
func ld32(p unsafe.Pointer, off int) uint32 { return *(*uint32)(unsafe.Add(p, off)) }
func ld64(p unsafe.Pointer, off int) uint64 { return *(*uint64)(unsafe.Add(p, off)) }

// Stores for stamping a stored block's header, under the same rule.
func st32(p unsafe.Pointer, off int, v uint32) { *(*uint32)(unsafe.Add(p, off)) = v }
func st64(p unsafe.Pointer, off int, v uint64) { *(*uint64)(unsafe.Add(p, off)) = v }
