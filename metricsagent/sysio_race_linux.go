//go:build race

package metricsagent

import (
	"errors"
	"syscall"
)

// Under the race detector socket I/O goes through syscall.Read and Write:
// they tell the detector that a socket orders the events on both ends and
// which bytes were touched, which RawSyscall does not (races would be
// reported that are none, and real ones on the buffers hidden).
func sysRead(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), b)
	return result(n, err)
}

func sysWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), b)
	return result(n, err)
}

func result(n int, err error) (int, syscall.Errno) {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return 0, errno
	}
	return max(n, 0), 0
}
