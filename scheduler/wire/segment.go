package wire

import (
	"encoding/binary"
	"strconv"
	"unsafe"
)

// Shared-data layout version 2: a directory and NumSegments segments (see
// the package documentation).
//
//	Directory = "WD" 0x02 n_segments:u8(64) zero:u32
//	            gen:u64 config_gen:u64 last_accept:i64
//	            DirEntry × n_segments
//	DirEntry  = seg_gen:u32 n_agents:u16 n_endpoints:u16 bytes:u32 zero:u32
//	            oldest_received:i64
//	Segment   = "WG" 0x02 index:u8 gen:u32 n_agents:u16 zero:u16 zero:u32
//	            AgentBlock × n_agents          (sorted, unique by agent id)

// NumSegments is the number of segment keys: agents are spread over them by
// a hash of their id, so shared data holds a fixed set of keys however many
// agents come and go.
const NumSegments = 64

// NumKeys is every metrics key: the directory, the segments and the probe
// key that creates keys safely (CreateToken).
const NumKeys = NumSegments + 2

const (
	dirHeaderBytes = 32
	dirEntryBytes  = 24
	// DirBytes is the size of the directory value, the one value a router
	// reads on every request.
	DirBytes = dirHeaderBytes + NumSegments*dirEntryBytes

	segHeaderBytes = 16
)

var (
	magicDir     = [2]byte{'W', 'D'}
	magicSegment = [2]byte{'W', 'G'}
)

// Keys are the shared-data keys of layout version 2 under one prefix.
type Keys struct {
	Dir      string
	Segments [NumSegments]string
	// Config holds the configuration record pushed by agents (its
	// generation is Directory.ConfigGen).
	Config string
	// Probe is written to get a create token (CreateToken).
	Probe string
}

// NewKeys returns the keys under prefix (e.g. DefaultKeyPrefix).
func NewKeys(prefix string) Keys {
	k := Keys{Dir: prefix + "v2.dir", Config: prefix + "v2.config", Probe: prefix + "v2.create"}
	for i := range k.Segments {
		k.Segments[i] = prefix + "v2.seg." + strconv.Itoa(i/10) + strconv.Itoa(i%10)
	}
	return k
}

// SegmentOf is the segment holding agent id's block.
func SegmentOf(id []byte) int {
	h := uint64(14695981039346656037) // FNV-1a, 64 bits
	for _, c := range id {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return int(h % NumSegments)
}

// DirEntry describes one segment in the directory.
type DirEntry struct {
	// Gen is the segment's generation (0: never written).
	Gen    uint32
	Agents int
	Points int // endpoints
	Bytes  int
	Oldest int64 // the oldest block's received time (Unix ns), 0 when empty
}

// Directory is the decoded directory value.
type Directory struct {
	// Gen changes with every directory write: equal Gen, nothing changed.
	Gen uint64
	// ConfigGen is the generation of the configuration record (0: none).
	ConfigGen uint64
	// LastAccept is the receiver's clock (Unix ns) when a push last
	// brought something new.
	LastAccept int64
	Entries    [NumSegments]DirEntry
}

// DecodeDirectory reads a directory value.
func DecodeDirectory(b []byte, d *Directory) error {
	if err := checkMagic(b, magicDir, "dir", DirBytes); err != nil {
		return err
	}
	if b[3] != NumSegments || le32(b, 4) != 0 {
		return errf(ErrInvalidField, "dir", 3, "segment count "+strconv.Itoa(int(b[3]))+" (this build has "+strconv.Itoa(NumSegments)+")")
	}
	// checkMagic checked the length: unchecked loads (load_le.go), as
	// every router and receiver decodes it after each change.
	p := unsafe.Pointer(unsafe.SliceData(b))
	d.Gen, d.ConfigGen, d.LastAccept = ld64(p, 8), ld64(p, 16), int64(ld64(p, 24))
	for i := range d.Entries {
		at := dirHeaderBytes + i*dirEntryBytes
		d.Entries[i] = DirEntry{Gen: ld32(p, at), Agents: int(ld16(p, at+4)), Points: int(ld16(p, at+6)),
			Bytes: int(ld32(p, at+8)), Oldest: int64(ld64(p, at+16))}
	}
	return nil
}

// DirGen reads only the generation of an encoded directory (ok false when b
// is not one): what a router compares on every request.
func DirGen(b []byte) (uint64, bool) {
	if len(b) != DirBytes || b[0] != magicDir[0] || b[1] != magicDir[1] || b[2] != version2 {
		return 0, false
	}
	return le64(b, 8), true
}

// DirConfigGen reads only the configuration record's generation of an
// encoded directory (ok false when b is not one).
func DirConfigGen(b []byte) (uint64, bool) {
	if _, ok := DirGen(b); !ok {
		return 0, false
	}
	return le64(b, 16), true
}

// AppendDirectory encodes d.
func AppendDirectory(dst []byte, d *Directory) []byte {
	dst = append(dst, magicDir[0], magicDir[1], version2, NumSegments, 0, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, d.Gen)
	dst = binary.LittleEndian.AppendUint64(dst, d.ConfigGen)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(d.LastAccept))
	for _, e := range d.Entries {
		dst = binary.LittleEndian.AppendUint32(dst, e.Gen)
		dst = binary.LittleEndian.AppendUint16(dst, uint16(e.Agents))
		dst = binary.LittleEndian.AppendUint16(dst, uint16(e.Points))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(e.Bytes))
		dst = binary.LittleEndian.AppendUint32(dst, 0)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Oldest))
	}
	return dst
}

