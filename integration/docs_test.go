//go:build integration

package integration

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/internal/doccheck"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// The user docs work as written: every command block of the README,
// docs/, SECURITY.md, the protocol's and the Python client's READMEs is run
// exactly as written, from the repository's root, against the test's Kafka
// and ZooKeeper (which must answer at the default addresses, as in the
// docs), or, where an annotation says it cannot run here, checked as the
// annotation says (package doccheck lists the treatments). A block the test
// does not know how to treat fails it.
//
// Only ports change: the ports the docs name (4987-4989, 9100-9102, and
// 9092 of fanout dev's in-process broker) are replaced by free ones in the
// blocks' text, and the daemons' default ports, which no text names, are
// set the same way through FANOUT_LISTEN, FANOUT_METRICS_LISTEN and
// FANOUT_DEV_KAFKA_LISTEN. `go install ./cmd/fanout` installs into a
// directory of the test's (GOBIN), first on the PATH, and no other fanout is
// on it, so the docs' `fanout` is the one their own commands built.
func TestDocs(t *testing.T) {
	t.Parallel()
	if got := kafkaAddrs(t); len(got) != 1 || !strings.HasSuffix(got[0], ":9092") {
		t.Fatalf("the docs use the default Kafka address localhost:9092; FANOUT_TEST_KAFKA is %v", got)
	}
	if got := zkAddrs(t); len(got) != 1 || !strings.HasSuffix(got[0], ":2181") {
		t.Fatalf("the docs use the default ZooKeeper address localhost:2181; FANOUT_TEST_ZOOKEEPER is %v", got)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := doccheck.ReadBlocks(root)
	if err != nil {
		t.Fatal(err)
	}
	env := newDocEnv(t, root)
	var files []string
	byFile := map[string][]doccheck.Block{}
	for _, b := range blocks {
		if _, ok := byFile[b.File]; !ok {
			files = append(files, b.File)
		}
		byFile[b.File] = append(byFile[b.File], b)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) { env.runFile(t, byFile[f]) })
	}
}

// docEnv is where the docs' blocks run.
type docEnv struct {
	root  string
	gobin string            // GOBIN, first on PATH
	ports map[string]string // documented port -> the free port used instead
	env   []string
}

// documentedPorts are the ports the docs name, replaced in their text.
var documentedPorts = []string{"4987", "4988", "4989", "9100", "9101", "9102", "9092"}

func newDocEnv(t *testing.T, root string) *docEnv {
	e := &docEnv{root: root, gobin: filepath.Join(t.TempDir(), "bin"), ports: map[string]string{}}
	if err := os.MkdirAll(e.gobin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range documentedPorts {
		_, port, _ := net.SplitHostPort(procFreeAddr(t))
		e.ports[p] = port
	}
	// The PATH without any fanout of the machine's: GOBIN first.
	path := []string{e.gobin}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, "fanout")); err == nil {
			continue
		}
		path = append(path, dir)
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "FANOUT_") || k == "PATH" || k == "GOBIN" {
			continue
		}
		e.env = append(e.env, kv)
	}
	e.env = append(e.env, "PATH="+strings.Join(path, string(os.PathListSeparator)), "GOBIN="+e.gobin,
		"FANOUT_LISTEN=:"+e.ports["4987"], "FANOUT_METRICS_LISTEN=:"+e.ports["9100"],
		"FANOUT_DEV_KAFKA_LISTEN=127.0.0.1:"+e.ports["9092"])
	return e
}

var documentedPortRE = regexp.MustCompile(`:(` + strings.Join(documentedPorts, "|") + `)\b`)

// subst replaces the documented ports of text by the test's.
func (e *docEnv) subst(text string) string {
	return documentedPortRE.ReplaceAllStringFunc(text, func(m string) string { return ":" + e.ports[m[1:]] })
}

