//go:build !linux

package metricsagent

import (
	"net"
	"os"
)

// rawSocket elsewhere than Linux is the plain connection (see
// sockio_linux.go for why Linux differs).
type rawSocket struct{ conn net.Conn }

func newRawSocket(c net.Conn) rawSocket { return rawSocket{conn: c} }

// read: without raw descriptors a read cannot be made not to wait, so a
// pod not read by the deadline fails even if its answer has arrived.
func (s rawSocket) read(b []byte, arrivedOnly bool) (int, error) {
	if arrivedOnly {
		return 0, os.ErrDeadlineExceeded
	}
	return s.conn.Read(b)
}

func (s rawSocket) write(b []byte) (int, error) { return s.conn.Write(b) }

// closedByPeer cannot look without raw descriptors: a connection the peer
// closed is found when the answer is read (and retried then if time is left).
func (s rawSocket) closedByPeer() bool { return false }
