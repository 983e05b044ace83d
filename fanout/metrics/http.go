package metrics

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Ready tells whether the daemon should receive traffic, and why not: a
// leader is ready while it serves and its offset commits have not been
// failing for longer than maxCommitFailing; a follower is ready while it
// knows its leader (clients it redirects get there).
func Ready(s Snapshot, now time.Time, maxCommitFailing time.Duration) (bool, string) {
	if s.Spread {
		return readySpread(s, now, maxCommitFailing)
	}
	switch {
	case s.Serving:
		since := s.Stats.CommitFailingSince
		if !since.IsZero() && now.Sub(since) > maxCommitFailing {
			return false, fmt.Sprintf("leader: offset commits failing for %s", now.Sub(since).Round(time.Millisecond))
		}
		if r := deadLettersRefused(s); r != "" {
			return false, "leader: " + r
		}
		if dl := s.DeadLetterFailingSince; !dl.IsZero() && now.Sub(dl) > maxCommitFailing {
			return false, fmt.Sprintf("leader: producing to dead-letter topic %s failing for %s (%d messages waiting, holding their partitions' offsets)",
				s.DeadLetterTopic, now.Sub(dl).Round(time.Millisecond), s.Stats.DeadLetterPending)
		}
		return true, "leader: serving"
	case s.Leader:
		return false, "leader: elected, not serving yet"
	case s.LeaderKnown:
		return true, fmt.Sprintf("follower: leader %s (epoch %d)", s.LeaderID, s.Epoch)
	case s.Clustered:
		return false, "follower: no leader known"
	default:
		return false, "starting: Kafka or ZooKeeper not reached yet"
	}
}

// readySpread is Ready of a spread-mode member: ready while it serves every
// partition its assignment gives it (none is fine) and its commits have
// not been failing for longer than maxCommitFailing.
func readySpread(s Snapshot, now time.Time, maxCommitFailing time.Duration) (bool, string) {
	switch {
	case !s.Serving:
		return false, "member: not serving yet"
	case s.Generation == 0:
		return false, "member: no assignment in force (no spread leader yet, cut off, or the leader runs another --assignment)"
	case !slices.Equal(s.Assigned, s.Owned):
		return false, fmt.Sprintf("member: owns partitions %v of %v assigned (generation %d)", s.Owned, s.Assigned, s.Generation)
	}
	if since := s.Stats.CommitFailingSince; !since.IsZero() && now.Sub(since) > maxCommitFailing {
		return false, fmt.Sprintf("member: offset commits failing for %s", now.Sub(since).Round(time.Millisecond))
	}
	if r := deadLettersRefused(s); r != "" {
		return false, "member: " + r
	}
	return true, fmt.Sprintf("member: serving partitions %v (generation %d)", s.Owned, s.Generation)
}

// deadLettersRefused is the reason a serving node is not ready while its
// dead-letter topic refuses records for a reason retrying cannot fix (at
// once: only an operator can fix it); "" when it refuses none.
func deadLettersRefused(s Snapshot) string {
	if s.DeadLetterRefused == 0 {
		return ""
	}
	return fmt.Sprintf("dead letters failing: %s refuses %d (%s); they hold their partitions' offsets",
		s.DeadLetterTopic, s.DeadLetterRefused, s.DeadLetterRefusedError)
}

// HandlerConfig configures Handler.
type HandlerConfig struct {
	Collector *Collector                     // required
	Snapshot  func(context.Context) Snapshot // for /readyz; required
	Now       func() time.Time               // default time.Now
	// MaxCommitFailing is how long a leader's commits may fail before
	// /readyz reports it unready; default 30s.
	MaxCommitFailing time.Duration
	// Token, when set, is the bearer token /metrics requires
	// ("Authorization: Bearer <Token>"); /healthz and /readyz stay open
	// for probes. A secret: it is never logged.
	Token string
	// Console, when set, serves the web console: its page and assets
	// (anything not served above) open, as they hold no data, and what is
	// under /api/ (the status document, with client names and addresses)
	// behind Token like /metrics.
	Console http.Handler
}

// Handler serves
//
//	/metrics  the Collector, Go runtime and process metrics (Prometheus text format);
//	          with cfg.Token, 401 unless the request carries it as a bearer token
//	/healthz  200 "ok" while the process runs
//	/readyz   200 with the role, or 503 with the reason (see Ready)
//	/api/     cfg.Console, behind cfg.Token like /metrics
//	/         cfg.Console (the page and its assets), open
func Handler(cfg HandlerConfig) http.Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxCommitFailing <= 0 {
		cfg.MaxCommitFailing = 30 * time.Second
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(cfg.Collector,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", requireBearer(cfg.Token, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), DefaultScrapeTimeout)
		defer cancel()
		ok, reason := Ready(cfg.Snapshot(ctx), cfg.Now(), cfg.MaxCommitFailing)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, reason)
	})
	if cfg.Console != nil {
		mux.Handle("GET /api/", requireBearer(cfg.Token, cfg.Console))
		mux.Handle("GET /", cfg.Console)
	}
	return mux
}

// requireBearer answers 401 to requests without "Authorization: Bearer
// token" and passes the others to h; an empty token lets every request
// through. The comparison takes the same time whatever the presented token.
func requireBearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fanout metrics"`)
			http.Error(w, "this needs the metrics token as a bearer token (--metrics-token-file or FANOUT_METRICS_TOKEN)", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Server is the HTTP listener of Handler.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr (host:port; port 0 picks a free one) for h. Serve
// starts serving.
func Listen(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener on %s: %w", addr, err)
	}
	return &Server{ln: ln, srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}}, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Shutdown and then returns nil.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}

// Shutdown stops the listener and waits, until ctx ends, for requests
// under way.
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("metrics server shutdown: %w", err)
	}
	return nil
}
