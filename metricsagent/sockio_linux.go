package metricsagent

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// On Linux a pod connection's reads and writes are made on the raw
// descriptor with syscall.RawSyscall, through net's RawConn so that the
// connection's deadline and the runtime's poller still decide when to wait.
//
// Why: Go's sockets are non-blocking, so a read or write returns at once
// (EAGAIN when there is nothing to do, and the RawConn then parks the
// goroutine until the poller says the socket is ready). But syscall.Read
// and Write tell the scheduler that the thread may block; the first such
// call after the process was idle wakes the runtime's monitor thread
// (sysmon), which then polls every 20 µs for a millisecond or more. The
// agent is idle between cycles, 20 times a second, so on a VM where a
// timer sleep costs tens of µs of CPU that monitor took a sixth of the
// agent's CPU (measured with perf; BENCHMARKS.md). A call that cannot
// block needs no such notice.
type rawSocket struct {
	conn net.Conn
	raw  syscall.RawConn // nil: not a socket with a descriptor (then conn is used)
}

func newRawSocket(c net.Conn) rawSocket {
	s := rawSocket{conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			s.raw = raw
		}
	}
	return s
}

// read reads into b, waiting for data up to the connection's deadline; with
// arrivedOnly it never waits and returns os.ErrDeadlineExceeded when
// nothing has arrived.
func (s rawSocket) read(b []byte, arrivedOnly bool) (int, error) {
	if s.raw == nil {
		if arrivedOnly {
			return 0, os.ErrDeadlineExceeded
		}
		return s.conn.Read(b)
	}
	if arrivedOnly {
		// An expired deadline refuses even bytes that are there
		// (internal/poll prepareRead), and this read must not wait.
		if err := s.conn.SetReadDeadline(time.Time{}); err != nil {
			return 0, err
		}
	}
	if len(b) == 0 {
		return 0, nil
	}
	var n uintptr
	var errno syscall.Errno
	err := s.raw.Read(func(fd uintptr) bool {
		for {
			n, _, errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch errno {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return arrivedOnly // false: wait for the poller, then call again
			}
			return true
		}
	})
	switch {
	case err != nil: // the deadline, or a closed connection
		return 0, err
	case errno == syscall.EAGAIN:
		return 0, os.ErrDeadlineExceeded
	case errno != 0:
		return 0, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return int(n), nil
}

// write writes all of b, waiting for room up to the connection's
// deadline, and returns how much was written.
func (s rawSocket) write(b []byte) (int, error) {
	if s.raw == nil {
		return s.conn.Write(b)
	}
	written := 0
	var errno syscall.Errno
	err := s.raw.Write(func(fd uintptr) bool {
		for written < len(b) {
			n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[written])), uintptr(len(b)-written))
			switch e {
			case 0:
				written += int(n)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait for room
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("write", errno)
	}
	return written, err
}

// closedByPeer reports, without waiting, whether the peer has closed or
// reset the connection, or sent bytes nobody asked for (either way the
// connection cannot carry the next request's answer cleanly). It peeks, so
// nothing is consumed.
func (s rawSocket) closedByPeer() bool {
	if s.raw == nil {
		return false
	}
	var one [1]byte
	var errno syscall.Errno
	err := s.raw.Control(func(fd uintptr) {
		for {
			_, _, errno = syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&one[0])), 1,
				syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
			if errno != syscall.EINTR {
				return
			}
		}
	})
	switch {
	case err != nil:
		return true
	case errno == syscall.EAGAIN:
		return false // open, nothing pending: the usual case
	case errno != 0:
		return true // reset
	default:
		return true // 0 bytes: the peer's FIN; 1: a byte nobody asked for
	}
}
