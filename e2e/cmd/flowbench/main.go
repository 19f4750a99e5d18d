// Command flowbench is the flow-control benchmark: the fleet simulation
// (package e2e/fleet) of scenario (a) with the mixed criticality mix past
// saturation and under bursts, each profile with today's immediate 429 and
// with the plugin's flow-control queue, and the cross-VM admission
// comparison. It writes RESULTS.md into -out.
//
//	flowbench                                  # the benchmark into e2e/results/flow-control
//	flowbench -seeds 1 -window 2m -out /tmp/f  # a quick look
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/fleet"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "flowbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	d := fleet.DefaultFlowBench()
	fs := flag.NewFlagSet("flowbench", flag.ContinueOnError)
	var (
		base     = fs.String("base", scheduler.ProfileDecisionTree, "profile compared with its flow-control variant: a scheduler profile or name=path/to/scheduler-config.json")
		extra    = fs.String("extra", "", "comma-separated further profiles measured both ways (name or name=config.json)")
		flowJSON = fs.String("flow", "", "flowControl configuration as JSON (default: the plugin's defaults)")
		seeds    = fs.Int("seeds", d.Seeds, "seeds pooled per row")
		seed     = fs.Uint64("seed", d.Seed, "first seed")
		warmup   = fs.Duration("warmup", d.Warmup, "simulated warmup")
		window   = fs.Duration("window", d.Window, "simulated measurement window")
		vms      = fs.Int("gateway-vms", d.VMs, "gateway VMs of the cross-VM admission comparison")
		parallel = fs.Int("parallel", runtime.GOMAXPROCS(0), "simulations run at once (results do not depend on it)")
		out      = fs.String("out", "e2e/results/flow-control", "directory for RESULTS.md")
		quiet    = fs.Bool("quiet", false, "no progress lines")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *vms < 2 {
		return errors.New("-gateway-vms: want at least 2 (the comparison is between VMs)")
	}
	cfg := d
	var err error
	if cfg.Base, err = fleet.ParsePolicy(*base); err != nil {
		return err
	}
	for _, e := range strings.Split(*extra, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		p, err := fleet.ParsePolicy(e)
		if err != nil {
			return err
		}
		cfg.Extra = append(cfg.Extra, p)
	}
	if cfg.Flow, err = flowcontrol.DecodeConfig([]byte(*flowJSON)); err != nil {
		return fmt.Errorf("-flow: %w", err)
	}
	cfg.Seeds, cfg.Seed, cfg.Warmup, cfg.Window, cfg.VMs, cfg.Parallel = *seeds, *seed, *warmup, *window, *vms, *parallel
	if !*quiet {
		cfg.Progress = os.Stderr
	}
	rep, err := fleet.RunFlowBench(cfg)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	rep.Markdown(&buf, "flowbench "+strings.Join(args, " "))
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(*out, "RESULTS.md")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s in %.0fs\n", path, time.Duration(rep.Elapsed).Seconds())
	return nil
}
