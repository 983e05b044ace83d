package kafka

import (
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"

	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// SASL mechanisms fanout supports (--kafka-sasl-mechanism).
const (
	SASLPlain       = sarama.SASLTypePlaintext   // PLAIN: the password itself goes to the broker; use it over TLS only
	SASLSCRAMSHA256 = sarama.SASLTypeSCRAMSHA256 // SCRAM-SHA-256: a challenge-response, the password never travels
	SASLSCRAMSHA512 = sarama.SASLTypeSCRAMSHA512 // SCRAM-SHA-512: likewise
)

// Security is how fanout's Kafka clients encrypt and authenticate: the
// --kafka-tls* and --kafka-sasl-* flags. The zero value is plain text
// without authentication. Every Kafka client of the daemon, the election,
// fanout produce and fanout status gets its configuration from Config.
type Security struct {
	// TLS encrypts every connection to the brokers. Any TLSFiles field set
	// implies it.
	TLS      bool
	TLSFiles tlsconf.Files

	// SASLMechanism is "" (no SASL), SASLPlain, SASLSCRAMSHA256 or
	// SASLSCRAMSHA512 (upper or lower case). SASLUser and SASLPassword are
	// then required. SASLPassword is a secret: it is never logged.
	SASLMechanism string
	SASLUser      string
	SASLPassword  string
}

// TLSEnabled reports whether connections use TLS.
func (s Security) TLSEnabled() bool { return s.TLS || s.TLSFiles.Set() }

// mechanism is SASLMechanism in upper case.
func (s Security) mechanism() string { return strings.ToUpper(strings.TrimSpace(s.SASLMechanism)) }

// Validate reports every problem with s in one error, naming the flags.
// It reads the TLS files, so an unreadable one is reported at start.
func (s Security) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch m := s.mechanism(); m {
	case "":
		if s.SASLUser != "" {
			bad("--kafka-sasl-user: needs --kafka-sasl-mechanism")
		}
		if s.SASLPassword != "" {
			bad("a Kafka SASL password is set (FANOUT_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file) without --kafka-sasl-mechanism")
		}
	case SASLPlain, SASLSCRAMSHA256, SASLSCRAMSHA512:
		if s.SASLUser == "" {
			bad("--kafka-sasl-user: required with --kafka-sasl-mechanism %s", m)
		}
		if s.SASLPassword == "" {
			bad("--kafka-sasl-mechanism %s: no password: set FANOUT_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file", m)
		}
	default:
		bad("--kafka-sasl-mechanism %q: want %s, %s or %s", s.SASLMechanism, SASLPlain, SASLSCRAMSHA256, SASLSCRAMSHA512)
	}
	if s.TLSEnabled() {
		if _, err := s.TLSFiles.Config(); err != nil {
			bad("--kafka-tls: %w", err)
		}
	}
	return errors.Join(errs...)
}

// Warnings lists what is legal but unsafe in s, for the operator to read
// once at start.
func (s Security) Warnings() []string {
	var w []string
	if s.TLSFiles.InsecureSkipVerify {
		w = append(w, "--kafka-tls-insecure-skip-verify: Kafka's certificate is not verified, anyone on the path can "+
			"impersonate the brokers and read the credentials; for tests only")
	}
	if s.mechanism() == SASLPlain && !s.TLSEnabled() {
		w = append(w, "--kafka-sasl-mechanism PLAIN without --kafka-tls: the password crosses the network in clear text")
	}
	return w
}

// String describes s for logs, without the password: "TLS, SASL
// SCRAM-SHA-512 as fanout", or "plain text".
func (s Security) String() string {
	var parts []string
	if s.TLSEnabled() {
		parts = append(parts, "TLS")
	}
	if m := s.mechanism(); m != "" {
		parts = append(parts, fmt.Sprintf("SASL %s as %s", m, s.SASLUser))
	}
	if len(parts) == 0 {
		return "plain text"
	}
	return strings.Join(parts, ", ")
}

// Config returns NewConfig(clientID) with s applied: TLS and SASL. It reads
// the TLS files on each call; the client made from it keeps what it read.
func (s Security) Config(clientID string) (*sarama.Config, error) {
	cfg := NewConfig(clientID)
	if s.TLSEnabled() {
		tc, err := s.TLSFiles.Config()
		if err != nil {
			return nil, fmt.Errorf("kafka TLS: %w", err)
		}
		cfg.Net.TLS.Enable, cfg.Net.TLS.Config = true, tc
	}
	m := s.mechanism()
	if m == "" {
		return cfg, nil
	}
	cfg.Net.SASL.Enable = true
	cfg.Net.SASL.Handshake = true
	cfg.Net.SASL.Version = sarama.SASLHandshakeV1
	cfg.Net.SASL.Mechanism = sarama.SASLMechanism(m)
	cfg.Net.SASL.User, cfg.Net.SASL.Password = s.SASLUser, s.SASLPassword
	switch m {
	case SASLPlain:
	case SASLSCRAMSHA256:
		cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
	case SASLSCRAMSHA512:
		cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
	default:
		return nil, fmt.Errorf("kafka SASL mechanism %q: want %s, %s or %s", s.SASLMechanism, SASLPlain, SASLSCRAMSHA256, SASLSCRAMSHA512)
	}
	return cfg, nil
}

// scramClient is sarama's SCRAMClient on github.com/xdg-go/scram.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

// Begin implements sarama.SCRAMClient.
func (c *scramClient) Begin(user, password, authzID string) error {
	client, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		// The error names the invalid part (SASLprep), never the value.
		return fmt.Errorf("scram: user or password not valid: %w", err)
	}
	c.conv = client.NewConversation()
	return nil
}

// Step implements sarama.SCRAMClient.
func (c *scramClient) Step(challenge string) (string, error) {
	resp, err := c.conv.Step(challenge)
	if err != nil {
		return "", fmt.Errorf("scram: %w", err)
	}
	return resp, nil
}

// Done implements sarama.SCRAMClient.
func (c *scramClient) Done() bool { return c.conv.Done() }

// DescribeError adds what an operator needs to an error of connecting to
// the brokers at addrs: refused credentials and failed TLS handshakes are
// said as such, not as an unreachable cluster.
func DescribeError(addrs []string, sec Security, err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, sarama.ErrSASLAuthenticationFailed) || strings.Contains(msg, "SASL Authentication failed"):
		return fmt.Errorf("kafka at %s refused the credentials (SASL %s, user %q): check --kafka-sasl-user and the password: %w",
			strings.Join(addrs, ","), sec.mechanism(), sec.SASLUser, err)
	case strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:"):
		return fmt.Errorf("kafka at %s: TLS handshake failed (check --kafka-tls-ca and the brokers' certificates): %w",
			strings.Join(addrs, ","), err)
	}
	return fmt.Errorf("kafka unreachable at %s (%s): %w", strings.Join(addrs, ","), sec, err)
}
