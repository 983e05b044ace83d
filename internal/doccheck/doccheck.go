// Package doccheck reads the user documentation (the README, docs/, the
// protocol's and the Python client's READMEs, SECURITY.md) for the tests
// that keep it true: its code blocks and what a test does with each, the
// command lines in them, and its links.
//
// Every fenced block is a command block (```sh) or code (```go, ```python,
// ```yaml, ```text, ```json, ```proto). A command block is run as written
// by integration/docs_test.go unless an annotation right above it, an HTML
// comment <!-- test: ... -->, says otherwise:
//
//	runs until stopped; ready when it prints "TEXT"
//	    started, and stopped (Ctrl-C) at the end of its section; it must
//	    print TEXT, run on, and exit 0
//	runs until it prints "TEXT", then Ctrl-C
//	    run in the foreground until it prints TEXT, then stopped; exit 0
//	runs beside fanout dev, started by the test
//	    run as written while the test runs fanout dev
//	recipe NAME
//	    run as written, then checked by the test's recipe NAME
//	run outside the repository: NAME
//	    run as written, in a module or virtualenv outside the repository,
//	    by the integration test that finds the block by NAME (Find)
//	not run (REASON); checked: CHECK
//	    not run, for REASON; CHECK says how the test checks it instead:
//	    flags (every command line is a command whose flags the test
//	    parses with the program's own parser), syntax (bash -n, and every
//	    command exists), docker (docker build and docker run, done without
//	    Docker), self (bin/integration, the command that runs the test),
//	    targets (go test -list finds the fuzz and benchmark targets of
//	    every go test command in its package)
//
// A block of another language, or a command block with an annotation the
// package does not know, is an error: no block goes untested silently.
package doccheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// Files returns the user documentation under root, relative to it (slash
// separated): README.md first, then docs/ (its sub-folders included),
// SECURITY.md, protocol/README.md, the Python client's README and the
// examples' READMEs.
func Files(root string) ([]string, error) {
	files := []string{"README.md"}
	var docs []string
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			docs = append(docs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list docs/: %w", err)
	}
	slices.Sort(docs)
	files = append(files, docs...)
	files = append(files, "SECURITY.md", "protocol/README.md", "clients/python/README.md")
	examples, err := filepath.Glob(filepath.Join(root, "examples", "*", "README.md"))
	if err != nil {
		return nil, err
	}
	for _, e := range examples {
		rel, err := filepath.Rel(root, e)
		if err != nil {
			return nil, err
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files, nil
}

// Block is one fenced block of a Markdown file.
type Block struct {
	File    string // the file, as Files names it
	Line    int    // line of the opening fence, from 1
	Lang    string // the fence's info string: sh, go, text, ...
	Text    string // the content, without the fences and their indentation
	Test    string // the annotation above it (after "test:"), or ""
	Section string // the nearest heading of level 1 or 2 above it
}

func (b Block) String() string { return fmt.Sprintf("%s:%d (```%s)", b.File, b.Line, b.Lang) }

// Blocks returns the fenced blocks of a Markdown file's content.
func Blocks(file, content string) ([]Block, error) {
	lines := strings.Split(content, "\n")
	var blocks []Block
	section := ""
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimLeft(line, " ")
		if strings.HasPrefix(line, "# ") || strings.HasPrefix(line, "## ") {
			section = strings.TrimSpace(strings.TrimLeft(line, "#"))
			continue
		}
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		indent := len(line) - len(trimmed)
		b := Block{File: file, Line: i + 1, Lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), Section: section}
		b.Test = annotation(lines[:i])
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			l := lines[i]
			if strings.TrimSpace(l) == "```" {
				closed = true
				break
			}
			if len(l)-len(strings.TrimLeft(l, " ")) >= indent {
				l = l[indent:]
			}
			body = append(body, l)
		}
		if !closed {
			return nil, fmt.Errorf("%s:%d: the block is not closed", file, b.Line)
		}
		b.Text = strings.Join(body, "\n") + "\n"
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// annotation returns the text after "test:" of an HTML comment on the
// nearest non-blank line of lines' end, or "".
func annotation(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if m := annotationRE.FindStringSubmatch(l); m != nil {
			return strings.TrimSpace(m[1])
		}
		return ""
	}
	return ""
}

var annotationRE = regexp.MustCompile(`^<!--\s*test:\s*(.*?)\s*-->$`)

// ReadBlocks returns the blocks of every file of Files.
func ReadBlocks(root string) ([]Block, error) {
	files, err := Files(root)
	if err != nil {
		return nil, err
	}
	var all []Block
	for _, f := range files {
		content, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		blocks, err := Blocks(f, string(content))
		if err != nil {
			return nil, err
		}
		all = append(all, blocks...)
	}
	return all, nil
}

