// Package logcapture is a slog.Handler that keeps records in memory so
// tests can assert on what was logged (for example a plugin's proxy_log
// lines in the test host).
package logcapture

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// Record is one captured log line.
type Record struct {
	Level   slog.Level
	Message string
	Attrs   map[string]string
}

// String renders the record as "LEVEL message k=v ...", attributes sorted
// by insertion order is not kept; use Attrs for exact checks.
func (r Record) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for k, v := range r.Attrs {
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	return b.String()
}

// Handler captures records at or above Level.
type Handler struct {
	Level slog.Level
	store *store
	attrs []slog.Attr
	group string
}

type store struct {
	mu      sync.Mutex
	records []Record
}

// New returns a handler capturing every level from min up.
func New(min slog.Level) *Handler { return &Handler{Level: min, store: &store{}} }

// Logger is a slog.Logger writing to h.
func (h *Handler) Logger() *slog.Logger { return slog.New(h) }

// Enabled implements slog.Handler.
func (h *Handler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.Level }

// Handle implements slog.Handler.
func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	rec := Record{Level: r.Level, Message: r.Message, Attrs: map[string]string{}}
	add := func(a slog.Attr) {
		k := a.Key
		if h.group != "" {
			k = h.group + "." + k
		}
		rec.Attrs[k] = a.Value.String()
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool { add(a); return true })
	h.store.mu.Lock()
	h.store.records = append(h.store.records, rec)
	h.store.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	return &c
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	c := *h
	c.group = name
	return &c
}

// Records returns a copy of everything captured so far.
func (h *Handler) Records() []Record {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	return append([]Record(nil), h.store.records...)
}

// Find returns the records whose message contains substr.
func (h *Handler) Find(substr string) []Record {
	var out []Record
	for _, r := range h.Records() {
		if strings.Contains(r.Message, substr) {
			out = append(out, r)
		}
	}
	return out
}
