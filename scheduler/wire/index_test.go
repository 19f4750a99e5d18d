package wire

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/internal/timewords"
)

// The scheduler indexes large snapshots, and the cache rewrites its
// snapshot in place: every decision on the refreshed snapshot must equal
// the decision on a snapshot built afresh from the same shared data, for
// value changes, adapter changes, agents coming and going, and the same
// endpoint reported by two agents.
func TestDecisionAfterInPlaceRefreshEqualsFreshSnapshot(t *testing.T) {
	// values: only values move (the cache reports each rewritten endpoint);
	// mixed: also identities, counts and duplicates (the whole snapshot).
	for _, changes := range []struct {
		name  string
		kinds int
	}{{"values", 6}, {"mixed", 10}} {
		for _, profile := range []string{"decision-tree", "scoring", "least-request"} {
			t.Run(changes.name+"/"+profile, func(t *testing.T) { testInPlaceRefresh(t, profile, changes.kinds) })
		}
	}
}

func testInPlaceRefresh(t *testing.T, profile string, kinds int) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	const agents = 150 // 300 endpoints: indexed
	seq := map[string]uint64{}
	now := at(0)
	push := func(id string, n int, marker uint32) {
		seq[id]++
		eps := agentState(id, n, marker, now)
		_, err := w.Apply(st, agentPush(t, id, seq[id], now, eps), now)
		require.NoError(t, err)
	}
	for i := range agents {
		push(fmt.Sprintf("node-%03d", i), 2, uint32(i))
	}
	clock := func() time.Time { return now }
	cfg, err := scheduler.DecodeConfig([]byte(`{"profile": "` + profile + `"}`))
	require.NoError(t, err)
	newSched := func() *scheduler.Scheduler {
		s, err := scheduler.New(cfg, nil, scheduler.Options{Rand: rand.NewPCG(1, 2), Now: clock})
		require.NoError(t, err)
		return s
	}
	inPlace, fresh := newSched(), newSched()
	cache := NewCache(testKeys, Limits{})
	reqs := []*scheduler.Request{
		{Model: "sql-lora", Criticality: scheduler.Critical},
		{Model: "summary", Criticality: scheduler.Sheddable},
		{Model: "base", Criticality: scheduler.Standard},
		{Model: "tenant-1", Criticality: scheduler.Critical},
	}
	r := rand.New(rand.NewPCG(7, 7))
	for round := range 60 {
		now = now.Add(50 * time.Millisecond)
		switch k := r.IntN(kinds); {
		case k < 6: // a few agents' values move (same strings: same identity)
			for range 1 + r.IntN(5) {
				i := r.IntN(agents)
				push(fmt.Sprintf("node-%03d", i), 2, uint32(i+3*r.IntN(300)))
			}
		case k < 7: // an agent's adapters change
			push(fmt.Sprintf("node-%03d", r.IntN(agents)), 2, uint32(r.IntN(1000)))
		case k < 8: // an agent reports one more endpoint
			push(fmt.Sprintf("node-%03d", r.IntN(agents)), 3, uint32(r.IntN(1000)))
		case k < 9: // a new agent
			push(fmt.Sprintf("extra-%03d", round), 2, uint32(r.IntN(1000)))
		default: // a second agent reports another's endpoints
			id := fmt.Sprintf("node-%03d", r.IntN(agents))
			seq["twin-"+id]++
			eps := agentState(id, 2, uint32(r.IntN(1000)), now)
			_, err := w.Apply(st, agentPush(t, "twin-"+id, seq["twin-"+id], now, eps), now)
			require.NoError(t, err)
		}
		snap, _, err := cache.Refresh(st)
		require.NoError(t, err)
		other := snapshotOf(t, st)
		require.Equal(t, len(other.Endpoints), len(snap.Endpoints))
		for i, req := range reqs {
			for range 3 { // the index is built on the second look
				a, b := inPlace.Schedule(req, snap), fresh.Schedule(req, other)
				require.Equal(t, b.Index, a.Index, "round %d request %d: endpoint", round, i)
				require.Equal(t, b.Path, a.Path, "round %d request %d: path", round, i)
				require.Equal(t, b.Outcome, a.Outcome, "round %d request %d: outcome", round, i)
			}
		}
	}
}

