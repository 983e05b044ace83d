package kafka

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// BenchmarkSource measures a Source reading every record of a topic of 4
// partitions from an in-process Kafka (kfake, whose own work is in the
// figures) until they are all in batches: ns/record, cpu-ns/record (the
// process's CPU time, kfake's included) and allocs/record are per record, a
// Source's start included (20,000 records amortize it), its stop (which
// waits for the fetch in flight) left out of the times.
func BenchmarkSource(b *testing.B) {
	for _, size := range []int{100, 1024} {
		b.Run(fmt.Sprintf("value=%d", size), func(b *testing.B) { benchSource(b, size) })
	}
}

func benchSource(b *testing.B, size int) {
	const topic, partitions, records = "t", 4, 20000
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		b.Fatal(err)
	}
	defer cluster.Close()
	cfg := NewConfig("fanout-bench")
	cfg.Producer.Return.Successes = true
	cfg.Producer.Flush.Messages = 100
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	sp, err := sarama.NewSyncProducer(cluster.ListenAddrs(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, size)
	var msgs []*sarama.ProducerMessage
	for i := range records {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: int32(i % partitions), Value: sarama.ByteEncoder(value)})
	}
	for i := 0; i < len(msgs); i += 100 {
		if err := sp.SendMessages(msgs[i : i+100]); err != nil {
			b.Fatal(err)
		}
	}
	_ = sp.Close()

	b.ReportAllocs()
	b.SetBytes(int64(size * records))
	var before, after runtime.MemStats
	var cpu time.Duration // the process's CPU time while timed
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		b.StartTimer()
		start := cpuTime()
		client, err := sarama.NewClient(cluster.ListenAddrs(), NewConfig("fanout-bench"))
		if err != nil {
			b.Fatal(err)
		}
		src, err := NewSource(client, SourceConfig{Topic: topic, Initial: sarama.OffsetOldest, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- src.Run(ctx) }()
		n := 0
		for batch := range src.Batches() {
			if batch.Anchor != nil {
				close(batch.Anchor)
			}
			if n += len(batch.Messages); n == records {
				cpu += cpuTime() - start
				b.StopTimer() // stopping waits for the fetch in flight
				cancel()
			}
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		cancel()
		_ = client.Close()
	}
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*records), "ns/record")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N*records), "allocs/record")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*records), "cpu-ns/record")
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
