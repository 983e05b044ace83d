// Package console is a daemon's web console: one page, embedded in the
// binary, that shows the cluster's members and leader, the partitions'
// offsets and lag, the connected clients and the message rates of the last
// minutes, kept up to date from the status document at /api/status (the
// document of fanout status --json, with the daemon's own view added).
//
// The page and its assets are static and hold no data; the document holds
// client names and addresses, so the metrics listener serves it behind the
// metrics token (see metrics.HandlerConfig.Console).
package console

import (
	"context"
	"embed"
	"io/fs"
	"net/http"
	"time"

	"github.com/nanoservice/core-fanout/fanout/status"
)

//go:embed assets
var assets embed.FS

// StatusTimeout bounds how long a request for the document waits for it.
const StatusTimeout = 5 * time.Second

// Config configures Handler.
type Config struct {
	// Status returns the daemon's status document; required.
	Status func(ctx context.Context) *status.Status
}

// contentSecurityPolicy lets the page load nothing but its own script,
// style and document: no inline script, no other origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"

// Handler serves
//
//	/             the page
//	/assets/...   its script, style and icon (embedded)
//	/api/status   the status document (status.Encode), read by the page every few seconds
func Handler(cfg Config) http.Handler {
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(static)
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", page(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, static, "index.html")
	})))
	mux.Handle("GET /assets/{file}", page(http.StripPrefix("/assets", files))) // files only, no listing
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), StatusTimeout)
		defer cancel()
		st := cfg.Status(ctx)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_ = status.Encode(w, st) // fails only when the client went away: nobody left to tell
	})
	return mux
}

// page adds the headers of the page and its assets: they may be cached
// only after a check (a new binary serves new ones), load nothing else, and
// are never taken for another type.
func page(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hdr := w.Header()
		hdr.Set("Content-Security-Policy", contentSecurityPolicy)
		hdr.Set("X-Content-Type-Options", "nosniff")
		hdr.Set("Referrer-Policy", "no-referrer")
		hdr.Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}
