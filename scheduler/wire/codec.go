package wire

import (
	"encoding/binary"
	"math"
	"net/netip"
	"strconv"
	"time"
)

const (
	version1 = 1
	// minEndpointBytes is the smallest encoded endpoint: empty namespace,
	// one-byte name, IPv4, empty adapter lists. Counts are checked against
	// the bytes left so a tiny payload cannot claim a huge slice.
	minEndpointBytes = 1 + 2 + 1 + 4 + 2 + 1 + 1 + 8 + 1 + 1 + 1 + 8 + 1
)

var magicPush = [2]byte{'W', 'P'}

// ---- encoding ----

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendStrList(dst []byte, list []string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(list)))
	for _, s := range list {
		dst = appendStr(dst, s)
	}
	return dst
}

// appendEndpoint writes e; the caller has validated it.
func appendEndpoint(dst []byte, e *EndpointState) []byte {
	dst = appendStr(dst, e.Namespace)
	dst = appendStr(dst, e.Name)
	if e.Address.Is4() {
		a := e.Address.As4()
		dst = append(dst, 4)
		dst = append(dst, a[:]...)
	} else {
		a := e.Address.As16()
		dst = append(dst, 16)
		dst = append(dst, a[:]...)
	}
	dst = binary.LittleEndian.AppendUint16(dst, e.Port)
	dst = binary.AppendUvarint(dst, uint64(e.Waiting))
	dst = binary.AppendUvarint(dst, uint64(e.Running))
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(e.KVCacheUsage))
	dst = binary.AppendUvarint(dst, uint64(e.MaxAdapters))
	dst = appendStrList(dst, e.ActiveAdapters)
	dst = appendStrList(dst, e.WaitingAdapters)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(e.ScrapeTime.UnixNano()))
	return append(dst, byte(e.LastError))
}

// ---- decoding ----

// decoder reads one message. Errors are sticky: after the first failure
// every read returns zero values and the caller checks err once per field
// group, which keeps the hot path free of error plumbing.
type decoder struct {
	b   []byte
	s   string // the same bytes as one string: fields are sliced from it, not copied one by one
	off int
	lim Limits
	err *Error

	// location for error messages, rendered only on failure
	root  string
	epIdx int

	// adapters is one backing array shared by every adapter list of the
	// message. When append grows it, lists already handed out keep pointing
	// at the old array, whose elements are complete and never written again.
	adapters []string
}

func newDecoder(b []byte, lim Limits, root string) *decoder {
	return &decoder{b: b, lim: lim.resolved(), root: root, epIdx: -1}
}

func (d *decoder) where(field string) string {
	w := d.root
	if d.epIdx >= 0 {
		w += ".endpoints[" + strconv.Itoa(d.epIdx) + "]"
	}
	if field != "" {
		w += "." + field
	}
	return w
}

func (d *decoder) fail(kind error, field string, offset int, detail string) {
	if d.err == nil {
		d.err = errf(kind, d.where(field), offset, detail)
	}
}

// need reports whether n more bytes exist, failing with ErrTruncated if not.
func (d *decoder) need(n int, field string) bool {
	if d.err != nil {
		return false
	}
	if len(d.b)-d.off < n {
		d.fail(ErrTruncated, field, d.off, "need "+strconv.Itoa(n)+" bytes, have "+strconv.Itoa(len(d.b)-d.off))
		return false
	}
	return true
}

// header checks magic and version.
func (d *decoder) header(magic [2]byte, maxBytes int) {
	if len(d.b) > maxBytes {
		d.fail(ErrLimit, "", 0, strconv.Itoa(len(d.b))+" bytes, limit "+strconv.Itoa(maxBytes))
		return
	}
	if len(d.b) < 2 {
		d.fail(ErrTruncated, "magic", 0, "payload of "+strconv.Itoa(len(d.b))+" bytes")
		return
	}
	if d.b[0] != magic[0] || d.b[1] != magic[1] {
		d.fail(ErrFormat, "magic", 0, "got "+strconv.Quote(string(d.b[:2]))+", want "+strconv.Quote(string(magic[:])))
		return
	}
	if !d.need(3, "version") {
		return
	}
	if v := d.b[2]; v != version1 {
		d.fail(ErrVersion, "version", 2, "version "+strconv.Itoa(int(v))+", this build reads "+strconv.Itoa(version1))
		return
	}
	d.off = 3
	// One copy of the whole payload; every string field is a substring of it.
	d.s = string(d.b)
}

func (d *decoder) u8(field string) byte {
	if !d.need(1, field) {
		return 0
	}
	v := d.b[d.off]
	d.off++
	return v
}

func (d *decoder) u16(field string) uint16 {
	if !d.need(2, field) {
		return 0
	}
	v := binary.LittleEndian.Uint16(d.b[d.off:])
	d.off += 2
	return v
}

