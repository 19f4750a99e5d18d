// Package timewords is time.Time's memory layout, for the scheduler's and
// the wire cache's loops that read or write update times in the Go guest
// without calls (a call in a loop there sends the loop's state through
// memory at every turn; BENCHMARKS.md). One definition, and a build that
// fails when time.Time changes size; the packages' tests check the
// meaning of the words against the time package's own functions.
package timewords

import (
	"time"
	"unsafe"
)

// Words is time.Time's layout. Wall holds the nanoseconds and, with
// HasMonotonic, the seconds since 1885 in 33 bits; Ext holds the seconds
// since year 1 when HasMonotonic is clear (the monotonic reading when it
// is set); Loc is the location.
type Words struct {
	Wall uint64
	Ext  int64
	Loc  unsafe.Pointer
}

// HasMonotonic is Wall's flag for a time carrying a monotonic reading.
const HasMonotonic = 1 << 63

// Of is t's words, in place.
func Of(t *time.Time) *Words { return (*Words)(unsafe.Pointer(t)) }

// Either array has a negative length, failing the build, unless Words and
// time.Time have the same size.
var (
	_ [unsafe.Sizeof(time.Time{}) - unsafe.Sizeof(Words{})]struct{}
	_ [unsafe.Sizeof(Words{}) - unsafe.Sizeof(time.Time{})]struct{}
)
