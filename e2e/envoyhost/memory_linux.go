package envoyhost

import "syscall"

// reservePages maps size bytes of address space without committing memory
// (pages are backed on first touch, zero-filled), or returns nil.
func reservePages(size uint64) []byte {
	if size > 1<<40 || uint64(int(size)) != size {
		return nil
	}
	b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
	if err != nil {
		return nil
	}
	return b
}

// releasePages gives the pages back to the OS; the range reads as zeros.
func releasePages(b []byte) {
	_ = syscall.Madvise(b, syscall.MADV_DONTNEED)
}
