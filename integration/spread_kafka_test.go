//go:build integration

package integration

// Spread mode on the Kafka store: the daemons are the members of the
// consumer group fanout_<id>, with their node ids as static instance ids;
// the group's leader plans, the coordinator fences their commits by
// generation; no ZooKeeper anywhere (the daemons are watched for any
// connection to one). The tests of spread_test.go run here on this store,
// and those of what only this store has. Helpers here are prefixed sk.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// skSessionTimeout is the members' --kafka-session-timeout: the brokers'
// smallest (group.min.session.timeout.ms), so that a crashed member's
// partitions move soon.
const skSessionTimeout = 6 * time.Second

// skNewCluster prepares n spread-mode daemons of topic on the Kafka store.
func skNewCluster(t *testing.T, topic string, n int) *clCluster {
	t.Helper()
	c := clNewKafkaCluster(t, topic, n)
	for _, nd := range c.nodes {
		nd.args = []string{"--assignment", "spread", "--kafka-session-timeout", skSessionTimeout.String(),
			"--handoff-timeout", spHandoffTimeout.String()}
	}
	return c
}

// skDescribe describes the cluster's group.
func skDescribe(t *testing.T, c *clCluster) kafkastore.Description {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	d, err := ksStore(t, c.id, c.topic).Describe(ctx)
	if err != nil {
		t.Fatalf("describe group %s: %v", kafkastore.GroupName(c.id), err)
	}
	return d
}

// skOwners returns, per node, the partitions the group's assignment lets
// it hold (none while the group rebalances).
func skOwners(t *testing.T, c *clCluster) map[string][]int32 {
	t.Helper()
	out := map[string][]int32{}
	for _, m := range skDescribe(t, c).Members {
		if len(m.Held) > 0 {
			out[m.InstanceID] = slices.Clone(m.Held)
		}
	}
	return out
}

// 1. Three members share twelve partitions through the group; Kafka's own
// kafka-consumer-groups lists each member with its partitions, and the
// committed offsets with their lag.
func TestSpreadKafkaThreeMembersShareTwelvePartitions(t *testing.T) {
	t.Parallel()
	c := testSpreadThreeMembersShareTwelvePartitions(t, skNewCluster)
	owned := skOwners(t, c)
	group := kafkastore.GroupName(c.id)
	tool := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "java", append([]string{"-cp", ksKafkaLibs(t), "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
			"--bootstrap-server", strings.Join(kafkaAddrs(t), ","), "--describe", "--group", group}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kafka-consumer-groups --describe %v: %v\n%s", args, err, out)
		}
		t.Logf("kafka-consumer-groups --describe --group %s %s:\n%s", group, strings.Join(args, " "), out)
		return string(out)
	}
	// GROUP CONSUMER-ID GROUP-INSTANCE-ID HOST CLIENT-ID #PARTITIONS CURRENT-EPOCH CURRENT-ASSIGNMENT ... (Kafka 4.4;
	// older tools name the last column ASSIGNMENT and write topic(0,1) for topic:0,1).
	members := map[string][]int32{} // group instance id -> partitions
	var cols []string
	for _, line := range strings.Split(tool("--members", "--verbose"), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "GROUP" {
			cols = f
			continue
		}
		if len(f) != len(cols) || len(f) == 0 || f[0] != group {
			continue
		}
		row := map[string]string{}
		for i, name := range cols {
			row[name] = f[i]
		}
		assigned := row["CURRENT-ASSIGNMENT"]
		if assigned == "" {
			assigned = row["ASSIGNMENT"]
		}
		node := row["GROUP-INSTANCE-ID"]
		for n := range owned {
			if node == "" && strings.HasPrefix(row["CONSUMER-ID"], n+"-") { // a member id is <instance id>-<uuid>
				node = n
			}
		}
		list := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(assigned, c.topic), ":"), ")")
		list = strings.TrimPrefix(list, "(")
		var ps []int32
		for _, x := range strings.Split(list, ",") {
			var p int32
			if _, err := fmt.Sscan(x, &p); err == nil {
				ps = append(ps, p)
			}
		}
		slices.Sort(ps)
		members[node] = ps
	}
	if !equalOwners(members, owned) {
		t.Errorf("kafka-consumer-groups --members --verbose: %v, want each member with its partitions %v", members, owned)
	}
	// GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
	rows := 0
	ownerOf := spOwnerAt(owned)
	for _, line := range strings.Split(tool("--offsets"), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != group || f[1] != c.topic {
			continue
		}
		rows++
		if f[3] != f[4] || f[5] != "0" {
			t.Errorf("kafka-consumer-groups --offsets: %s: want the log end committed and lag 0", line)
		}
		var p int32
		fmt.Sscan(f[2], &p)
		if !strings.HasPrefix(f[6], ownerOf[p]+"-") {
			t.Errorf("kafka-consumer-groups --offsets: partition %d consumed by %s, held by %s", p, f[6], ownerOf[p])
		}
	}
	if rows != 12 {
		t.Errorf("kafka-consumer-groups --offsets listed %d partitions, want 12", rows)
	}

	// fanout offsets reset is refused while the members run, --fence-leader
	// or not: no leader record fences their commits.
	for _, extra := range [][]string{nil, {"--fence-leader"}} {
		args := append([]string{"offsets", "reset", "--id", c.id, "--topic", c.topic, "--kafka", strings.Join(kafkaAddrs(t), ","),
			"--offset-store", "kafka", "--to", "oldest", "--yes"}, extra...)
		cmd := exec.Command(procBinary(t), args...)
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "the cluster runs") ||
			!strings.Contains(string(out), "spread mode") {
			t.Errorf("fanout offsets reset %v while the members run: exit %d, want 1 naming the running spread cluster:\n%s", extra, code, out)
		}
	}
	if got := c.offsets(); got[0] == 0 {
		t.Errorf("a refused reset wrote: %v", got)
	}
}

