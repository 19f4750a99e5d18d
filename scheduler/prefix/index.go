package prefix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"
	"unsafe"
)

// Index defaults.
const (
	DefaultMaxEntries    = 65536
	DefaultBucketEntries = 16
	DefaultRecordEvery   = 4
	DefaultMaxRecord     = 256
	DefaultMaxPending    = 8192
	// DefaultMaxBytes leaves room for the default entries (about 1.1 MB).
	DefaultMaxBytes = 2 << 20
)

// IndexConfig configures an Index; zero fields take the defaults.
type IndexConfig struct {
	// MaxEntries bounds the (block, endpoint) entries held.
	MaxEntries int `json:"maxEntries,omitempty"`
	// MaxBytes bounds the bytes the index keeps in the store (buckets and
	// directory); each worker VM keeps a copy of the same size.
	MaxBytes int `json:"maxBytes,omitempty"`
	// BucketEntries is the entries per bucket (eviction is least recently
	// recorded first, within a bucket).
	BucketEntries int `json:"bucketEntries,omitempty"`
	// RecordEvery: only every RecordEvery-th block is recorded and looked
	// up (positions RecordEvery-1, 2·RecordEvery-1, ...), so a match is
	// known to RecordEvery blocks (4 × 64 bytes: about 64 tokens).
	RecordEvery int `json:"recordEvery,omitempty"`
	// MaxRecord bounds the entries one request writes; longer prompts
	// record evenly spaced positions, the deepest always.
	MaxRecord int `json:"maxRecord,omitempty"`
	// MaxPending bounds the writes waiting for the next Sync; more are
	// dropped (counted in Stats.DroppedWrites).
	MaxPending int `json:"maxPending,omitempty"`
	// KeyPrefix starts every store key.
	KeyPrefix string `json:"-"`
}

// WithDefaults returns c with zero fields set to the defaults.
func (c IndexConfig) WithDefaults() IndexConfig {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxEntries, DefaultMaxEntries)
	def(&c.MaxBytes, DefaultMaxBytes)
	def(&c.BucketEntries, DefaultBucketEntries)
	def(&c.RecordEvery, DefaultRecordEvery)
	def(&c.MaxRecord, DefaultMaxRecord)
	def(&c.MaxPending, DefaultMaxPending)
	return c
}

// Validate reports a field out of range (after WithDefaults).
func (c IndexConfig) Validate() error {
	switch {
	case c.BucketEntries < 1 || c.BucketEntries > 1024:
		return fmt.Errorf("bucketEntries must be in [1, 1024], got %d", c.BucketEntries)
	case c.MaxEntries < c.BucketEntries || c.MaxEntries > 1<<24:
		return fmt.Errorf("maxEntries must be in [bucketEntries, %d], got %d", 1<<24, c.MaxEntries)
	case c.RecordEvery < 1 || c.RecordEvery > 1024:
		return fmt.Errorf("recordEvery must be in [1, 1024], got %d", c.RecordEvery)
	case c.MaxRecord < 1 || c.MaxRecord > 1<<16:
		return fmt.Errorf("maxRecord must be in [1, 65536], got %d", c.MaxRecord)
	case c.MaxPending < 1 || c.MaxPending > 1<<20:
		return fmt.Errorf("maxPending must be in [1, 1048576], got %d", c.MaxPending)
	}
	if b := c.buckets(); b == 0 {
		return fmt.Errorf("maxBytes %d holds no bucket of %d entries (%d bytes each, plus the directory)", c.MaxBytes, c.BucketEntries, bucketBytes(c.BucketEntries)+4)
	}
	return nil
}

// buckets is the largest power of two of buckets within both bounds.
func (c IndexConfig) buckets() int {
	b := c.MaxEntries / c.BucketEntries
	for b > 0 && b*(bucketBytes(c.BucketEntries)+4)+dirHeader+genBytes > c.MaxBytes {
		b /= 2
	}
	if b == 0 {
		return 0
	}
	return 1 << (bits.Len(uint(b)) - 1)
}