func checkMagic(b []byte, magic [2]byte, where string, exact int) *Error {
	switch {
	case len(b) < 3:
		return errf(ErrTruncated, where, 0, "value of "+strconv.Itoa(len(b))+" bytes")
	case b[0] != magic[0] || b[1] != magic[1]:
		return errf(ErrFormat, where+".magic", 0, "got "+strconv.Quote(string(b[:2]))+", want "+strconv.Quote(string(magic[:])))
	case b[2] != version2:
		return errf(ErrVersion, where+".version", 2, "version "+strconv.Itoa(int(b[2]))+", this build reads 2")
	case exact > 0 && len(b) != exact:
		return errf(ErrTruncated, where, 0, strconv.Itoa(len(b))+" bytes, want "+strconv.Itoa(exact))
	}
	return nil
}

// serialNewer reports whether generation a is newer than b, counting
// modulo 2^32 (RFC 1982), so generations may wrap.
func serialNewer(a, b uint32) bool { return int32(a-b) > 0 }

// nextGen is the generation after g (never 0, which means "never written").
func nextGen(g uint32) uint32 {
	if g++; g == 0 {
		g = 1
	}
	return g
}

// Segment is a checked segment value, read in place.
type Segment struct {
	Index  int
	Gen    uint32
	Blocks []Block
	// Info[i] is Blocks[i]'s header, read once (walkSegment).
	Info []BlockInfo
}

// BlockInfo is what readers use of a block's header, read once so that
// merging and matching do not read it again field by field (in the Wasm
// guest every bounds-checked read counts).
type BlockInfo struct {
	ID             []byte // the agent id (string 0)
	Seq            uint64
	Held, Received int64
	Len            int // endpoints
	Refs, Strings  int
	Identity       uint32
}

// SentAt is when the agent sent the block, on the receiver's clock.
func (i *BlockInfo) SentAt() int64 { return clampTime(i.Received - i.Held) }

// info reads a block's header; the block's layout has been checked.
func info(b Block) BlockInfo {
	p := unsafe.Pointer(unsafe.SliceData(b))
	n, nrefs := int(ld16(p, bhEps)), int(ld16(p, bhRefs))
	lens := blockHeaderBytes + n*recordBytes + 2*nrefs
	strs := lens + int(ld16(p, bhStrs))
	return BlockInfo{ID: b[strs : strs+int(b[lens])], Seq: ld64(p, bhSeq), Held: int64(ld64(p, bhHeld)),
		Received: int64(ld64(p, bhReceived)), Len: n, Refs: nrefs, Strings: int(ld16(p, bhStrs)), Identity: ld32(p, bhIdentity)}
}

