//go:build integration

package integration

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/internal/doccheck"
	"github.com/nanoservice/core-fanout/internal/modproxy"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// outRoot is the repository root, seen from this package.
const outRoot = ".."

// outsideBlocks are the command blocks of the user docs that the tests of
// this file run as written outside the repository, by the name their
// annotation gives them (<!-- test: run outside the repository: NAME -->);
// the docs test checks that every such block is one of them.
var outsideBlocks = []string{"go get the client", "build the Python wheel", "install the Python client"}

// docBlock returns the text of the command block of the document file
// (relative to the repository root) run outside the repository as name.
func docBlock(t testing.TB, file, name string) string {
	t.Helper()
	if !slices.Contains(outsideBlocks, name) {
		t.Fatalf("%q is not one of outsideBlocks", name)
	}
	b, err := doccheck.Find(outRoot, file, name)
	if err != nil {
		t.Fatal(err)
	}
	return b.Text
}

// outShell runs script with bash -euo pipefail in dir, with env added to
// the test's environment, and returns its output; the test fails with the
// output when the script fails.
func outShell(t testing.TB, dir string, env []string, script string) string {
	t.Helper()
	// A bound on a hung command only, far above what it takes on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in %s:\n%s\n%v\n%s", dir, script, err, out)
	}
	return string(out)
}

// The Go client used as a user outside this repository uses it: a module in
// a temporary directory, with no workspace, gets the client with the command
// docs/releasing.md gives, from a module proxy that serves the modules of
// this repository's HEAD as proxy.golang.org serves a commit (the zips the go
// command makes; GONOSUMDB, as the commit is not in the public checksum
// database), builds examples/consumer there, and that program receives the
// messages produced and acks them: the daemon commits their offsets.
func TestGoClientFromOutsideTheRepository(t *testing.T) {
	t.Parallel()
	const partitions, n = 2, 6
	repo, err := filepath.Abs(outRoot)
	if err != nil {
		t.Fatal(err)
	}
	head, err := modproxy.Resolve(repo, "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("git", "-C", repo, "status", "--porcelain").Output(); len(out) > 0 {
		t.Logf("the work tree has changes that are not committed: this test uses HEAD, %s", head.Hash)
	}
	dirs, err := modproxy.ModuleDirs(repo, head)
	if err != nil {
		t.Fatal(err)
	}
	proxy := t.TempDir()
	var served []string
	for _, dir := range dirs {
		if dir == "" {
			continue // the daemon's module: an application, which nobody imports
		}
		m, err := modproxy.Add(proxy, repo, head, dir)
		if err != nil {
			t.Fatal(err)
		}
		served = append(served, m.String())
	}
	t.Logf("the proxy serves %s", strings.Join(served, ", "))
	const clientPath = "github.com/nanoservice/core-fanout/client"
	want := clientPath + "@" + head.PseudoVersion("v0")

	usual, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		t.Fatalf("go env GOPROXY: %v", err)
	}
	env := []string{
		"GOWORK=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod",
		"GOPROXY=file://" + filepath.ToSlash(proxy) + "," + strings.TrimSpace(string(usual)),
		"GONOSUMDB=github.com/nanoservice/core-fanout",
	}
	app := t.TempDir()
	src, err := os.ReadFile(filepath.Join(outRoot, "examples", "consumer", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "main.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	getClient := docBlock(t, "docs/releasing.md", "go get the client")
	if readme := docBlock(t, "README.md", "go get the client"); readme != getClient {
		t.Errorf("the README gets the client with\n%s\nand docs/releasing.md with\n%s", readme, getClient)
	}
	outShell(t, app, env, "go mod init example.com/consumer")
	outShell(t, app, env, getClient)
	mods := strings.Fields(outShell(t, app, env, "go list -m -f '{{.Path}}@{{.Version}}' all | grep nanoservice || true"))
	if len(mods) != 1 || mods[0] != want {
		t.Fatalf("the application builds from %q of this repository, want %s alone", mods, want)
	}
	bin := filepath.Join(app, "consumer")
	outShell(t, app, env, "go build -o "+bin+" .")

	topic, id := uniqueName(t, "topic"), uniqueName(t, "svc")
	createTopic(t, topic, partitions)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr)...)
	values := produceSeq(t, topic, "outside", n, partitions)
	consumer := procRun(t, bin, nil, "--connect", addr)
	testutil.WaitFor(t, 60*time.Second, "every offset committed", func() bool {
		var sum int64
		for _, o := range zkOffsets(t, id, topic) {
			sum += o
		}
		return sum == n
	})
	for _, v := range values {
		if !strings.Contains(consumer.output(), fmt.Sprintf("value=%q", v)) {
			t.Errorf("the consumer did not print %s", v)
		}
	}
	consumer.signal(t, syscall.SIGTERM)
	if code := consumer.wait(t, 30*time.Second); code != 0 {
		t.Errorf("the consumer exited %d after SIGTERM, want 0", code)
	}
}

