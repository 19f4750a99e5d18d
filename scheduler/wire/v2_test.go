package wire

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

var testKeys = NewKeys(DefaultKeyPrefix)

// agentState is n endpoints of one agent whose values carry marker, so a
// reader can tell which push it sees.
func agentState(agent string, n int, marker uint32, scrape time.Time) []EndpointState {
	eps := make([]EndpointState, n)
	for i := range eps {
		eps[i] = EndpointState{
			Namespace: "llm", Name: fmt.Sprintf("%s-pod-%d", agent, i),
			Address: netip.AddrFrom4([4]byte{10, byte(len(agent)), byte(i >> 8), byte(i)}), Port: 8000,
			Waiting: marker, Running: marker % 7, KVCacheUsage: float64(marker%100) / 100,
			MaxAdapters: 4, ScrapeTime: scrape,
		}
		if i%2 == 0 {
			eps[i].ActiveAdapters = []string{"sql-lora", fmt.Sprintf("tenant-%d", marker%3)}
			eps[i].WaitingAdapters = []string{"summary"}
		}
	}
	Normalize(eps)
	return eps
}

func agentPush(t testing.TB, agent string, seq uint64, send time.Time, eps []EndpointState) []byte {
	t.Helper()
	var enc BlockEncoder
	b, err := enc.AppendAgentPush(nil, &Push{AgentID: agent, Seq: seq, SendTime: send, Endpoints: eps}, Limits{})
	require.NoError(t, err)
	return b
}

// snapshotOf reads st through a fresh cache.
func snapshotOf(t testing.TB, st Store) *scheduler.Snapshot {
	t.Helper()
	snap, _, err := NewCache(testKeys, Limits{}).Refresh(st)
	require.NoError(t, err)
	return snap
}

func byName(snap *scheduler.Snapshot) map[string]scheduler.Endpoint {
	m := map[string]scheduler.Endpoint{}
	for _, e := range snap.Endpoints {
		m[e.ID.Name] = e
	}
	return m
}

func TestV2PushIsReadBackAsSent(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, 2*time.Second)
	eps := agentState("node-a", 5, 3, at(-20*time.Millisecond))
	_, err := w.Apply(st, agentPush(t, "node-a", 1, at(0), eps), at(time.Second))
	require.NoError(t, err)

	snap := snapshotOf(t, st)
	require.Len(t, snap.Endpoints, 5)
	assert.True(t, at(time.Second).Equal(snap.Time), "snapshot time is the receipt")
	got := byName(snap)
	for _, e := range eps {
		g, ok := got[e.Name]
		require.True(t, ok, e.Name)
		assert.Equal(t, e.Namespace, g.ID.Namespace)
		assert.Equal(t, e.Address.String(), g.Address)
		assert.Equal(t, int(e.Port), g.Port)
		assert.Equal(t, int(e.Waiting), g.Metrics.WaitingQueueSize)
		assert.Equal(t, int(e.Running), g.Metrics.RunningQueueSize)
		assert.Equal(t, e.KVCacheUsage, g.Metrics.KVCacheUsage)
		assert.Equal(t, int(e.MaxAdapters), g.Metrics.MaxActiveModels)
		assert.Equal(t, e.ActiveAdapters, g.Metrics.ActiveModels)
		assert.Equal(t, e.WaitingAdapters, g.Metrics.WaitingModels)
		// Scraped 20 ms before the send: 20 ms before the receipt.
		assert.True(t, at(time.Second-20*time.Millisecond).Equal(g.Metrics.UpdateTime), "%v", g.Metrics.UpdateTime)
	}
}

func TestV1PushIsStillAccepted(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, 2*time.Second)
	b, err := EncodePush(&Push{AgentID: "old-agent", Seq: 7, SendTime: at(0), Endpoints: agentState("old-agent", 3, 1, at(-time.Millisecond))}, Limits{})
	require.NoError(t, err)
	_, err = w.Apply(st, b, at(0))
	require.NoError(t, err)
	assert.Len(t, snapshotOf(t, st).Endpoints, 3)
}