// 2. A member joins while messages flow: each member ends with three,
// only the partitions that move pause, nothing acked is delivered again.
func TestSpreadKafkaJoinTakesItsShare(t *testing.T) { testSpreadJoinHandsOver(t, skNewCluster) }

// 3. SIGTERM of a member: it drains, commits, leaves the group, and
// nothing acked is delivered again.
func TestSpreadKafkaSigtermHandsOver(t *testing.T) { testSpreadSigtermHandsOver(t, skNewCluster) }

// 4. kill -9 of the group's leader (the member that plans): its
// partitions are served by the others once the coordinator drops it (the
// session timeout), the others keep theirs, nothing is lost, and only its
// uncommitted messages come again.
func TestSpreadKafkaMemberCrash(t *testing.T) {
	t.Parallel()
	testSpreadMemberCrash(t, skNewCluster, func(c *clCluster) *clNode {
		var leader string
		testutil.WaitFor(t, 30*time.Second, "the group's plan", func() bool {
			if p := skDescribe(t, c).Plan(); p != nil {
				leader = p.Leader
			}
			return leader != ""
		})
		for _, nd := range c.nodes {
			if nd.id == leader {
				return nd
			}
		}
		t.Fatalf("the group's leader %q is none of the daemons", leader)
		return nil
	})
}

// 5. A member paused past its session loses its partitions; resumed, it
// cannot commit them and stops delivering them as soon as it learns.
func TestSpreadKafkaPausedMemberLosesItsPartitions(t *testing.T) {
	t.Parallel()
	testSpreadPausedMemberLosesItsPartitions(t, skNewCluster)
}

// 6. Partitions added to the topic are spread.
func TestSpreadKafkaPartitionIncrease(t *testing.T) { testSpreadPartitionIncrease(t, skNewCluster) }

