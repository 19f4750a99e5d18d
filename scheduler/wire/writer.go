package wire

import (
	"encoding/binary"
	"errors"
	"strconv"
	"time"
	"unsafe"

	"github.com/wasm-epp/wasm-epp/scheduler/kv"
)

// Store is Envoy's shared data (kv.Store; tests use MemStore).
type Store = kv.Store

// Store outcomes (kv's).
var (
	ErrNotFound    = kv.ErrNotFound
	ErrCASMismatch = kv.ErrCASMismatch
	// ErrContention: other writers kept changing a key during every
	// attempt (the receiver answers 503; the pusher retries next cycle).
	ErrContention = errors.New("shared data kept changing")
)

// maxAttempts bounds each CAS loop; maxSweepsPerPush bounds the segments a
// push rewrites to drop expired agents it did not carry.
const (
	maxAttempts      = 16
	maxSweepsPerPush = 2
)

// Writer is the receiver's write step for layout version 2: it checks a
// push, merges its agent blocks into their segments and updates the
// directory, each with a CAS loop, so receivers on several worker threads
// never lose each other's writes. It keeps its buffers between pushes and
// allocates nothing per push once warm (version 1 pushes excepted: they are
// decoded and converted). Not safe for concurrent use: one per VM.
type Writer struct {
	keys Keys
	lim  Limits
	// expiry: a stored agent block not replaced by a newer one for this
	// long is dropped, by the next push that brings something new.
	expiry time.Duration

	dec     PushDecoder
	checker blockChecker
	dirBuf  []byte
	dirOut  []byte
	// dirRead: dir is the stored directory as readDir decoded it, with
	// its cas dirCas, so the push's directory update can try that cas
	// before reading the directory again.
	dirRead bool
	dirCas  uint32
	segs    [NumSegments]segWork
	dir     Directory
	order   []int // touched segments, ascending
	// sweeping: this push brings something new, so expired blocks go.
	sweeping bool
}

// segWork is one segment's part of a push.
type segWork struct {
	in      []Block // incoming blocks, sorted
	inInfo  []BlockInfo
	buf     []byte // stored value as read
	cas     uint32
	stored  Segment
	out     []byte // the merged value
	entry   DirEntry
	changed bool // out differs from what is stored
	written bool
	// what the last merge did
	accepted, stale, swept int
	// news: some incoming block would be stored (bringsNews)
	news bool
	// known are identities of blocks this writer checked or wrote (see
	// readSegment); dropped counts unreadable stored blocks left out.
	known   []uint32
	dropped int
	// match[j] is the index of incoming block j's stored block, or -1;
	// same[j] says they have the same identity (sameIdentity).
	match []int
	same  []bool
	// cursor: the stored blocks before it sort before every incoming
	// block paired so far (takeBlocks).
	cursor int
	// absent: the segment's key did not exist when read; its first write
	// creates it (CreateToken).
	absent bool
}

// ApplyStats says what one push did.
type ApplyStats struct {
	// Accepted counts blocks newer than what was stored; Stale those
	// that were not (a relay carrying what another relay already wrote).
	Accepted, Stale int
	// Swept counts expired agent blocks dropped.
	Swept int
	// Segments written; Retries counts CAS mismatches that were retried.
	Segments, Retries int
	// Reset counts stored values that could not be read and were replaced.
	Reset int
	// Compared counts blocks checked by comparison with the stored block
	// of the same identity (take.go) rather than by every check.
	Compared int
}

// NewWriter returns a writer for keys. lim bounds pushes and what is
// stored; expiry is how long an agent's block stays after the last push
// that brought a newer one (the plugin passes staleAfter).
func NewWriter(keys Keys, lim Limits, expiry time.Duration) *Writer {
	return &Writer{keys: keys, lim: lim.resolved(), expiry: expiry}
}

