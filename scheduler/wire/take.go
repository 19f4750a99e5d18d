package wire

import (
	"math"
	"unsafe"
)

// takeBlocks is the receiver's one pass over a push's nb agent blocks,
// which start at off in body: each block is checked, put in its agent's
// segment (read from st when the push first touches it) and paired with
// the agent's stored block, in push order. Blocks are sorted by agent id,
// so the blocks of one segment come in the order the segment keeps them,
// and a cursor per segment pairs them in one walk.
//
// A block whose identity (string table, endpoints, adapter lists) is the
// stored block's, which is nearly every block of a healthy fleet, is
// checked by comparison with it: its header's sizes and the bytes after its
// records (adapter references, string lengths, strings) equal the stored
// block's, each record's names, address, port and adapter ranges too, so
// only the values are checked, while they are read for that comparison.
// The stored block passed every check when it was stored (readSegment).
// Any other block gets every check (checkHeader, checkRecords, then
// checkDeep, or only checkAdapters when just its adapters changed), which
// also names the fault of a block the comparison refused.
//
// Nothing is written: a fault returns its error with the store as it was.
// The segments' in, inInfo, match and same hold the pairing merge uses.
func (w *Writer) takeBlocks(st Store, body []byte, off, nb int, stats *ApplyStats) (int, error) {
	lim := &w.lim
	maxCount := uint32(lim.MaxCount)
	var prevID []byte
	for i := 0; i < nb; i++ {
		// The header, as checkHeader checks it but for the string
		// lengths' sum (the comparison below, or checkHeader, sees to it).
		rest := len(body) - off
		fast := rest >= blockHeaderBytes
		var p unsafe.Pointer
		n, neps, nrefs, nstrs, lens := 0, 0, 0, 0, 0
		if fast {
			p = unsafe.Pointer(&body[off])
			n = int(ld32(p, bhLen))
			neps, nrefs, nstrs = int(ld16(p, bhEps)), int(ld16(p, bhRefs)), int(ld16(p, bhStrs))
			strBytes := int(ld32(p, bhStrBytes))
			lens = blockHeaderBytes + neps*recordBytes + 2*nrefs
			fast = n >= blockHeaderBytes && n <= rest && ld16(p, bhFlags) == 0 && ld32(p, bhZero) == 0 &&
				ld64(p, bhSeq) != 0 && int64(ld64(p, bhHeld)) >= 0 && ld64(p, bhReceived) == 0 && ld32(p, bhIdentity) == 0 &&
				neps <= lim.MaxEndpoints && nstrs != 0 && lens+nstrs+strBytes == n &&
				body[off+lens] != 0 && int(body[off+lens]) <= strBytes
		}
		if !fast {
			size, err := checkHeader(body[off:], lim, inPush, "push.blocks", i, off)
			if err != nil {
				return off, err
			}
			p = unsafe.Pointer(&body[off])
			n, neps, nrefs, nstrs = size, int(ld16(p, bhEps)), int(ld16(p, bhRefs)), int(ld16(p, bhStrs))
			lens = blockHeaderBytes + neps*recordBytes + 2*nrefs
		}
		b := Block(body[off : off+n])
		at := lens + nstrs
		id := b[at : at+int(b[lens])]
		if i > 0 && compareIDs(prevID, id) >= 0 {
			return off, errUnsorted(i, off, prevID, id)
		}
		prevID = id

		k := SegmentOf(id)
		s := &w.segs[k]
		if len(s.in) == 0 {
			w.order = append(w.order, k)
			if err := w.readSegment(st, k, stats); err != nil {
				return off, err
			}
			s.cursor = 0
		}
		m := -1
		stored := s.stored.Info
		for s.cursor < len(stored) {
			if c := compareIDs(stored[s.cursor].ID, id); c >= 0 {
				if c == 0 {
					m = s.cursor
				}
				break
			}
			s.cursor++
		}

		same, checked := false, false
		if m >= 0 && fast {
			sb := s.stored.Blocks[m]
			sp := unsafe.Pointer(unsafe.SliceData(sb))
			// n_endpoints, n_refs, n_strings, flags; str_bytes; then
			// everything after the records.
			same = len(sb) == n && ld64(sp, bhEps) == ld64(p, bhEps) && ld32(sp, bhStrBytes) == ld32(p, bhStrBytes) &&
				equalBytes(b[lens-2*nrefs:], sb[lens-2*nrefs:])
			checked = same
			for r := blockHeaderBytes; same && r < lens-2*nrefs; r += recordBytes {
				q, sq := unsafe.Add(p, r), unsafe.Add(sp, r)
				if ld64(q, erNamespace) != ld64(sq, erNamespace) || ld32(q, erRefsFirst) != ld32(sq, erRefsFirst) {
					same, checked = false, false
					break
				}
				if ld32(q, erWaiting) > maxCount || ld32(q, erRunning) > maxCount || ld32(q, erMaxAdapters) > maxCount ||
					ld64(q, erKV) > math.Float64bits(1) || int64(ld64(q, erAge)) < 0 || ld64(q, erLastError) > uint64(scrapeStatusEnd-1) {
					checked = false // checkRecords names it
					break
				}
			}
		}
		if checked {
			stats.Compared++
		} else {
			if fast { // the string lengths' sum too, and its error
				if _, err := checkHeader(b, lim, inPush, "push.blocks", i, off); err != nil {
					return off, err
				}
			}
			if err := checkRecords(b, lim, "push.blocks", i, off); err != nil {
				return off, err
			}
			if same = m >= 0 && sameIdentity(b, s.stored.Blocks[m]); same {
				// The identity was checked when the stored block was; the
				// adapter lists are values and may have changed.
				if o := &s.stored.Info[m]; o.Refs != nrefs || !sameRefs(b, s.stored.Blocks[m], neps, nrefs) {
					if err := w.checker.checkAdapters(b, "push.agent", -1, 0); err != nil {
						return off, err
					}
				}
			} else if err := w.checker.checkDeep(b, lim, "push.agent", -1, 0); err != nil {
				return off, err
			}
		}
		s.in = append(s.in, b)
		s.inInfo = append(s.inInfo, BlockInfo{ID: id, Seq: ld64(p, bhSeq), Held: int64(ld64(p, bhHeld)), Len: neps, Refs: nrefs, Strings: nstrs})
		s.match = append(s.match, m)
		s.same = append(s.same, same)
		off += n
	}
	return off, nil
}