// runFile runs a file's blocks in order. A block that runs until stopped
// is stopped (Ctrl-C) at the end of its section, and must exit 0.
func (e *docEnv) runFile(t *testing.T, blocks []doccheck.Block) {
	var running []*docProc
	section := ""
	stopAll := func() {
		for _, p := range running {
			if code := p.stop(t); !stoppedCleanly(p.block, code) {
				t.Errorf("%s: exit code %d after Ctrl-C at the end of its section:\n%s", p.block, code, p.output())
			}
		}
		running = nil
	}
	defer stopAll()
	for _, b := range blocks {
		if b.Section != section {
			stopAll()
			section = b.Section
		}
		tr, err := b.Treatment()
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("%s: %s", b, tr.Kind)
		switch tr.Kind {
		case doccheck.Code:
		case doccheck.Run:
			p := e.start(t, b, b.Text)
			if code := p.wait(t, 15*time.Minute); code != 0 {
				t.Errorf("%s: exit code %d:\n%s\n%s", b, code, b.Text, p.output())
			}
		case doccheck.Start:
			p := e.start(t, b, b.Text)
			p.waitOutput(t, e.subst(tr.Text))
			t.Logf("%s: printed %q; runs to the end of its section", b, tr.Text)
			running = append(running, p)
		case doccheck.Until:
			p := e.start(t, b, b.Text)
			p.waitOutput(t, e.subst(tr.Text))
			code := p.stop(t)
			if !stoppedCleanly(b, code) {
				t.Errorf("%s: exit code %d after Ctrl-C:\n%s", b, code, p.output())
			}
			t.Logf("%s: printed %q; exit code %d after Ctrl-C", b, tr.Text, code)
		case doccheck.Beside:
			dev := e.start(t, b, "fanout dev\n")
			dev.waitOutput(t, "fanout dev is ready")
			p := e.start(t, b, b.Text)
			if code := p.wait(t, 5*time.Minute); code != 0 {
				t.Errorf("%s: exit code %d beside fanout dev:\n%s\n%s\nfanout dev:\n%s", b, code, b.Text, p.output(), dev.output())
			}
			if code := dev.stop(t); code != 0 {
				t.Errorf("%s: fanout dev exit code %d after Ctrl-C:\n%s", b, code, dev.output())
			}
		case doccheck.Recipe:
			recipe, ok := docRecipes[tr.Text]
			if !ok {
				t.Errorf("%s: no recipe %q in this test", b, tr.Text)
				continue
			}
			p := e.start(t, b, b.Text)
			recipe(t, e, b, p)
			running = append(running, p)
		case doccheck.Outside:
			if !slices.Contains(outsideBlocks, tr.Text) {
				t.Errorf("%s: no test runs the block %q outside the repository (outsideBlocks)", b, tr.Text)
			}
		case doccheck.NotRun:
			t.Logf("%s: not run (%s); checked: %s", b, tr.Reason, tr.Check)
			e.check(t, b, tr.Check)
		default:
			t.Errorf("%s: no way to run a block of kind %q", b, tr.Kind)
		}
	}
}

// docProc is a block running in bash, in a process group of its own.
type docProc struct {
	*procProcess
	block doccheck.Block
}

// backgroundLineRE matches a line that starts a command in the background.
var backgroundLineRE = regexp.MustCompile(`(?m)[^&]&\s*(#.*)?$`)

// epilogue follows a block that starts commands in the background: the
// shell waits for them (Ctrl-C stops them, not it) and fails if one of
// them exited other than 0, so that their exit codes count as a command's.
const epilogue = `
# (the docs test) wait for the block's background commands, fail if one of them failed
trap : INT TERM
failed=0
for j in $(jobs -p); do
  while kill -0 "$j" 2>/dev/null; do wait "$j" || :; done
  s=0; wait "$j" || s=$?
  if [ "$s" -ne 0 ]; then echo "docs test: background command $j exited $s" >&2; failed=1; fi
done
exit "$failed"
`

// start runs text (a block's, or a command of the test's) in bash with
// -e and pipefail, from the root, ports substituted.
func (e *docEnv) start(t *testing.T, b doccheck.Block, text string) *docProc {
	t.Helper()
	script := "set -eo pipefail\n" + e.subst(text)
	if backgroundLineRE.MatchString(text) {
		script += epilogue
	}
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir, cmd.Env = e.root, e.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return &docProc{procProcess: procRunCmd(t, cmd), block: b}
}

