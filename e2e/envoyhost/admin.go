package envoyhost

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// The admin listener: a small part of Envoy's admin interface.
//
//	GET /stats             text stats, "name: value"
//	GET /stats/prometheus  Prometheus text exposition
//	GET /ready             "LIVE" once started
func (h *Host) startAdmin() error {
	ln, err := net.Listen("tcp", h.cfg.AdminAddress)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	h.adminLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		h.stats.writeText(w)
	})
	mux.HandleFunc("GET /stats/prometheus", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=UTF-8")
		h.stats.writePrometheus(w)
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		fmt.Fprintln(w, "LIVE")
	})
	h.admin = &http.Server{Handler: mux, ReadHeaderTimeout: time.Minute}
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		if err := h.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("admin listener stopped", "err", err)
		}
	}()
	h.log.Info("admin listening", "address", ln.Addr().String())
	return nil
}
