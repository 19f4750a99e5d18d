package scheduler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func seedTreeWith(t *testing.T, affinity float64) *DecisionTreeFilter {
	t.Helper()
	p := DefaultTreeParams()
	p.LoRAAffinityThreshold = affinity
	steps, entries := SeedTree(p)
	tree, err := NewDecisionTree("tree", steps, entries)
	require.NoError(t, err)
	return tree
}

// TestSeedTreeBranches covers every branch of the seed's decision tree: the
// survivors it leaves for the random picker, the route and shedding.
func TestSeedTreeBranches(t *testing.T) {
	x := []string{"x"}
	tests := []struct {
		name     string
		crit     Criticality
		affinity float64 // LoraAffinityThreshold
		snap     *Snapshot
		want     []string // survivors, in snapshot order
		path     string
		dropped  bool
	}{
		{
			name: "critical, affinity group chosen", crit: Critical, affinity: 1,
			snap: snapshot(ep("a", 0, 0.2, nil, nil, 4), ep("b", 3, 0.1, x, nil, 4), ep("c", 10, 0.2, nil, nil, 4)),
			want: []string{"b"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "critical, available group chosen (threshold 0)", crit: Critical, affinity: 0,
			// available {a, c}; least-queue band [0, 0+10/2] keeps a.
			snap: snapshot(ep("a", 0, 0.2, nil, nil, 4), ep("b", 3, 0.1, x, nil, 4), ep("c", 10, 0.2, nil, nil, 4)),
			want: []string{"a"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "only the available group exists", crit: Critical, affinity: 1,
			snap: snapshot(ep("a", 1, 0.2, []string{"y"}, nil, 1), ep("b", 2, 0.3, nil, nil, 4), ep("c", 2, 0.3, nil, nil, 4)),
			want: []string{"b", "c"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "adapter only waiting counts as affinity", crit: Critical, affinity: 1,
			snap: snapshot(ep("a", 0, 0.1, nil, nil, 4), ep("b", 5, 0.5, nil, x, 4)),
			want: []string{"b"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "no affinity and no free slot: lora step fails, input kept", crit: Critical, affinity: 1,
			snap: snapshot(ep("a", 0, 0.4, []string{"y"}, nil, 1), ep("b", 1, 0.1, []string{"z"}, nil, 1), ep("c", 9, 0.0, []string{"w"}, nil, 1)),
			// least-queue band [0, 0+9/3=3] keeps a, b; least-kv band [0.1, 0.1+0.3/2] keeps b.
			want: []string{"b"}, path: "critical/low-queue/least-queue/least-kv",
		},
		{
			name: "MaxActiveModels 0: nobody has a free slot", crit: Critical, affinity: 0,
			snap: snapshot(ep("a", 0, 0.2, nil, nil, 0), ep("b", 0, 0.2, nil, nil, 0)),
			want: []string{"a", "b"}, path: "critical/low-queue/least-queue/least-kv",
		},
		{
			name: "MaxActiveModels 0 with the adapter active still has affinity", crit: Critical, affinity: 0,
			snap: snapshot(ep("a", 0, 0.2, nil, nil, 0), ep("b", 4, 0.6, x, nil, 0)),
			want: []string{"b"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "adapter both active and waiting: affinity, and it uses two slots", crit: Critical, affinity: 0,
			// b holds x twice (2 of 2 slots) but has affinity; c has y twice in 3 slots: free.
			// Threshold 0 picks the available group: only c.
			snap: snapshot(ep("b", 0, 0.1, x, x, 2), ep("c", 0, 0.1, []string{"y"}, []string{"y"}, 3), ep("d", 0, 0.1, []string{"y"}, []string{"y"}, 2)),
			want: []string{"c"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "adapter both active and waiting with threshold 1", crit: Critical, affinity: 1,
			snap: snapshot(ep("b", 0, 0.1, x, x, 2), ep("c", 0, 0.1, []string{"y"}, []string{"y"}, 3)),
			want: []string{"b"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "no endpoint passes low-queue: least-queue first, then affinity", crit: Critical, affinity: 1,
			// band [150, 150+150/3=200] keeps a, c; b (with x) is too queued; affinity
			// group empty among a, c so the available group {a, c}; least-kv keeps c.
			snap: snapshot(ep("a", 200, 0.5, nil, nil, 4), ep("b", 300, 0.1, x, nil, 4), ep("c", 150, 0.3, nil, nil, 4)),
			want: []string{"c"}, path: "critical/no-low-queue/least-queue/lora-affinity/least-kv",
		},
		{
			name: "no low queue, affinity among the least queued", crit: Critical, affinity: 1,
			snap: snapshot(ep("a", 200, 0.5, x, nil, 4), ep("b", 300, 0.1, x, nil, 4), ep("c", 150, 0.3, nil, nil, 4)),
			want: []string{"a"}, path: "critical/no-low-queue/least-queue/lora-affinity/least-kv",
		},
		{
			name: "no low queue and no lora match", crit: Critical, affinity: 1,
			snap: snapshot(ep("a", 200, 0.5, []string{"y"}, nil, 1), ep("c", 190, 0.3, []string{"z"}, nil, 1)),
			want: []string{"c"}, path: "critical/no-low-queue/least-queue/least-kv",
		},
		{
			name: "critical requests are never dropped", crit: Critical, affinity: 1,
			snap: snapshot(ep("a", 50, 0.95, nil, nil, 4), ep("b", 60, 0.99, nil, nil, 4)),
			// band [50, 50+10/2=55] keeps a.
			want: []string{"a"}, path: "critical/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "sheddable with capacity takes the critical route among capable endpoints", crit: Sheddable, affinity: 1,
			// c holds x but has no capacity (queue 10 > 5): a and b remain; available group.
			snap: snapshot(ep("a", 0, 0.2, nil, nil, 4), ep("b", 0, 0.2, nil, nil, 4), ep("c", 10, 0.2, x, nil, 4)),
			want: []string{"a", "b"}, path: "sheddable/capacity/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "sheddable dropped: queues too long or KV too full", crit: Sheddable, affinity: 1,
			snap: snapshot(ep("a", 10, 0.9, nil, nil, 4), ep("b", 3, 0.85, x, nil, 4), ep("c", 10, 0.85, nil, nil, 4)),
			want: []string{}, path: "sheddable/no-capacity", dropped: true,
		},
		{
			name: "standard is shed like sheddable (upstream at 264ee45a)", crit: Standard, affinity: 1,
			snap: snapshot(ep("a", 6, 0.1, nil, nil, 4)),
			want: []string{}, path: "standard/no-capacity", dropped: true,
		},
		{
			name: "thresholds are inclusive", crit: Standard, affinity: 1,
			snap: snapshot(ep("a", 5, 0.8, nil, nil, 4), ep("b", 6, 0.1, nil, nil, 4)),
			want: []string{"a"}, path: "standard/capacity/low-queue/lora-affinity/least-queue/least-kv",
		},
		{
			name: "unknown criticality is shed like sheddable", crit: Criticality(7), affinity: 1,
			snap: snapshot(ep("a", 9, 0.1, nil, nil, 4)),
			want: []string{}, path: "sheddable/no-capacity", dropped: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree := seedTreeWith(t, tc.affinity)
			c := testCycle(&Request{Model: "x", Criticality: tc.crit}, tc.snap, 1)
			got := tree.Filter(c, nil, all(tc.snap))
			assert.Equal(t, tc.want, append([]string{}, names(got)...))
			assert.Equal(t, tc.path, c.path)
			assert.Equal(t, tc.dropped, c.Dropped())
			assert.Contains(t, tree.Paths(), tc.path)
		})
	}
}

// TestSeedTreeAffinityProbability checks the soft-affinity split: with the
// default 0.999 the available group is chosen about once per thousand.
func TestSeedTreeAffinityProbability(t *testing.T) {
	tree := seedTreeWith(t, DefaultLoRAAffinityThreshold)
	snap := snapshot(ep("has", 0, 0.1, []string{"x"}, nil, 4), ep("free", 0, 0.1, nil, nil, 4))
	c := testCycle(&Request{Model: "x"}, snap, 42)
	const n = 100_000
	free := 0
	for range n {
		c.reset(&Request{Model: "x", Criticality: Critical}, snap)
		got := tree.Filter(c, nil, all(snap))
		require.Len(t, got, 1)
		if got[0].ID.Name == "free" {
			free++
		}
	}
	// Binomial(1e5, 0.001): mean 100, sd ~10.
	assert.InDelta(t, 100, free, 50)
}

func TestSeedTreePaths(t *testing.T) {
	tree := seedTreeWith(t, DefaultLoRAAffinityThreshold)
	critical := []string{
		"low-queue/lora-affinity/least-queue/least-kv",
		"low-queue/least-queue/least-kv",
		"no-low-queue/least-queue/lora-affinity/least-kv",
		"no-low-queue/least-queue/least-kv",
	}
	var want []string
	for _, c := range critical {
		want = append(want, "critical/"+c)
	}
	for _, class := range []string{"standard", "sheddable"} {
		for _, c := range critical {
			want = append(want, class+"/capacity/"+c)
		}
		want = append(want, class+"/no-capacity")
	}
	for _, class := range []string{"standard", "sheddable"} {
		for _, c := range critical {
			want = append(want, class+"/admitted/"+c)
		}
	}
	assert.Equal(t, want, tree.Paths())
}

// TestSeedTreeAdmitted: a request flow control admitted is never shed; it
// takes the critical route over every endpoint, capacity or not, and its
// path keeps its criticality.
func TestSeedTreeAdmitted(t *testing.T) {
	x := []string{"x"}
	// Neither endpoint has capacity (queue > 5, KV > 0.8); b holds x.
	snap := snapshot(ep("a", 9, 0.9, nil, nil, 4), ep("b", 6, 0.95, x, nil, 4))
	tree := seedTreeWith(t, 1)
	for _, tc := range []struct {
		crit Criticality
		path string
	}{
		{Standard, "standard/admitted/low-queue/lora-affinity/least-queue/least-kv"},
		{Sheddable, "sheddable/admitted/low-queue/lora-affinity/least-queue/least-kv"},
		{Criticality(7), "sheddable/admitted/low-queue/lora-affinity/least-queue/least-kv"},
		{Critical, "critical/low-queue/lora-affinity/least-queue/least-kv"},
	} {
		c := testCycle(&Request{Model: "x", Criticality: tc.crit, Admitted: true}, snap, 1)
		got := tree.Filter(c, nil, all(snap))
		assert.Equal(t, []string{"b"}, names(got), "%v", tc.crit)
		assert.False(t, c.Dropped())
		assert.Equal(t, tc.path, c.path)
		assert.Contains(t, tree.Paths(), tc.path)
	}
	// The same request, not admitted, is shed.
	c := testCycle(&Request{Model: "x", Criticality: Standard}, snap, 1)
	assert.Empty(t, tree.Filter(c, nil, all(snap)))
	assert.True(t, c.Dropped())
}

func TestNewDecisionTreeErrors(t *testing.T) {
	f := &LowQueueFilter{PluginName: "lq"}
	entries := TreeEntries{Critical: "a", Standard: "a", Sheddable: "a"}
	tests := []struct {
		name    string
		steps   []TreeStep
		entries TreeEntries
		err     string
	}{
		{"empty name", []TreeStep{{"", f, Done, Done}}, entries, "steps[0].name: must not be empty"},
		{"reserved name", []TreeStep{{"drop", f, Done, Done}}, entries, `steps[0].name: "drop" is reserved`},
		{"duplicate", []TreeStep{{"a", f, Done, Done}, {"a", f, Done, Done}}, entries, `steps[1].name: duplicate step "a"`},
		{"no filter", []TreeStep{{"a", nil, Done, Done}}, entries, "steps[0].filter: required"},
		{"unknown next", []TreeStep{{"a", f, "b", Done}}, entries, `steps[0].onSuccess: unknown step "b"`},
		{"unknown failure", []TreeStep{{"a", f, Done, ""}}, entries, `steps[0].onFailure: unknown step ""`},
		{"cycle", []TreeStep{{"a", f, "b", Done}, {"b", f, Done, "a"}}, entries, `steps: cycle through step "a"`},
		{"missing entry", []TreeStep{{"a", f, Done, Done}}, TreeEntries{Critical: "a", Standard: "a"}, "entries.sheddable: required"},
		{"entry to terminal", []TreeStep{{"a", f, Done, Done}}, TreeEntries{Critical: "a", Standard: "drop", Sheddable: "a"}, "entries.standard: must name a step"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDecisionTree("t", tc.steps, tc.entries)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			var ce *ConfigError
			assert.ErrorAs(t, err, &ce)
		})
	}
}

func TestNewDecisionTreeRouteLimit(t *testing.T) {
	// 13 branching rows in a chain double the routes each time.
	var steps []TreeStep
	f := &LowQueueFilter{PluginName: "lq"}
	names := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12"}
	for i, n := range names {
		next := Done
		if i+1 < len(names) {
			next = names[i+1]
		}
		steps = append(steps, TreeStep{n, f, next, next})
		steps = append(steps, TreeStep{n + "/alt", f, next, next})
		steps[len(steps)-2].OnFailure = n + "/alt"
	}
	_, err := NewDecisionTree("t", steps, TreeEntries{"s0", "s0", "s0"})
	assert.ErrorContains(t, err, "nodes (a node per row on each route to it); simplify it")
}
