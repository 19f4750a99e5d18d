package wire

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
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

// FuzzDecodeStored: the same for stored snapshots, plus DecodeSnapshot
// agreeing with DecodeStored, and a merge of a fixed push into whatever
// decoded staying decodable.
func FuzzDecodeStored(f *testing.F) {
	for _, s := range []*Stored{
		{},
		{Agents: []AgentState{{AgentID: "a", LastSeq: 1, Received: t0, Endpoints: endpoints(3)}}},
		{Agents: []AgentState{
			{AgentID: "a", LastSeq: 5, Received: t0, Endpoints: endpoints(2)},
			{AgentID: "b", LastSeq: 9, Received: t0, Endpoints: endpoints(1)},
		}},
	} {
		b, err := EncodeStored(s, Limits{})
		require.NoError(f, err)
		f.Add(b)
	}
	pb, err := EncodePush(push("z-agent", 1<<40, 2), Limits{})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeStored(b, Limits{})
		snap, snapErr := DecodeSnapshot(b, Limits{}, SnapshotOptions{})
		if err != nil {
			requireKnownKind(t, err)
			require.Error(t, snapErr)
			require.Nil(t, snap)
			return
		}
		require.NoError(t, snapErr)
		require.Equal(t, s.Snapshot(SnapshotOptions{}), snap)
		again, err := EncodeStored(s, Limits{})
		require.NoError(t, err)
		require.True(t, bytes.Equal(b, again), "re-encoding differs")

		merged, err := MergeBytes(b, pb, t0.Add(time.Second), Limits{})
		if err != nil {
			require.True(t, errors.Is(err, ErrLimit) || errors.Is(err, ErrStaleSequence), "merge: %v", err)
			return
		}
		_, err = DecodeStored(merged, Limits{})
		require.NoError(t, err)
	})
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
	stored, _ := EncodeStored(&Stored{Agents: []AgentState{
		{AgentID: "a", LastSeq: 5, Received: t0, Endpoints: renamed("a", 2)},
		{AgentID: "b", LastSeq: 9, Received: t0, Endpoints: renamed("b", 2)},
	}}, Limits{})
	write("FuzzDecodeStored", "valid-2-agents", stored)
	write("FuzzDecodeStored", "total-mismatch", rawStored(&Stored{Agents: []AgentState{{AgentID: "a", LastSeq: 1, Received: t0, Endpoints: endpoints(1)}}}, 2))
	write("FuzzDecodeStored", "push-as-stored", good)
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