// The kinds of Treatment.
const (
	Code   = "code"   // a block of code, not commands
	Run    = "run"    // run as written, exit 0
	Start  = "start"  // run until stopped at the end of its section
	Until  = "until"  // run until it prints Text, then Ctrl-C
	Beside = "beside" // run as written while fanout dev runs
	Recipe = "recipe" // run as written, checked by the recipe Text
	// Outside: run as written outside the repository by the test that
	// finds it by the name Text.
	Outside = "outside"
	NotRun  = "not run"
)

// The checks of a block that is not run.
const (
	CheckFlags  = "flags"
	CheckSyntax = "syntax"
	CheckDocker = "docker"
	CheckSelf   = "self"
	// CheckTargets: every go test command's fuzz or benchmark targets
	// are found by go test -list in its package.
	CheckTargets = "targets"
)

// codeLangs are the languages of blocks that are code, not commands.
var codeLangs = []string{"go", "python", "yaml", "text", "json", "proto"}

// Treatment is what a test does with a block.
type Treatment struct {
	Kind   string
	Text   string // what Start, Until wait for; the recipe's name
	Reason string // why a block is not run
	Check  string // how a block that is not run is checked
}

var (
	startRE   = regexp.MustCompile(`^runs until stopped; ready when it prints "([^"]+)"$`)
	untilRE   = regexp.MustCompile(`^runs until it prints "([^"]+)", then Ctrl-C$`)
	besideRE  = regexp.MustCompile(`^runs beside fanout dev, started by the test$`)
	recipeRE  = regexp.MustCompile(`^recipe ([\w -]+)$`)
	outsideRE = regexp.MustCompile(`^run outside the repository: ([\w -]+)$`)
	notRunRE  = regexp.MustCompile(`^not run \((.+)\); checked: (\w+)$`)
)

// Treatment returns what a test does with the block, or an error when the
// block is of no known language or its annotation is not understood.
func (b Block) Treatment() (Treatment, error) {
	if slices.Contains(codeLangs, b.Lang) {
		if b.Test != "" {
			return Treatment{}, fmt.Errorf("%s: a %s block is not run; it has the annotation %q", b, b.Lang, b.Test)
		}
		return Treatment{Kind: Code}, nil
	}
	if b.Lang != "sh" {
		return Treatment{}, fmt.Errorf("%s: a block of unknown language %q: tag commands sh, code with its language (%s)",
			b, b.Lang, strings.Join(codeLangs, ", "))
	}
	if b.Test == "" {
		return Treatment{Kind: Run}, nil
	}
	if m := startRE.FindStringSubmatch(b.Test); m != nil {
		return Treatment{Kind: Start, Text: m[1]}, nil
	}
	if m := untilRE.FindStringSubmatch(b.Test); m != nil {
		return Treatment{Kind: Until, Text: m[1]}, nil
	}
	if besideRE.MatchString(b.Test) {
		return Treatment{Kind: Beside}, nil
	}
	if m := recipeRE.FindStringSubmatch(b.Test); m != nil {
		return Treatment{Kind: Recipe, Text: m[1]}, nil
	}
	if m := outsideRE.FindStringSubmatch(b.Test); m != nil {
		return Treatment{Kind: Outside, Text: m[1]}, nil
	}
	if m := notRunRE.FindStringSubmatch(b.Test); m != nil {
		if !slices.Contains([]string{CheckFlags, CheckSyntax, CheckDocker, CheckSelf, CheckTargets}, m[2]) {
			return Treatment{}, fmt.Errorf("%s: unknown check %q (flags, syntax, docker, self or targets)", b, m[2])
		}
		return Treatment{Kind: NotRun, Reason: m[1], Check: m[2]}, nil
	}
	return Treatment{}, fmt.Errorf("%s: annotation %q not understood (see package doccheck)", b, b.Test)
}

// Find returns the command block of file (relative to root) that is run
// outside the repository under name.
func Find(root, file, name string) (Block, error) {
	content, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return Block{}, err
	}
	blocks, err := Blocks(file, string(content))
	if err != nil {
		return Block{}, err
	}
	for _, b := range blocks {
		if tr, err := b.Treatment(); err == nil && tr.Kind == Outside && tr.Text == name {
			return b, nil
		}
	}
	return Block{}, fmt.Errorf("%s has no block annotated <!-- test: run outside the repository: %s -->", file, name)
}

// FlagChecked are the programs (as Command.Program names them) whose command
// lines a block "checked: flags" may hold: the test parses them with the
// program's own flag parser (the program run with --help added).
var FlagChecked = []string{"fanout", "bin/bench", "bin/chaos"}

// Command is one simple command of a command block: its environment
// assignments and its words, quotes removed, nothing expanded.
type Command struct {
	Env  []string // NAME=value words before the command
	Args []string
	Dir  string // the directory a "cd DIR" before it went to, or ""
}

// Line returns the command as a shell line (for messages).
func (c Command) Line() string { return strings.Join(append(slices.Clone(c.Env), c.Args...), " ") }

