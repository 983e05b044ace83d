package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// Defaults of the action commands.
const (
	actionTimeout = 10 * time.Second
	pauseWait     = 30 * time.Second
)

// actionFlags are the flags every action command takes: which daemons to
// ask, with what token, and who asks.
func actionFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "metrics-addr", Value: cli.NewStringSlice("localhost:9100"), EnvVars: []string{"FANOUT_METRICS_ADDR"},
			Usage: "a daemon's metrics listener, host:port or http(s)://host:port (repeat it, or separate with commas, for several)"},
		&cli.StringFlag{Name: secretFlag(secretMetricsToken), EnvVars: []string{"FANOUT_" + secretMetricsToken + "_FILE"},
			Usage: "file holding the daemons' metrics token (or set FANOUT_" + secretMetricsToken + "): actions need it"},
		&cli.StringFlag{Name: "by", Usage: "who asks, for the daemons' logs and status (default: user@host)"},
		&cli.DurationFlag{Name: "timeout", Value: actionTimeout, Usage: "give up on a daemon that has not answered after this long"},
	}
}

func pauseCommand(paused bool) *cli.Command {
	name, verb := "resume", "resume"
	if paused {
		name, verb = "pause", "pause"
	}
	return &cli.Command{
		Name:      name,
		Usage:     verb + " the deliveries of the whole cluster (every member, and the next leader too)",
		UsageText: "fanout " + name + " [--metrics-addr host:port]... [--metrics-token-file FILE] [--wait 30s]",
		Description: "Asks a daemon's metrics listener, with the metrics token (--metrics-token-file or FANOUT_METRICS_TOKEN), to\n" +
			verb + " the cluster's deliveries. Any member will do: the members carry the pause in their heartbeats, and\n" +
			"every member (a new leader too) takes it. While paused, no message is handed out; clients keep their\n" +
			"sessions, their acks count, and ack timeouts run. The first --metrics-addr that answers is asked; then\n" +
			"the command waits until every member says it has taken it (--wait 0: not at all). A daemon without a\n" +
			"metrics token takes no action.",
		Flags: append(actionFlags(),
			&cli.DurationFlag{Name: "wait", Value: pauseWait, Usage: "wait this long for every member to take it; 0: do not wait"}),
		OnUsageError: commandUsageError,
		Action:       func(c *cli.Context) error { return pauseAction(c, paused) },
	}
}

func drainClientCommand() *cli.Command {
	return &cli.Command{
		Name:      "drain-client",
		Usage:     "end a client's sessions gracefully: no more deliveries, what it holds goes to the other clients",
		UsageText: "fanout drain-client [--metrics-addr host:port]... [--metrics-token-file FILE] [--session ID | NAME]",
		Description: "Asks each daemon's metrics listener (--metrics-addr, repeated: in spread mode a client has a session\n" +
			"with every member, in leader mode the leader holds them) to drain the client's sessions: each gets\n" +
			"Goodbye and no more deliveries, its acks still count, and once it holds nothing (or after the daemon's\n" +
			"--drain-timeout) its connection closes and what it still holds goes to the other clients, not counted\n" +
			"as a failed attempt. A client that connects again gets deliveries again. Exits 1 when no daemon had such\n" +
			"a client.",
		Flags: append(actionFlags(),
			&cli.Uint64Flag{Name: "session", Usage: "drain the session of this id (the console's client rows, /api/status) instead of a name"}),
		OnUsageError: commandUsageError,
		Action:       drainClientAction,
	}
}

// actionClient is what an action command needs to ask daemons.
type actionClient struct {
	addrs   []string // base URLs
	token   string
	by      string
	timeout time.Duration
	http    *http.Client
}

