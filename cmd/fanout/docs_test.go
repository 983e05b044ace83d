package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/internal/doccheck"
)

// helpFlag is one flag as `fanout --help` lists it.
type helpFlag struct {
	env, def string // its environment variable, its default ("" when none)
}

var (
	helpFlagRE    = regexp.MustCompile(`^\s+--([a-z0-9-]+)`)
	helpEnvRE     = regexp.MustCompile(`\[\$([A-Z0-9_]+)\]\s*$`)
	helpDefaultRE = regexp.MustCompile(`\(default: "?([^")]*)"?\)`)
)

// daemonHelp returns the daemon's flags from `fanout --help`.
func daemonHelp(t *testing.T) map[string]helpFlag {
	t.Helper()
	var out bytes.Buffer
	if err := runCLI(context.Background(), newApp(&out, io.Discard), []string{"fanout", "--help"}); err != nil {
		t.Fatal(err)
	}
	_, options, ok := strings.Cut(out.String(), "GLOBAL OPTIONS:\n")
	if !ok {
		t.Fatalf("fanout --help has no GLOBAL OPTIONS:\n%s", out.String())
	}
	flags := map[string]helpFlag{}
	for _, line := range strings.Split(options, "\n") {
		m := helpFlagRE.FindStringSubmatch(line)
		if m == nil || m[1] == "help" || m[1] == "version" {
			continue
		}
		var f helpFlag
		if e := helpEnvRE.FindStringSubmatch(line); e != nil {
			f.env = e[1]
		}
		if d := helpDefaultRE.FindStringSubmatch(line); d != nil {
			f.def = d[1]
		}
		flags[m[1]] = f
	}
	if len(flags) < 20 {
		t.Fatalf("fanout --help lists %d flags:\n%s", len(flags), out.String())
	}
	return flags
}

// docRow is one row of the flag table of docs/flags.md.
type docRow struct {
	env, def string // as the table writes them
}

var (
	rowRE     = regexp.MustCompile("^\\| ((?:`-[^`]+`(?:, )?)+) \\| `([A-Z0-9_]+)` \\| ([^|]*) \\|")
	rowFlagRE = regexp.MustCompile("`--([a-z0-9-]+)`")
	literalRE = regexp.MustCompile("^`([^`]*)`")
)

// flagTable reads the flag table of docs/flags.md.
func flagTable(t *testing.T) map[string]docRow {
	t.Helper()
	doc, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]docRow{}
	for _, line := range strings.Split(string(doc), "\n") {
		m := rowRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, f := range rowFlagRE.FindAllStringSubmatch(m[1], -1) {
			if _, dup := rows[f[1]]; dup {
				t.Errorf("docs/flags.md documents --%s twice", f[1])
			}
			rows[f[1]] = docRow{env: m[2], def: strings.TrimSpace(m[3])}
		}
	}
	return rows
}

// The flag table of docs/flags.md is the daemon's flags as `fanout --help`
// lists them: every flag the daemon has is documented, with its
// environment variable, and every flag the table names exists; a default
// the table writes as a literal is the daemon's.
func TestDocsFlagTable(t *testing.T) {
	t.Parallel()
	help, rows := daemonHelp(t), flagTable(t)
	for name, f := range help {
		row, ok := rows[name]
		switch {
		case !ok:
			t.Errorf("docs/flags.md does not document --%s", name)
		case row.env != f.env:
			t.Errorf("docs/flags.md: --%s has the environment variable %s, the daemon %s", name, row.env, f.env)
		}
		if m := literalRE.FindStringSubmatch(row.def); ok && m != nil && f.def != "" && m[1] != f.def {
			t.Errorf("docs/flags.md: --%s defaults to %q, the daemon to %q", name, m[1], f.def)
		}
	}
	for name := range rows {
		if _, ok := help[name]; !ok {
			t.Errorf("docs/flags.md documents --%s, which the daemon does not have", name)
		}
	}
}

// docCommand is what the docs test's app recorded of a command line.
type docCommand struct {
	path []string // the command's names: [] for the daemon, [offsets reset], ...
	ctx  *cli.Context
}

// docsApp is the command's app with every action replaced by one that
// records what ran, so that a command line is parsed, not run.
func docsApp(ran *docCommand) *cli.App {
	app := newApp(io.Discard, io.Discard)
	record := func(path []string) cli.ActionFunc {
		return func(c *cli.Context) error {
			*ran = docCommand{path: path, ctx: c}
			return nil
		}
	}
	app.Action = record(nil)
	var walk func(cmds []*cli.Command, path []string)
	walk = func(cmds []*cli.Command, path []string) {
		for _, c := range cmds {
			p := append(slices.Clone(path), c.Name)
			if c.Action != nil {
				c.Action = record(p)
			}
			walk(c.Subcommands, p)
		}
	}
	walk(app.Commands, nil)
	return app
}

// Every fanout command line of the docs (run by their test or not: those
// against hosts that do not exist here, or files of a deployment) is one
// the command accepts: its flags parse, a daemon's options validate, and
// the values the tools parse themselves (offsets reset --to) are valid.
func TestDocCommandLines(t *testing.T) {
	blocks, err := doccheck.ReadBlocks("../..")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range blocks {
		if b.Lang != "sh" {
			continue
		}
		cmds, err := doccheck.Commands(b.Text)
		if err != nil {
			t.Errorf("%s: %v", b, err)
			continue
		}
		for _, c := range cmds {
			if prog, _ := c.Program(); prog == "fanout" {
				n++
				checkDocCommand(t, b, c)
			}
		}
	}
	if n < 10 {
		t.Errorf("%d fanout command lines in the docs: the parser misses some", n)
	}
}

func checkDocCommand(t *testing.T, b doccheck.Block, c doccheck.Command) {
	t.Helper()
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	_, args := c.Program()
	var ran docCommand
	if err := runCLI(context.Background(), docsApp(&ran), append([]string{"fanout"}, args...)); err != nil {
		t.Errorf("%s: %q: %v", b, c.Line(), err)
		return
	}
	switch strings.Join(ran.path, " ") {
	case "", "serve":
		if ran.ctx.Args().Present() {
			t.Errorf("%s: %q: stray argument %q", b, c.Line(), ran.ctx.Args().First())
		}
		opts, err := serveOptions(ran.ctx, append(os.Environ(), c.Env...))
		if errors.Is(err, fs.ErrNotExist) {
			return // a secret's file of the deployment the example shows
		}
		if err == nil {
			err = opts.Validate()
		}
		if err != nil {
			t.Errorf("%s: %q: %v", b, c.Line(), err)
		}
	case "offsets reset":
		if _, err := parseResetTarget(ran.ctx.String("to")); err != nil {
			t.Errorf("%s: %q: %v", b, c.Line(), err)
		}
		if _, err := parsePartitions(ran.ctx.StringSlice("partitions")); err != nil {
			t.Errorf("%s: %q: %v", b, c.Line(), err)
		}
	}
	for _, kv := range c.Env {
		k, _, _ := strings.Cut(kv, "=")
		os.Unsetenv(k)
	}
}
