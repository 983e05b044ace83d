package main

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout"
)

func TestBadFlagsExitTwo(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no id", []string{"--topic", "t"}, "--id"},
		{"no topic", []string{"--id", "svc"}, "--topic"},
		{"unknown flag", []string{"--id", "svc", "--topic", "t", "--bogus"}, "bogus"},
		{"bad duration", []string{"--id", "svc", "--topic", "t", "--ack-timeout", "soon"}, "ack-timeout"},
		{"negative duration", []string{"--id", "svc", "--topic", "t", "--ack-timeout=-1s"}, "--ack-timeout"},
		{"bad initial offset", []string{"--id", "svc", "--topic", "t", "--initial-offset", "middle"}, "--initial-offset"},
		{"bad kafka address", []string{"--id", "svc", "--topic", "t", "--kafka", "nohost"}, "--kafka"},
		{"bad id", []string{"--id", "a b", "--topic", "t"}, "--id"},
		{"bad topic", []string{"--id", "svc", "--topic", "a/b"}, "--topic"},
		{"bad log format", []string{"--log-format", "xml", "--id", "svc", "--topic", "t"}, "--log-format"},
		{"stray argument", []string{"--id", "svc", "--topic", "t", "extra"}, "extra"},
		{"serve alias validates too", []string{"serve", "--id", "svc"}, "--topic"},
		// Messages a new user should not have to decode.
		{"duration without a unit", []string{"--id", "svc", "--topic", "t", "--ack-timeout", "5"}, `--ack-timeout "5": not a duration; give a number with a unit, e.g. 5s`},
		{"command duration without a unit", []string{"tail", "--timeout", "5"}, "not a duration; give a number with a unit"},
		{"not a number", []string{"--id", "svc", "--topic", "t", "--max-in-flight", "many"}, `--max-in-flight "many": not a whole number`},
		{"given but invalid id is not called missing", []string{"--id", "a b", "--topic", "t"}, `--id "a b": use 1-100 of`},
		{"missing id is called required", []string{"--topic", "t"}, "--id is required"},
		{"unknown command lists every command", []string{"foo"}, "commands: serve, produce, dev, tail, status"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"fanout"}, tt.args...), &stdout, &stderr)
			if code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr does not mention %q:\n%s", tt.want, stderr.String())
			}
		})
	}
}

// TestMistypedFlagSuggestsTheFlag: a flag or command a letter off gets the
// right one suggested, once, with no doubled prefix; one like nothing gets
// none.
func TestMistypedFlagSuggestsTheFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // the whole of stderr
	}{
		{[]string{"--tpic", "x"}, "fanout: unknown flag --tpic: did you mean --topic? (fanout --help lists the flags)\n"},
		{[]string{"dev", "--kafka-listn", "127.0.0.1:0"}, "fanout: unknown flag --kafka-listn: did you mean --kafka-listen? (fanout dev --help lists the flags)\n"},
		{[]string{"dev", "--retry-backof", "1s"}, "fanout: unknown flag --retry-backof: did you mean --retry-backoff? (fanout dev --help lists the flags)\n"},
		{[]string{"tail", "--conect", "x"}, "fanout: unknown flag --conect: did you mean --connect? (fanout tail --help lists the flags)\n"},
		{[]string{"offsets", "show", "--tpic", "x"}, "fanout: unknown flag --tpic: did you mean --topic? (fanout offsets show --help lists the flags)\n"},
		{[]string{"--xyzzy", "1"}, "fanout: unknown flag --xyzzy (fanout --help lists the flags)\n"},
		{[]string{"dve"}, "fanout: unknown command \"dve\": did you mean dev? (commands: serve, produce, dev, tail, status, offsets, healthcheck, pause, resume, drain-client, help)\n"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), append([]string{"fanout"}, tt.args...), &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit code %d, want 2; stderr:\n%s", tt.args, code, stderr.String())
		}
		if got := stderr.String(); got != tt.want {
			t.Errorf("%v: stderr %q, want %q", tt.args, got, tt.want)
		}
	}
}

// A given --id or --topic that is invalid is never reported as missing.
func TestInvalidValueNotCalledRequired(t *testing.T) {
	for _, args := range [][]string{{"--id", "a b", "--topic", "t"}, {"--id", "svc", "--topic", "a/b"}} {
		var stdout, stderr bytes.Buffer
		run(context.Background(), append([]string{"fanout"}, args...), &stdout, &stderr)
		if strings.Contains(stderr.String(), "required") {
			t.Errorf("%v: %q calls a given value missing", args, stderr.String())
		}
	}
}

// Every flag's help shows one default.
func TestHelpShowsOneDefaultPerFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"fanout", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr: %s", code, stderr.String())
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if n := strings.Count(line, "default"); n > 1 {
			t.Errorf("help line names %d defaults: %s", n, line)
		}
	}
	if !strings.Contains(stdout.String(), "(default: 3 × --cluster-heartbeat)") {
		t.Errorf("--leader-timeout's help does not give its derived default:\n%s", stdout.String())
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"fanout", "--version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), version) {
		t.Fatalf("version output %q", stdout.String())
	}
}

