// Package deliverylog writes and reads the delivery log (--delivery-log): a
// text file with one line per delivery attempt, per outcome of one, and per
// change of what the daemon serves, for operators debugging where a record
// went and for the chaos run's verification.
//
// A line is
//
//	<unix ns> <event> <partition> <offset> <delivery id> <attempt> <session> <detail> <client>
//
// with "-" for a field the event has not; the client's name is the rest of
// the line. The dispatcher writes through Add, which never blocks: events go
// to a bounded queue, and one goroutine writes them to the file in whole
// lines, flushing whenever it has caught up. When the disk is too slow for
// the queue, events are dropped, counted, and a "gap" line with their number
// is written once the writer catches up: the log says where it is
// incomplete, and delivery never waits for it.
package deliverylog

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/internal/actor"
)

// Kind is what an event of the log records.
type Kind uint8

// Kinds of events.
const (
	// Open: a process opened the log (Detail: node=<node id>,pid=<pid>).
	// The events that follow, up to the next Open, are its own.
	Open Kind = iota + 1
	// Start: a dispatcher started serving (Detail: leader, or spread: its
	// partitions come with Assign).
	Start
	// Stop: the dispatcher stopped (Detail: why: drained, or its error).
	Stop
	// Join: a client joined (Session, Client).
	Join
	// Leave: a client left (Session, Client; Detail: the reason).
	Leave
	// Deliver: an attempt was sent (Partition, Offset, ID, Attempt,
	// Session, Client). The events below with an ID are its outcome.
	Deliver
	// Ack: the attempt was acked.
	Ack
	// Nack: it was nacked (Detail: counted, or uncounted-unprocessed).
	Nack
	// Timeout: no ack came within the ack timeout (Detail: counted).
	Timeout
	// Gone: its client left holding it (Detail: counted; uncounted-goodbye,
	// the client said goodbye; uncounted-shutdown, the daemon closed the
	// connection; or uncounted-window: within the liveness window of the
	// message's last counted disconnect).
	Gone
	// Returned: it came back while its partition was being handed over
	// (Detail: nack, timeout or gone): left to the next owner, not counted.
	Returned
	// Dropped: it ended with no outcome (Detail: revoked, at the handoff
	// timeout; lost, its partition taken by another member; stopped, the
	// dispatcher stopped).
	Dropped
	// Forgotten: it came back after its partition restarted at or below
	// it: the record is fetched again (or gone), not counted.
	Forgotten
	// DeadLetter: the message was handed to the dead-letter producer
	// (Partition, Offset; Attempt: the failures counted; Detail: the last
	// failure, as the fanout.dlq.last_failure header names it).
	DeadLetter
	// DeadLettered: the dead-letter topic stored it.
	DeadLettered
	// Skipped: not delivered, the stored progress shows it acked.
	Skipped
	// Assign: a partition was assigned (spread mode; Offset: the stored
	// offset, -1 when none).
	Assign
	// Revoke: a partition's handoff began.
	Revoke
	// Revoked: the handoff ended (Offset: the committable offset).
	Revoked
	// Lost: a partition was dropped at once, another member owning it.
	Lost
	// Restart: the source (re)started a partition at Offset.
	Restart
	// Gap: Detail events were dropped before this line: the disk was too
	// slow for the queue.
	Gap
	numKinds
)

var kindNames = [numKinds]string{"", "open", "start", "stop", "join", "leave", "deliver", "ack", "nack", "timeout", "gone",
	"returned", "dropped", "forgotten", "dead-letter", "dead-lettered", "skipped", "assign", "revoke", "revoked", "lost",
	"restart", "gap"}

func (k Kind) String() string {
	if k == 0 || k >= numKinds {
		return "kind(" + strconv.Itoa(int(k)) + ")"
	}
	return kindNames[k]
}

