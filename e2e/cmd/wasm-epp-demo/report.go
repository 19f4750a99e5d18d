package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// summary is what the demo prints at the end.
type summary struct {
	Sending  time.Duration // how long requests were being sent
	Elapsed  time.Duration // until the last answer
	Total    int
	OK       int
	Dropped  int // 429
	Skipped  int // never sent: client-side in-flight cap
	Errors   map[string]int
	Latency  []time.Duration // successful requests, sorted
	TTFT     []time.Duration // successful streams, sorted
	Replicas map[string]int  // successful requests per replica
	Models   map[string]*modelStats
	Hits     int
	Misses   int
	// PromptTokens and CachedTokens sum the usage of the successful
	// responses that reported cached tokens (Reported of them).
	PromptTokens, CachedTokens int64
	Reported                   int
}

type modelStats struct {
	Criticality string
	Requests    int
	OK          int
	Dropped     int
	Failed      int
	Replicas    map[string]int // successful requests per replica
	Hits        int
	Misses      int
}

func summarize(results []result, sending, elapsed time.Duration, skipped int) summary {
	s := summary{Sending: sending, Elapsed: elapsed, Total: len(results), Skipped: skipped, Errors: map[string]int{},
		Replicas: map[string]int{}, Models: map[string]*modelStats{}}
	for _, r := range results {
		m := s.Models[r.Model]
		if m == nil {
			m = &modelStats{Criticality: r.Criticality, Replicas: map[string]int{}}
			s.Models[r.Model] = m
		}
		m.Requests++
		switch {
		case r.Status == http.StatusOK && r.ErrType == "":
			s.OK++
			m.OK++
			s.Latency = append(s.Latency, r.Latency)
			if r.Stream {
				s.TTFT = append(s.TTFT, r.TTFT)
			}
			name := replicaName(r)
			s.Replicas[name]++
			m.Replicas[name]++
			if r.CachedTokens >= 0 {
				s.Reported++
				s.PromptTokens += int64(r.PromptTokens)
				s.CachedTokens += int64(min(r.CachedTokens, r.PromptTokens))
			}
		case r.Status == http.StatusTooManyRequests:
			s.Dropped++
			m.Dropped++
		default:
			m.Failed++
			key := r.ErrType
			if r.Status != 0 {
				key = fmt.Sprintf("%d %s", r.Status, r.ErrType)
			}
			s.Errors[key]++
		}
		switch r.Hit {
		case hitYes:
			s.Hits++
			m.Hits++
		case hitNo:
			s.Misses++
			m.Misses++
		}
	}
	slices.Sort(s.Latency)
	slices.Sort(s.TTFT)
	return s
}

func replicaName(r result) string {
	switch {
	case r.Endpoint != "" && r.Replica != "":
		return r.Endpoint + " (" + r.Replica + ")"
	case r.Endpoint != "":
		return r.Endpoint
	case r.Replica != "":
		return r.Replica
	}
	return "(unnamed)"
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func pct(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

func (s summary) write(w io.Writer) {
	rate := 0.0
	if s.Sending > 0 {
		rate = float64(s.Total) / s.Sending.Seconds()
	}
	failed := 0
	for _, n := range s.Errors {
		failed += n
	}
	fmt.Fprintf(w, "\nSummary: %d requests sent over %s (%.1f req/s), all answered after %s: %d ok, %d dropped (429), %d failed",
		s.Total, round(s.Sending), rate, round(s.Elapsed), s.OK, s.Dropped, failed)
	if s.Skipped > 0 {
		fmt.Fprintf(w, ", %d not sent (client in-flight cap)", s.Skipped)
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "\nLatency of successful requests (end to end):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tp50\tp90\tp99\tmax\t")
	row := func(name string, v []time.Duration) {
		if len(v) == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t\n", name)
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", name, len(v), round(percentile(v, 50)), round(percentile(v, 90)),
			round(percentile(v, 99)), round(v[len(v)-1]))
	}
	row("all", s.Latency)
	row("time to first token (streams)", s.TTFT)
	tw.Flush()

	fmt.Fprintln(w, "\nRequests per replica (successful):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, name := range sortedKeys(s.Replicas) {
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", name, s.Replicas[name], pct(s.Replicas[name], s.OK))
	}
	tw.Flush()

	fmt.Fprintln(w, "\nRequests per model / adapter:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  model\tcriticality\tsent\tok\t429\tfailed\tadapter hits\tspread over replicas")
	names := sortedKeys(s.Models)
	for _, name := range names {
		m := s.Models[name]
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", name, m.Criticality, m.Requests, m.OK, m.Dropped, m.Failed,
			pct(m.Hits, m.Hits+m.Misses), spread(m.Replicas))
	}
	tw.Flush()

	fmt.Fprintf(w, "\nAdapter hit rate: %s of %d judged adapter requests went to a replica already running or queuing that adapter\n",
		pct(s.Hits, s.Hits+s.Misses), s.Hits+s.Misses)
	fmt.Fprintln(w, "  (judged by the demo's own scrape of the replica's /metrics just before the request was sent; a miss needed a free adapter slot)")

	if s.Reported > 0 {
		fmt.Fprintf(w, "\nPrefix cache hit rate: %.1f%% of %d prompt tokens were served from the replicas' prefix caches (usage.prompt_tokens_details.cached_tokens of %d responses)\n",
			100*float64(s.CachedTokens)/float64(max(s.PromptTokens, 1)), s.PromptTokens, s.Reported)
	} else {
		fmt.Fprintln(w, "\nPrefix cache hit rate: not reported (the replicas sent no cached_tokens)")
	}

	fmt.Fprintf(w, "\nDrops: %d requests answered 429 (sheddable requests while every replica was saturated)\n", s.Dropped)
	if failed > 0 {
		fmt.Fprintln(w, "Failures by kind:")
		for _, k := range sortedKeys(s.Errors) {
			fmt.Fprintf(w, "  %6d  %s\n", s.Errors[k], k)
		}
	}
}

// spread shows how a model's successful requests split over replicas, the
// largest share first, by the replica's port (short enough for one line).
func spread(by map[string]int) string {
	type kv struct {
		k string
		n int
	}
	var all []kv
	total := 0
	for k, n := range by {
		all = append(all, kv{k, n})
		total += n
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].k < all[j].k })
	var parts []string
	for _, e := range all {
		name := e.k
		if i := strings.IndexByte(name, ' '); i > 0 {
			name = name[:i]
		}
		if i := strings.LastIndexByte(name, ':'); i >= 0 {
			name = name[i:]
		}
		parts = append(parts, fmt.Sprintf("%s %.0f%%", name, 100*float64(e.n)/float64(total)))
	}
	return strings.Join(parts, " ")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
