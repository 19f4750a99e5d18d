// Package wasmbuild builds Go packages as wasip1 c-shared modules (the form
// Envoy loads) for tests: each package once per test binary, into a
// temporary directory removed by Cleanup.
package wasmbuild

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// EnvPluginPath names the environment variable that points at a prebuilt
// bin/wasm-epp.wasm (make test sets it); Plugin uses it instead of building.
const EnvPluginPath = "WASM_EPP_WASM"

var (
	mu     sync.Mutex
	builds = map[string]*build{}
	outDir string
)

type build struct {
	once sync.Once
	path string
	err  error
}

// ModuleRoot finds the directory holding go.mod, walking up from the
// working directory (a test runs in its package directory).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("wasmbuild: go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Build compiles pkg (a path relative to the module root, such as
// "./plugin/internal/testplugin") with GOOS=wasip1 GOARCH=wasm
// -buildmode=c-shared and returns the .wasm path. Later calls with the same
// pkg return the same file. Tests are skipped in -short mode.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("wasmbuild: building a wasm module is skipped in -short mode")
	}
	path, err := BuildErr(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// BuildErr is Build without a testing.TB, for TestMain and benchmarks.
func BuildErr(pkg string) (string, error) {
	mu.Lock()
	b, ok := builds[pkg]
	if !ok {
		b = &build{}
		builds[pkg] = b
	}
	mu.Unlock()
	b.once.Do(func() { b.path, b.err = compile(pkg) })
	return b.path, b.err
}

func compile(pkg string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	mu.Lock()
	if outDir == "" {
		if outDir, err = os.MkdirTemp("", "wasmbuild-"); err != nil {
			mu.Unlock()
			return "", err
		}
	}
	dir := outDir
	mu.Unlock()
	out := filepath.Join(dir, fmt.Sprintf("%x.wasm", []byte(filepath.Clean(pkg))))
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("wasmbuild: go build %s: %v\n%s", pkg, err, msg)
	}
	return out, nil
}

// Plugin returns the main plugin: $WASM_EPP_WASM if set, else a fresh
// build of ./plugin.
func Plugin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvPluginPath); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("wasmbuild: %s=%s: %v", EnvPluginPath, p, err)
		}
		return p
	}
	return Build(t, "./plugin")
}

// Cleanup removes the build directory; call it from TestMain after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if outDir != "" {
		os.RemoveAll(outDir)
		outDir = ""
		builds = map[string]*build{}
	}
}
