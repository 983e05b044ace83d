package doccheck

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository root, from this package's directory.
const root = "../.."

func TestBlocks(t *testing.T) {
	t.Parallel()
	md := "# T\n\n## First\n\n<!-- test: recipe one -->\n```sh\na\n```\n\n" +
		"1. A list\n\n   ```text\n   x\n     y\n   ```\n### Sub\n```go\nz\n```\n"
	blocks, err := Blocks("f.md", md)
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{File: "f.md", Line: 6, Lang: "sh", Text: "a\n", Test: "recipe one", Section: "First"},
		{File: "f.md", Line: 12, Lang: "text", Text: "x\n  y\n", Section: "First"},
		{File: "f.md", Line: 17, Lang: "go", Text: "z\n", Section: "First"},
	}
	if !slices.Equal(blocks, want) {
		t.Errorf("blocks:\n%+v\nwant\n%+v", blocks, want)
	}
	if _, err := Blocks("f.md", "```sh\nrm -rf /\n"); err == nil {
		t.Error("an unclosed block is accepted")
	}
}

func TestTreatment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lang, test string
		want       Treatment
	}{
		{"sh", "", Treatment{Kind: Run}},
		{"go", "", Treatment{Kind: Code}},
		{"sh", `runs until stopped; ready when it prints "ready"`, Treatment{Kind: Start, Text: "ready"}},
		{"sh", `runs until it prints "hello", then Ctrl-C`, Treatment{Kind: Until, Text: "hello"}},
		{"sh", `runs beside fanout dev, started by the test`, Treatment{Kind: Beside}},
		{"sh", `recipe cluster on one host`, Treatment{Kind: Recipe, Text: "cluster on one host"}},
		{"sh", `not run (no Docker engine here); checked: docker`, Treatment{Kind: NotRun, Reason: "no Docker engine here", Check: CheckDocker}},
	} {
		got, err := Block{Lang: tc.lang, Test: tc.test}.Treatment()
		if err != nil || got != tc.want {
			t.Errorf("```%s %q: %+v, %v; want %+v", tc.lang, tc.test, got, err, tc.want)
		}
	}
	for _, b := range []Block{
		{Lang: ""},                   // untagged
		{Lang: "bash"},               // unknown language
		{Lang: "go", Test: "recipe"}, // code is not run
		{Lang: "sh", Test: "skip"},
		{Lang: "sh", Test: "not run (slow); checked: vibes"},
		{Lang: "sh", Test: "not run; checked: flags"}, // no reason
	} {
		if got, err := b.Treatment(); err == nil {
			t.Errorf("```%s %q: %+v, want an error", b.Lang, b.Test, got)
		}
	}
}

