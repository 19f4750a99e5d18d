package wire

import (
	"encoding/binary"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// An agent block is one agent's whole state in version 2: the unit a push
// carries, the receiver stores and a router reads, in the same bytes. It is
// read in place: fixed-size endpoint records refer to a small string table
// by index, so checking a block is bounds and value checks, and reading it
// allocates nothing once its strings are known.
//
//	AgentBlock = block_len:u32 seq:u64 held:i64 received:i64
//	             n_endpoints:u16 n_refs:u16 n_strings:u16 flags:u16(0)
//	             str_bytes:u32 identity:u32 zero:u32
//	             EndpointRecord × n_endpoints   (48 bytes each, sorted, unique by namespace,name)
//	             ref:u16 × n_refs               (adapter names, as string indexes)
//	             len:u8 × n_strings             (string lengths)
//	             bytes × str_bytes              (the strings, back to back)
//	EndpointRecord = namespace:u16 name:u16 address:u16 port:u16
//	             waiting:u32 running:u32 kv_cache_usage:f64 max_adapters:u32
//	             refs_first:u16 n_active:u8 n_waiting:u8
//	             age:i64 last_error:u8 zero:7
//
// String 0 is the agent id. namespace, name and address are string
// indexes; the address is the canonical text of the pod IP (what
// netip.Addr.String gives). The adapter lists are refs[refs_first:]
// (n_active, then n_waiting), each sorted by name and unique.
//
// Durations are on the sender's clock and times on the receiver's, so the
// clocks of two machines are never compared: age is how long before the
// push's send time the endpoint was scraped, held how long before it the
// block left its agent (0 from the agent itself; a relay adds the time it
// kept the block to both). received is 0 in a push; in storage it is the
// receiver's clock when it accepted the block, so an endpoint's update time
// is received minus age and the agent sent the block at received minus
// held, neither ever later than the receipt.
//
// identity is 0 in a push. In storage the receiver sets it: it keeps the
// stored block's identity when the new block has the same string table
// and endpoints (sameIdentity), and gives it a new one (the segment's new
// generation) otherwise. A reader that has seen a block's identity before
// reads only its values and adapter lists.
const (
	blockHeaderBytes = 48
	recordBytes      = 48

	// byte offsets in the block header
	bhLen      = 0
	bhSeq      = 4
	bhHeld     = 12
	bhReceived = 20
	bhEps      = 28
	bhRefs     = 30
	bhStrs     = 32
	bhFlags    = 34
	bhStrBytes = 36
	bhIdentity = 40
	bhZero     = 44

	// byte offsets in an endpoint record
	erNamespace   = 0
	erName        = 2
	erAddress     = 4
	erPort        = 6
	erWaiting     = 8
	erRunning     = 12
	erKV          = 16
	erMaxAdapters = 24
	erRefsFirst   = 28
	erNActive     = 30
	erNWaiting    = 31
	erAge         = 32
	erLastError   = 40
	erZero        = 41

	// maxBlockStrings bounds a block's string table (indexes are u16).
	maxBlockStrings = math.MaxUint16
)

// Block is a checked agent block: a view of bytes it does not own. Its
// methods read fields in place.
type Block []byte

func le16(b []byte, off int) uint16 { return binary.LittleEndian.Uint16(b[off:]) }
func le32(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }
func le64(b []byte, off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

// Seq is the agent's sequence number.
func (b Block) Seq() uint64 { return le64(b, bhSeq) }

// Identity changes (in storage) exactly when the block's strings,
// endpoints or adapters do; 0 in a push.
func (b Block) Identity() uint32 { return le32(b, bhIdentity) }

// Held is how long before its send the block left its agent (ns).
func (b Block) Held() int64 { return int64(le64(b, bhHeld)) }

// Received is, in storage, the receiver's clock (Unix ns) when it accepted
// the block; 0 in a push.
func (b Block) Received() int64 { return int64(le64(b, bhReceived)) }

// SentAt is when, on the receiver's clock, the agent sent the block (a
// stored block).
func (b Block) SentAt() int64 { return clampTime(b.Received() - b.Held()) }

// clampTime keeps a computed time in what the format carries (>= 1 ns).
func clampTime(t int64) int64 {
	if t <= 0 {
		return 1
	}
	return t
}

// Len is the number of endpoints.
func (b Block) Len() int { return int(le16(b, bhEps)) }

func (b Block) nRefs() int    { return int(le16(b, bhRefs)) }
func (b Block) nStrings() int { return int(le16(b, bhStrs)) }

func (b Block) refsAt() int    { return blockHeaderBytes + b.Len()*recordBytes }
func (b Block) lensAt() int    { return b.refsAt() + 2*b.nRefs() }
func (b Block) stringsAt() int { return b.lensAt() + b.nStrings() }

// StringTable is the part of the block that holds its strings (lengths and
// bytes): two blocks with equal string tables name the same strings at the
// same indexes.
func (b Block) StringTable() []byte { return b[b.lensAt():] }

// AgentID returns string 0 without copying; valid while b is.
func (b Block) AgentID() []byte {
	_ = b[blockHeaderBytes-1] // a checked block: its header is there
	p := unsafe.Pointer(unsafe.SliceData(b))
	lens := blockHeaderBytes + int(ld16(p, bhEps))*recordBytes + 2*int(ld16(p, bhRefs))
	at := lens + int(ld16(p, bhStrs))
	return b[at : at+int(b[lens])]
}

// Strings appends the block's strings to dst, all sharing one new backing
// string (one allocation for the whole table).
func (b Block) Strings(dst []string) []string {
	lens := b.lensAt()
	all := string(b[b.stringsAt():])
	off := 0
	for i := 0; i < b.nStrings(); i++ {
		n := int(b[lens+i])
		dst = append(dst, all[off:off+n])
		off += n
	}
	return dst
}

// Record is endpoint i of the block (0 <= i < Len()).
func (b Block) Record(i int) Record {
	at := blockHeaderBytes + i*recordBytes
	return Record(b[at : at+recordBytes])
}

// Ref is adapter reference i: a string index.
func (b Block) Ref(i int) int { return int(le16(b, b.refsAt()+2*i)) }

// Record is one endpoint record, read in place.
type Record []byte

func (r Record) Namespace() int        { return int(le16(r, erNamespace)) }
func (r Record) Name() int             { return int(le16(r, erName)) }
func (r Record) Address() int          { return int(le16(r, erAddress)) }
func (r Record) Port() uint16          { return le16(r, erPort) }
func (r Record) Waiting() uint32       { return le32(r, erWaiting) }
func (r Record) Running() uint32       { return le32(r, erRunning) }
func (r Record) KVCacheUsage() float64 { return math.Float64frombits(le64(r, erKV)) }
func (r Record) MaxAdapters() uint32   { return le32(r, erMaxAdapters) }
func (r Record) RefsFirst() int        { return int(le16(r, erRefsFirst)) }
func (r Record) NActive() int          { return int(r[erNActive]) }
func (r Record) NWaiting() int         { return int(r[erNWaiting]) }

// Age is how long before the push's send time the endpoint was scraped.
func (r Record) Age() int64 { return int64(le64(r, erAge)) }

// LastError is the outcome of the agent's latest scrape.
func (r Record) LastError() ScrapeStatus { return ScrapeStatus(r[erLastError]) }

// ---- encoding ----

// BlockEncoder builds agent blocks. It keeps its scratch space between
// calls, so an agent encoding every cycle allocates nothing once warm. Not
// safe for concurrent use.
type BlockEncoder struct {
	index map[string]uint16
	strs  []string
	used  []bool
	refs  []uint16
	agent string
}

// AppendBlock validates one agent's state and appends its block to dst:
// eps must be in wire order (Normalize), times are encoded for a push sent
// at send (each scrape's age then), held 0. An error leaves dst as it
// was.
//
// The encoder keeps its string table from one block of an agent to the
// next (names, addresses and adapters it saw recently stay, new ones are
// added at the end, and the table is rebuilt only when unused entries
// outnumber used ones), so a block's identity (sameIdentity) changes only
// when a new name appears: readers then re-read only values.
func (enc *BlockEncoder) AppendBlock(dst []byte, agentID string, seq uint64, send time.Time, eps []EndpointState, lim Limits) ([]byte, error) {
	lim = lim.resolved()
	p := Push{AgentID: agentID, Seq: seq, SendTime: send, Endpoints: eps}
	if err := p.validate(&lim); err != nil {
		return dst, err
	}
	return enc.appendBlock(dst, &p, &lim)
}

// startTable keeps the string table for another block of agent, or starts
// a new one.
func (enc *BlockEncoder) startTable(agent string) {
	unused := 0
	for _, u := range enc.used {
		if !u {
			unused++
		}
	}
	if enc.index == nil || agent != enc.agent || unused > max(16, len(enc.strs)-unused) {
		if enc.index == nil {
			enc.index = make(map[string]uint16)
		}
		clear(enc.index)
		enc.strs, enc.agent = enc.strs[:0], agent
	}
	enc.used = append(enc.used[:0], make([]bool, len(enc.strs))...)
	enc.refs = enc.refs[:0]
}

func (enc *BlockEncoder) appendBlock(dst []byte, p *Push, lim *Limits) ([]byte, error) {
	enc.startTable(p.AgentID)
	intern := func(s string) (uint16, bool) {
		if i, ok := enc.index[s]; ok {
			enc.used[i] = true
			return i, true
		}
		if len(enc.strs) == maxBlockStrings {
			return 0, false
		}
		i := uint16(len(enc.strs))
		enc.index[s] = i
		enc.strs = append(enc.strs, s)
		enc.used = append(enc.used, true)
		return i, true
	}
	if len(p.Endpoints) > math.MaxUint16 {
		return dst, errf(ErrLimit, "push.endpoints", -1, strconv.Itoa(len(p.Endpoints))+" endpoints, a block holds 65535 at most")
	}
	intern(p.AgentID) // string 0, kept from block to block
	start := len(dst)
	dst = append(dst, make([]byte, blockHeaderBytes)...)
	var addr [64]byte
	for i := range p.Endpoints {
		e := &p.Endpoints[i]
		ns, ok1 := intern(e.Namespace)
		name, ok2 := intern(e.Name)
		a, ok3 := intern(string(e.Address.AppendTo(addr[:0])))
		first := len(enc.refs)
		for _, ad := range e.ActiveAdapters {
			r, ok := intern(ad)
			ok1 = ok1 && ok
			enc.refs = append(enc.refs, r)
		}
		for _, ad := range e.WaitingAdapters {
			r, ok := intern(ad)
			ok1 = ok1 && ok
			enc.refs = append(enc.refs, r)
		}
		if !ok1 || !ok2 || !ok3 {
			return dst[:start], errf(ErrLimit, "push.strings", -1, "more than "+strconv.Itoa(maxBlockStrings)+" distinct strings in one agent's state")
		}
		if len(enc.refs) > math.MaxUint16 {
			return dst[:start], errf(ErrLimit, "push.refs", -1, "more than 65535 adapter entries in one agent's state")
		}
		age := p.SendTime.Sub(e.ScrapeTime)
		if age < 0 {
			age = 0
		}
		var rec [recordBytes]byte
		binary.LittleEndian.PutUint16(rec[erNamespace:], ns)
		binary.LittleEndian.PutUint16(rec[erName:], name)
		binary.LittleEndian.PutUint16(rec[erAddress:], a)
		binary.LittleEndian.PutUint16(rec[erPort:], e.Port)
		binary.LittleEndian.PutUint32(rec[erWaiting:], e.Waiting)
		binary.LittleEndian.PutUint32(rec[erRunning:], e.Running)
		binary.LittleEndian.PutUint64(rec[erKV:], math.Float64bits(e.KVCacheUsage))
		binary.LittleEndian.PutUint32(rec[erMaxAdapters:], e.MaxAdapters)
		binary.LittleEndian.PutUint16(rec[erRefsFirst:], uint16(first))
		rec[erNActive] = byte(len(e.ActiveAdapters))
		rec[erNWaiting] = byte(len(e.WaitingAdapters))
		binary.LittleEndian.PutUint64(rec[erAge:], uint64(age))
		rec[erLastError] = byte(e.LastError)
		dst = append(dst, rec[:]...)
	}
	for _, r := range enc.refs {
		dst = binary.LittleEndian.AppendUint16(dst, r)
	}
	strBytes := 0
	for _, s := range enc.strs {
		dst = append(dst, byte(len(s)))
		strBytes += len(s)
	}
	for _, s := range enc.strs {
		dst = append(dst, s...)
	}
	h := dst[start : start+blockHeaderBytes]
	n := len(dst) - start
	if n > math.MaxUint32 || n > lim.MaxPushBytes {
		return dst[:start], errf(ErrLimit, "push", -1, "agent "+strconv.Quote(p.AgentID)+": block of "+strconv.Itoa(n)+" bytes over the limit "+strconv.Itoa(lim.MaxPushBytes))
	}
	binary.LittleEndian.PutUint32(h[bhLen:], uint32(n))
	binary.LittleEndian.PutUint64(h[bhSeq:], p.Seq)
	binary.LittleEndian.PutUint16(h[bhEps:], uint16(len(p.Endpoints)))
	binary.LittleEndian.PutUint16(h[bhRefs:], uint16(len(enc.refs)))
	binary.LittleEndian.PutUint16(h[bhStrs:], uint16(len(enc.strs)))
	binary.LittleEndian.PutUint32(h[bhStrBytes:], uint32(strBytes))
	return dst, nil
}

// ---- checking ----

// blockRole says what received must hold.
type blockRole int

const (
	inPush blockRole = iota
	inStorage
)

// blockChecker validates blocks; its scratch space is kept between calls,
// so checking allocates nothing once warm.
type blockChecker struct {
	offs []int // string offsets of the block being checked deeply
}

// blockError builds the error of a check: the block is where[idx] (or
// where when idx < 0), endpoint ep when ep >= 0; built only on failure.
func blockError(kind error, where string, idx, ep int, field string, off int, detail string) *Error {
	w := where
	if idx >= 0 {
		w += "[" + strconv.Itoa(idx) + "]"
	}
	if ep >= 0 {
		w += ".endpoints[" + strconv.Itoa(ep) + "]"
	}
	if field != "" {
		w += "." + field
	}
	return errf(kind, w, off, detail)
}

// checkHeader validates the block header and the layout it announces:
// sizes add up, the string lengths add up, the agent id is not empty. A
// reader may then walk the block; checkRecords makes its indexes and
// values safe to use. Returns the block's length.
func checkHeader(b []byte, lim *Limits, role blockRole, where string, idx, base int) (int, *Error) {
	fail := func(kind error, field string, off int, detail string) (int, *Error) {
		return 0, blockError(kind, where, idx, -1, field, base+off, detail)
	}
	if len(b) < blockHeaderBytes {
		return fail(ErrTruncated, "", 0, "block header needs "+strconv.Itoa(blockHeaderBytes)+" bytes, have "+strconv.Itoa(len(b)))
	}
	n := int(le32(b, bhLen))
	if n < blockHeaderBytes || n > len(b) {
		return fail(ErrTruncated, "block_len", bhLen, "block of "+strconv.Itoa(n)+" bytes, "+strconv.Itoa(len(b))+" left")
	}
	blk := Block(b[:n])
	if f := le16(blk, bhFlags); f != 0 {
		return fail(ErrInvalidField, "flags", bhFlags, "flags "+strconv.Itoa(int(f))+" (this build knows none)")
	}
	if le32(blk, bhZero) != 0 {
		return fail(ErrInvalidField, "", bhZero, "reserved bytes are not 0")
	}
	if blk.Seq() == 0 {
		return fail(ErrInvalidField, "seq", bhSeq, "sequence number 0")
	}
	if h := blk.Held(); h < 0 {
		return fail(ErrInvalidField, "held", bhHeld, "held for "+strconv.FormatInt(h, 10)+" ns")
	}
	switch recv, id := blk.Received(), blk.Identity(); {
	case role == inPush && (recv != 0 || id != 0):
		return fail(ErrInvalidField, "received", bhReceived, "received and identity must be 0 in a push")
	case role == inStorage && (recv <= 0 || id == 0):
		return fail(ErrInvalidField, "received", bhReceived, "stored block without a receipt time or identity")
	}
	neps, nrefs, nstrs := blk.Len(), blk.nRefs(), blk.nStrings()
	if neps > lim.MaxEndpoints {
		return fail(ErrLimit, "endpoints", bhEps, strconv.Itoa(neps)+" endpoints, limit "+strconv.Itoa(lim.MaxEndpoints))
	}
	if nstrs == 0 {
		return fail(ErrInvalidField, "strings", bhStrs, "no string table (string 0 is the agent id)")
	}
	strBytes := int(le32(blk, bhStrBytes))
	if want := blockHeaderBytes + neps*recordBytes + 2*nrefs + nstrs + strBytes; want != n {
		return fail(ErrInvalidField, "block_len", bhLen, "block_len "+strconv.Itoa(n)+" but its parts add up to "+strconv.Itoa(want))
	}
	lens := blk.lensAt()
	total := 0
	for _, l := range blk[lens : lens+nstrs] {
		total += int(l)
	}
	if total != strBytes {
		return fail(ErrInvalidField, "str_bytes", bhStrBytes, "string lengths add up to "+strconv.Itoa(total)+", str_bytes says "+strconv.Itoa(strBytes))
	}
	if blk[lens] == 0 {
		return fail(ErrInvalidField, "agent_id", blk.stringsAt(), "empty")
	}
	return n, nil
}

// checkRefs validates what a reader of a block whose identity it knows
// uses besides values: the adapter references, each a string of the
// block, each record's lists within them and the limits.
func checkRefs(blk Block, lim *Limits) bool {
	nrefs, nstrs := blk.nRefs(), blk.nStrings()
	if blk.refsAt()+2*nrefs > len(blk) {
		return false
	}
	if nrefs > 0 {
		p := unsafe.Pointer(&blk[blk.refsAt()])
		for off := 0; off < 2*nrefs; off += 2 {
			if int(ld16(p, off)) >= nstrs {
				return false
			}
		}
	}
	if blk.Len() == 0 {
		return true
	}
	p := unsafe.Pointer(&blk[blockHeaderBytes])
	for off := 0; off < blk.Len()*recordBytes; off += recordBytes {
		first, na, nw := int(ld16(p, off+erRefsFirst)), int(*(*uint8)(unsafe.Add(p, off+erNActive))), int(*(*uint8)(unsafe.Add(p, off+erNWaiting)))
		if na > lim.MaxAdapters || nw > lim.MaxAdapters || first+na+nw > nrefs {
			return false
		}
	}
	return true
}

// checkRecords validates every index of a block checkHeader accepted and
// every value's range: string indexes, adapter ranges, ports, counts,
// KV-cache use, ages, scrape status, padding. The strings' contents, the
// addresses and the orders are checkDeep's.
func checkRecords(blk Block, lim *Limits, where string, idx, base int) *Error {
	fail := func(kind error, ep int, field string, off int, detail string) *Error {
		return blockError(kind, where, idx, ep, field, base+off, detail)
	}
	neps, nrefs, nstrs := blk.Len(), blk.nRefs(), blk.nStrings()
	refs := blk.refsAt()
	for i := 0; i < nrefs; i++ {
		if r := int(le16(blk, refs+2*i)); r >= nstrs {
			return fail(ErrInvalidField, -1, "refs["+strconv.Itoa(i)+"]", refs+2*i, "string index "+strconv.Itoa(r)+" of "+strconv.Itoa(nstrs))
		}
	}
	if neps == 0 {
		return nil
	}
	// checkHeader made sure the records lie inside the block: read them
	// with unchecked loads (load_le.go), the receiver's hottest loop.
	p := unsafe.Pointer(&blk[blockHeaderBytes])
	maxCount := uint32(lim.MaxCount)
	for i := 0; i < neps; i++ {
		rb := blockHeaderBytes + i*recordBytes
		q := unsafe.Add(p, i*recordBytes)
		if int(ld16(q, erNamespace)) >= nstrs || int(ld16(q, erName)) >= nstrs || int(ld16(q, erAddress)) >= nstrs {
			return fail(ErrInvalidField, i, "", rb, "string index past the "+strconv.Itoa(nstrs)+" strings")
		}
		if ld16(q, erPort) == 0 {
			return fail(ErrInvalidField, i, "port", rb+erPort, "port 0 (must be 1..65535)")
		}
		if w, ru, m := ld32(q, erWaiting), ld32(q, erRunning), ld32(q, erMaxAdapters); w > maxCount || ru > maxCount || m > maxCount {
			return fail(ErrLimit, i, "", rb+erWaiting, "waiting "+strconv.FormatUint(uint64(w), 10)+", running "+strconv.FormatUint(uint64(ru), 10)+
				", max_adapters "+strconv.FormatUint(uint64(m), 10)+": limit "+strconv.Itoa(lim.MaxCount))
		}
		if bits := ld64(q, erKV); bits > math.Float64bits(1) { // also NaN, negative and -0
			kv := math.Float64frombits(bits)
			return fail(ErrInvalidField, i, "kv_cache_usage", rb+erKV, strconv.FormatFloat(kv, 'g', -1, 64)+" outside 0..1")
		}
		first, na, nw := int(ld16(q, erRefsFirst)), int(*(*uint8)(unsafe.Add(q, erNActive))), int(*(*uint8)(unsafe.Add(q, erNWaiting)))
		if na > lim.MaxAdapters || nw > lim.MaxAdapters {
			return fail(ErrLimit, i, "adapters", rb+erNActive, strconv.Itoa(max(na, nw))+" adapters in one list, limit "+strconv.Itoa(lim.MaxAdapters))
		}
		if first+na+nw > nrefs {
			return fail(ErrInvalidField, i, "refs_first", rb+erRefsFirst, "adapter refs "+strconv.Itoa(first)+"+"+strconv.Itoa(na+nw)+" past the "+strconv.Itoa(nrefs)+" refs")
		}
		if age := int64(ld64(q, erAge)); age < 0 {
			return fail(ErrInvalidField, i, "age", rb+erAge, "scrape age "+strconv.FormatInt(age, 10)+" ns is negative")
		}
		// last_error is the low byte of the word that holds the padding.
		if tail := ld64(q, erLastError); tail > uint64(scrapeStatusEnd-1) {
			if ScrapeStatus(tail&0xff) >= scrapeStatusEnd {
				return fail(ErrInvalidField, i, "last_error", rb+erLastError, "unknown scrape status "+strconv.Itoa(int(tail&0xff)))
			}
			return fail(ErrInvalidField, i, "", rb+erZero, "padding is not 0")
		}
	}
	return nil
}

// checkDeep is checkIdentity then checkAdapters.
func (c *blockChecker) checkDeep(blk Block, lim *Limits, where string, idx, base int) *Error {
	if err := c.checkIdentity(blk, lim, where, idx, base); err != nil {
		return err
	}
	return c.checkAdapters(blk, where, idx, base)
}

// offsets fills c.offs with the offset of each string of blk.
func (c *blockChecker) offsets(blk Block) {
	lens, nstrs := blk.lensAt(), blk.nStrings()
	c.offs = c.offs[:0]
	off := blk.stringsAt()
	for i := 0; i < nstrs; i++ {
		c.offs = append(c.offs, off)
		off += int(blk[lens+i])
	}
}

func (c *blockChecker) str(blk Block, i int) string {
	return unsafe.String(unsafe.SliceData(blk[c.offs[i]:]), int(blk[blk.lensAt()+i]))
}

// checkIdentity validates, for a block checkHeader and checkRecords
// accepted, what sameIdentity compares: every string is text within the
// limits (the agent id not empty), every name non-empty, endpoints sorted
// and unique, addresses in canonical form.
func (c *blockChecker) checkIdentity(blk Block, lim *Limits, where string, idx, base int) *Error {
	fail := func(kind error, ep int, field string, off int, detail string) *Error {
		return blockError(kind, where, idx, ep, field, base+off, detail)
	}
	c.offsets(blk)
	for i := 0; i < blk.nStrings(); i++ {
		if e := checkString(c.str(blk, i), lim.MaxNameLen, i != 0); e != nil {
			field := "strings[" + strconv.Itoa(i) + "]"
			if i == 0 {
				field = "agent_id"
			}
			return fail(e.Kind, -1, field, c.offs[i], e.Detail)
		}
	}
	var prevNS, prevName string
	for i := 0; i < blk.Len(); i++ {
		r := blk.Record(i)
		rb := blockHeaderBytes + i*recordBytes
		ns, name := c.str(blk, r.Namespace()), c.str(blk, r.Name())
		if name == "" {
			return fail(ErrInvalidField, i, "name", rb+erName, "empty")
		}
		if i > 0 {
			if c := strings.Compare(prevNS, ns); c > 0 || c == 0 && prevName >= name {
				return fail(ErrInvalidField, i, "", rb, "endpoints not sorted and unique: "+strconv.Quote(prevNS+"/"+prevName)+" then "+strconv.Quote(ns+"/"+name))
			}
		}
		prevNS, prevName = ns, name
		if e := checkAddressText(c.str(blk, r.Address())); e != nil {
			return fail(ErrInvalidField, i, "address", rb+erAddress, e.Detail)
		}
	}
	return nil
}

// checkAdapters validates the adapter lists of a block checkRecords
// accepted: each sorted, unique, without empty names.
func (c *blockChecker) checkAdapters(blk Block, where string, idx, base int) *Error {
	if blk.nRefs() == 0 {
		return nil
	}
	c.offsets(blk)
	for i := 0; i < blk.Len(); i++ {
		r := blk.Record(i)
		first, na, nw := r.RefsFirst(), r.NActive(), r.NWaiting()
		for l, from, count := 0, first, na; l < 2; l, from, count = l+1, first+na, nw {
			prev := ""
			for j := 0; j < count; j++ {
				a := c.str(blk, blk.Ref(from+j))
				if a == "" || j > 0 && prev >= a {
					field := "active_adapters"
					if l == 1 {
						field = "waiting_adapters"
					}
					detail := "empty adapter name"
					if a != "" {
						detail = "adapters not sorted and unique: " + strconv.Quote(prev) + " then " + strconv.Quote(a)
					}
					return blockError(ErrInvalidField, where, idx, i, field+"["+strconv.Itoa(j)+"]", base+blockHeaderBytes+i*recordBytes+erRefsFirst, detail)
				}
				prev = a
			}
		}
	}
	return nil
}

// sameIdentity reports whether two blocks have the same string table and
// name the same endpoints at the same addresses and ports in the same
// order (so one passing checkIdentity means the other does). They may
// differ in sequence, times, values and adapter lists (adapters are
// values: vLLM's running adapters change from one scrape to the next).
func sameIdentity(a, b Block) bool {
	if a.Len() != b.Len() || a.nStrings() != b.nStrings() {
		return false
	}
	if !equalBytes(a.StringTable(), b.StringTable()) {
		return false
	}
	if a.Len() == 0 {
		return true
	}
	pa, pb := unsafe.Pointer(&a[blockHeaderBytes]), unsafe.Pointer(&b[blockHeaderBytes])
	for off := 0; off < a.Len()*recordBytes; off += recordBytes {
		if ld64(pa, off) != ld64(pb, off) { // namespace, name, address, port
			return false
		}
	}
	return true
}

// sameRefs reports whether two blocks of the same identity (and so the
// same number of endpoints, n) have the same adapter lists. Both blocks'
// layouts are checked (walkSegment, checkHeader), and both have nRefs refs.
func sameRefs(a, b Block, n, nRefs int) bool {
	if n == 0 {
		return true
	}
	pa, pb := unsafe.Pointer(unsafe.SliceData(a)), unsafe.Pointer(unsafe.SliceData(b))
	at := blockHeaderBytes + n*recordBytes
	for off := 0; off < 2*nRefs; off += 2 {
		if ld16(pa, at+off) != ld16(pb, at+off) {
			return false
		}
	}
	for off := blockHeaderBytes + erRefsFirst; off < at; off += recordBytes {
		if ld32(pa, off) != ld32(pb, off) {
			return false
		}
	}
	return true
}

// checkAddressText accepts the canonical text of a unicast pod IP, the
// same addresses checkEndpoint accepts.
func checkAddressText(s string) *Error {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return errf(ErrInvalidField, "", -1, "not an IP address: "+strconv.Quote(s))
	}
	if err := checkAddr(a); err != nil {
		return err
	}
	var buf [64]byte
	if string(a.AppendTo(buf[:0])) != s {
		return errf(ErrInvalidField, "", -1, "address "+strconv.Quote(s)+" not in canonical form "+strconv.Quote(a.String()))
	}
	return nil
}
