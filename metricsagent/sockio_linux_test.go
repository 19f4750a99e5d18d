package metricsagent

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// bytesQueued is how many received bytes wait in c's socket (FIONREAD).
func bytesQueued(t *testing.T, c net.Conn) int {
	raw, err := c.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	var n int32
	var errno syscall.Errno
	require.NoError(t, raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	}))
	require.Zero(t, errno)
	return int(n)
}

func TestAnswerInBeforeTheDeadlineCountsThoughReadAfterIt(t *testing.T) {
	// A 116 KB page takes several reads; the deadline passes between two
	// of them, after the whole answer had arrived.
	body := append(golden(t, "vllm-v1.txt"), bytes.Repeat([]byte("# pad\n"), 15000)...)
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
	s := &Scraper{Timeout: time.Second, MaxBodyBytes: 1 << 20, Names: DefaultMetricNames()}
	p, err := s.ForURL("http://" + rawServer(t, answer) + "/metrics")
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.dial(context.Background()))
	deadline := time.Now().Add(200 * time.Millisecond)
	require.NoError(t, p.send(deadline))
	for bytesQueued(t, p.conn) < len(answer) {
		time.Sleep(time.Millisecond)
	}
	if time.Now().After(deadline) {
		t.Skip("the machine was too slow to have the answer in before the deadline")
	}
	_, err = p.br.Peek(1) // the first read, before the deadline
	require.NoError(t, err)
	time.Sleep(time.Until(deadline) + time.Millisecond)
	m, err := p.receive(deadline, false)
	require.NoError(t, err, "the answer had fully arrived before the deadline")
	require.Equal(t, uint32(31), m.Running)
}
