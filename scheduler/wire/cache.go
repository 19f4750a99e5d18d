package wire

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/internal/timewords"
)

// Cache is a router's view of layout version 2: a scheduler.Snapshot kept
// up to date from shared data at the cost of what changed. Refresh reads
// the directory (DirBytes) and compares its generation; only when it moved
// are the segments whose generation moved read again, and only their
// endpoints rewritten, in place. A block whose identity (strings,
// endpoints, adapters) is unchanged has only its values rewritten, so an
// ordinary metrics change allocates nothing and touches no string.
//
// The snapshot Refresh returns is owned by the Cache and rewritten by the
// next Refresh: use it until then (a Proxy-Wasm VM handles one callback at
// a time, and a request schedules within one). Not safe for concurrent use.
type Cache struct {
	keys    Keys
	lim     Limits
	checker blockChecker

	dirBuf []byte
	dir    Directory
	valid  bool // dir holds what the snapshot was built from
	// dirAbsent: the last read found no directory (nothing stored yet).
	dirAbsent bool

	segs [NumSegments]segView
	// all is every endpoint of every segment, segment by segment; snap
	// shows it (or, when two agents report the same endpoint, a copy
	// without the older reports).
	all  []scheduler.Endpoint
	snap scheduler.Snapshot
	// identity changes whenever an endpoint's identity, address or
	// position may have changed (see Identity); tag names the content.
	identity uint64
	tag      uint64
	// reports counts the blocks reporting each endpoint, kept as blocks
	// come, go and change identity; dups counts endpoints reported more
	// than once (then the snapshot is a deduplicated copy).
	reports map[scheduler.EndpointID]int32
	dups    int
	ids     map[scheduler.EndpointID]int
	deduped []scheduler.Endpoint

	stats CacheStats
}

// CacheStats counts a Cache's work since it was made.
type CacheStats struct {
	// Changes: refreshes that found a new directory generation.
	Changes int
	// SegmentReads and BytesRead: segment values read. Rebuilds: blocks
	// whose strings were made anew (their identity changed).
	SegmentReads, BytesRead, Rebuilds int
	// Errors: unreadable directory or segment values (the previous
	// content was kept).
	Errors int
}

// segView is one segment as the cache last read it.
type segView struct {
	known  bool
	gen    uint32
	buf    []byte // the value cur points into
	cur    Segment
	strs   []blockRead // parallel to cur.Blocks
	off, n int         // its endpoints in Cache.all
	newest int64       // latest received of its blocks

	// contiguous: cur.Blocks lie back to back in buf, from its header
	// to its end (what checkSameLayout needs); written: this read has
	// already rewritten the segment's endpoints (no materialize);
	// allRewritten: it rewrote every endpoint (no block unchanged).
	contiguous, written, allRewritten bool

	// the next value, while it is being checked
	spare    []byte
	next     Segment
	nextStrs []blockRead
	kept     []bool // current block j is carried over with its identity
	changed  bool
}

// blockRead is how a segment's block was read: its strings, and whether
// it has the identity (sameID) and the adapter lists (refsSame) of the
// block it replaced, or is that very block (unchanged: same sequence,
// receipt and held time; the receiver copies a block it keeps verbatim),
// whose endpoints then need no rewrite.
type blockRead struct {
	strs                        *blockStrings
	sameID, refsSame, unchanged bool
}

// blockStrings are one block's strings, kept while its identity stays.
type blockStrings struct {
	strs     []string
	adapters []string // backing array of the endpoints' adapter lists
}

// NewCache returns an empty cache reading keys.
func NewCache(keys Keys, lim Limits) *Cache {
	return &Cache{keys: keys, lim: lim.resolved()}
}

// Identity changes whenever an endpoint's identity, address or index in
// the snapshot may have changed: values cached per endpoint index (such as
// formatted destinations) stay valid while it does not.
func (c *Cache) Identity() uint64 { return c.identity }

// Tag names the content the snapshot was built from (every segment's
// generation): two caches with the same Tag hold the same endpoints in the
// same order, whatever directory generation they read.
func (c *Cache) Tag() uint64 { return c.tag }

// Directory is the directory the snapshot was built from (zero before the
// first successful Refresh).
func (c *Cache) Directory() *Directory { return &c.dir }

