package wire

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strconv"
	"time"
	"unsafe"
)

// Push version 2 carries agent blocks (block.go):
//
//	PushV2 = "WP" 0x02 kind:u8 sender_len:u8 sender:bytes send_time:i64
//	         n_blocks:u16 AgentBlock × n_blocks   (sorted, unique by agent id)
//
// kind 1 is an agent's own push: exactly one block, whose agent id is the
// sender. kind 2 is a relay: what an aggregator sends, the latest block of
// one or more agents (an aggregator with nothing new sends nothing). A block's endpoint times are scrape ages at send_time on the
// sender's clock, and the block's held time says how long ago (a relay adds
// the time it kept each block to both).

// PushKind says who sent a version 2 push.
type PushKind uint8

// Push kinds. The numbers are part of the wire format.
const (
	KindAgent PushKind = 1
	KindRelay PushKind = 2
)

const (
	version2 = 2
	// pushV2Fixed is the header after the sender: send_time and n_blocks.
	pushV2Fixed = 8 + 2
)

// PushView is a checked push of either version, read in place. A version 1
// push is converted once into a block (Blocks then points into the
// converter's buffer).
type PushView struct {
	Version  int
	Kind     PushKind
	Sender   []byte
	SendTime int64
	// Blocks are the agent blocks, sorted by agent id.
	Blocks []Block
}

// PushDecoder checks pushes; it keeps its scratch space (block list,
// version 1 conversion buffer) between calls. Not safe for concurrent use.
type PushDecoder struct {
	view    PushView
	checker blockChecker
	blocks  []Block
	enc     BlockEncoder
	v1buf   []byte
}

// Decode checks push (version 1 or 2) against lim and returns a view that
// aliases push (and, for version 1, the decoder's buffer) until the next
// Decode. An unknown version is refused with ErrVersion naming the
// versions this build reads.
func (d *PushDecoder) Decode(push []byte, lim Limits) (*PushView, error) {
	lim = lim.resolved()
	off, nb, err := d.decodeHead(push, &lim)
	if err != nil {
		return nil, err
	}
	if d.view.Version == version1 {
		return &d.view, nil
	}
	return d.decodeV2Blocks(push, &lim, off, nb)
}

// decodeHead checks what comes before a push's blocks: its size, magic and
// version, and for version 2 its kind, sender, send time and block count.
// d.view then holds them, with Blocks nil for version 2 (the blocks start
// at off, nb of them). A version 1 push is decoded whole and converted:
// d.view is complete (one checked block).
func (d *PushDecoder) decodeHead(push []byte, lim *Limits) (off, nb int, err error) {
	if len(push) > lim.MaxPushBytes {
		return 0, 0, errf(ErrLimit, "push", 0, strconv.Itoa(len(push))+" bytes, limit "+strconv.Itoa(lim.MaxPushBytes))
	}
	if len(push) < 3 {
		return 0, 0, errf(ErrTruncated, "push.magic", 0, "payload of "+strconv.Itoa(len(push))+" bytes")
	}
	if push[0] != magicPush[0] || push[1] != magicPush[1] {
		return 0, 0, errf(ErrFormat, "push.magic", 0, "got "+strconv.Quote(string(push[:2]))+", want "+strconv.Quote(string(magicPush[:])))
	}
	switch push[2] {
	case version1:
		_, err := d.decodeV1(push, lim)
		return 0, 0, err
	case version2:
		return d.decodeV2Head(push, lim)
	}
	return 0, 0, errf(ErrVersion, "push.version", 2, "version "+strconv.Itoa(int(push[2]))+"; this build reads versions 1 and 2 (a newer agent or aggregator than this plugin: upgrade the plugin first)")
}

func (d *PushDecoder) decodeV1(push []byte, lim *Limits) (*PushView, error) {
	p, err := DecodePush(push, *lim)
	if err != nil {
		return nil, err
	}
	// The push passed its size limit; its block (fixed-size records)
	// may be a few times larger, which the stored-bytes limit bounds.
	blim := *lim
	blim.MaxPushBytes = 4*lim.MaxPushBytes + blockHeaderBytes
	d.v1buf, err = d.enc.appendBlock(d.v1buf[:0], p, &blim)
	if err != nil {
		return nil, err
	}
	d.blocks = append(d.blocks[:0], Block(d.v1buf))
	d.view = PushView{Version: version1, Kind: KindAgent, Sender: d.blocks[0].AgentID(), SendTime: p.SendTime.UnixNano(), Blocks: d.blocks}
	return &d.view, nil
}