// TestNewStringTableKeepsEndpointIdentities: a block whose string table
// changes (an agent's encoder dropped or added adapter names) while it
// names the same endpoints at the same addresses is, for everything kept
// per endpoint, a change of values: the cache's Identity stays and a
// Scheduler's index is told which endpoints changed, not that the whole
// snapshot did (which made every router VM rebuild its index after
// almost every relay at 1,000 endpoints). A renamed endpoint still moves
// Identity.
func TestNewStringTableKeepsEndpointIdentities(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	require.NoError(t, w.Init(st))
	const agents = 150 // 300 endpoints: indexed
	push := func(id string, seq uint64, eps []EndpointState, d time.Duration) {
		t.Helper()
		_, err := w.Apply(st, agentPush(t, id, seq, at(d), eps), at(d)) // a new encoder each time: a new table
		require.NoError(t, err)
	}
	for i := range agents {
		id := fmt.Sprintf("node-%03d", i)
		push(id, 1, agentState(id, 2, uint32(i), at(0)), 0)
	}
	c := NewCache(testKeys, Limits{})
	snap, _, err := c.Refresh(st)
	require.NoError(t, err)
	cfg, err := scheduler.DecodeConfig([]byte(`{"profile": "decision-tree"}`))
	require.NoError(t, err)
	s, err := scheduler.New(cfg, nil, scheduler.Options{Rand: rand.NewPCG(1, 2)})
	require.NoError(t, err)
	req := &scheduler.Request{Model: "base", Criticality: scheduler.Critical}
	for range 3 { // indexed from the second look
		s.Schedule(req, snap)
	}
	ident := c.Identity()
	rebuilds := s.IndexRebuilds()

	// node-007's adapters change to a name its table never held: a new
	// identity for its block, the same two endpoints.
	eps := agentState("node-007", 2, 7, at(0))
	eps[0].ActiveAdapters = []string{"brand-new-adapter"}
	push("node-007", 2, eps, 50*time.Millisecond)
	snap, changed, err := c.Refresh(st)
	require.NoError(t, err)
	require.True(t, changed)
	assert.Equal(t, ident, c.Identity(), "same endpoints, same addresses: Identity stays")
	assert.Equal(t, []string{"brand-new-adapter"}, byName(snap)[eps[0].Name].Metrics.ActiveModels)
	s.Schedule(req, snap)
	s.Schedule(req, snap) // a rebuild waits for the second look
	assert.Equal(t, rebuilds, s.IndexRebuilds(), "two endpoints changed: applied one by one, no rebuild")
	fresh := snapshotOf(t, st)
	for i := range fresh.Endpoints {
		assert.Equal(t, fresh.Endpoints[i], snap.Endpoints[i], "endpoint %d as a fresh cache reads it", i)
	}

	// The same agent renames a pod: identities moved.
	eps[1].Name = "node-007-renamed"
	Normalize(eps)
	push("node-007", 3, eps, 100*time.Millisecond)
	snap, _, err = c.Refresh(st)
	require.NoError(t, err)
	assert.NotEqual(t, ident, c.Identity(), "an endpoint renamed: Identity moves")
	assert.Contains(t, byName(snap), "node-007-renamed")
	fresh = snapshotOf(t, st)
	for i := range fresh.Endpoints {
		assert.Equal(t, fresh.Endpoints[i].ID, snap.Endpoints[i].ID, "endpoint %d", i)
	}
}

