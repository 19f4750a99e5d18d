package metricsagent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
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

// BenchmarkSweep is one cycle's Sweep over 100 loopback pods serving the
// whole vLLM v1 page with changing values, in this process: "cpu-µs/pod"
// is the process's CPU (agent side and the 100 servers together) per pod
// and cycle, from getrusage, which moves with the agent's share when the
// servers' work is the same.
func BenchmarkSweep(b *testing.B) {
	live := livePage(golden(b, "vllm-v1.txt"))
	const pods, variants = 100, 16
	var pages [variants][]byte
	for i := range pages {
		pages[i] = live(int64(i))
	}
	s := &Scraper{Timeout: 5 * time.Second, MaxBodyBytes: 4 << 20, Names: DefaultMetricNames()}
	var scrapers []*PodScraper
	var n atomic.Int64
	for range pods {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			body := pages[n.Add(1)%variants]
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			_, _ = w.Write(body)
		}))
		b.Cleanup(srv.Close)
		ps, err := s.ForURL(srv.URL + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(ps.Close)
		scrapers = append(scrapers, ps)
	}
	out := make([]Scraped, pods)
	s.Sweep(context.Background(), scrapers, time.Now().Add(5*time.Second), out) // connect
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.ReportAllocs()
	for b.Loop() {
		s.Sweep(context.Background(), scrapers, time.Now().Add(5*time.Second), out)
		for i := range out {
			if out[i].Err != nil {
				b.Fatal(out[i].Err)
			}
		}
	}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*pods), "cpu-µs/pod")
}
