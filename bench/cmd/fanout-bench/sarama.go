package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/kafka"
)

// runSarama is the plain sarama consumer: one PartitionConsumer per
// partition from the oldest offset, configured by kafka.NewConfig like the
// daemon's. It stops after --count messages (or when standard input closes)
// and prints its Result; times are those of receipt from Messages().
func runSarama(args []string) error {
	fs := flag.NewFlagSet("sarama", flag.ExitOnError)
	brokers := fs.String("kafka", "127.0.0.1:9092", "bootstrap brokers, comma-separated")
	topic := fs.String("topic", "", "topic")
	count := fs.Int64("count", 0, "stop after this many messages")
	latency := fs.Bool("latency", false, "record produce-to-receipt latency of synthetic values")
	_ = fs.Parse(args)

	cfg := kafka.NewConfig("fanout-bench-sarama")
	consumer, err := sarama.NewConsumer(strings.Split(*brokers, ","), cfg)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer consumer.Close()
	parts, err := consumer.Partitions(*topic)
	if err != nil {
		return fmt.Errorf("partitions of %s: %w", *topic, err)
	}
	cnt := &counter{measureLatency: *latency}
	cnt.ready() // connected, the partitions known: what follows is consuming
	enough := make(chan struct{})
	var once sync.Once
	stop := make(chan struct{})
	go reportProgress(&cnt.n, 250*time.Millisecond, stop)
	var wg sync.WaitGroup
	for _, p := range parts {
		pc, err := consumer.ConsumePartition(*topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
		defer pc.AsyncClose()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case m := <-pc.Messages():
					cnt.add(m.Value, time.Now())
					if cnt.n.Load() >= *count {
						once.Do(func() { close(enough) })
					}
				case err := <-pc.Errors():
					fmt.Fprintf(os.Stderr, "partition %d: %v\n", p, err)
				case <-enough:
					return
				}
			}
		}()
	}
	select {
	case <-enough:
	case <-stdinClosed():
		once.Do(func() { close(enough) })
	}
	wg.Wait()
	close(stop)
	return printResult(cnt.result())
}
