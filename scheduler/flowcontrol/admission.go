package flowcontrol

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/kv"
)

// Store is the proxy's shared data (kv.Store); MemStore is an in-process
// one for simulations and tests.
type Store = kv.Store

// Errors a Store returns (kv's).
var (
	ErrNotFound    = kv.ErrNotFound
	ErrCASMismatch = kv.ErrCASMismatch
)

// ErrConflict is Admission.Admit's answer when another VM admitted a
// request since the last Sync: sync and schedule again.
var ErrConflict = errors.New("flowcontrol: another VM admitted a request meanwhile")

// Admission makes the VMs of one proxy agree on how many requests each
// endpoint was sent since the snapshot they all schedule on, so that
// together they fill one free slot once, not once per VM.
//
// One shared record holds, for the current snapshot (named by a tag every
// VM derives from the snapshot's version), a count per endpoint index of
// the requests the VMs released to it. Each VM keeps its own decoded copy
// of the snapshot; Sync adds what the record counts beyond what this VM
// already added to its copy's waiting queues, so the scheduler sees every
// VM's admissions as waiting requests. Admit then writes the record with
// compare-and-swap: when another VM wrote in between, nothing is written
// and the caller syncs and schedules again. A record with another tag
// counts for nothing (it belongs to an older or newer snapshot) and is
// replaced by the first admission on this one.
//
// Fresh metrics reset the counts: a new snapshot copy (another pointer or
// tag) starts with nothing added. Requests that reach the endpoint before
// it is scraped are then in its scraped queue; the few dispatched between
// the scrape and the new snapshot's arrival are counted by neither, as
// with Scheduler.Observe.
//
// An Admission is used by one VM (not safe for concurrent use) and
// allocates nothing once its buffers have grown to the record's size.
type Admission struct {
	store Store
	key   string

	snap *scheduler.Snapshot
	tag  uint64
	// applied[i] is what this VM added to snap.Endpoints[i]'s waiting queue.
	applied []int32
	// record is the last record read (for tag), sorted by endpoint; cas
	// its token; synced: nothing was written since it was read.
	record []admitted
	cas    uint32
	synced bool

	readBuf, writeBuf []byte
	stats             AdmissionStats
}

// AdmissionStats count an Admission's work since it was made.
type AdmissionStats struct {
	// Admitted counts successful Admit calls; Conflicts the CAS
	// mismatches; Corrupt the records that could not be decoded (each
	// is replaced by the next admission).
	Admitted, Conflicts, Corrupt uint64
	// StoreErrors counts Store failures other than not-found and
	// mismatch.
	StoreErrors uint64
}

type admitted struct {
	index uint32
	count uint32
}

// NewAdmission returns an Admission over the shared record under key.
func NewAdmission(store Store, key string) *Admission {
	return &Admission{store: store, key: key}
}

// Stats returns the counters.
func (a *Admission) Stats() AdmissionStats { return a.stats }

// Sync reads the shared record and adds to snap (this VM's own copy,
// named by tag) the admissions it does not hold yet. On a Store error the
// copy is left as it was and the error returned: the caller may go on
// without cross-VM agreement.
func (a *Admission) Sync(snap *scheduler.Snapshot, tag uint64) error {
	a.use(snap, tag)
	v, cas, err := a.store.Get(a.key, a.readBuf[:0])
	if cap(v) > cap(a.readBuf) {
		a.readBuf = v[:0]
	}
	switch {
	case errors.Is(err, ErrNotFound):
		// Create an empty record and read it back: Admit needs a token.
		if err := a.create(); err != nil {
			a.stats.StoreErrors++
			return fmt.Errorf("flowcontrol: creating %q: %w", a.key, err)
		}
		if v, cas, err = a.store.Get(a.key, a.readBuf[:0]); err != nil {
			a.stats.StoreErrors++
			return fmt.Errorf("flowcontrol: reading %q: %w", a.key, err)
		}
	case err != nil:
		a.stats.StoreErrors++
		return fmt.Errorf("flowcontrol: reading %q: %w", a.key, err)
	}
	recTag, rec, ok := decodeRecord(v, a.record[:0])
	if ok && recTag == tag && len(rec) > 0 && rec[len(rec)-1].index >= uint32(len(snap.Endpoints)) {
		ok = false // this snapshot has no such endpoint
	}
	a.record = rec[:0]
	switch {
	case !ok:
		a.stats.Corrupt++
	case recTag == tag:
		a.record = rec
	}
	a.cas, a.synced = cas, true
	for _, r := range a.record {
		if d := int32(r.count) - a.applied[r.index]; d > 0 {
			snap.Endpoints[r.index].Metrics.WaitingQueueSize += int(d)
			snap.MetricsChanged(int(r.index))
			a.applied[r.index] += d
		}
	}
	return nil
}