func TestCommands(t *testing.T) {
	t.Parallel()
	text := "# a comment\n" +
		"echo hello | go run ./cmd/fanout produce --kafka 127.0.0.1:9092 --topic user_need\n" +
		"./fanout --id x \\\n  --topic y &   # trailing comment\n" +
		"FANOUT_A=1 fanout status --zookeeper 'zk1:2181' --auth-token \"$TOKEN\"\n" +
		"(cd bench && go run ./cmd/fanout-bench targets a.json b.json)\n" +
		"cd protocol\ngo test -fuzz=F .\n" +
		"curl -s http://h:9100/api/status | jq '.clients[] | {name}' >&2; umask 077\n"
	got, err := Commands(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []Command{
		{Args: []string{"echo", "hello"}},
		{Args: []string{"go", "run", "./cmd/fanout", "produce", "--kafka", "127.0.0.1:9092", "--topic", "user_need"}},
		{Args: []string{"./fanout", "--id", "x", "--topic", "y"}},
		{Env: []string{"FANOUT_A=1"}, Args: []string{"fanout", "status", "--zookeeper", "zk1:2181", "--auth-token", "$TOKEN"}},
		{Dir: "bench", Args: []string{"go", "run", "./cmd/fanout-bench", "targets", "a.json", "b.json"}},
		{Dir: "protocol", Args: []string{"go", "test", "-fuzz=F", "."}},
		{Dir: "protocol", Args: []string{"curl", "-s", "http://h:9100/api/status"}},
		{Dir: "protocol", Args: []string{"jq", ".clients[] | {name}", ">&2"}},
		{Dir: "protocol", Args: []string{"umask", "077"}},
	}
	if len(got) != len(want) {
		t.Fatalf("commands:\n%q\nwant\n%q", got, want)
	}
	for i := range want {
		if !slices.Equal(got[i].Env, want[i].Env) || !slices.Equal(got[i].Args, want[i].Args) || got[i].Dir != want[i].Dir {
			t.Errorf("command %d: %q, want %q", i, got[i], want[i])
		}
	}
	if p, args := got[1].Program(); p != "fanout" || args[0] != "produce" {
		t.Errorf("go run ./cmd/fanout: program %q %q", p, args)
	}
	if p, _ := got[2].Program(); p != "fanout" {
		t.Errorf("./fanout: program %q", p)
	}
}

func TestAnchors(t *testing.T) {
	t.Parallel()
	a := Anchors("# Offsets tool: show, replay, skip, migrate\n## Chaos (`bin/chaos`)\n```sh\n# not a heading\n```\n## Chaos (bin/chaos)\n## Große Ü\n")
	for _, want := range []string{"offsets-tool-show-replay-skip-migrate", "chaos-binchaos", "chaos-binchaos-1", "große-ü"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a comment in a code block is taken for a heading")
	}
}

// readDoc reads a file of the repository.
func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every block of the user docs has a treatment the tests know, and a block
// that is not run is one its check can handle: no block is skipped
// silently. (integration/docs_test.go runs them.)
func TestEveryBlockHasATreatment(t *testing.T) {
	t.Parallel()
	blocks, err := ReadBlocks(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) == 0 {
		t.Fatal("no blocks in the docs")
	}
	for _, b := range blocks {
		tr, err := b.Treatment()
		if err != nil {
			t.Error(err)
			continue
		}
		if tr.Kind == Code {
			continue
		}
		cmds, err := Commands(b.Text)
		if err != nil {
			t.Errorf("%s: %v", b, err)
			continue
		}
		if len(cmds) == 0 {
			t.Errorf("%s: a command block without a command", b)
		}
		if tr.Kind != NotRun {
			continue
		}
		switch tr.Check {
		case CheckFlags:
			for _, c := range cmds {
				if p, _ := c.Program(); !slices.Contains(FlagChecked, p) {
					t.Errorf("%s: checked: flags, but no flag check knows %q (only %v)", b, c.Line(), FlagChecked)
				}
			}
		case CheckDocker:
			for _, c := range cmds {
				if len(c.Args) < 2 || c.Args[0] != "docker" || (c.Args[1] != "build" && c.Args[1] != "run") {
					t.Errorf("%s: checked: docker, but %q is not docker build or docker run", b, c.Line())
				}
			}
		case CheckSelf:
			if strings.TrimSpace(b.Text) != "bin/integration" {
				t.Errorf("%s: checked: self is bin/integration alone, not %q", b, b.Text)
			}
		case CheckSyntax:
			checkSyntax(t, b, cmds)
		case CheckTargets:
			for _, c := range cmds {
				if len(c.Args) < 2 || c.Args[0] != "go" || c.Args[1] != "test" {
					t.Errorf("%s: checked: targets, but %q is not go test", b, c.Line())
				}
			}
		}
	}
}

// checkSyntax: bash parses the block, and every command it runs exists (or
// is one whose flags a test checks: fanout's are, in every block, by
// cmd/fanout's tests).
func checkSyntax(t *testing.T, b Block, cmds []Command) {
	t.Helper()
	if out, err := exec.Command("bash", "-n", "-c", b.Text).CombinedOutput(); err != nil {
		t.Errorf("%s: bash -n: %v\n%s", b, err, out)
	}
	for _, c := range cmds {
		if p, _ := c.Program(); slices.Contains(FlagChecked, p) {
			continue
		}
		cmd := exec.Command("bash", "-c", `command -v -- "$1"`, "_", c.Args[0])
		cmd.Dir = filepath.Join(root, c.Dir)
		if err := cmd.Run(); err != nil {
			t.Errorf("%s: the command %q does not exist here", b, c.Args[0])
		}
	}
}

// The first screen of the README names the two commands a newcomer needs:
// the one that runs fanout and the one that runs every test.
func TestReadmeFirstScreen(t *testing.T) {
	t.Parallel()
	const screen = 40 // lines
	blocks, err := Blocks("README.md", readDoc(t, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"go run ./cmd/fanout dev", "bin/integration"} {
		found := false
		for _, b := range blocks {
			if b.Line <= screen && b.Lang == "sh" && strings.TrimSpace(b.Text) == want {
				found = true
			}
		}
		if !found {
			t.Errorf("README.md: no command block %q in its first %d lines", want, screen)
		}
	}
}

// The README is a front page: short, and it links to every page of docs/.
func TestReadmeIsAFrontPage(t *testing.T) {
	t.Parallel()
	const most = 400 // lines
	readme := readDoc(t, "README.md")
	if n := strings.Count(readme, "\n"); n > most {
		t.Errorf("README.md has %d lines; a front page has %d at most: move reference into docs/", n, most)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	for _, p := range pages {
		link := "](docs/" + filepath.Base(p) + ")"
		if !strings.Contains(readme, link) {
			t.Errorf("README.md does not link to docs/%s", filepath.Base(p))
		}
	}
}

// issueRE matches a citation of an issue by number.
var issueRE = regexp.MustCompile(`(?i)\bissues?\s+#?\d+`)

// skipDirs are the folders of downloads, build output and results, not the
// project's text.
var skipDirs = []string{".git", ".cache", ".run", "chaos-results", "bench-results", "dist", "__pycache__", ".pytest_cache", "evidence"}

// The docs speak of the product, not of its history, and so do comments,
// scripts and tests: no file cites an issue by number.
func TestNoIssueNumbers(t *testing.T) {
	t.Parallel()
	if !issueRE.MatchString("the targets of Iss"+"ue 13") || !issueRE.MatchString("iss"+"ues #12") {
		t.Fatal("issueRE misses a citation")
	}
	walkText(t, func(rel string, content []byte) {
		for i, line := range bytes.Split(content, []byte("\n")) {
			if m := issueRE.Find(line); m != nil {
				t.Errorf("%s:%d cites %q: say what the product does instead", rel, i+1, m)
			}
		}
	})
}

// walkText calls f with every text file of the repository (not those of
// skipDirs, nor binary ones).
func walkText(t *testing.T, f func(rel string, content []byte)) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if slices.Contains(skipDirs, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		content, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(content, 0) >= 0 || len(content) > 4<<20 {
			return nil // binary, or data
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		f(filepath.ToSlash(rel), content)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Every relative link of every Markdown file points at a file that exists
// and, with an anchor, at a heading of it; so does every "FILE.md#anchor"
// that code, scripts and messages name.
func TestLinks(t *testing.T) {
	t.Parallel()
	anchors := map[string]map[string]bool{}
	anchorsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil
		}
		anchors[file] = Anchors(string(b))
		return anchors[file]
	}
	n := 0
	walkText(t, func(rel string, content []byte) {
		if strings.HasPrefix(rel, "internal/doccheck/") {
			return // its examples
		}
		for _, l := range Links(rel, string(content)) {
			n++
			file, anchor := l.Resolve(root)
			if _, err := os.Stat(filepath.Join(root, file)); err != nil {
				t.Errorf("%s:%d: link %q: %s does not exist", l.File, l.Line, l.Target, file)
				continue
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !anchorsOf(file)[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading #%s", l.File, l.Line, l.Target, file, anchor)
			}
		}
	})
	if n == 0 {
		t.Error("no links found")
	}
}
