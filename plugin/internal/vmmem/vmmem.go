// Package vmmem reports the guest memory of the plugin's VMs as gauges,
// each the sum over every VM of one Go runtime reading (runtime/metrics):
//
//   - wasm_epp.vm.memory_bytes: the memory the runtime has mapped
//     (/memory/classes/total:bytes), which in a Wasm guest is its linear
//     memory in use (Wasm memory never shrinks, so a gauge that keeps
//     rising is a leak or a collector that falls behind);
//   - wasm_epp.vm.heap_objects_bytes: heap held by objects, live or not yet
//     swept (/memory/classes/heap/objects:bytes);
//   - wasm_epp.vm.heap_live_bytes: heap marked live by the last collection
//     (/gc/heap/live:bytes);
//   - wasm_epp.vm.heap_goal_bytes: the collector's goal for the heap
//     (/gc/heap/goal:bytes);
//   - wasm_epp.vm.gc_cycles: collections completed (/gc/cycles/total).
//
// Every role of a VM calls Maybe; each VM adds the change since its last
// report, at most once a second, looking at the clock every 64th call.
// Every role defines the gauges in its plugin start (Define).
package vmmem

import (
	"runtime/metrics"
	"time"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// every bounds how often a VM reads its memory (a read is a few
// microseconds; the gauges are for dashboards and soak tests), and a VM
// looks at the clock (a host call) only every checkEvery-th call.
const (
	every      = time.Second
	checkEvery = 64
)

// readings are the gauges, in the order of sample.
var readings = [...]struct{ gauge, metric string }{
	{"wasm_epp.vm.memory_bytes", "/memory/classes/total:bytes"},
	{"wasm_epp.vm.heap_objects_bytes", "/memory/classes/heap/objects:bytes"},
	{"wasm_epp.vm.heap_live_bytes", "/gc/heap/live:bytes"},
	{"wasm_epp.vm.heap_goal_bytes", "/gc/heap/goal:bytes"},
	{"wasm_epp.vm.gc_cycles", "/gc/cycles/total:gc-cycles"},
}

var (
	gauges   [len(readings)]proxywasm.MetricGauge
	reported [len(readings)]int64
	sample   [len(readings)]metrics.Sample
	defined  bool
	fresh    bool // nothing reported since Define or Forget
	epoch    time.Time
	last     time.Duration // since epoch, at the last report
	calls    uint32
)

func init() {
	for i, r := range readings {
		sample[i].Name = r.metric
	}
}

// Define defines the gauges; call it from each role's plugin start. A VM
// holding several plugins gets the same gauges each time and keeps
// counting where it was.
func Define() {
	changed := !defined
	for i, r := range readings {
		g := proxywasm.DefineGaugeMetric(r.gauge)
		changed = changed || g != gauges[i]
		gauges[i] = g
	}
	if changed {
		Forget()
	}
	if !defined {
		epoch = time.Now()
	}
	defined = true
}

// Maybe reports this VM's readings when the last report is older than a
// second (or none was made). It allocates nothing.
func Maybe() {
	if !defined {
		return
	}
	calls++
	if !fresh && calls%checkEvery != 0 {
		return
	}
	mono := time.Since(epoch)
	if !fresh && mono-last < every {
		return
	}
	last, fresh = mono, false
	metrics.Read(sample[:])
	for i := range sample {
		if sample[i].Value.Kind() != metrics.KindUint64 {
			continue
		}
		now := int64(sample[i].Value.Uint64())
		if d := now - reported[i]; d != 0 {
			gauges[i].Add(d)
			reported[i] = now
		}
	}
}

// Forget makes the next Maybe report every reading whole again, as a new
// VM does: for tests that start a new host in the same process.
func Forget() { reported, last, fresh = [len(readings)]int64{}, 0, true }