// create writes an empty record unless the key exists by now. Another VM
// may have created the record and admitted requests into it since this
// VM's read found nothing, and a write with token 0 is unconditional: it
// would wipe those admissions, and both VMs would fill the same slots.
// Shared data has no "create if absent", but a write with a token that no
// entry of this key can hold does just that: it fails (mismatch) when the
// key exists and creates it when it does not. Tokens come from one counter
// for the whole table, one per write, so the token of another key's entry
// is such a token: the probe key <key>.create, written first.
func (a *Admission) create() error {
	probe := a.key + ".create"
	if err := a.store.Set(probe, nil, 0); err != nil {
		return err
	}
	_, token, err := a.store.Get(probe, a.readBuf[:0])
	if err != nil {
		return err
	}
	err = a.store.Set(a.key, appendRecord(a.writeBuf[:0], 0, nil), token)
	if errors.Is(err, ErrCASMismatch) {
		return nil // another VM created it: read it
	}
	return err
}

// Synced reports whether the record was read for snap and tag and nothing
// was admitted since: Admit can be tried without another Sync.
func (a *Admission) Synced(snap *scheduler.Snapshot, tag uint64) bool {
	return a.synced && a.snap == snap && a.tag == tag
}

// Admit records one request sent to snap.Endpoints[i], on top of the
// record the last Sync read, and counts it in snap. It returns ErrConflict
// (nothing written) when another VM wrote since that Sync, or when there
// was no Sync for this snapshot since the last Admit.
func (a *Admission) Admit(snap *scheduler.Snapshot, tag uint64, i int) error {
	if i < 0 || i >= len(snap.Endpoints) {
		return fmt.Errorf("flowcontrol: endpoint index %d outside the snapshot's %d", i, len(snap.Endpoints))
	}
	if !a.Synced(snap, tag) {
		return ErrConflict
	}
	rec := a.record
	k := 0
	for k < len(rec) && rec[k].index < uint32(i) {
		k++
	}
	if k < len(rec) && rec[k].index == uint32(i) {
		rec[k].count++
	} else {
		rec = append(rec, admitted{})
		copy(rec[k+1:], rec[k:])
		rec[k] = admitted{index: uint32(i), count: 1}
	}
	a.record = rec
	a.writeBuf = appendRecord(a.writeBuf[:0], tag, rec)
	a.synced = false // the new token is not known until the next read
	switch err := a.store.Set(a.key, a.writeBuf, a.cas); {
	case errors.Is(err, ErrCASMismatch):
		a.stats.Conflicts++
		return ErrConflict
	case err != nil:
		a.stats.StoreErrors++
		return fmt.Errorf("flowcontrol: writing %q: %w", a.key, err)
	}
	a.stats.Admitted++
	a.countLocal(snap, tag, i)
	return nil
}

// countLocal counts a request sent to snap.Endpoints[i] in this VM's copy.
func (a *Admission) countLocal(snap *scheduler.Snapshot, tag uint64, i int) {
	a.use(snap, tag)
	a.applied[i]++
	snap.Endpoints[i].Metrics.WaitingQueueSize++
	snap.MetricsChanged(i)
}

