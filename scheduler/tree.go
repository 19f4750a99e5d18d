package scheduler

import (
	"fmt"
	"strings"
)

// TreeParams are the seed's four thresholds (upstream read them from
// environment variables).
type TreeParams struct {
	// LoRAAffinityThreshold is the probability of keeping the affinity
	// group when both LoRA groups exist. Default 0.999.
	LoRAAffinityThreshold float64 `json:"loraAffinityThreshold"`
	// QueueingThresholdLoRA is the low-queue limit. Default 128.
	QueueingThresholdLoRA int `json:"queueingThresholdLoRA"`
	// QueueThresholdCritical is the waiting-queue limit of has-capacity.
	// Default 5.
	QueueThresholdCritical int `json:"queueThresholdCritical"`
	// KVCacheThreshold is the KV-cache limit of has-capacity. Default 0.8.
	KVCacheThreshold float64 `json:"kvCacheThreshold"`
}

// DefaultTreeParams returns the seed's defaults.
func DefaultTreeParams() TreeParams {
	return TreeParams{
		LoRAAffinityThreshold:  DefaultLoRAAffinityThreshold,
		QueueingThresholdLoRA:  DefaultQueueingThresholdLoRA,
		QueueThresholdCritical: DefaultQueueThresholdCritical,
		KVCacheThreshold:       DefaultKVCacheThreshold,
	}
}

func (p TreeParams) validate() error {
	switch {
	case !(p.LoRAAffinityThreshold >= 0 && p.LoRAAffinityThreshold <= 1):
		return fieldErr("loraAffinityThreshold", "must be in [0,1]")
	case p.QueueingThresholdLoRA < 0:
		return fieldErr("queueingThresholdLoRA", "must be >= 0")
	case p.QueueThresholdCritical < 0:
		return fieldErr("queueThresholdCritical", "must be >= 0")
	case !(p.KVCacheThreshold >= 0 && p.KVCacheThreshold <= 1):
		return fieldErr("kvCacheThreshold", "must be in [0,1]")
	}
	return nil
}

// Terminal targets of a TreeStep: Done ends the tree with the current
// candidates; Drop ends it by shedding the request (429).
const (
	Done = "done"
	Drop = "drop"
)

// TreeStep is one row of a decision tree: run Filter on the current
// candidates; if it keeps any, they become the current candidates and the
// tree continues at OnSuccess; otherwise the current candidates stay as
// they were (upstream: "the original input will be passed to the next
// filter") and the tree continues at OnFailure.
//
// Name is the row's unique key. Its last '/'-separated segment is the
// row's label in decision paths, so rows that repeat a filter on another
// branch can share a label ("least-queue", "queued/least-queue").
type TreeStep struct {
	Name      string `json:"name"`
	Filter    Filter `json:"-"`
	OnSuccess string `json:"onSuccess"`
	OnFailure string `json:"onFailure"`
}

// TreeEntries name the first row per criticality.
type TreeEntries struct {
	Critical  string `json:"critical"`
	Standard  string `json:"standard"`
	Sheddable string `json:"sheddable"`
}

// SeedTree is the seed's algorithm (doc.go) as a flat table. Critical
// requests start at low-queue. Standard and Sheddable requests (upstream's
// non-critical path) first need an endpoint with capacity, else they are
// dropped; with capacity they take the critical route.
//
//	step                    filter          on success              on failure
//	capacity                has-capacity    low-queue               drop
//	low-queue               low-queue       lora-affinity           queued/least-queue
//	lora-affinity           lora-affinity   least-queue             least-queue
//	least-queue             least-queue     least-kv                least-kv
//	least-kv                least-kv-cache  done                    done
//	queued/least-queue      least-queue     queued/lora-affinity    queued/lora-affinity
//	queued/lora-affinity    lora-affinity   queued/least-kv         queued/least-kv
//	queued/least-kv         least-kv-cache  done                    done
//
// The profile's random picker then chooses among the survivors.
func SeedTree(p TreeParams) ([]TreeStep, TreeEntries) {
	var (
		capacity     = &HasCapacityFilter{PluginName: "has-capacity", QueueThreshold: p.QueueThresholdCritical, KVCacheThreshold: p.KVCacheThreshold}
		lowQueue     = &LowQueueFilter{PluginName: "low-queue", Threshold: p.QueueingThresholdLoRA}
		loraAffinity = &LoRAAffinityFilter{PluginName: "lora-affinity", Threshold: p.LoRAAffinityThreshold}
		leastQueue   = &LeastQueueFilter{PluginName: "least-queue"}
		leastKV      = &LeastKVCacheFilter{PluginName: "least-kv-cache"}
	)
	steps := []TreeStep{
		{"capacity", capacity, "low-queue", Drop},
		{"low-queue", lowQueue, "lora-affinity", "queued/least-queue"},
		{"lora-affinity", loraAffinity, "least-queue", "least-queue"},
		{"least-queue", leastQueue, "least-kv", "least-kv"},
		{"least-kv", leastKV, Done, Done},
		{"queued/least-queue", leastQueue, "queued/lora-affinity", "queued/lora-affinity"},
		{"queued/lora-affinity", loraAffinity, "queued/least-kv", "queued/least-kv"},
		{"queued/least-kv", leastKV, Done, Done},
	}
	return steps, TreeEntries{Critical: "low-queue", Standard: "capacity", Sheddable: "capacity"}
}