func (d *PushDecoder) decodeV2Head(push []byte, lim *Limits) (int, int, error) {
	d.view = PushView{Version: version2}
	v := &d.view
	off := 3
	need := func(n int, field string) *Error {
		if len(push)-off < n {
			return errf(ErrTruncated, "push."+field, off, "need "+strconv.Itoa(n)+" bytes, have "+strconv.Itoa(len(push)-off))
		}
		return nil
	}
	if err := need(2, "kind"); err != nil {
		return 0, 0, err
	}
	v.Kind = PushKind(push[off])
	if v.Kind != KindAgent && v.Kind != KindRelay {
		return 0, 0, errf(ErrInvalidField, "push.kind", off, "kind "+strconv.Itoa(int(v.Kind))+" (want 1 agent or 2 relay)")
	}
	n := int(push[off+1])
	off += 2
	if err := need(n+pushV2Fixed, "sender"); err != nil {
		return 0, 0, err
	}
	v.Sender = push[off : off+n]
	if e := checkString(unsafe.String(unsafe.SliceData(v.Sender), len(v.Sender)), lim.MaxNameLen, false); e != nil {
		return 0, 0, e.at("push.sender")
	}
	off += n
	v.SendTime = int64(le64(push, off))
	if e := checkNanos(v.SendTime, ""); e != nil {
		return 0, 0, errf(ErrInvalidField, "push.send_time", off, e.Detail)
	}
	nb := int(le16(push, off+8))
	off += pushV2Fixed
	maxBlocks := lim.MaxAgents
	if v.Kind == KindAgent {
		maxBlocks = 1
	}
	if nb > maxBlocks {
		return 0, 0, errf(ErrLimit, "push.n_blocks", off-2, strconv.Itoa(nb)+" agent blocks, limit "+strconv.Itoa(maxBlocks))
	}
	if v.Kind == KindAgent && nb != 1 {
		return 0, 0, errf(ErrInvalidField, "push.n_blocks", off-2, "an agent's push carries exactly one block, not "+strconv.Itoa(nb))
	}
	if nb == 0 {
		return 0, 0, errf(ErrInvalidField, "push.n_blocks", off-2, "a relay carries at least one agent block")
	}
	return off, nb, nil
}

// decodeV2Blocks checks the nb blocks of a version 2 push from off, every
// block fully (checkHeader, checkRecords, checkDeep), and the push's end.
func (d *PushDecoder) decodeV2Blocks(push []byte, lim *Limits, off, nb int) (*PushView, error) {
	v := &d.view
	d.blocks = d.blocks[:0]
	var prevID []byte
	for i := 0; i < nb; i++ {
		size, err := checkHeader(push[off:], lim, inPush, "push.blocks", i, off)
		if err != nil {
			return nil, err
		}
		b := Block(push[off : off+size])
		if err := checkRecords(b, lim, "push.blocks", i, off); err != nil {
			return nil, err
		}
		if err := d.checker.checkDeep(b, lim, "push.blocks", i, off); err != nil {
			return nil, err
		}
		id := b.AgentID()
		if i > 0 && bytes.Compare(prevID, id) >= 0 {
			return nil, errUnsorted(i, off, prevID, id)
		}
		prevID = id
		d.blocks = append(d.blocks, b)
		off += size
	}
	if err := checkPushEnd(push, off, v.Kind, v.Sender, d.blocks[0].AgentID()); err != nil {
		return nil, err
	}
	v.Blocks = d.blocks
	return v, nil
}

// errUnsorted is the error of a push whose block i (at off) does not come
// after the one before it.
func errUnsorted(i, off int, prevID, id []byte) *Error {
	return errf(ErrInvalidField, "push.blocks["+strconv.Itoa(i)+"]", off,
		"agents not sorted and unique: "+strconv.Quote(string(prevID))+" then "+strconv.Quote(string(id)))
}

// checkPushEnd checks what is known once every block is read: nothing
// follows the last block (which ended at off), and an agent's push carries
// its own block (first is the first block's agent id).
func checkPushEnd(push []byte, off int, kind PushKind, sender, first []byte) *Error {
	if off != len(push) {
		return errf(ErrTrailing, "push", off, strconv.Itoa(len(push)-off)+" bytes after the message")
	}
	if kind == KindAgent && !bytes.Equal(first, sender) {
		return errf(ErrInvalidField, "push.blocks[0].agent_id", 0, "agent push from "+strconv.Quote(string(sender))+" carries agent "+strconv.Quote(string(first)))
	}
	return nil
}