// ConfigGen is the configuration record's generation the directory names
// (0: none); known is false when the last directory read failed, so the
// caller keeps what it has.
func (c *Cache) ConfigGen() (gen uint64, known bool) {
	if !c.valid {
		return 0, c.dirAbsent
	}
	return c.dir.ConfigGen, true
}

// Stats returns the counters.
func (c *Cache) Stats() CacheStats { return c.stats }

// Refresh brings the snapshot up to date and returns it; changed says
// whether it moved. On a read error it keeps what it could not read as it
// was and returns the error with the snapshot.
func (c *Cache) Refresh(st Store) (snap *scheduler.Snapshot, changed bool, err error) {
	b, _, err := st.Get(c.keys.Dir, c.dirBuf[:0])
	if cap(b) > cap(c.dirBuf) && cap(b) <= 2*DirBytes {
		c.dirBuf = b[:0]
	}
	c.dirAbsent = err != nil && errors.Is(err, ErrNotFound)
	switch {
	case c.dirAbsent:
		if !c.valid && len(c.all) == 0 {
			return &c.snap, false, nil
		}
		c.reset()
		return &c.snap, true, nil
	case err != nil:
		return &c.snap, false, err
	}
	if gen, ok := DirGen(b); ok && c.valid && gen == c.dir.Gen {
		return &c.snap, false, nil
	}
	if err := DecodeDirectory(b, &c.dir); err != nil {
		c.stats.Errors++
		c.valid = false
		return &c.snap, false, err
	}
	c.valid = true
	c.stats.Changes++
	layout, ident := false, false
	hadDups := c.dups > 0
	var firstErr error
	for k := range c.segs {
		sv := &c.segs[k]
		sv.changed = false
		e := c.dir.Entries[k]
		if sv.known && e.Gen == sv.gen {
			continue
		}
		moved, strs, err := c.readSegment(st, k, e.Gen)
		if err != nil {
			c.stats.Errors++
			if firstErr == nil {
				firstErr = err
			}
		}
		layout = layout || moved
		ident = ident || strs
	}
	if layout {
		c.relayout()
	} else {
		for k := range c.segs {
			if sv := &c.segs[k]; sv.changed && !sv.written {
				c.materialize(k, false)
			}
		}
	}
	if layout || ident {
		c.identity++
	}
	c.publish()
	c.tellScheduler(layout || ident || hadDups)
	return &c.snap, true, firstErr
}

// tellScheduler reports the in-place rewrite to an index the scheduler
// may keep on the snapshot (scheduler.Snapshot.MetricsChanged, Changed):
// each endpoint of a rewritten segment when only values and adapter lists
// moved, the whole snapshot when identities, order or count did (or when
// it is a deduplicated copy, whose positions are not c.all's).
func (c *Cache) tellScheduler(identities bool) {
	if identities || c.dups > 0 {
		c.snap.Changed()
		return
	}
	// Runs of rewritten blocks are told as one range each, across the
	// blocks and segments that lie next to each other in c.all (at the
	// knee, most of a relay in one call).
	from, to := 0, 0
	for k := range c.segs {
		sv := &c.segs[k]
		if !sv.changed {
			continue
		}
		i := sv.off
		if sv.allRewritten {
			if i != to {
				c.snap.MetricsChangedRange(from, to)
				from = i
			}
			to = i + sv.n
			continue
		}
		for bi := range sv.cur.Info {
			n := sv.cur.Info[bi].Len
			if !sv.strs[bi].unchanged {
				if i != to {
					c.snap.MetricsChangedRange(from, to)
					from = i
				}
				to = i + n
			}
			i += n
		}
	}
	c.snap.MetricsChangedRange(from, to)
}

// reset forgets everything (the directory is gone: a new Envoy, or the
// keys changed).
func (c *Cache) reset() {
	for k := range c.segs {
		c.segs[k] = segView{}
	}
	c.all, c.deduped, c.dups = c.all[:0], c.deduped[:0], 0
	clear(c.reports)
	c.valid = false
	c.dir = Directory{}
	c.identity++
	c.publish()
	c.snap.Changed()
}