// Daemon flags count at either level: before the serve command or after it.
func TestServeFlagsAtEitherLevel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		kafka      string
		listen, id string
	}{
		{"root", []string{"--id", "a", "--topic", "t", "--kafka", "k1:9092", "--listen", ":5000"}, "k1:9092", ":5000", "a"},
		{"serve", []string{"serve", "--id", "a", "--topic", "t", "--kafka", "k1:9092", "--listen", ":5000"}, "k1:9092", ":5000", "a"},
		{"before serve", []string{"--kafka", "k1:9092", "--listen", ":5000", "--id", "b", "serve", "--topic", "t"}, "k1:9092", ":5000", "b"},
		{"serve wins", []string{"--listen", ":5000", "serve", "--id", "a", "--topic", "t", "--listen", ":6000"}, "localhost:9092", ":6000", "a"},
		{"defaults", []string{"serve", "--id", "a", "--topic", "t"}, "localhost:9092", ":4987", "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got fanout.Options
			app := newApp(io.Discard, io.Discard)
			capture := func(c *cli.Context) (err error) { got, err = serveOptions(c, nil); return err }
			app.Action = capture
			app.Command("serve").Action = capture
			if err := runCLI(context.Background(), app, append([]string{"fanout"}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			kafka := "localhost:9092"
			if len(got.Kafka) > 0 {
				kafka = strings.Join(got.Kafka, ",")
			}
			if kafka != tt.kafka || got.Listen != tt.listen || got.ID != tt.id || got.Topic != "t" {
				t.Fatalf("options: kafka %q listen %q id %q topic %q; want %q %q %q t", kafka, got.Listen, got.ID, got.Topic, tt.kafka, tt.listen, tt.id)
			}
		})
	}
}

func TestTailBadUsageExitsTwo(t *testing.T) {
	for _, args := range [][]string{
		{"tail", "--count", "-1"},
		{"tail", "--connect", ","},
		{"tail", "--bogus"},
		{"tail", "--max-in-flight", "-5"},
		{"tail", "extra", "--connect", "127.0.0.1:1"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), append([]string{"fanout"}, args...), &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit code %d, want 2; stderr: %s", args, code, stderr.String())
		}
	}
}

// --zookeeper-session-timeout and its environment variable reach the
// options; without either the default does.
func TestZooKeeperSessionTimeoutFlag(t *testing.T) {
	if got := serveOptionsOf(t).ZooKeeperSessionTimeout; got != fanout.DefaultZKSessionTimeout {
		t.Errorf("default: %v, want %v", got, fanout.DefaultZKSessionTimeout)
	}
	if got := serveOptionsOf(t, "--zookeeper-session-timeout", "4s").ZooKeeperSessionTimeout; got != 4*time.Second {
		t.Errorf("flag: %v, want 4s", got)
	}
	t.Setenv("FANOUT_ZOOKEEPER_SESSION_TIMEOUT", "6s")
	if got := serveOptionsOf(t).ZooKeeperSessionTimeout; got != 6*time.Second {
		t.Errorf("environment: %v, want 6s", got)
	}
}

// --assignment, --weight and --handoff-timeout and their environment
// variables reach the options; without them the defaults do.
func TestSpreadFlags(t *testing.T) {
	if got := serveOptionsOf(t); got.Assignment != fanout.AssignmentLeader || got.Weight != 1 || got.HandoffTimeout != fanout.DefaultHandoffTimeout {
		t.Errorf("defaults: %q, %d, %v", got.Assignment, got.Weight, got.HandoffTimeout)
	}
	got := serveOptionsOf(t, "--assignment", "spread", "--weight", "3", "--handoff-timeout", "4s")
	if got.Assignment != fanout.AssignmentSpread || got.Weight != 3 || got.HandoffTimeout != 4*time.Second {
		t.Errorf("flags: %q, %d, %v", got.Assignment, got.Weight, got.HandoffTimeout)
	}
	t.Setenv("FANOUT_ASSIGNMENT", "spread")
	t.Setenv("FANOUT_WEIGHT", "2")
	t.Setenv("FANOUT_HANDOFF_TIMEOUT", "6s")
	if got := serveOptionsOf(t); got.Assignment != fanout.AssignmentSpread || got.Weight != 2 || got.HandoffTimeout != 6*time.Second {
		t.Errorf("environment: %q, %d, %v", got.Assignment, got.Weight, got.HandoffTimeout)
	}
}

