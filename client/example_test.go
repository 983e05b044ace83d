package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nanoservice/core-fanout/client"
)

func Example() {
	addr, _ := client.StartExampleDaemon("hello", "world")

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

// With Config.Batches the messages of each frame come together, and one
// call acks them all.
func Example_batches() {
	addr, acked := client.StartExampleBatchDaemon("hello", "world")

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
	acked()
	if err := c.Close(); err != nil {
		log.Print(err)
	}
	// Output:
	// hello (attempt 1)
	// world (attempt 1)
}