// Details of outcomes.
const (
	Counted              = "counted"
	UncountedUnprocessed = "uncounted-unprocessed"
	UncountedWindow      = "uncounted-window"
	// Uncounted, with a client's leave reason after it (goodbye, shutdown),
	// says why a Gone did not count.
	Uncounted = "uncounted-"
)

// Event is one line of the log. Partition and Offset are -1, ID, Attempt
// and Session 0, Detail and Client "" where the event has none.
type Event struct {
	At        time.Time
	Kind      Kind
	Partition int32
	Offset    int64
	ID        uint64
	Attempt   uint32
	Session   uint64
	Detail    string
	Client    string
}

// Counted reports whether a failed attempt counted toward --max-attempts.
func (e Event) Counted() bool { return e.Detail == Counted }

// queueLen is how many events wait for the writer before Add drops them:
// about a second of a busy dispatcher (two events per message).
const queueLen = 1 << 16

// Log is an open delivery log. A nil *Log records nothing: Add on it is a
// no-op, so callers check nothing but that.
type Log struct {
	queue   chan Event
	dropped atomic.Uint64
	f       io.WriteCloser
	w       *bufio.Writer
	line    []byte
	log     *logrus.Entry
	failed  bool // a write failed: logged once
	g       actor.Group
	stop    chan struct{}
	once    sync.Once
}

// OpenFile appends to the log at path (created when missing, 0644), writes
// an Open event naming node and this process, and starts the writer
// goroutine. Close it when nothing adds to it any more.
func OpenFile(path, node string, log *logrus.Entry) (*Log, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("delivery log: %w", err)
	}
	l := newLog(f, queueLen, log.WithField("delivery_log", path))
	l.Add(Event{At: time.Now(), Kind: Open, Partition: -1, Offset: -1,
		Detail: "node=" + node + ",pid=" + strconv.Itoa(os.Getpid())})
	l.start()
	return l, nil
}

// newLog returns a Log writing to f through a queue of n events, its
// writer not yet started.
func newLog(f io.WriteCloser, n int, log *logrus.Entry) *Log {
	return &Log{queue: make(chan Event, n), f: f, w: bufio.NewWriterSize(f, 64<<10), log: log, stop: make(chan struct{})}
}

// start starts the writer goroutine.
func (l *Log) start() { l.g.Go(l.log, "delivery log", l.run, nil) }

// Add queues e for the writer without blocking: when the queue is full
// (the disk is slow) e is dropped and counted, and the log gets a Gap line.
func (l *Log) Add(e Event) {
	if l == nil {
		return
	}
	select {
	case l.queue <- e:
	default:
		l.dropped.Add(1)
	}
}

// Close writes what is queued, closes the file and returns once the writer
// has stopped. Events added after Close are dropped.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.once.Do(func() { close(l.stop) })
	l.g.Wait()
	return l.f.Close()
}

// run writes events until Close, flushing whenever the queue is empty.
func (l *Log) run() {
	for {
		select {
		case e := <-l.queue:
			l.write(e)
			continue
		default:
		}
		l.noteGap()
		l.flush()
		select {
		case e := <-l.queue:
			l.write(e)
		case <-l.stop:
			for {
				select {
				case e := <-l.queue:
					l.write(e)
				default:
					l.noteGap()
					l.flush()
					return
				}
			}
		}
	}
}

// noteGap writes a Gap line when events were dropped since the last one.
func (l *Log) noteGap() {
	n := l.dropped.Swap(0)
	if n == 0 {
		return
	}
	l.log.WithField("dropped", n).Warn("delivery log: the disk is too slow, events dropped (a gap line marks where)")
	l.write(Event{At: time.Now(), Kind: Gap, Partition: -1, Offset: -1, Detail: strconv.FormatUint(n, 10)})
}

// write formats e as one line and buffers it; a line never straddles two
// writes to the file, so a process killed leaves whole lines.
func (l *Log) write(e Event) {
	l.line = Append(l.line[:0], e)
	if l.w.Available() < len(l.line) {
		l.flush()
	}
	if _, err := l.w.Write(l.line); err != nil {
		l.fail(err)
	}
}

