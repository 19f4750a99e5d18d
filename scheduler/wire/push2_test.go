package wire

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// v2Push is a valid agent push of node-a's 3 endpoints and the offset of
// its block.
func v2Push(t *testing.T) ([]byte, int) {
	t.Helper()
	b := agentPush(t, "node-a", 7, at(0), agentState("node-a", 3, 1, at(-time.Millisecond)))
	return b, 5 + len("node-a") + pushV2Fixed
}

func TestPushV2RoundTrip(t *testing.T) {
	eps := agentState("node-a", 3, 1, at(-20*time.Millisecond))
	b := agentPush(t, "node-a", 7, at(0), eps)
	var d PushDecoder
	v, err := d.Decode(b, Limits{})
	require.NoError(t, err)
	assert.Equal(t, KindAgent, v.Kind)
	assert.Equal(t, "node-a", string(v.Sender))
	assert.Equal(t, at(0).UnixNano(), v.SendTime)
	require.Len(t, v.Blocks, 1)
	blk := v.Blocks[0]
	assert.Equal(t, uint64(7), blk.Seq())
	assert.Equal(t, 3, blk.Len())
	strs := blk.Strings(nil)
	for i, e := range eps {
		r := blk.Record(i)
		assert.Equal(t, e.Name, strs[r.Name()])
		assert.Equal(t, e.Address.String(), strs[r.Address()])
		assert.Equal(t, e.Waiting, r.Waiting())
		assert.Equal(t, int64(20*time.Millisecond), r.Age())
	}
}