func TestUnknownPushVersionSaysWhichAreRead(t *testing.T) {
	b := agentPush(t, "a", 1, at(0), nil)
	b[2] = 3
	_, err := NewWriter(testKeys, Limits{}, time.Second).Apply(&MemStore{}, b, at(0))
	require.ErrorIs(t, err, ErrVersion)
	assert.Contains(t, err.Error(), "reads versions 1 and 2")
}

func TestOnlyChangedSegmentsAreReadAgain(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("node-%02d", i)
		_, err := w.Apply(st, agentPush(t, id, 1, at(0), agentState(id, 2, 1, at(0))), at(0))
		require.NoError(t, err)
	}
	c := NewCache(testKeys, Limits{})
	snap, changed, err := c.Refresh(st)
	require.NoError(t, err)
	require.True(t, changed)
	require.Len(t, snap.Endpoints, 80)
	before := c.Stats()

	_, changed, err = c.Refresh(st)
	require.NoError(t, err)
	assert.False(t, changed, "nothing changed: one directory read")
	assert.Equal(t, before, c.Stats())

	_, err = w.Apply(st, agentPush(t, "node-07", 2, at(time.Second), agentState("node-07", 2, 100, at(time.Second))), at(time.Second))
	require.NoError(t, err)
	snap, changed, err = c.Refresh(st)
	require.NoError(t, err)
	require.True(t, changed)
	assert.Equal(t, before.SegmentReads+1, c.Stats().SegmentReads, "one segment read again")
	assert.Equal(t, before.Rebuilds, c.Stats().Rebuilds, "same strings: none made anew")
	assert.Equal(t, 100, byName(snap)["node-07-pod-1"].Metrics.WaitingQueueSize)
	assert.Equal(t, 1, byName(snap)["node-08-pod-1"].Metrics.WaitingQueueSize)
}

func TestStaleAgentPushIsRefusedAndWritesNothing(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	_, err := w.Apply(st, agentPush(t, "node-a", 10, at(0), agentState("node-a", 1, 1, at(0))), at(0))
	require.NoError(t, err)
	keys, size := st.Keys()
	for _, seq := range []uint64{10, 9} {
		_, err = w.Apply(st, agentPush(t, "node-a", seq, at(0), agentState("node-a", 1, 2, at(0))), at(time.Second))
		require.ErrorIs(t, err, ErrStaleSequence)
		assert.Contains(t, err.Error(), "last accepted 10")
		k, s := st.Keys()
		assert.Equal(t, [2]int{keys, size}, [2]int{k, s})
	}
}

// relay builds an aggregator's push of the given agents' blocks.
func relay(t testing.TB, sender string, send time.Time, blocks ...[]byte) []byte {
	t.Helper()
	var d PushDecoder
	type kb struct {
		id string
		b  Block
	}
	var list []kb
	for _, p := range blocks {
		v, err := d.Decode(p, Limits{})
		require.NoError(t, err)
		list = append(list, kb{string(v.Blocks[0].AgentID()), append(Block(nil), v.Blocks[0]...)})
	}
	for i := 1; i < len(list); i++ {
		for j := i; j > 0 && list[j].id < list[j-1].id; j-- {
			list[j], list[j-1] = list[j-1], list[j]
		}
	}
	out := AppendPushV2Header(nil, KindRelay, sender, send, len(list))
	for _, e := range list {
		out = AppendRelayBlock(out, e.b, 0)
	}
	return out
}