// TestSetTimeKeepsTheInstant: setTime relies on time.Time's layout
// (timewords.Words); whichever store it takes, the result is the instant and
// location stored.
func TestSetTimeKeepsTheInstant(t *testing.T) {
	require.Equal(t, unsafe.Sizeof(timewords.Words{}), unsafe.Sizeof(time.Time{}))
	var dst time.Time
	for _, v := range []time.Time{
		time.Unix(0, 1), time.Unix(1_700_000_000, 123_456_789), time.Unix(0, 5).UTC(),
		time.Date(2026, 12, 1, 0, 0, 0, 7, time.FixedZone("x", 3600)), time.Unix(1_700_000_001, 0), time.Now(), {},
	} {
		setTime(&dst, v)
		require.True(t, dst.Equal(v), "%v != %v", dst, v)
		require.Equal(t, v.Location(), dst.Location())
		require.Equal(t, v, dst) // monotonic reading too
	}
}

// TestSetUnixNanoIsTimeUnix: setUnixNano writes time.Unix's words itself
// once the location is there; the result is time.Unix(0, ns) exactly.
func TestSetUnixNanoIsTimeUnix(t *testing.T) {
	var dst time.Time
	for _, ns := range []int64{1, 999_999_999, 1_000_000_000, 1_700_000_000_123_456_789, 1<<63 - 1, 5, -3} {
		setUnixNano(&dst, ns)
		want := time.Unix(0, ns)
		require.Equal(t, want, dst, "ns %d", ns)
		require.Equal(t, unixLoc, timewords.Of(&dst).Loc)
	}
	dst = time.Unix(0, 5).UTC() // another location: taken whole
	setUnixNano(&dst, 7)
	require.Equal(t, time.Unix(0, 7), dst)
}

// TestRewriteValuesTimesAreTimeUnix: the update times rewriteValues
// derives from the receipt's seconds (no division per endpoint) are
// time.Unix's of the receipt less the age, across second boundaries, for
// ages of a second and more, and for receipts too small for that path.
func TestRewriteValuesTimesAreTimeUnix(t *testing.T) {
	ages := []int64{0, 1, 123_456_788, 123_456_789, 123_456_790, 999_999_999, 1_000_000_000, 2_500_000_001, -1}
	rec := make([]byte, len(ages)*recordBytes)
	for i, a := range ages {
		binary.LittleEndian.PutUint64(rec[i*recordBytes+erAge:], uint64(a))
		binary.LittleEndian.PutUint32(rec[i*recordBytes+erWaiting:], uint32(i))
	}
	for _, recv := range []int64{t0.UnixNano(), 1_750_000_000_000_000_000, 1_750_000_000_999_999_999, 999_999_999, 5} {
		eps := make([]scheduler.Endpoint, len(ages))
		for i := range eps {
			eps[i].Metrics.UpdateTime = time.Unix(0, 1) // a previous read's: the location set
			eps[i].Metrics.RoutedSinceUpdate = 3
		}
		eps[1].Metrics.UpdateTime = time.Time{} // never read: no location yet
		rewriteValues(eps, unsafe.Pointer(&rec[0]), recv)
		for i, a := range ages {
			require.Equal(t, time.Unix(0, clampTime(recv-a)), eps[i].Metrics.UpdateTime, "receipt %d age %d", recv, a)
			require.Equal(t, i, eps[i].Metrics.WaitingQueueSize)
			require.Zero(t, eps[i].Metrics.RoutedSinceUpdate)
		}
	}
}