// Layout (keys "<prefix>v2.prefix.dir", "<prefix>v2.prefix.gen" and
// "<prefix>v2.prefix.<bucket>", the shared-data layout reserves for the
// index): the generation is 8 bytes, the magic then a little-endian uint32
// raised by one after every directory write, so that a VM reads the
// directory only when it changed; every other value starts
// with a 4-byte magic, then a little-endian uint32 version. A bucket then
// has uint16 capacity, uint16 count, uint32 bucket count, and capacity
// entries of 16 bytes: block hash (uint64),
// endpoint key (uint32, 0 = free slot), stamp (uint32, tenths of a second
// since stampEpoch). The directory then has uint32 buckets and one uint32
// version per bucket. A value with another magic or shape is read as empty
// and overwritten by the next writer.
const (
	bucketHeader = 16
	entryBytes   = 16
	dirHeader    = 12
)

var (
	bucketMagic = [4]byte{'W', 'P', 'B', '1'}
	dirMagic    = [4]byte{'W', 'P', 'D', '1'}
	genMagic    = [4]byte{'W', 'P', 'G', '1'}
)

func bucketBytes(entries int) int { return bucketHeader + entries*entryBytes }

// stampEpoch is stamp 0; stamps are uint32 tenths of a second since, good
// for 13 years.
var stampEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Stamp converts a time to an entry stamp (clamped to [1, 2^32-1]).
func Stamp(t time.Time) uint32 {
	d := t.Sub(stampEpoch) / (100 * time.Millisecond)
	switch {
	case d < 1:
		return 1
	case d > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(d)
}

// EndpointKey is the 32-bit key the index records an endpoint under: a
// hash of its identity and address, never 0. A restarted pod with a new
// address is a new endpoint, as its cache is new.
func EndpointKey(namespace, name, address string, port int) uint32 {
	h := hashBytes(0x9e3779b97f4a7c15, unsafe.Slice(unsafe.StringData(namespace), len(namespace)))
	h = hashBytes(h, unsafe.Slice(unsafe.StringData(name), len(name)))
	h = hashBytes(h, unsafe.Slice(unsafe.StringData(address), len(address)))
	h = chain(h, uint64(port))
	k := uint32(h ^ h>>32)
	if k == 0 {
		k = 1
	}
	return k
}

// Stats are an index's counters since it was made.
type Stats struct {
	// Recorded and Forgotten count entries written and removed by this
	// VM; Evicted the entries its writes pushed out of full buckets.
	Recorded, Forgotten, Evicted int64
	// DroppedWrites counts writes lost: the pending buffer was full, or a
	// bucket stayed contended through every CAS retry.
	DroppedWrites int64
	// Flushes counts buckets written to the store; CASRetries the retries.
	Flushes, CASRetries int64
	// Fetched counts buckets read from the store because another VM
	// changed them; FetchedBytes their bytes (directory reads included).
	Fetched, FetchedBytes int64
	// DirectoryReads counts the directory reads: a Sync reads it only
	// when the generation moved since this VM last read it.
	DirectoryReads int64
	// StoreErrors counts store calls that failed other than by CAS.
	StoreErrors int64
}

// op is a write waiting for the next Sync.
type op struct {
	hash   uint64
	ep     uint32
	stamp  uint32
	bucket uint32
	forget bool
}

// Index records which endpoints most recently received which blocks. Its
// entries live in a fixed set of store keys: 2^k buckets chosen by block
// hash (Envoy's shared data has no delete, so keys are never created past
// that set) and a directory of bucket versions. Each Index (one per worker
// VM) keeps a full local copy that lookups read without any store call;
// its own writes apply to the copy at once and reach the store at the next
// Sync, which also re-reads exactly the buckets whose version another VM
// changed. A VM's view therefore lags another VM's writes by at most the
// two VMs' Sync periods (measured: TestCrossVMVisibility, BENCHMARKS.md).
//
// An Index is not safe for concurrent use (one per VM, single-threaded).
type Index struct {
	cfg    IndexConfig
	store  Store
	nb     int
	mask   uint64
	bsize  int
	keys   []string
	dirKey string
	genKey string
	// seenGen is the generation this VM's copy reflects (haveGen: one
	// was read); genBuf receives the generation value.
	seenGen uint32
	haveGen bool
	genBuf  []byte
	local   []byte
	ver     []uint32
	pending []op
	scratch []byte
	dirBuf  []byte
	touched []uint32
	stats   Stats
	// entries counts the entries in the local copy, kept as buckets
	// change: counting them (thousands of buckets) on every tick cost
	// more than the rest of the tick in a Wasm guest.
	entries int
}

// NewIndex returns an Index over store (nil: a private MemStore, an index
// that this VM alone sees).
func NewIndex(cfg IndexConfig, store Store) (*Index, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil {
		store = NewMemStore()
	}
	nb := cfg.buckets()
	x := &Index{cfg: cfg, store: store, nb: nb, mask: uint64(nb - 1), bsize: bucketBytes(cfg.BucketEntries)}
	x.keys = make([]string, nb)
	for i := range x.keys {
		x.keys[i] = fmt.Sprintf("%sv2.prefix.%d", cfg.KeyPrefix, i)
	}
	x.dirKey = cfg.KeyPrefix + "v2.prefix.dir"
	x.genKey = cfg.KeyPrefix + "v2.prefix.gen"
	x.genBuf = make([]byte, 0, 16)
	x.local = make([]byte, nb*x.bsize)
	for i := range nb {
		x.initBucket(x.localBucket(i))
	}
	x.ver = make([]uint32, nb)
	x.pending = make([]op, 0, min(cfg.MaxPending, 1024))
	x.scratch = make([]byte, x.bsize)
	return x, nil
}

// Config returns the configuration with defaults applied.
func (x *Index) Config() IndexConfig { return x.cfg }

// Buckets is the number of buckets; Capacity the entries they hold; Bytes
// the bytes kept in the store.
func (x *Index) Buckets() int  { return x.nb }
func (x *Index) Capacity() int { return x.nb * x.cfg.BucketEntries }
func (x *Index) Bytes() int    { return x.nb*x.bsize + dirHeader + 4*x.nb + genBytes }

// Stats returns the counters.
func (x *Index) Stats() Stats { return x.stats }

// Pending is the number of writes waiting for Sync.
func (x *Index) Pending() int { return len(x.pending) }

func (x *Index) localBucket(i int) []byte { return x.local[i*x.bsize : (i+1)*x.bsize] }

func (x *Index) initBucket(b []byte) {
	clear(b)
	copy(b, bucketMagic[:])
	binary.LittleEndian.PutUint16(b[8:], uint16(x.cfg.BucketEntries))
	binary.LittleEndian.PutUint32(b[12:], uint32(x.nb))
}

// Entries is the number of entries in this VM's copy.
func (x *Index) Entries() int { return x.entries }

// countEntries counts the entries of the local copy bucket by bucket
// (tests check Entries against it).
func (x *Index) countEntries() int {
	n := 0
	for i := range x.nb {
		n += bucketCount(x.localBucket(i))
	}
	return n
}

func bucketCount(b []byte) int { return int(binary.LittleEndian.Uint16(b[10:])) }

// setLocal replaces local bucket i with b (a valid bucket).
func (x *Index) setLocal(i int, b []byte) {
	l := x.localBucket(i)
	x.entries += bucketCount(b) - bucketCount(l)
	copy(l, b)
}

// applyLocal applies o to local bucket i.
func (x *Index) applyLocal(i int, o op) int {
	res := x.apply(x.localBucket(i), o)
	switch res {
	case applyAdded:
		x.entries++
	case applyForgot:
		x.entries--
	}
	return res
}

// Positions returns how many positions of a prompt of n blocks are
// recorded (n / RecordEvery); position k is block (k+1)·RecordEvery − 1.
func (x *Index) Positions(n int) int { return n / x.cfg.RecordEvery }

// Match is the result of a lookup: for each endpoint key that holds some
// recorded position of the prompt, the blocks matched (deepest position +
// 1). It is reused across lookups.
type Match struct {
	keys   []uint32
	blocks []int
	// Total is the prompt's blocks.
	Total int
}

// Reset empties m.
func (m *Match) Reset(total int) {
	m.keys, m.blocks, m.Total = m.keys[:0], m.blocks[:0], total
}

// Blocks returns the blocks matched for endpoint key k (0 when none).
func (m *Match) Blocks(k uint32) int {
	for i, v := range m.keys {
		if v == k {
			return m.blocks[i]
		}
	}
	return 0
}

// Len is the number of endpoints with a match.
func (m *Match) Len() int { return len(m.keys) }

// At returns the i-th endpoint key and its matched blocks.
func (m *Match) At(i int) (uint32, int) { return m.keys[i], m.blocks[i] }

// Best is the largest match.
func (m *Match) Best() int {
	b := 0
	for _, v := range m.blocks {
		b = max(b, v)
	}
	return b
}

func (m *Match) set(k uint32, blocks int) {
	for i, v := range m.keys {
		if v == k {
			m.blocks[i] = max(m.blocks[i], blocks)
			return
		}
	}
	m.keys = append(m.keys, k)
	m.blocks = append(m.blocks, blocks)
}

// Lookup fills m with what this VM's copy knows about blocks. The deepest
// recorded position an endpoint holds wins, whatever is missing before it
// (chained hashes: holding position k means holding the whole prefix up to
// it; shallower entries may have been evicted first). No store call.
func (x *Index) Lookup(blocks []uint64, m *Match) {
	m.Reset(len(blocks))
	// The fields are read once: in a Wasm guest each is a load in the
	// loop, and the loop runs once per recorded position.
	step, local, bsize, mask := x.cfg.RecordEvery, x.local, x.bsize, x.mask
	for p := step - 1; p < len(blocks); p += step {
		h := blocks[p]
		off := int(h&mask) * bsize
		b := local[off : off+bsize : off+bsize]
		for n, e := int(binary.LittleEndian.Uint16(b[10:])), bucketHeader; n > 0 && e+entryBytes <= len(b); e += entryBytes {
			ent := b[e : e+entryBytes : e+entryBytes]
			ep := binary.LittleEndian.Uint32(ent[8:])
			if ep == 0 {
				continue
			}
			n--
			if binary.LittleEndian.Uint64(ent) != h {
				continue
			}
			// Positions only deepen: the endpoint matched last (usually
			// the only one) takes p+1 with no search and no call.
			if k := len(m.keys) - 1; k >= 0 && k < len(m.blocks) && m.keys[k] == ep {
				m.blocks[k] = p + 1
			} else {
				m.set(ep, p+1)
			}
		}
	}
}

// Record notes that endpoint ep was sent a prompt of these blocks, of
// which the first matched blocks were already recorded for it: the
// recorded positions past matched are written, and the deepest matched
// position is refreshed (the deepest entry is the one lookups need).
// Writes apply to this VM's copy now and to the store at the next Sync.
func (x *Index) Record(blocks []uint64, ep uint32, matched int, now time.Time) {
	step := x.cfg.RecordEvery
	npos := len(blocks) / step
	if npos == 0 || ep == 0 {
		return
	}
	stamp := Stamp(now)
	first := 0 // first position to write
	if matched >= step {
		first = min(matched/step-1, npos-1) // refresh the deepest matched one
	}
	count := npos - first
	stride := 1
	if count > x.cfg.MaxRecord {
		stride = (count + x.cfg.MaxRecord - 1) / x.cfg.MaxRecord
	}
	for k := npos - 1; k >= first; k -= stride {
		x.write(op{hash: blocks[(k+1)*step-1], ep: ep, stamp: stamp})
	}
}

// Forget removes the entries of endpoint ep for the recorded positions of
// blocks that cover more than from blocks, except entries recorded after
// before: a predicted hit of len(blocks) blocks that the endpoint reported
// as a hit of only from blocks. Pass the prompt's blocks cut at the
// prediction, so what the request itself recorded past it stays (the
// endpoint has just computed those blocks).
func (x *Index) Forget(blocks []uint64, ep uint32, from int, before time.Time) {
	step := x.cfg.RecordEvery
	stamp := Stamp(before)
	for p := (max(from, 0)/step+1)*step - 1; p < len(blocks); p += step {
		x.write(op{hash: blocks[p], ep: ep, stamp: stamp, forget: true})
	}
}

func (x *Index) write(o op) {
	o.bucket = uint32(o.hash & x.mask)
	switch x.applyLocal(int(o.bucket), o) {
	case applyNone:
		// Nothing to tell the others: this VM's copy already says it (a
		// refresh within one stamp, or a forget of what is gone).
		return
	case applyAdded:
		x.stats.Recorded++
	case applyEvicted:
		x.stats.Recorded++
		x.stats.Evicted++
	case applyForgot:
		x.stats.Forgotten++
	}
	if len(x.pending) >= x.cfg.MaxPending {
		x.stats.DroppedWrites++
		return
	}
	x.pending = append(x.pending, o)
}

// What apply did.
const (
	applyNone    = iota
	applyAdded   // a new entry in a free slot
	applyEvicted // a new entry in place of the oldest
	applyRefresh // a newer stamp on an existing entry
	applyForgot  // an entry removed
)

// apply changes one bucket for one op.
func (x *Index) apply(b []byte, o op) int {
	ents := b[bucketHeader:]
	free, oldest, oldestStamp := -1, -1, uint32(1<<32-1)
	count := int(binary.LittleEndian.Uint16(b[10:]))
	for j := range x.cfg.BucketEntries {
		ent := ents[j*entryBytes : (j+1)*entryBytes]
		ep := binary.LittleEndian.Uint32(ent[8:])
		if ep == 0 {
			if free < 0 {
				free = j
			}
			continue
		}
		st := binary.LittleEndian.Uint32(ent[12:])
		if ep == o.ep && binary.LittleEndian.Uint64(ent) == o.hash {
			if o.forget {
				if st > o.stamp {
					return applyNone // recorded again since: keep
				}
				clear(ent)
				binary.LittleEndian.PutUint16(b[10:], uint16(count-1))
				return applyForgot
			}
			if st >= o.stamp {
				return applyNone
			}
			binary.LittleEndian.PutUint32(ent[12:], o.stamp)
			return applyRefresh
		}
		if st < oldestStamp {
			oldest, oldestStamp = j, st
		}
	}
	if o.forget {
		return applyNone
	}
	res := applyAdded
	slot := free
	if slot < 0 {
		if oldestStamp > o.stamp {
			return applyNone // everything here is newer
		}
		slot, res = oldest, applyEvicted
	} else {
		binary.LittleEndian.PutUint16(b[10:], uint16(count+1))
	}
	ent := ents[slot*entryBytes : (slot+1)*entryBytes]
	binary.LittleEndian.PutUint64(ent, o.hash)
	binary.LittleEndian.PutUint32(ent[8:], o.ep)
	binary.LittleEndian.PutUint32(ent[12:], o.stamp)
	return res
}

// keepScratch adopts a value the store returned as the scratch buffer when
// it is larger (a store may return its own slice, or nil when the key is
// missing); the scratch always holds at least one bucket.
func (x *Index) keepScratch(v []byte) {
	if cap(v) > cap(x.scratch) {
		x.scratch = v[:0]
	}
}

// validBucket reports whether b is a bucket of this layout.
func (x *Index) validBucket(b []byte) bool {
	if len(b) != x.bsize || [4]byte(b[:4]) != bucketMagic || int(binary.LittleEndian.Uint16(b[8:])) != x.cfg.BucketEntries ||
		binary.LittleEndian.Uint32(b[12:]) != uint32(x.nb) {
		return false
	}
	count := 0
	for j := range x.cfg.BucketEntries {
		if binary.LittleEndian.Uint32(b[bucketHeader+j*entryBytes+8:]) != 0 {
			count++
		}
	}
	return count == int(binary.LittleEndian.Uint16(b[10:]))
}

// maxCASRetries bounds the attempts at one bucket or the directory per Sync.
const maxCASRetries = 4

// retryAfter counts a failed CAS write: true (retry) when another VM wrote
// first, false for any other store error.
func (x *Index) retryAfter(err error) bool {
	if errors.Is(err, ErrCASMismatch) {
		x.stats.CASRetries++
		return true
	}
	x.stats.StoreErrors++
	return false
}

// Sync writes this VM's pending writes into the store, then re-reads every
// bucket another VM changed since the last Sync. The plugin calls it from
// its tick; the cost is one read of the 8-byte generation, plus, when
// another VM wrote since, one directory read, and one read and write per
// bucket that changed.
func (x *Index) Sync() {
	x.flush()
	x.fetch()
}

func (x *Index) flush() {
	if len(x.pending) == 0 {
		return
	}
	slices.SortStableFunc(x.pending, func(a, b op) int { return int(a.bucket) - int(b.bucket) })
	x.touched = x.touched[:0]
	kept := x.pending[:0]
	for i := 0; i < len(x.pending); {
		j := i
		for j < len(x.pending) && x.pending[j].bucket == x.pending[i].bucket {
			j++
		}
		ops := x.pending[i:j]
		bi := int(ops[0].bucket)
		ver, ok := x.writeBucket(bi, ops)
		switch {
		case ok && ver != 0:
			x.touched = append(x.touched, uint32(bi), ver)
		case ok:
		case len(kept)+len(ops) <= x.cfg.MaxPending/2:
			kept = append(kept, ops...) // try again at the next Sync
		default:
			x.stats.DroppedWrites += int64(len(ops))
		}
		i = j
	}
	x.pending = kept
	if len(x.touched) > 0 {
		x.writeDirectory()
	}
}

// writeBucket merges ops into the store's bucket bi with CAS and returns
// the version written.
func (x *Index) writeBucket(bi int, ops []op) (uint32, bool) {
	key := x.keys[bi]
	for range maxCASRetries {
		cur, cas, err := x.store.Get(key, x.scratch)
		x.keepScratch(cur)
		b := cur
		switch {
		case errors.Is(err, ErrNotFound):
			cas = 0
			b = x.scratch[:x.bsize]
			x.initBucket(b)
		case err != nil:
			x.stats.StoreErrors++
			return 0, false
		case !x.validBucket(b):
			b = x.scratch[:x.bsize]
			x.initBucket(b)
		}
		changed := false
		for _, o := range ops {
			changed = x.apply(b, o) != applyNone || changed
		}
		if !changed {
			// The store already holds all of it: nothing to write and
			// nothing for the others to fetch (0: no directory update).
			if cas != 0 {
				x.setLocal(bi, b)
				x.ver[bi] = binary.LittleEndian.Uint32(b[4:])
			}
			return 0, true
		}
		ver := binary.LittleEndian.Uint32(b[4:]) + 1
		binary.LittleEndian.PutUint32(b[4:], ver)
		err = x.store.Set(key, b, cas)
		if err == nil {
			x.stats.Flushes++
			x.setLocal(bi, b)
			x.ver[bi] = ver
			return ver, true
		}
		if !x.retryAfter(err) {
			return 0, false
		}
	}
	return 0, false
}

// writeDirectory raises the directory's versions of the touched buckets.
func (x *Index) writeDirectory() {
	for range maxCASRetries {
		cur, cas, err := x.store.Get(x.dirKey, x.dirBuf)
		if cap(cur) > cap(x.dirBuf) {
			x.dirBuf = cur[:0]
		}
		d := cur
		switch {
		case errors.Is(err, ErrNotFound):
			cas = 0
			d = x.newDirectory()
		case err != nil:
			x.stats.StoreErrors++
			return
		case !x.validDirectory(d):
			d = x.newDirectory()
		}
		for i := 0; i < len(x.touched); i += 2 {
			at := dirHeader + 4*int(x.touched[i])
			if v := x.touched[i+1]; int32(v-binary.LittleEndian.Uint32(d[at:])) > 0 {
				binary.LittleEndian.PutUint32(d[at:], v)
			}
		}
		binary.LittleEndian.PutUint32(d[4:], binary.LittleEndian.Uint32(d[4:])+1)
		err = x.store.Set(x.dirKey, d, cas)
		if err == nil {
			x.raiseGeneration()
			return
		}
		if !x.retryAfter(err) {
			return
		}
	}
	// The buckets are written; other VMs see them once a later directory
	// write of any VM carries a version at least as high.
	x.stats.DroppedWrites++
}

const genBytes = 8

// readGeneration returns the stored generation (0 when missing or not
// of this layout: a later directory write replaces it).
func (x *Index) readGeneration() (gen, cas uint32, err error) {
	g, cas, err := x.store.Get(x.genKey, x.genBuf)
	if cap(g) > cap(x.genBuf) {
		x.genBuf = g[:0]
	}
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, 0, nil
	case err != nil:
		x.stats.StoreErrors++
		return 0, 0, err
	case len(g) != genBytes || [4]byte(g[:4]) != genMagic:
		return 0, cas, nil
	}
	return binary.LittleEndian.Uint32(g[4:]), cas, nil
}