// --isolation and --max-outstanding, and their environment variables,
// reach the options; without either the defaults do.
func TestSourceFlags(t *testing.T) {
	if got := serveOptionsOf(t); got.Isolation != "read_committed" || got.MaxOutstanding != fanout.DefaultMaxOutstanding {
		t.Errorf("defaults: isolation %q, max outstanding %d", got.Isolation, got.MaxOutstanding)
	}
	if got := serveOptionsOf(t, "--isolation", "read_uncommitted", "--max-outstanding", "7"); got.Isolation != "read_uncommitted" || got.MaxOutstanding != 7 {
		t.Errorf("flags: isolation %q, max outstanding %d", got.Isolation, got.MaxOutstanding)
	}
	t.Setenv("FANOUT_ISOLATION", "read_uncommitted")
	t.Setenv("FANOUT_MAX_OUTSTANDING", "9")
	if got := serveOptionsOf(t); got.Isolation != "read_uncommitted" || got.MaxOutstanding != 9 {
		t.Errorf("environment: isolation %q, max outstanding %d", got.Isolation, got.MaxOutstanding)
	}
}

// serveOptionsOf returns the options serve makes of the daemon flags args
// (after --id a --topic t) and the environment.
func serveOptionsOf(t *testing.T, args ...string) fanout.Options {
	t.Helper()
	var got fanout.Options
	app := newApp(io.Discard, io.Discard)
	app.Action = func(c *cli.Context) (err error) { got, err = serveOptions(c, nil); return err }
	if err := runCLI(context.Background(), app, append([]string{"fanout", "--id", "a", "--topic", "t"}, args...)); err != nil {
		t.Fatal(err)
	}
	return got
}

// --offset-store and --kafka-session-timeout reach the options from the
// flags and the environment; with the Kafka store the Docker link variables
// of ZooKeeper are not taken, so no ZooKeeper is configured.
func TestOffsetStoreFlags(t *testing.T) {
	links := []string{"ZK_PORT_2181_TCP_ADDR=zk", "ZK_PORT_2181_TCP_PORT=2181"}
	parse := func(args ...string) fanout.Options {
		t.Helper()
		var got fanout.Options
		app := newApp(io.Discard, io.Discard)
		app.Action = func(c *cli.Context) (err error) { got, err = serveOptions(c, links); return err }
		if err := runCLI(context.Background(), app, append([]string{"fanout", "--id", "a", "--topic", "t"}, args...)); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := parse(); got.OffsetStore != fanout.OffsetStoreZooKeeper || !slices.Equal(got.ZooKeeper, []string{"zk:2181"}) ||
		got.KafkaSessionTimeout != fanout.DefaultKafkaSession {
		t.Errorf("default: store %q zookeeper %v session %v; want zookeeper, the linked zk:2181, %v",
			got.OffsetStore, got.ZooKeeper, got.KafkaSessionTimeout, fanout.DefaultKafkaSession)
	}
	got := parse("--offset-store", "kafka", "--kafka-session-timeout", "7s")
	if got.OffsetStore != fanout.OffsetStoreKafka || len(got.ZooKeeper) != 0 || got.KafkaSessionTimeout != 7*time.Second {
		t.Errorf("flags: store %q zookeeper %v session %v; want kafka, none, 7s", got.OffsetStore, got.ZooKeeper, got.KafkaSessionTimeout)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("--offset-store kafka with ZooKeeper links in the environment: %v", err)
	}
	t.Setenv("FANOUT_OFFSET_STORE", "kafka")
	t.Setenv("FANOUT_KAFKA_SESSION_TIMEOUT", "8s")
	if got := parse(); got.OffsetStore != fanout.OffsetStoreKafka || len(got.ZooKeeper) != 0 || got.KafkaSessionTimeout != 8*time.Second {
		t.Errorf("environment: store %q zookeeper %v session %v; want kafka, none, 8s", got.OffsetStore, got.ZooKeeper, got.KafkaSessionTimeout)
	}
	// A ZooKeeper given explicitly with Kafka's store is a clear error.
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"fanout", "--id", "a", "--topic", "t", "--zookeeper", "zk:2181"}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "not used with --offset-store kafka") {
		t.Errorf("--zookeeper with FANOUT_OFFSET_STORE=kafka: exit code %d, stderr %q; want 2 and why", code, stderr.String())
	}
}

// --deliveries-per-turn and its environment variable reach the options;
// without either the default does.
func TestDeliveriesPerTurnFlag(t *testing.T) {
	if got := serveOptionsOf(t); got.DeliveriesPerTurn != fanout.DefaultDeliveriesPerTurn {
		t.Errorf("default: %d deliveries per turn, want %d", got.DeliveriesPerTurn, fanout.DefaultDeliveriesPerTurn)
	}
	if got := serveOptionsOf(t, "--deliveries-per-turn", "8"); got.DeliveriesPerTurn != 8 {
		t.Errorf("flag: %d deliveries per turn, want 8", got.DeliveriesPerTurn)
	}
	t.Setenv("FANOUT_DELIVERIES_PER_TURN", "3")
	if got := serveOptionsOf(t); got.DeliveriesPerTurn != 3 {
		t.Errorf("environment: %d deliveries per turn, want 3", got.DeliveriesPerTurn)
	}
}
