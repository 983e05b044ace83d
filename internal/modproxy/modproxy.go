// Package modproxy writes a directory that serves Go modules of a git
// repository's commit as a module proxy would (GOPROXY=file://DIR): for a
// module, <escaped path>/@v/<version>.zip (made by golang.org/x/mod/zip
// from the commit, the zip the go command and proxy.golang.org make),
// .mod and .info, the list of its tagged versions (none here: a commit is
// served at its pseudo-version), and @latest. Tests use it to build a module
// outside the repository against what users would download.
package modproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// Commit is a resolved commit of a git repository.
type Commit struct {
	Hash string    // the full hash
	Time time.Time // the committer's time, which pseudo-versions carry
}

// PseudoVersion is the version the go command gives the commit for a
// module of major version major ("v0", "v1": v0.0.0-...; "v2" and up:
// vN.0.0-...) when no tag of the module precedes it.
func (c Commit) PseudoVersion(major string) string {
	return module.PseudoVersion(major, "", c.Time, c.Hash[:12])
}

// Resolve returns the commit rev (a hash, a branch, HEAD) names in the git
// repository whose work tree (or linked worktree) is repo.
func Resolve(repo, rev string) (Commit, error) {
	out, err := git(repo, "show", "-s", "--format=%H %ct", rev+"^{commit}", "--")
	if err != nil {
		return Commit{}, fmt.Errorf("resolve %s: %w", rev, err)
	}
	hash, ct, ok := strings.Cut(strings.TrimSpace(out), " ")
	sec, err := strconv.ParseInt(ct, 10, 64)
	if !ok || err != nil {
		return Commit{}, fmt.Errorf("resolve %s: unexpected git output %q", rev, out)
	}
	return Commit{Hash: hash, Time: time.Unix(sec, 0).UTC()}, nil
}

// ModuleDirs returns the directories, relative to the repository's root and
// slash-separated, of the go.mod files of commit c ("" for the root module).
func ModuleDirs(repo string, c Commit) ([]string, error) {
	out, err := git(repo, "ls-tree", "-r", "--name-only", c.Hash)
	if err != nil {
		return nil, fmt.Errorf("list the files of %s: %w", c.Hash, err)
	}
	var dirs []string
	for _, name := range strings.Split(out, "\n") {
		if path.Base(name) != "go.mod" {
			continue
		}
		dir := path.Dir(name)
		if dir == "." {
			dir = ""
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// Add writes to the proxy directory dir the module whose go.mod is in the
// directory subdir ("" for the root) of commit c of repository repo, at the
// commit's pseudo-version, and returns the module's path and version.
func Add(dir, repo string, c Commit, subdir string) (module.Version, error) {
	modFile := path.Join(subdir, "go.mod")
	gomod, err := git(repo, "show", c.Hash+":"+modFile)
	if err != nil {
		return module.Version{}, fmt.Errorf("read %s at %s: %w", modFile, c.Hash, err)
	}
	modPath := modfile.ModulePath([]byte(gomod))
	if modPath == "" {
		return module.Version{}, fmt.Errorf("%s at %s names no module", modFile, c.Hash)
	}
	major := "v0"
	if _, pathMajor, ok := module.SplitPathVersion(modPath); ok && pathMajor != "" {
		major = module.PathMajorPrefix(pathMajor)
	}
	m := module.Version{Path: modPath, Version: c.PseudoVersion(major)}
	root, err := repoRoot(repo)
	if err != nil {
		return m, err
	}
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return m, fmt.Errorf("module %s: %w", m.Path, err)
	}
	escVersion, err := module.EscapeVersion(m.Version)
	if err != nil {
		return m, fmt.Errorf("module %s: %w", m, err)
	}
	vdir := filepath.Join(dir, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return m, err
	}
	zf, err := os.Create(filepath.Join(vdir, escVersion+".zip"))
	if err != nil {
		return m, err
	}
	err = modzip.CreateFromVCS(zf, m, root, c.Hash, subdir)
	if cerr := zf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return m, fmt.Errorf("zip of %s: %w", m, err)
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, c.Time})
	if err != nil {
		return m, err
	}
	files := []struct {
		name string
		data []byte
	}{
		{filepath.Join(vdir, escVersion+".mod"), []byte(gomod)},
		{filepath.Join(vdir, escVersion+".info"), info},
		// A proxy lists only tagged versions; with none, @latest answers
		// the newest commit's pseudo-version, as here.
		{filepath.Join(vdir, "list"), nil},
		{filepath.Join(dir, filepath.FromSlash(escPath), "@latest"), info},
	}
	for _, f := range files {
		if err := os.WriteFile(f.name, f.data, 0o644); err != nil {
			return m, err
		}
	}
	return m, nil
}

// repoRoot returns the directory whose .git holds the objects of the
// repository at repo: repo itself in a plain clone, the main work tree for a
// linked worktree (whose .git is a file), because zip.CreateFromVCS accepts
// only a directory with a .git directory. The commits are the same objects.
func repoRoot(repo string) (string, error) {
	out, err := git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return "", fmt.Errorf("find the repository of %s: %w", repo, err)
	}
	common := strings.TrimSpace(out)
	if filepath.Base(common) != ".git" {
		return "", fmt.Errorf("the git directory of %s is %s: not the .git of a work tree", repo, common)
	}
	return filepath.Dir(common), nil
}

// git runs git with args in dir and returns its standard output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
