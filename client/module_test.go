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

// An application on oldestGo imports the client: its go.mod stays at that
// Go after go mod tidy (which raises it to the highest go directive of the
// modules it builds from), and it builds. The client and protocol are
// modules of their own for this: the daemon's module needs a newer Go. It
// runs offline, from the module cache.
func TestImportableFromOlderGo(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	clientDir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	protocolDir := filepath.Join(filepath.Dir(clientDir), "protocol")
	want := oldestGo
	for _, mod := range []string{"go.mod", filepath.Join(protocolDir, "go.mod")} {
		if got := goLine(t, mod); got != want {
			t.Errorf("%s: go %s, want %s (oldestGo)", mod, got, want)
		}
	}
	app := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/app\n\ngo "+want+"\n\n"+
		"require github.com/nanoservice/core-fanout/client v0.0.0\n\n"+
		"replace github.com/nanoservice/core-fanout/client => "+clientDir+"\n\n"+
		"replace github.com/nanoservice/core-fanout/protocol => "+protocolDir+"\n")
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
	run := func(args ...string) {
		cmd := exec.Command("go", args...)
		cmd.Dir = app
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// -e: the tests of the dependencies need modules the cache may lack
	// (go-cmp, for protobuf's tests) and GOPROXY is off; tidy goes on
	// without them, and still raises the go directive as it must.
	run("mod", "tidy", "-e")
	if got := goLine(t, filepath.Join(app, "go.mod")); got != want {
		t.Fatalf("go mod tidy raised the application's go directive from %s to %s: a module it builds from needs a newer Go", want, got)
	}
	run("vet", ".")
	run("build", "-o", filepath.Join(app, "app"), ".")
}
