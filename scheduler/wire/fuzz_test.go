package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// kinds lists every error kind a decode may return.
var kinds = []error{ErrFormat, ErrVersion, ErrTruncated, ErrTrailing, ErrLimit, ErrInvalidField}

func requireKnownKind(t *testing.T, err error) {
	t.Helper()
	var we *Error
	require.True(t, errors.As(err, &we), "error is a *wire.Error: %v", err)
	for _, k := range kinds {
		if errors.Is(err, k) {
			return
		}
	}
	t.Fatalf("error of unknown kind: %v", err)
}

func seedPushes(f *testing.F) {
	for _, p := range []*Push{push("node-a", 1, 0), push("node-a", 2, 1), push("node-b", 3, 5)} {
		b, err := EncodePush(p, Limits{})
		require.NoError(f, err)
		f.Add(b)
	}
}

// FuzzDecodePush: never panics; an accepted payload re-encodes to the
// same bytes (one encoding per message); a rejected one says why.
func FuzzDecodePush(f *testing.F) {
	seedPushes(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePush(b, Limits{})
		if err != nil {
			requireKnownKind(t, err)
			return
		}
		again, err := EncodePush(p, Limits{})
		require.NoError(t, err)
		require.True(t, bytes.Equal(b, again), "re-encoding differs")
	})
}

// seedPushesV2 are valid version 2 pushes: an agent's, a relay's.
func seedPushesV2(f *testing.F) [][]byte {
	a := agentPush(f, "node-a", 7, at(0), agentState("node-a", 3, 1, at(-time.Millisecond)))
	b := agentPush(f, "node-b", 9, at(0), agentState("node-b", 2, 2, at(-time.Millisecond)))
	var d PushDecoder
	va, err := d.Decode(a, Limits{})
	require.NoError(f, err)
	relay := AppendPushV2Header(nil, KindRelay, "agg-0", at(0), 2)
	relay = AppendRelayBlock(relay, append(Block(nil), va.Blocks[0]...), 3*time.Millisecond)
	vb, err := d.Decode(b, Limits{})
	require.NoError(f, err)
	relay = AppendRelayBlock(relay, vb.Blocks[0], 0)
	return [][]byte{a, b, relay}
}

// FuzzDecodePushV2: never panics; a rejected payload says why, with a known
// kind; an accepted one is stored by the receiver and read back by a
// router with every endpoint (no limit in the way here).
func FuzzDecodePushV2(f *testing.F) {
	for _, p := range seedPushesV2(f) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d PushDecoder
		v, err := d.Decode(b, Limits{})
		if err != nil {
			requireKnownKind(t, err)
			return
		}
		n := 0
		for _, blk := range v.Blocks {
			n += blk.Len()
		}
		st := &MemStore{}
		w := NewWriter(testKeys, Limits{}, 100*365*24*time.Hour)
		require.NoError(t, w.Init(st))
		now := time.Unix(0, v.SendTime)
		if _, err := w.Apply(st, b, now); err != nil {
			require.True(t, errors.Is(err, ErrLimit) || errors.Is(err, ErrStaleSequence), "apply: %v", err)
			return
		}
		snap, _, err := NewCache(testKeys, Limits{}).Refresh(st)
		require.NoError(t, err)
		require.LessOrEqual(t, len(snap.Endpoints), n) // old news and duplicates may drop some
	})
}

// seedKnownRelays are relays a receiver holding knownRelay's store checks
// by comparison (take.go): the next relay, and that relay with a value, a
// name and a string length changed.
func seedKnownRelays(f testing.TB) [][]byte {
	_, _, next, blk := knownRelay(f)
	rec := blk[0] + blockHeaderBytes
	kv := append([]byte(nil), next...)
	binary.LittleEndian.PutUint64(kv[rec+erKV:], math.Float64bits(1.5))
	name := append([]byte(nil), next...)
	binary.LittleEndian.PutUint16(name[rec+erName:], binary.LittleEndian.Uint16(name[rec+erNamespace:]))
	var d PushDecoder
	v, err := d.Decode(next, Limits{})
	require.NoError(f, err)
	lens := append([]byte(nil), next...)
	lens[blk[0]+v.Blocks[0].lensAt()+1]++
	return [][]byte{next, kv, name, lens}
}

