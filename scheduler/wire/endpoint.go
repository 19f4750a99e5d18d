package wire

import (
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ScrapeStatus is the outcome of the agent's latest scrape of an endpoint.
// Zero means healthy; anything else names why the latest scrape failed (the
// endpoint then carries its last good values and their scrape time).
type ScrapeStatus uint8

// Scrape outcomes. The numbers are part of the wire format: append only.
const (
	ScrapeOK ScrapeStatus = iota
	ScrapeConnectFailed
	ScrapeTimeout
	ScrapeHTTPStatus
	ScrapeBadContentType
	ScrapeBodyTooLarge
	ScrapeParseError
	ScrapeInvalidValue
	ScrapeMissingMetric
	scrapeStatusEnd // first unknown value
)

var scrapeStatusNames = [...]string{
	ScrapeOK:             "ok",
	ScrapeConnectFailed:  "connect",
	ScrapeTimeout:        "timeout",
	ScrapeHTTPStatus:     "http_status",
	ScrapeBadContentType: "content_type",
	ScrapeBodyTooLarge:   "body_too_large",
	ScrapeParseError:     "parse",
	ScrapeInvalidValue:   "invalid_value",
	ScrapeMissingMetric:  "missing_metric",
}

// String returns a short snake_case name, usable as a metric label value.
func (s ScrapeStatus) String() string {
	if s < scrapeStatusEnd {
		return scrapeStatusNames[s]
	}
	return "unknown(" + strconv.Itoa(int(s)) + ")"
}

// EndpointState is one endpoint as the agent last saw it.
type EndpointState struct {
	// Namespace may be empty (static targets); Name may not.
	Namespace string
	Name      string
	// Address is the pod IP: IPv4, or IPv6 that is not IPv4-mapped, no zone.
	Address netip.Addr
	Port    uint16
	Waiting uint32
	Running uint32
	// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
	KVCacheUsage float64
	// ActiveAdapters and WaitingAdapters are sorted and unique.
	ActiveAdapters  []string
	WaitingAdapters []string
	// MaxAdapters is vLLM's max_loras (0 when LoRA is off).
	MaxAdapters uint32
	// ScrapeTime is when the values above were scraped (the last good scrape).
	ScrapeTime time.Time
	// LastError is the outcome of the latest scrape attempt.
	LastError ScrapeStatus
}

// Healthy reports whether the latest scrape succeeded.
func (e *EndpointState) Healthy() bool { return e.LastError == ScrapeOK }

// compareEndpointID orders endpoints by namespace, then name.
func compareEndpointID(a, b *EndpointState) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// Normalize puts eps in wire order: endpoints sorted by namespace and name,
// adapter lists sorted with duplicates removed. It works in place. Duplicate
// endpoints are left for the encoder to reject: which one is right is the
// caller's decision.
func Normalize(eps []EndpointState) {
	for i := range eps {
		eps[i].ActiveAdapters = sortUnique(eps[i].ActiveAdapters)
		eps[i].WaitingAdapters = sortUnique(eps[i].WaitingAdapters)
	}
	slices.SortFunc(eps, func(a, b EndpointState) int { return compareEndpointID(&a, &b) })
}

func sortUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// checkString validates one string field.
func checkString(s string, max int, allowEmpty bool) *Error {
	if s == "" {
		if allowEmpty {
			return nil
		}
		return errf(ErrInvalidField, "", -1, "empty")
	}
	if len(s) > max {
		return errf(ErrLimit, "", -1, "length "+strconv.Itoa(len(s))+" over the limit "+strconv.Itoa(max))
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return errf(ErrInvalidField, "", -1, "control character at index "+strconv.Itoa(i))
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return errf(ErrInvalidField, "", -1, "invalid UTF-8 at index "+strconv.Itoa(i))
		}
		if r >= 0x80 && r < 0xa0 { // C1 controls
			return errf(ErrInvalidField, "", -1, "control character at index "+strconv.Itoa(i))
		}
		i += size
	}
	return nil
}

func checkAdapters(list []string, lim *Limits, field string) *Error {
	if len(list) > lim.MaxAdapters {
		return errf(ErrLimit, field, -1, strconv.Itoa(len(list))+" adapters, limit "+strconv.Itoa(lim.MaxAdapters))
	}
	for i, a := range list {
		if e := checkString(a, lim.MaxNameLen, false); e != nil {
			return e.at(field + "[" + strconv.Itoa(i) + "]")
		}
		if i > 0 && list[i-1] >= a {
			return errf(ErrInvalidField, field+"["+strconv.Itoa(i)+"]", -1, "adapters not sorted and unique: "+strconv.Quote(list[i-1])+" then "+strconv.Quote(a))
		}
	}
	return nil
}

