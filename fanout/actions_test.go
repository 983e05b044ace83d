package fanout

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// warned reports whether the daemon's document warns of kind.
func warned(d *Daemon, kind string) bool {
	for _, w := range d.Status(context.Background()).Node.Warnings {
		if w.Kind == kind {
			return true
		}
	}
	return false
}

// A daemon leading alone: messages produced while no client is connected
// show in its lag and warning (its source fetches nothing meanwhile); a
// pause holds what is produced while it lasts, in the document and in the
// dispatcher, and is noted among the daemon's actions; a drained client's
// deliveries go to the other client; a client of no such name is none.
func TestDaemonActions(t *testing.T) {
	t.Parallel()
	d, brokers, _ := soloDaemon(t, offsets.NewMemoryStore(), func(o *Options) {
		o.NodeID = "solo-node"
		o.ConnectBackoffMax = 200 * time.Millisecond // the topic check's interval
		o.DrainTimeout = time.Second
	})
	for range 3 {
		produceTo(t, brokers, "waiting")
	}
	testutil.WaitFor(t, 30*time.Second, "the lag and the no-clients warning", func() bool {
		st := d.Status(context.Background())
		return st.TotalLag == 3 && warned(d, "no-clients")
	})

	ctx := context.Background()
	p, err := d.setPaused(ctx, true, "ops from 10.0.0.1:5")
	if err != nil || p == nil || !p.Paused || p.Version != 1 || p.Node != "solo-node" || p.By != "ops from 10.0.0.1:5" {
		t.Fatalf("setPaused = %+v, %v", p, err)
	}
	c, err := client.Dial(ctx, client.Config{Addrs: []string{d.Addr().String()}, ClientID: "holder", MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 30*time.Second, "the client joined, the deliveries paused", func() bool {
		s, ok := d.Stats(ctx)
		return ok && s.Clients == 1 && s.DeliveryPaused && warned(d, "delivery-paused") && !warned(d, "no-clients")
	})
	produceTo(t, brokers, "during")
	testutil.WaitFor(t, 30*time.Second, "the message produced while paused in the lag", func() bool {
		return d.Status(ctx).TotalLag == 4
	})
	if s, _ := d.Stats(ctx); s.Delivered != 0 {
		t.Fatalf("%d delivered while paused", s.Delivered)
	}
	st := d.Status(ctx)
	if st.Pause == nil || !st.Pause.Paused || !st.Node.DeliveryPaused || len(st.Node.Actions) != 1 || st.Node.Actions[0].Kind != "pause" {
		t.Fatalf("the document while paused: pause %+v, node %+v", st.Pause, st.Node)
	}

	if _, err := d.setPaused(ctx, false, "ops"); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		select {
		case <-c.Messages(): // held, never acked
		case <-time.After(30 * time.Second):
			t.Fatal("the held client got less than the 4 messages after the resume")
		}
	}
	other, err := client.Dial(ctx, client.Config{Addrs: []string{d.Addr().String()}, ClientID: "other", MaxInFlight: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	testutil.WaitFor(t, 30*time.Second, "the other client joined", func() bool { return len(d.Status(ctx).Clients) == 2 })

	if got, err := d.drainClient(ctx, 0, "nobody", "ops"); err != nil || len(got) != 0 {
		t.Fatalf("drainClient of nobody = %+v, %v", got, err)
	}
	drained, err := d.drainClient(ctx, 0, "holder", "ops from 10.0.0.1:5")
	if err != nil || len(drained) != 1 || drained[0].Name != "holder" || drained[0].InFlight != 4 || !drained[0].Draining {
		t.Fatalf("drainClient = %+v, %v", drained, err)
	}
	for range 4 {
		select {
		case m := <-other.Messages():
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the drained client's messages did not reach the other client")
		}
	}
	testutil.WaitFor(t, 30*time.Second, "the drained client gone, every message committed", func() bool {
		st := d.Status(ctx)
		return len(st.Clients) == 1 && st.Clients[0].Name == "other" && st.TotalLag == 0
	})
	acts := d.Status(ctx).Node.Actions
	kinds := make([]string, len(acts))
	for i, a := range acts {
		kinds[i] = a.Kind + " " + a.Target + ": " + a.Result
	}
	if want := []string{"pause : version 1", "resume : version 2", "drain-client nobody: no such client", "drain-client holder: 1 sessions"}; !slices.Equal(kinds, want) {
		t.Errorf("actions %q, want %q", kinds, want)
	}
}

// Actions before the daemon takes part in its cluster are refused as
// unavailable, and so is a drain on a daemon that serves no clients.
func TestDaemonActionsUnavailable(t *testing.T) {
	t.Parallel()
	d, err := New(Options{ID: "svc", Topic: "jobs", Kafka: []string{"127.0.0.1:1"}, ZooKeeper: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.setPaused(context.Background(), true, "ops"); !errors.Is(err, console.ErrUnavailable) || !strings.Contains(err.Error(), "does not take part in its cluster yet") {
		t.Errorf("setPaused before the election = %v", err)
	}
	if _, err := d.drainClient(context.Background(), 0, "w", "ops"); !errors.Is(err, console.ErrUnavailable) || !strings.Contains(err.Error(), "serves no clients") {
		t.Errorf("drainClient while not serving = %v", err)
	}
	var log actionLog
	for i := range maxActions + 5 {
		log.add(status.Action{Kind: "pause", Result: strings.Repeat("x", i)})
	}
	if all := log.all(); len(all) != maxActions || len(all[0].Result) != 5 {
		t.Errorf("the action log keeps %d, the oldest %q; want the last %d", len(all), all[0].Result, maxActions)
	}
}
