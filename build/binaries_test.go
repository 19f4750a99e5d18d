package build

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The flags the manifests pass must exist in the binaries they run. A
// binary is taken from $WASM_EPP_BIN (set by `make test`) when present,
// otherwise built into a temporary directory, and asked for -h.

var (
	binOnce sync.Map // command path -> *binResult
)

type binResult struct {
	once  sync.Once
	flags []string
	err   error
}

func simFlags(t *testing.T) []string { return commandFlags(t, "vllm-sim", "./e2e/cmd/vllm-sim") }

func commandFlags(t *testing.T, name, pkg string) []string {
	t.Helper()
	v, _ := binOnce.LoadOrStore(pkg, &binResult{})
	r := v.(*binResult)
	r.once.Do(func() { r.flags, r.err = readFlags(t, name, pkg) })
	require.NoError(t, r.err)
	require.NotEmpty(t, r.flags, "%s -h listed no flags", name)
	return r.flags
}

func readFlags(t *testing.T, name, pkg string) ([]string, error) {
	bin := ""
	if dir := os.Getenv("WASM_EPP_BIN"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			bin = filepath.Join(dir, name)
		}
	}
	if bin == "" {
		bin = filepath.Join(t.TempDir(), name)
		if out, err := runCommand(t, "..", "go", "build", "-o", bin, pkg); err != nil {
			return nil, &buildError{pkg: pkg, out: string(out), err: err}
		}
	}
	// Go's flag package prints the defaults on -h and exits 0 (or 2 with
	// older conventions): only the output matters.
	out, _ := runCommand(t, ".", bin, "-h")
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^\s+--?([A-Za-z0-9][A-Za-z0-9_.-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	return flags, nil
}

type buildError struct {
	pkg, out string
	err      error
}

func (e *buildError) Error() string { return "go build " + e.pkg + ": " + e.err.Error() + "\n" + e.out }

func runCommand(t *testing.T, dir, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}