func (d *decoder) u64(field string) uint64 {
	if !d.need(8, field) {
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v
}

// uvarint reads a shortest-form LEB128 number.
func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	start := d.off
	if start < len(d.b) && d.b[start] < 0x80 { // one byte: nearly every varint here
		d.off++
		return uint64(d.b[start])
	}
	var v uint64
	for shift := 0; ; shift += 7 {
		if d.off >= len(d.b) {
			d.fail(ErrTruncated, field, start, "varint cut short")
			return 0
		}
		c := d.b[d.off]
		d.off++
		if shift == 63 && c > 1 {
			d.fail(ErrInvalidField, field, start, "varint overflows 64 bits")
			return 0
		}
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if c == 0 && d.off-start > 1 {
				d.fail(ErrInvalidField, field, start, "varint not in shortest form")
				return 0
			}
			return v
		}
	}
}

// count reads a list length, bounded by max and by the bytes left.
func (d *decoder) count(field string, max, minBytesEach int) int {
	start := d.off
	n := d.uvarint(field)
	if d.err != nil {
		return 0
	}
	if n > uint64(max) {
		d.fail(ErrLimit, field, start, strconv.FormatUint(n, 10)+" entries, limit "+strconv.Itoa(max))
		return 0
	}
	if rest := uint64(len(d.b) - d.off); n*uint64(minBytesEach) > rest {
		d.fail(ErrTruncated, field, start, strconv.FormatUint(n, 10)+" entries cannot fit in "+strconv.FormatUint(rest, 10)+" bytes")
		return 0
	}
	return int(n)
}

// u32count reads a bounded number that fits in uint32.
func (d *decoder) u32count(field string) uint32 {
	start := d.off
	v := d.uvarint(field)
	if d.err == nil && v > uint64(d.lim.MaxCount) {
		d.fail(ErrLimit, field, start, strconv.FormatUint(v, 10)+" over the limit "+strconv.Itoa(d.lim.MaxCount))
		return 0
	}
	return uint32(v)
}

func (d *decoder) str(field string) string {
	start := d.off
	n := d.uvarint(field)
	if d.err != nil {
		return ""
	}
	if n > uint64(d.lim.MaxNameLen) {
		d.fail(ErrLimit, field, start, "length "+strconv.FormatUint(n, 10)+" over the limit "+strconv.Itoa(d.lim.MaxNameLen))
		return ""
	}
	if !d.need(int(n), field) {
		return ""
	}
	s := d.s[d.off : d.off+int(n)]
	d.off += int(n)
	return s
}

func (d *decoder) strList(field string) []string {
	n := d.count(field, d.lim.MaxAdapters, 1)
	if n == 0 || d.err != nil {
		return nil
	}
	first := len(d.adapters)
	for i := 0; i < n; i++ {
		d.adapters = append(d.adapters, d.str(field))
	}
	if d.err != nil {
		return nil
	}
	return d.adapters[first:len(d.adapters):len(d.adapters)]
}

func (d *decoder) time(field string) time.Time {
	start := d.off
	ns := int64(d.u64(field))
	if d.err != nil {
		return time.Time{}
	}
	if e := checkNanos(ns, ""); e != nil {
		d.fail(ErrInvalidField, field, start, e.Detail)
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// endpoint reads one endpoint into e and validates it.
func (d *decoder) endpoint(e *EndpointState) {
	start := d.off
	e.Namespace = d.str("namespace")
	e.Name = d.str("name")
	switch n := d.u8("address"); {
	case d.err != nil:
	case n == 4:
		if d.need(4, "address") {
			e.Address = netip.AddrFrom4([4]byte(d.b[d.off : d.off+4]))
			d.off += 4
		}
	case n == 16:
		if d.need(16, "address") {
			e.Address = netip.AddrFrom16([16]byte(d.b[d.off : d.off+16]))
			d.off += 16
		}
	default:
		d.fail(ErrInvalidField, "address", d.off-1, "address length "+strconv.Itoa(int(n))+" (want 4 or 16)")
	}
	e.Port = d.u16("port")
	e.Waiting = d.u32count("waiting")
	e.Running = d.u32count("running")
	e.KVCacheUsage = math.Float64frombits(d.u64("kv_cache_usage"))
	e.MaxAdapters = d.u32count("max_adapters")
	e.ActiveAdapters = d.strList("active_adapters")
	e.WaitingAdapters = d.strList("waiting_adapters")
	e.ScrapeTime = d.time("scrape_time")
	e.LastError = ScrapeStatus(d.u8("last_error"))
	if d.err != nil {
		return
	}
	if err := checkEndpoint(e, &d.lim); err != nil {
		err.Where = d.where(err.Where)
		err.Offset = start
		d.err = err
	}
}

// endpoints reads a counted, sorted list of endpoints into dst.
func (d *decoder) endpoints(dst []EndpointState) {
	for i := range dst {
		d.epIdx = i
		d.endpoint(&dst[i])
		if d.err != nil {
			return
		}
		if i > 0 && compareEndpointID(&dst[i-1], &dst[i]) >= 0 {
			d.fail(ErrInvalidField, "", d.off, "endpoints not sorted and unique: "+endpointLabel(&dst[i-1])+" then "+endpointLabel(&dst[i]))
			return
		}
	}
	d.epIdx = -1
}

func (d *decoder) end() {
	if d.err == nil && d.off != len(d.b) {
		d.fail(ErrTrailing, "", d.off, strconv.Itoa(len(d.b)-d.off)+" bytes after the message")
	}
}