// readSegment reads segment k again and makes it current. moved: its
// endpoint count or block layout changed; strs: some block's identity
// changed. On error the segment keeps its previous content (and is tried
// again when its generation moves).
func (c *Cache) readSegment(st Store, k int, dirGen uint32) (moved, strs bool, err error) {
	sv := &c.segs[k]
	sv.written, sv.allRewritten = false, false
	var b []byte
	if dirGen != 0 {
		var gerr error
		b, _, gerr = st.Get(c.keys.Segments[k], sv.spare[:0])
		if cap(b) > cap(sv.spare) {
			sv.spare = b[:0]
		}
		switch {
		case gerr == nil:
		case errors.Is(gerr, ErrNotFound):
			b = nil
		default:
			return false, false, gerr
		}
	}
	if len(b) > 0 && c.rereadInPlace(sv, b) {
		c.stats.SegmentReads++
		c.stats.BytesRead += len(b)
		sv.gen = sv.cur.Gen
		return false, false, nil
	}
	sv.next.Blocks, sv.next.Gen = sv.next.Blocks[:0], dirGen
	if len(b) > 0 {
		c.stats.SegmentReads++
		c.stats.BytesRead += len(b)
		if e := walkSegment(b, k, &c.lim, &sv.next); e != nil {
			sv.known, sv.gen = true, dirGen
			return false, false, e
		}
	}
	// Match each new block with the current block of the same identity:
	// the receiver keeps a block's identity while its strings and
	// endpoints stay, so only its values and adapters need reading. A
	// block that fails its checks is left out (and reported); the rest of
	// the segment is used.
	sv.nextStrs = sv.nextStrs[:0]
	sv.kept = append(sv.kept[:0], make([]bool, len(sv.cur.Blocks))...)
	moved = len(sv.next.Blocks) != len(sv.cur.Blocks)
	n := 0
	cur, next := sv.cur.Info, sv.next.Info
	kept := 0 // blocks kept so far; they move down over the ones left out
	for i := range next {
		bi := &next[i]
		blk := sv.next.Blocks[i]
		if kept != i {
			sv.next.Blocks[kept], next[kept] = blk, *bi
			bi = &next[kept]
		}
		at := kept // its position among the blocks kept
		j := -1
		if at < len(cur) && cur[at].Identity == bi.Identity {
			j = at
		} else {
			for jj := range cur {
				if cur[jj].Identity == bi.Identity {
					j = jj
					moved = true // the same block at another position
					break
				}
			}
		}
		if j >= 0 && cur[j].Len == bi.Len && cur[j].Strings == bi.Strings {
			refsSame := cur[j].Refs == bi.Refs && sameRefs(blk, sv.cur.Blocks[j], bi.Len, bi.Refs)
			if !refsSame && !checkRefs(blk, &c.lim) {
				if err == nil {
					err = errf(ErrInvalidField, "segment.blocks["+strconv.Itoa(i)+"].refs", -1, "adapter references out of range; block left out")
				}
				moved = true
				continue
			}
			kept++
			n += bi.Len
			o := &cur[j]
			unchanged := refsSame && o.Seq == bi.Seq && o.Received == bi.Received && o.Held == bi.Held
			sv.nextStrs = append(sv.nextStrs, blockRead{sv.strs[j].strs, true, refsSame, unchanged})
			sv.kept[j] = true
			continue
		}
		// A new identity: check everything before using its indexes and
		// strings.
		if e := c.checkNew(blk, i); e != nil {
			if err == nil {
				err = e
			}
			moved = true
			continue
		}
		kept++
		n += bi.Len
		moved = moved || at >= len(cur) || cur[at].Len != bi.Len
		var bs *blockStrings
		for jj, o := range sv.cur.Blocks { // same strings, other endpoints or adapters?
			if bytes.Equal(o.AgentID(), blk.AgentID()) && equalBytes(o.StringTable(), blk.StringTable()) {
				bs = &blockStrings{strs: sv.strs[jj].strs.strs}
				break
			}
		}
		if bs == nil {
			c.stats.Rebuilds++
			bs = &blockStrings{strs: blk.Strings(nil)}
		}
		// A new string table naming the endpoints the block in its place
		// named (the agent's encoder dropped or added adapter names) keeps
		// every endpoint's identity, address and position: its endpoints
		// are rewritten, but nothing kept per endpoint elsewhere goes stale.
		strs = strs || moved || !sameEndpoints(blk, bs.strs, sv.cur.Blocks[at], sv.strs[at].strs.strs)
		sv.nextStrs = append(sv.nextStrs, blockRead{bs, false, false, false})
	}
	sv.next.Blocks, sv.next.Info = sv.next.Blocks[:kept], next[:kept]
	// The new value (without the blocks left out) becomes the segment's
	// content. Endpoints
	// of blocks that went or changed identity stop counting as reported,
	// those of new identities start.
	for j, o := range sv.cur.Blocks {
		if !sv.kept[j] {
			c.count(o, sv.strs[j].strs.strs, -1)
		}
	}
	for i, blk := range sv.next.Blocks {
		if !sv.nextStrs[i].sameID {
			c.count(blk, sv.nextStrs[i].strs.strs, +1)
		}
	}
	sv.buf, sv.spare = b, sv.buf
	sv.cur, sv.next = sv.next, sv.cur
	sv.strs, sv.nextStrs = sv.nextStrs, sv.strs
	clear(sv.nextStrs) // drop references to strings no longer used
	sv.known, sv.changed = true, true
	sv.gen = dirGen
	if len(b) > 0 {
		sv.gen = sv.cur.Gen
	}
	sv.newest = 0
	for i := range sv.cur.Info {
		sv.newest = max(sv.newest, sv.cur.Info[i].Received)
	}
	sv.contiguous = isContiguous(sv.buf, sv.cur.Blocks)
	moved = moved || n != sv.n
	sv.n = n
	return moved, strs || moved, err
}