// DecisionTreeFilter runs a table of TreeSteps as one filter and records
// the route it took as the cycle's path.
//
// A path is the request's criticality ("critical", "standard",
// "sheddable") followed by one label per visited row: the row's label when
// its filter kept candidates; "no-"+label when it kept none and that
// changed the route (OnSuccess != OnFailure); nothing when it kept none
// and the route is the same either way. With the seed table the paths are:
//
//	critical/low-queue/lora-affinity/least-queue/least-kv
//	critical/low-queue/least-queue/least-kv            (no affinity, no free slot)
//	critical/no-low-queue/least-queue/lora-affinity/least-kv
//	critical/no-low-queue/least-queue/least-kv
//	standard/capacity/...  the four critical routes after "capacity"
//	standard/no-capacity                               (dropped)
//	sheddable/...          as standard
//	standard/admitted/...  the four critical routes: flow control admitted it
//	sheddable/admitted/... as standard/admitted
//
// A request flow control admitted (Request.Admitted) is never shed: it
// takes the critical entry, and its path names its own criticality then
// "admitted".
//
// Every route is enumerated when the tree is built (Paths), so the
// strings are shared and a decision allocates nothing.
type DecisionTreeFilter struct {
	name  string
	steps []TreeStep
	// nodes is the tree unrolled into routes: one node per (row, route so
	// far), terminals carrying the finished path.
	nodes []treeNode
	roots [3]int // per Criticality
	// admitted are the roots of admitted requests: the critical entry,
	// under their own criticality's name.
	admitted [3]int
	paths    []string
	bufs     [2][]*Endpoint
}

var _ Filter = (*DecisionTreeFilter)(nil)

type treeNode struct {
	step      int // index into steps; terminalDone or terminalDrop
	onSuccess int // node index
	onFailure int
	path      string // set on terminals
}

const (
	terminalDone = -1
	terminalDrop = -2
	// maxTreeNodes bounds the unrolled tree (one node per row on each
	// route that reaches it): a table that unrolls into more is a
	// configuration mistake, and its enumerated paths become metric
	// labels.
	maxTreeNodes = 4096
)

// NewDecisionTree checks the table (unique names, known targets, every
// entry present, no cycles) and unrolls it. Errors name the offending row
// as steps[i].
func NewDecisionTree(name string, steps []TreeStep, entries TreeEntries) (*DecisionTreeFilter, error) {
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		switch {
		case s.Name == "":
			return nil, fieldErr(fmt.Sprintf("steps[%d].name", i), "must not be empty")
		case s.Name == Done || s.Name == Drop:
			return nil, fieldErr(fmt.Sprintf("steps[%d].name", i), fmt.Sprintf("%q is reserved", s.Name))
		case s.Filter == nil:
			return nil, fieldErr(fmt.Sprintf("steps[%d].filter", i), "required")
		}
		if _, dup := index[s.Name]; dup {
			return nil, fieldErr(fmt.Sprintf("steps[%d].name", i), fmt.Sprintf("duplicate step %q", s.Name))
		}
		index[s.Name] = i
	}
	target := func(field, next string) (int, error) {
		switch next {
		case Done:
			return terminalDone, nil
		case Drop:
			return terminalDrop, nil
		}
		if i, ok := index[next]; ok {
			return i, nil
		}
		return 0, fieldErr(field, fmt.Sprintf("unknown step %q (want a step name, %q or %q)", next, Done, Drop))
	}
	next := make([][2]int, len(steps))
	for i, s := range steps {
		var err error
		if next[i][0], err = target(fmt.Sprintf("steps[%d].onSuccess", i), s.OnSuccess); err != nil {
			return nil, err
		}
		if next[i][1], err = target(fmt.Sprintf("steps[%d].onFailure", i), s.OnFailure); err != nil {
			return nil, err
		}
	}
	t := &DecisionTreeFilter{name: name, steps: steps}
	b := treeBuilder{t: t, steps: steps, next: next, onPath: make([]bool, len(steps)), seen: map[string]bool{}}
	for c, entry := range []string{entries.Critical, entries.Standard, entries.Sheddable} {
		crit := Criticality(c)
		field := "entries." + strings.ToLower(crit.String())
		if entry == "" {
			return nil, fieldErr(field, "required")
		}
		row, err := target(field, entry)
		if err != nil {
			return nil, err
		}
		if row < 0 {
			return nil, fieldErr(field, "must name a step")
		}
		if t.roots[c], err = b.build(row, strings.ToLower(crit.String())); err != nil {
			return nil, err
		}
	}
	// Admitted routes come after the others, so the paths of a tree
	// keep their order.
	t.admitted[Critical] = t.roots[Critical]
	criticalRow, _ := target("entries.critical", entries.Critical)
	for _, crit := range []Criticality{Standard, Sheddable} {
		var err error
		if t.admitted[crit], err = b.build(criticalRow, strings.ToLower(crit.String())+"/admitted"); err != nil {
			return nil, err
		}
	}
	return t, nil
}

