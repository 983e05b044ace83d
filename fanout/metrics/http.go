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
	"strconv"
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
		if why := c.check(s, now, maxCommitFailing); why != "" {
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

// A check is a condition with the kind of Warning its failure is.
type check struct {
	kind  string
	check condition
}

// conditions are the readiness conditions, in the order their reasons are
// given. A new reason to be unready is one more entry.
var conditions = []check{
	{"topic-missing", topicExists},
	{"kafka-silent", kafkaAnswers},
	{"role", roleHolds},
	{"partitions-not-consumed", partitionsConsumed},
	{"commits-failing", commitsSucceed},
	{"dead-letters-refused", deadLettersRefused},
	{"dead-letters-failing", deadLettersProduced},
}

// advisories are what an operator should look at that does not make the
// daemon unready: the first signs of a readiness condition, or trouble that
// a ready daemon can have.
var advisories = []check{
	{"delivery-paused", deliveryPaused},
	{"commits-failing", commitsFailingBriefly},
	{"dead-letters-failing", deadLettersFailingBriefly},
	{"partitions-held", partitionsHeld},
	{"partitions-stalled", partitionsStalled},
	{"no-clients", noClientsWhileMessagesWait},
}

// Warning is something an operator should look at: a readiness condition
// that fails (Unready), or an advisory.
type Warning struct {
	Kind    string // what it is about: "topic-missing", "partitions-held", ...
	Message string // what is wrong, for people
	Unready bool   // the daemon is unready for it (Ready says why)
}

// Warnings returns, in s at now, every readiness condition that fails (the
// reasons Ready gives), then every advisory that holds.
func Warnings(s Snapshot, now time.Time, maxCommitFailing time.Duration) []Warning {
	var out []Warning
	for _, c := range conditions {
		if why := c.check(s, now, maxCommitFailing); why != "" {
			out = append(out, Warning{Kind: c.kind, Message: why, Unready: true})
		}
	}
	for _, c := range advisories {
		if why := c.check(s, now, maxCommitFailing); why != "" {
			out = append(out, Warning{Kind: c.kind, Message: why})
		}
	}
	return out
}

// deliveryPaused: an operator paused the deliveries.
func deliveryPaused(s Snapshot, _ time.Time, _ time.Duration) string {
	if !s.DeliveryPaused {
		return ""
	}
	why := "deliveries paused"
	if s.PausedBy != "" {
		why += " by " + s.PausedBy
	}
	return why + ": no message is handed out until they resume"
}

// commitsFailingBriefly: a serving daemon's offset commits fail, not yet
// for longer than maxCommitFailing (then commitsSucceed says it).
func commitsFailingBriefly(s Snapshot, now time.Time, maxCommitFailing time.Duration) string {
	if since := s.Stats.CommitFailingSince; s.Serving && !since.IsZero() && now.Sub(since) <= maxCommitFailing {
		return fmt.Sprintf("offset commits failing for %s (%d failures so far)", now.Sub(since).Round(time.Millisecond), s.Stats.CommitFailures)
	}
	return ""
}

// deadLettersFailingBriefly: producing to the dead-letter topic fails, not
// yet for longer than maxCommitFailing (then deadLettersProduced says it).
func deadLettersFailingBriefly(s Snapshot, now time.Time, maxCommitFailing time.Duration) string {
	if dl := s.DeadLetterFailingSince; s.Serving && !dl.IsZero() && now.Sub(dl) <= maxCommitFailing {
		return fmt.Sprintf("producing to dead-letter topic %s failing for %s (%d messages waiting)",
			s.DeadLetterTopic, now.Sub(dl).Round(time.Millisecond), s.Stats.DeadLetterPending)
	}
	return ""
}

// partitionsHeld: partitions whose fetching is paused behind an unacked
// message (--max-outstanding).
func partitionsHeld(s Snapshot, _ time.Time, _ time.Duration) string {
	if !s.Serving || len(s.Stats.Held) == 0 {
		return ""
	}
	return fmt.Sprintf("partitions %s held: more than --max-outstanding offsets behind an unacked message, fetching them is paused until it is acked",
		partitionList(s.Stats.Held))
}

// partitionsStalled: partitions whose committed offset has not moved for
// the stall time while they hold unacked messages.
func partitionsStalled(s Snapshot, _ time.Time, _ time.Duration) string {
	if !s.Serving || len(s.Stats.Stalled) == 0 {
		return ""
	}
	return fmt.Sprintf("partitions %s stalled: their committed offset has not moved for 3 ack timeouts while they hold unacked messages (the log says where each one's oldest is)",
		partitionList(s.Stats.Stalled))
}

// noClientsWhileMessagesWait: a serving daemon has no client while
// messages wait, fetched or not.
func noClientsWhileMessagesWait(s Snapshot, _ time.Time, _ time.Duration) string {
	if !s.Serving || s.Stats.Clients > 0 {
		return ""
	}
	var lag int64
	for p, hw := range s.HighWaterMarks {
		if off, ok := s.Stats.Committed[p]; ok {
			lag += Lag(hw, off)
		}
	}
	if lag == 0 && s.Stats.Buffered == 0 {
		return ""
	}
	return fmt.Sprintf("no clients connected while messages wait (lag %d, %d fetched)", lag, s.Stats.Buffered)
}

// partitionList writes partitions as "0, 3".
func partitionList(ps []int32) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = strconv.Itoa(int(p))
	}
	return strings.Join(out, ", ")
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
	// Actions, when set, serves the operators' actions: POST requests
	// under /api/, behind Token, and refused (403) when there is no Token:
	// nobody may act on a daemon without a secret.
	Actions http.Handler
}

// Handler serves
//
//	/metrics  the Collector, Go runtime and process metrics (Prometheus text format);
//	          with cfg.Token, 401 unless the request carries it as a bearer token
//	/healthz  200 "ok" while the process runs
//	/readyz   200 with the role, or 503 with the reason (see Ready)
//	/api/     cfg.Console, behind cfg.Token like /metrics
//	POST /api/...  cfg.Actions, behind cfg.Token; refused without one
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
	if cfg.Actions != nil {
		mux.Handle("POST /api/", requireToken(cfg.Token, cfg.Actions))
	}
	return mux
}

// ErrNoToken is what an action is answered when the daemon has no metrics
// token: it takes no action from anybody.
const ErrNoToken = "actions need the metrics token, and this daemon has none: start it with --metrics-token-file (or FANOUT_METRICS_TOKEN) to act on it"

// requireToken is requireBearer that refuses every request (403) when
// there is no token.
func requireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, ErrNoToken, http.StatusForbidden)
		})
	}
	return requireBearer(token, h)
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
