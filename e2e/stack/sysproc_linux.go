package stack

import "syscall"

// sysProcAttr puts the child in a process group of its own and, on Linux,
// has the kernel kill it if the stack's owner dies without stopping it
// (a SIGKILLed `make run` must not leave replicas behind).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