// rereadInPlace takes the new value b of segment sv when it holds the
// same blocks as the current one, in the same order (same identities,
// endpoint and string counts): the common re-read, where only values,
// times and adapter lists moved. It checks every block first, changing
// nothing but the read flags, and reports false when the layout differs
// or a check fails (readSegment then reads b the general way); it checks
// what walkSegment and readSegment would (each block fits, its records
// fit, new adapter references are in range). Then it copies b into the
// current value's buffer, so the current blocks (views of it) read the
// new content, updates their headers field by field and rewrites the
// endpoints of the blocks that changed, so the segment needs no
// materialize. Only when a block's adapter list changed length, and so
// blocks moved, are views stored anew: pointer stores are what the guest
// pays a write barrier for while its collector marks (BENCHMARKS.md).
//
// In the common case (values moved, adapter lists did not) the loops
// take few branches and make one call per block: refsDiffer in the
// checks, rewriteValues in the commit, each a loop over the block of its
// own (checkRefs and fillBlock run only for a block whose adapter lists
// changed; the compiler inlines none of them, go build -gcflags=-m). In
// the Wasm guest every taken branch goes through the function's
// dispatch and every call spills the loop's state to the Go stack in
// linear memory, which was most of what a re-read cost ("The router's
// re-read, restructured"): no call is made per endpoint (while ages stay
// under a second: see rewriteValues).
func (c *Cache) rereadInPlace(sv *segView, b []byte) bool {
	cur := sv.cur.Info
	if !sv.known || len(b) < segHeaderBytes || len(cur) != len(sv.cur.Blocks) ||
		b[0] != magicSegment[0] || b[1] != magicSegment[1] || b[2] != version2 || int(b[3]) != sv.cur.Index ||
		int(le16(b, 8)) != len(cur) || le16(b, 10) != 0 || le32(b, 12) != 0 {
		return false
	}
	resized, ok := false, sv.contiguous && len(b) == len(sv.buf) && c.checkSameLayout(sv, b)
	if !ok {
		resized, ok = c.checkInPlace(sv, b)
	}
	if !ok {
		return false
	}
	// Blocks stay where they are when none changed size in a current
	// value whose blocks lie back to back (then b has its length).
	moved := resized || !sv.contiguous
	if cap(sv.buf) < len(b) {
		sv.buf, sv.spare = b, sv.buf // b is sv.spare's storage, or larger
		moved = true
	} else {
		sv.buf = sv.buf[:len(b)]
		copy(sv.buf, b)
	}
	c.commitInPlace(sv, moved)
	sv.cur.Gen = le32(b, 4)
	sv.known, sv.changed, sv.written, sv.contiguous = true, true, true, true
	return true
}