func TestDecodePushV2Rejects(t *testing.T) {
	valid, blk := v2Push(t)
	rec := blk + blockHeaderBytes // first record
	mut := func(f func(b []byte)) []byte {
		b := append([]byte(nil), valid...)
		f(b)
		return b
	}
	put16 := func(off int, v uint16) []byte {
		return mut(func(b []byte) { binary.LittleEndian.PutUint16(b[off:], v) })
	}
	put32 := func(off int, v uint32) []byte {
		return mut(func(b []byte) { binary.LittleEndian.PutUint32(b[off:], v) })
	}
	put64 := func(off int, v uint64) []byte {
		return mut(func(b []byte) { binary.LittleEndian.PutUint64(b[off:], v) })
	}
	// The block's string table: string lengths, then bytes.
	var d PushDecoder
	v, err := d.Decode(valid, Limits{})
	require.NoError(t, err)
	lens := blk + v.Blocks[0].lensAt()
	strs := blk + v.Blocks[0].stringsAt()
	relay := append(AppendPushV2Header(nil, KindRelay, "agg", at(0), 2), valid[blk:]...)
	relay = append(relay, valid[blk:]...) // the same agent twice

	tests := []struct {
		name  string
		in    []byte
		lim   Limits
		kind  error
		where string
	}{
		{"version 3", mut(func(b []byte) { b[2] = 3 }), Limits{}, ErrVersion, "reads versions 1 and 2"},
		{"unknown kind", mut(func(b []byte) { b[3] = 9 }), Limits{}, ErrInvalidField, "push.kind"},
		{"empty sender", append([]byte("WP\x02\x01\x00"), valid[5+len("node-a"):]...), Limits{}, ErrInvalidField, "push.sender"},
		{"send time 0", put64(5+len("node-a"), 0), Limits{}, ErrInvalidField, "push.send_time"},
		{"agent push with two blocks", put16(5+len("node-a")+8, 2), Limits{}, ErrLimit, "n_blocks"},
		{"agent push of another agent", mut(func(b []byte) { b[5] = 'N' }), Limits{}, ErrInvalidField, "carries agent"},
		{"relay with an agent twice", relay, Limits{}, ErrInvalidField, "agents not sorted and unique"},
		{"relay with no block", AppendPushV2Header(nil, KindRelay, "agg", at(0), 0), Limits{}, ErrInvalidField, "at least one agent block"},
		{"trailing byte", append(append([]byte(nil), valid...), 0), Limits{}, ErrTrailing, "1 bytes after"},
		{"truncated block", valid[:len(valid)-1], Limits{}, ErrTruncated, "block_len"},
		{"over the size limit", valid, Limits{MaxPushBytes: 64}, ErrLimit, "limit 64"},
		{"flags", put16(blk+bhFlags, 1), Limits{}, ErrInvalidField, "flags"},
		{"reserved bytes", put32(blk+bhZero, 1), Limits{}, ErrInvalidField, "reserved"},
		{"seq 0", put64(blk+bhSeq, 0), Limits{}, ErrInvalidField, "sequence number 0"},
		{"held negative", put64(blk+bhHeld, math.MaxUint64), Limits{}, ErrInvalidField, "held"},
		{"received set in a push", put64(blk+bhReceived, 1), Limits{}, ErrInvalidField, "must be 0 in a push"},
		{"identity set in a push", put32(blk+bhIdentity, 1), Limits{}, ErrInvalidField, "must be 0 in a push"},
		{"too many endpoints", valid, Limits{MaxEndpoints: 2}, ErrLimit, "3 endpoints, limit 2"},
		{"parts do not add up", put32(blk+bhStrBytes, 1), Limits{}, ErrInvalidField, "parts add up"},
		{"string lengths do not add up", mut(func(b []byte) { b[lens+1]++; b[lens+2]-- }), Limits{}, ErrInvalidField, ""},
		{"no strings", put16(blk+bhStrs, 0), Limits{}, ErrInvalidField, ""},
		{"namespace index out of range", put16(rec+erNamespace, 999), Limits{}, ErrInvalidField, "string index"},
		{"port 0", put16(rec+erPort, 0), Limits{}, ErrInvalidField, "port 0"},
		{"waiting over the limit", put32(rec+erWaiting, 101), Limits{MaxCount: 100}, ErrLimit, "waiting 101"},
		{"kv NaN", put64(rec+erKV, math.Float64bits(math.NaN())), Limits{}, ErrInvalidField, "kv_cache_usage: NaN"},
		{"kv above 1", put64(rec+erKV, math.Float64bits(1.5)), Limits{}, ErrInvalidField, "1.5 outside 0..1"},
		{"kv negative zero", put64(rec+erKV, math.Float64bits(math.Copysign(0, -1))), Limits{}, ErrInvalidField, "kv_cache_usage"},
		{"adapters past the refs", put16(rec+erRefsFirst, 999), Limits{}, ErrInvalidField, "refs_first"},
		{"too many adapters", mut(func(b []byte) { b[rec+erNActive] = 65 }), Limits{}, ErrLimit, "adapters in one list"},
		{"negative age", put64(rec+erAge, math.MaxUint64), Limits{}, ErrInvalidField, "scrape age"},
		{"unknown scrape status", mut(func(b []byte) { b[rec+erLastError] = 200 }), Limits{}, ErrInvalidField, "unknown scrape status 200"},
		{"padding", mut(func(b []byte) { b[rec+recordBytes-1] = 1 }), Limits{}, ErrInvalidField, "padding"},
		{"control character in a name", mut(func(b []byte) { b[strs+1] = '\n' }), Limits{}, ErrInvalidField, "control character"},
		{"invalid UTF-8", mut(func(b []byte) { b[strs+1] = 0xff }), Limits{}, ErrInvalidField, "invalid UTF-8"},
		{"name too long", valid, Limits{MaxNameLen: 5}, ErrLimit, "over the limit 5"},
		{"endpoints not sorted", mut(func(b []byte) {
			r1, r2 := rec, rec+recordBytes
			var tmp [recordBytes]byte
			copy(tmp[:], b[r1:r1+recordBytes])
			copy(b[r1:r1+recordBytes], b[r2:r2+recordBytes])
			copy(b[r2:r2+recordBytes], tmp[:])
		}), Limits{}, ErrInvalidField, "not sorted and unique"},
		{"address not canonical", mut(func(b []byte) {
			// the address of the first endpoint names the agent id instead
			binary.LittleEndian.PutUint16(b[rec+erAddress:], 0)
		}), Limits{}, ErrInvalidField, "not an IP address"},
		{"adapters not sorted", mut(func(b []byte) {
			r := v.Blocks[0].refsAt() + blk
			b[r], b[r+1], b[r+2], b[r+3] = b[r+2], b[r+3], b[r], b[r+1]
		}), Limits{}, ErrInvalidField, "adapters not sorted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d PushDecoder
			_, err := d.Decode(tc.in, tc.lim)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.kind)
			assert.Contains(t, err.Error(), tc.where)
			requireKnownKind(t, err)
			// The receiver writes nothing for it either.
			st := &MemStore{}
			w := NewWriter(testKeys, tc.lim, time.Hour)
			require.NoError(t, w.Init(st))
			keys, size := st.Keys()
			_, err = w.Apply(st, tc.in, at(0))
			require.Error(t, err)
			k, s := st.Keys()
			assert.Equal(t, [2]int{keys, size}, [2]int{k, s}, "nothing written")
		})
	}
}

