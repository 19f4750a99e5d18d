package endtoend

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// Environment variables make test sets.
const (
	envBin  = "WASM_EPP_BIN"
	envWasm = "WASM_EPP_WASM"
	// envGateway forces the gateway: "envoy" or "envoyhost".
	envGateway = "WASM_EPP_GATEWAY"
)

// commands are the binaries the tests run, by package.
var commands = map[string]string{
	stack.SimBinary:       "./e2e/cmd/vllm-sim",
	stack.AgentBinary:     "./metricsagent/cmd/metricsagent",
	stack.EnvoyHostBinary: "./e2e/cmd/envoyhost",
	"wasm-epp-run":        "./e2e/cmd/wasm-epp-run",
	"wasm-epp-demo":       "./e2e/cmd/wasm-epp-demo",
}

var (
	buildOnce sync.Once
	binDir    string
	wasmPath  string
	buildErr  error
	buildTmp  string
	// cacheDir is wazero's compilation cache shared by every envoyhost
	// the tests start: the plugin is compiled once per test binary.
	cacheDir string
)

func TestMain(m *testing.M) {
	var err error
	if cacheDir, err = os.MkdirTemp("", "wasm-epp-wazero-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(cacheDir)
	wasmbuild.Cleanup()
	if buildTmp != "" {
		os.RemoveAll(buildTmp)
	}
	os.Exit(code)
}

// binaries returns the directory with every command and the plugin path,
// building what is missing (once per test binary).
func binaries(t testing.TB) (bin, wasm string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end tests start real processes; skipped in -short mode")
	}
	buildOnce.Do(func() { binDir, wasmPath, buildErr = findOrBuild() })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir, wasmPath
}

func findOrBuild() (bin, wasm string, err error) {
	root, err := wasmbuild.ModuleRoot()
	if err != nil {
		return "", "", err
	}
	bin, wasm = os.Getenv(envBin), os.Getenv(envWasm)
	if wasm == "" && bin != "" {
		wasm = filepath.Join(bin, stack.WasmFile)
	}
	haveAll := bin != ""
	for name := range commands {
		if _, err := os.Stat(filepath.Join(bin, name)); bin == "" || err != nil {
			haveAll = false
		}
	}
	_, wasmErr := os.Stat(wasm)
	if haveAll && wasm != "" && wasmErr == nil {
		return bin, wasm, nil
	}
	if buildTmp, err = os.MkdirTemp("", "wasm-epp-endtoend-"); err != nil {
		return "", "", err
	}
	if !haveAll {
		args := []string{"build", "-trimpath", "-o", buildTmp + string(filepath.Separator)}
		for _, pkg := range commands {
			args = append(args, pkg)
		}
		if err := goCmd(root, args...); err != nil {
			return "", "", err
		}
		bin = buildTmp
	}
	if wasm == "" || wasmErr != nil {
		if wasm, err = wasmbuild.BuildErr("./plugin"); err != nil {
			return "", "", err
		}
	}
	return bin, wasm, nil
}

func goCmd(dir string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %v\n%s", args, err, out)
	}
	return nil
}
