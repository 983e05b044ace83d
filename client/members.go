package client

import (
	"fmt"
	"slices"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// eventKind says what a link tells the client's run loop.
type eventKind int

const (
	evWelcomed eventKind = iota // a session of the link was welcomed
	evMembers                   // a session of the link received a Members frame
	evGaveUp                    // the link gave up: the client stops with err
	evExited                    // the link's goroutine returned
	evShutdown                  // Shutdown: stop every link, start none
)

// event is one report of a link to the client's run loop.
type event struct {
	kind    eventKind
	link    *link
	sess    *session
	members []string                 // evMembers: the list
	version *protocol.MembersVersion // evMembers: its version
	err     error                    // evGaveUp: why
}

// event hands ev to the run loop, which receives until every link has
// exited.
func (c *Client) event(ev event) { c.events <- ev }

// share is the credit of each session when the client's MaxInFlight is
// split over n members: MaxInFlight / n rounded down, at least 1. With
// more members than MaxInFlight the sessions together may hold more than
// MaxInFlight (one each).
func share(maxInFlight, n int) int {
	if n <= 1 {
		return maxInFlight
	}
	return max(1, maxInFlight/n)
}

// run is the client's run loop, the owner of its links. It starts with one
// link to the cluster (Config.Addrs, following redirects); once a Welcome or
// a Members frame lists members, it keeps one link per member, each with
// its share of the credit, and follows the list's changes. It reports the
// outcome of the first connection on ready (capacity 1), stops the client
// when a link gives up, and closes msgs once every link has exited.
func (c *Client) run(ready chan<- error) {
	defer close(c.done)
	connected := false    // ready has been told
	live := 0             // links whose goroutine has not exited
	shuttingDown := false // Shutdown was called: no link starts
	startLink := func(member string, credit int) {
		if shuttingDown {
			return
		}
		l := newLink(c, member, credit)
		c.mu.Lock()
		c.links = append(c.links, l)
		c.mu.Unlock()
		live++
		l.start()
	}
	startLink("", c.cfg.MaxInFlight)
	for live > 0 {
		ev := <-c.events
		switch ev.kind {
		case evWelcomed:
			if !connected {
				connected = true
				ready <- nil
			}
			c.followMembers(ev.link, protocol.Addresses(ev.sess.welcome.GetMembers()), ev.sess.welcome.GetMembersVersion(), true, startLink)
		case evMembers:
			c.followMembers(ev.link, ev.members, ev.version, false, startLink)
		case evGaveUp:
			c.mu.Lock()
			if c.err == nil {
				c.err = ev.err
			}
			c.mu.Unlock()
			if !connected {
				connected = true
				ready <- ev.err
			}
			c.cancel() // the other links say goodbye and exit
		case evShutdown:
			shuttingDown = true
			c.mu.Lock()
			links := slices.Clone(c.links)
			c.mu.Unlock()
			for _, l := range links {
				l.stop()
			}
		case evExited:
			live--
			c.mu.Lock()
			c.links = slices.DeleteFunc(c.links, func(l *link) bool { return l == ev.link })
			c.mu.Unlock()
		}
	}
	c.linkWG.Wait()
	close(c.msgs) // after the last reader has ended
	if c.batches != nil {
		close(c.batches)
	}
}

// followMembers applies a member list of version v that from's session
// received (in its Welcome when welcome): an empty list means leader mode
// (from becomes the one link, with all the credit); otherwise one link per
// member, each with its share, links of members no longer listed are
// stopped (after the messages they delivered are acked), and the cluster
// link becomes the link of the member it is connected to, or stops. It
// never stops every link, so the run loop ends only after Close or a link
// gave up.
//
// Members may disagree for a moment while an assignment spreads: a list
// older than the one followed (a lower version, or none from a Members
// frame while the client holds one) is ignored, so that the client does not
// open and retire sessions at the pace of whichever member spoke last. A
// Welcome without a version is leader mode, or an older daemon: followed.
func (c *Client) followMembers(from *link, list []string, v *protocol.MembersVersion, welcome bool,
	startLink func(member string, credit int)) {
	if _, _, stopping := from.state(); stopping {
		return // its member left: its view is not the one to follow
	}
	if v.Compare(c.version) < 0 && (v != nil || !welcome) {
		c.log.Debug("ignoring an older member list", "from", from.addr(), "members", list,
			"version", fmt.Sprintf("%d/%d", v.GetEpoch(), v.GetGeneration()),
			"following", fmt.Sprintf("%d/%d", c.version.GetEpoch(), c.version.GetGeneration()))
		return
	}
	c.version = v
	list = slices.Compact(slices.Sorted(slices.Values(slices.DeleteFunc(slices.Clone(list),
		func(a string) bool { return a == "" }))))
	c.mu.Lock()
	prev := c.members
	links := slices.Clone(c.links)
	c.mu.Unlock()
	if slices.Equal(list, prev) {
		return
	}
	// Members reports the list once the links follow it.
	defer c.setMembers(list)
	if len(list) == 0 {
		c.log.Info("no members listed: one session, to the leader", "from", from.addr())
		from.setMember("")
		from.setCredit(c.cfg.MaxInFlight)
		for _, l := range links {
			if l != from {
				l.stop()
			}
		}
		return
	}
	credit := share(c.cfg.MaxInFlight, len(list))
	c.log.Info("members changed: one session per member", "from", from.addr(), "members", list, "max_in_flight", credit)
	// Which links stay: one per listed member. The cluster link becomes
	// the link of the member it is connected to, when that member is
	// listed under the address it used.
	byMember := make(map[string]*link)
	var leaving, clusters []*link
	for _, l := range links {
		member, _, stopping := l.state()
		switch {
		case stopping:
		case member == "":
			clusters = append(clusters, l)
		case slices.Contains(list, member) && byMember[member] == nil:
			byMember[member] = l
		default:
			leaving = append(leaving, l)
		}
	}
	for _, l := range clusters {
		if _, s, _ := l.state(); s != nil && slices.Contains(list, s.addr) && byMember[s.addr] == nil {
			l.setMember(s.addr)
			byMember[s.addr] = l
			continue
		}
		leaving = append(leaving, l)
	}
	// Leavers first: a member no longer listed passes nothing more on from
	// here, before any other session is opened again.
	for _, l := range leaving {
		l.stop()
	}
	for _, addr := range list {
		if l := byMember[addr]; l != nil {
			l.setCredit(credit)
		}
	}
	for _, addr := range list {
		if byMember[addr] == nil {
			startLink(addr, credit)
		}
	}
}

// setMembers records the member list for Members.
func (c *Client) setMembers(list []string) {
	c.mu.Lock()
	c.members = list
	c.mu.Unlock()
}

// Members returns the addresses of the members the client keeps a session
// with, sorted: the latest list a daemon sent. It is empty in leader mode,
// where the client keeps one session, to the leader.
func (c *Client) Members() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.members)
}

// dropStale empties msgs (or batches) of messages of ended sessions, which could no
// longer be acked, to make room for the next session's deliveries. It does
// so only when l is the client's one link (leader mode): messages of other
// sessions may wait in msgs otherwise, and stay (a stale one returns
// ErrStale from Ack). c.mu is held, so no link starts meanwhile.
func (c *Client) dropStale(l *link) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.links) != 1 || c.links[0] != l {
		return
	}
	for {
		select {
		case m := <-c.msgs:
			m.done.Store(true)
		case b := <-c.batches: // a nil channel without Config.Batches
			for _, m := range b.Messages {
				m.done.Store(true)
			}
		default:
			return
		}
	}
}
