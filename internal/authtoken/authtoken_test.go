package authtoken

import (
	"crypto/sha256"
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

// CheckSum checks a token by its SHA-256; Refresh re-reads a changed file
// without a check; Reload re-reads it even when its time and size did not
// change, and reports the outcome.
func TestCheckSumRefreshAndReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	mod := time.Now().Add(-time.Hour)
	write(t, path, "a:tok-a\n", mod)
	var reloads []error
	f, err := Open(path, func(err error) { reloads = append(reloads, err) })
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := f.CheckSum(sha256.Sum256([]byte("tok-a"))); !ok || name != "a" {
		t.Fatalf("CheckSum of tok-a: %q, %v", name, ok)
	}
	write(t, path, "b:tok-b\n", mod.Add(time.Minute))
	f.Refresh()
	if len(reloads) != 1 || reloads[0] != nil {
		t.Fatalf("reloads after Refresh: %v", reloads)
	}
	write(t, path, "b:tok-c\n", mod.Add(time.Minute)) // same time, same size
	f.Refresh()
	if _, ok := f.Check("tok-c"); ok || len(reloads) != 1 {
		t.Fatalf("Refresh read a file whose time and size did not change (reloads %v)", reloads)
	}
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	if name, ok := f.Check("tok-c"); !ok || name != "b" || len(reloads) != 2 {
		t.Fatalf("after Reload: %q, %v, reloads %v", name, ok, reloads)
	}
	write(t, path, "broken\n", mod.Add(time.Minute))
	if err := f.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("Reload of a broken file: %v", err)
	}
	if _, ok := f.Check("tok-c"); !ok {
		t.Fatal("a broken file dropped the tokens in force")
	}
}
