package fanout

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/metrics"
)

// topicCheckInterval is how often the daemon checks that its topic exists,
// which also tells that Kafka answers (at most Options.ConnectBackoffMax
// apart). One metadata request of one topic: nothing for Kafka.
const topicCheckInterval = 5 * time.Second

// healthLogEvery is how often a problem that lasts (a missing topic, Kafka
// not answering) is logged again.
const healthLogEvery = time.Minute

// The outcomes of a topic check.
const (
	checkFound       = "found"       // the topic exists
	checkMissing     = "missing"     // Kafka answered: no such topic
	checkUnreachable = "unreachable" // no answer from Kafka
)

// kafkaHealth is what the daemon knows of Kafka and of its topic beyond
// the election and the serving term: whether the topic exists, and when
// Kafka last answered. The topic watch and the daemon's connections to
// Kafka write it; /readyz, the console and the heartbeats read it.
type kafkaHealth struct {
	found     chan struct{} // closed once the topic was first found
	foundOnce sync.Once

	mu       sync.Mutex // guards the fields below
	answered time.Time  // when Kafka last answered; zero before it first did
	lastErr  string     // the last failure to reach Kafka since it last answered; "" when none
	missing  bool       // Kafka's last answer: the topic does not exist
	// newest is, while the daemon's source fetches nothing, the partitions'
	// high watermarks as the last check read them (newestUnwatched); nil
	// else.
	newest map[int32]int64
}

func newKafkaHealth() *kafkaHealth { return &kafkaHealth{found: make(chan struct{})} }

// Found is closed once a check first found the topic.
func (h *kafkaHealth) Found() <-chan struct{} { return h.found }

// fill sets what s says of Kafka and the topic: whether it was missing at
// Kafka's last answer, when that was, and the failure to reach Kafka since.
func (h *kafkaHealth) fill(s *metrics.Snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.TopicMissing, s.KafkaAnswered, s.KafkaError = h.missing, h.answered, h.lastErr
}

// fillNewest raises the high watermarks of s to those the last check read,
// where newer, for the partitions the source consumes.
func (h *kafkaHealth) fillNewest(s *metrics.Snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, hw := range h.newest {
		if cur, ok := s.HighWaterMarks[p]; ok && hw > cur {
			s.HighWaterMarks[p] = hw
		}
	}
}

// setNewest records the high watermarks newestUnwatched read.
func (h *kafkaHealth) setNewest(newest map[int32]int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.newest = newest
}

// newestUnwatched reads, while the daemon serves and its source fetches
// nothing for want of a client or because the deliveries are paused (its
// high watermarks then stand still), the high watermarks of parts: the lag
// and the warning of messages waiting without a client go on from them
// (metrics.Warnings). One request per partition, on the topic check, only
// then; nil otherwise.
func (d *Daemon) newestUnwatched(client sarama.Client, parts []int32) map[int32]int64 {
	if d.backend.dispatcher() == nil || d.srv.Clients() > 0 && !d.pause.On() {
		return nil
	}
	out := make(map[int32]int64, len(parts))
	for _, p := range parts {
		if hw, err := client.GetOffset(d.opts.Topic, p, sarama.OffsetNewest); err == nil {
			out[p] = hw
		}
	}
	return out
}

// connected records that a connection to Kafka was made (it answered), or
// failed with err.
func (h *kafkaHealth) connected(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.lastErr = err.Error()
		return
	}
	h.answered, h.lastErr = time.Now(), ""
}

// record records the outcome of a topic check (err nil: found; wrapping
// kafka.ErrTopicNotFound: Kafka answered that the topic does not exist;
// another: Kafka did not answer) and returns its name.
func (h *kafkaHealth) record(err error) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.answered, h.lastErr, h.missing = time.Now(), "", false
		h.foundOnce.Do(func() { close(h.found) })
		return checkFound
	case errors.Is(err, kafka.ErrTopicNotFound):
		h.answered, h.lastErr, h.missing = time.Now(), "", true
		return checkMissing
	}
	h.lastErr = err.Error()
	return checkUnreachable
}

// watch checks the topic with check at once, then every interval until ctx
// ends, records each outcome, and logs what changed (a problem that lasts,
// again every healthLogEvery). A check under way when ctx ends is waited
// for.
func (h *kafkaHealth) watch(ctx context.Context, log *logrus.Entry, interval time.Duration, check func() error) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last string             // the last outcome
	var since, logged time.Time // when it began, and was last logged
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		err := check()
		outcome, now := h.record(err), time.Now()
		switch {
		case outcome != last:
			lasted := now.Sub(since) // the problem that ends, when outcome is found
			if outcome != checkFound {
				lasted = 0 // a problem that begins
			}
			since, logged = now, now
			logHealth(log, outcome, last, lasted, interval, err)
		case outcome != checkFound && now.Sub(logged) >= healthLogEvery:
			logged = now
			logHealth(log, outcome, last, now.Sub(since), interval, err)
		}
		last = outcome
		timer.Reset(interval)
	}
}

// logHealth logs a topic check's outcome, which follows prev: a problem
// that has lasted for lasted (0: it begins), or the end of one that lasted
// that long.
func logHealth(log *logrus.Entry, outcome, prev string, lasted, interval time.Duration, err error) {
	log = log.WithField("checking_every", interval)
	if lasted > 0 {
		log = log.WithField("for", lasted.Round(time.Second))
	}
	switch {
	case outcome == checkFound && prev == checkMissing:
		log.Info("topic found")
	case outcome == checkFound && prev == checkUnreachable:
		log.Info("Kafka answers again")
	case outcome == checkFound: // the first check: nothing to say
	case outcome == checkMissing:
		log.Warn("topic not found in Kafka: not ready until it is created (the daemon waits for it before it joins " +
			"the cluster, and creates no heartbeat topic meanwhile)")
	default:
		log.WithError(err).Warn("checking the topic: no answer from Kafka")
	}
}

// readyState is one answer of the readiness check.
type readyState struct {
	ready  bool
	reason string
}

// readiness is what /readyz answers now.
func (d *Daemon) readiness(ctx context.Context) (bool, string) {
	return metrics.Ready(d.metricsSnapshot(ctx), time.Now(), d.maxCommitFailing())
}

// refreshReadiness computes what /readyz answers, for the heartbeats, within
// one cluster heartbeat: the election loop reads it and must not wait for
// the dispatcher.
func (d *Daemon) refreshReadiness(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.ClusterHeartbeat)
	defer cancel()
	ready, reason := d.readiness(ctx)
	d.lastReady.Store(&readyState{ready: ready, reason: reason})
}

// heartbeatReadiness is cluster.Config.Readiness: the last refresh's answer
// (runCluster refreshes it before the election runs).
func (d *Daemon) heartbeatReadiness() (bool, string) {
	if r := d.lastReady.Load(); r != nil {
		return r.ready, r.reason
	}
	return false, "starting"
}