func TestRelayFromTwoAggregatorsWritesOnce(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	a := agentPush(t, "node-a", 5, at(0), agentState("node-a", 2, 1, at(0)))
	b := agentPush(t, "node-b", 8, at(0), agentState("node-b", 2, 1, at(0)))
	s, err := w.Apply(st, relay(t, "agg-0", at(0), a, b), at(0))
	require.NoError(t, err)
	assert.Equal(t, 2, s.Accepted)
	_, dirCas, err := st.Get(testKeys.Dir, nil)
	require.NoError(t, err)

	// The second aggregator relays the same sequence numbers: nothing is
	// written, so routers have nothing to re-read.
	s, err = w.Apply(st, relay(t, "agg-1", at(0), a, b), at(10*time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, 0, s.Accepted)
	assert.Equal(t, 2, s.Stale)
	assert.Equal(t, 0, s.Segments)
	_, cas, err := st.Get(testKeys.Dir, nil)
	require.NoError(t, err)
	assert.Equal(t, dirCas, cas, "directory untouched")
}

func TestAgentThatDisappearsLeavesNothingBehindAfterExpiry(t *testing.T) {
	st := &MemStore{}
	const expiry = 2 * time.Second
	w := NewWriter(testKeys, Limits{}, expiry)
	_, err := w.Apply(st, agentPush(t, "gone", 1, at(0), agentState("gone", 3, 1, at(0))), at(0))
	require.NoError(t, err)
	for i, ms := range []int{500, 1000, 1999} { // not yet expired
		_, err = w.Apply(st, agentPush(t, "alive", uint64(i+1), at(time.Duration(ms)*time.Millisecond), agentState("alive", 1, 1, at(0))), at(time.Duration(ms)*time.Millisecond))
		require.NoError(t, err)
		require.Len(t, snapshotOf(t, st).Endpoints, 4)
	}
	// Past the expiry, the next push that brings something new drops it.
	_, err = w.Apply(st, agentPush(t, "alive", 10, at(2001*time.Millisecond), agentState("alive", 1, 1, at(0))), at(2001*time.Millisecond))
	require.NoError(t, err)
	snap := snapshotOf(t, st)
	require.Len(t, snap.Endpoints, 1)
	assert.Equal(t, "alive-pod-0", snap.Endpoints[0].ID.Name)

	// When nothing new arrives at all, the last state stays (fail-open):
	// an aggregator still relaying the agent's last push brings nothing
	// new, and cannot bring it back once it is gone either.
	st2 := &MemStore{}
	only := agentPush(t, "only", 1, at(0), agentState("only", 2, 1, at(0)))
	_, err = w.Apply(st2, only, at(0))
	require.NoError(t, err)
	var d PushDecoder
	v, err := d.Decode(only, Limits{})
	require.NoError(t, err)
	late := AppendRelayBlock(AppendPushV2Header(nil, KindRelay, "agg", at(time.Minute), 1), v.Blocks[0], time.Minute)
	s, err := w.Apply(st2, late, at(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, 0, s.Accepted)
	assert.Len(t, snapshotOf(t, st2).Endpoints, 2, "kept for fail-open")
	_, err = w.Apply(st2, agentPush(t, "other", 1, at(time.Minute), agentState("other", 1, 1, at(time.Minute))), at(time.Minute))
	require.NoError(t, err)
	_, err = w.Apply(st2, late, at(time.Minute))
	require.NoError(t, err)
	snap = snapshotOf(t, st2)
	require.Len(t, snap.Endpoints, 1, "swept, and not brought back by the relay")
	assert.Equal(t, "other-pod-0", snap.Endpoints[0].ID.Name)
}

// A relay that brings news for one segment sweeps the expired agents of
// another segment it carries only old blocks for (such a segment is not
// merged otherwise).
func TestRelaySweepsExpiredAgentsOfSegmentsWithoutNews(t *testing.T) {
	st := &MemStore{}
	const expiry = 2 * time.Second
	w := NewWriter(testKeys, Limits{}, expiry)
	ys := sameSegmentIDs(2) // ys[0] expires, ys[1] is relayed again unchanged
	x := "node-x"
	for i := 0; SegmentOf([]byte(x)) == SegmentOf([]byte(ys[0])); i++ {
		x = fmt.Sprintf("node-x%d", i)
	}
	_, err := w.Apply(st, agentPush(t, ys[0], 1, at(0), agentState(ys[0], 1, 1, at(0))), at(0))
	require.NoError(t, err)
	late := at(1500 * time.Millisecond)
	y1 := agentPush(t, ys[1], 1, late, agentState(ys[1], 1, 1, late))
	_, err = w.Apply(st, y1, late)
	require.NoError(t, err)
	require.Len(t, snapshotOf(t, st).Endpoints, 2)

	now := at(2001 * time.Millisecond)
	s, err := w.Apply(st, relay(t, "agg-0", now, agentPush(t, x, 1, now, agentState(x, 1, 1, now)), y1), now)
	require.NoError(t, err)
	assert.Equal(t, 1, s.Accepted)
	assert.Equal(t, 1, s.Stale)
	assert.Equal(t, 1, s.Swept)
	var names []string
	for _, e := range snapshotOf(t, st).Endpoints {
		names = append(names, e.ID.Name)
	}
	assert.ElementsMatch(t, []string{x + "-pod-0", ys[1] + "-pod-0"}, names)
}

func TestEndpointAnAgentStopsReportingIsGoneAtOnce(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	_, err := w.Apply(st, agentPush(t, "node-a", 1, at(0), agentState("node-a", 3, 1, at(0))), at(0))
	require.NoError(t, err)
	c := NewCache(testKeys, Limits{})
	snap, _, err := c.Refresh(st)
	require.NoError(t, err)
	require.Len(t, snap.Endpoints, 3)
	_, err = w.Apply(st, agentPush(t, "node-a", 2, at(0), agentState("node-a", 2, 1, at(0))), at(0))
	require.NoError(t, err)
	snap, _, err = c.Refresh(st)
	require.NoError(t, err)
	require.Len(t, snap.Endpoints, 2)
	_, gone := byName(snap)["node-a-pod-2"]
	assert.False(t, gone)
}

// Agent ids come and go; shared data keeps a fixed set of keys and bytes
// bounded by what is alive.
func TestChurnKeepsKeysAndBytesBounded(t *testing.T) {
	st := &MemStore{}
	const expiry = time.Second
	w := NewWriter(testKeys, Limits{}, expiry)
	maxBytes := 0
	seq := uint64(0)
	for round := 0; round < 50; round++ {
		now := at(time.Duration(round) * 300 * time.Millisecond)
		// 20 agents alive at a time, a new set every round: 1,000 ids.
		for i := 0; i < 20; i++ {
			id := fmt.Sprintf("churn-%04d", round*20+i)
			seq++
			_, err := w.Apply(st, agentPush(t, id, seq, now, agentState(id, 2, 1, now)), now)
			require.NoError(t, err)
		}
		keys, size := st.Keys()
		assert.LessOrEqual(t, keys, NumKeys, "a fixed set of keys")
		maxBytes = max(maxBytes, size)
	}
	// Alive at the end: the rounds within the expiry (4 rounds of 20 agents).
	snap := snapshotOf(t, st)
	assert.LessOrEqual(t, len(snap.Endpoints), 5*20*2)
	// 100 agents' worth of blocks at most, whatever the churn.
	one := len(agentPush(t, "churn-0000", 1, at(0), agentState("churn-0000", 2, 1, at(0))))
	assert.Less(t, maxBytes, DirBytes+NumSegments*segHeaderBytes+6*20*one)
	t.Logf("at most %d bytes in %d keys after 1,000 agent ids", maxBytes, NumKeys)
}

func TestLimitsRefuseAndWriteNothing(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{MaxAgents: 2, MaxTotalEndpoints: 5}, time.Hour)
	for _, id := range []string{"a", "b"} {
		_, err := w.Apply(st, agentPush(t, id, 1, at(0), agentState(id, 2, 1, at(0))), at(0))
		require.NoError(t, err)
	}
	keys, size := st.Keys()
	_, err := w.Apply(st, agentPush(t, "c", 1, at(0), agentState("c", 1, 1, at(0))), at(0))
	require.ErrorIs(t, err, ErrLimit)
	assert.Contains(t, err.Error(), "3 agents, limit 2")
	_, err = w.Apply(st, agentPush(t, "a", 2, at(0), agentState("a", 4, 1, at(0))), at(0))
	require.ErrorIs(t, err, ErrLimit)
	assert.Contains(t, err.Error(), "6 endpoints, limit 5")
	k, s := st.Keys()
	assert.Equal(t, [2]int{keys, size}, [2]int{k, s})
}

func TestClockSkewIsRefused(t *testing.T) {
	w := NewWriter(testKeys, Limits{}, time.Hour)
	_, err := w.Apply(&MemStore{}, agentPush(t, "a", 1, at(time.Hour), agentState("a", 1, 1, at(time.Hour))), at(0))
	require.ErrorIs(t, err, ErrClockSkew)
	assert.Contains(t, err.Error(), "1h0m0s ahead")
}

// Several writers (worker VMs) at once: no agent's push is lost, and a
// reader never sees two versions of one agent's data.
func TestConcurrentWritersLoseNothingAndReadersSeeWholeAgents(t *testing.T) {
	st := &MemStore{}
	require.NoError(t, NewWriter(testKeys, Limits{}, time.Hour).Init(st))
	const writers, agentsPer, rounds = 4, 6, 30
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mixed []string
	var mixedMu sync.Mutex
	// A reader checks each agent's endpoints carry one marker.
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := NewCache(testKeys, Limits{})
		for {
			select {
			case <-stop:
				return
			default:
			}
			snap, _, err := c.Refresh(st)
			if err != nil {
				continue
			}
			seen := map[string]int{}
			for _, e := range snap.Endpoints {
				agent := e.ID.Name[:strings.LastIndex(e.ID.Name, "-pod-")]
				if m, ok := seen[agent]; ok && m != e.Metrics.WaitingQueueSize {
					mixedMu.Lock()
					mixed = append(mixed, agent)
					mixedMu.Unlock()
				}
				seen[agent] = e.Metrics.WaitingQueueSize
			}
		}
	}()
	var retries int
	var retryMu sync.Mutex
	var wwg sync.WaitGroup
	for wi := 0; wi < writers; wi++ {
		wwg.Add(1)
		go func(wi int) {
			defer wwg.Done()
			w := NewWriter(testKeys, Limits{}, time.Hour)
			for r := 1; r <= rounds; r++ {
				for a := 0; a < agentsPer; a++ {
					id := fmt.Sprintf("w%d-a%d", wi, a)
					s, err := w.Apply(st, agentPush(t, id, uint64(r), at(0), agentState(id, 3, uint32(r), at(0))), at(0))
					if !assert.NoError(t, err) {
						return
					}
					retryMu.Lock()
					retries += s.Retries
					retryMu.Unlock()
				}
			}
		}(wi)
	}
	wwg.Wait()
	close(stop)
	wg.Wait()
	assert.Empty(t, mixed, "an agent's endpoints from two pushes")
	snap := snapshotOf(t, st)
	require.Len(t, snap.Endpoints, writers*agentsPer*3, "every agent's latest endpoints")
	for _, e := range snap.Endpoints {
		assert.Equal(t, rounds, e.Metrics.WaitingQueueSize, e.ID.Name)
	}
	t.Logf("%d CAS retries over %d pushes", retries, writers*agentsPer*rounds)
}

