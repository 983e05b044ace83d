package modproxy

import (
	"archive/zip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// gitRepo makes a git repository in a temporary directory with files (name
// → content) committed, and returns its directory.
func gitRepo(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, dir, nil, "git", "init", "-q")
	run(t, dir, nil, "git", "add", "-A")
	run(t, dir, nil, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "first")
	return dir
}

// run runs a command in dir with env added to the test's, failing the test
// (with its output) when it fails; it returns the output.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The repository of the tests: a root module and a nested one whose path
// has capitals (escaped in the proxy's paths), with a file outside it.
var repoFiles = map[string]string{
	"go.mod":             "module example.com/Root\n\ngo 1.23\n",
	"root.go":            "package root\n",
	"lib/go.mod":         "module example.com/Root/lib\n\ngo 1.23\n",
	"lib/lib.go":         "package lib\n\n// Answer is what an importer prints.\nconst Answer = \"forty-two\"\n",
	"lib/sub/sub.go":     "package sub\n",
	"libs/other/file.go": "package other\n",
}

// The proxy directory of a commit serves its nested module at the commit's
// pseudo-version: files laid out by the escaped path, a zip holding the
// module's files only, and a module outside the repository (GOWORK off, no
// other proxy) gets it with `go get ...@latest` and runs it. From a linked
// worktree of the repository too.
func TestAddServesAModuleOutsideGetsAndBuilds(t *testing.T) {
	t.Parallel()
	repo := gitRepo(t, repoFiles)
	worktree := filepath.Join(t.TempDir(), "wt")
	run(t, repo, nil, "git", "worktree", "add", "-q", "--detach", worktree)
	for name, dir := range map[string]string{"clone": repo, "worktree": worktree} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := Resolve(dir, "HEAD")
			if err != nil {
				t.Fatal(err)
			}
			dirs, err := ModuleDirs(dir, c)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(dirs)
			if want := []string{"", "lib"}; !slices.Equal(dirs, want) {
				t.Fatalf("ModuleDirs = %q, want %q", dirs, want)
			}
			proxy := t.TempDir()
			m, err := Add(proxy, dir, c, "lib")
			if err != nil {
				t.Fatal(err)
			}
			wantVersion := "v0.0.0-" + c.Time.Format("20060102150405") + "-" + c.Hash[:12]
			if m.Path != "example.com/Root/lib" || m.Version != wantVersion {
				t.Fatalf("Add = %v, want example.com/Root/lib@%s", m, wantVersion)
			}
			vdir := filepath.Join(proxy, "example.com", "!root", "lib", "@v")
			for _, f := range []string{m.Version + ".zip", m.Version + ".mod", m.Version + ".info", "list"} {
				if _, err := os.Stat(filepath.Join(vdir, f)); err != nil {
					t.Errorf("the proxy lacks %s: %v", f, err)
				}
			}
			zr, err := zip.OpenReader(filepath.Join(vdir, m.Version+".zip"))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, f := range zr.File {
				names = append(names, f.Name)
			}
			zr.Close()
			slices.Sort(names)
			prefix := m.Path + "@" + m.Version + "/"
			if want := []string{prefix + "go.mod", prefix + "lib.go", prefix + "sub/sub.go"}; !slices.Equal(names, want) {
				t.Errorf("the zip holds %q, want %q", names, want)
			}

			app := t.TempDir()
			if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(
				"package main\n\nimport \"example.com/Root/lib\"\n\nfunc main() { println(lib.Answer) }\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			env := []string{"GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=file://" + filepath.ToSlash(proxy),
				"GONOSUMDB=example.com", "GOTOOLCHAIN=local"}
			run(t, app, env, "go", "mod", "init", "example.com/app")
			run(t, app, env, "go", "get", "example.com/Root/lib@latest")
			if gomod, _ := os.ReadFile(filepath.Join(app, "go.mod")); !strings.Contains(string(gomod), "example.com/Root/lib "+m.Version) {
				t.Errorf("the application's go.mod does not require %s:\n%s", m, gomod)
			}
			if out := run(t, app, env, "go", "run", "."); !strings.Contains(out, "forty-two") {
				t.Errorf("go run printed %q, want forty-two", out)
			}
		})
	}
}

// A revision the repository lacks is an error that names it, and so is a
// directory without a go.mod.
func TestErrors(t *testing.T) {
	t.Parallel()
	repo := gitRepo(t, repoFiles)
	if _, err := Resolve(repo, "no-such-branch"); err == nil || !strings.Contains(err.Error(), "no-such-branch") {
		t.Errorf("Resolve(no-such-branch) = %v, want an error naming it", err)
	}
	c, err := Resolve(repo, "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Add(t.TempDir(), repo, c, "libs"); err == nil || !strings.Contains(err.Error(), "libs/go.mod") {
		t.Errorf("Add(libs) = %v, want an error naming libs/go.mod", err)
	}
}
