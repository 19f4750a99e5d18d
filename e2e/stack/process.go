package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Process is one child process of the stack, started in its own process
// group so that stopping it also stops anything it started, and so that a
// terminal's Ctrl-C reaches only the stack's owner, which then stops the
// children in order.
type Process struct {
	Name    string
	Args    []string // argv, Args[0] the binary
	LogPath string   // stdout and stderr of the process

	cmd     *exec.Cmd
	logFile *os.File
	done    chan struct{}
	waitErr error

	mu       sync.Mutex
	stopping bool // Stop or Kill was called: the exit is expected
}

// ExitError reports a process that ended while the stack still needed it.
type ExitError struct {
	Name    string
	Err     error  // from Wait; nil when it exited with status 0
	LogTail string // the end of its log
}

func (e *ExitError) Error() string {
	status := "exited with status 0"
	if e.Err != nil {
		status = e.Err.Error()
	}
	msg := fmt.Sprintf("%s %s", e.Name, status)
	if e.LogTail != "" {
		msg += "; last log lines:\n" + e.LogTail
	}
	return msg
}

// startProcess runs argv with env added to this process's environment,
// output appended to logPath.
func startProcess(name string, argv []string, env []string, dir, logPath string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, argv[0], err)
	}
	p := &Process{Name: name, Args: argv, LogPath: logPath, cmd: cmd, logFile: f, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id, which is also its process group id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// expected reports whether an exit was asked for.
func (p *Process) expected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

// exitError describes how the process ended; call after Done.
func (p *Process) exitError() *ExitError {
	return &ExitError{Name: p.Name, Err: p.waitErr, LogTail: LogTail(p.LogPath, 20)}
}

// Stop sends SIGTERM to the process group, waits up to grace for the
// process to exit, then sends SIGKILL to the group. It always kills the
// group at the end, so helpers the process started cannot outlive it.
func (p *Process) Stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	if !p.Exited() {
		p.signalGroup(syscall.SIGTERM)
		t := time.NewTimer(grace)
		select {
		case <-p.done:
		case <-t.C:
		}
		t.Stop()
	}
	p.Kill()
}

// Kill sends SIGKILL to the process group and waits for the process.
func (p *Process) Kill() {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	// The group may still hold children after the leader exited.
	p.signalGroup(syscall.SIGKILL)
	<-p.done
}

func (p *Process) signalGroup(sig syscall.Signal) {
	// A negative pid addresses the whole process group; ESRCH means it is
	// already empty.
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = p.cmd.Process.Signal(sig)
	}
}

// LogTail returns the last n lines of a log file ("" if unreadable).
func LogTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const maxRead = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		if _, err := f.Seek(st.Size()-maxRead, io.SeekStart); err != nil {
			return ""
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return ""
	}
	b = bytes.TrimRight(b, "\n")
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// waitFor polls check every interval until it returns nil, the context
// ends, or the process exits (which makes waiting pointless).
func waitFor(ctx context.Context, p *Process, interval time.Duration, what string, check func(context.Context) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		var exited <-chan struct{}
		if p != nil {
			exited = p.done
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not ready: %w (last check: %v)", what, ctx.Err(), last)
		case <-exited:
			return fmt.Errorf("%s: %w", what, p.exitError())
		case <-t.C:
		}
	}
}
