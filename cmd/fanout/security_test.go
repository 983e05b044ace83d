package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

const testSecret = "s3cret-never-on-a-command-line"

// withEnviron makes environ() return env for the test.
func withEnviron(t *testing.T, env ...string) {
	t.Helper()
	old := environ
	environ = func() []string { return env }
	t.Cleanup(func() { environ = old })
}

// writeSecret writes content to a file in a temporary directory.
func writeSecret(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// parseServe parses args as the daemon's command line with env and returns
// the options, or the error serveOptions gives.
func parseServe(t *testing.T, env []string, args ...string) (fanout.Options, error) {
	t.Helper()
	var got fanout.Options
	var perr error
	app := newApp(io.Discard, io.Discard)
	capture := func(c *cli.Context) error { got, perr = serveOptions(c, env); return nil }
	app.Action = capture
	app.Command("serve").Action = capture
	if err := runCLI(context.Background(), app, append([]string{"fanout", "--id", "a", "--topic", "t"}, args...)); err != nil {
		t.Fatal(err)
	}
	return got, perr
}

func TestSecretsFromEnvironmentOrFile(t *testing.T) {
	t.Parallel()
	file := writeSecret(t, testSecret+"\n")
	opts, err := parseServe(t, []string{"FANOUT_KAFKA_SASL_PASSWORD=" + testSecret, "FANOUT_METRICS_TOKEN=tok"},
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "fanout", "--zookeeper-auth-file", file,
		"--cluster-secret-file", file, "--auth-tokens-file", file, "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	if opts.KafkaSecurity.SASLPassword != testSecret || opts.KafkaSecurity.SASLUser != "fanout" ||
		opts.KafkaSecurity.SASLMechanism != "SCRAM-SHA-512" {
		t.Errorf("Kafka SASL from FANOUT_KAFKA_SASL_PASSWORD: %+v", opts.KafkaSecurity)
	}
	if opts.ZooKeeperSecurity.Auth != testSecret {
		t.Errorf("ZooKeeper auth from --zookeeper-auth-file (line break dropped): %q", opts.ZooKeeperSecurity.Auth)
	}
	if opts.MetricsToken != "tok" {
		t.Errorf("metrics token from FANOUT_METRICS_TOKEN: %q", opts.MetricsToken)
	}
	if opts.ClusterSecret != testSecret {
		t.Errorf("cluster secret from --cluster-secret-file: %q", opts.ClusterSecret)
	}
	if opts.AuthTokensFile != file {
		t.Errorf("--auth-tokens-file: %q", opts.AuthTokensFile)
	}
	if f := opts.ClientTLS; f.Cert != "c.pem" || f.Key != "k.pem" || f.ClientCA != "ca.pem" {
		t.Errorf("client listener TLS files: %+v", f)
	}
	if opts.ZooKeeperSecurity.ReadACL != "world" {
		t.Errorf("--zookeeper-acl-read default %q, want world", opts.ZooKeeperSecurity.ReadACL)
	}

	// A flag given before the serve command counts too.
	opts, err = parseServe(t, nil, "--kafka-sasl-password-file", file, "--kafka-tls", "serve", "--kafka-sasl-user", "u")
	if err != nil {
		t.Fatal(err)
	}
	if opts.KafkaSecurity.SASLPassword != testSecret || !opts.KafkaSecurity.TLS || opts.KafkaSecurity.SASLUser != "u" {
		t.Errorf("flags at both levels: %+v", opts.KafkaSecurity)
	}
}

func TestSecretSourcesConflictOrFail(t *testing.T) {
	t.Parallel()
	file := writeSecret(t, testSecret)
	empty := writeSecret(t, "\n")
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"both sources", []string{"FANOUT_KAFKA_SASL_PASSWORD=" + testSecret}, []string{"--kafka-sasl-password-file", file},
			"--kafka-sasl-password-file and FANOUT_KAFKA_SASL_PASSWORD are both set"},
		{"unreadable file", nil, []string{"--zookeeper-auth-file", missing}, "--zookeeper-auth-file: open " + missing},
		{"empty file", nil, []string{"--metrics-token-file", empty}, "the file is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseServe(t, tt.env, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("serveOptions = %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), testSecret) {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
}

// Bad security flags exit 2 with a clear message, for serve, produce and
// status alike, and never print a secret.
func TestBadSecurityFlagsExitTwo(t *testing.T) {
	files := testutil.NewTLSFiles(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	daemon := []string{"--id", "svc", "--topic", "t"}
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"bad mechanism", nil, append(daemon, "--kafka-sasl-mechanism", "GSSAPI", "--kafka-sasl-user", "u"), `--kafka-sasl-mechanism "GSSAPI"`},
		{"no password source", nil, append(daemon, "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "u"),
			"no password: set FANOUT_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file"},
		{"no user", []string{"FANOUT_KAFKA_SASL_PASSWORD=" + testSecret}, append(daemon, "--kafka-sasl-mechanism", "PLAIN"), "--kafka-sasl-user: required"},
		{"password as a flag", nil, append(daemon, "--kafka-sasl-password", testSecret), "unknown flag --kafka-sasl-password: a secret is read from a file (--kafka-sasl-password-file) or the environment (FANOUT_KAFKA_SASL_PASSWORD), never from a flag"},
		{"CA unreadable", nil, append(daemon, "--kafka-tls-ca", missing), "--kafka-tls: CA file: open " + missing},
		{"client key unreadable", nil, append(daemon, "--kafka-tls-cert", files.ClientCert, "--kafka-tls-key", missing), missing},
		{"certificate without key", nil, append(daemon, "--kafka-tls-cert", files.ClientCert), "needs both"},
		{"zookeeper auth without password", []string{"FANOUT_ZOOKEEPER_AUTH=fanout"}, daemon, "--zookeeper-auth: want user:password"},
		{"zookeeper acl read", nil, append(daemon, "--zookeeper-acl-read", "nobody"), `--zookeeper-acl-read "nobody"`},
		{"zookeeper acl read auth without auth", nil, append(daemon, "--zookeeper-acl-read", "auth"), "needs --zookeeper-auth"},
		{"zookeeper CA unreadable", nil, append(daemon, "--zookeeper-tls-ca", missing), "--zookeeper-tls: CA file"},
		{"metrics token with spaces", []string{"FANOUT_METRICS_TOKEN= " + testSecret}, daemon, "white space"},
		{"auth tokens file unreadable", nil, append(daemon, "--auth-tokens-file", missing), "--auth-tokens-file: stat " + missing},
		{"short cluster secret", []string{"FANOUT_CLUSTER_SECRET=abc"}, daemon, "shorter than 16 bytes"},
		{"TLS certificate unreadable", nil, append(daemon, "--tls-cert", missing, "--tls-key", missing), "client listener TLS: TLS certificate " + missing},
		{"tail: client key without certificate", nil, []string{"tail", "--tls-key", missing}, "needs both"},
		{"produce: bad mechanism", nil, []string{"produce", "--topic", "t", "--kafka-sasl-mechanism", "md5"}, `--kafka-sasl-mechanism "md5"`},
		{"produce: no password source", nil, []string{"produce", "--topic", "t", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u"}, "no password"},
		{"produce: CA unreadable", nil, []string{"produce", "--topic", "t", "--kafka-tls-ca", missing}, missing},
		{"status: no password source", nil, []string{"status", "--id", "svc", "--topic", "t", "--kafka-sasl-mechanism", "SCRAM-SHA-256", "--kafka-sasl-user", "u"}, "no password"},
		{"status: zookeeper auth file unreadable", nil, []string{"status", "--id", "svc", "--topic", "t", "--zookeeper-auth-file", missing}, missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withEnviron(t, tt.env...)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"fanout"}, tt.args...), &stdout, &stderr)
			if code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr does not say %q:\n%s", tt.want, stderr.String())
			}
			if strings.Contains(stderr.String()+stdout.String(), testSecret) {
				t.Fatalf("the output shows the secret:\n%s", stderr.String())
			}
		})
	}
}

// produce and status warn, as the daemon does, about a broker certificate
// that is not verified.
func TestToolsWarnAboutInsecureTLS(t *testing.T) {
	for _, args := range [][]string{
		{"produce", "--topic", "t", "--kafka", "127.0.0.1:1", "--kafka-tls-insecure-skip-verify"},
		{"status", "--id", "s", "--topic", "t", "--kafka", "127.0.0.1:1", "--zookeeper", "127.0.0.1:1",
			"--timeout", "100ms", "--kafka-tls-insecure-skip-verify"},
	} {
		withEnviron(t)
		var stdout, stderr bytes.Buffer
		app := newApp(&stdout, &stderr)
		app.Reader = strings.NewReader("")
		_ = runCLI(context.Background(), app, append([]string{"fanout"}, args...))
		if !strings.Contains(stderr.String(), "fanout: warning: --kafka-tls-insecure-skip-verify") {
			t.Errorf("%s: no warning about --kafka-tls-insecure-skip-verify:\n%s", args[0], stderr.String())
		}
	}
}