// FuzzApplyOverStored: a receiver that holds blocks of the pushing agents
// (so it checks blocks of the same identity by comparison) refuses exactly
// what the full decode refuses, writing nothing then, and never panics.
func FuzzApplyOverStored(f *testing.F) {
	for _, p := range seedKnownRelays(f) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, w, _, _ := knownRelay(t)
		before := storeContents(st)
		var d PushDecoder
		_, derr := d.Decode(b, Limits{})
		_, err := w.Apply(st, b, at(time.Second))
		switch {
		case derr != nil:
			require.Error(t, err, "the decode refuses it: %v", derr)
			if !errors.Is(err, ErrClockSkew) { // checked first by the receiver
				requireKnownKind(t, err)
			}
			require.Equal(t, before, storeContents(st), "a refused push writes nothing")
		case err != nil:
			require.True(t, errors.Is(err, ErrLimit) || errors.Is(err, ErrStaleSequence) || errors.Is(err, ErrClockSkew), "apply: %v", err)
			require.Equal(t, before, storeContents(st), "a refused push writes nothing")
		}
	})
}

// FuzzStoredValues: whatever bytes sit in a segment or the directory (an
// older build, a bug), a router's refresh never panics, and the receiver
// replaces what it cannot read and leaves shared data readable.
func FuzzStoredValues(f *testing.F) {
	pushes := seedPushesV2(f)
	for _, v := range seedStoredValues(f) {
		f.Add(v.dir, v.value)
	}
	again := agentPush(f, "node-a", 8, at(time.Second), agentState("node-a", 3, 1, at(time.Second)))
	f.Fuzz(func(t *testing.T, dir bool, value []byte) {
		st := &MemStore{}
		w := NewWriter(testKeys, Limits{}, time.Hour)
		require.NoError(t, w.Init(st))
		_, err := w.Apply(st, pushes[0], at(0))
		require.NoError(t, err)
		c := NewCache(testKeys, Limits{})
		_, _, err = c.Refresh(st)
		require.NoError(t, err)
		key := testKeys.Segments[SegmentOf([]byte("node-a"))]
		if dir {
			key = testKeys.Dir
		}
		require.NoError(t, st.Set(key, value, 0))
		// Move the directory so the router looks at the segment again.
		if !dir {
			var d Directory
			b, _, _ := st.Get(testKeys.Dir, nil)
			require.NoError(t, DecodeDirectory(b, &d))
			d.Gen++
			d.Entries[SegmentOf([]byte("node-a"))].Gen++
			require.NoError(t, st.Set(testKeys.Dir, AppendDirectory(nil, &d), 0))
		}
		_, _, _ = c.Refresh(st) // may fail, must not panic
		_, _, _ = NewCache(testKeys, Limits{}).Refresh(st)
		// The agent's next push replaces what cannot be read, and routers
		// see it (blocks that fail their checks are left out, reported).
		_, err = w.Apply(st, again, at(time.Second))
		if errors.Is(err, ErrStaleSequence) {
			// Not broken: a readable segment whose block for the agent
			// claims a later push (an agent's seq survives its restarts).
			var seg Segment
			lim := DefaultLimits().resolved()
			require.Nil(t, walkSegment(value, SegmentOf([]byte("node-a")), &lim, &seg), "refused as stale: %v", err)
			later := false
			for _, blk := range seg.Blocks {
				later = later || string(blk.AgentID()) == "node-a" && blk.Seq() >= 8
			}
			require.True(t, later, "refused as stale without a later stored push: %v", err)
			return
		}
		require.NoError(t, err, "a push over a broken value")
		snap, _, _ := NewCache(testKeys, Limits{}).Refresh(st)
		found := 0
		for _, e := range snap.Endpoints {
			if strings.HasPrefix(e.ID.Name, "node-a-") && e.Metrics.UpdateTime.Equal(at(time.Second)) {
				found++
			}
		}
		require.Equal(t, 3, found, "the agent's new push is what routers see")
	})
}

