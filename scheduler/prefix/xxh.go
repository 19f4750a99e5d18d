package prefix

import (
	"encoding/binary"
	"math/bits"
)

// This file is the 64-bit hash of blocks. A 64-byte block (the default)
// is folded into the previous block's hash by mixBlock64. Other sizes get
// XXH64 (Yann Collet's public algorithm, written here from its
// specification) of their content, chained to the previous hash by a
// two-multiply step; XXH64 also hashes seeds and endpoint identities.

const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

func xxRound(acc, in uint64) uint64 {
	acc += in * prime2
	return bits.RotateLeft64(acc, 31) * prime1
}

func xxMerge(acc, v uint64) uint64 {
	acc ^= xxRound(0, v)
	return acc*prime1 + prime4
}

// hashBytes is XXH64 of b with a seed.
func hashBytes(seed uint64, b []byte) uint64 {
	n := len(b)
	var h uint64
	if n >= 32 {
		v1, v2, v3, v4 := seed+prime1+prime2, seed+prime2, seed, seed-prime1
		for len(b) >= 32 {
			v1 = xxRound(v1, binary.LittleEndian.Uint64(b[0:8]))
			v2 = xxRound(v2, binary.LittleEndian.Uint64(b[8:16]))
			v3 = xxRound(v3, binary.LittleEndian.Uint64(b[16:24]))
			v4 = xxRound(v4, binary.LittleEndian.Uint64(b[24:32]))
			b = b[32:]
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(h, v1)
		h = xxMerge(h, v2)
		h = xxMerge(h, v3)
		h = xxMerge(h, v4)
	} else {
		h = seed + prime5
	}
	h += uint64(n)
	for ; len(b) >= 8; b = b[8:] {
		h ^= xxRound(0, binary.LittleEndian.Uint64(b[:8]))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b[:4])) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
		b = b[4:]
	}
	for _, c := range b {
		h ^= uint64(c) * prime5
		h = bits.RotateLeft64(h, 11) * prime1
	}
	return avalanche(h)
}

// avalanche is XXH64's final mix.
func avalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// chain combines the previous block's hash with a block's content hash.
// For a fixed content hash it is a bijection of the previous hash (odd
// multiply, xor, xorshift-multiply), so two different histories followed
// by the same block never meet.
func chain(prev, content uint64) uint64 {
	h := bits.RotateLeft64(prev, 29)*prime1 ^ content
	h ^= h >> 32
	h *= prime3
	h ^= h >> 29
	return h
}

// mixBlock64 is the chained hash of one 64-byte block: the previous
// block's hash folded with the block's eight words by one multiply-rotate
// step each, then XXH64's final avalanche. It is about a third of XXH64's
// multiplies, with no loop: in a Wasm guest, where hashing a long prompt
// is the plugin's largest cost, that cut the hashing time by about half
// (BENCHMARKS.md). Blocks of other sizes use hashBytes and chain.
func mixBlock64(prev uint64, b *[64]byte) uint64 {
	return mixWords64(prev, binary.LittleEndian.Uint64(b[0:8]), binary.LittleEndian.Uint64(b[8:16]),
		binary.LittleEndian.Uint64(b[16:24]), binary.LittleEndian.Uint64(b[24:32]), binary.LittleEndian.Uint64(b[32:40]),
		binary.LittleEndian.Uint64(b[40:48]), binary.LittleEndian.Uint64(b[48:56]), binary.LittleEndian.Uint64(b[56:64]))
}

// mixWords64 is mixBlock64 of a block already loaded as its eight
// little-endian words (the string scanner loads them to look for quotes).
func mixWords64(prev, w0, w1, w2, w3, w4, w5, w6, w7 uint64) uint64 {
	h := prev ^ prime5
	h = bits.RotateLeft64(h^w0, 31) * prime1
	h = bits.RotateLeft64(h^w1, 31) * prime1
	h = bits.RotateLeft64(h^w2, 31) * prime1
	h = bits.RotateLeft64(h^w3, 31) * prime1
	h = bits.RotateLeft64(h^w4, 31) * prime1
	h = bits.RotateLeft64(h^w5, 31) * prime1
	h = bits.RotateLeft64(h^w6, 31) * prime1
	h = bits.RotateLeft64(h^w7, 31) * prime1
	return avalanche(h)
}
