package wire

import (
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The golden files pin each message version byte for byte, so a layout
// change fails even when encode and decode still agree with each other.
// They were written by hand from the grammar in doc.go, not by the
// encoder. A change to these bytes is a new wire version, not an edit.

// readHex reads an annotated hex file: hex digits and whitespace, with
// "#" comments to the end of the line.
func readHex(t *testing.T, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	var digits strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		line, _, _ = strings.Cut(line, "#")
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(digits.String())
	require.NoError(t, err, name)
	return b
}

func goldenTime(ns int64) time.Time { return time.Unix(0, ns) }

// goldenEndpoints are the endpoints of testdata/push-v1.hex, in wire order.
func goldenEndpoints() []EndpointState {
	return []EndpointState{
		{Name: "static", Address: netip.MustParseAddr("fd00::2"), Port: 8001,
			ScrapeTime: goldenTime(1_699_999_998_000_000_000), LastError: ScrapeTimeout},
		{Namespace: "llm", Name: "vllm-0", Address: netip.MustParseAddr("10.0.0.1"), Port: 8000,
			Waiting: 3, Running: 200, KVCacheUsage: 0.5, MaxAdapters: 4,
			ActiveAdapters: []string{"sql-lora"}, WaitingAdapters: []string{"tweets"},
			ScrapeTime: goldenTime(1_699_999_999_950_000_000)},
	}
}

func goldenPush() *Push {
	return &Push{AgentID: "node-a", Seq: 7, SendTime: goldenTime(1_700_000_000_000_000_000), Endpoints: goldenEndpoints()}
}

// goldenBytes reads a golden file and requires encoded to equal it.
func goldenBytes(t *testing.T, name string, encoded []byte, err error) []byte {
	t.Helper()
	require.NoError(t, err)
	want := readHex(t, name)
	require.Equal(t, hex.Dump(want), hex.Dump(encoded), "%s: the encoder's bytes", name)
	return want
}

func TestPushGolden(t *testing.T) {
	encoded, err := EncodePush(goldenPush(), DefaultLimits())
	want := goldenBytes(t, "push-v1.hex", encoded, err)
	p, err := DecodePush(want, DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, goldenPush(), p)
}

func TestPushV2Golden(t *testing.T) {
	p := &Push{AgentID: "node-a", Seq: 7, SendTime: goldenTime(1_700_000_000_000_000_000), Endpoints: []EndpointState{
		{Namespace: "llm", Name: "vllm-0", Address: netip.MustParseAddr("10.0.0.1"), Port: 8000,
			Waiting: 3, Running: 200, KVCacheUsage: 0.5, MaxAdapters: 4,
			ActiveAdapters: []string{"sql-lora"}, WaitingAdapters: []string{"tweets"},
			ScrapeTime: goldenTime(1_699_999_999_950_000_000)},
	}}
	var enc BlockEncoder
	encoded, err := enc.AppendAgentPush(nil, p, DefaultLimits())
	want := goldenBytes(t, "push-v2.hex", encoded, err)
	var d PushDecoder
	v, err := d.Decode(want, DefaultLimits())
	require.NoError(t, err)
	require.Len(t, v.Blocks, 1)
	r := v.Blocks[0].Record(0)
	assert.Equal(t, uint32(200), r.Running())
	assert.Equal(t, int64(50*time.Millisecond), r.Age())
}

// TestSegmentV2Golden pins the stored form: the same block as push-v2.hex,
// received 10 ms after it was sent, in segment 19 (node-a's).
func TestSegmentV2Golden(t *testing.T) {
	want := readHex(t, "segment-v2.hex")
	push := readHex(t, "push-v2.hex")
	st := &MemStore{}
	w := NewWriter(NewKeys(DefaultKeyPrefix), DefaultLimits(), time.Hour)
	require.NoError(t, w.Init(st))
	_, err := w.Apply(st, push, goldenTime(1_700_000_000_010_000_000))
	require.NoError(t, err)
	k := SegmentOf([]byte("node-a"))
	require.Equal(t, 19, k)
	got, _, err := st.Get(NewKeys(DefaultKeyPrefix).Segments[k], nil)
	require.NoError(t, err)
	require.Equal(t, hex.Dump(want), hex.Dump(got), "the receiver's bytes")
}