func (l *Log) flush() {
	if err := l.w.Flush(); err != nil {
		l.fail(err)
	}
}

// fail logs the first write error and discards what was buffered; the
// writer goes on (a later write may succeed, once a full disk has room), so
// that Add never blocks.
func (l *Log) fail(err error) {
	if !l.failed {
		l.failed = true
		l.log.WithError(err).Error("delivery log: writing failed; the log is incomplete from here")
	}
	l.w.Reset(l.f)
}

// Append appends e's line, newline included, to b.
func Append(b []byte, e Event) []byte {
	b = strconv.AppendInt(b, e.At.UnixNano(), 10)
	b = append(b, ' ')
	b = append(b, e.Kind.String()...)
	b = appendInt(b, int64(e.Partition), e.Partition >= 0)
	b = appendInt(b, e.Offset, e.Offset >= 0)
	b = appendUint(b, e.ID)
	b = appendUint(b, uint64(e.Attempt))
	b = appendUint(b, e.Session)
	b = appendWord(b, e.Detail, false)
	b = appendWord(b, e.Client, true)
	return append(b, '\n')
}

func appendInt(b []byte, v int64, ok bool) []byte {
	if !ok {
		return append(b, " -"...)
	}
	return strconv.AppendInt(append(b, ' '), v, 10)
}

func appendUint(b []byte, v uint64) []byte {
	if v == 0 {
		return append(b, " -"...)
	}
	return strconv.AppendUint(append(b, ' '), v, 10)
}

// appendWord appends s, "-" when empty; line breaks become '?', and spaces
// too unless last (the last field is the rest of the line).
func appendWord(b []byte, s string, last bool) []byte {
	b = append(b, ' ')
	if s == "" {
		return append(b, '-')
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\n' || c == '\r' || (!last && (c == ' ' || c == '\t')) {
			c = '?'
		}
		b = append(b, c)
	}
	return b
}

// ReadFile reads the delivery log at path (Parse).
func ReadFile(path string) (events []Event, bad int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("delivery log: %w", err)
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads a delivery log. Lines it cannot read (a file cut short by a
// full disk) are skipped and counted in bad.
func Parse(r io.Reader) (events []Event, bad int, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		e, ok := parseLine(sc.Text())
		if !ok {
			bad++
			continue
		}
		events = append(events, e)
	}
	return events, bad, sc.Err()
}

func parseLine(line string) (Event, bool) {
	f := strings.SplitN(line, " ", 9)
	if len(f) != 9 {
		return Event{}, false
	}
	var e Event
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return Event{}, false
	}
	e.At = time.Unix(0, ns)
	for k := Kind(1); k < numKinds; k++ {
		if kindNames[k] == f[1] {
			e.Kind = k
			break
		}
	}
	if e.Kind == 0 {
		return Event{}, false
	}
	num := func(s string, bits int) (int64, bool) {
		if s == "-" {
			return -1, true
		}
		v, err := strconv.ParseInt(s, 10, bits)
		return v, err == nil
	}
	unum := func(s string, bits int) (uint64, bool) {
		if s == "-" {
			return 0, true
		}
		v, err := strconv.ParseUint(s, 10, bits)
		return v, err == nil
	}
	p, ok1 := num(f[2], 32)
	o, ok2 := num(f[3], 64)
	id, ok3 := unum(f[4], 64)
	a, ok4 := unum(f[5], 32)
	sess, ok5 := unum(f[6], 64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return Event{}, false
	}
	e.Partition, e.Offset, e.ID, e.Attempt, e.Session = int32(p), o, id, uint32(a), sess
	if f[7] != "-" {
		e.Detail = f[7]
	}
	if f[8] != "-" {
		e.Client = f[8]
	}
	return e, true
}
