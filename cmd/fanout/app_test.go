package main

import (
	"context"
	"sync"

	"github.com/urfave/cli/v2"
)

// The tests of this package run in parallel, apps included, but urfave/cli
// is not safe for two apps that set up at once: setting up an app or a
// command and parsing its flags write package variables of the library
// (cli.HelpFlag's fields, in its Apply; the fields of the help command it
// shares among all apps), so two apps parsing their flags at the same time
// race. runCLI serializes that part, from the start of a run until the app's
// action begins (or the run ends, as on bad flags or --help); the actions,
// the part that takes time (a daemon, a dev broker, a tail, a produce), run
// in parallel.
//
// What stays sequential (no t.Parallel): the tests that set the environment
// (t.Setenv, withEnviron), the tests that call run (it builds its app
// itself, out of runCLI's reach), and the tests that read what an app logs
// through the standard logrus logger (each app's setupLogging points it at
// that app's stderr, so with apps in parallel a line may land in another's).

// setup is held by the app that is setting up.
var setup sync.Mutex

// runCLI runs app with args (args[0] the program name) and ctx, holding
// setup until one of its actions begins.
func runCLI(ctx context.Context, app *cli.App, args []string) error {
	setup.Lock()
	var once sync.Once
	release := func() { once.Do(setup.Unlock) }
	defer release()
	app.Action = releasing(app.Action, release)
	releaseCommands(app.Commands, release)
	return app.RunContext(ctx, args)
}

// releaseCommands makes the actions of cmds and of their subcommands call
// release first. It changes only the app's own commands: the help command
// urfave/cli adds at setup is its own package variable.
func releaseCommands(cmds []*cli.Command, release func()) {
	for _, c := range cmds {
		c.Action = releasing(c.Action, release)
		releaseCommands(c.Subcommands, release)
	}
}

// releasing returns action preceded by release (nil stays nil: urfave/cli
// gives a command without an action its help).
func releasing(action cli.ActionFunc, release func()) cli.ActionFunc {
	if action == nil {
		return nil
	}
	return func(c *cli.Context) error {
		release()
		return action(c)
	}
}
