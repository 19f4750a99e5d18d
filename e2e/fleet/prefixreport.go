package fleet

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// prefixComparators are the policies whose p90 TTFT the prefix targets
// divide by prefix-aware's, in the columns of prefixSweep.
var prefixComparators = []struct {
	title    string
	policies []string // the best (lowest p90 TTFT) of these
}{
	{"per-VM index", []string{PolicyPrefixPerVM}},
	{"llm-d-style", []string{PolicyLLMDApproximate}},
	{"Higress-style", []string{PolicyHigressApprox}},
	{"best of least-request, decision-tree, scoring", []string{scheduler.ProfileLeastRequest, scheduler.ProfileDecisionTree, scheduler.ProfileScoring}},
	{"least-request", []string{scheduler.ProfileLeastRequest}},
	{"round-robin", []string{scheduler.ProfileRoundRobin}},
}

// prefixSweep tabulates, for every scenario with shared prefixes, the
// issue's prefix targets at every swept load rather than at the knee
// alone: each comparator's p90 TTFT over prefix-aware's, prefix-aware's
// over the oracle's, and the floor no router can go under.
func (rep *Report) prefixSweep() string {
	var b strings.Builder
	for i := range rep.Results {
		sr := &rep.Results[i]
		if !sr.Scenario.SharesPrefixes() || len(sr.runsOf(PolicyPrefixAware)) == 0 {
			continue
		}
		var cols []int
		for k, c := range prefixComparators {
			for _, p := range c.policies {
				if len(sr.runsOf(p)) > 0 {
					cols = append(cols, k)
					break
				}
			}
		}
		fmt.Fprintf(&b, "(%s): p90 TTFT of each policy over prefix-aware's (above 1: prefix-aware is better)", sr.Scenario.Name)
		if floor, what := ttftFloor(sr.Scenario); floor > 0 {
			fmt.Fprintf(&b, "; **floor %s**: %s, so no p90 TTFT of any router is below it, and a ratio of 3 is out of reach wherever the comparator's p90 is under 3 × %s", fmtDur(floor), what, fmtDur(floor))
		}
		b.WriteString(".\n\n| load | prefix-aware p90 TTFT |")
		for _, k := range cols {
			fmt.Fprintf(&b, " %s |", prefixComparators[k].title)
		}
		b.WriteString(" prefix-aware / oracle |\n|---:|---:|")
		b.WriteString(strings.Repeat("---:|", len(cols)+1) + "\n")
		for _, load := range rep.Config.Loads {
			ours := sr.run(PolicyPrefixAware, load)
			if ours == nil {
				continue
			}
			fmt.Fprintf(&b, "| %.0f%% | %s |", 100*load, fmtDur(ours.TTFT.P90))
			for _, k := range cols {
				best := time.Duration(math.MaxInt64)
				for _, p := range prefixComparators[k].policies {
					if r := sr.run(p, load); r != nil {
						best = min(best, r.TTFT.P90)
					}
				}
				if best == math.MaxInt64 {
					b.WriteString(" — |")
					continue
				}
				fmt.Fprintf(&b, " %.2f× |", ratio(best, ours.TTFT.P90))
			}
			if o := sr.run(Oracle, load); o != nil {
				fmt.Fprintf(&b, " %.2f× |\n", ratio(ours.TTFT.P90, o.TTFT.P90))
			} else {
				b.WriteString(" — |\n")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// ttftFloor is a time to first token no router can beat for the p90
// request of sc: its tokens that no cache can hold (those after the
// shared part, plus the shared part's partial last block), prefilled in
// one step on an idle replica (vllmsim's step time, with one adapter's
// slowdown where requests name adapters). 0 for traffic it does not know.
func ttftFloor(sc Scenario) (time.Duration, string) {
	cfg := sc.Replica
	var tokens int
	var what string
	lora := 1.0
	switch t := sc.Traffic.(type) {
	case SharedContexts:
		tokens = int(math.Round(t.Question.Quantile(0.9))) + t.ContextTokens%cfg.BlockSize
		what = fmt.Sprintf("the p90 question (%d new tokens) prefilled on an idle replica that holds its context", tokens)
	case SystemPrompts:
		tokens = int(math.Round(t.Input.Quantile(0.9))) + t.SystemTokens%cfg.BlockSize
		lora += cfg.LoRASlowdownPerAdapter
		what = fmt.Sprintf("the p90 user text (%d new tokens) prefilled on an idle replica that holds its system prompt and runs its adapter", tokens)
	default:
		return 0, ""
	}
	// The idle step has no decoding sequences; a prompt longer than the
	// step's token budget takes one step per budget's worth.
	var d time.Duration
	for left := tokens; left > 0; left -= cfg.MaxNumBatchedTokens {
		d += cfg.Profile.StepTime(min(left, cfg.MaxNumBatchedTokens), 0, 0)
	}
	return time.Duration(float64(d) * lora), what
}