// 7. A member killed and restarted within the session timeout takes its
// place back (its static instance id): no rebalance, nothing moves, and it
// serves its partitions again from their committed offsets: fanout tail
// given another member's address prints every partition's messages.
func TestSpreadKafkaRestartMovesNothing(t *testing.T) {
	t.Parallel()
	const partitions = 6
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := skNewCluster(t, topic, 3)
	c.startAll()
	before := spWaitOwned(t, nil, c, c.nodes, partitions, 60*time.Second)
	gen := skDescribe(t, c).Plan().Generation
	victim := c.nodes[1]
	victim.signal(t, syscall.SIGKILL)
	victim.waitExit(t, 10*time.Second)
	victim.mark(t, "restarted")
	c.start(victim)
	testutil.WaitFor(t, 60*time.Second, victim.id+" serving again", func() bool {
		return len(spLogLines(victim, "restarted", "partition reserved")) == len(before[victim.id])
	})
	d := skDescribe(t, c)
	if p := d.Plan(); p == nil || p.Generation != gen {
		t.Errorf("the group's generation went from %d to %v: the restart rebalanced", gen, p)
	}
	if after := skOwners(t, c); !equalOwners(after, before) {
		t.Errorf("owners %v after the restart, %v before: something moved", after, before)
	}
	// fanout tail given another member's address prints the messages of
	// every partition: it connects to every member from there, and the
	// restarted member serves its partitions again.
	const n = 4 * partitions
	produceSeq(t, topic, "m", n, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tail := exec.CommandContext(ctx, procBinary(t), "tail", "--connect", c.nodes[0].addr, "--count", fmt.Sprint(n), "--json", "--timeout", "60s")
	var stdout, stderr bytes.Buffer
	tail.Stdout, tail.Stderr = &stdout, &stderr
	if err := tail.Run(); err != nil {
		t.Fatalf("fanout tail --connect %s: %v\nstderr:\n%s", c.nodes[0].addr, err, stderr.String())
	}
	seen, parts := map[string]bool{}, map[int32]bool{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var r struct {
			Partition int32  `json:"partition"`
			Value     string `json:"value"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("fanout tail printed %q: %v", line, err)
		}
		seen[r.Value], parts[r.Partition] = true, true
	}
	if len(seen) != n || len(parts) != partitions {
		t.Errorf("fanout tail given %s printed %d distinct messages of partitions %v, want %d of all %d",
			c.nodes[0].addr, len(seen), slices.Sorted(maps.Keys(parts)), n, partitions)
	}
	testutil.WaitFor(t, 30*time.Second, "the tailed messages committed on every partition", func() bool {
		offs := c.offsets()
		for p := range int32(partitions) {
			if offs[p] != n/partitions {
				return false
			}
		}
		return true
	})
}

func equalOwners(a, b map[string][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// 8. A member of the other mode than the group's is refused, with a
// message naming both: a leader-mode daemon of the Kafka store does not
// lead a group of spread members, and serves nothing; once they are gone
// it leads, and a spread member is refused in turn.
func TestSpreadKafkaModeMismatch(t *testing.T) {
	t.Parallel()
	const partitions = 2
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	c := skNewCluster(t, topic, 3)
	leaderMode := c.nodes[2]
	leaderMode.args = []string{"--kafka-session-timeout", skSessionTimeout.String()}
	c.start(c.nodes[0])
	c.start(c.nodes[1])
	spWaitOwned(t, nil, c, c.nodes[:2], partitions, 60*time.Second)
	c.start(leaderMode)
	testutil.WaitFor(t, 60*time.Second, leaderMode.id+" to say the group runs spread mode", func() bool {
		return len(clGrep(leaderMode.logAfter(""), "run --assignment spread, this member --assignment leader")) > 0
	})
	if a := clHello(leaderMode.addr); a.welcome != "" {
		t.Errorf("the leader-mode member answered %v under spread members: it serves", a)
	}
	for _, nd := range c.nodes[:2] {
		nd.signal(t, syscall.SIGTERM)
		nd.waitExit(t, 30*time.Second)
	}
	testutil.WaitFor(t, 60*time.Second, "the leader-mode member to lead once the spread members left", func() bool {
		return clHello(leaderMode.addr).welcome == leaderMode.id
	})
	spread := c.nodes[0]
	spread.mark(t, "restarted")
	c.start(spread)
	testutil.WaitFor(t, 60*time.Second, spread.id+" to say the group runs leader mode", func() bool {
		return len(clGrep(spread.logAfter("restarted"), "run --assignment leader, this member --assignment spread")) > 0
	})
	if a := clHello(spread.addr); a.welcome != "" || a.code != protocol.ErrorCode_ERROR_CODE_NO_LEADER {
		t.Errorf("the spread member answered %v under a leader-mode leader, want NO_LEADER", a)
	}
}