// readSegment checks a stored segment value into s (reusing s.Blocks): the
// segment's header and each block's, so its blocks can be walked, copied
// and merged (what walkSegment and checkHeader check), in the order and
// segment the writer keeps them. The writer reads what it is about to
// merge into this way, in one pass (every push reads the segments it
// touches).
//
// known lists identities the caller checked before: their blocks'
// segment is not hashed again. unknown reports whether some block's
// identity is not in known (the caller checks those blocks further).
func readSegment(b []byte, index int, lim *Limits, s *Segment, known []uint32) (unknown bool, _ *Error) {
	s.Blocks, s.Info = s.Blocks[:0], s.Info[:0]
	if err := checkMagic(b, magicSegment, "segment", 0); err != nil {
		return false, err
	}
	if len(b) < segHeaderBytes {
		return false, errf(ErrTruncated, "segment", 0, strconv.Itoa(len(b))+" bytes")
	}
	if int(b[3]) != index {
		return false, errf(ErrInvalidField, "segment.index", 3, "segment "+strconv.Itoa(int(b[3]))+" stored under key "+strconv.Itoa(index))
	}
	if le16(b, 10) != 0 || le32(b, 12) != 0 {
		return false, errf(ErrInvalidField, "segment", 10, "reserved bytes are not 0")
	}
	s.Index, s.Gen = index, le32(b, 4)
	n := int(le16(b, 8))
	if n > lim.MaxAgents {
		return false, errf(ErrLimit, "segment.n_agents", 8, strconv.Itoa(n)+" agents, limit "+strconv.Itoa(lim.MaxAgents))
	}
	off := segHeaderBytes
	var prevID []byte
	for i := 0; i < n; i++ {
		rest := len(b) - off
		if rest < blockHeaderBytes {
			return false, errf(ErrTruncated, "segment.blocks["+strconv.Itoa(i)+"]", off, strconv.Itoa(rest)+" bytes left for a block")
		}
		p := unsafe.Pointer(&b[off]) // the block header is inside b
		size, neps, nrefs, nstrs := int(ld32(p, bhLen)), int(ld16(p, bhEps)), int(ld16(p, bhRefs)), int(ld16(p, bhStrs))
		if size < blockHeaderBytes || size > rest || blockHeaderBytes+neps*recordBytes > size {
			return false, errf(ErrTruncated, "segment.blocks["+strconv.Itoa(i)+"]", off, "block of "+strconv.Itoa(size)+" bytes does not fit its records in the "+strconv.Itoa(rest)+" bytes left")
		}
		// checkHeader's checks of a stored block, read directly; on a
		// fault checkHeader names it.
		strBytes := int(ld32(p, bhStrBytes))
		lens := blockHeaderBytes + neps*recordBytes + 2*nrefs
		ok := ld16(p, bhFlags) == 0 && ld32(p, bhZero) == 0 && ld64(p, bhSeq) != 0 && int64(ld64(p, bhHeld)) >= 0 &&
			int64(ld64(p, bhReceived)) > 0 && ld32(p, bhIdentity) != 0 &&
			neps <= lim.MaxEndpoints && nstrs != 0 && lens+nstrs+strBytes == size && b[off+lens] != 0
		ok = ok && sumBytes(b[off+lens:off+lens+nstrs]) == strBytes
		blk := Block(b[off : off+size])
		if !ok {
			if _, err := checkHeader(blk, lim, inStorage, "segment.blocks", i, off); err != nil {
				return false, err
			}
		}
		at := lens + nstrs
		id := blk[at : at+int(blk[lens])]
		identity := ld32(p, bhIdentity)
		// The writer remembers the identities of what it wrote in order.
		if !(i < len(known) && known[i] == identity) && !hasIdentity(known, identity) {
			unknown = true
			if SegmentOf(id) != index {
				return false, errf(ErrInvalidField, "segment.blocks["+strconv.Itoa(i)+"]", off, "agent "+strconv.Quote(string(id))+" belongs in segment "+strconv.Itoa(SegmentOf(id)))
			}
		}
		if i > 0 && compareIDs(prevID, id) >= 0 {
			return false, errf(ErrInvalidField, "segment.blocks["+strconv.Itoa(i)+"]", off, "agents not sorted and unique")
		}
		prevID = id
		s.Blocks = append(s.Blocks, blk)
		s.Info = append(s.Info, BlockInfo{ID: id, Len: neps, Refs: nrefs, Strings: nstrs, Identity: identity,
			Received: int64(ld64(p, bhReceived)), Held: int64(ld64(p, bhHeld)), Seq: ld64(p, bhSeq)})
		off += size
	}
	if off != len(b) {
		return false, errf(ErrTrailing, "segment", off, strconv.Itoa(len(b)-off)+" bytes after the last block")
	}
	return unknown, nil
}