// Commands splits a command block into its simple commands: lines joined
// at a final backslash, comments dropped, split at ;, &&, ||, |, & and
// line ends, parentheses of subshells dropped. Quotes group words and are
// removed; nothing is expanded. A "cd DIR" sets the Dir of the commands
// after it: to the end of the line in a line that starts a subshell "(",
// else to the end of the block.
func Commands(text string) ([]Command, error) {
	text = strings.ReplaceAll(text, "\\\n", " ")
	var cmds []Command
	blockDir := ""
	for _, line := range strings.Split(text, "\n") {
		words, err := split(line)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		dir := blockDir
		subshell := strings.HasPrefix(strings.TrimSpace(line), "(")
		for _, w := range words {
			if len(w) == 0 {
				continue
			}
			c := Command{Dir: dir}
			for len(w) > 0 && isAssignment(w[0]) {
				c.Env = append(c.Env, w[0])
				w = w[1:]
			}
			if len(w) == 0 {
				continue
			}
			c.Args = w
			if w[0] == "cd" && len(w) == 2 {
				dir = path.Join(dir, w[1])
				if !subshell {
					blockDir = dir
				}
				continue
			}
			cmds = append(cmds, c)
		}
	}
	return cmds, nil
}

var assignmentRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

func isAssignment(w string) bool { return assignmentRE.MatchString(w) }

// split splits one line into commands (lists of words) at the operators
// ;, &&, ||, |, &. Redirections stay words ("> file", ">&2").
func split(line string) ([][]string, error) {
	var cmds [][]string
	var words []string
	var word strings.Builder
	inWord := false
	endWord := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCmd := func() {
		endWord()
		cmds = append(cmds, words)
		words = nil
	}
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '\'' || ch == '"':
			j := strings.IndexByte(line[i+1:], ch)
			if j < 0 {
				return nil, errors.New("unclosed quote")
			}
			word.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case ch == '#' && !inWord:
			endCmd()
			return cmds, nil
		case ch == ' ' || ch == '\t' || ch == '(' || ch == ')':
			endWord()
		case ch == '&' && i > 0 && line[i-1] == '>': // >&2
			word.WriteByte(ch)
		case ch == ';' || ch == '&' || ch == '|':
			if i+1 < len(line) && line[i+1] == ch {
				i++ // && or ||
			}
			endCmd()
		default:
			word.WriteByte(ch)
			inWord = true
		}
	}
	endCmd()
	return cmds, nil
}

// Program names the program a command runs, for the flag checks: "fanout"
// (fanout, ./fanout, go run ./cmd/fanout), "bin/bench", "bin/chaos",
// "docker", or its first word. Args returns the arguments after it.
func (c Command) Program() (string, []string) {
	a := c.Args
	switch {
	case len(a) >= 3 && a[0] == "go" && a[1] == "run" && a[2] == "./cmd/fanout":
		return "fanout", a[3:]
	case a[0] == "fanout" || a[0] == "./fanout":
		return "fanout", a[1:]
	}
	return a[0], a[1:]
}

// Link is a link of a Markdown file, or a "FILE.md#anchor" named in
// another file.
type Link struct {
	File   string // where it is, relative to the root
	Line   int
	Target string // as written
}

var (
	mdLinkRE   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdAnchorRE = regexp.MustCompile(`[\w./-]*\.md#[\w-]+`)
)

// Links returns the relative links of a Markdown file's content (not
// http:, https:, mailto:), or, for another file, every "X.md#anchor" in it.
func Links(file, content string) []Link {
	re := mdLinkRE
	if !strings.HasSuffix(file, ".md") {
		re = mdAnchorRE
	}
	var links []Link
	for i, line := range strings.Split(content, "\n") {
		for _, m := range re.FindAllStringSubmatch(line, -1) {
			target := m[len(m)-1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links = append(links, Link{File: file, Line: i + 1, Target: target})
		}
	}
	return links
}

// Resolve returns the file a link points to (relative to the root; a
// folder's README.md for a folder and an anchor) and its anchor. A link of a file that is
// not Markdown is resolved from the root when it does not exist beside it.
func (l Link) Resolve(root string) (file, anchor string) {
	target, anchor, _ := strings.Cut(l.Target, "#")
	if target == "" {
		return l.File, anchor
	}
	file = path.Clean(path.Join(path.Dir(l.File), target))
	if !strings.HasSuffix(l.File, ".md") {
		if _, err := os.Stat(filepath.Join(root, file)); err != nil {
			file = path.Clean(target)
		}
	}
	if st, err := os.Stat(filepath.Join(root, file)); err == nil && st.IsDir() && anchor != "" {
		file = path.Join(file, "README.md")
	}
	return file, anchor
}

// Anchors returns the anchors GitHub makes of a Markdown file's headings:
// lower case, punctuation other than - and _ dropped, spaces to hyphens, a
// number added to repeats.
func Anchors(content string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(content, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " "), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}
