package proxywasm

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encodeByHand builds the pairs encoding field by field, independently of
// appendPairs: a count, then every key and value size, then every key and
// value, each followed by a NUL.
func encodeByHand(pairs [][2]string) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pairs)))
	for _, p := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(append(b, p[0]...), 0)
		b = append(append(b, p[1]...), 0)
	}
	return b
}

func TestAppendPairs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pairs [][2]string
	}{
		{"none", nil},
		{"one", [][2]string{{":path", "/"}}},
		{"empty key and value", [][2]string{{"", ""}}},
		{"duplicates", [][2]string{{"a", "1"}, {"a", "2"}, {"b", ""}}},
		{"embedded NUL", [][2]string{{"k", "v\x00w"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := appendPairs(nil, tc.pairs)
			require.NoError(t, err)
			assert.Equal(t, encodeByHand(tc.pairs), got)
			assert.Len(t, got, pairsSize(tc.pairs))
			back, err := decodePairs(got)
			require.NoError(t, err)
			if len(tc.pairs) == 0 {
				assert.Empty(t, back)
			} else {
				assert.Equal(t, tc.pairs, back)
			}
		})
	}
}

func TestAppendPairsKeepsPrefix(t *testing.T) {
	got, err := appendPairs([]byte("xy"), [][2]string{{"a", "b"}})
	require.NoError(t, err)
	assert.Equal(t, append([]byte("xy"), encodeByHand([][2]string{{"a", "b"}})...), got)
}

func TestAppendPairsLimits(t *testing.T) {
	many := make([][2]string, MaxPairsCount+1)
	_, err := appendPairs(nil, many)
	assert.ErrorIs(t, err, ErrTooManyPairs)
	_, err = appendPairs(nil, many[:MaxPairsCount])
	assert.NoError(t, err)

	// 4 + 8 + len(k)+1 + len(v)+1 bytes: exactly at and one past 1 MiB.
	atLimit := [][2]string{{"k", strings.Repeat("v", MaxPairsBytes-4-8-2-1)}}
	assert.Equal(t, MaxPairsBytes, pairsSize(atLimit))
	_, err = appendPairs(nil, atLimit)
	assert.NoError(t, err)
	atLimit[0][1] += "v"
	_, err = appendPairs(nil, atLimit)
	assert.ErrorIs(t, err, ErrPairsTooLarge)
	assert.ErrorIs(t, checkPairs(atLimit), ErrPairsTooLarge)
}

func TestDecodePairsRejects(t *testing.T) {
	valid := encodeByHand([][2]string{{"ab", "c"}, {"d", ""}})
	mutate := func(f func(b []byte) []byte) []byte {
		return f(append([]byte(nil), valid...))
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"short count", []byte{1, 0}},
		{"count past end", binary.LittleEndian.AppendUint32(nil, 5)},
		{"huge count", binary.LittleEndian.AppendUint32(nil, 0xffffffff)},
		{"trailing byte", append(append([]byte(nil), valid...), 0)},
		{"truncated", valid[:len(valid)-1]},
		{"missing key NUL", mutate(func(b []byte) []byte { b[4+2*8+2] = 'x'; return b })},
		{"key length past end", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[4:], 0xfffffff0)
			return b
		})},
		{"value length overflow", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], 0xffffffff)
			return b
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodePairs(tc.in)
			assert.ErrorIs(t, err, ErrMalformedPairs)
		})
	}
}

func TestDecodePairsEmpty(t *testing.T) {
	got, err := decodePairs(nil)
	require.NoError(t, err)
	assert.Nil(t, got)
	got, err = decodePairs(encodeByHand(nil))
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestDecodePairsAliasesInput(t *testing.T) {
	b := encodeByHand([][2]string{{"key", "value"}})
	got, err := decodePairs(b)
	require.NoError(t, err)
	// Zero-copy: the strings point into b (the host buffer is never reused).
	assert.Equal(t, &b[4+8], unsafeStringData(got[0][0]))
}

func TestAppendPropertyPath(t *testing.T) {
	got, err := appendPropertyPath(nil, []string{"source", "address"})
	require.NoError(t, err)
	assert.Equal(t, []byte("source\x00address"), got)
	got, err = appendPropertyPath(nil, []string{"x"})
	require.NoError(t, err)
	assert.Equal(t, []byte("x"), got)
	_, err = appendPropertyPath(nil, nil)
	assert.ErrorIs(t, err, ErrEmptyPropertyPath)
}

// FuzzDecodePairs checks decodePairs never panics, accepts only what the host
// would produce, and that what it accepts re-encodes to the same bytes.
func FuzzDecodePairs(f *testing.F) {
	f.Add([]byte{})
	f.Add(encodeByHand(nil))
	f.Add(encodeByHand([][2]string{{":path", "/"}, {"x", ""}}))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs, err := decodePairs(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedPairs) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		if len(b) == 0 {
			return
		}
		if len(pairs) > MaxPairsCount || len(b) > MaxPairsBytes {
			return // valid encoding, just more than the guest may send
		}
		again, err := appendPairs(nil, pairs)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if string(again) != string(b) {
			t.Fatalf("round trip differs: %x vs %x", again, b)
		}
	})
}

func BenchmarkAppendPairs(b *testing.B) {
	pairs := benchPairs()
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = appendPairs(buf[:0], pairs); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodePairs(b *testing.B) {
	enc := encodeByHand(benchPairs())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodePairs(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPairs is a typical request header map (12 headers).
func benchPairs() [][2]string {
	return [][2]string{
		{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "gateway.example"},
		{":scheme", "http"}, {"content-type", "application/json"}, {"content-length", "4096"},
		{"user-agent", "bench/1.0"}, {"accept", "*/*"}, {"x-request-id", "8d3e2a1c-9f7b-4c61-a0e5-2b7d4c9e1f30"},
		{"authorization", "Bearer abcdefghijklmnopqrstuvwxyz"}, {"x-forwarded-for", "10.0.0.1"},
		{"x-gateway-model-name", "llama-3-8b"},
	}
}