// A block whose identity the receiver stored already is not checked deeply
// again, but its adapter lists are, and a change of identity is.
func TestWriterChecksWhatChanged(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	valid, blk := v2Push(t)
	_, err := w.Apply(st, valid, at(0))
	require.NoError(t, err)
	var d PushDecoder
	v, err := d.Decode(valid, Limits{})
	require.NoError(t, err)

	next := append([]byte(nil), valid...)
	binary.LittleEndian.PutUint64(next[blk+bhSeq:], 8)
	r := v.Blocks[0].refsAt() + blk
	next[r], next[r+1], next[r+2], next[r+3] = next[r+2], next[r+3], next[r], next[r+1] // adapters out of order
	_, err = w.Apply(st, next, at(0))
	require.ErrorIs(t, err, ErrInvalidField)
	assert.Contains(t, err.Error(), "adapters not sorted")

	next = append([]byte(nil), valid...)
	binary.LittleEndian.PutUint64(next[blk+bhSeq:], 8)
	next[len(next)-1] = 0x01 // the last string now holds a control character
	_, err = w.Apply(st, next, at(0))
	require.ErrorIs(t, err, ErrInvalidField)
	assert.True(t, strings.Contains(err.Error(), "control character"), err.Error())
}

func TestDecodeAgentPushGivesBackTheState(t *testing.T) {
	eps := agentState("node-a", 3, 1, at(-20*time.Millisecond))
	for _, v := range []int{1, 2} {
		var b []byte
		var err error
		p := &Push{AgentID: "node-a", Seq: 7, SendTime: at(0), Endpoints: eps}
		if v == 1 {
			b, err = EncodePush(p, Limits{})
		} else {
			var enc BlockEncoder
			b, err = enc.AppendAgentPush(nil, p, Limits{})
		}
		require.NoError(t, err)
		got, err := DecodeAgentPush(b, Limits{})
		require.NoError(t, err)
		require.Len(t, got.Endpoints, 3, "version %d", v)
		for i := range eps {
			assert.True(t, eps[i].ScrapeTime.Equal(got.Endpoints[i].ScrapeTime), "version %d", v)
			got.Endpoints[i].ScrapeTime = eps[i].ScrapeTime
		}
		assert.Equal(t, eps, got.Endpoints, "version %d", v)
	}
}

// knownRelay is a store holding a relay of node-a and node-b, and the next
// relay of both (new sequence numbers and values, the same identities),
// with the offsets of its two blocks: the receiver checks such blocks by
// comparison with the stored ones (take.go).
func knownRelay(t testing.TB) (*MemStore, *Writer, []byte, [2]int) {
	t.Helper()
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	require.NoError(t, w.Init(st))
	first := relay(t, "agg-0", at(0),
		agentPush(t, "node-a", 1, at(0), agentState("node-a", 3, 1, at(0))),
		agentPush(t, "node-b", 1, at(0), agentState("node-b", 2, 1, at(0))))
	_, err := w.Apply(st, first, at(0))
	require.NoError(t, err)
	next := relay(t, "agg-0", at(time.Second),
		agentPush(t, "node-a", 2, at(time.Second), agentState("node-a", 3, 4, at(time.Second))),
		agentPush(t, "node-b", 2, at(time.Second), agentState("node-b", 2, 4, at(time.Second))))
	a := 5 + len("agg-0") + pushV2Fixed
	return st, w, next, [2]int{a, a + int(le32(next, a+bhLen))}
}

// storeContents is every key and value of st.
func storeContents(st *MemStore) map[string]string {
	m := map[string]string{}
	st.Each(func(k string, v []byte) { m[k] = string(v) })
	return m
}

