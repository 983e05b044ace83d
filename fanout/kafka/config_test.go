package kafka

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
)

func TestNewConfig(t *testing.T) {
	t.Parallel()
	cfg := NewConfig("fanout-test")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !cfg.Version.IsAtLeast(sarama.V4_0_0_0) {
		t.Errorf("Version = %v, want >= 4.0", cfg.Version)
	}
	if cfg.ClientID != "fanout-test" {
		t.Errorf("ClientID = %q", cfg.ClientID)
	}
	if !cfg.Consumer.Return.Errors || !cfg.Producer.Return.Successes {
		t.Errorf("Return.Errors=%v Return.Successes=%v, want both true",
			cfg.Consumer.Return.Errors, cfg.Producer.Return.Successes)
	}
	if cfg.Producer.RequiredAcks != sarama.WaitForAll {
		t.Errorf("RequiredAcks = %v, want WaitForAll", cfg.Producer.RequiredAcks)
	}
	if cfg.Metadata.Retry.Max < 3 || cfg.Metadata.Retry.BackoffFunc == nil {
		t.Errorf("Metadata.Retry = %+v, want several retries with backoff", cfg.Metadata.Retry)
	}
	if a, b := NewConfig("a"), NewConfig("b"); a == b || a.ClientID == b.ClientID {
		t.Error("NewConfig must return a fresh config per call")
	}
}

func TestMetadataBackoff(t *testing.T) {
	t.Parallel()
	var total time.Duration
	prev := time.Duration(0)
	for i := range 10 {
		d := metadataBackoff(i, 10)
		if d < prev || d > 2*time.Second {
			t.Fatalf("backoff(%d) = %v after %v", i, d, prev)
		}
		prev = d
		total += d
	}
	if total < 5*time.Second {
		t.Errorf("10 retries cover only %v", total)
	}
}

func TestParseIsolation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    sarama.IsolationLevel
		wantErr bool
	}{
		{"read_committed", sarama.ReadCommitted, false},
		{" READ_UNCOMMITTED ", sarama.ReadUncommitted, false},
		{"committed", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseIsolation(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseIsolation(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
