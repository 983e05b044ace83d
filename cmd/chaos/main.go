// Command chaos is the fault-injection run (bin/chaos is its wrapper): it
// starts its own Kafka and ZooKeeper (bin/services in a directory and on
// ports of its own), fanout daemons, client processes and a producer,
// injects faults on a seeded schedule, drains, and verifies that nothing
// was lost. `chaos client` is one of its client processes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/chaos"
)

func main() {
	log := logrus.New()
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "client":
		err = client(ctx, os.Args[2:], logrus.NewEntry(log))
	case len(os.Args) > 1 && os.Args[1] == "verify":
		err = verify(os.Args[2:])
	default:
		err = run(ctx, os.Args[1:], logrus.NewEntry(log))
	}
	switch {
	case errors.Is(err, flag.ErrHelp): // -help: the usage was printed
	case err != nil:
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}

// errFailed is returned when a run's verification failed.
var errFailed = errors.New("verification failed (see the summaries)")

func run(ctx context.Context, args []string, log *logrus.Entry) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	root := fs.String("root", ".", "the checkout (its bin/services runs Kafka and ZooKeeper)")
	out := fs.String("out", "chaos-results", "directory of the results and logs")
	fanoutBin := fs.String("fanout", "", "the fanout daemon binary (required)")
	mode := fs.String("assignment", "leader", "leader, spread, or both (one after the other)")
	store := fs.String("offset-store", "zookeeper", "the daemons' --offset-store: zookeeper, kafka (no ZooKeeper), or both (one after the other)")
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()%1_000_000), "seed of the fault schedule")
	duration := fs.Duration("duration", 10*time.Minute, "length of the fault phase of each mode")
	interval := fs.Duration("interval", 10*time.Second, "mean time between fault starts")
	quick := fs.Bool("quick", false, "35 s of faults per run, one every 3 s: both modes on both offset stores (leader and spread "+
		"mode on ZooKeeper, then on Kafka); about 1.25 minutes per run")
	daemons := fs.Int("daemons", 3, "daemon processes")
	clients := fs.Int("clients", 3, "acking client processes (a silent and a nacking one come on top)")
	partitions := fs.Int("partitions", 6, "partitions of the topic at the start")
	rate := fs.Int("rate", 200, "messages produced per second")
	portBase := fs.Int("port-base", 19000, "Kafka on BASE+92, ZooKeeper on BASE+181, daemons from BASE+200")
	ackTimeout := fs.Duration("ack-timeout", 5*time.Second, "the daemons' --ack-timeout")
	maxAttempts := fs.Int("max-attempts", 5, "the daemons' --max-attempts, with a dead-letter topic of the run's own (0: none)")
	poison := fs.Float64("poison-share", 0.01, "share of the records produced as poison: every client nacks them, so they are dead-lettered")
	nackRedeliver := fs.Duration("nack-redeliver", 10*time.Second,
		"the delay the nacking client asks for in its nacks (longer than a failover, so that delays must survive one)")
	python := fs.String("python", "", "a Python 3 with the Python client's dependencies: one more acking client on it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	type pair struct{ mode, store string }
	var runs []pair
	modes, stores := []string{*mode}, []string{*store}
	if *mode == "both" {
		modes = []string{"leader", "spread"}
	}
	if *store == "both" {
		stores = []string{"zookeeper", "kafka"}
	}
	for _, m := range modes {
		if m != "leader" && m != "spread" {
			return fmt.Errorf("--assignment %q: want leader, spread or both", *mode)
		}
	}
	for _, s := range stores {
		if s != "zookeeper" && s != "kafka" {
			return fmt.Errorf("--offset-store %q: want zookeeper, kafka or both", *store)
		}
	}
	for _, m := range modes {
		for _, s := range stores {
			runs = append(runs, pair{m, s})
		}
	}
	if *quick {
		// Every mode on every store: each pair fences and hands over
		// differently (the leader record or the group's one membership,
		// ownership records or the group's generations).
		runs = []pair{{"leader", "zookeeper"}, {"spread", "zookeeper"}, {"spread", "kafka"}, {"leader", "kafka"}}
		*duration, *interval = 35*time.Second, 3*time.Second
	}
	if *fanoutBin == "" {
		return errors.New("--fanout is required")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	absRoot, err := filepath.Abs(*root)
	if err != nil {
		return err
	}
	absOut, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(absOut, 0o755); err != nil {
		return err
	}
	log.Infof("seed %d (replay: --seed %d); results in %s", *seed, *seed, absOut)
	svc := &chaos.Services{Root: absRoot, Dir: filepath.Join(absOut, "services"), PortBase: *portBase,
		Log: filepath.Join(absOut, "services.log")}
	log.Infof("starting Kafka on %s and ZooKeeper on %s (%s)", svc.Kafka(), svc.ZooKeeper(), svc.Dir)
	if err := svc.Start(ctx); err != nil {
		return err
	}
	defer func() {
		if err := svc.Stop(); err != nil {
			log.WithError(err).Error("stopping the servers")
		}
	}()
	failed := false
	for _, rn := range runs {
		cfg := chaos.Config{Services: svc, Fanout: *fanoutBin, Self: self, Mode: rn.mode, Store: rn.store,
			Python: *python, Root: absRoot, Seed: *seed, Duration: *duration, Interval: *interval, Daemons: *daemons, Clients: *clients,
			Partitions: *partitions, Rate: *rate, AckTimeout: *ackTimeout, Drain: 2 * time.Minute,
			MaxAttempts: *maxAttempts, PoisonShare: *poison, NackRedeliver: *nackRedeliver}
		cfg.Out = filepath.Join(absOut, cfg.Name())
		log.Infof("===== %s mode, offsets in %s: %s of faults, one every %s", rn.mode, rn.store, *duration, *interval)
		sum, err := chaos.Run(ctx, cfg, log.WithField("run", cfg.Name()))
		if err != nil {
			return fmt.Errorf("%s: %w", cfg.Name(), err)
		}
		fmt.Println(sum.Markdown())
		if !sum.Passed {
			failed = true
		}
	}
	if failed {
		return errFailed
	}
	return nil
}

// verify verifies again a finished run from the files it left, and
// rewrites its summary and timeline.
func verify(args []string) error {
	fs := flag.NewFlagSet("chaos verify", flag.ContinueOnError)
	dir := fs.String("dir", "", "a mode's results directory, e.g. chaos-results/leader")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sum, err := chaos.VerifyDir(*dir)
	if err != nil {
		return err
	}
	fmt.Println(sum.Markdown())
	if !sum.Passed {
		return errFailed
	}
	return nil
}

func client(ctx context.Context, args []string, log *logrus.Entry) error {
	fs := flag.NewFlagSet("chaos client", flag.ContinueOnError)
	var cfg chaos.ClientConfig
	addrs := fs.String("addrs", "", "daemon addresses, comma-separated")
	fs.StringVar(&cfg.Name, "name", "", "name in the event log: role.incarnation")
	fs.StringVar(&cfg.Log, "log", "", "event log, appended to")
	fs.StringVar(&cfg.Mode, "mode", chaos.ModeAck, "ack, silent or nack")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the processing times")
	fs.IntVar(&cfg.MaxInFlight, "max-in-flight", 16, "messages held at once")
	fs.IntVar(&cfg.Workers, "workers", 4, "messages processed at once")
	fs.DurationVar(&cfg.MaxProcess, "max-process", 20*time.Millisecond, "processing time is uniform below this")
	fs.Float64Var(&cfg.NackShare, "nack-share", 0.3, "nack mode: share of messages nacked")
	fs.DurationVar(&cfg.NackDelay, "nack-delay", 200*time.Millisecond, "nack mode: time a message is held before its nack")
	fs.DurationVar(&cfg.NackRedeliver, "nack-redeliver", 0, "nack mode: the delay of its nacks (NackWithDelay): no redelivery before it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Addrs = strings.Split(*addrs, ",")
	if cfg.Name == "" || cfg.Log == "" || *addrs == "" {
		return errors.New("client: --addrs, --name and --log are required")
	}
	return chaos.RunClient(ctx, cfg, log.WithField("client", cfg.Name))
}
