package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout"
)

// healthcheckCommand asks the daemon on this host whether it is ready, for
// container health checks (the distroless image has no curl).
func healthcheckCommand() *cli.Command {
	return &cli.Command{
		Name:  "healthcheck",
		Usage: "exit 0 when the daemon on this host is ready (its /readyz answers 200), else 1",
		Description: "Asks /readyz on the daemon's --metrics-listen address (the same flag and FANOUT_METRICS_LISTEN\n" +
			"variable as the daemon's, so a container's environment serves both), on loopback when the address\n" +
			"names no host. Prints the daemon's answer: its role, or why it is not ready.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "metrics-listen", Value: fanout.DefaultMetricsListen, Usage: "the daemon's --metrics-listen", EnvVars: []string{"FANOUT_METRICS_LISTEN"}},
			&cli.DurationFlag{Name: "timeout", Value: 3 * time.Second, Usage: "give up after this long"},
		},
		OnUsageError: commandUsageError,
		Action:       healthcheck,
	}
}

func healthcheck(c *cli.Context) error {
	if c.Args().Present() {
		return usageError(fmt.Errorf("unexpected argument %q", c.Args().First()))
	}
	url, err := readyzURL(c.String("metrics-listen"))
	if err != nil {
		return usageError(err)
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usageError(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return cli.Exit(fmt.Sprintf("not ready: %v", err), 1)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	answer := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return cli.Exit(fmt.Sprintf("not ready (%s): %s", resp.Status, answer), 1)
	}
	fmt.Fprintln(c.App.Writer, answer)
	return nil
}

// readyzURL is the /readyz URL of a daemon listening on addr (host:port): on
// loopback when the host is empty or unspecified.
func readyzURL(addr string) (string, error) {
	if addr == "" {
		return "", fmt.Errorf("--metrics-listen is empty: the daemon serves no /readyz to ask")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--metrics-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}
