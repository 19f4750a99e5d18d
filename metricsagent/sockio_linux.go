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
type rawSocket = *rawSock

type rawSock struct {
	conn net.Conn
	raw  syscall.RawConn // nil: not a socket with a descriptor (then conn is used)

	// The RawConn callbacks, made once per connection (a closure built
	// per call would be an allocation per read and write), and what each
	// works on. Reads and writes may run at once on two goroutines (as
	// http.Transport does), so each has its own fields; two reads or two
	// writes never overlap.
	readFn, writeFn        func(fd uintptr) bool
	peekFn                 func(fd uintptr)
	rbuf, wbuf             []byte
	rdone, wdone           int
	arrivedOnly            bool
	rerrno, werrno, perrno syscall.Errno
}

func newRawSocket(c net.Conn) rawSocket {
	s := &rawSock{conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			s.raw = raw
		}
	}
	s.readFn, s.writeFn, s.peekFn = s.readOnce, s.writeAll, s.peekOne
	return s
}

// read reads into b, waiting for data up to the connection's deadline; with
// arrivedOnly it never waits and returns os.ErrDeadlineExceeded when
// nothing has arrived.
func (s *rawSock) read(b []byte, arrivedOnly bool) (int, error) {
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
	s.rbuf, s.rdone, s.arrivedOnly, s.rerrno = b, 0, arrivedOnly, 0
	err := s.raw.Read(s.readFn)
	n, errno := s.rdone, s.rerrno
	s.rbuf = nil
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
	return n, nil
}

// readOnce is the read callback: one read(2); false asks the poller to
// wait for data and call again.
func (s *rawSock) readOnce(fd uintptr) bool {
	for {
		n, errno := sysRead(fd, s.rbuf)
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			s.rerrno = errno
			return s.arrivedOnly
		}
		s.rdone, s.rerrno = n, errno
		return true
	}
}

// write writes all of b, waiting for room up to the connection's
// deadline, and returns how much was written.
func (s *rawSock) write(b []byte) (int, error) {
	if s.raw == nil {
		return s.conn.Write(b)
	}
	s.wbuf, s.wdone, s.werrno = b, 0, 0
	err := s.raw.Write(s.writeFn)
	written, errno := s.wdone, s.werrno
	s.wbuf = nil
	if err == nil && errno != 0 {
		err = os.NewSyscallError("write", errno)
	}
	return written, err
}

// writeAll is the write callback: write(2) until all is written; false
// asks the poller to wait for room and call again.
func (s *rawSock) writeAll(fd uintptr) bool {
	for s.wdone < len(s.wbuf) {
		n, errno := sysWrite(fd, s.wbuf[s.wdone:])
		switch errno {
		case 0:
			s.wdone += n
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			s.werrno = errno
			return true
		}
	}
	return true
}

// closedByPeer reports, without waiting, whether the peer has closed or
// reset the connection, or sent bytes nobody asked for (either way the
// connection cannot carry the next request's answer cleanly). It peeks, so
// nothing is consumed.
func (s *rawSock) closedByPeer() bool {
	if s.raw == nil {
		return false
	}
	s.perrno = 0
	// Control, not Read: Read refuses at once once the connection's
	// deadline (last cycle's) has passed.
	err := s.raw.Control(s.peekFn)
	switch {
	case err != nil:
		return true
	case s.perrno == syscall.EAGAIN:
		return false // open, nothing pending: the usual case
	case s.perrno != 0:
		return true // reset
	default:
		return true // 0 bytes: the peer's FIN; 1: a byte nobody asked for
	}
}

// peekOne is the peek callback: recv(2) of one byte with MSG_PEEK and
// MSG_DONTWAIT.
func (s *rawSock) peekOne(fd uintptr) {
	var one [1]byte
	for {
		_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&one[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		if errno != syscall.EINTR {
			s.perrno = errno
			return
		}
	}
}