// raiseGeneration adds one to the generation after a directory write, so
// that every VM's next Sync reads the directory. It is a CAS increment,
// so a generation never repeats: a VM that saw generation g and sees g
// again knows that no directory write finished in between. This VM's own
// write needs no read back when nobody else wrote since its last fetch
// (the generation was still the one it had seen).
func (x *Index) raiseGeneration() {
	for range maxCASRetries {
		g, cas, err := x.readGeneration()
		if err != nil {
			return
		}
		var b [genBytes]byte
		copy(b[:], genMagic[:])
		binary.LittleEndian.PutUint32(b[4:], g+1)
		err = x.store.Set(x.genKey, b[:], cas)
		if err == nil {
			if x.haveGen && g == x.seenGen {
				x.seenGen = g + 1
			}
			return
		}
		if !x.retryAfter(err) {
			return
		}
	}
	// Not raised: the directory holds the writes, and the others read
	// them once any later directory write raises the generation.
	x.stats.DroppedWrites++
}

func (x *Index) newDirectory() []byte {
	d := append(x.dirBuf[:0], make([]byte, dirHeader+4*x.nb)...)
	copy(d, dirMagic[:])
	binary.LittleEndian.PutUint32(d[8:], uint32(x.nb))
	x.dirBuf = d[:0]
	return d
}

