package scheduler

var (
	_ Picker = (*RandomPicker)(nil)
	_ Picker = (*MaxScorePicker)(nil)
	_ Picker = (*WeightedRandomPicker)(nil)
	_ Picker = (*RoundRobinPicker)(nil)
)

// RandomPicker picks uniformly among the candidates, ignoring scores: the
// seed's final step ("random among survivors").
type RandomPicker struct {
	PluginName string
}

func (p *RandomPicker) Name() string { return p.PluginName }

func (p *RandomPicker) Pick(c *Cycle, candidates []*Endpoint, _ []float64) int {
	return c.Rand.IntN(len(candidates))
}

// MaxScorePicker picks the candidate with the highest score, uniformly at
// random among exact ties (so equal endpoints share load instead of the
// first one taking everything). Without scores it picks at random.
type MaxScorePicker struct {
	PluginName string
}

func (p *MaxScorePicker) Name() string { return p.PluginName }

func (p *MaxScorePicker) Pick(c *Cycle, candidates []*Endpoint, scores []float64) int {
	if scores == nil {
		return c.Rand.IntN(len(candidates))
	}
	return maxScoreIndex(c, scores)
}

// maxScoreIndex is MaxScorePicker's choice among scores (not empty).
func maxScoreIndex(c *Cycle, scores []float64) int {
	best, ties := scores[0], 1
	for _, s := range scores[1:] {
		switch {
		case s > best:
			best, ties = s, 1
		case s == best:
			ties++
		}
	}
	k := 0
	if ties > 1 {
		k = c.Rand.IntN(ties)
	}
	for i, s := range scores {
		if s == best {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return 0 // unreachable: best is one of scores
}

// WeightedRandomPicker picks candidate i with probability proportional to
// its score (roulette wheel, one random draw). Zero-score candidates are
// never picked unless every score is zero, in which case it picks
// uniformly. Upstream's weighted-random picker draws the same distribution
// with A-Res keys; for a single pick the wheel is cheaper.
type WeightedRandomPicker struct {
	PluginName string
}

func (p *WeightedRandomPicker) Name() string { return p.PluginName }

func (p *WeightedRandomPicker) Pick(c *Cycle, candidates []*Endpoint, scores []float64) int {
	if scores == nil {
		return c.Rand.IntN(len(candidates))
	}
	var sum float64
	for _, s := range scores {
		sum += s
	}
	if !(sum > 0) {
		return c.Rand.IntN(len(candidates))
	}
	r := c.Rand.Float64() * sum
	last := 0
	for i, s := range scores {
		if s <= 0 {
			continue
		}
		last = i
		if r < s {
			return i
		}
		r -= s
	}
	return last // rounding left r just above the final weight
}

// RoundRobinPicker cycles through the candidates by position, ignoring
// scores. Its counter lives in the plugin instance, so it rotates across
// requests of one Scheduler; with a stable candidate list it is the classic
// round-robin balancer.
type RoundRobinPicker struct {
	PluginName string
	next       uint64
}

func (p *RoundRobinPicker) Name() string { return p.PluginName }

func (p *RoundRobinPicker) Pick(_ *Cycle, candidates []*Endpoint, _ []float64) int {
	i := int(p.next % uint64(len(candidates)))
	p.next++
	return i
}