// waitOutput waits until the block has printed text, and fails if it ends
// before.
func (p *docProc) waitOutput(t *testing.T, text string) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Minute, fmt.Sprintf("%s to print %q", p.block, text), func() bool {
		if p.exited() && !strings.Contains(p.output(), text) {
			t.Fatalf("%s exited (code %d) without printing %q:\n%s", p.block, p.cmd.ProcessState.ExitCode(), text, p.output())
		}
		return strings.Contains(p.output(), text)
	})
}

// stop is Ctrl-C: SIGINT to the block's process group; it returns the
// exit code.
func (p *docProc) stop(t *testing.T) int {
	t.Helper()
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
	}
	return p.wait(t, 2*time.Minute)
}

// stoppedCleanly says whether a block stopped by Ctrl-C exited as a clean
// stop does: 0; or 1 when its last command is go run, which exits 1 when
// interrupted whatever the program it ran did (fanout's own exit code on
// SIGINT is 0, which the blocks that run the installed fanout check).
func stoppedCleanly(b doccheck.Block, code int) bool {
	if code == 0 {
		return true
	}
	cmds, err := doccheck.Commands(b.Text)
	if err != nil || len(cmds) == 0 {
		return false
	}
	last := cmds[len(cmds)-1].Args
	return code == 1 && len(last) >= 2 && last[0] == "go" && last[1] == "run"
}

// check checks a block that is not run, as its annotation says.
func (e *docEnv) check(t *testing.T, b doccheck.Block, check string) {
	cmds, err := doccheck.Commands(b.Text)
	if err != nil || len(cmds) == 0 {
		t.Errorf("%s: no commands: %v", b, err)
		return
	}
	switch check {
	case doccheck.CheckSelf:
		e.checkSelf(t, b)
	case doccheck.CheckFlags:
		for _, c := range cmds {
			e.checkFlags(t, b, c)
		}
	case doccheck.CheckSyntax:
		if out, err := exec.Command("bash", "-n", "-c", b.Text).CombinedOutput(); err != nil {
			t.Errorf("%s: bash -n: %v\n%s", b, err, out)
		}
		for _, c := range cmds {
			if p, _ := c.Program(); slices.Contains(doccheck.FlagChecked, p) {
				e.checkFlags(t, b, c)
				continue
			}
			cmd := exec.Command("bash", "-c", `command -v -- "$1"`, "_", c.Args[0])
			cmd.Dir, cmd.Env = filepath.Join(e.root, c.Dir), e.env
			if err := cmd.Run(); err != nil {
				t.Errorf("%s: the command %q does not exist here", b, c.Args[0])
			}
		}
	case doccheck.CheckTargets:
		for _, c := range cmds {
			e.checkTargets(t, b, c)
		}
	case doccheck.CheckDocker:
		e.checkDocker(t, b, cmds)
	default:
		t.Errorf("%s: no check %q in this test", b, check)
	}
}

// checkSelf: bin/integration is the command that runs this test: it runs
// go test with the integration tag on the packages that have such files.
func (e *docEnv) checkSelf(t *testing.T, b doccheck.Block) {
	path := filepath.Join(e.root, "bin", "integration")
	st, err := os.Stat(path)
	if err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("%s: bin/integration is not an executable file: %v", b, err)
		return
	}
	script, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`go test .*-tags integration`).Match(script) ||
		!strings.Contains(string(script), "//go:build .*\\bintegration\\b") {
		t.Errorf("%s: bin/integration does not run go test -tags integration on the integration-tagged packages", b)
	}
}

