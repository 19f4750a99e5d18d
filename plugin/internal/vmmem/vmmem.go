// Package vmmem reports the guest memory of the plugin's VMs as one gauge,
// wasm_epp.vm.memory_bytes: the sum over every VM of the memory its Go
// runtime has mapped (runtime/metrics /memory/classes/total:bytes), which in
// a Wasm guest is its linear memory in use (Wasm memory never shrinks, so a
// gauge that keeps rising is a leak). Every role of a VM calls Maybe; each
// VM adds the change since its last report, at most once a second. Every
// role defines the gauge in its plugin start (Define).
package vmmem

import (
	"runtime/metrics"
	"time"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// every bounds how often a VM reads its memory (a read is a few
// microseconds; the gauge is for dashboards and soak tests).
const every = time.Second

var (
	gauge    proxywasm.MetricGauge
	defined  bool
	reported int64
	last     time.Duration
	sample   = []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
)

// Define defines the gauge; call it from each role's plugin start. A VM
// holding several plugins gets the same gauge each time and keeps counting
// where it was.
func Define() {
	g := proxywasm.DefineGaugeMetric("wasm_epp.vm.memory_bytes")
	if !defined || g != gauge {
		gauge, reported, last = g, 0, 0
	}
	defined = true
}

// Maybe reports this VM's memory when the last report is older than a
// second; mono is a monotonic reading of the caller's (time since some
// start). It allocates nothing.
func Maybe(mono time.Duration) {
	if !defined || reported != 0 && mono-last < every && mono >= last {
		return
	}
	last = mono
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	now := int64(sample[0].Value.Uint64())
	if d := now - reported; d != 0 {
		gauge.Add(d)
		reported = now
	}
}

// Forget makes the next Maybe report the whole memory again, as a new VM
// does: for tests that start a new host in the same process.
func Forget() { reported, last = 0, 0 }
