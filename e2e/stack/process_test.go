package stack

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The test binary doubles as the processes under test: with helperEnv set
// it runs one of the behaviours below instead of the tests.
const helperEnv = "STACK_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "parent":
		// Start a grandchild in our process group and report its pid.
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=sleeper")
		if err := cmd.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Printf("grandchild %d\n", cmd.Process.Pid)
		_ = cmd.Wait()
		os.Exit(0)
	case "sleeper":
		time.Sleep(time.Minute)
		os.Exit(0)
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ignoring SIGTERM")
		time.Sleep(time.Minute)
		os.Exit(0)
	case "crash":
		fmt.Fprintln(os.Stderr, "boom: cannot bind")
		os.Exit(3)
	}
}

// gone reports whether pid no longer runs (absent or a zombie waiting for
// a reaper that a container's init may never be).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) != nil
	}
	// Format: pid (comm) state ...; comm may contain spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

func helper(t *testing.T, mode string) *Process {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	p, err := startProcess(mode, []string{exe, "-test.run=^$"}, []string{helperEnv + "=" + mode}, t.TempDir(), filepath.Join(t.TempDir(), mode+".log"))
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	return p
}

// logLine waits for a line with prefix in the process log.
func logLine(t *testing.T, p *Process, prefix string) string {
	t.Helper()
	var line string
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(p.LogPath)
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), prefix) {
				line = sc.Text()
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "no %q line in %s", prefix, p.LogPath)
	return line
}

func TestStopKillsTheWholeProcessGroup(t *testing.T) {
	p := helper(t, "parent")
	line := logLine(t, p, "grandchild ")
	pid, err := strconv.Atoi(strings.TrimPrefix(line, "grandchild "))
	require.NoError(t, err)
	require.False(t, gone(pid), "grandchild should run before Stop")

	p.Stop(5 * time.Second)
	require.True(t, p.Exited())
	require.Eventually(t, func() bool { return gone(pid) }, 10*time.Second, 10*time.Millisecond,
		"grandchild %d outlived Stop", pid)
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	p := helper(t, "stubborn")
	logLine(t, p, "ignoring SIGTERM")
	p.Stop(50 * time.Millisecond)
	require.True(t, p.Exited())
	var exit *exec.ExitError
	require.ErrorAs(t, p.waitErr, &exit)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
}

func TestExitErrorCarriesTheLogTail(t *testing.T) {
	p := helper(t, "crash")
	<-p.Done()
	require.False(t, p.expected())
	e := p.exitError()
	require.Equal(t, "crash", e.Name)
	require.Error(t, e.Err)
	require.Contains(t, e.Error(), "boom: cannot bind")
}

func TestLogTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	require.Equal(t, "line 97\nline 98\nline 99", LogTail(path, 3))
	require.Equal(t, "", LogTail(filepath.Join(t.TempDir(), "absent"), 3))
}
