package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestBadFlagsExitTwo(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no id", []string{"--topic", "t"}, "--id"},
		{"no topic", []string{"--id", "svc"}, "--topic"},
		{"unknown flag", []string{"--id", "svc", "--topic", "t", "--bogus"}, "bogus"},
		{"bad duration", []string{"--id", "svc", "--topic", "t", "--ack-timeout", "soon"}, "ack-timeout"},
		{"negative duration", []string{"--id", "svc", "--topic", "t", "--ack-timeout=-1s"}, "--ack-timeout"},
		{"bad initial offset", []string{"--id", "svc", "--topic", "t", "--initial-offset", "middle"}, "--initial-offset"},
		{"bad kafka address", []string{"--id", "svc", "--topic", "t", "--kafka", "nohost"}, "--kafka"},
		{"bad id", []string{"--id", "a b", "--topic", "t"}, "--id"},
		{"bad topic", []string{"--id", "svc", "--topic", "a/b"}, "--topic"},
		{"bad log format", []string{"--log-format", "xml", "--id", "svc", "--topic", "t"}, "--log-format"},
		{"stray argument", []string{"--id", "svc", "--topic", "t", "extra"}, "extra"},
		{"serve alias validates too", []string{"serve", "--id", "svc"}, "--topic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"fanout"}, tt.args...), &stdout, &stderr)
			if code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr does not mention %q:\n%s", tt.want, stderr.String())
			}
		})
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"fanout", "--version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), version) {
		t.Fatalf("version output %q", stdout.String())
	}
}