// outCopyTree copies the directory src to dst, without what builds and
// test runs leave beside the sources (caches, build output).
func outCopyTree(t testing.TB, src, dst string) {
	t.Helper()
	skip := map[string]bool{"__pycache__": true, ".pytest_cache": true, "build": true, "dist": true}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (skip[d.Name()] || strings.HasSuffix(d.Name(), ".egg-info")) {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}

// outPyVersion matches the line of the Python client's version.
var outPyVersion = regexp.MustCompile(`(?m)^__version__ = "[^"]*"$`)

// The Python client used as a user outside this repository uses it: in a
// copy of clients/python whose version is set in its one place (as a
// release does), the wheel is built with the command docs/releasing.md
// gives; installed with the user's commands into a fresh virtualenv in a
// temporary directory, offline (pip's index is bin/deps' wheelhouse: the
// wheels of setuptools and protobuf), the package and its metadata carry
// that version; and clients/python/examples/tail.py, run from there with
// that virtualenv, receives the messages produced and acks them: the daemon
// commits their offsets.
func TestPythonWheelFromOutsideTheRepository(t *testing.T) {
	t.Parallel()
	const partitions, n, version = 2, 6, "0.99.0"
	venvBin := filepath.Dir(pyPython(t))
	wheelhouse := filepath.Join(filepath.Dir(venvBin), "wheelhouse")
	if _, err := os.Stat(wheelhouse); err != nil {
		t.Fatalf("the wheelhouse of the Python client's build and dependencies is missing (%v): run bin/deps", err)
	}
	env := []string{
		// python3 is the tests' virtualenv's, which has pip (Debian's python3 may not).
		"PATH=" + venvBin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"PIP_NO_INDEX=1", "PIP_FIND_LINKS=" + wheelhouse, "PIP_DISABLE_PIP_VERSION_CHECK=1",
		"PYTHONPATH=", "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1",
	}

	src := t.TempDir()
	outCopyTree(t, filepath.Join(outRoot, "clients", "python"), filepath.Join(src, "clients", "python"))
	initPy := filepath.Join(src, "clients", "python", "src", "fanout_client", "__init__.py")
	b, err := os.ReadFile(initPy)
	if err != nil {
		t.Fatal(err)
	}
	if !outPyVersion.Match(b) {
		t.Fatalf("%s sets no __version__", initPy)
	}
	if err := os.WriteFile(initPy, outPyVersion.ReplaceAll(b, []byte(`__version__ = "`+version+`"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	outShell(t, src, env, docBlock(t, "docs/releasing.md", "build the Python wheel"))
	wheels, _ := filepath.Glob(filepath.Join(src, "dist", "fanout_client-*.whl"))
	wheelName := "fanout_client-" + version + "-py3-none-any.whl"
	if len(wheels) != 1 || filepath.Base(wheels[0]) != wheelName {
		t.Fatalf("the build made %q, want %s alone", wheels, wheelName)
	}

	user := t.TempDir()
	wheel, err := os.ReadFile(wheels[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(user, wheelName), wheel, 0o644); err != nil {
		t.Fatal(err)
	}
	outShell(t, user, env, docBlock(t, "docs/releasing.md", "install the Python client"))
	python := filepath.Join(user, "venv", "bin", "python")
	got := strings.Fields(outShell(t, user, env, python+` -c 'import importlib.metadata, fanout_client
print(fanout_client.__file__, fanout_client.__version__, importlib.metadata.version("fanout-client"))'`))
	if len(got) != 3 || !strings.HasPrefix(got[0], filepath.Join(user, "venv")+string(filepath.Separator)) {
		t.Fatalf("the virtualenv imports fanout_client as %q, want it from %s", got, filepath.Join(user, "venv"))
	}
	if got[1] != version || got[2] != version {
		t.Errorf("fanout_client.__version__ %s, installed metadata %s: want %s for both", got[1], got[2], version)
	}

	topic, id := uniqueName(t, "topic"), uniqueName(t, "svc")
	createTopic(t, topic, partitions)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr)...)
	values := produceSeq(t, topic, "wheel", n, partitions)
	tail, err := os.ReadFile(filepath.Join(outRoot, "clients", "python", "examples", "tail.py"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(user, "tail.py"), tail, 0o644); err != nil {
		t.Fatal(err)
	}
	out := outShell(t, user, env, fmt.Sprintf("%s tail.py --connect %s --count %d --json --timeout 60", python, addr, n))
	for _, v := range values {
		if !strings.Contains(out, fmt.Sprintf("%q", v)) {
			t.Errorf("tail.py did not print %s:\n%s", v, out)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool {
		var sum int64
		for _, o := range zkOffsets(t, id, topic) {
			sum += o
		}
		return sum == n
	})
}