// checkSameLayout is checkInPlace's common case, taken when the current
// blocks lie back to back in sv.buf (contiguous) and b has its length: b
// then holds the same blocks at the same offsets when every block header
// has the current one's size, counts and identity, which it compares as
// words with the bytes already checked (no bounds to check: each block
// lies where the current one does).
func (c *Cache) checkSameLayout(sv *segView, b []byte) bool {
	cur, strs := sv.cur.Info, sv.strs[:len(sv.cur.Info)]
	nb, ob := unsafe.Pointer(unsafe.SliceData(b)), unsafe.Pointer(unsafe.SliceData(sv.buf))
	off := segHeaderBytes
	for i := range cur {
		p, q := unsafe.Add(nb, off), unsafe.Add(ob, off)
		size := int(ld32(q, bhLen))
		// Size, then counts and flags, string bytes and identity, zero.
		d := uint64(ld32(p, bhLen)^ld32(q, bhLen)) | (ld64(p, bhEps) ^ ld64(q, bhEps)) | (ld64(p, bhStrBytes) ^ ld64(q, bhStrBytes)) |
			uint64(ld32(p, bhZero)^ld32(q, bhZero))
		if d != 0 {
			return false
		}
		d = refsDiffer(p, q, cur[i].Len, cur[i].Refs, size)
		if d != 0 && !checkRefs(Block(b[off:off+size]), &c.lim) {
			return false
		}
		strs[i].refsSame = d == 0
		off += size
	}
	return true
}

// refsDiffer is nonzero when the blocks at p and q, of the same layout (n
// endpoints, nRefs refs, size bytes), have different adapter lists: each
// record's refs_first and counts (two records a turn), then the refs a
// word at a time. A word may run into the string lengths and strings that
// follow, the same in both blocks (same identity), so it compares no less
// than it must; a block too short for that compares exactly.
func refsDiffer(p, q unsafe.Pointer, n, nRefs, size int) uint64 {
	var d uint64
	at := blockHeaderBytes + erRefsFirst
	for ; n >= 2; n -= 2 {
		d |= uint64(ld32(p, at)^ld32(q, at)) | uint64(ld32(p, at+recordBytes)^ld32(q, at+recordBytes))
		at += 2 * recordBytes
	}
	if n == 1 {
		d |= uint64(ld32(p, at) ^ ld32(q, at))
		at += recordBytes
	}
	at -= erRefsFirst
	if end := at + 2*nRefs; end+7 <= size {
		for ; at < end; at += 8 {
			d |= ld64(p, at) ^ ld64(q, at)
		}
	} else {
		for ; at < end; at += 2 {
			d |= uint64(ld16(p, at) ^ ld16(q, at))
		}
	}
	return d
}

// checkInPlace is rereadInPlace's check of every block of b against the
// current one; resized: some block's adapter refs changed count.
func (c *Cache) checkInPlace(sv *segView, b []byte) (resized, ok bool) {
	cur := sv.cur.Info
	blocks, strs := sv.cur.Blocks[:len(cur)], sv.strs[:len(cur)]
	nb := unsafe.Pointer(unsafe.SliceData(b))
	off := segHeaderBytes
	for i := range cur {
		if len(b)-off < blockHeaderBytes {
			return false, false
		}
		p, q := unsafe.Add(nb, off), unsafe.Pointer(unsafe.SliceData(blocks[i]))
		size := int(ld32(p, bhLen))
		// Counts and flags, string bytes and identity, zero: all as the
		// current block's but the refs count, which the mask takes out
		// of the counts word alone.
		d := ld64(p, bhEps) ^ ld64(q, bhEps)
		rest := (ld64(p, bhStrBytes) ^ ld64(q, bhStrBytes)) | uint64(ld32(p, bhZero)^ld32(q, bhZero))
		if rest|d&^(0xffff<<(8*(bhRefs-bhEps))) != 0 || size > len(b)-off {
			return false, false
		}
		if d |= uint64(size ^ len(blocks[i])); d == 0 {
			// The same layout: the adapter lists are each record's
			// refs_first and counts (two records a turn), then the refs a
			// word at a time. A word may run into the string lengths and
			// strings that follow, the same in both blocks (same
			// identity), so it compares no less than it must; a block too
			// short for that compares exactly.
			if d = refsDiffer(p, q, cur[i].Len, cur[i].Refs, size); d != 0 && !checkRefs(Block(b[off:off+size]), &c.lim) {
				return false, false
			}
		} else if blockHeaderBytes+cur[i].Len*recordBytes > size || !checkRefs(Block(b[off:off+size]), &c.lim) {
			return false, false // another refs count: the records must fit, the refs be in range
		} else {
			resized = true
		}
		strs[i].refsSame = d == 0
		off += size
	}
	return resized, off == len(b)
}

