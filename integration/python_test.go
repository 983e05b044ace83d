//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// pyRoot is the repository root, seen from this package.
const pyRoot = ".."

// pyPython returns the interpreter of the virtualenv bin/deps makes for the
// Python client's tests, failing (never skipping) when it is missing.
func pyPython(t testing.TB) string {
	t.Helper()
	py, err := filepath.Abs(filepath.Join(pyRoot, ".cache", "python", "bin", "python"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("the Python client's virtualenv is missing (%v): run bin/deps", err)
	}
	return py
}

// pyRun runs the venv's python with args in dir (relative to the repository
// root), the Python client's sources on PYTHONPATH and env added, until it
// exits or timeout; the test fails on a non-zero exit, with the output.
func pyRun(t testing.TB, dir string, timeout time.Duration, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	src, err := filepath.Abs(filepath.Join(pyRoot, "clients", "python", "src"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, pyPython(t), args...)
	cmd.Dir = filepath.Join(pyRoot, dir)
	cmd.Env = append(append(os.Environ(), "PYTHONPATH="+src, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// pyTest runs pytest on the Python client's tests selected by args.
func pyTest(t testing.TB, env []string, args ...string) {
	t.Helper()
	out := pyRun(t, "clients/python", 5*time.Minute, env,
		append([]string{"-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "log_level=INFO"}, args...)...)
	t.Logf("pytest %s:\n%s", strings.Join(args, " "), out)
}

// The Python client's unit tests, against its in-process fake daemon
// (framing errors, redirects, pings, members, batches).
func TestPythonClientUnit(t *testing.T) {
	pyTest(t, nil, "tests", "-m", "not integration")
}

// The Python client against the real daemon: a wrong token is refused, then
// every message is received and acked (one nacked, one touched), the client
// closes cleanly, and the daemon commits every offset.
func TestPythonClientAgainstDaemon(t *testing.T) {
	const partitions, n = 2, 20
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, partitions)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr, "--auth-token", "py-secret")...)
	produceSeq(t, topic, "m", n, partitions)

	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + addr, "FANOUT_TEST_TOKEN=py-secret", fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_daemon.py::test_consume_ack_nack_touch")
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool {
		offs := zkOffsets(t, id, topic)
		return offs[0] == n/partitions && offs[1] == n/partitions
	})
}

// The Python client given a follower is redirected to the leader and
// receives every message from it.
func TestPythonClientFollowsRedirect(t *testing.T) {
	const n = 6
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 1)
	addrs := []string{procFreeAddr(t), procFreeAddr(t)}
	for _, a := range addrs {
		procStart(t, procDaemonArgs(t, id, topic, a)...)
	}
	var leader, follower string
	testutil.WaitFor(t, 60*time.Second, "a leader and a follower that redirects to it", func() bool {
		a, b := clHello(addrs[0]), clHello(addrs[1])
		switch {
		case a.welcome != "" && b.redirectTo == addrs[0]:
			leader, follower = addrs[0], addrs[1]
		case b.welcome != "" && a.redirectTo == addrs[1]:
			leader, follower = addrs[1], addrs[0]
		default:
			return false
		}
		return true
	})
	produceSeq(t, topic, "m", n, 1)
	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + follower, "FANOUT_TEST_LEADER=" + leader, fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_daemon.py::test_redirected_to_the_leader")
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool { return zkOffsets(t, id, topic)[0] == n })
}