// TestInPlaceRefreshEqualsFreshSnapshot: after rounds in which some
// agents' values move, some agents' adapter lists change (to lists of the
// same or another length, so blocks move) and some stay as they were, the
// refreshed snapshot is the one a fresh cache reads from the same shared
// data, and the segments were re-read in place (no materialize, no
// strings made again).
func TestInPlaceRefreshEqualsFreshSnapshot(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	require.NoError(t, w.Init(st))
	const agents = 200
	encs := make([]BlockEncoder, agents)
	seq := make([]uint64, agents)
	lists := [][]string{{"sql-lora"}, {"sql-lora", "tenant-0"}, {"tenant-0"}, nil, {"sql-lora", "summary", "tenant-0"}}
	r := rand.New(rand.NewPCG(3, 4))
	now := at(0)
	push := func(a int, list []string) {
		id := fmt.Sprintf("node-%03d", a)
		seq[a]++
		eps := agentState(id, 1+a%3, uint32(3*r.IntN(100)), now.Add(-time.Duration(r.IntN(1500))*time.Millisecond))
		for i := range eps {
			eps[i].ActiveAdapters, eps[i].WaitingAdapters = list, nil
		}
		b, err := encs[a].AppendAgentPush(nil, &Push{AgentID: id, Seq: seq[a], SendTime: now, Endpoints: eps}, Limits{})
		require.NoError(t, err)
		_, err = w.Apply(st, b, now)
		require.NoError(t, err)
	}
	for a := range agents { // every adapter name in every table from the start
		push(a, lists[4])
	}
	c := NewCache(testKeys, Limits{})
	_, _, err := c.Refresh(st)
	require.NoError(t, err)
	rebuilds, inPlace := c.Stats().Rebuilds, 0
	for round := range 30 {
		now = now.Add(50*time.Millisecond + time.Duration(r.IntN(1000))*time.Microsecond)
		for a := range agents {
			switch k := r.IntN(10); {
			case k < 3: // unchanged
			case k < 8:
				push(a, lists[4]) // values only
			default:
				push(a, lists[r.IntN(len(lists))])
			}
		}
		snap, changed, err := c.Refresh(st)
		require.NoError(t, err)
		require.True(t, changed)
		fresh := snapshotOf(t, st)
		require.Equal(t, fresh.Endpoints, snap.Endpoints, "round %d", round)
		for k := range c.segs {
			if c.segs[k].changed && c.segs[k].written {
				inPlace++
			}
		}
	}
	assert.Equal(t, rebuilds, c.Stats().Rebuilds, "no strings made again")
	assert.Greater(t, inPlace, 30*NumSegments*9/10, "segments re-read in place")
}

// TestInPlaceRereadComparesWholeHeaderWords: the in-place re-read takes
// a block as the current one with at most another adapter refs count
// (whose bytes share a word with the endpoint count) only when the rest
// of its header is the current block's: one that differs only in the
// upper bytes of str_bytes or of the reserved zero word is left to the
// general read (which, for an identity the cache has seen, reads its
// values as walkSegment describes; a fresh cache refuses such a block).
// The same value without the fault is re-read in place.
func TestInPlaceRereadComparesWholeHeaderWords(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int // the byte of the block header flipped, -1: none
	}{
		{"none", -1},
		{"str_bytes byte 2", bhStrBytes + 2}, {"str_bytes byte 3", bhStrBytes + 3},
		{"zero byte 2", bhZero + 2}, {"zero byte 3", bhZero + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &MemStore{}
			w := NewWriter(testKeys, Limits{}, time.Hour)
			require.NoError(t, w.Init(st))
			push := func(seq uint64, marker uint32) {
				now := at(time.Duration(seq) * time.Second)
				_, err := w.Apply(st, agentPush(t, "node-a", seq, now, agentState("node-a", 3, marker, now)), now)
				require.NoError(t, err)
			}
			push(1, 1)
			c := NewCache(testKeys, Limits{})
			_, _, err := c.Refresh(st)
			require.NoError(t, err)
			push(2, 4) // other values, the same strings and adapter lists
			k := SegmentOf([]byte("node-a"))
			key := testKeys.Segments[k]
			v, _, err := st.Get(key, nil)
			require.NoError(t, err)
			require.Equal(t, len(v), int(le32(v, segHeaderBytes+bhLen))+segHeaderBytes, "one block")
			if tc.at >= 0 {
				v[segHeaderBytes+tc.at] ^= 1
				require.NoError(t, st.Set(key, v, 0))
				_, _, ferr := NewCache(testKeys, Limits{}).Refresh(st)
				require.Error(t, ferr, "a fresh cache refuses the value")
			}
			snap, _, err := c.Refresh(st)
			require.NoError(t, err)
			require.Equal(t, tc.at < 0, c.segs[k].written, "re-read in place")
			require.Len(t, snap.Endpoints, 3)
			assert.Equal(t, 4, snap.Endpoints[0].Metrics.WaitingQueueSize, "the new values")
		})
	}
}
