// Package authtoken holds the named client tokens of --auth-tokens-file: a
// file of "name:token" lines, re-read when it changes, against which a
// token is checked in constant time and answered with its name. Neither
// the tokens nor the lines that hold them are ever part of an error.
package authtoken

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// File is the named tokens of one file. Its methods are safe for
// concurrent use.
type File struct {
	path     string
	onReload func(error) // told the outcome of each re-read after the first

	mu     sync.Mutex // guards the fields below
	tokens []named    // in file order
	mod    time.Time  // of the version tokens were read from
	size   int64
}

// named is one token, kept as its SHA-256 so that every comparison takes
// the same time whatever the tokens' lengths.
type named struct {
	name string
	sum  [sha256.Size]byte
}

// Open reads the file at path. onReload, when not nil, is told the outcome
// of every later re-read (the file changed): nil when the new tokens are in
// force, else why the previous ones stay.
func Open(path string, onReload func(error)) (*File, error) {
	f := &File{path: path, onReload: onReload}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--auth-tokens-file: %w", err)
	}
	tokens, err := read(path)
	if err != nil {
		return nil, err
	}
	f.tokens, f.mod, f.size = tokens, fi.ModTime(), fi.Size()
	return f, nil
}

// Len returns the number of tokens in force.
func (f *File) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.tokens)
}

// Check returns the name of token, re-reading the file first if it changed.
// Every token in force is compared, in constant time, whichever matches.
func (f *File) Check(token string) (name string, ok bool) {
	return f.CheckSum(sha256.Sum256([]byte(token)))
}

// CheckSum is Check of the token whose SHA-256 is sum: a session keeps
// the sum of its token, never the token, to check it again once the file
// changed.
func (f *File) CheckSum(sum [sha256.Size]byte) (name string, ok bool) {
	f.refresh()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.tokens {
		if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 && !ok {
			name, ok = t.name, true
		}
	}
	return name, ok
}

// Refresh re-reads the file if its modification time or size changed,
// telling onReload the outcome; the daemon calls it periodically, so that
// a change takes effect without waiting for the next client.
func (f *File) Refresh() { f.refresh() }

// Reload re-reads the file now, whether or not it changed (SIGHUP), and
// tells onReload the outcome. On error the previous tokens stay in force.
func (f *File) Reload() error {
	fi, err := os.Stat(f.path)
	if err == nil {
		f.mu.Lock()
		f.mod, f.size = fi.ModTime(), fi.Size() // a broken version is not read again until it changes
		f.mu.Unlock()
	}
	tokens, err := read(f.path)
	if err == nil {
		f.mu.Lock()
		f.tokens = tokens
		f.mu.Unlock()
	}
	if f.onReload != nil {
		f.onReload(err)
	}
	return err
}

// refresh re-reads the file when its modification time or size changed.
// A version that does not parse leaves the previous tokens in force and
// is not read again until it changes.
func (f *File) refresh() {
	fi, err := os.Stat(f.path)
	if err != nil {
		return // gone for a moment (a rename over it): keep the tokens
	}
	f.mu.Lock()
	changed := !fi.ModTime().Equal(f.mod) || fi.Size() != f.size
	if changed {
		f.mod, f.size = fi.ModTime(), fi.Size()
	}
	f.mu.Unlock()
	if !changed {
		return
	}
	tokens, err := read(f.path)
	if err == nil {
		f.mu.Lock()
		f.tokens = tokens
		f.mu.Unlock()
	}
	if f.onReload != nil {
		f.onReload(err)
	}
}

// read parses the file: one "name:token" a line; blank lines and lines
// starting with # are skipped. Names and tokens are unique and not empty.
// Errors name the line's number, never its content.
func read(path string) ([]named, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--auth-tokens-file: %w", err)
	}
	var out []named
	names := map[string]bool{}
	sums := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		name, token, found := strings.Cut(line, ":")
		name = strings.TrimSpace(name)
		switch {
		case !found || name == "" || token == "":
			return nil, fmt.Errorf("--auth-tokens-file %s, line %d: want name:token", path, n)
		case strings.TrimSpace(token) != token:
			return nil, fmt.Errorf("--auth-tokens-file %s, line %d: the token starts or ends with white space", path, n)
		case names[name]:
			return nil, fmt.Errorf("--auth-tokens-file %s, line %d: the name %q is used twice", path, n, name)
		}
		sum := sha256.Sum256([]byte(token))
		if sums[sum] {
			return nil, fmt.Errorf("--auth-tokens-file %s, line %d: this token is used twice (names must tell clients apart)", path, n)
		}
		names[name], sums[sum] = true, true
		out = append(out, named{name: name, sum: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--auth-tokens-file %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, errors.New("--auth-tokens-file " + path + ": no name:token line")
	}
	return out, nil
}
