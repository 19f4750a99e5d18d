// Command wasm-epp-demo is `make demo`: a short mixed load against the local
// stack, with a progress line on the terminal, then a summary: requests per
// replica and per model/adapter, the adapter hit rate, latency percentiles
// and drops.
//
// It sends to a running stack (`make run` in another terminal) when one
// answers at --url; otherwise it starts the same stack itself from bin/ and
// stops it at the end (--start never/always changes that).
//
// The load is open loop: Poisson arrivals whose rate ramps from a tenth of
// --rate up to --rate, over the models of the router configuration (base
// model, every adapter with a few hot and the rest cold, the traffic-split
// name), ShareGPT-like prompt and output lengths, some chat, some streamed.
// The same --seed gives the same requests.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

func main() {
	err := run(os.Args[1:], os.Stdout)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "wasm-epp-demo:", err)
		os.Exit(1)
	}
}

type options struct {
	url, start, binDir, bootstrap, replicas string
	duration, drain, scrapeEvery            time.Duration
	rate, ramp, streamFrac, chatFrac        float64
	timeScale                               float64
	maxInflight, maxRequests                int
	seed                                    uint64
	progress                                string
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("wasm-epp-demo", flag.ContinueOnError)
	fs.StringVar(&o.url, "url", "http://localhost:10000", "gateway base URL")
	fs.StringVar(&o.start, "start", "auto", "auto (start the local stack if nothing answers at --url) | always | never")
	fs.StringVar(&o.binDir, "bin", "", "binaries for a self-started stack (default: this program's directory)")
	fs.StringVar(&o.bootstrap, "config", "", "Envoy bootstrap whose router configuration gives the models (default: envoy/envoy.yaml)")
	fs.StringVar(&o.replicas, "replicas", "", "comma-separated replica host:port to scrape for the hit rate (default: learned from the served-by header)")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long to send")
	fs.DurationVar(&o.drain, "drain", 60*time.Second, "how long to wait for in-flight requests after sending stops")
	fs.Float64Var(&o.rate, "rate", 40, "peak arrival rate, requests per second")
	fs.Float64Var(&o.ramp, "ramp", 0.5, "fraction of --duration spent ramping from rate/10 up to --rate")
	fs.Float64Var(&o.streamFrac, "stream", 0.3, "fraction of streamed (SSE) requests")
	fs.Float64Var(&o.chatFrac, "chat", 0.3, "fraction of /v1/chat/completions requests")
	fs.IntVar(&o.maxInflight, "max-inflight", 2000, "requests in flight at most (later arrivals are counted as not sent)")
	fs.IntVar(&o.maxRequests, "requests", 0, "stop after this many requests (0: no cap)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the request stream")
	fs.Float64Var(&o.timeScale, "time-scale", 1, "time scale of a self-started stack's replicas")
	fs.DurationVar(&o.scrapeEvery, "scrape-interval", 100*time.Millisecond, "how often the demo scrapes replicas for the hit rate")
	fs.StringVar(&o.progress, "progress", "auto", "auto (a live line on a terminal, else a line every 5s) | line | off")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: wasm-epp-demo [flags]\n\nDrives a short mixed load through the wasm-epp gateway and summarizes where it went.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	case o.rate <= 0:
		return o, errors.New("--rate must be positive")
	case o.ramp < 0 || o.ramp > 1:
		return o, errors.New("--ramp must be in [0,1]")
	case o.duration <= 0:
		return o, errors.New("--duration must be positive")
	case o.maxInflight < 1:
		return o, errors.New("--max-inflight must be at least 1")
	}
	switch o.start {
	case "auto", "always", "never":
	default:
		return o, fmt.Errorf("--start %q: want auto, always or never", o.start)
	}
	switch o.progress {
	case "auto", "line", "off":
	default:
		return o, fmt.Errorf("--progress %q: want auto, line or off", o.progress)
	}
	return o, nil
}

