package endtoend

import (
	"bufio"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
)

// TestRunCommand runs bin/wasm-epp-run as `make run` does (on free ports),
// sends the request its banner suggests, then interrupts it as Ctrl-C does
// and checks that every process it started is gone.
func TestRunCommand(t *testing.T) {
	bin, wasm := binaries(t)
	root, err := wasmbuild.ModuleRoot()
	require.NoError(t, err)
	cmd := exec.Command(filepath.Join(bin, "wasm-epp-run"),
		"--bin", bin, "--wasm", wasm, "--config", filepath.Join(root, "envoy", "envoy.yaml"),
		"--replicas", "2", "--replica-port", "0", "--agent-listen", "127.0.0.1:0",
		"--client-addr", "127.0.0.1:0", "--push-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--log-dir", t.TempDir(), "--compilation-cache", cacheDir)
	if g := gatewayEnv(); g != "" {
		cmd.Args = append(cmd.Args, "--gateway", g)
	}
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	var mu sync.Mutex
	var out strings.Builder
	banner := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.Contains(sc.Text(), "Ctrl-C stops everything") {
				once.Do(func() { close(banner) })
			}
		}
		io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("wasm-epp-run output:\n%s", output())
		}
	})

	select {
	case <-banner:
	case err := <-exited:
		t.Fatalf("wasm-epp-run exited before it was ready: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("wasm-epp-run did not print its banner")
	}
	text := output()
	m := regexp.MustCompile(`Send OpenAI-style requests to\s+(http://localhost:\d+/v1/completions)`).FindStringSubmatch(text)
	require.NotNil(t, m, "banner has the URL:\n%s", text)
	require.Contains(t, text, "curl -si "+m[1])
	url := strings.Replace(m[1], "localhost", "127.0.0.1", 1)

	// The suggested request works, for an adapter of the configuration.
	curl := regexp.MustCompile(`-d '(\{[^']*\})'`).FindStringSubmatch(text)
	require.NotNil(t, curl)
	r, err := trySend(t.Context(), http.MethodPost, url, rawJSON(curl[1]), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.Status, r.String())
	require.NotEmpty(t, r.Header.Get("x-wasm-epp-endpoint"))

	var pids []int
	for _, p := range regexp.MustCompile(`\bpid (\d+)\)`).FindAllStringSubmatch(text, -1) {
		n, err := strconv.Atoi(p[1])
		require.NoError(t, err)
		pids = append(pids, n)
	}
	require.Len(t, pids, 4, "2 replicas, the gateway and the agent")

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status after Ctrl-C")
	case <-time.After(60 * time.Second):
		t.Fatal("wasm-epp-run did not stop after SIGINT")
	}
	require.Contains(t, output(), "stack stopped")
	// Each child led its own process group: nothing may remain in any of
	// them (a helper a child started would still carry the group id).
	poll(t, func() bool { return len(groupMembers(pids)) == 0 },
		"survivors: %v", groupMembers(pids))
}

// rawJSON passes a JSON text through trySend's marshalling unchanged.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }
