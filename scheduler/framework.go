package scheduler

// The framework: a Profile runs ordered Filters, then weighted Scorers, then
// one Picker over the candidates of one cycle. Candidates are pointers into
// the cycle's Snapshot; plugins never copy or modify endpoint metrics.
//
// Interfaces are deliberately small and allocation-free: filters append
// into a buffer the caller owns, scorers write into a slice the caller owns,
// pickers return an index.

// Plugin is anything a profile is built from.
type Plugin interface {
	// Name is the instance name given in the configuration (for a plugin
	// referenced by type only, the type name).
	Name() string
}

// Filter is a hard requirement. It appends to dst (which it may assume is
// empty and never aliases candidates) the candidates that pass, and
// returns the extended slice. Keeping nothing is a normal outcome, not an
// error: the profile then reports NoEndpoint (or Dropped if the filter
// called Cycle.Drop).
type Filter interface {
	Plugin
	Filter(c *Cycle, dst, candidates []*Endpoint) []*Endpoint
}

// Scorer is a soft preference. It writes into scores[i] a value in [0,1]
// for candidates[i] (len(scores) == len(candidates) > 0); higher is better.
// Weights are the profile's business, not the scorer's. Values outside
// [0,1] (or NaN) are clamped by the profile.
type Scorer interface {
	Plugin
	Score(c *Cycle, candidates []*Endpoint, scores []float64)
}

// Picker chooses one candidate and returns its index. candidates is never
// empty. scores holds the weighted mean of the profile's scorers per
// candidate (in [0,1]), or is nil when the profile has no scorers.
type Picker interface {
	Plugin
	Pick(c *Cycle, candidates []*Endpoint, scores []float64) int
}

// PathLister is implemented by plugins that set Cycle.SetPath; Paths lists
// every value they may set, so callers can pre-create one counter per path.
type PathLister interface {
	Paths() []string
}

// NonEmptyFilter marks filters that keep at least one candidate of any
// non-empty input (the "least" band filters). A decision tree uses it to
// leave routes where such a row fails out of its path list.
type NonEmptyFilter interface {
	Filter
	KeepsAtLeastOne()
}

// WeightedScorer is a scorer with its weight in one profile.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// Profile is one scheduling recipe: filters in order, then weighted
// scorers, then a picker.
type Profile struct {
	Name    string
	Filters []Filter
	Scorers []WeightedScorer
	Picker  Picker

	weightSum float64
	// fast decides on the Scheduler's index when the profile's plugins
	// allow it (fastpath.go); nil otherwise.
	fast fastPath
	// fastFlat: fast also decides on the index's values alone (fastflat.go).
	fastFlat bool
	// fused decides the prefix-aware shape without the index
	// (fusedprefix.go); nil otherwise.
	fused *fusedPrefix
}

// Paths lists the Result.Path values a cycle run by this profile can
// report: the paths declared by its filters, or the profile name.
func (p *Profile) Paths() []string {
	var paths []string
	for _, f := range p.Filters {
		if pl, ok := f.(PathLister); ok {
			paths = append(paths, pl.Paths()...)
		}
	}
	return append(paths, p.Name)
}

// clamp01 maps a scorer's output into [0,1]; NaN counts as 0 so one broken
// scorer cannot make a candidate win.
func clamp01(v float64) float64 {
	if v > 1 {
		return 1
	}
	if v >= 0 {
		return v
	}
	return 0 // negative or NaN
}
