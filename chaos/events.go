package chaos

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Kinds of client events, the second field of a client log line.
const (
	EventDeliver = 'D' // a message arrived
	EventAck     = 'A' // about to be acked
	EventNack    = 'N' // about to be nacked
)

// Event is one line of a client's log:
//
//	<unix ns> <kind> <client> <index> <partition> <offset> <attempt> <member> <delivery id> <value>
//
// Index numbers the deliveries of one client incarnation; an ack or nack
// carries the index of its delivery. The delivery id is the daemon's (the
// member's delivery log names the attempt by it); logs of runs before it
// was logged lack the field (DeliveryID 0).
type Event struct {
	At        time.Time
	Kind      byte
	Client    string // <role>.<incarnation>, e.g. c0.2
	Index     uint64
	Partition int32
	Offset    int64
	Attempt   int
	Member    string
	// DeliveryID names the attempt to the member that made it.
	DeliveryID uint64
	Value      string
}

// Role is the client's role without its incarnation (c0 of c0.2): the
// target name of client faults.
func (e Event) Role() string {
	role, _, _ := strings.Cut(e.Client, ".")
	return role
}

// ParseEvents reads a client log. A last line cut short by a kill is
// skipped; any other malformed line is an error.
func ParseEvents(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var pending error
	for n := 1; sc.Scan(); n++ {
		if pending != nil {
			return nil, pending
		}
		e, err := parseEvent(sc.Text())
		if err != nil {
			pending = fmt.Errorf("line %d: %w", n, err)
			continue
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

func parseEvent(line string) (Event, error) {
	f := strings.Fields(line)
	if (len(f) != 9 && len(f) != 10) || len(f[1]) != 1 {
		return Event{}, fmt.Errorf("malformed event %q", line)
	}
	var e Event
	if len(f) == 10 {
		id, err := strconv.ParseUint(f[8], 10, 64)
		if err != nil {
			return Event{}, fmt.Errorf("malformed event %q: %w", line, err)
		}
		e.DeliveryID = id
		f = append(f[:8], f[9])
	}
	ns, err1 := strconv.ParseInt(f[0], 10, 64)
	idx, err2 := strconv.ParseUint(f[3], 10, 64)
	p, err3 := strconv.ParseInt(f[4], 10, 32)
	off, err4 := strconv.ParseInt(f[5], 10, 64)
	att, err5 := strconv.Atoi(f[6])
	for _, err := range []error{err1, err2, err3, err4, err5} {
		if err != nil {
			return Event{}, fmt.Errorf("malformed event %q: %w", line, err)
		}
	}
	e.At, e.Kind, e.Client, e.Index = time.Unix(0, ns), f[1][0], f[2], idx
	e.Partition, e.Offset, e.Attempt, e.Member, e.Value = int32(p), off, att, f[7], f[8]
	return e, nil
}