// A block whose identity is stored is checked by comparison, and still
// every value of it is checked; one that only looks like it (a name, a
// string length, an adapter changed) gets every check.
func TestWriterChecksValuesOfKnownBlocks(t *testing.T) {
	st, w, next, blk := knownRelay(t)
	var d PushDecoder
	v, err := d.Decode(next, Limits{})
	require.NoError(t, err)
	b0 := v.Blocks[0]
	rec := blk[0] + blockHeaderBytes + recordBytes // node-a's second endpoint
	lens := blk[0] + b0.lensAt()
	cases := []struct {
		name string
		edit func(b []byte)
		want error
		msg  string
	}{
		{"kv above 1", func(b []byte) { binary.LittleEndian.PutUint64(b[rec+erKV:], math.Float64bits(1.5)) }, ErrInvalidField, "outside 0..1"},
		{"kv NaN", func(b []byte) { binary.LittleEndian.PutUint64(b[rec+erKV:], math.Float64bits(math.NaN())) }, ErrInvalidField, "outside 0..1"},
		{"waiting over the limit", func(b []byte) { binary.LittleEndian.PutUint32(b[rec+erWaiting:], 1<<31) }, ErrLimit, "waiting"},
		{"running over the limit", func(b []byte) { binary.LittleEndian.PutUint32(b[rec+erRunning:], 1<<31) }, ErrLimit, "running"},
		{"max adapters over the limit", func(b []byte) { binary.LittleEndian.PutUint32(b[rec+erMaxAdapters:], 1<<31) }, ErrLimit, "max_adapters"},
		{"negative age", func(b []byte) { binary.LittleEndian.PutUint64(b[rec+erAge:], 1<<63) }, ErrInvalidField, "negative"},
		{"unknown scrape status", func(b []byte) { b[rec+erLastError] = 200 }, ErrInvalidField, "unknown scrape status"},
		{"padding", func(b []byte) { b[rec+erZero+3] = 1 }, ErrInvalidField, "padding"},
		{"string lengths off", func(b []byte) { b[lens+1]++; b[lens+2]-- }, ErrInvalidField, "endpoints not sorted and unique"},
		{"string lengths sum", func(b []byte) { b[lens+1]++ }, ErrInvalidField, "add up"},
		{"name index past the table", func(b []byte) { binary.LittleEndian.PutUint16(b[rec+erName:], 999) }, ErrInvalidField, "string index"},
		{"port 0", func(b []byte) { binary.LittleEndian.PutUint16(b[rec+erPort:], 0) }, ErrInvalidField, "port 0"},
		{"adapters out of order", func(b []byte) {
			r := blk[0] + b0.refsAt()
			b[r], b[r+1], b[r+2], b[r+3] = b[r+2], b[r+3], b[r], b[r+1]
		}, ErrInvalidField, "adapters not sorted"},
		{"endpoints out of order", func(b []byte) {
			n0, n1 := blk[0]+blockHeaderBytes+erName, rec+erName
			b[n0], b[n0+1], b[n1], b[n1+1] = b[n1], b[n1+1], b[n0], b[n0+1]
		}, ErrInvalidField, "not sorted"},
		{"second block's kv", func(b []byte) { binary.LittleEndian.PutUint64(b[blk[1]+blockHeaderBytes+erKV:], math.Float64bits(2)) }, ErrInvalidField, "outside 0..1"},
	}
	before := storeContents(st)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := append([]byte(nil), next...)
			tc.edit(bad)
			_, derr := d.Decode(bad, Limits{})
			require.ErrorIs(t, derr, tc.want, "the full decode refuses it too")
			_, err := w.Apply(st, bad, at(time.Second))
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Equal(t, before, storeContents(st), "nothing written")
		})
	}
	// The unchanged relay is taken, and a renamed endpoint (another string
	// of the same table) is a new identity that routers see.
	s, err := w.Apply(st, next, at(time.Second))
	require.NoError(t, err)
	assert.Equal(t, 2, s.Accepted)
	assert.Equal(t, 2, s.Compared, "both blocks checked by comparison")
	renamed := relay(t, "agg-0", at(2*time.Second),
		agentPush(t, "node-a", 3, at(2*time.Second), agentState("node-a", 3, 5, at(2*time.Second))),
		agentPush(t, "node-b", 3, at(2*time.Second), agentState("node-b", 2, 5, at(2*time.Second))))
	name := blk[0] + blockHeaderBytes + erName
	nsIdx := binary.LittleEndian.Uint16(renamed[blk[0]+blockHeaderBytes+erNamespace:])
	binary.LittleEndian.PutUint16(renamed[name:], nsIdx) // endpoint 0 is now named "llm"
	_, err = w.Apply(st, renamed, at(2*time.Second))
	require.NoError(t, err)
	names := byName(snapshotOf(t, st))
	assert.Contains(t, names, "llm")
	assert.NotContains(t, names, "node-a-pod-0")
	assert.Contains(t, names, "node-b-pod-1")
}

// A push refused before anything is stored writes nothing, not even the
// key that creates segments (the segment keys are absent: no Init).
func TestRefusedPushCreatesNoKey(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	bad := relay(t, "agg-0", at(0), agentPush(t, "node-a", 1, at(0), agentState("node-a", 2, 1, at(0))))
	binary.LittleEndian.PutUint64(bad[5+len("agg-0")+pushV2Fixed+blockHeaderBytes+erKV:], math.Float64bits(3))
	_, err := w.Apply(st, bad, at(0))
	require.ErrorIs(t, err, ErrInvalidField)
	assert.Empty(t, storeContents(st))
}
