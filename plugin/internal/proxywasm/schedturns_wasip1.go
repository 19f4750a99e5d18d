//go:build wasip1

package proxywasm

import "runtime"

// yieldEvery is how many outermost callbacks a VM runs between two turns
// of the Go scheduler. A turn at every callback cost a routed request 18 %
// more guest instructions (about 8,500 a callback, the collections it let
// finish included); every 16th (every two or three requests) costs
// 1.3-1.4 % and gives the collector enough turns to finish each cycle
// (BENCHMARKS.md, "Guest memory: the soak").
const yieldEvery = 16

// schedTurns gives the Go scheduler a turn at the end of every yieldEvery-th
// outermost callback.
//
// A wasip1 guest runs Go code only inside host callbacks, on one goroutine
// (the runtime keeps the main goroutine for them), and the scheduler runs
// another goroutine only when that one blocks or yields. The collector's
// background mark worker is such a goroutine. Without turns it never runs,
// so a mark phase is left to allocation assists and lasts seconds;
// everything allocated meanwhile is allocated marked and survives the
// cycle, the next heap goal is twice that, and the heap snowballs (at
// 1,000 endpoints under relays, 4 VMs went from 65 to 233 MiB in 40 s with
// 2 cycles completed). A turn lets the worker mark for its share of the
// time since the phase began (the runtime's fractional worker, as with
// GOMAXPROCS=1 on a native thread), and the background sweeper sweep.
// The turn comes after the callback's work and after host buffers are
// released, when no host call is in flight; the plugin starts no
// goroutines of its own, so only the runtime's run.
type schedTurns struct{ callbacks uint32 }

// afterCallback is called when an outermost callback's work is done.
func (t *schedTurns) afterCallback() {
	t.callbacks++
	if t.callbacks%yieldEvery == 0 {
		runtime.Gosched()
	}
}