// A writer that loses every race at the worst moment still converges.
func TestWriterMergesOnTopOfAConcurrentWrite(t *testing.T) {
	st := &MemStore{}
	w1 := NewWriter(testKeys, Limits{}, time.Hour)
	w2 := NewWriter(testKeys, Limits{}, time.Hour)
	require.NoError(t, w1.Init(st))
	// Two agents in the same segment.
	ids := sameSegmentIDs(2)
	once := true
	st.BeforeSet = func(key string) {
		if once && key == testKeys.Segments[SegmentOf([]byte(ids[0]))] {
			once = false
			_, err := w2.Apply(st, agentPush(t, ids[1], 1, at(0), agentState(ids[1], 1, 1, at(0))), at(0))
			require.NoError(t, err)
		}
	}
	s, err := w1.Apply(st, agentPush(t, ids[0], 1, at(0), agentState(ids[0], 1, 1, at(0))), at(0))
	require.NoError(t, err)
	// One retry for the segment, one for the directory: w1 read it before
	// w2 wrote it, and tries that read's cas first.
	assert.Equal(t, 2, s.Retries)
	assert.Len(t, snapshotOf(t, st).Endpoints, 2)
}

func sameSegmentIDs(n int) []string {
	var out []string
	want := -1
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("agent-%d", i)
		if k := SegmentOf([]byte(id)); want < 0 || k == want {
			want = k
			out = append(out, id)
		}
	}
	return out
}