type treeBuilder struct {
	t      *DecisionTreeFilter
	steps  []TreeStep
	next   [][2]int
	onPath []bool
	seen   map[string]bool
}

// build unrolls the routes starting at row with the path so far, returning
// the node index.
func (b *treeBuilder) build(row int, path string) (int, error) {
	if len(b.t.nodes) >= maxTreeNodes {
		return 0, fieldErr("steps", fmt.Sprintf("the table unrolls into more than %d nodes (a node per row on each route to it); simplify it", maxTreeNodes))
	}
	if row < 0 {
		b.t.nodes = append(b.t.nodes, treeNode{step: row, path: path})
		if !b.seen[path] {
			b.seen[path] = true
			b.t.paths = append(b.t.paths, path)
		}
		return len(b.t.nodes) - 1, nil
	}
	if b.onPath[row] {
		return 0, fieldErr("steps", fmt.Sprintf("cycle through step %q", b.steps[row].Name))
	}
	b.onPath[row] = true
	defer func() { b.onPath[row] = false }()

	n := len(b.t.nodes)
	b.t.nodes = append(b.t.nodes, treeNode{step: row})
	label := b.steps[row].Name
	if i := strings.LastIndexByte(label, '/'); i >= 0 {
		label = label[i+1:]
	}
	succ, err := b.build(b.next[row][0], path+"/"+label)
	if err != nil {
		return 0, err
	}
	if _, keepsOne := b.steps[row].Filter.(NonEmptyFilter); keepsOne {
		// Inside a tree the current candidates are never empty, so this
		// row cannot fail: leave its impossible routes out of Paths.
		b.t.nodes[n].onSuccess, b.t.nodes[n].onFailure = succ, succ
		return n, nil
	}
	failPath := path
	if b.next[row][0] != b.next[row][1] {
		failPath = path + "/no-" + label
	}
	fail, err := b.build(b.next[row][1], failPath)
	if err != nil {
		return 0, err
	}
	b.t.nodes[n].onSuccess, b.t.nodes[n].onFailure = succ, fail
	return n, nil
}

func (t *DecisionTreeFilter) Name() string { return t.name }

// Paths lists every path the tree can set, in table order.
func (t *DecisionTreeFilter) Paths() []string { return t.paths }

func (t *DecisionTreeFilter) Filter(c *Cycle, dst, candidates []*Endpoint) []*Endpoint {
	if len(candidates) == 0 {
		return dst // nothing to decide; in particular no reason to shed
	}
	crit := c.Request.Criticality
	if crit < Critical || crit > Sheddable {
		crit = Sheddable // unknown importance is shed first
	}
	root := t.roots[crit]
	if c.Request.Admitted {
		root = t.admitted[crit]
	}
	node := &t.nodes[root]
	current, free := candidates, 0
	for node.step >= 0 {
		out := t.steps[node.step].Filter.Filter(c, t.bufs[free][:0], current)
		t.bufs[free] = out[:0] // keep any capacity the filter grew
		if c.dropped {
			return dst
		}
		if len(out) > 0 {
			current, free = out, free^1
		}
		node = t.advance(node, len(out) > 0)
	}
	if t.end(c, node) {
		return dst
	}
	return append(dst, current...)
}

// advance returns the node that follows node when its row kept
// candidates, or did not.
func (t *DecisionTreeFilter) advance(node *treeNode, kept bool) *treeNode {
	if kept {
		return &t.nodes[node.onSuccess]
	}
	return &t.nodes[node.onFailure]
}

// end records terminal node's route as c's path, and the drop when it is
// one; it reports whether the request was dropped.
func (t *DecisionTreeFilter) end(c *Cycle, node *treeNode) bool {
	c.SetPath(node.path)
	if node.step == terminalDrop {
		c.Drop()
		return true
	}
	return false
}
