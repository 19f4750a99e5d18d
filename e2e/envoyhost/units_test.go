package envoyhost

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPairsRoundTrip(t *testing.T) {
	pairs := []Pair{{":path", "/"}, {"k", ""}, {"", "v"}, {"x", "a\x00b"}}
	enc := encodePairs(pairs)
	// count, then sizes, then NUL-terminated strings.
	assert.Equal(t, uint32(4), binary.LittleEndian.Uint32(enc))
	assert.Equal(t, uint32(5), binary.LittleEndian.Uint32(enc[4:]))
	assert.Equal(t, uint32(1), binary.LittleEndian.Uint32(enc[8:]))
	assert.Equal(t, pairs, decodePairs(enc))
	assert.Empty(t, decodePairs(encodePairs(nil)))
}

func TestDecodePairsRejectsMalformed(t *testing.T) {
	good := encodePairs([]Pair{{"a", "b"}})
	cases := map[string][]byte{
		"empty":           nil,
		"short count":     {1, 0},
		"trailing bytes":  append(append([]byte{}, good...), 0),
		"missing nul":     bytes.Replace(good, []byte("a\x00"), []byte("aX"), 1),
		"overread sizes":  {5, 0, 0, 0},
		"too many pairs":  binary.LittleEndian.AppendUint32(nil, pairsMaxCount+1),
		"size past end":   append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 1), 100), 0), 'a', 0, 0),
		"over 1 MiB":      append(good, make([]byte, pairsMaxBytes)...),
		"truncated value": good[:len(good)-1],
	}
	for name, b := range cases {
		assert.Nil(t, decodePairs(b), name)
	}
}

// FuzzDecodePairs: decoding never panics, and whatever decodes re-encodes
// to the same bytes.
func FuzzDecodePairs(f *testing.F) {
	f.Add(encodePairs([]Pair{{"a", "b"}, {":status", "200"}}))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'k', 0, 'v', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs := decodePairs(b)
		if pairs == nil {
			return
		}
		require.Equal(t, b, encodePairs(pairs))
	})
}

func TestHeaderMapSemantics(t *testing.T) {
	m := NewHeaderMap(Pair{"Content-Type", "a"}, Pair{"x-Multi", "1"}, Pair{"X-MULTI", "2"})
	v, ok := m.Get("X-multi")
	assert.True(t, ok)
	assert.Equal(t, "1", v, "get returns the first value")
	assert.Equal(t, []string{"1", "2"}, m.Values("x-multi"))
	assert.Equal(t, len("content-type")+1+2*(len("x-multi")+1), m.ByteSize(), "size counts bytes")
	assert.Equal(t, 3, m.Len())

	m.Set("x-multi", "3")
	assert.Equal(t, []string{"3"}, m.Values("x-multi"), "replace leaves one value")
	m.Add("x-multi", "4")
	assert.Equal(t, []string{"3", "4"}, m.Values("x-multi"), "add appends")
	m.Remove("x-multi")
	m.Remove("absent")
	_, ok = m.Get("x-multi")
	assert.False(t, ok, "remove deletes every value")
	m.SetPairs([]Pair{{"A", "1"}})
	assert.Equal(t, []Pair{{"a", "1"}}, m.Pairs())
}

func TestBufferCopyFrom(t *testing.T) {
	cases := []struct {
		name          string
		start, length int
		data, want    string
		result        WasmResult
	}{
		{"replace all", 0, 100, "new", "new", ResultOK},
		{"prepend", 0, 0, ">", ">hello", ResultOK},
		{"replace prefix", 0, 2, "J", "Jllo", ResultOK},
		{"append", 5, 0, "!", "hello!", ResultOK},
		{"append past end", 99, 0, "!", "hello!", ResultOK},
		{"middle", 2, 1, "x", "hello", ResultBadArgument},
	}
	for _, c := range cases {
		b := []byte("hello")
		buf := bodyBuffer{data: &b, mutable: true}
		assert.Equal(t, c.result, buf.copyFrom(c.start, c.length, []byte(c.data)), c.name)
		assert.Equal(t, c.want, string(b), c.name)
	}
	assert.Equal(t, ResultBadArgument, bodyBuffer{view: []byte("x")}.copyFrom(0, 1, nil), "immutable")
}