// newActionClient reads the action flags.
func newActionClient(c *cli.Context) (*actionClient, error) {
	token, err := readSecret(environ(), contextValues(c), secretMetricsToken)
	if err != nil {
		return nil, err
	}
	if token == "" {
		return nil, errors.New("actions need the metrics token: give --metrics-token-file or set FANOUT_METRICS_TOKEN")
	}
	ac := &actionClient{token: token, by: c.String("by"), timeout: c.Duration("timeout"), http: &http.Client{}}
	for _, a := range splitAll(c.StringSlice("metrics-addr")) {
		u, err := metricsBase(a)
		if err != nil {
			return nil, err
		}
		ac.addrs = append(ac.addrs, u)
	}
	if len(ac.addrs) == 0 {
		return nil, errors.New("--metrics-addr is empty: name a daemon's metrics listener")
	}
	if ac.by == "" {
		ac.by = defaultBy()
	}
	return ac, nil
}

// metricsBase is the base URL of the metrics listener at addr: host:port
// (http), or a URL.
func metricsBase(addr string) (string, error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("--metrics-addr %q: want host:port or http(s)://host:port", addr)
		}
		return strings.TrimRight(u.String(), "/"), nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("--metrics-addr %q: %w", addr, err)
	}
	return "http://" + addr, nil
}

// defaultBy is who asks when --by is not given: user@host.
func defaultBy() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	if host == "" {
		return name
	}
	return name + "@" + host
}

// answer is a daemon's answer to a request.
type answer struct {
	code int
	body []byte
}

// text is the answer's body as one line.
func (a answer) text() string { return strings.TrimSpace(string(a.body)) }

// do sends method path (with body as JSON when not nil) to base and reads
// the answer; an error when the daemon cannot be reached.
func (ac *actionClient) do(ctx context.Context, method, base, path string, body any) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, ac.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+ac.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := ac.http.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return answer{}, fmt.Errorf("%s: read the answer: %w", base, err)
	}
	return answer{code: resp.StatusCode, body: b}, nil
}

// refused says what a refusal of the daemon at base means.
func refused(base string, a answer) error {
	switch a.code {
	case http.StatusUnauthorized:
		return fmt.Errorf("%s refused the metrics token: %s", base, a.text())
	case http.StatusForbidden:
		return fmt.Errorf("%s takes no action: %s", base, a.text())
	}
	return fmt.Errorf("%s answered %d: %s", base, a.code, a.text())
}

func pauseAction(c *cli.Context, paused bool) error {
	if c.Args().Present() {
		return usageError(fmt.Errorf("unexpected argument %q", c.Args().First()))
	}
	ac, err := newActionClient(c)
	if err != nil {
		return usageError(err)
	}
	path := "/api/resume"
	if paused {
		path = "/api/pause"
	}
	var problems []string
	for _, base := range ac.addrs {
		a, err := ac.do(c.Context, http.MethodPost, base, path, console.ActionRequest{By: ac.by})
		switch {
		case err != nil:
			problems = append(problems, err.Error())
			continue
		case a.code == http.StatusServiceUnavailable:
			problems = append(problems, base+": "+a.text())
			continue
		case a.code != http.StatusOK:
			return cli.Exit(refused(base, a).Error(), 1)
		}
		var ans console.PauseAnswer
		if err := json.Unmarshal(a.body, &ans); err != nil || ans.Pause == nil {
			return cli.Exit(fmt.Sprintf("%s: an answer that is not a pause: %q", base, a.text()), 1)
		}
		p := ans.Pause
		fmt.Fprintf(c.App.Writer, "deliveries %s by %s (asked of %s, version %d)\n", pausedWord(p.Paused), p.By, p.Node, p.Version)
		if wait := c.Duration("wait"); wait > 0 {
			return ac.awaitPause(c, base, p, wait)
		}
		return nil
	}
	return cli.Exit("no daemon took it: "+strings.Join(problems, "; "), 1)
}

func pausedWord(paused bool) string {
	if paused {
		return "paused"
	}
	return "resumed"
}