// checkFlags parses a command line with its program's own flag parser:
// the program, run with the line's arguments and --help, must exit 0 (it
// prints its usage once every flag before it parsed; a flag it does not
// know, or a value of the wrong type, exits 2).
func (e *docEnv) checkFlags(t *testing.T, b doccheck.Block, c doccheck.Command) {
	prog, args := c.Program()
	if !slices.Contains(doccheck.FlagChecked, prog) {
		t.Errorf("%s: %q: no flag check for %s", b, c.Line(), prog)
		return
	}
	if prog == "fanout" {
		prog = filepath.Join(e.gobin, prog) // the docs' own go install's
	} else {
		prog = filepath.Join(e.root, prog)
	}
	cmd := exec.Command(prog, append(slices.Clone(args), "--help")...)
	cmd.Dir, cmd.Env = filepath.Join(e.root, c.Dir), append(slices.Clone(e.env), c.Env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%s: %q with --help: %v (its flags do not parse)\n%s", b, c.Line(), err, out)
	}
	t.Logf("%s: the flags of %q parse", b, c.Line())
}

// checkTargets: go test -list finds the fuzz or benchmark targets a go test
// command names, in its package.
func (e *docEnv) checkTargets(t *testing.T, b doccheck.Block, c doccheck.Command) {
	if len(c.Args) < 2 || c.Args[0] != "go" || c.Args[1] != "test" {
		t.Errorf("%s: %q is not go test", b, c.Line())
		return
	}
	var pattern, kind string
	var pkgs []string
	for i := 2; i < len(c.Args); i++ {
		a := c.Args[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case !strings.HasPrefix(a, "-"):
			pkgs = append(pkgs, a)
		case name == "fuzz" || name == "bench":
			if !hasValue {
				i++
				value = c.Args[i]
			}
			pattern, kind = value, map[string]string{"fuzz": "Fuzz", "bench": "Benchmark"}[name]
		case name == "run" || name == "fuzztime" || name == "benchtime" || name == "count":
			if !hasValue {
				i++
			}
		}
	}
	if pattern == "" {
		t.Errorf("%s: %q names no -fuzz or -bench target", b, c.Line())
		return
	}
	cmd := exec.Command("go", append([]string{"test", "-run", "^$", "-list", pattern}, pkgs...)...)
	cmd.Dir, cmd.Env = filepath.Join(e.root, c.Dir), e.env
	out, err := cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^`+kind+`\w*$`).Match(out) {
		t.Errorf("%s: %q: go test -list %s %v finds no %s target: %v\n%s", b, c.Line(), pattern, pkgs, kind, err, out)
	}
}

// checkDocker does what the docker commands would, without Docker: docker
// build builds the Dockerfile's default target, whose entry point is the
// fanout binary; docker run runs that binary with the run's arguments and
// the environment its --link options give (NAME_PORT_<port>_TCP_ADDR and
// _PORT for each linked service: kafka, the test's Kafka, zookeeper, its
// ZooKeeper), on ports of its own, until it is ready; then docker stop
// (SIGTERM), exit 0.
func (e *docEnv) checkDocker(t *testing.T, b doccheck.Block, cmds []doccheck.Command) {
	dockerfile, err := os.ReadFile(filepath.Join(e.root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	entry := regexp.MustCompile(`(?m)^ENTRYPOINT \["(/usr/local/bin/fanout)"\]\s*\z`).FindSubmatch(dockerfile)
	if entry == nil {
		t.Errorf("%s: the Dockerfile's last instruction is not ENTRYPOINT [\"/usr/local/bin/fanout\"]", b)
		return
	}
	built := ""
	for _, c := range cmds {
		a := c.Args
		switch a[1] {
		case "build":
			if len(a) != 5 || a[2] != "-t" || a[4] != "." {
				t.Errorf("%s: %q: want docker build -t IMAGE .", b, c.Line())
				continue
			}
			built = a[3]
		case "run":
			e.dockerRun(t, b, c, built)
		}
	}
}

// linkedServices are the services a docker run may --link to: the port
// their image exposes, and the test's address of them.
func linkedServices(t *testing.T) map[string][2]string {
	_, kport, _ := net.SplitHostPort(kafkaAddrs(t)[0])
	_, zport, _ := net.SplitHostPort(zkAddrs(t)[0])
	return map[string][2]string{"kafka": {"9092", kport}, "zookeeper": {"2181", zport}}
}

func (e *docEnv) dockerRun(t *testing.T, b doccheck.Block, c doccheck.Command, built string) {
	a := c.Args[2:]
	env := slices.Clone(e.env)
	services := linkedServices(t)
	for len(a) > 0 && strings.HasPrefix(a[0], "-") {
		switch a[0] {
		case "-d":
			a = a[1:]
		case "--link":
			name, alias, _ := strings.Cut(a[1], ":")
			s, ok := services[name]
			if !ok {
				t.Errorf("%s: --link %s: no such service here (kafka, zookeeper)", b, a[1])
				return
			}
			prefix := strings.ToUpper(alias) + "_PORT_" + s[0] + "_TCP"
			env = append(env, prefix+"_ADDR=127.0.0.1", prefix+"_PORT="+s[1])
			a = a[2:]
		default:
			t.Errorf("%s: docker run option %s: not known to this test", b, a[0])
			return
		}
	}
	if len(a) == 0 || a[0] != built {
		t.Errorf("%s: %q does not run the image docker build made (%q)", b, c.Line(), built)
		return
	}
	args := a[1:]
	// The container's own ports, on the host: fresh ones.
	metrics := procFreeAddr(t)
	env = append(env, "FANOUT_LISTEN="+procFreeAddr(t), "FANOUT_METRICS_LISTEN="+metrics)
	if topic := flagValue(args, "topic"); topic != "" {
		createDocTopic(t, topic)
	}
	p := procRun(t, filepath.Join(e.gobin, "fanout"), env, args...)
	testutil.WaitFor(t, 2*time.Minute, "the container's daemon to be ready (/readyz 200)", func() bool {
		if p.exited() {
			t.Fatalf("%s: the container's daemon exited:\n%s", b, p.output())
		}
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, time.Minute); code != 0 {
		t.Errorf("%s: the container's daemon exit code %d after SIGTERM (docker stop):\n%s", b, code, p.output())
	}
	t.Logf("%s: %s %v with the links' environment was ready, and stopped", b, built, args)
}

// createDocTopic creates a topic the docs assume exists, if it does not.
func createDocTopic(t *testing.T, topic string) {
	admin, err := sarama.NewClusterAdmin(kafkaAddrs(t), kafka.NewConfig("fanout-integration-admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// flagValue returns the value of --name in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// docRecipes check what a block did once it runs: by the recipe's name.
var docRecipes = map[string]func(t *testing.T, e *docEnv, b doccheck.Block, p *docProc){
	"cluster on one host": recipeClusterOnOneHost,
}

// The README's cluster on one host: with the default Kafka and ZooKeeper
// addresses, every daemon starts and stays up, the highest node id leads
// and the others redirect to it, and every metrics port answers. (They
// are stopped at the end of the section, and must exit 0.)
func recipeClusterOnOneHost(t *testing.T, e *docEnv, b doccheck.Block, p *docProc) {
	cmds, err := doccheck.Commands(e.subst(b.Text))
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*clNode
	for _, c := range cmds {
		if prog, args := c.Program(); prog == "fanout" {
			createDocTopic(t, flagValue(args, "topic"))
			nodes = append(nodes, &clNode{id: flagValue(args, "node-id"), addr: flagValue(args, "advertise")})
		}
	}
	if len(nodes) < 2 {
		t.Fatalf("%s: a cluster of %d daemons", b, len(nodes))
	}
	leader := clWaitLeader(t, nodes, 2*time.Minute)
	if want := nodes[len(nodes)-1]; leader != want {
		t.Errorf("%s: %s leads, want %s (the highest node id)", b, leader.id, want.id)
	}
	for _, c := range cmds {
		_, args := c.Program()
		url := "http://localhost" + flagValue(args, "metrics-listen") + "/healthz"
		testutil.WaitFor(t, time.Minute, url+" to answer 200", func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	if p.exited() {
		t.Errorf("%s: the daemons exited:\n%s", b, p.output())
	}
	t.Logf("%s: %s leads, the others redirect to it, every metrics port answers", b, leader.id)
}