func TestUnreadableStoredValuesAreReplaced(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	id := "node-a"
	require.NoError(t, st.Set(testKeys.Dir, []byte("garbage"), 0))
	require.NoError(t, st.Set(testKeys.Segments[SegmentOf([]byte(id))], []byte("WG\x02junk"), 0))
	s, err := w.Apply(st, agentPush(t, id, 1, at(0), agentState(id, 2, 1, at(0))), at(0))
	require.NoError(t, err)
	assert.Positive(t, s.Reset)
	assert.Len(t, snapshotOf(t, st).Endpoints, 2)
}

func TestCacheKeepsTheLastGoodSegment(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	_, err := w.Apply(st, agentPush(t, "node-a", 1, at(0), agentState("node-a", 2, 1, at(0))), at(0))
	require.NoError(t, err)
	c := NewCache(testKeys, Limits{})
	_, _, err = c.Refresh(st)
	require.NoError(t, err)
	// Someone writes junk and moves the directory.
	k := SegmentOf([]byte("node-a"))
	require.NoError(t, st.Set(testKeys.Segments[k], []byte("WG\x02junk"), 0))
	var d Directory
	b, _, _ := st.Get(testKeys.Dir, nil)
	require.NoError(t, DecodeDirectory(b, &d))
	d.Gen++
	d.Entries[k].Gen++
	require.NoError(t, st.Set(testKeys.Dir, AppendDirectory(nil, &d), 0))
	snap, _, err := c.Refresh(st)
	require.Error(t, err)
	assert.Len(t, snap.Endpoints, 2, "previous content kept")
}

