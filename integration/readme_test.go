//go:build integration

package integration

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// readmeRecipe returns the command lines of the README's code block that
// follows the marker "<!-- recipe: NAME": each line that starts with
// "./fanout", split into its arguments (without "./fanout" and a final "&").
func readmeRecipe(t *testing.T, name string) [][]string {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	i := strings.Index(text, "<!-- recipe: "+name)
	if i < 0 {
		t.Fatalf("README.md has no recipe %q", name)
	}
	block := text[i:]
	start := strings.Index(block, "```sh\n")
	end := strings.Index(block[start+6:], "```")
	if start < 0 || end < 0 {
		t.Fatalf("README.md recipe %q has no ```sh block", name)
	}
	var cmds [][]string
	for _, line := range strings.Split(block[start+6:start+6+end], "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "./fanout" {
			continue
		}
		if fields[len(fields)-1] == "&" {
			fields = fields[:len(fields)-1]
		}
		cmds = append(cmds, fields[1:])
	}
	if len(cmds) == 0 {
		t.Fatalf("README.md recipe %q runs no ./fanout", name)
	}
	return cmds
}

// flagValue returns the value of --name in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// The README's recipe for a cluster on one host works as written: with the
// default Kafka and ZooKeeper addresses (the test's services must answer
// there), every daemon starts and stays up, one leads and the others
// redirect to it, and every metrics port answers.
func TestReadmeClusterOnOneHost(t *testing.T) {
	if got := kafkaAddrs(t); len(got) != 1 || !strings.HasSuffix(got[0], ":9092") {
		t.Fatalf("the recipe uses the default Kafka address localhost:9092; FANOUT_TEST_KAFKA is %v", got)
	}
	if got := zkAddrs(t); len(got) != 1 || !strings.HasSuffix(got[0], ":2181") {
		t.Fatalf("the recipe uses the default ZooKeeper address localhost:2181; FANOUT_TEST_ZOOKEEPER is %v", got)
	}
	cmds := readmeRecipe(t, "cluster on one host")
	topic := flagValue(cmds[0], "topic")
	admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}

	var nodes []*clNode
	var procs []*procProcess
	for _, args := range cmds {
		procs = append(procs, procStart(t, args...))
		nodes = append(nodes, &clNode{id: flagValue(args, "node-id"), addr: flagValue(args, "advertise")})
	}
	leader := clWaitLeader(t, nodes, 60*time.Second)
	if want := nodes[len(nodes)-1]; leader != want {
		t.Errorf("%s leads, want %s (the highest node id)", leader.id, want.id)
	}
	for i, args := range cmds {
		url := "http://localhost" + flagValue(args, "metrics-listen") + "/healthz"
		testutil.WaitFor(t, 10*time.Second, url+" to answer 200", func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if procs[i].exited() {
			t.Errorf("daemon %d exited:\n%s", i, procs[i].output())
		}
	}
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
	}
	for i, p := range procs {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("daemon %d exit code %d after SIGTERM:\n%s", i, code, p.output())
		}
	}
}

// A daemon whose client or metrics port is taken exits at once and says
// which flag to change, and the daemon holding the port runs on.
func TestPortTakenSaysWhichFlag(t *testing.T) {
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	listen, metrics := procFreeAddr(t), procFreeAddr(t)
	first := procStart(t, procDaemonArgs(t, uniqueName(t, "svc"), topic, listen, "--metrics-listen", metrics)...)
	testutil.WaitFor(t, 30*time.Second, "the first daemon to serve metrics", func() bool {
		resp, err := http.Get("http://" + metrics + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"--listen", procDaemonArgs(t, uniqueName(t, "svc"), topic, listen)},
		{"--metrics-listen", procDaemonArgs(t, uniqueName(t, "svc"), topic, procFreeAddr(t), "--metrics-listen", metrics)},
	} {
		p := procStart(t, tc.args...)
		if code := p.wait(t, 30*time.Second); code == 0 {
			t.Fatalf("a daemon on a taken %s port exited 0:\n%s", tc.flag, p.output())
		}
		if out := p.output(); !strings.Contains(out, "address already in use") || !strings.Contains(out, "its own "+tc.flag+" ") {
			t.Errorf("a taken %s port: the error does not say which flag to change:\n%s", tc.flag, out)
		}
	}
	if first.exited() {
		t.Errorf("the daemon holding the ports exited:\n%s", first.output())
	}
}