// commitInPlace is rereadInPlace's update of the current blocks from
// sv.buf, which holds the checked new value: their headers, their views
// when they moved, and their endpoints.
func (c *Cache) commitInPlace(sv *segView, moved bool) {
	cur := sv.cur.Info
	blocks, strs := sv.cur.Blocks[:len(cur)], sv.strs[:len(cur)]
	ob := unsafe.Pointer(unsafe.SliceData(sv.buf))
	dst := c.all[sv.off : sv.off+sv.n]
	at, newest, kept := 0, int64(0), false
	off := segHeaderBytes
	for i := range cur {
		o, r := &cur[i], &strs[i]
		p := unsafe.Add(ob, off)
		size := int(ld32(p, bhLen))
		if moved {
			blocks[i] = Block(sv.buf[off : off+size])
			o.Refs = int(ld16(p, bhRefs))
		}
		seq, held, recv := ld64(p, bhSeq), int64(ld64(p, bhHeld)), int64(ld64(p, bhReceived))
		r.sameID = true
		r.unchanged = r.refsSame && (o.Seq^seq)|uint64(o.Received^recv)|uint64(o.Held^held) == 0
		o.Seq, o.Held, o.Received = seq, held, recv
		newest = max(newest, recv)
		eps := dst[at : at+o.Len]
		at += o.Len
		off += size
		switch {
		case r.unchanged:
			kept = true
		case r.refsSame:
			rewriteValues(eps, unsafe.Add(p, blockHeaderBytes), recv)
		default:
			fillBlock(eps, blocks[i], r.strs, recv, false, true)
		}
	}
	sv.newest, sv.allRewritten = newest, !kept
}

// isContiguous reports whether blocks lie back to back in buf, from the
// segment header to its end.
func isContiguous(buf []byte, blocks []Block) bool {
	off := segHeaderBytes
	for _, blk := range blocks {
		if off >= len(buf) || unsafe.SliceData(blk) != &buf[off] {
			return false
		}
		off += len(blk)
	}
	return off == len(buf)
}

// sameEndpoints reports whether blocks a and b (with strings sa and sb)
// name the same endpoints (namespace, name, address, port) in the same
// order. Both blocks passed their checks, so every string index is in
// range.
func sameEndpoints(a Block, sa []string, b Block, sb []string) bool {
	n := a.Len()
	if n != b.Len() {
		return false
	}
	for r := 0; r < n; r++ {
		ra, rb := a.Record(r), b.Record(r)
		if ra.Port() != rb.Port() || sa[ra.Name()] != sb[rb.Name()] || sa[ra.Address()] != sb[rb.Address()] ||
			sa[ra.Namespace()] != sb[rb.Namespace()] {
			return false
		}
	}
	return true
}

// checkNew checks a block whose identity the cache has not read before.
func (c *Cache) checkNew(blk Block, i int) error {
	if _, e := checkHeader(blk, &c.lim, inStorage, "segment.blocks", i, 0); e != nil {
		return e
	}
	if e := checkRecords(blk, &c.lim, "segment.blocks", i, 0); e != nil {
		return e
	}
	if e := c.checker.checkDeep(blk, &c.lim, "segment.blocks", i, 0); e != nil {
		return e
	}
	return nil
}

// relayout places every segment's endpoints anew in c.all and fills them.
func (c *Cache) relayout() {
	total := 0
	for k := range c.segs {
		c.segs[k].off = total
		total += c.segs[k].n
	}
	if cap(c.all) < total {
		c.all = make([]scheduler.Endpoint, total, total+total/4)
	}
	c.all = c.all[:total]
	for k := range c.segs {
		c.materialize(k, true)
	}
}

// materialize writes segment k's endpoints into its range of c.all: all
// fields when full; else values always, identities only for blocks whose
// identity is new and adapter lists only for blocks whose lists changed.
func (c *Cache) materialize(k int, full bool) {
	sv := &c.segs[k]
	dst := c.all[sv.off : sv.off+sv.n]
	i := 0
	for bi, blk := range sv.cur.Blocks {
		n := sv.cur.Info[bi].Len
		if n == 0 {
			continue
		}
		r := &sv.strs[bi]
		if !full && r.unchanged {
			i += n // the same block as before: its endpoints hold its values
			continue
		}
		recv := sv.cur.Info[bi].Received
		ident, adapters := full || !r.sameID, full || !r.refsSame
		if !ident && !adapters {
			rewriteValues(dst[i:i+n], unsafe.Pointer(&blk[blockHeaderBytes]), recv)
		} else {
			fillBlock(dst[i:i+n], blk, r.strs, recv, ident, adapters)
		}
		i += n
	}
}

