// Command fanout-bench measures fanout against the real Kafka of the test
// harness and compares it with Kafka's own tools and a plain sarama consumer.
// bin/bench builds it and runs `fanout-bench run`; the driver starts the
// other subcommands as separate processes:
//
//	run      the driver: prepares topics, runs every measurement, writes the report
//	client   one fanout client (the Go client library) that acks every message
//	sarama   a plain sarama consumer of every partition (the ceiling for fanout)
//	idle     many idle connections to a daemon that only answer pings
//	busy     many raw connections to a daemon, each acking every delivery
//	targets  the performance targets in results.json files, side by side
//	         (fanout-bench targets BEFORE.json AFTER.json)
//
// Workers report one JSON object on standard output when their standard input
// closes (or, for sarama, when they have seen --count messages); progress lines
// ("progress N") go to standard error.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	cmds := map[string]func([]string) error{
		"run":     runDriver,
		"client":  runClient,
		"sarama":  runSarama,
		"idle":    runIdle,
		"busy":    runBusy,
		"targets": runTargets,
	}
	cmd, ok := cmds[os.Args[1]]
	if !ok {
		usage()
	}
	if err := cmd(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "fanout-bench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: fanout-bench run|client|sarama|idle|busy|targets [flags]   (see bin/bench)")
	os.Exit(2)
}
