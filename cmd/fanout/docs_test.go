package main

import (
	"os"
	"strings"
	"testing"
)

// The flag table of docs/flags.md must name every daemon flag with its
// environment variable, so that a new flag cannot go undocumented.
func TestReadmeDocumentsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(logFlags(), serveFlags()...) {
		name := f.Names()[0]
		if !strings.Contains(string(readme), "`--"+name+"`") {
			t.Errorf("docs/flags.md does not document --%s", name)
		}
		if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
			for _, e := range ev.GetEnvVars() {
				if !strings.Contains(string(readme), "`"+e+"`") {
					t.Errorf("docs/flags.md does not name %s for --%s", e, name)
				}
			}
		}
	}
}