// FuzzDecodeDirectory: never panics; an accepted directory re-encodes to
// one that decodes the same, and the one-field readers routers and receivers use
// agree with it; a refused one says why, with a known kind.
func FuzzDecodeDirectory(f *testing.F) {
	for _, v := range seedStoredValues(f) {
		if v.dir {
			f.Add(v.value)
		}
	}
	f.Add(AppendDirectory(nil, &Directory{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Directory
		gen, genOK := DirGen(b)
		cgen, cgenOK := DirConfigGen(b)
		if err := DecodeDirectory(b, &d); err != nil {
			requireKnownKind(t, err)
			require.Zero(t, d, "nothing decoded from a refused value")
			return
		}
		require.True(t, genOK && cgenOK)
		require.Equal(t, d.Gen, gen)
		require.Equal(t, d.ConfigGen, cgen)
		again := AppendDirectory(nil, &d)
		require.Len(t, again, DirBytes)
		var d2 Directory
		require.NoError(t, DecodeDirectory(again, &d2))
		require.Equal(t, d, d2)
	})
}

// storedValue is one stored value for the seed corpora.
type storedValue struct {
	dir   bool
	value []byte
}

// seedStoredValues are the directory and the segments a receiver stores
// for the seed pushes.
func seedStoredValues(f *testing.F) []storedValue {
	pushes := seedPushesV2(f)
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	require.NoError(f, w.Init(st))
	_, err := w.Apply(st, pushes[2], at(0))
	require.NoError(f, err)
	var out []storedValue
	st.Each(func(key string, value []byte) {
		if len(value) > segHeaderBytes || key == testKeys.Dir {
			out = append(out, storedValue{key == testKeys.Dir, append([]byte(nil), value...)})
		}
	})
	return out
}

// TestWriteFuzzSeeds regenerates the committed seed corpus under
// testdata/fuzz when WIRE_WRITE_SEEDS=1 (the corpus then runs in go test).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("WIRE_WRITE_SEEDS") != "1" {
		t.Skip("set WIRE_WRITE_SEEDS=1 to rewrite testdata/fuzz seeds")
	}
	write := func(target, name string, b []byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		content := "go test fuzz v1\n[]byte(" + quoteBytes(b) + ")\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	good, _ := EncodePush(push("node-a", 42, 4), Limits{})
	write("FuzzDecodePush", "valid-4-endpoints", good)
	write("FuzzDecodePush", "kv-nan", rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = nan() })))
	write("FuzzDecodePush", "unsorted", rawPush(&Push{AgentID: "a", Seq: 1, SendTime: t0, Endpoints: []EndpointState{endpoint(2), endpoint(1)}}))
	write("FuzzDecodePush", "version-2", append([]byte("WP\x02"), good[3:]...))
	write("FuzzDecodePush", "truncated", good[:len(good)/2])
	write("FuzzDecodePush", "trailing", append(append([]byte{}, good...), 0))
	for i, p := range seedPushesV2(&testing.F{}) {
		write("FuzzDecodePushV2", []string{"agent", "agent-b", "relay"}[i], p)
		write("FuzzDecodePushV2", []string{"agent", "agent-b", "relay"}[i]+"-truncated", p[:len(p)*2/3])
	}
	for i, p := range seedKnownRelays(t) {
		write("FuzzApplyOverStored", []string{"next", "next-kv", "next-renamed", "next-string-length"}[i], p)
	}
	writeStored := func(name string, dir bool, b []byte) {
		d := filepath.Join("testdata", "fuzz", "FuzzStoredValues")
		require.NoError(t, os.MkdirAll(d, 0o755))
		content := "go test fuzz v1\nbool(" + strconv.FormatBool(dir) + ")\n[]byte(" + quoteBytes(b) + ")\n"
		require.NoError(t, os.WriteFile(filepath.Join(d, name), []byte(content), 0o644))
	}
	for _, v := range seedStoredValues(&testing.F{}) {
		if v.dir {
			write("FuzzDecodeDirectory", "dir", v.value)
			write("FuzzDecodeDirectory", "dir-truncated", v.value[:len(v.value)/2])
			writeStored("dir", true, v.value)
			bad := append([]byte(nil), v.value...)
			bad[3] = NumSegments / 2
			writeStored("dir-other-segment-count", true, bad)
			continue
		}
		writeStored("segment", false, v.value)
		writeStored("segment-truncated", false, v.value[:len(v.value)*2/3])
		bad := append([]byte(nil), v.value...)
		bad[len(bad)-1] ^= 0xff // the last string's last byte
		writeStored("segment-bad-string", false, bad)
	}
}

func nan() float64 { var z float64; return z / z }

func quoteBytes(b []byte) string {
	const hex = "0123456789abcdef"
	out := []byte{'"'}
	for _, c := range b {
		out = append(out, '\\', 'x', hex[c>>4], hex[c&15])
	}
	return string(append(out, '"'))
}
