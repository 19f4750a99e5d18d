package metricsagent

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// k8sDocs reads a multi-document YAML file of testdata/k8s as JSON objects.
func k8sDocs(t testing.TB, name string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "k8s", name))
	require.NoError(t, err)
	var out [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		require.NoError(t, err)
		out = append(out, js)
	}
	return out
}

func testTableInput(t testing.TB) TableInput {
	return TableInput{PoolNamespace: "llm", PoolName: "vllm-llama", Pools: []string{"other-pool", "vllm-llama"},
		Objectives: k8sDocs(t, "objectives.yaml"), Rewrites: k8sDocs(t, "rewrites.yaml")}
}

func wt(model string, w uint32) wire.WeightedTarget {
	return wire.WeightedTarget{Model: model, Weight: w}
}

// TestBuildTableFromTestdata: the objects of testdata/k8s, each accepted
// or rejected as its comment there says, mapped onto one table.
func TestBuildTableFromTestdata(t *testing.T) {
	res := BuildTable(testTableInput(t), wire.ConfigLimits{})
	canary := []wire.WeightedTarget{wt("llama-3.1-8b", 90), wt("llama-3.2-8b", 10)}
	assert.Equal(t, wire.ModelTable{
		Rewrites: []wire.ModelRewrite{
			{Model: "llama", Targets: canary},
			{Model: "llama-chat", Targets: canary},
			{Model: "sql", Targets: []wire.WeightedTarget{wt("sql-lora-v1", 1), wt("sql-lora-v2", 1)}},
		},
		Default:    []wire.WeightedTarget{wt("llama-3.1-8b", 1)},
		Objectives: []wire.Objective{{Name: "batch", Priority: -5}, {Name: "interactive", Priority: 10}, {Name: "standard", Priority: 0}},
	}, res.Table)

	type verdict struct {
		id       string
		gen      int64
		accepted bool
		reason   string
		msg      string // a part of the message
	}
	var got []verdict
	for _, v := range res.Verdicts {
		got = append(got, verdict{v.ID(), v.Generation, v.Accepted, v.Reason, v.Message})
	}
	want := []verdict{
		{"InferenceModelRewrite llm/adapters", 1, true, "Accepted", "1 models rewritten, and every other model by rules[1]"},
		{"InferenceModelRewrite llm/all-off", 1, false, "InvalidSpec", "spec.rules[0].targets: the weights add up to 0"},
		{"InferenceModelRewrite llm/llama-canary", 4, true, "Accepted", `2 models rewritten; rules[1] matches "llama", as rules[0] does: rules[0] wins (first rule in list order)`},
		{"InferenceModelRewrite llm/llama-experiment", 2, false, "ModelConflict", `model "llama" is already rewritten by the older InferenceModelRewrite "llama-canary" (the oldest object wins)`},
		{"InferenceModelRewrite llm/negative", 1, false, "InvalidSpec", "spec.rules[0].targets[0].weight -1 is negative"},
		{"InferenceModelRewrite llm/unknown-field", 1, false, "InvalidSpec", `spec.rules[0].targets[0]: unknown field "percent"`},
		{"InferenceModelRewrite llm/wrong-pool", 1, false, "PoolNotFound", `spec.poolRef names InferencePool "no-such-pool", which does not exist in namespace "llm"`},
		{"InferenceObjective llm/batch", 1, true, "Accepted", "priority -5 (sheddable) for requests with header x-llm-d-inference-objective: batch"},
		{"InferenceObjective llm/interactive", 3, true, "Accepted", "priority 10 (not sheddable)"},
		{"InferenceObjective llm/orphan", 2, false, "PoolNotFound", `InferencePool "vllm-lama", which does not exist`},
		{"InferenceObjective llm/standard", 1, true, "Accepted", "priority 0 (not sheddable)"},
		{"InferenceObjective llm/typo", 1, false, "InvalidSpec", `spec: unknown field "criticality"`},
	}
	require.Len(t, got, len(want), "%+v", got)
	for i := range want {
		assert.Equal(t, want[i].id, got[i].id)
		assert.Equal(t, want[i].gen, got[i].gen, want[i].id)
		assert.Equal(t, want[i].accepted, got[i].accepted, want[i].id)
		assert.Equal(t, want[i].reason, got[i].reason, want[i].id)
		assert.Contains(t, got[i].msg, want[i].msg, want[i].id)
	}
	assert.Equal(t, []string{`model "llama" is already rewritten by the older InferenceModelRewrite "llama-canary" (the oldest object wins)`},
		res.Verdicts[3].Conflicts, "the conflict is reported on the loser")
	assert.Len(t, res.Verdicts[2].Conflicts, 1, "the shadowed rule is reported on its object")

	// The table is a valid record, within the default bounds.
	_, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "node-1", PoolNamespace: "llm", PoolName: "vllm-llama", Table: res.Table}, wire.ConfigLimits{})
	require.NoError(t, err)
}

// TestBuildTableIgnoresOrder: every agent reads the objects in its own
// order and must build the same table.
func TestBuildTableIgnoresOrder(t *testing.T) {
	in := testTableInput(t)
	want := BuildTable(in, wire.ConfigLimits{})
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		rng.Shuffle(len(in.Objectives), func(i, j int) { in.Objectives[i], in.Objectives[j] = in.Objectives[j], in.Objectives[i] })
		rng.Shuffle(len(in.Rewrites), func(i, j int) { in.Rewrites[i], in.Rewrites[j] = in.Rewrites[j], in.Rewrites[i] })
		assert.Equal(t, want, BuildTable(in, wire.ConfigLimits{}))
	}
}