// fillBlock writes block blk's endpoints (strings bs, received at recv)
// into dst: values always (rewriteValues), identities when ident, adapter
// lists when adapters (setAdapters). Fields are read with unchecked loads
// (load_le.go): walkSegment checked that every record lies inside its
// block, checkRefs (or checkRecords) the adapter references.
func fillBlock(dst []scheduler.Endpoint, blk Block, bs *blockStrings, recv int64, ident, adapters bool) {
	recs := unsafe.Pointer(&blk[blockHeaderBytes])
	rewriteValues(dst, recs, recv)
	if ident {
		strs := bs.strs
		for r := range dst {
			q := unsafe.Add(recs, r*recordBytes)
			ep := &dst[r]
			ep.ID = scheduler.EndpointID{Namespace: strs[ld16(q, erNamespace)], Name: strs[ld16(q, erName)]}
			ep.Address = strs[ld16(q, erAddress)]
			ep.Port = int(ld16(q, erPort))
		}
	}
	if adapters {
		setAdapters(dst, blk, bs)
	}
}

// setAdapters points dst's adapter lists at blk's: bs.adapters holds the
// names of blk's refs, in order, and each endpoint's lists are slices of
// it (refs[refs_first:], n_active then n_waiting). A name or list already
// in place is not stored again: a pointer store costs the guest a write
// barrier while its collector marks.
func setAdapters(dst []scheduler.Endpoint, blk Block, bs *blockStrings) {
	strs, n := bs.strs, blk.nRefs()
	if cap(bs.adapters) < n {
		bs.adapters = make([]string, n, n+n/4)
	}
	ads := bs.adapters[:n]
	bs.adapters = ads
	if n > 0 {
		refs := unsafe.Pointer(&blk[blk.refsAt()])
		for j := range ads {
			if s := strs[ld16(refs, 2*j)]; unsafe.StringData(s) != unsafe.StringData(ads[j]) || len(s) != len(ads[j]) {
				ads[j] = s
			}
		}
	}
	recs := unsafe.Pointer(&blk[blockHeaderBytes])
	for r := range dst {
		q := unsafe.Add(recs, r*recordBytes)
		first, na, nw := int(ld16(q, erRefsFirst)), int(*(*uint8)(unsafe.Add(q, erNActive))), int(*(*uint8)(unsafe.Add(q, erNWaiting)))
		m := &dst[r].Metrics
		setList(&m.ActiveModels, ads[first:first+na:first+na])
		setList(&m.WaitingModels, ads[first+na:first+na+nw:first+na+nw])
	}
}

// setList stores l in *dst (nil when empty) unless *dst is l already.
func setList(dst *[]string, l []string) {
	if len(l) == 0 {
		l = nil
	}
	if unsafe.SliceData(*dst) != unsafe.SliceData(l) || len(*dst) != len(l) || cap(*dst) != cap(l) {
		*dst = l
	}
}

// rewriteValues writes the values of the records at recs (one per
// endpoint of eps, received at recv) into eps: a re-read's common case,
// identities and adapter lists as they were, in a loop of its own without
// calls or pointer stores (the guest's cost per endpoint, BENCHMARKS.md).
// An update time is the receipt less the record's age: its words (see
// setUnixNano) come from the receipt's, without a division per endpoint,
// when the age is under a second.
func rewriteValues(eps []scheduler.Endpoint, recs unsafe.Pointer, recv int64) {
	sec, nsec, maxFastAge := recv/1e9+unixToInternal, recv%1e9, uint64(1e9)
	if recv < 1e9 {
		maxFastAge = 0 // not a receipt time of this century: every time the general way
	}
	q := recs
	for r := range eps {
		m := &eps[r].Metrics
		m.WaitingQueueSize = int(ld32(q, erWaiting))
		m.RunningQueueSize = int(ld32(q, erRunning))
		m.KVCacheUsage = math.Float64frombits(ld64(q, erKV))
		m.MaxActiveModels = int(ld32(q, erMaxAdapters))
		m.RoutedSinceUpdate = 0
		age, t := int64(ld64(q, erAge)), timewords.Of(&m.UpdateTime)
		q = unsafe.Add(q, recordBytes)
		if t.Loc != unixLoc || uint64(age) >= maxFastAge {
			setUnixNano(&m.UpdateTime, clampTime(recv-age))
			continue
		}
		ns := nsec - age
		borrow := ns >> 63 // -1 when the age reaches into the second before
		t.Wall, t.Ext = uint64(ns+borrow&1e9), sec+borrow
	}
}

