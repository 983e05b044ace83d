package authtoken

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, path, content string, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

func TestCheckNamesTheToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, "# clients\nbilling:tok-billing-1\n\nreports :tok-reports-2\r\n", time.Now())
	f, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for token, want := range map[string]string{"tok-billing-1": "billing", "tok-reports-2": "reports"} {
		if name, ok := f.Check(token); !ok || name != want {
			t.Errorf("Check(%q) = %q, %v; want %q", token, name, ok, want)
		}
	}
	for _, bad := range []string{"", "tok-billing", "tok-billing-1x", "billing", "billing:tok-billing-1"} {
		if name, ok := f.Check(bad); ok {
			t.Errorf("Check(%q) = %q, accepted", bad, name)
		}
	}
}

func TestChangedFileIsReread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, "a:tok-a\n", time.Now())
	var reloads []error
	f, err := Open(path, func(err error) { reloads = append(reloads, err) })
	if err != nil {
		t.Fatal(err)
	}
	write(t, path, "b:tok-b\n", time.Now().Add(time.Minute))
	if _, ok := f.Check("tok-a"); ok {
		t.Error("a revoked token is still accepted")
	}
	if name, ok := f.Check("tok-b"); !ok || name != "b" {
		t.Errorf("a new token: %q, %v", name, ok)
	}
	// A broken version keeps the tokens in force and is reported, once.
	write(t, path, "c-without-token\n", time.Now().Add(2*time.Minute))
	if name, ok := f.Check("tok-b"); !ok || name != "b" {
		t.Errorf("after a broken version: %q, %v; want the previous tokens", name, ok)
	}
	f.Check("tok-b")
	if len(reloads) != 2 || reloads[0] != nil || reloads[1] == nil || !strings.Contains(reloads[1].Error(), "line 1") {
		t.Errorf("reloads reported: %v", reloads)
	}
}

func TestBadFilesNeverShowTheTokens(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]string{
		"secret-without-name\n":        "line 1: want name:token",
		"a:dup-secret\nb:dup-secret\n": "line 2: this token is used twice",
		"a:secret-one\na:secret-two\n": `line 2: the name "a" is used twice`,
		"a: secret-with-space\n":       "white space",
		"# nothing\n\n":                "no name:token line",
		":secret-with-empty-name\n":    "line 1: want name:token",
	} {
		path := filepath.Join(dir, "tokens")
		write(t, path, content, time.Now())
		_, err := Open(path, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", content, err, want)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows a token: %v", content, err)
		}
	}
	if _, err := Open(filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("a missing file opened")
	}
}