func TestSharedDataCAS(t *testing.T) {
	s := newSharedData()
	_, _, r := s.get("vm", "k")
	assert.Equal(t, ResultNotFound, r)
	require.Equal(t, ResultOK, s.set("vm", "k", []byte("a"), 12345), "a new key ignores cas")
	v, cas, r := s.get("vm", "k")
	require.Equal(t, ResultOK, r)
	assert.Equal(t, "a", string(v))
	assert.Equal(t, uint32(1), cas, "the counter starts at 1")
	assert.Equal(t, ResultCasMismatch, s.set("vm", "k", []byte("b"), cas+7))
	assert.Equal(t, ResultOK, s.set("vm", "k", []byte("b"), cas))
	assert.Equal(t, ResultOK, s.set("vm", "k", []byte("c"), 0), "cas 0 always wins")
	_, cas2, _ := s.get("vm", "k")
	assert.Equal(t, uint32(3), cas2)
	// One counter across vm_ids; tables are separate.
	require.Equal(t, ResultOK, s.set("other", "k", []byte("x"), 0))
	_, cas3, _ := s.get("other", "k")
	assert.Equal(t, uint32(4), cas3)
	v, _, _ = s.get("vm", "k")
	assert.Equal(t, "c", string(v))

	s.cas = ^uint32(0)
	require.Equal(t, ResultOK, s.set("vm", "wrap", nil, 0))
	assert.Equal(t, uint32(1), s.cas, "0 is skipped when wrapping")
}

func TestPrometheusFormat(t *testing.T) {
	s := newStatsStore()
	c, ok := s.custom(statCounter, "reqs.total")
	require.True(t, ok)
	s.add(c, 3)
	g, _ := s.custom(statGauge, "inflight")
	s.add(g, 2)
	s.sub(g, 3)
	hist, _ := s.custom(statHistogram, "latency")
	s.record(hist, 7)
	_, ok = s.custom(statGauge, "reqs.total")
	assert.False(t, ok, "one name, one kind")
	_, _ = s.custom(statCounter, "9starts_with_digit")
	inv := s.builtin(statCounter, "cluster.c.original_dst_host_invalid", "envoy_cluster_original_dst_host_invalid",
		[2]string{"envoy_cluster_name", "c"})
	s.add(inv, 1)

	var b strings.Builder
	s.writePrometheus(&b)
	out := b.String()
	assert.Contains(t, out, "# TYPE reqs_total counter\nreqs_total{} 3\n")
	assert.Contains(t, out, "# TYPE inflight gauge\ninflight{} -1\n")
	assert.Contains(t, out, "latency_bucket{le=\"5\"} 0\nlatency_bucket{le=\"10\"} 1\n")
	assert.Contains(t, out, "latency_bucket{le=\"+Inf\"} 1\nlatency_sum{} 7\nlatency_count{} 1\n")
	assert.Contains(t, out, "envoy_cluster_original_dst_host_invalid{envoy_cluster_name=\"c\"} 1\n")
	assert.NotContains(t, out, "starts_with_digit", "invalid Prometheus names are left out")

	b.Reset()
	s.writeText(&b)
	assert.Contains(t, b.String(), "reqs.total: 3\n")
	assert.Contains(t, b.String(), "cluster.c.original_dst_host_invalid: 1\n")
}

func TestParseInternetAddressAndPort(t *testing.T) {
	for in, ok := range map[string]bool{
		"10.0.0.1:8000":   true,
		"[::1]:80":        true,
		"[fe80::1%0]:80":  false,
		"::1:80":          false,
		"10.0.0.1":        false,
		"host:80":         false,
		"10.0.0.1:99999":  false,
		"010.0.0.1:80":    false,
		" 10.0.0.1:80":    false,
		"10.0.0.1:80,x:1": false,
	} {
		_, err := parseInternetAddressAndPort(in)
		assert.Equal(t, ok, err == nil, in)
	}
}

func TestReplaceAllEmptySpace(t *testing.T) {
	assert.Equal(t, "a_b_c", replaceAllEmptySpace("a b\nc"))
}
