package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// Secrets have no flag of their own: a command line is visible to every
// user of the host (ps, /proc). Each comes from its environment variable
// FANOUT_<NAME> or from the file that its --<name>-file flag names.
const (
	secretKafkaPassword = "KAFKA_SASL_PASSWORD" // --kafka-sasl-password-file
	secretZooKeeperAuth = "ZOOKEEPER_AUTH"      // --zookeeper-auth-file
	secretMetricsToken  = "METRICS_TOKEN"       // --metrics-token-file
	secretCluster       = "CLUSTER_SECRET"      // --cluster-secret-file
)

// secrets lists the daemon's secrets: the variables FANOUT_<name> it reads
// beside its flags' (deployment manifests are checked against both).
var secrets = []string{secretKafkaPassword, secretZooKeeperAuth, secretMetricsToken, secretCluster}

// secretFlag is the --<name>-file flag of the secret FANOUT_<name>.
func secretFlag(name string) string {
	return strings.ReplaceAll(strings.ToLower(name), "_", "-") + "-file"
}

// flagValues reads flags by name; serve's looks at both command levels.
type flagValues struct {
	str     func(string) string
	boolean func(string) bool
	num     func(string) int
}

func contextValues(c *cli.Context) flagValues {
	return flagValues{str: c.String, boolean: c.Bool, num: c.Int}
}

// readSecret returns the secret FANOUT_<name> from env, or the content of
// the file its --<name>-file flag names (without a final line break); ""
// when neither is set. Both set is an error, so is an unreadable or empty
// file. Errors never contain the secret.
func readSecret(env []string, f flagValues, name string) (string, error) {
	envName, flag := "FANOUT_"+name, secretFlag(name)
	var value string
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == envName {
			value = v
		}
	}
	path := f.str(flag)
	switch {
	case path == "":
		return value, nil
	case value != "":
		return "", fmt.Errorf("--%s and %s are both set: use one", flag, envName)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	secret := strings.TrimRight(string(b), "\r\n")
	if secret == "" {
		return "", fmt.Errorf("--%s %s: the file is empty", flag, path)
	}
	return secret, nil
}

// kafkaSecurityFlags are the Kafka TLS and SASL flags of serve, produce and
// status.
func kafkaSecurityFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return []cli.Flag{
		&cli.BoolFlag{Name: "kafka-tls", Usage: "connect to Kafka over TLS (implied by any --kafka-tls-* flag)", EnvVars: env("KAFKA_TLS")},
		&cli.StringFlag{Name: "kafka-tls-ca", Usage: "PEM file of the CA that signs the brokers' certificates (default: the system's roots)", EnvVars: env("KAFKA_TLS_CA")},
		&cli.StringFlag{Name: "kafka-tls-cert", Usage: "PEM file of a client certificate, for brokers that require one", EnvVars: env("KAFKA_TLS_CERT")},
		&cli.StringFlag{Name: "kafka-tls-key", Usage: "PEM file of the client certificate's key", EnvVars: env("KAFKA_TLS_KEY")},
		&cli.BoolFlag{Name: "kafka-tls-insecure-skip-verify", Usage: "do not verify the brokers' certificates (tests only)", EnvVars: env("KAFKA_TLS_INSECURE_SKIP_VERIFY")},
		&cli.StringFlag{Name: "kafka-sasl-mechanism", Usage: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default: no SASL)", EnvVars: env("KAFKA_SASL_MECHANISM")},
		&cli.StringFlag{Name: "kafka-sasl-user", Usage: "SASL user name", EnvVars: env("KAFKA_SASL_USER")},
		&cli.StringFlag{Name: secretFlag(secretKafkaPassword), Usage: "file holding the SASL password (or set FANOUT_" + secretKafkaPassword + ")", EnvVars: env(secretKafkaPassword + "_FILE")},
	}
}

// kafkaSecurity maps the Kafka security flags and the password onto
// kafka.Security (not yet validated).
func kafkaSecurity(env []string, f flagValues) (kafka.Security, error) {
	password, err := readSecret(env, f, secretKafkaPassword)
	if err != nil {
		return kafka.Security{}, err
	}
	return kafka.Security{
		TLS: f.boolean("kafka-tls"),
		TLSFiles: tlsconf.Files{
			CA: f.str("kafka-tls-ca"), Cert: f.str("kafka-tls-cert"), Key: f.str("kafka-tls-key"),
			InsecureSkipVerify: f.boolean("kafka-tls-insecure-skip-verify"),
		},
		SASLMechanism: f.str("kafka-sasl-mechanism"),
		SASLUser:      f.str("kafka-sasl-user"),
		SASLPassword:  password,
	}, nil
}