// AppendPushV2Header appends a version 2 push header for nBlocks blocks;
// the caller appends the blocks (sorted by agent id) after it.
func AppendPushV2Header(dst []byte, kind PushKind, sender string, send time.Time, nBlocks int) []byte {
	dst = append(dst, magicPush[0], magicPush[1], version2, byte(kind), byte(len(sender)))
	dst = append(dst, sender...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(send.UnixNano()))
	return binary.LittleEndian.AppendUint16(dst, uint16(nBlocks))
}

// AppendAgentPush validates an agent's state and appends its version 2
// push (kind agent) to dst. eps must be in wire order (Normalize).
func (enc *BlockEncoder) AppendAgentPush(dst []byte, p *Push, lim Limits) ([]byte, error) {
	lim = lim.resolved()
	if err := p.validate(&lim); err != nil {
		return dst, err
	}
	if len(p.AgentID) > 255 {
		return dst, errf(ErrLimit, "push.agent_id", -1, "longer than 255 bytes")
	}
	start := len(dst)
	dst = AppendPushV2Header(dst, KindAgent, p.AgentID, p.SendTime, 1)
	dst, err := enc.appendBlock(dst, p, &lim)
	if err != nil {
		return dst[:start], err
	}
	if n := len(dst) - start; n > lim.MaxPushBytes {
		return dst[:start], errf(ErrLimit, "push", -1, "encoded size "+strconv.Itoa(n)+" bytes, limit "+strconv.Itoa(lim.MaxPushBytes))
	}
	return dst, nil
}

// AppendRelayBlock appends b, a pushed block received heldFor ago (on the
// relay's clock), to a relay push being built in dst: its held time and
// every scrape age grow by heldFor, so they are right at the relay's send
// time.
func AppendRelayBlock(dst []byte, b Block, heldFor time.Duration) []byte {
	start := len(dst)
	dst = append(dst, b...)
	if heldFor <= 0 {
		return dst
	}
	out := Block(dst[start:])
	held := out.Held() + int64(heldFor)
	if held < 0 {
		held = 1<<63 - 1
	}
	binary.LittleEndian.PutUint64(out[bhHeld:], uint64(held))
	for i := 0; i < out.Len(); i++ {
		at := blockHeaderBytes + i*recordBytes + erAge
		age := int64(le64(out, at)) + int64(heldFor)
		if age < 0 { // overflow: an age beyond 292 years is as stale as any
			age = 1<<63 - 1
		}
		binary.LittleEndian.PutUint64(out[at:], uint64(age))
	}
	return dst
}

// DecodeAgentPush decodes an agent's push of either version into a Push:
// what tools and tests that look at one agent's state want. (The receiver
// and aggregators read blocks in place instead.) Scrape times are the send
// time minus each scrape's age.
func DecodeAgentPush(b []byte, lim Limits) (*Push, error) {
	if len(b) >= 3 && b[2] == version1 {
		return DecodePush(b, lim)
	}
	var d PushDecoder
	v, err := d.Decode(b, lim)
	if err != nil {
		return nil, err
	}
	if v.Kind != KindAgent {
		return nil, errf(ErrInvalidField, "push.kind", 3, "a relay push, not an agent's")
	}
	blk := v.Blocks[0]
	strs := blk.Strings(nil)
	send := time.Unix(0, v.SendTime)
	p := &Push{AgentID: strs[0], Seq: blk.Seq(), SendTime: send}
	for i := 0; i < blk.Len(); i++ {
		r := blk.Record(i)
		e := EndpointState{
			Namespace: strs[r.Namespace()], Name: strs[r.Name()], Address: netip.MustParseAddr(strs[r.Address()]), Port: r.Port(),
			Waiting: r.Waiting(), Running: r.Running(), KVCacheUsage: r.KVCacheUsage(), MaxAdapters: r.MaxAdapters(),
			ScrapeTime: send.Add(-time.Duration(r.Age())), LastError: r.LastError(),
		}
		for j := 0; j < r.NActive(); j++ {
			e.ActiveAdapters = append(e.ActiveAdapters, strs[blk.Ref(r.RefsFirst()+j)])
		}
		for j := 0; j < r.NWaiting(); j++ {
			e.WaitingAdapters = append(e.WaitingAdapters, strs[blk.Ref(r.RefsFirst()+r.NActive()+j)])
		}
		p.Endpoints = append(p.Endpoints, e)
	}
	return p, nil
}