// Init creates every key that does not exist yet with an empty value (the
// receiver calls it in its plugin start), so that routers find a
// directory and pushes find their segments. It is safe against other VMs
// creating or writing the same keys at the same time (see create).
func (w *Writer) Init(st Store) error {
	for k, key := range w.keys.Segments {
		if _, _, err := st.Get(key, w.segs[k].buf[:0]); errors.Is(err, ErrNotFound) {
			if err := w.create(st, key, appendSegmentHeader(nil, k, 0, 0)); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
	}
	if _, _, err := st.Get(w.keys.Dir, w.dirBuf[:0]); errors.Is(err, ErrNotFound) {
		return w.create(st, w.keys.Dir, AppendDirectory(nil, &Directory{}))
	} else if err != nil {
		return err
	}
	return nil
}

// create writes value under key unless the key exists by now; a key that
// another VM created in between is left as it is.
func (w *Writer) create(st Store, key string, value []byte) error {
	token, err := CreateToken(st, w.keys.Probe)
	if err != nil {
		return err
	}
	if err := st.Set(key, value, token); err != nil && !errors.Is(err, ErrCASMismatch) {
		return err
	}
	return nil
}

// CreateToken returns a cas with which Set creates a key only if it is
// still absent. A write with cas 0 is unconditional, so two VMs that both
// found a key missing and both "create" it lose one's write. Shared data
// has no "create if absent", but a write with a cas that no entry of the
// key holds does just that: it fails (mismatch) when the key exists and
// creates it when it does not. Envoy's cas values come from one counter
// for the whole table, one per write, so the cas of another key's entry is
// such a value: CreateToken writes the probe key and returns its cas.
func CreateToken(st Store, probe string) (uint32, error) {
	if err := st.Set(probe, nil, 0); err != nil {
		return 0, err
	}
	_, cas, err := st.Get(probe, nil)
	return cas, err
}

// Apply checks push and writes it. now is the receiver's clock.
//
// Errors: the decode errors (ErrFormat, ErrVersion, ErrTruncated,
// ErrTrailing, ErrLimit, ErrInvalidField), ErrClockSkew, ErrStaleSequence
// (an agent push not newer than the stored block), ErrLimit when storing it
// would exceed MaxAgents, MaxTotalEndpoints or MaxStoredBytes: in these
// cases nothing was written. ErrContention and store errors may come after
// some segments were written (each agent's block is always whole).
func (w *Writer) Apply(st Store, push []byte, now time.Time) (ApplyStats, error) {
	var stats ApplyStats
	off, nb, err := w.dec.decodeHead(push, &w.lim)
	if err != nil {
		return stats, err
	}
	v := &w.dec.view
	nowNs := now.UnixNano()
	if ahead := time.Duration(v.SendTime - nowNs); ahead > w.lim.MaxClockSkew {
		return stats, errf(ErrClockSkew, "push.send_time", -1, quoteID(v.Sender)+" sent at "+
			time.Unix(0, v.SendTime).UTC().Format(time.RFC3339Nano)+", "+ahead.String()+" ahead of the receiver's clock (limit "+
			w.lim.MaxClockSkew.String()+"): check the clocks of the sender's node and of this Envoy")
	}
	body := push
	if v.Version == version1 { // its block, converted and checked
		body, off, nb = w.dec.v1buf, 0, 1
	}
	w.order = w.order[:0]
	for i := range w.segs {
		s := &w.segs[i]
		s.in, s.inInfo, s.match, s.same, s.changed, s.written = s.in[:0], s.inInfo[:0], s.match[:0], s.same[:0], false, false
	}
	if err := w.readDir(st, &stats); err != nil {
		return stats, err
	}
	// One pass over the blocks: checked, grouped by segment, paired with
	// what is stored (take.go).
	end, err := w.takeBlocks(st, body, off, nb, &stats)
	if err != nil {
		return stats, err
	}
	if v.Version == version2 {
		if err := checkPushEnd(push, end, v.Kind, v.Sender, w.segs[w.order[0]].in[0].AgentID()); err != nil {
			return stats, err
		}
	}
	sortInts(w.order)
	cutoff := nowNs - int64(w.expiry)
	// Expired agents are dropped only by a push that brings something new:
	// then the metrics path is alive. When nothing new arrives at all, the
	// last state stays, for the router's fail-open policy.
	w.sweeping = false
	for _, k := range w.order {
		w.segs[k].news = w.bringsNews(k, nowNs, cutoff)
		w.sweeping = w.sweeping || w.segs[k].news
	}
	for _, k := range w.order {
		if s := &w.segs[k]; !s.news && s.dropped == 0 && !w.expiresStored(k, cutoff) {
			// Nothing to store, drop or sweep (a relay carrying blocks
			// this Envoy holds already): the segment stays as it is.
			s.keepStored(w.dir.Entries[k])
			continue
		}
		w.merge(k, nowNs, cutoff)
	}
	if s := &w.segs[w.order[0]]; v.Kind == KindAgent && s.accepted == 0 {
		in := &s.inInfo[0]
		last := uint64(0)
		if i := s.match[0]; i >= 0 {
			last = s.stored.Info[i].Seq
		}
		return stats, errf(ErrStaleSequence, "push.seq", -1, "agent "+quoteID(in.ID)+" sent seq "+
			strconv.FormatUint(in.Seq, 10)+", last accepted "+strconv.FormatUint(last, 10))
	}
	if err := w.checkTotals(); err != nil {
		return stats, err
	}
	for _, k := range w.order {
		if err := w.writeSegment(st, k, nowNs, cutoff, &stats); err != nil {
			return stats, err
		}
	}
	for _, k := range w.order {
		s := &w.segs[k]
		stats.Accepted, stats.Stale, stats.Swept = stats.Accepted+s.accepted, stats.Stale+s.stale, stats.Swept+s.swept
	}
	if w.sweeping {
		w.sweep(st, nowNs, cutoff, &stats)
	}
	if stats.Segments == 0 {
		return stats, nil
	}
	return stats, w.writeDir(st, nowNs, stats.Accepted > 0, &stats)
}

func quoteID(b []byte) string { return strconv.Quote(string(b)) }

func sortInts(s []int) {
	for i := 1; i < len(s); i++ { // tiny lists
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// readDir reads the directory into w.dir (empty when absent or unreadable).
func (w *Writer) readDir(st Store, stats *ApplyStats) error {
	w.dirRead = false
	b, cas, err := st.Get(w.keys.Dir, w.dirBuf[:0])
	if cap(b) > cap(w.dirBuf) {
		w.dirBuf = b[:0]
	}
	switch {
	case errors.Is(err, ErrNotFound):
		w.dir = Directory{}
		return nil
	case err != nil:
		return err
	}
	if DecodeDirectory(b, &w.dir) != nil {
		stats.Reset++
		return w.rebuildDir(st, stats)
	}
	w.dirRead, w.dirCas = true, cas
	return nil
}

// rebuildDir recomputes the directory from the segments themselves, when
// it is unreadable (another build, or a bug, wrote it).
func (w *Writer) rebuildDir(st Store, stats *ApplyStats) error {
	gen := w.dir.Gen
	w.dir = Directory{Gen: gen}
	for k := range w.dir.Entries {
		if err := w.readSegment(st, k, stats); err != nil {
			return err
		}
		s := &w.segs[k]
		e := DirEntry{Gen: s.stored.Gen, Agents: len(s.stored.Blocks), Bytes: len(s.buf)}
		for i := range s.stored.Info {
			bi := &s.stored.Info[i]
			e.Points += bi.Len
			if t := bi.SentAt(); e.Oldest == 0 || t < e.Oldest {
				e.Oldest = t
			}
		}
		w.dir.Entries[k] = e
	}
	return nil
}

// readSegment reads segment k (empty when absent; replaced when
// unreadable).
func (w *Writer) readSegment(st Store, k int, stats *ApplyStats) error {
	s := &w.segs[k]
	b, cas, err := st.Get(w.keys.Segments[k], s.buf[:0])
	if cap(b) > cap(s.buf) {
		s.buf = b[:0]
	}
	s.cas, s.absent = cas, false
	s.stored.Gen, s.stored.Blocks, s.dropped = 0, s.stored.Blocks[:0], 0
	switch {
	case errors.Is(err, ErrNotFound):
		// Written with a create token (taken when written, so a push that
		// is refused writes nothing): if another writer creates the key
		// first, the write fails and this one merges on top.
		s.absent = true
		return nil
	case err != nil:
		return err
	}
	unknown, e := readSegment(b, k, &w.lim, &s.stored, s.known)
	if e != nil {
		// Unreadable (another build, or a bug): start this segment afresh
		// keeping its generation moving; its agents return with their
		// next push.
		g := uint32(0)
		if len(b) >= 8 {
			g = le32(b, 4)
		}
		s.stored.Gen, s.stored.Blocks = g, s.stored.Blocks[:0]
		s.dropped++
		stats.Reset++
		return nil
	}
	// Blocks are kept as they are when other agents push: check fully,
	// once, those this writer has not written or checked itself, and drop
	// any that fail (routers would refuse to read them).
	if !unknown {
		return nil
	}
	kept, keptInfo := s.stored.Blocks[:0], s.stored.Info[:0]
	for i, blk := range s.stored.Blocks {
		bi := s.stored.Info[i]
		if !s.knows(bi.Identity) {
			if checkRecords(blk, &w.lim, "segment.blocks", -1, 0) != nil || w.checker.checkDeep(blk, &w.lim, "segment.blocks", -1, 0) != nil {
				s.dropped++
				stats.Reset++
				continue
			}
			s.known = append(s.known, bi.Identity)
		}
		kept, keptInfo = append(kept, blk), append(keptInfo, bi)
	}
	s.stored.Blocks, s.stored.Info = kept, keptInfo
	return nil
}

// knows reports whether identity was checked (or written) by this writer.
func (s *segWork) knows(identity uint32) bool { return hasIdentity(s.known, identity) }

// pair fills match and same, walking the sorted stored and incoming
// blocks once.
func (s *segWork) pair() {
	s.match, s.same = s.match[:0], s.same[:0]
	i := 0
	stored := s.stored.Info
	for j := range s.inInfo {
		id := s.inInfo[j].ID
		c := -1
		for i < len(stored) {
			if c = compareIDs(stored[i].ID, id); c >= 0 {
				break
			}
			i++
		}
		if c == 0 {
			s.match = append(s.match, i)
			s.same = append(s.same, sameIdentity(s.in[j], s.stored.Blocks[i]))
		} else {
			s.match = append(s.match, -1)
			s.same = append(s.same, false)
		}
	}
}

// bringsNews reports whether some incoming block of segment k would be
// stored.
func (w *Writer) bringsNews(k int, now, cutoff int64) bool {
	s := &w.segs[k]
	for j := range s.inInfo {
		in := &s.inInfo[j]
		if clampTime(now-in.Held) < cutoff {
			continue
		}
		if i := s.match[j]; i < 0 || in.Seq > s.stored.Info[i].Seq || s.stored.Info[i].SentAt() < cutoff {
			return true
		}
	}
	return false
}

// expiresStored reports whether a merge of segment k would drop a stored
// block as expired.
func (w *Writer) expiresStored(k int, cutoff int64) bool {
	if !w.sweeping {
		return false
	}
	s := &w.segs[k]
	for i := range s.stored.Info {
		if s.stored.Info[i].SentAt() < cutoff {
			return true
		}
	}
	return false
}

// keepStored records that segment k's incoming blocks are all stale and
// its stored value stays: what merge would find, without building it.
func (s *segWork) keepStored(e DirEntry) {
	s.changed = false
	s.accepted, s.stale, s.swept = 0, len(s.in), 0
	s.entry = e
}

// merge builds segment k's new value from its stored blocks and the
// incoming ones: a newer block replaces the stored one, a block that is not
// newer is skipped, expired stored blocks go.
func (w *Writer) merge(k int, now, cutoff int64) {
	s := &w.segs[k]
	accepted, stale, swept := 0, 0, 0
	old, oldInfo := s.stored.Blocks, s.stored.Info
	gen := nextGen(s.stored.Gen)
	s.out = appendSegmentHeader(s.out[:0], k, gen, 0)
	e := DirEntry{}
	n := 0
	keep := func(i int) {
		s.out = append(s.out, old[i]...)
		n++
		e.Points += oldInfo[i].Len
		if t := oldInfo[i].SentAt(); e.Oldest == 0 || t < e.Oldest {
			e.Oldest = t
		}
	}
	// add stores incoming block j: its identity is the stored block's when
	// they have the same, else new (this generation: unique in the
	// segment).
	add := func(j int) {
		start := len(s.out)
		s.out = append(s.out, s.in[j]...)
		ident := gen
		if s.same[j] {
			ident = oldInfo[s.match[j]].Identity
		}
		stampBlock(s.out[start:], now, ident)
		n++
		accepted++
		e.Points += s.inInfo[j].Len
		if t := clampTime(now - s.inInfo[j].Held); e.Oldest == 0 || t < e.Oldest {
			e.Oldest = t
		}
	}
	expiredOld := func(i int) bool { return w.sweeping && oldInfo[i].SentAt() < cutoff }
	// Walk the stored blocks in order, the incoming ones by their match.
	i := 0
	for j := range s.in {
		m := s.match[j]
		next := len(old) // stored blocks before this incoming one
		if m >= 0 {
			next = m
		} else {
			for next = i; next < len(old) && compareIDs(oldInfo[next].ID, s.inInfo[j].ID) < 0; next++ {
			}
		}
		for ; i < next; i++ { // stored only
			if expiredOld(i) {
				swept++
			} else {
				keep(i)
			}
		}
		// A pushed block the agent sent longer ago than the expiry (a relay
		// still holding a dead agent's last push) is old news: never
		// stored, so it cannot bring an agent back.
		expiredIn := clampTime(now-s.inInfo[j].Held) < cutoff
		if m < 0 { // a new agent
			if expiredIn {
				stale++
			} else {
				add(j)
			}
			continue
		}
		// An expired stored block is forgotten, sequence included: the
		// agent is new again (it may have restarted).
		switch {
		case expiredIn:
			stale++
			if expiredOld(i) {
				swept++
			} else {
				keep(i)
			}
		case s.inInfo[j].Seq > oldInfo[i].Seq || expiredOld(i):
			add(j)
		default:
			keep(i)
			stale++
		}
		i++
	}
	for ; i < len(old); i++ {
		if expiredOld(i) {
			swept++
		} else {
			keep(i)
		}
	}
	binary.LittleEndian.PutUint16(s.out[8:], uint16(n))
	e.Agents, e.Bytes, e.Gen = n, len(s.out), gen
	s.entry = e
	s.changed = accepted > 0 || swept > 0 || s.dropped > 0
	s.accepted, s.stale, s.swept = accepted, stale, swept
}

// stampBlock turns a pushed block into a stored one: received is now and
// its identity is set. Ages and the held time stay as the sender measured
// them; readers count them back from received.
func stampBlock(b []byte, now int64, identity uint32) {
	_ = b[blockHeaderBytes-1] // one bounds check, then unchecked stores (load_le.go)
	p := unsafe.Pointer(unsafe.SliceData(b))
	st64(p, bhReceived, uint64(now))
	st32(p, bhIdentity, identity)
}

// checkTotals checks the limits over every segment, the touched ones
// with their new content.
func (w *Writer) checkTotals() error {
	agents, points, size := 0, 0, 0
	for k := range w.dir.Entries {
		e := w.dir.Entries[k]
		if len(w.segs[k].in) > 0 {
			e = w.segs[k].entry
		}
		agents, points, size = agents+e.Agents, points+e.Points, size+e.Bytes
	}
	switch {
	case agents > w.lim.MaxAgents:
		return errf(ErrLimit, "stored.agents", -1, "storing this push would keep "+strconv.Itoa(agents)+" agents, limit "+strconv.Itoa(w.lim.MaxAgents))
	case points > w.lim.MaxTotalEndpoints:
		return errf(ErrLimit, "stored.endpoints", -1, "storing this push would keep "+strconv.Itoa(points)+" endpoints, limit "+strconv.Itoa(w.lim.MaxTotalEndpoints))
	case size > w.lim.MaxStoredBytes:
		return errf(ErrLimit, "stored.bytes", -1, "storing this push would keep "+strconv.Itoa(size)+" bytes, limit "+strconv.Itoa(w.lim.MaxStoredBytes))
	}
	return nil
}

// writeSegment stores segment k's merged value, merging again on top of
// whatever another writer stored in between.
func (w *Writer) writeSegment(st Store, k int, now, cutoff int64, stats *ApplyStats) error {
	s := &w.segs[k]
	for attempt := 1; ; attempt++ {
		if !s.changed {
			return nil
		}
		if err := s.createToken(st, w.keys.Probe); err != nil {
			return err
		}
		err := st.Set(w.keys.Segments[k], s.out, s.cas)
		if err == nil {
			s.written = true
			s.rememberOut()
			stats.Segments++
			return nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return err
		}
		if attempt == maxAttempts {
			return errf(ErrContention, "segment "+strconv.Itoa(k), -1, "changed during "+strconv.Itoa(maxAttempts)+" attempts; retry")
		}
		stats.Retries++
		if err := w.readSegment(st, k, stats); err != nil {
			return err
		}
		// The incoming blocks were checked already; only their pairing
		// with what is stored now changes.
		s.pair()
		w.merge(k, now, cutoff)
	}
}

// sweep rewrites up to maxSweepsPerPush untouched segments whose oldest
// block has expired.
func (w *Writer) sweep(st Store, now, cutoff int64, stats *ApplyStats) {
	done := 0
	for k := range w.dir.Entries {
		e := w.dir.Entries[k]
		if done == maxSweepsPerPush || len(w.segs[k].in) > 0 || e.Agents == 0 || e.Oldest >= cutoff {
			continue
		}
		done++
		if w.readSegment(st, k, stats) != nil {
			continue
		}
		w.segs[k].pair()
		w.merge(k, now, cutoff)
		if !w.segs[k].changed {
			continue
		}
		if err := w.segs[k].setOnce(st, w.keys.Segments[k], w.keys.Probe); err == nil {
			stats.Swept += w.segs[k].swept
			stats.Segments++
			w.order = append(w.order, k)
		}
	}
}

// setOnce writes the merged value if nobody wrote the segment since it was
// read; a sweep that loses the race leaves the work to the next push.
func (s *segWork) setOnce(st Store, key, probe string) error {
	if err := s.createToken(st, probe); err != nil {
		return err
	}
	err := st.Set(key, s.out, s.cas)
	if err == nil {
		s.written = true
		s.rememberOut()
	}
	return err
}

// createToken makes s.cas a create token when the segment's key was
// absent when read.
func (s *segWork) createToken(st Store, probe string) error {
	if !s.absent {
		return nil
	}
	cas, err := CreateToken(st, probe)
	if err != nil {
		return err
	}
	s.cas, s.absent = cas, false
	return nil
}

// rememberOut makes the identities of the written value the known ones.
func (s *segWork) rememberOut() {
	s.known = s.known[:0]
	for off := segHeaderBytes; off < len(s.out); off += int(le32(s.out, off+bhLen)) {
		s.known = append(s.known, Block(s.out[off:]).Identity())
	}
}

// writeDir records the written segments in the directory with a CAS loop.
func (w *Writer) writeDir(st Store, now int64, accepted bool, stats *ApplyStats) error {
	cached := w.dirRead
	w.dirRead = false
	return w.updateDir(st, stats, cached, func(d *Directory) {
		for _, k := range w.order {
			s := &w.segs[k]
			if !s.written {
				continue
			}
			// A later writer of the same segment may have recorded a newer
			// generation already: never go back.
			if cur := d.Entries[k]; cur.Gen == 0 || serialNewer(s.entry.Gen, cur.Gen) {
				d.Entries[k] = s.entry
			}
		}
		if accepted && now > d.LastAccept {
			d.LastAccept = now
		}
	})
}

// updateDir applies edit to the stored directory and writes it back with
// its generation moved, re-reading and editing again on a CAS mismatch.
// cached: w.dir and w.dirCas are the directory as this push read it, so
// the first attempt edits that instead of reading it again (if another
// writer changed it since, the cas fails and the loop reads it).
func (w *Writer) updateDir(st Store, stats *ApplyStats, cached bool, edit func(*Directory)) error {
	for attempt := 0; attempt < maxAttempts; attempt++ {
		var b []byte
		var cas uint32
		var err error
		if cached && attempt == 0 {
			b, cas = w.dirBuf, w.dirCas
		} else {
			b, cas, err = st.Get(w.keys.Dir, w.dirBuf[:0])
			if cap(b) > cap(w.dirBuf) {
				w.dirBuf = b[:0]
			}
		}
		switch {
		case cached && attempt == 0:
			// w.dir holds what readDir decoded from this cas.
		case errors.Is(err, ErrNotFound):
			w.dir = Directory{}
			if cas, err = CreateToken(st, w.keys.Probe); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			if DecodeDirectory(b, &w.dir) != nil {
				w.dir = Directory{}
			}
		}
		edit(&w.dir)
		w.dir.Gen++
		w.dirOut = AppendDirectory(w.dirOut[:0], &w.dir)
		err = st.Set(w.keys.Dir, w.dirOut, cas)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return err
		}
		stats.Retries++
	}
	return errf(ErrContention, "dir", -1, "changed during "+strconv.Itoa(maxAttempts)+" attempts; retry")
}

// SeenConfigGen is the configuration record's generation in the directory
// as the last Apply read or wrote it (valid after an Apply without error):
// what the receiver tells the pusher it holds, at no extra read.
func (w *Writer) SeenConfigGen() uint64 { return w.dir.ConfigGen }

// ConfigGen reads the configuration record's generation from the stored
// directory (0: no record, or no directory yet).
func (w *Writer) ConfigGen(st Store) (uint64, error) {
	b, _, err := st.Get(w.keys.Dir, w.dirBuf[:0])
	if cap(b) > cap(w.dirBuf) {
		w.dirBuf = b[:0]
	}
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	gen, ok := DirConfigGen(b)
	if !ok {
		return 0, errf(ErrFormat, "dir", 0, "unreadable directory")
	}
	return gen, nil
}

// SetConfigGen records gen (ConfigGenOf the stored configuration record)
// in the directory, which routers read on every request: the record
// itself is read only when this moves. Writing the generation it already
// holds writes nothing.
func (w *Writer) SetConfigGen(st Store, gen uint64) (ApplyStats, error) {
	var stats ApplyStats
	if cur, err := w.ConfigGen(st); err == nil && cur == gen {
		return stats, nil
	}
	err := w.updateDir(st, &stats, false, func(d *Directory) { d.ConfigGen = gen })
	return stats, err
}