// TestBuildTableFitsEveryAgent: the table is built without knowing which
// agent sends it, and fits the record of any, also at the byte bound. A
// table sized for its agent's id fitted one agent's record and not
// another's: two versions of the table at once, at the same objects, which
// the receivers would take in turns.
func TestBuildTableFitsEveryAgent(t *testing.T) {
	in := testTableInput(t)
	for _, maxBytes := range []int{400, 500, 600, 800} {
		lim := wire.ConfigLimits{MaxBytes: maxBytes}
		res := BuildTable(in, lim)
		for _, agent := range []string{"n", strings.Repeat("n", wire.MaxObjectNameLen)} {
			_, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: agent, PoolNamespace: "llm", PoolName: "vllm-llama", Table: res.Table}, lim)
			assert.NoError(t, err, "MaxBytes %d, agent id of %d bytes", maxBytes, len(agent))
		}
	}
}

func TestBuildTableBounds(t *testing.T) {
	res := BuildTable(testTableInput(t), wire.ConfigLimits{MaxRewrites: 2, MaxObjectives: 2})
	assert.Equal(t, []string{"llama", "llama-chat"}, rewriteModels(res.Table), "the oldest objects fill the table")
	assert.Nil(t, res.Table.Default, "the younger object is rejected whole, its default rule too")
	assert.Equal(t, []wire.Objective{{Name: "batch", Priority: -5}, {Name: "interactive", Priority: 10}}, res.Table.Objectives)
	reasons := map[string]string{}
	for _, v := range res.Verdicts {
		reasons[v.ID()] = v.Reason + ": " + v.Message
	}
	assert.Contains(t, reasons["InferenceModelRewrite llm/adapters"], "TooLarge: its 1 models would take the table past its bounds (2 models")
	assert.Contains(t, reasons["InferenceObjective llm/standard"], "TooLarge: the table already holds 2 objectives")

	// A byte bound that only the oldest rewrite fits in (with room for the
	// longest agent id).
	lim := wire.ConfigLimits{MaxBytes: 450}
	res = BuildTable(testTableInput(t), lim)
	assert.Equal(t, []string{"llama", "llama-chat"}, rewriteModels(res.Table))
	b, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "node-1", PoolNamespace: "llm", PoolName: "vllm-llama", Table: res.Table}, lim)
	require.NoError(t, err, "the builder keeps the record within MaxBytes")
	assert.LessOrEqual(t, len(b), 450)

	// Names the receiver would refuse.
	res = BuildTable(testTableInput(t), wire.ConfigLimits{MaxModelNameLen: 9, MaxTargets: 1})
	for _, v := range res.Verdicts {
		reasons[v.ID()] = v.Reason + ": " + v.Message
	}
	assert.Contains(t, reasons["InferenceModelRewrite llm/llama-canary"], `InvalidSpec: spec.rules[0].matches[1].model.value "llama-chat": length 10 over the limit 9`)
	assert.Contains(t, reasons["InferenceModelRewrite llm/adapters"], "TooLarge: spec.rules[0] has 2 targets, at most 1")
}

func rewriteModels(t wire.ModelTable) []string {
	var out []string
	for _, rw := range t.Rewrites {
		out = append(out, rw.Model)
	}
	return out
}

func TestDecodeInferencePool(t *testing.T) {
	docs := k8sDocs(t, "pools.yaml")
	p, err := DecodeInferencePool(docs[0])
	require.NoError(t, err)
	assert.Equal(t, "llm", p.Namespace)
	assert.Equal(t, "vllm-llama", p.Name)
	assert.Equal(t, map[string]string{"app": "vllm-llama"}, p.Spec.Selector.MatchLabels)
	assert.Equal(t, []uint16{8000, 8001}, p.Ports())

	bad := k8sDocs(t, "bad-pools.yaml")
	for i, want := range []string{
		"InvalidSpec: spec.targetPorts is empty",
		"InvalidSpec: spec.targetPorts[1].number 70000 is out of range 1..65535",
		`InvalidSpec: spec.selector: unknown field "matchExpressions"`,
	} {
		_, err := DecodeInferencePool(bad[i])
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
	}
	_, err = DecodeInferencePool(k8sDocs(t, "objectives.yaml")[0])
	assert.ErrorContains(t, err, `apiVersion "llm-d.ai/v1alpha2" kind "InferenceObjective": want inference.networking.k8s.io/v1 InferencePool`)
}

// FuzzBuildTable: whatever the API server sends, the object decoders never
// panic, and the table built from it is a record the receiver accepts,
// within the limits.
func FuzzBuildTable(f *testing.F) {
	for _, file := range []string{"objectives.yaml", "rewrites.yaml", "pools.yaml", "bad-pools.yaml"} {
		for _, js := range k8sDocs(f, file) {
			f.Add(js)
		}
	}
	f.Fuzz(func(t *testing.T, js []byte) {
		_, _ = DecodeInferencePool(js)
		in := TableInput{PoolNamespace: "llm", PoolName: "vllm-llama", Pools: []string{"vllm-llama"},
			Objectives: [][]byte{js}, Rewrites: [][]byte{js, js}}
		lim := wire.ConfigLimits{MaxBytes: 4096}
		res := BuildTable(in, lim)
		_, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "node-1", PoolNamespace: "llm", PoolName: "vllm-llama", Table: res.Table}, lim)
		require.NoError(t, err)
		for _, v := range res.Verdicts {
			require.NotEmpty(t, v.Reason)
		}
	})
}
