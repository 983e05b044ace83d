package kafka

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/nanoservice/core-fanout/internal/testutil"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

const (
	testUser     = "fanout"
	testPassword = "kafka-pa55word-never-logged"
)

// secureCluster starts a kfake cluster with TLS (the server certificate of
// files) and SASL, whose only user is testUser with testPassword for
// mechanism. It seeds the topic "t" with 2 partitions.
func secureCluster(t *testing.T, files testutil.TLSFiles, mechanism string) *kfake.Cluster {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "t"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair}}),
		kfake.EnableSASL(), kfake.Superuser(mechanism, testUser, testPassword))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// connect opens a sarama client of c with sec and lists topic t.
func connect(c *kfake.Cluster, sec Security) error {
	cfg, err := sec.Config("security-test")
	if err != nil {
		return err
	}
	cfg.Metadata.Retry.Max = 0
	client, err := sarama.NewClient(c.ListenAddrs(), cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	_, err = client.Partitions("t")
	return err
}

func TestSecurityConfigConnectsWithEachMechanismOverTLS(t *testing.T) {
	t.Parallel()
	files := testutil.NewTLSFiles(t)
	for _, m := range []string{SASLPlain, SASLSCRAMSHA256, SASLSCRAMSHA512} {
		t.Run(m, func(t *testing.T) {
			c := secureCluster(t, files, m)
			sec := Security{TLS: true, TLSFiles: tlsconf.Files{CA: files.CA},
				SASLMechanism: strings.ToLower(m), SASLUser: testUser, SASLPassword: testPassword}
			if err := sec.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if err := connect(c, sec); err != nil {
				t.Fatalf("connect with %s over TLS: %v", m, err)
			}
		})
	}
}

func TestSecurityConfigWrongPasswordIsRefused(t *testing.T) {
	t.Parallel()
	files := testutil.NewTLSFiles(t)
	c := secureCluster(t, files, SASLSCRAMSHA512)
	sec := Security{TLSFiles: tlsconf.Files{CA: files.CA},
		SASLMechanism: SASLSCRAMSHA512, SASLUser: testUser, SASLPassword: "wrong-pa55word"}
	err := connect(c, sec)
	if err == nil {
		t.Fatal("connected with a wrong password")
	}
	if desc := DescribeError(c.ListenAddrs(), sec, err).Error(); strings.Contains(desc, "wrong-pa55word") {
		t.Errorf("DescribeError shows the password: %q", desc)
	}
	// kfake hangs up on bad credentials; a real broker answers with
	// SASL_AUTHENTICATION_FAILED (integration/security_test.go), which is
	// said as such.
	wrapped := fmt.Errorf("kafka: client has run out of available brokers to talk to: %w", sarama.ErrSASLAuthenticationFailed)
	desc := DescribeError([]string{"k1:9093"}, sec, wrapped).Error()
	for _, want := range []string{"k1:9093 refused the credentials", "SCRAM-SHA-512", `"fanout"`} {
		if !strings.Contains(desc, want) {
			t.Errorf("DescribeError = %q, want it to say %q", desc, want)
		}
	}
	if !errors.Is(DescribeError(nil, sec, wrapped), sarama.ErrSASLAuthenticationFailed) {
		t.Error("DescribeError does not wrap the error")
	}
}

func TestSecurityConfigRefusesBrokerOfAnotherCA(t *testing.T) {
	t.Parallel()
	files, other := testutil.NewTLSFiles(t), testutil.NewTLSFiles(t)
	c := secureCluster(t, files, SASLSCRAMSHA512)
	sec := Security{TLSFiles: tlsconf.Files{CA: other.CA},
		SASLMechanism: SASLSCRAMSHA512, SASLUser: testUser, SASLPassword: testPassword}
	err := connect(c, sec)
	if err == nil {
		t.Fatal("connected to a broker whose certificate another CA signed")
	}
	if desc := DescribeError(c.ListenAddrs(), sec, err).Error(); !strings.Contains(desc, "TLS handshake failed") {
		t.Fatalf("DescribeError = %q, want a TLS handshake failure", desc)
	}

	// Only the test-only switch accepts it.
	sec.TLSFiles.InsecureSkipVerify = true
	if err := connect(c, sec); err != nil {
		t.Fatalf("connect with InsecureSkipVerify: %v", err)
	}
	if w := strings.Join(sec.Warnings(), "\n"); !strings.Contains(w, "--kafka-tls-insecure-skip-verify") {
		t.Fatalf("Warnings() = %q, want a warning about --kafka-tls-insecure-skip-verify", w)
	}
}

func TestSecurityConfigPlain(t *testing.T) {
	t.Parallel()
	cfg, err := Security{}.Config("plain")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Net.TLS.Enable || cfg.Net.SASL.Enable {
		t.Fatalf("zero Security: TLS %v SASL %v, want neither", cfg.Net.TLS.Enable, cfg.Net.SASL.Enable)
	}
	if cfg.ClientID != "plain" || cfg.Version != KafkaVersion {
		t.Fatalf("Config does not start from NewConfig: client id %q version %v", cfg.ClientID, cfg.Version)
	}
}

func TestSecurityValidate(t *testing.T) {
	t.Parallel()
	files := testutil.NewTLSFiles(t)
	sasl := Security{SASLMechanism: SASLSCRAMSHA512, SASLUser: "u", SASLPassword: testPassword}
	tests := []struct {
		name   string
		modify func(*Security)
		want   string // substring of the error; "" for valid
	}{
		{"SCRAM-SHA-512", func(*Security) {}, ""},
		{"no SASL at all", func(s *Security) { *s = Security{} }, ""},
		{"lower case mechanism", func(s *Security) { s.SASLMechanism = "plain" }, ""},
		{"bad mechanism", func(s *Security) { s.SASLMechanism = "GSSAPI" }, `--kafka-sasl-mechanism "GSSAPI": want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512`},
		{"no user", func(s *Security) { s.SASLUser = "" }, "--kafka-sasl-user: required"},
		{"no password", func(s *Security) { s.SASLPassword = "" }, "FANOUT_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file"},
		{"user without mechanism", func(s *Security) { s.SASLMechanism, s.SASLPassword = "", "" }, "--kafka-sasl-user: needs --kafka-sasl-mechanism"},
		{"password without mechanism", func(s *Security) { s.SASLMechanism, s.SASLUser = "", "" }, "without --kafka-sasl-mechanism"},
		{"CA unreadable", func(s *Security) { s.TLSFiles.CA = "/nonexistent/ca.pem" }, "--kafka-tls: CA file: open /nonexistent/ca.pem"},
		{"certificate without key", func(s *Security) { s.TLS, s.TLSFiles.Cert = true, files.ClientCert }, "--kafka-tls: a client certificate needs both"},
		{"client certificate", func(s *Security) {
			s.TLSFiles = tlsconf.Files{CA: files.CA, Cert: files.ClientCert, Key: files.ClientKey}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sasl
			tt.modify(&s)
			err := s.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), s.SASLPassword) && s.SASLPassword != "" {
				t.Fatalf("Validate() shows the password: %v", err)
			}
		})
	}
}

func TestSecurityStringHidesPassword(t *testing.T) {
	t.Parallel()
	s := Security{TLS: true, SASLMechanism: "scram-sha-256", SASLUser: "fanout", SASLPassword: testPassword}
	if got, want := s.String(), "TLS, SASL SCRAM-SHA-256 as fanout"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if got := (Security{}).String(); got != "plain text" {
		t.Fatalf("zero String() = %q", got)
	}
	if w := (Security{SASLMechanism: "PLAIN"}).Warnings(); len(w) != 1 || !strings.Contains(w[0], "clear text") {
		t.Fatalf("PLAIN without TLS: Warnings() = %q", w)
	}
	if w := (Security{TLS: true, SASLMechanism: "PLAIN"}).Warnings(); len(w) != 0 {
		t.Fatalf("PLAIN over TLS: Warnings() = %q, want none", w)
	}
}