// awaitPause waits until every member the daemon at base hears from says
// it has taken p (or a later pause), printing who has when all have.
func (ac *actionClient) awaitPause(c *cli.Context, base string, p *status.Pause, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	var behind []string
	for {
		a, err := ac.do(c.Context, http.MethodGet, base, "/api/status", nil)
		if err == nil && a.code == http.StatusOK {
			var st status.Status
			if err := json.Unmarshal(a.body, &st); err != nil {
				return cli.Exit(fmt.Sprintf("%s: an unreadable status document: %v", base, err), 1)
			}
			behind = behind[:0]
			var took []string
			for _, m := range st.Members {
				if m.Pause == nil || m.Pause.Version < p.Version {
					behind = append(behind, m.NodeID)
				} else {
					took = append(took, m.NodeID)
				}
			}
			if len(behind) == 0 {
				if len(took) == 0 { // a daemon leading alone: no members but itself
					took = []string{st.Node.NodeID}
				}
				fmt.Fprintf(c.App.Writer, "every member has it: %s\n", strings.Join(took, ", "))
				return nil
			}
		}
		if time.Now().After(deadline) {
			return cli.Exit(fmt.Sprintf("members %s have not said they took it within %v (their heartbeats may be late, or they run a version without pauses)",
				strings.Join(behind, ", "), wait), 1)
		}
		select {
		case <-c.Context.Done():
			return c.Context.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func drainClientAction(c *cli.Context) error {
	session := c.Uint64("session")
	name := c.Args().First()
	if rest := c.Args().Tail(); len(rest) > 0 && !slices.ContainsFunc(rest, func(a string) bool { return a != "-h" && a != "--help" }) {
		// Flags stop at the client's name: a help flag after it still asks for help.
		return cli.ShowCommandHelp(c.Lineage()[1], c.Command.Name)
	}
	switch {
	case c.Args().Len() > 1 && strings.HasPrefix(c.Args().Get(1), "-"):
		return usageError(fmt.Errorf("unexpected argument %q: the flags go before the client's name", c.Args().Get(1)))
	case c.Args().Len() > 1:
		return usageError(fmt.Errorf("unexpected argument %q: one client at a time", c.Args().Get(1)))
	case name == "" && session == 0:
		return usageError(errors.New("name the client: fanout drain-client NAME, or --session ID"))
	case name != "" && session != 0:
		return usageError(errors.New("a NAME or --session, not both"))
	}
	ac, err := newActionClient(c)
	if err != nil {
		return usageError(err)
	}
	drained := 0
	var problems []string
	for _, base := range ac.addrs {
		a, err := ac.do(c.Context, http.MethodPost, base, "/api/drain-client", console.ActionRequest{By: ac.by, Name: name, ID: session})
		switch {
		case err != nil:
			problems = append(problems, err.Error())
			continue
		case a.code == http.StatusNotFound || a.code == http.StatusServiceUnavailable:
			fmt.Fprintf(c.App.Writer, "%s: %s\n", base, a.text())
			continue
		case a.code != http.StatusOK:
			return cli.Exit(refused(base, a).Error(), 1)
		}
		var ans console.DrainAnswer
		if err := json.Unmarshal(a.body, &ans); err != nil {
			return cli.Exit(fmt.Sprintf("%s: an answer that is not a drain: %q", base, a.text()), 1)
		}
		for _, cl := range ans.Drained {
			fmt.Fprintf(c.App.Writer, "%s: draining %s (session %d, %s, holding %d)\n", base, cl.Name, cl.ID, orNone(cl.Addr), cl.InFlight)
		}
		drained += len(ans.Drained)
	}
	if drained == 0 {
		msg := "no daemon had such a client"
		if len(problems) > 0 {
			msg += "; " + strings.Join(slices.Compact(problems), "; ")
		}
		return cli.Exit(msg, 1)
	}
	if len(problems) > 0 {
		fmt.Fprintln(c.App.ErrWriter, "fanout: warning: not asked:", strings.Join(problems, "; "))
	}
	return nil
}
