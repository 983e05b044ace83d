package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// Services are the Kafka and ZooKeeper of a chaos run: started by
// bin/services in a directory of their own (FANOUT_SERVICES_DIR) on ports
// from PortBase, never the shared ones, and restarted there as faults.
type Services struct {
	Root     string // the checkout, whose bin/services runs them
	Dir      string // data, logs and pid files
	PortBase int    // Kafka on PortBase+92, ZooKeeper on PortBase+181, ...
	Log      string // bin/services' output is appended here
}

// Kafka is the plain listener's address.
func (s *Services) Kafka() string { return s.addr(92) }

// KafkaProxied is the address of the PROXIED listener, which advertises
// KafkaAdvertised: a proxy there carries all the Kafka traffic of a client
// bootstrapped on KafkaAdvertised.
func (s *Services) KafkaProxied() string { return s.addr(94) }

// KafkaAdvertised is where the PROXIED listener sends its clients.
func (s *Services) KafkaAdvertised() string { return s.addr(95) }

// ZooKeeper is ZooKeeper's plain client address.
func (s *Services) ZooKeeper() string { return s.addr(181) }

func (s *Services) addr(off int) string { return "127.0.0.1:" + strconv.Itoa(s.PortBase+off) }

func (s *Services) env() []string {
	p := func(off int) string { return strconv.Itoa(s.PortBase + off) }
	return append(os.Environ(),
		"FANOUT_SERVICES_DIR="+s.Dir,
		"FANOUT_KAFKA_PORT="+p(92), "FANOUT_KAFKA_CONTROLLER_PORT="+p(93),
		"FANOUT_KAFKA_PROXIED_PORT="+p(94), "FANOUT_KAFKA_PROXIED_ADVERTISED_PORT="+p(95),
		"FANOUT_KAFKA_SASL_PORT="+p(96), "FANOUT_ZK_PORT="+p(181), "FANOUT_ZK_TLS_PORT="+p(182),
		"FANOUT_KAFKA_HEAP=512m", "FANOUT_ZK_HEAP=128m")
}

// run runs bin/services with args, its output appended to s.Log.
func (s *Services) run(ctx context.Context, args ...string) error {
	f, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("services log: %w", err)
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(s.Root, "bin", "services"), args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = s.env(), f, f
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("bin/services %v (see %s): %w", args, s.Log, err)
	}
	return nil
}

// Start starts both servers on fresh data.
func (s *Services) Start(ctx context.Context) error { return s.run(ctx, "start") }

// Restart stops one server (kafka or zookeeper), by TERM or, with kill, by
// KILL, and starts it again on its data.
func (s *Services) Restart(ctx context.Context, name string, kill bool) error {
	args := []string{"restart", name}
	if kill {
		args = append(args, "--kill")
	}
	return s.run(ctx, args...)
}

// Stop stops both servers and removes their data.
func (s *Services) Stop() error { return s.run(context.Background(), "stop", "--clean") }