// use starts over when snap is a new copy or tag a new snapshot.
func (a *Admission) use(snap *scheduler.Snapshot, tag uint64) {
	if a.snap == snap && a.tag == tag && len(a.applied) == len(snap.Endpoints) {
		return
	}
	a.snap, a.tag, a.synced = snap, tag, false
	if cap(a.applied) < len(snap.Endpoints) {
		a.applied = make([]int32, len(snap.Endpoints))
	}
	a.applied = a.applied[:len(snap.Endpoints)]
	clear(a.applied)
}

// The record: "WA" 1, the tag (8 bytes little-endian), a count n (4
// bytes), then n pairs of endpoint index and count (4 bytes each), indices
// strictly increasing, counts positive.
const (
	recordMagic0, recordMagic1 = 'W', 'A'
	recordVersion              = 1
	recordHeader               = 3 + 8 + 4
)

func appendRecord(dst []byte, tag uint64, rec []admitted) []byte {
	dst = append(dst, recordMagic0, recordMagic1, recordVersion)
	dst = binary.LittleEndian.AppendUint64(dst, tag)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(rec)))
	for _, r := range rec {
		dst = binary.LittleEndian.AppendUint32(dst, r.index)
		dst = binary.LittleEndian.AppendUint32(dst, r.count)
	}
	return dst
}

// decodeRecord appends the record's pairs to into and returns its tag. It
// refuses (false) anything but an exact, well-formed record.
func decodeRecord(b []byte, into []admitted) (uint64, []admitted, bool) {
	if len(b) < recordHeader || b[0] != recordMagic0 || b[1] != recordMagic1 || b[2] != recordVersion {
		return 0, into, false
	}
	tag := binary.LittleEndian.Uint64(b[3:])
	n := binary.LittleEndian.Uint32(b[11:])
	if uint64(len(b)-recordHeader) != 8*uint64(n) {
		return 0, into, false
	}
	start := len(into)
	for p := recordHeader; p < len(b); p += 8 {
		r := admitted{index: binary.LittleEndian.Uint32(b[p:]), count: binary.LittleEndian.Uint32(b[p+4:])}
		if r.count == 0 || r.count > 1<<30 || (len(into) > start && into[len(into)-1].index >= r.index) {
			return 0, into[:start], false
		}
		into = append(into, r)
	}
	return tag, into, true
}

// MemStore is kv.MemStore, for simulations that run several VMs in one
// process, and for tests.
type MemStore = kv.MemStore

// maxPlaceAttempts bounds Place's retries. Each retry means another VM
// admitted a request between this VM's read and write; a handful of
// workers cannot keep that up for long.
const maxPlaceAttempts = 8

// ErrContention is Place's answer after maxPlaceAttempts conflicts: the
// request stays queued for the next release.
var ErrContention = errors.New("flowcontrol: shared admission record kept changing")

// Place schedules one request under admission. try runs the scheduler on
// snap (after Sync brought it up to date) and returns the chosen endpoint
// index, or -1 when the request cannot be routed now (try keeps the
// reason). Place then admits it; on a conflict it syncs and calls try
// again. It returns the admitted index, or -1 with a nil error when try
// declined, or an error: ErrContention (nothing admitted), or a Store
// failure together with the index try chose without cross-VM agreement
// (counted in this VM's copy only; the caller routes there and logs) or
// -1.
func (a *Admission) Place(snap *scheduler.Snapshot, tag uint64, try func() int) (int, error) {
	for range maxPlaceAttempts {
		if !a.Synced(snap, tag) {
			if err := a.Sync(snap, tag); err != nil {
				i := try()
				if i >= 0 {
					a.countLocal(snap, tag, i)
				}
				return i, err
			}
		}
		i := try()
		switch {
		case i < 0:
			return -1, nil
		case i >= len(snap.Endpoints):
			return -1, fmt.Errorf("flowcontrol: endpoint index %d outside the snapshot's %d", i, len(snap.Endpoints))
		}
		switch err := a.Admit(snap, tag, i); {
		case err == nil:
			return i, nil
		case !errors.Is(err, ErrConflict):
			a.countLocal(snap, tag, i)
			return i, err
		}
	}
	return -1, ErrContention
}
