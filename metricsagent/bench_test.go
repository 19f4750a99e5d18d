package metricsagent

import (
	"context"
	"testing"
)

// BenchmarkScrape is one scrape of the 26 KB vLLM v1 golden page from a
// loopback server: HTTP round trip, capped read, filter and parse. The
// server's CPU is in the same process and included.
func BenchmarkScrape(b *testing.B) {
	pod := newPodServer(b, serveText(golden(b, "vllm-v1.txt")))
	s := &Scraper{Client: NewScrapeClient(), Timeout: 5e9, MaxBodyBytes: 4 << 20, Names: DefaultMetricNames()}
	url := pod.target("llm", "a").URL
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Scrape(context.Background(), url); err != nil {
			b.Fatal(err)
		}
	}
}
