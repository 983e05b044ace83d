package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goLine returns the go directive of the go.mod file at path.
func goLine(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(b)
	if m == nil {
		tb.Fatalf("%s has no go directive", path)
	}
	return string(m[1])
}

// oldestGo is the oldest Go that applications importing the client may
// use, as docs/clients.md says: the go directive of google.golang.org/protobuf,
// which protocol needs.
const oldestGo = "1.23"

// whyOldestGo ends every failure of TestImportableFromOlderGo: the rule the
// failure breaks and why it exists, for whoever meets it first.
const whyOldestGo = "\n\nThe client module (the client and client/protocol, their tests included) stays on Go " + oldestGo +
	", the oldest Go google.golang.org/protobuf supports, and uses nothing newer, so that an application on Go " + oldestGo +
	" can import it: a module's go directive is a minimum for every module built from it (go mod tidy raises an " +
	"application's go line to the highest one it builds from). Use what Go " + oldestGo + " has (no testing/synctest, " +
	"T.Context or B.Loop in the tests either); see the package documentation (go doc ./client, the Go version)."

// An application on oldestGo imports the client: its go.mod stays at that
// Go after go mod tidy (which raises it to the highest go directive of the
// modules it builds from), and it builds. The client, with the protocol
// package inside, is a module of its own for this: the daemon's module needs
// a newer Go. The module's own code and tests use no API of the standard
// library newer than oldestGo (go vet's stdversion check: the toolchain that
// runs the tests is newer, and builds such code without a word). It runs
// offline, from the module cache.
func TestImportableFromOlderGo(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	clientDir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	want := oldestGo
	if got := goLine(t, "go.mod"); got != want {
		t.Errorf("go.mod: go %s, want %s (oldestGo)%s", got, want, whyOldestGo)
	}
	app := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/app\n\ngo "+want+"\n\n"+
		"require github.com/nanoservice/core-fanout/client v0.0.0\n\n"+
		"replace github.com/nanoservice/core-fanout/client => "+clientDir+"\n")
	write("main.go", `package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/nanoservice/core-fanout/client"
)

func main() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.Config{Addrs: []string{"localhost:4987"}, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		panic(err)
	}
	defer c.Shutdown(ctx)
	_ = c.Consume(ctx, 4, func(ctx context.Context, m *client.Message) error { return nil })
}
`)
	goIn := func(dir string, args ...string) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s (in %s): %v\n%s%s", strings.Join(args, " "), dir, err, out, whyOldestGo)
		}
	}
	run := func(args ...string) { goIn(app, args...) }
	// -e: the tests of the dependencies need modules the cache may lack
	// (go-cmp, for protobuf's tests) and GOPROXY is off; tidy goes on
	// without them, and still raises the go directive as it must.
	run("mod", "tidy", "-e")
	if got := goLine(t, filepath.Join(app, "go.mod")); got != want {
		t.Fatalf("go mod tidy raised the application's go directive from %s to %s: a module it builds from needs a newer Go%s",
			want, got, whyOldestGo)
	}
	run("vet", ".")
	run("build", "-o", filepath.Join(app, "app"), ".")
	goIn(clientDir, "vet", "-stdversion", "./...")
}

// The client's go.mod names no other module of this repository and
// replaces nothing: a replace directive counts only in the main module, so an
// application importing the client would have to find such a module on a
// proxy, at the version named (integration's
// TestGoClientFromOutsideTheRepository builds one that way, from a proxy).
func TestModuleNeedsNothingElseOfThisRepository(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if fields[0] == "replace" {
			t.Errorf("go.mod:%d: %s: a replace directive, which an application importing the client ignores", i+1, line)
		}
		for _, f := range fields {
			if strings.HasPrefix(f, "github.com/nanoservice/") && f != "github.com/nanoservice/core-fanout/client" {
				t.Errorf("go.mod:%d: %s: names another module of this repository", i+1, line)
			}
		}
	}
}