// reachable reports whether something accepts connections at the URL's
// host:port (any HTTP answer counts: the stack may be warming up).
func reachable(base string) bool {
	req, err := http.NewRequest(http.MethodGet, strings.TrimRight(base, "/")+"/v1/models", nil)
	if err != nil {
		return false
	}
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func run(args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	if o.binDir == "" {
		if o.binDir, err = stack.ExecutableDir(); err != nil {
			return err
		}
	}
	if o.bootstrap == "" {
		if o.bootstrap, err = stack.FindBootstrap(o.binDir); err != nil {
			return err
		}
	}
	tmpl, err := os.ReadFile(o.bootstrap)
	if err != nil {
		return err
	}
	info, err := stack.InspectBootstrap(tmpl)
	if err != nil {
		return fmt.Errorf("%s: %w", o.bootstrap, err)
	}

	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()

	base := strings.TrimRight(o.url, "/")
	var known []string
	if o.replicas != "" {
		known = strings.Split(o.replicas, ",")
	}
	if o.start == "always" || (o.start == "auto" && !reachable(base)) {
		cfg, err := stack.LocalConfig(o.binDir, o.bootstrap)
		if err != nil {
			return err
		}
		cfg.TimeScale = o.timeScale
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(out, "  "+format+"\n", args...) }
		fmt.Fprintf(out, "Nothing answers at %s: starting the local stack (as make run does)...\n", base)
		s, err := stack.Start(ctx, cfg)
		if err != nil {
			return fmt.Errorf("starting the stack: %w", err)
		}
		defer s.Stop()
		base = s.ClientURL()
		known = nil
		for _, r := range s.Replicas() {
			known = append(known, r.Addr)
		}
		go func() {
			// A stack process dying mid-demo shows up as failed requests;
			// say which one.
			if e, ok := <-s.Failed(); ok {
				fmt.Fprintf(out, "\n%v\n", e)
			}
		}()
	} else if o.start == "never" && !reachable(base) {
		return fmt.Errorf("nothing answers at %s (start it with make run, or use --start auto)", base)
	}

	mix := buildMix(info.Router, stack.DefaultModel)
	jobs := plan(loadShape{Duration: o.duration, Peak: o.rate, Ramp: o.ramp, MaxJobs: o.maxRequests,
		StreamFrac: o.streamFrac, ChatFrac: o.chatFrac, Seed: o.seed}, mix)
	adapters := map[string]bool{}
	for _, a := range stack.Adapters(info.Router, stack.DefaultModel) {
		adapters[a] = true
	}
	servedBy := info.Router.ServedByHeader
	if servedBy == "" {
		fmt.Fprintln(out, "note: the router configuration sets no servedByHeader; replicas are named by the simulator's header and the hit rate is not judged")
	}

	sc := newScraper(o.scrapeEvery, o.duration+o.drain+10*time.Second)
	for _, k := range known {
		sc.observe(strings.TrimSpace(k))
	}
	scrapeCtx, stopScrape := context.WithCancel(context.Background())
	defer stopScrape()
	go sc.run(scrapeCtx)

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = o.maxInflight
	tr.MaxIdleConnsPerHost = o.maxInflight
	tr.DisableCompression = true
	tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	d := &driver{client: &http.Client{Transport: tr}, base: base, servedBy: servedBy, adapters: adapters,
		scraper: sc, maxInflight: int64(o.maxInflight)}

	fmt.Fprintf(out, "Sending %d requests over %s to %s (peak %.0f req/s; %d models; seed %d). Ctrl-C stops early.\n",
		len(jobs), o.duration, base, o.rate, len(mix), o.seed)
	start := time.Now()
	stopProgress := startProgress(out, o.progress, d, start, o.duration)
	sending := d.run(ctx, jobs, start, o.drain)
	elapsed := time.Since(start)
	stopProgress()
	stopScrape()

	summarize(d.snapshot(), sending, elapsed, int(d.skipped.Load())).write(out)
	if ctx.Err() != nil {
		fmt.Fprintln(out, "\n(interrupted)")
	}
	return nil
}

// startProgress shows counters while the load runs: a line rewritten in
// place on a terminal, else a plain line every 5 seconds.
func startProgress(out io.Writer, mode string, d *driver, start time.Time, duration time.Duration) (stop func()) {
	if mode == "off" {
		return func() {}
	}
	live := mode == "auto" && isTerminal(out)
	every := 5 * time.Second
	if live {
		every = 250 * time.Millisecond
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	line := func() string {
		el := time.Since(start)
		phase := "sending"
		if el > duration {
			phase = "draining"
		}
		return fmt.Sprintf("[%5.1fs/%s %s] sent %d  in flight %d  ok %d  429 %d  failed %d",
			el.Seconds(), duration, phase, d.sent.Load(), d.inflight.Load(), d.ok.Load(), d.dropped.Load(), d.failed.Load())
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				if live {
					fmt.Fprintf(out, "\r\x1b[K%s\n", line())
				}
				return
			case <-t.C:
				if live {
					fmt.Fprintf(out, "\r\x1b[K%s", line())
				} else {
					fmt.Fprintln(out, line())
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