func checkCount(v uint32, lim *Limits, field string) *Error {
	if int64(v) > int64(lim.MaxCount) {
		return errf(ErrLimit, field, -1, strconv.FormatUint(uint64(v), 10)+" over the limit "+strconv.Itoa(lim.MaxCount))
	}
	return nil
}

// timeNanos converts t to positive Unix nanoseconds, the only times the
// format carries (UnixNano is undefined outside 1678..2262 and the zero Time
// is a forgotten assignment, not a moment).
func timeNanos(t time.Time, field string) (int64, *Error) {
	if t.IsZero() || !t.After(time.Unix(0, 0)) || t.After(time.Unix(0, math.MaxInt64)) {
		return 0, errf(ErrInvalidField, field, -1, "time "+t.String()+" not in 1970..2262")
	}
	return t.UnixNano(), nil
}

// checkNanos validates a decoded time.
func checkNanos(ns int64, field string) *Error {
	if ns <= 0 {
		return errf(ErrInvalidField, field, -1, "time "+strconv.FormatInt(ns, 10)+" ns is not after 1970")
	}
	return nil
}

// checkAddr accepts a unicast pod IP: IPv4, or IPv6 that is not
// IPv4-mapped, without a zone.
func checkAddr(a netip.Addr) *Error {
	switch {
	case !a.IsValid():
		return errf(ErrInvalidField, "", -1, "missing")
	case a.Zone() != "":
		return errf(ErrInvalidField, "", -1, "zone not allowed: "+a.String())
	case a.Is4In6():
		return errf(ErrInvalidField, "", -1, "IPv4-mapped IPv6 must be sent as IPv4: "+a.String())
	case a.IsUnspecified() || a.IsMulticast():
		return errf(ErrInvalidField, "", -1, "not a unicast address: "+a.String())
	case a.Is4() && a.As4() == [4]byte{255, 255, 255, 255}:
		return errf(ErrInvalidField, "", -1, "broadcast address")
	}
	return nil
}

// checkEndpoint validates every field of e (not its order among others).
func checkEndpoint(e *EndpointState, lim *Limits) *Error {
	if err := checkString(e.Namespace, lim.MaxNameLen, true); err != nil {
		return err.at("namespace")
	}
	if err := checkString(e.Name, lim.MaxNameLen, false); err != nil {
		return err.at("name")
	}
	if err := checkAddr(e.Address); err != nil {
		return err.at("address")
	}
	if e.Port == 0 {
		return errf(ErrInvalidField, "port", -1, "port 0 (must be 1..65535)")
	}
	if err := checkCount(e.Waiting, lim, "waiting"); err != nil {
		return err
	}
	if err := checkCount(e.Running, lim, "running"); err != nil {
		return err
	}
	if err := checkCount(e.MaxAdapters, lim, "max_adapters"); err != nil {
		return err
	}
	kv := e.KVCacheUsage
	if math.IsNaN(kv) || kv < 0 || kv > 1 || math.Signbit(kv) {
		return errf(ErrInvalidField, "kv_cache_usage", -1, strconv.FormatFloat(kv, 'g', -1, 64)+" outside 0..1")
	}
	if err := checkAdapters(e.ActiveAdapters, lim, "active_adapters"); err != nil {
		return err
	}
	if err := checkAdapters(e.WaitingAdapters, lim, "waiting_adapters"); err != nil {
		return err
	}
	if _, err := timeNanos(e.ScrapeTime, "scrape_time"); err != nil {
		return err
	}
	if e.LastError >= scrapeStatusEnd {
		return errf(ErrInvalidField, "last_error", -1, "unknown scrape status "+strconv.Itoa(int(e.LastError)))
	}
	return nil
}

// checkEndpointList validates each endpoint and their strict order.
func checkEndpointList(eps []EndpointState, lim *Limits, where string) *Error {
	for i := range eps {
		if err := checkEndpoint(&eps[i], lim); err != nil {
			return err.at(where + "[" + strconv.Itoa(i) + "] (" + endpointLabel(&eps[i]) + ")")
		}
		if i > 0 && compareEndpointID(&eps[i-1], &eps[i]) >= 0 {
			return errf(ErrInvalidField, where+"["+strconv.Itoa(i)+"]", -1,
				"endpoints not sorted and unique: "+endpointLabel(&eps[i-1])+" then "+endpointLabel(&eps[i]))
		}
	}
	return nil
}

func endpointLabel(e *EndpointState) string {
	return strconv.Quote(e.Namespace + "/" + e.Name)
}