// zookeeperSecurityFlags are the ZooKeeper authentication, ACL and TLS
// flags of serve and status.
func zookeeperSecurityFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return []cli.Flag{
		&cli.StringFlag{Name: secretFlag(secretZooKeeperAuth), Usage: "file holding the ZooKeeper digest identity user:password (or set FANOUT_" + secretZooKeeperAuth + "); znodes fanout creates are then writable by it alone", EnvVars: env(secretZooKeeperAuth + "_FILE")},
		&cli.StringFlag{Name: "zookeeper-acl-read", Value: zkstore.ReadWorld, Usage: "who may read the znodes fanout creates: world, or auth (the --zookeeper-auth identity alone)", EnvVars: env("ZOOKEEPER_ACL_READ")},
		&cli.BoolFlag{Name: "zookeeper-tls", Usage: "connect to ZooKeeper's secure client port over TLS (implied by any --zookeeper-tls-* flag)", EnvVars: env("ZOOKEEPER_TLS")},
		&cli.StringFlag{Name: "zookeeper-tls-ca", Usage: "PEM file of the CA that signs ZooKeeper's certificate (default: the system's roots)", EnvVars: env("ZOOKEEPER_TLS_CA")},
		&cli.StringFlag{Name: "zookeeper-tls-cert", Usage: "PEM file of a client certificate, for servers that require one", EnvVars: env("ZOOKEEPER_TLS_CERT")},
		&cli.StringFlag{Name: "zookeeper-tls-key", Usage: "PEM file of the client certificate's key", EnvVars: env("ZOOKEEPER_TLS_KEY")},
		&cli.BoolFlag{Name: "zookeeper-tls-insecure-skip-verify", Usage: "do not verify ZooKeeper's certificate (tests only)", EnvVars: env("ZOOKEEPER_TLS_INSECURE_SKIP_VERIFY")},
	}
}

// zookeeperSecurity maps the ZooKeeper security flags and the digest
// identity onto zkstore.Security (not yet validated).
func zookeeperSecurity(env []string, f flagValues) (zkstore.Security, error) {
	auth, err := readSecret(env, f, secretZooKeeperAuth)
	if err != nil {
		return zkstore.Security{}, err
	}
	return zkstore.Security{
		Auth:    auth,
		ReadACL: f.str("zookeeper-acl-read"),
		TLS:     f.boolean("zookeeper-tls"),
		TLSFiles: tlsconf.Files{
			CA: f.str("zookeeper-tls-ca"), Cert: f.str("zookeeper-tls-cert"), Key: f.str("zookeeper-tls-key"),
			InsecureSkipVerify: f.boolean("zookeeper-tls-insecure-skip-verify"),
		},
	}, nil
}

// clientTLSFlags are the flags of a tool that connects to the daemons'
// client listener over TLS (tail).
func clientTLSFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return []cli.Flag{
		&cli.StringFlag{Name: "tls-ca", Usage: "connect over TLS, verifying the daemons' certificates against this PEM CA file (implied by any --tls-* flag; default: the system's roots)", EnvVars: env("CLIENT_TLS_CA")},
		&cli.StringFlag{Name: "tls-cert", Usage: "PEM file of this client's certificate, for daemons with --tls-client-ca (mutual TLS)", EnvVars: env("CLIENT_TLS_CERT")},
		&cli.StringFlag{Name: "tls-key", Usage: "PEM file of the --tls-cert certificate's key", EnvVars: env("CLIENT_TLS_KEY")},
		&cli.StringFlag{Name: "tls-server-name", Usage: "name every daemon's certificate must carry (default: the host of each address connected to)", EnvVars: env("CLIENT_TLS_SERVER_NAME")},
	}
}

// clientTLS returns the TLS configuration of the client TLS flags, or nil
// when none is set (plain text).
func clientTLS(f flagValues) (*tls.Config, error) {
	files := tlsconf.Files{CA: f.str("tls-ca"), Cert: f.str("tls-cert"), Key: f.str("tls-key")}
	name := f.str("tls-server-name")
	if !files.Set() && name == "" {
		return nil, nil
	}
	cfg, err := files.Config()
	if err != nil {
		return nil, fmt.Errorf("--tls-*: %w", err)
	}
	cfg.ServerName = name
	return cfg, nil
}

// metricsTokenFlag is serve's --metrics-token-file.
func metricsTokenFlag() cli.Flag {
	return &cli.StringFlag{Name: secretFlag(secretMetricsToken), Usage: "file holding the bearer token /metrics and the console's /api/status require (or set FANOUT_" + secretMetricsToken + "); /healthz, /readyz and the console's page stay open", EnvVars: []string{"FANOUT_" + secretMetricsToken + "_FILE"}}
}

// clusterSecretFlag is serve's --cluster-secret-file.
func clusterSecretFlag() cli.Flag {
	return &cli.StringFlag{Name: secretFlag(secretCluster), Usage: "file holding the secret that authenticates the heartbeats of the cluster (or set FANOUT_" + secretCluster + "); the same on every member, at least 16 bytes", EnvVars: []string{"FANOUT_" + secretCluster + "_FILE"}}
}

// warn prints what is legal but unsafe in a tool's options (produce,
// status) to w, one line each.
func warn(w io.Writer, warnings []string) {
	for _, msg := range warnings {
		fmt.Fprintln(w, "fanout: warning:", msg)
	}
}
