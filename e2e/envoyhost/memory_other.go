//go:build !linux

package envoyhost

// Without a reservation (only implemented on Linux) memories are Go slices,
// wazero's default.
func reservePages(uint64) []byte { return nil }

func releasePages([]byte) {}
