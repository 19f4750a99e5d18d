package metricsagent

import (
	"context"
	"testing"
)

// BenchmarkScrape is one scrape of the vLLM v1 golden page from a loopback
// server: HTTP round trip, capped read, filter and parse. The server's CPU
// is in the same process and included. "whole-page" reads all 26 KB;
// "name-filter" asks for the five families with name[] and the server
// answers as vLLM's prometheus_client does.
func BenchmarkScrape(b *testing.B) {
	for _, tc := range []struct {
		name string
		ask  bool
	}{{"whole-page", false}, {"name-filter", true}} {
		b.Run(tc.name, func(b *testing.B) {
			pod := newPodServer(b, restrictedPage(golden(b, "vllm-v1.txt"), nil))
			s := &Scraper{Timeout: 5e9, MaxBodyBytes: 4 << 20, Names: DefaultMetricNames(), AskForNames: tc.ask}
			ps, err := s.ForURL(s.URL(pod.target("llm", "a").URL))
			if err != nil {
				b.Fatal(err)
			}
			defer ps.Close()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ps.Scrape(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
