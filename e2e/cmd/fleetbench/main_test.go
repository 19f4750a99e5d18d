package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSweepWritesTheResultsFolder(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tuned.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"profile":"t","profiles":{"t":{"scorers":[{"scorer":"queue-scorer","weight":1}],"picker":"max-score-picker"}}}`), 0o600))
	out := filepath.Join(dir, "results")
	err := run([]string{"-quiet", "-scenarios", "b", "-loads", "50", "-seeds", "1", "-warmup", "0s", "-window", "10s",
		"-criticality", "critical=1,sheddable=1", "-policies", "decision-tree,envoy-least-request,tuned=" + cfg, "-out", out})
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(out, "RESULTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "fleetbench -quiet -scenarios b")
	assert.Contains(t, string(md), "| tuned |")
	assert.FileExists(t, filepath.Join(out, "results.csv"))
	assert.FileExists(t, filepath.Join(out, "scenario-b-ntpot-p90.svg"))
}

func TestCountRoutedAndGatewayVMsFlags(t *testing.T) {
	out := filepath.Join(t.TempDir(), "results")
	err := run([]string{"-quiet", "-scenarios", "a", "-loads", "50", "-seeds", "1", "-warmup", "0s", "-window", "5s",
		"-count-routed", "-gateway-vms", "2", "-policies", "decision-tree,envoy-least-request", "-out", out})
	require.NoError(t, err)
	md, err := os.ReadFile(filepath.Join(out, "RESULTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "The gateway runs 2 routing VMs")
	assert.Contains(t, string(md), "(countRoutedSinceSnapshot on): decision-tree.")

	require.NoError(t, run([]string{"-quiet", "-scenarios", "a", "-loads", "50", "-seeds", "1", "-warmup", "0s", "-window", "5s",
		"-count-routed=false", "-policies", "decision-tree", "-out", out}))
	md, err = os.ReadFile(filepath.Join(out, "RESULTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "countRoutedSinceSnapshot off")
	assert.NotContains(t, string(md), "routing VMs")
}

func TestSingleRunMode(t *testing.T) {
	require.NoError(t, run([]string{"-qps", "20", "-warmup", "0s", "-window", "5s", "-scenarios", "a", "-policies", "scoring"}))
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"-scenarios", "z"},
		{"-policies", "fastest"},
		{"-loads", "abc"},
		{"-loads", "-5"},
		{"-criticality", "urgent=1"},
		{"-scenarios", ""},
		{"extra"},
		{"-nosuchflag"},
		{"-gateway-vms", "0"},
		{"-count-routed=maybe"},
	} {
		assert.Error(t, run(append(args, "-out", t.TempDir())), "%q", args)
	}
}