// count adds delta to the reports of every endpoint of blk (whose strings
// are strs), keeping dups.
func (c *Cache) count(blk Block, strs []string, delta int32) {
	if c.reports == nil {
		c.reports = make(map[scheduler.EndpointID]int32)
	}
	for r := 0; r < blk.Len(); r++ {
		rec := blk.Record(r)
		id := scheduler.EndpointID{Namespace: strs[rec.Namespace()], Name: strs[rec.Name()]}
		before := c.reports[id]
		after := before + delta
		switch {
		case before > 1 && after <= 1:
			c.dups--
		case before <= 1 && after > 1:
			c.dups++
		}
		if after == 0 {
			delete(c.reports, id)
		} else {
			c.reports[id] = after
		}
	}
}

// publish points the snapshot at the endpoints: all of them, or when some
// are reported twice, a copy keeping each one's newest report (address
// and port break ties, so every Envoy replica keeps the same).
func (c *Cache) publish() {
	newest := int64(0)
	h := uint64(14695981039346656037)
	for k := range c.segs {
		newest = max(newest, c.segs[k].newest)
		h = (h ^ uint64(c.segs[k].gen)) * 1099511628211
	}
	c.tag = h
	c.snap.Time = time.Time{}
	if newest > 0 {
		c.snap.Time = time.Unix(0, newest)
	}
	eps := c.all
	if c.dups > 0 {
		if c.ids == nil {
			c.ids = make(map[scheduler.EndpointID]int, len(c.all))
		}
		clear(c.ids)
		c.deduped = c.deduped[:0]
		for i := range c.all {
			e := &c.all[i]
			j, seen := c.ids[e.ID]
			if !seen {
				c.ids[e.ID] = len(c.deduped)
				c.deduped = append(c.deduped, *e)
				continue
			}
			if newerReport(e, &c.deduped[j]) {
				c.deduped[j] = *e
			}
		}
		eps = c.deduped
	}
	if len(eps) == 0 {
		eps = nil
	}
	c.snap.Endpoints = eps
}

// newerReport reports whether a should replace b as the report of one
// endpoint: newer scrape, then lower address, then lower port.
func newerReport(a, b *scheduler.Endpoint) bool {
	if c := a.Metrics.UpdateTime.Compare(b.Metrics.UpdateTime); c != 0 {
		return c > 0
	}
	if c := strings.Compare(a.Address, b.Address); c != 0 {
		return c < 0
	}
	return a.Port < b.Port
}

// unixLoc and unixToInternal are the location and the seconds offset of
// what time.Unix returns, taken from it: setUnixNano writes those words
// directly (TestSetUnixNanoIsTimeUnix).
var unixLoc, unixToInternal = func() (unsafe.Pointer, int64) {
	t := time.Unix(0, 0)
	w := timewords.Of(&t)
	return w.Loc, w.Ext
}()

// setUnixNano stores time.Unix(0, ns) in *dst for ns > 0. When *dst
// already has that location, as a re-read's update times do after the
// first, it writes the two words without pointers (see setTime) and
// without time.Unix's normalising branches.
func setUnixNano(dst *time.Time, ns int64) {
	d := timewords.Of(dst)
	if d.Loc != unixLoc || ns <= 0 {
		setTime(dst, time.Unix(0, ns))
		return
	}
	d.Wall, d.Ext = uint64(ns%1e9), ns/1e9+unixToInternal
}

// setTime stores t in *dst. When *dst already has t's location, as every
// re-read's update times do after the first, only the two words without
// pointers are written: a pointer store costs a write barrier while the
// guest's collector marks, which in the Wasm guest was most of a
// re-read's endpoint rewrite (BENCHMARKS.md).
func setTime(dst *time.Time, t time.Time) {
	d, s := timewords.Of(dst), timewords.Of(&t)
	if d.Loc != s.Loc {
		*dst = t
		return
	}
	d.Wall, d.Ext = s.Wall, s.Ext
}
