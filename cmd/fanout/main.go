// Command fanout is the fanout daemon and its tools.
//
//	fanout --id service_x --topic user_need   # run the daemon
//	fanout tail --connect localhost:4987      # print and ack messages
//
// Run `fanout --help` for every command and flag.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(context.Background(), os.Args, os.Stdout, os.Stderr))
}

// run executes the command line args and returns the process exit code:
// 0 on success, 2 for bad flags or values, 1 for other failures.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	app := newApp(stdout, stderr)
	err := app.RunContext(ctx, args)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "fanout:", err)
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

// usageError marks bad flags or values: exit code 2.
func usageError(err error) error { return cli.Exit(err.Error(), 2) }

func init() {
	// -v is --verbose here, so --version has no short alias.
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version"}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "fanout",
		Usage:     "hand each message of a Kafka topic to one of many TCP clients, with acks and redelivery",
		UsageText: "fanout --id SERVICE_ID --topic TOPIC [flags]\nfanout COMMAND [flags]",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		Flags:     append(logFlags(), serveFlags()...),
		Before:    setupLogging,
		Action:    serve,
		// Errors are printed once, by run, with the right exit code.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   commandUsageError,
		Commands: []*cli.Command{
			{
				Name:         "serve",
				Usage:        "run the daemon (the same as running fanout without a command)",
				Flags:        serveFlags(),
				Action:       serve,
				OnUsageError: commandUsageError,
			},
			produceCommand(),
			devCommand(),
			tailCommand(),
			statusCommand(),
			offsetsCommand(),
			healthcheckCommand(),
			pauseCommand(true),
			pauseCommand(false),
			drainClientCommand(),
			// COMMANDS
		},
	}
}

// commandUsageError is every command's OnUsageError: bad flags exit 2, with
// the parser's terse complaints made plain.
func commandUsageError(c *cli.Context, err error, _ bool) error {
	return usageError(explainUsage(c, err))
}

// badValue matches the flag parser's complaint about a value it cannot
// parse, undefinedFlag the one about a flag it does not know.
var (
	badValue      = regexp.MustCompile(`^invalid value "(.*)" for flag -([\w-]+): parse error$`)
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -+(.+)$`)
)

// explainUsage rewrites the flag parser's terse complaints: a flag it does
// not know gets the nearest one suggested; "invalid value ... parse error"
// says what the flag expects (a duration needs a unit, a number digits).
func explainUsage(c *cli.Context, err error) error {
	if m := undefinedFlag.FindStringSubmatch(err.Error()); m != nil && c != nil && c.Command != nil {
		return unknownFlag(c, m[1])
	}
	m := badValue.FindStringSubmatch(err.Error())
	if m == nil || c == nil {
		return err
	}
	value, name := m[1], m[2]
	for _, f := range append(c.Command.Flags, c.App.Flags...) {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		switch f.(type) {
		case *cli.DurationFlag:
			return fmt.Errorf("--%s %q: not a duration; give a number with a unit, e.g. 5s, 500ms or 1m", name, value)
		case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag, *cli.Uint64Flag:
			return fmt.Errorf("--%s %q: not a whole number", name, value)
		case *cli.BoolFlag:
			return fmt.Errorf("--%s %q: want true or false", name, value)
		}
	}
	return fmt.Errorf("--%s %q: cannot parse the value", name, value)
}

// unknownFlag is the error for a flag the command of c does not have,
// suggesting the one nearest to it.
func unknownFlag(c *cli.Context, name string) error {
	var names []string
	for _, f := range c.Command.Flags {
		names = append(names, f.Names()...)
	}
	path := []string{"--help"}
	for _, ctx := range c.Lineage() {
		if ctx.Command != nil && ctx.Command.Name != "" && ctx.Command.Name != c.App.Name {
			path = append([]string{ctx.Command.Name}, path...)
		}
	}
	help := strings.Join(append([]string{c.App.Name}, path...), " ")
	if slices.Contains(names, name+"-file") {
		// A secret: never a flag, where ps and the shell history show it.
		env := "FANOUT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		return fmt.Errorf("unknown flag --%s: a secret is read from a file (--%s-file) or the environment (%s), never from a flag", name, name, env)
	}
	if near := nearest(name, names); near != "" {
		return fmt.Errorf("unknown flag --%s: did you mean --%s? (%s lists the flags)", name, near, help)
	}
	return fmt.Errorf("unknown flag --%s (%s lists the flags)", name, help)
}

// nearest returns the name of names closest to s when it is close enough
// to be a typo of it: one edit away (a letter missing, extra, wrong, or two
// swapped) for names of up to 5 letters, two for longer ones; else "".
// (urfave/cli's own suggestions always name a flag, however unlike.)
func nearest(s string, names []string) string {
	if len(s) < 2 {
		return ""
	}
	best, limit := "", 1
	if len(s) > 5 {
		limit = 2
	}
	for _, n := range names {
		if d := editDistance(s, n); d <= limit {
			best, limit = n, d-1 // a later name must be closer
		}
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and swaps of adjacent bytes that
// turn a into b.
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// commandNames lists the app's commands for "unexpected argument" errors.
func commandNames(c *cli.Context) string {
	var names []string
	for _, cmd := range c.App.Commands {
		if !cmd.Hidden {
			names = append(names, cmd.Name)
		}
	}
	return strings.Join(names, ", ")
}

func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "debug logs", EnvVars: []string{"FANOUT_VERBOSE"}},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", EnvVars: []string{"FANOUT_LOG_FORMAT"}},
	}
}

// setupLogging configures the standard logrus logger from -v and --log-format.
func setupLogging(c *cli.Context) error {
	logrus.SetOutput(c.App.ErrWriter)
	switch c.String("log-format") {
	case "text":
		logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		logrus.SetFormatter(&logrus.JSONFormatter{})
	default:
		return usageError(fmt.Errorf("--log-format %q: want text or json", c.String("log-format")))
	}
	logrus.SetLevel(logrus.InfoLevel)
	if c.Bool("verbose") {
		logrus.SetLevel(logrus.DebugLevel)
	}
	return nil
}
