package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/nanoservice/core-fanout/client"
)

func Example() {
	addr := startExampleDaemon("hello", "world")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{addr}, ClientID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		m := <-c.Messages()
		fmt.Printf("%s (attempt %d)\n", m.Value, m.Attempt)
		if err := m.Ack(); err != nil {
			log.Print(err)
		}
	}
	if err := c.Close(); err != nil { // sends the acks not sent yet
		log.Print(err)
	}
	// Output:
	// hello (attempt 1)
	// world (attempt 1)
}

// Consume runs the handler in a pool of workers: nil acks the message, an
// error nacks it and the daemon delivers it again. Shutdown lets the
// running handlers finish, sends their acks and says goodbye.
func ExampleClient_Consume() {
	addr := startExampleDaemon("a", "b", "c")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{addr}, ClientID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	handled := make(chan struct{}, 4)
	go func() {
		for range 4 { // a, b, c, and b again
			<-handled
		}
		if err := c.Shutdown(ctx); err != nil { // on SIGTERM, say
			log.Print(err)
		}
	}()
	err = c.Consume(context.Background(), 2, func(ctx context.Context, m *client.Message) error {
		defer func() { handled <- struct{}{} }()
		if string(m.Value) == "b" && m.Attempt == 1 {
			fmt.Printf("%s (attempt %d): failed\n", m.Value, m.Attempt)
			return errors.New("a transient failure")
		}
		fmt.Printf("%s (attempt %d)\n", m.Value, m.Attempt)
		return nil
	})
	if err != nil {
		log.Print(err)
	}
	// Unordered output:
	// a (attempt 1)
	// b (attempt 1): failed
	// b (attempt 2)
	// c (attempt 1)
}

// With Config.Batches the messages of each frame come together, and one
// call acks them all.
func Example_batches() {
	addr := startExampleDaemon("hello", "world")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{addr}, ClientID: "example", Batches: true})
	if err != nil {
		log.Fatal(err)
	}
	b := <-c.Batches()
	for _, m := range b.Messages {
		fmt.Printf("%s (attempt %d)\n", m.Value, m.Attempt)
	}
	if err := b.Ack(); err != nil { // the whole batch: one range on the wire
		log.Print(err)
	}
	if err := c.Close(); err != nil { // sends the ack not sent yet
		log.Print(err)
	}
	// Output:
	// hello (attempt 1)
	// world (attempt 1)
}
