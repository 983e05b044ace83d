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

// KafkaGrace is how long Kafka may leave the daemon's checks unanswered
// before /readyz reports it unready. The daemon checks its topic every few
// seconds (fanout.topicCheckInterval); 30 s rides out a broker restart or a
// controller failover without flapping, and a probe's own failure
// threshold adds to it. A leader cut off from Kafka loses its term sooner
// (its heartbeats stop coming back): this is for what the election does not
// see, and for a daemon leading alone.
const KafkaGrace = 30 * time.Second

// Ready tells whether the daemon should receive traffic, and why not. It is
// ready while every one of conditions holds. The answer names the daemon's
// role (leader, follower, member, starting), then either what it does or
// every condition that fails, joined by "; ".
func Ready(s Snapshot, now time.Time, maxCommitFailing time.Duration) (bool, string) {
	var failing []string
	for _, c := range conditions {
		if why := c(s, now, maxCommitFailing); why != "" {
			failing = append(failing, why)
		}
	}
	if len(failing) > 0 {
		return false, role(s) + ": " + strings.Join(failing, "; ")
	}
	return true, role(s) + ": " + doing(s)
}

// A condition is one thing readiness requires: it returns why it does not
// hold in s at now, or "" while it does.
type condition func(s Snapshot, now time.Time, maxCommitFailing time.Duration) string

// conditions are the readiness conditions, in the order their reasons are
// given. A new reason to be unready is one more entry.
var conditions = []condition{
	topicExists,
	kafkaAnswers,
	roleHolds,
	partitionsConsumed,
	commitsSucceed,
	deadLettersRefused,
	deadLettersProduced,
}

// topicExists: Kafka's last answer to the daemon's check of its topic did
// not say it is missing. A daemon waits for a missing topic before it joins
// the election, and a leader whose topic is deleted consumes nothing.
func topicExists(s Snapshot, _ time.Time, _ time.Duration) string {
	if s.TopicMissing {
		return fmt.Sprintf("topic %s not found in Kafka", s.Topic)
	}
	return ""
}

// kafkaAnswers: Kafka answered the daemon within KafkaGrace (once it first
// did; before, roleHolds says the daemon is starting).
func kafkaAnswers(s Snapshot, now time.Time, _ time.Duration) string {
	if s.KafkaAnswered.IsZero() || now.Sub(s.KafkaAnswered) <= KafkaGrace {
		return ""
	}
	why := fmt.Sprintf("Kafka not answering for %s", now.Sub(s.KafkaAnswered).Round(time.Second))
	if s.KafkaError != "" {
		why += " (" + s.KafkaError + ")"
	}
	return why
}

// roleHolds: the daemon does what its role needs. A leader serves; a
// follower knows its leader (the clients it redirects get there); a
// spread-mode member serves every partition its assignment gives it (none
// is fine).
func roleHolds(s Snapshot, _ time.Time, _ time.Duration) string {
	if s.Spread {
		switch {
		case !s.Serving && s.TopicMissing:
			return "" // topicExists says why
		case !s.Serving:
			return "not serving yet"
		case s.Generation == 0:
			return "no assignment in force (none received yet, cut off, or the cluster runs another --assignment)"
		case !slices.Equal(s.Assigned, s.Owned):
			return fmt.Sprintf("owns partitions %v of %v assigned (generation %d)", s.Owned, s.Assigned, s.Generation)
		}
		return ""
	}
	switch {
	case s.Serving:
		return ""
	case s.Leader:
		return "elected, not serving yet"
	case s.LeaderKnown:
		return ""
	case s.Clustered:
		return "no leader known"
	case s.TopicMissing:
		return "" // found Kafka; topicExists says why it goes no further
	case s.KafkaAnswered.IsZero():
		if s.KafkaError != "" {
			return "Kafka not reached yet (" + s.KafkaError + ")"
		}
		return "Kafka not reached yet"
	}
	return "offset store not reached yet"
}

// partitionsConsumed: a serving daemon with partitions to serve consumes at
// least one of them (a partition consumer is open: HighWaterMarks has it).
func partitionsConsumed(s Snapshot, _ time.Time, _ time.Duration) string {
	if !s.Serving || len(s.HighWaterMarks) > 0 || s.Spread && len(s.Owned) == 0 {
		return ""
	}
	if s.Partitions == 0 {
		return fmt.Sprintf("no partition of topic %s consumed: the source has not started (the log says why)", s.Topic)
	}
	return fmt.Sprintf("no partition of topic %s consumed: 0 of %d open (the log says why)", s.Topic, s.Partitions)
}

// commitsSucceed: a serving daemon's offset commits have not been failing
// for longer than maxCommitFailing.
func commitsSucceed(s Snapshot, now time.Time, maxCommitFailing time.Duration) string {
	if since := s.Stats.CommitFailingSince; s.Serving && !since.IsZero() && now.Sub(since) > maxCommitFailing {
		return fmt.Sprintf("offset commits failing for %s", now.Sub(since).Round(time.Millisecond))
	}
	return ""
}

// deadLettersProduced: a serving daemon's producing to its dead-letter
// topic has not been failing for longer than maxCommitFailing (the
// messages waiting for it hold their partitions' offsets).
func deadLettersProduced(s Snapshot, now time.Time, maxCommitFailing time.Duration) string {
	if dl := s.DeadLetterFailingSince; s.Serving && !dl.IsZero() && now.Sub(dl) > maxCommitFailing {
		return fmt.Sprintf("producing to dead-letter topic %s failing for %s (%d messages waiting, holding their partitions' offsets)",
			s.DeadLetterTopic, now.Sub(dl).Round(time.Millisecond), s.Stats.DeadLetterPending)
	}
	return ""
}

// role names what the daemon is in the cluster.
func role(s Snapshot) string {
	switch {
	case s.Spread:
		return "member"
	case s.Serving || s.Leader:
		return "leader"
	case s.Clustered:
		return "follower"
	}
	return "starting"
}

// doing says what a ready daemon does.
func doing(s Snapshot) string {
	switch {
	case s.Spread:
		return fmt.Sprintf("serving partitions %v (generation %d)", s.Owned, s.Generation)
	case s.Serving:
		return "serving"
	case s.LeaderKnown:
		return fmt.Sprintf("leader %s (epoch %d)", s.LeaderID, s.Epoch)
	}
	return "ready"
}

// deadLettersRefused: a serving daemon's dead-letter topic refuses no
// record for a reason retrying cannot fix (unready at once: only an
// operator can fix it).
func deadLettersRefused(s Snapshot, _ time.Time, _ time.Duration) string {
	if !s.Serving || s.DeadLetterRefused == 0 {
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