func TestSameEndpointFromTwoAgentsAppearsOnceNewestWins(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	e := agentState("x", 1, 1, at(0))
	old := append([]EndpointState(nil), e...)
	old[0].Waiting = 50
	_, err := w.Apply(st, agentPush(t, "agent-old", 1, at(0), old), at(0))
	require.NoError(t, err)
	_, err = w.Apply(st, agentPush(t, "agent-new", 1, at(time.Second), e), at(time.Second))
	require.NoError(t, err)
	c := NewCache(testKeys, Limits{})
	snap, _, err := c.Refresh(st)
	require.NoError(t, err)
	require.Len(t, snap.Endpoints, 1)
	assert.Equal(t, 1, snap.Endpoints[0].Metrics.WaitingQueueSize)
}

func TestWriterAndCacheAllocateNothingOnceWarm(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	c := NewCache(testKeys, Limits{})
	const agents, rounds = 50, 8
	pushes := make([][]byte, 0, rounds*agents)
	for r := 1; r <= rounds; r++ {
		for a := 0; a < agents; a++ {
			id := fmt.Sprintf("node-%03d", a)
			// Values change every round, strings do not (marker%3 names
			// an adapter), as with a real pod.
			pushes = append(pushes, agentPush(t, id, uint64(r), at(0), agentState(id, 4, uint32(3*r), at(0))))
		}
	}
	i := 0
	apply := func() {
		if _, err := w.Apply(st, pushes[i], at(0)); err != nil {
			t.Fatal(err)
		}
		i++
		if _, _, err := c.Refresh(st); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 * agents {
		apply()
	}
	// MemStore copies values (Envoy's host does the same into guest
	// memory): count only what the writer and cache allocate.
	allocs := testing.AllocsPerRun(250, apply)
	t.Logf("%.1f allocations per push and refresh", allocs)
	assert.Zero(t, allocs, "the writer and the cache allocate nothing (MemStore reuses its values' storage)")
}

// Adapters come and go from scrape to scrape without changing a block's
// identity (the agent's string table keeps names it saw), and readers see
// every change.
func TestAdapterChangesKeepIdentityAndAreSeen(t *testing.T) {
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	c := NewCache(testKeys, Limits{})
	var enc BlockEncoder
	eps := agentState("node-a", 2, 1, at(0))
	lists := [][]string{{"a1"}, {"a1", "a2"}, {"a2"}, nil, {"a1"}}
	var ident uint32
	for i, l := range lists {
		eps[0].ActiveAdapters = l
		b, err := enc.AppendAgentPush(nil, &Push{AgentID: "node-a", Seq: uint64(i + 1), SendTime: at(0), Endpoints: eps}, Limits{})
		require.NoError(t, err)
		_, err = w.Apply(st, b, at(0))
		require.NoError(t, err)
		snap, _, err := c.Refresh(st)
		require.NoError(t, err)
		got := byName(snap)[eps[0].Name].Metrics.ActiveModels
		assert.Equal(t, l, got, "push %d", i)
		v, _, _ := st.Get(testKeys.Segments[SegmentOf([]byte("node-a"))], nil)
		var seg Segment
		_, e := readSegment(v, SegmentOf([]byte("node-a")), &w.lim, &seg, nil)
		require.Nil(t, e)
		if i == 1 {
			ident = seg.Blocks[0].Identity() // "a2" seen from here on
		}
		if i > 1 {
			assert.Equal(t, ident, seg.Blocks[0].Identity(), "push %d: same identity", i)
		}
	}
	assert.Equal(t, 2, c.Stats().Rebuilds, "strings made for the first push and when a2 appeared")
}

// Two writers find a segment key missing (no Init: a key not created yet,
// or created by an older build under another name); the second creates it
// with its agent's block while the first is between its read and its
// write. The first must not wipe that block: a write with cas 0 is
// unconditional, so creating a key must fail when it exists by then.
func TestCreatingAKeyKeepsAnotherWritersBlock(t *testing.T) {
	for _, key := range []string{"segment", "dir"} {
		t.Run(key, func(t *testing.T) {
			st := &MemStore{}
			w1 := NewWriter(testKeys, Limits{}, time.Hour)
			w2 := NewWriter(testKeys, Limits{}, time.Hour)
			ids := sameSegmentIDs(2)
			watch := testKeys.Segments[SegmentOf([]byte(ids[0]))]
			if key == "dir" {
				// agents in two segments: the directory holds both entries
				ids[1] = "agent-b"
				require.NotEqual(t, SegmentOf([]byte(ids[0])), SegmentOf([]byte(ids[1])))
				watch = testKeys.Dir
			}
			once := true
			st.BeforeSet = func(k string) {
				if once && k == watch {
					once = false
					_, err := w2.Apply(st, agentPush(t, ids[1], 1, at(0), agentState(ids[1], 1, 1, at(0))), at(0))
					require.NoError(t, err)
				}
			}
			_, err := w1.Apply(st, agentPush(t, ids[0], 1, at(0), agentState(ids[0], 1, 1, at(0))), at(0))
			require.NoError(t, err)
			snap := snapshotOf(t, st)
			names := []string{}
			for _, e := range snap.Endpoints {
				names = append(names, e.ID.Name)
			}
			assert.ElementsMatch(t, []string{ids[0] + "-pod-0", ids[1] + "-pod-0"}, names, "both agents' blocks")
		})
	}
}

// TestInPlaceRereadFollowsBlocksThatMoved: when one agent's adapter list
// changes length, its block changes size and the blocks after it in the
// segment move; a cache that has read the segment before must then read
// every block where it now lies, as a fresh cache does.
func TestInPlaceRereadFollowsBlocksThatMoved(t *testing.T) {
	var ids []string // three agents of one segment, in sorted order
	for i := 0; len(ids) < 3; i++ {
		if id := fmt.Sprintf("node-%03d", i); SegmentOf([]byte(id)) == SegmentOf([]byte("node-000")) {
			ids = append(ids, id)
		}
	}
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	c := NewCache(testKeys, Limits{})
	encs := make([]BlockEncoder, len(ids))
	lists := [][]string{{"a1", "a2", "a3"}, {"a1"}, {"a1", "a3"}, {"a2", "a3"}, {"a3"}, {"a1", "a2", "a3"}}
	for round, l := range lists {
		for k, id := range ids {
			// markers of 3: the same adapter names, other values
			eps := agentState(id, 2, uint32(3*(10*round+k+1)), at(time.Duration(round)*time.Millisecond))
			if k == 0 {
				eps[0].ActiveAdapters = l
			}
			b, err := encs[k].AppendAgentPush(nil, &Push{AgentID: id, Seq: uint64(round + 1), SendTime: at(0), Endpoints: eps}, Limits{})
			require.NoError(t, err)
			_, err = w.Apply(st, b, at(time.Duration(round)*time.Millisecond))
			require.NoError(t, err)
		}
		snap, _, err := c.Refresh(st)
		require.NoError(t, err)
		fresh, _, err := NewCache(testKeys, Limits{}).Refresh(st)
		require.NoError(t, err)
		require.Equal(t, fresh.Endpoints, snap.Endpoints, "round %d", round)
	}
	assert.Equal(t, len(ids), c.Stats().Rebuilds, "identities kept: strings made once per agent")
}