func (x *Index) validDirectory(d []byte) bool {
	return len(d) == dirHeader+4*x.nb && [4]byte(d[:4]) == dirMagic && binary.LittleEndian.Uint32(d[8:]) == uint32(x.nb)
}

// fetch re-reads the buckets whose directory version differs from this
// VM's copy, when the generation moved since this VM last read the
// directory (the generation is read first: a directory write that ends
// after it raises it again, and the next fetch reads it).
func (x *Index) fetch() {
	gen, _, err := x.readGeneration()
	if err != nil {
		return
	}
	if x.haveGen && gen == x.seenGen {
		return
	}
	x.stats.DirectoryReads++
	d, _, err := x.store.Get(x.dirKey, x.dirBuf)
	if cap(d) > cap(x.dirBuf) {
		x.dirBuf = d[:0]
	}
	switch {
	case errors.Is(err, ErrNotFound):
		x.seenGen, x.haveGen = gen, true // nothing written yet
		return
	case err != nil:
		x.stats.StoreErrors++
		return
	case !x.validDirectory(d):
		return
	}
	x.stats.FetchedBytes += int64(len(d))
	// The generation counts as seen only when every changed bucket was
	// read: a failed read is retried at the next Sync.
	complete := true
	for i := range x.nb {
		v := binary.LittleEndian.Uint32(d[dirHeader+4*i:])
		if v == x.ver[i] {
			continue
		}
		b, _, err := x.store.Get(x.keys[i], x.scratch)
		x.keepScratch(b)
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				x.stats.StoreErrors++
			}
			complete = false
			continue
		}
		x.stats.Fetched++
		x.stats.FetchedBytes += int64(len(b))
		if !x.validBucket(b) {
			complete = false
			continue
		}
		x.setLocal(i, b)
		x.ver[i] = max(v, binary.LittleEndian.Uint32(b[4:]))
		// Writes of this VM still waiting (a contended bucket) stay visible.
		for _, o := range x.pending {
			if int(o.bucket) == i {
				x.applyLocal(i, o)
			}
		}
	}
	if complete {
		x.seenGen, x.haveGen = gen, true
	}
}