// hasIdentity reports whether ids holds id.
func hasIdentity(ids []uint32, id uint32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// walkSegment checks what is needed to find a segment's blocks and read
// their values: the segment header, and for each block that its length and
// its records fit (a router reads a block it has seen before only there).
// A block a router has not seen before must then pass checkHeader,
// checkRecords and checkDeep before anything else of it is used.
func walkSegment(b []byte, index int, lim *Limits, s *Segment) *Error {
	s.Blocks, s.Info = s.Blocks[:0], s.Info[:0]
	if err := checkMagic(b, magicSegment, "segment", 0); err != nil {
		return err
	}
	if len(b) < segHeaderBytes {
		return errf(ErrTruncated, "segment", 0, strconv.Itoa(len(b))+" bytes")
	}
	if int(b[3]) != index {
		return errf(ErrInvalidField, "segment.index", 3, "segment "+strconv.Itoa(int(b[3]))+" stored under key "+strconv.Itoa(index))
	}
	if le16(b, 10) != 0 || le32(b, 12) != 0 {
		return errf(ErrInvalidField, "segment", 10, "reserved bytes are not 0")
	}
	s.Index, s.Gen = index, le32(b, 4)
	n := int(le16(b, 8))
	if n > lim.MaxAgents {
		return errf(ErrLimit, "segment.n_agents", 8, strconv.Itoa(n)+" agents, limit "+strconv.Itoa(lim.MaxAgents))
	}
	off := segHeaderBytes
	for i := 0; i < n; i++ {
		rest := len(b) - off
		if rest < blockHeaderBytes {
			return errf(ErrTruncated, "segment.blocks["+strconv.Itoa(i)+"]", off, strconv.Itoa(rest)+" bytes left for a block")
		}
		size := int(le32(b, off+bhLen))
		if size < blockHeaderBytes || size > rest || blockHeaderBytes+int(le16(b, off+bhEps))*recordBytes > size {
			return errf(ErrTruncated, "segment.blocks["+strconv.Itoa(i)+"]", off, "block of "+strconv.Itoa(size)+" bytes does not fit its records in the "+strconv.Itoa(rest)+" bytes left")
		}
		s.Blocks = append(s.Blocks, Block(b[off:off+size]))
		p := unsafe.Pointer(&b[off]) // the block header is inside b
		s.Info = append(s.Info, BlockInfo{Len: int(ld16(p, bhEps)), Refs: int(ld16(p, bhRefs)), Strings: int(ld16(p, bhStrs)), Identity: ld32(p, bhIdentity),
			Received: int64(ld64(p, bhReceived)), Held: int64(ld64(p, bhHeld)), Seq: ld64(p, bhSeq)})
		off += size
	}
	if off != len(b) {
		return errf(ErrTrailing, "segment", off, strconv.Itoa(len(b)-off)+" bytes after the last block")
	}
	return nil
}

// appendSegmentHeader starts a segment value of n blocks.
func appendSegmentHeader(dst []byte, index int, gen uint32, n int) []byte {
	dst = append(dst, magicSegment[0], magicSegment[1], version2, byte(index))
	dst = binary.LittleEndian.AppendUint32(dst, gen)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(n))
	return append(dst, 0, 0, 0, 0, 0, 0)
}
