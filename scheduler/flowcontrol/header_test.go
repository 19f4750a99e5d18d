package flowcontrol

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseTTL(t *testing.T) {
	const limit = 10 * time.Second
	for _, tc := range []struct {
		in     string
		want   time.Duration
		status TTLStatus
	}{
		{"", limit, TTLAbsent},
		{"0", 0, TTLValid},
		{"250", 250 * time.Millisecond, TTLValid},
		{"0009999", 9999 * time.Millisecond, TTLValid},
		{"10000", limit, TTLValid},
		{"60000", limit, TTLValid}, // capped: a header only shortens
		{strings.Repeat("9", 40), limit, TTLValid},
		{"-1", limit, TTLMalformed},
		{"+5", limit, TTLMalformed},
		{"1.5", limit, TTLMalformed},
		{"5s", limit, TTLMalformed},
		{" 5", limit, TTLMalformed},
		{"5 ", limit, TTLMalformed},
		{"0x10", limit, TTLMalformed},
		{"١٢", limit, TTLMalformed}, // Arabic-Indic digits
		{"5\x00", limit, TTLMalformed},
	} {
		got, st := ParseTTL([]byte(tc.in), limit)
		if got != tc.want || st != tc.status {
			t.Errorf("ParseTTL(%q) = %v, %v; want %v, %v", tc.in, got, st, tc.want, tc.status)
		}
	}
}

func TestFlowKey(t *testing.T) {
	for _, tc := range []struct {
		in     string
		want   string
		status FlowKeyStatus
	}{
		{"", "", FlowKeyMissing},
		{"tenant-a", "tenant-a", FlowKeyOK},
		{strings.Repeat("x", 8), strings.Repeat("x", 8), FlowKeyOK},
		{strings.Repeat("x", 9), "", FlowKeyTooLong},
	} {
		got, st := FlowKey([]byte(tc.in), 8)
		if string(got) != tc.want || st != tc.status {
			t.Errorf("FlowKey(%q) = %q, %v; want %q, %v", tc.in, got, st, tc.want, tc.status)
		}
	}
}

func TestParseTTLAllocatesNothing(t *testing.T) {
	v := []byte("1234")
	if a := testing.AllocsPerRun(100, func() { ParseTTL(v, time.Second) }); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

// FuzzParseTTL holds ParseTTL to its contract on any bytes: never more than
// the limit, never negative, valid exactly for non-empty ASCII digits, and
// equal to strconv's reading wherever that fits.
func FuzzParseTTL(f *testing.F) {
	for _, s := range []string{"", "0", "1", "250", "10000", "99999999999999999999", "-1", "1e3", "5s", " 7", "\xff"} {
		f.Add([]byte(s), int64(10*time.Second))
	}
	f.Fuzz(func(t *testing.T, v []byte, limitNs int64) {
		limit := time.Duration(limitNs)
		if limit <= 0 || limit > MaxTTL {
			limit = DefaultTTL
		}
		got, st := ParseTTL(v, limit)
		if got < 0 || got > limit {
			t.Fatalf("ParseTTL(%q, %v) = %v: outside [0, limit]", v, limit, got)
		}
		digits := len(v) > 0
		for _, c := range v {
			if c < '0' || c > '9' {
				digits = false
			}
		}
		switch {
		case len(v) == 0:
			if st != TTLAbsent || got != limit {
				t.Fatalf("empty: %v %v", got, st)
			}
		case !digits:
			if st != TTLMalformed || got != limit {
				t.Fatalf("ParseTTL(%q) = %v %v; want malformed, limit", v, got, st)
			}
		default:
			if st != TTLValid {
				t.Fatalf("ParseTTL(%q) = %v; want valid", v, st)
			}
			want := limit
			if ms, err := strconv.ParseInt(string(v), 10, 64); err == nil && ms <= int64(MaxTTL/time.Millisecond) {
				want = min(time.Duration(ms)*time.Millisecond, limit)
			}
			if got != want {
				t.Fatalf("ParseTTL(%q, %v) = %v, want %v", v, limit, got, want)
			}
		}
	})
}

// FuzzFlowKey: a key is never longer than the bound and is the value
// itself or the anonymous flow.
func FuzzFlowKey(f *testing.F) {
	for _, s := range []string{"", "tenant", strings.Repeat("k", 200)} {
		f.Add([]byte(s), 128)
	}
	f.Fuzz(func(t *testing.T, v []byte, maxBytes int) {
		if maxBytes < 1 || maxBytes > MaxMaxFlowKeyBytes {
			maxBytes = DefaultMaxFlowKeyBytes
		}
		k, st := FlowKey(v, maxBytes)
		switch {
		case len(k) > maxBytes:
			t.Fatalf("key of %d bytes over the bound %d", len(k), maxBytes)
		case st == FlowKeyOK && string(k) != string(v):
			t.Fatalf("key %q is not the value %q", k, v)
		case st != FlowKeyOK && len(k) != 0:
			t.Fatalf("status %v with key %q", st, k)
		}
	})
}

func TestLogLimiter(t *testing.T) {
	l := LogLimiter{Interval: 10 * time.Second}
	var allowed []time.Duration
	var held []uint64
	for now := time.Duration(0); now < 35*time.Second; now += time.Second {
		if ok, n := l.Allow(now); ok {
			allowed, held = append(allowed, now), append(held, n)
		}
	}
	if len(allowed) != 4 || allowed[1] != 10*time.Second || held[0] != 0 || held[1] != 9 {
		t.Fatalf("allowed at %v with %v held back", allowed, held)
	}
	// A clock that goes backwards does not silence the log for good.
	if ok, _ := l.Allow(time.Second); !ok {
		t.Fatal("message after a backwards clock jump held back")
	}
}
