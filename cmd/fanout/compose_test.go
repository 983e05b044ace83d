package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"
	"golang.org/x/mod/modfile"

	"github.com/nanoservice/core-fanout/fanout"
)

// These tests check docker-compose.yml, Dockerfile and .dockerignore
// without Docker: the files are parsed, and the daemons' commands are
// parsed by the daemon's own flags (newApp), so a renamed flag breaks them.

// repoFile reads a file at the repository root.
func repoFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// composeFile is the part of the compose specification the tests read.
type composeFile struct {
	Version  *string                   `yaml:"version"`
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string                      `yaml:"image"`
	Build       any                         `yaml:"build"`
	Entrypoint  []string                    `yaml:"entrypoint"`
	Command     []string                    `yaml:"command"`
	Ports       []string                    `yaml:"ports"`
	Environment map[string]string           `yaml:"environment"`
	DependsOn   map[string]composeDependsOn `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

type composeDependsOn struct {
	Condition string `yaml:"condition"`
}

func loadCompose(t *testing.T, name string) composeFile {
	t.Helper()
	var f composeFile
	if err := yaml.Unmarshal(repoFile(t, name), &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

// daemonOptions parses args as the daemon's command line and returns the
// options it would run with.
func daemonOptions(t *testing.T, args []string) fanout.Options {
	t.Helper()
	return daemonOptionsEnv(t, args, nil)
}

// daemonOptionsEnv is daemonOptions with the environment env (NAME=value)
// set for the parse (t.Setenv: the test must not be parallel), as the
// daemon's flags and secrets read it.
func daemonOptionsEnv(t *testing.T, args, env []string) fanout.Options {
	t.Helper()
	opts, err := parseDaemon(t, args, env)
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// parseDaemon parses args as the daemon's command line with the environment
// env set (t.Setenv), and returns the validated options or why the daemon
// would not run with them.
func parseDaemon(t *testing.T, args, env []string) (fanout.Options, error) {
	t.Helper()
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		t.Setenv(name, value)
	}
	app := newApp(io.Discard, io.Discard)
	var opts fanout.Options
	parsed := false
	app.Action = func(c *cli.Context) error {
		if c.Args().Present() {
			return fmt.Errorf("stray argument %q", c.Args().First())
		}
		var err error
		opts, err = serveOptions(c, env)
		parsed = true
		return err
	}
	if err := runCLI(context.Background(), app, append([]string{"fanout"}, args...)); err != nil {
		return opts, fmt.Errorf("the daemon rejects command %v: %w", args, err)
	}
	if !parsed {
		return opts, fmt.Errorf("command %v does not run the daemon", args)
	}
	if err := opts.Validate(); err != nil {
		return opts, fmt.Errorf("command %v: %w", args, err)
	}
	return opts, nil
}

func TestComposeFile(t *testing.T) {
	t.Parallel()
	checkCompose(t, "docker-compose.yml", true)
}

// The variant without ZooKeeper: the same cluster, its daemons with
// --offset-store kafka and no ZooKeeper service, flag or dependency.
func TestComposeFileWithoutZooKeeper(t *testing.T) {
	t.Parallel()
	f := checkCompose(t, "docker-compose.no-zookeeper.yml", false)
	for name, s := range f.Services {
		if strings.Contains(strings.ToLower(strings.Join(append(slices.Clone(s.Command), s.Image), " ")), "zookeeper") {
			t.Errorf("service %s still mentions ZooKeeper: %v", name, s.Command)
		}
	}
}

// checkCompose checks the compose file name against the daemon's flags; the
// daemons use ZooKeeper when withZooKeeper, else the Kafka offset store.
func checkCompose(t *testing.T, file string, withZooKeeper bool) composeFile {
	t.Helper()
	f := loadCompose(t, file)
	if f.Version != nil {
		t.Errorf("%s has the obsolete version key %q", file, *f.Version)
	}
	services := []string{"kafka", "topics", "fanout1", "fanout2", "fanout3", "consumer"}
	if withZooKeeper {
		services = append(services, "zookeeper")
	} else if _, ok := f.Services["zookeeper"]; ok {
		t.Errorf("%s has a zookeeper service", file)
	}
	for _, name := range services {
		if _, ok := f.Services[name]; !ok {
			t.Fatalf("%s: service %s missing", file, name)
		}
	}

	// Kafka: KRaft single node advertising an address the services resolve.
	kafka := f.Services["kafka"]
	if want := "apache/kafka:" + testedKafkaVersion(t); kafka.Image != want {
		t.Errorf("kafka image %q, want %s, the version the tests run (bin/deps)", kafka.Image, want)
	}
	for _, k := range []string{"KAFKA_NODE_ID", "KAFKA_PROCESS_ROLES", "KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS",
		"KAFKA_CONTROLLER_QUORUM_VOTERS", "KAFKA_CONTROLLER_LISTENER_NAMES", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"} {
		if kafka.Environment[k] == "" {
			t.Errorf("kafka environment lacks %s", k)
		}
	}
	adv, err := url.Parse(kafka.Environment["KAFKA_ADVERTISED_LISTENERS"])
	if err != nil || adv.Host == "" || !strings.Contains(kafka.Environment["KAFKA_LISTENERS"], ":"+adv.Port()) {
		t.Fatalf("KAFKA_ADVERTISED_LISTENERS %q: want one listener that KAFKA_LISTENERS (%q) listens on",
			kafka.Environment["KAFKA_ADVERTISED_LISTENERS"], kafka.Environment["KAFKA_LISTENERS"])
	}
	if _, ok := f.Services[adv.Hostname()]; !ok {
		t.Errorf("Kafka advertises %s, not a service name", adv.Host)
	}
	kafkaAddr := adv.Host
	zkAddr := "zookeeper:2181" // the official image listens on 2181 unless ZOO_PORT says otherwise
	if p := f.Services["zookeeper"].Environment["ZOO_PORT"]; p != "" {
		zkAddr = net.JoinHostPort("zookeeper", p)
	}
	healthChecked := []string{"kafka"}
	if withZooKeeper {
		healthChecked = append(healthChecked, "zookeeper")
	}
	for _, name := range healthChecked {
		if hc := f.Services[name].Healthcheck; hc == nil || len(hc.Test) == 0 {
			t.Errorf("service %s has no healthcheck (others wait for it to be healthy)", name)
		}
	}

	// The daemons: the daemon's own flags, one cluster, distinct host ports.
	_, listenPort, _ := net.SplitHostPort(fanout.DefaultListen)
	var advertised []string
	hostPorts := map[string]string{}
	for _, name := range []string{"fanout1", "fanout2", "fanout3"} {
		s := f.Services[name]
		if s.Build == nil || s.Image != "nanoservice/fanout" {
			t.Errorf("%s: want built from the Dockerfile as nanoservice/fanout, have build %v image %q", name, s.Build, s.Image)
		}
		opts := daemonOptions(t, s.Command)
		if opts.ID != "service_x" || opts.Topic != "user_need" {
			t.Errorf("%s: --id %q --topic %q, want service_x and user_need", name, opts.ID, opts.Topic)
		}
		if !slices.Equal(opts.Kafka, []string{kafkaAddr}) {
			t.Errorf("%s: --kafka %v, want Kafka's advertised listener %s", name, opts.Kafka, kafkaAddr)
		}
		switch {
		case withZooKeeper && (opts.OffsetStore != fanout.OffsetStoreZooKeeper || !slices.Equal(opts.ZooKeeper, []string{zkAddr})):
			t.Errorf("%s: --offset-store %s --zookeeper %v, want zookeeper at %s", name, opts.OffsetStore, opts.ZooKeeper, zkAddr)
		case !withZooKeeper && (opts.OffsetStore != fanout.OffsetStoreKafka || len(opts.ZooKeeper) != 0):
			t.Errorf("%s: --offset-store %s --zookeeper %v, want kafka and no ZooKeeper", name, opts.OffsetStore, opts.ZooKeeper)
		}
		_, port, err := net.SplitHostPort(opts.Listen)
		if err != nil || port != listenPort {
			t.Errorf("%s: --listen %q, want port %s", name, opts.Listen, listenPort)
		}
		if want := net.JoinHostPort(name, port); opts.Advertise != want {
			t.Errorf("%s: --advertise %q, want %s", name, opts.Advertise, want)
		}
		advertised = append(advertised, opts.Advertise)
		_, metricsPort, err := net.SplitHostPort(opts.MetricsListen)
		if err != nil {
			t.Fatalf("%s: --metrics-listen %q: %v", name, opts.MetricsListen, err)
		}
		if len(s.Ports) != 2 {
			t.Fatalf("%s: ports %v, want two: the client port and the metrics port", name, s.Ports)
		}
		for i, want := range []string{port, metricsPort} {
			host, container, ok := strings.Cut(s.Ports[i], ":")
			if !ok || container != want {
				t.Errorf("%s: port %q does not publish port %s", name, s.Ports[i], want)
			}
			if other, dup := hostPorts[host]; dup {
				t.Errorf("%s and %s both publish host port %s", other, name, host)
			}
			hostPorts[host] = name
		}
		// The health check runs the image's own binary: a command it has.
		if hc := s.Healthcheck; hc == nil || len(hc.Test) < 3 || hc.Test[0] != "CMD" || filepath.Base(hc.Test[1]) != "fanout" {
			t.Errorf("%s: healthcheck %v, want [CMD /usr/local/bin/fanout healthcheck]", name, s.Healthcheck)
		} else if !hasCommand(hc.Test[2]) {
			t.Errorf("%s: healthcheck runs fanout %s, which is not a command", name, hc.Test[2])
		}
		deps := map[string]string{"topics": "service_completed_successfully"}
		if withZooKeeper {
			deps["zookeeper"] = "service_healthy"
		}
		for dep, cond := range deps {
			if got := s.DependsOn[dep].Condition; got != cond {
				t.Errorf("%s: depends_on %s condition %q, want %s", name, dep, got, cond)
			}
		}
		if len(s.DependsOn) != len(deps) {
			t.Errorf("%s: depends_on %v, want exactly %v", name, s.DependsOn, deps)
		}
	}
	if got := slices.Sorted(maps.Keys(hostPorts)); !slices.Equal(got, []string{"4987", "4988", "4989", "9100", "9101", "9102"}) {
		t.Errorf("host ports %v, want 4987-4989 and 9100-9102", got)
	}
	// The consumer starts once every daemon is healthy.
	for _, name := range []string{"fanout1", "fanout2", "fanout3"} {
		if got := f.Services["consumer"].DependsOn[name].Condition; got != "service_healthy" {
			t.Errorf("consumer: depends_on %s condition %q, want service_healthy", name, got)
		}
	}

	// The topics the daemons need, created once Kafka is healthy.
	topics := f.Services["topics"]
	if topics.DependsOn["kafka"].Condition != "service_healthy" {
		t.Errorf("topics: want depends_on kafka service_healthy, have %v", topics.DependsOn)
	}
	script := strings.Join(append(slices.Clone(topics.Entrypoint), topics.Command...), " ")
	for _, want := range []string{"/opt/kafka/bin/kafka-topics.sh", "--bootstrap-server " + kafkaAddr,
		"user_need:8", "fanout_service_x_user_need:1"} {
		if !strings.Contains(script, want) {
			t.Errorf("topics command does not contain %q:\n%s", want, script)
		}
	}

	// The consumer connects to every daemon by its advertised address.
	consumer := f.Services["consumer"]
	i := slices.Index(consumer.Command, "--connect")
	if i < 0 || i+1 >= len(consumer.Command) {
		t.Fatalf("consumer command %v: no --connect", consumer.Command)
	}
	if got := strings.Split(consumer.Command[i+1], ","); !slices.Equal(got, advertised) {
		t.Errorf("consumer --connect %v, want the daemons %v", got, advertised)
	}
	build, _ := consumer.Build.(map[string]any)
	target, _ := build["target"].(string)
	if _, ok := dockerStages(t)[target]; !ok {
		t.Errorf("consumer build target %q is not a Dockerfile stage", target)
	}
	return f
}

// dockerStage is one stage of the Dockerfile: its instructions, with line
// continuations joined.
type dockerStage struct {
	from  string
	instr [][2]string // keyword (upper case), arguments
}

// dockerStages parses the Dockerfile into its stages, by name; the last
// stage (the default target) is also under "".
func dockerStages(t *testing.T) map[string]*dockerStage {
	t.Helper()
	text := strings.ReplaceAll(string(repoFile(t, "Dockerfile")), "\\\n", " ")
	stages := map[string]*dockerStage{}
	var cur *dockerStage
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kw, args, _ := strings.Cut(line, " ")
		kw, args = strings.ToUpper(kw), strings.TrimSpace(args)
		if kw == "FROM" {
			f := strings.Fields(args)
			cur = &dockerStage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				stages[f[2]] = cur
			}
			stages[""] = cur
			continue
		}
		if cur == nil {
			if kw != "ARG" {
				t.Fatalf("Dockerfile: %s before FROM", kw)
			}
			continue
		}
		cur.instr = append(cur.instr, [2]string{kw, args})
	}
	return stages
}

func (s *dockerStage) all(kw string) []string {
	var out []string
	for _, in := range s.instr {
		if in[0] == kw {
			out = append(out, in[1])
		}
	}
	return out
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	stages := dockerStages(t)
	build, ok := stages["build"]
	if !ok || !strings.HasPrefix(build.from, "golang:") {
		t.Fatalf("no golang build stage named build")
	}
	runs := strings.Join(build.all("RUN"), "\n")
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.version=", "./cmd/fanout"} {
		if !strings.Contains(runs, want) {
			t.Errorf("build stage does not contain %q", want)
		}
	}
	// Every program a stage starts is copied into it from a path that the
	// build stage writes with go build -o.
	built := map[string]string{} // output path -> package
	for _, m := range regexp.MustCompile(`-o (\S+) (\./\S+)`).FindAllStringSubmatch(runs, -1) {
		built[m[1]] = m[2]
		if _, err := os.Stat(filepath.Join("..", "..", m[2])); err != nil {
			t.Errorf("build stage builds %s: %v", m[2], err)
		}
	}
	for name, s := range stages {
		if name == "build" {
			continue
		}
		eps := s.all("ENTRYPOINT")
		if len(eps) != 1 {
			t.Fatalf("stage %q: %d ENTRYPOINTs, want 1", name, len(eps))
		}
		var ep []string
		if err := json.Unmarshal([]byte(eps[0]), &ep); err != nil || len(ep) == 0 {
			t.Fatalf("stage %q: ENTRYPOINT %s is not in exec (JSON) form", name, eps[0])
		}
		copied := false
		for _, c := range s.all("COPY") {
			f := strings.Fields(c)
			if len(f) == 3 && f[0] == "--from=build" && f[2] == ep[0] && built[f[1]] != "" {
				copied = true
			}
		}
		if !copied {
			t.Errorf("stage %q: ENTRYPOINT %s is not copied from a go build output of the build stage", name, ep[0])
		}
		if users := s.all("USER"); len(users) == 0 || strings.HasPrefix(users[len(users)-1], "root") || users[len(users)-1] == "0" {
			t.Errorf("stage %q runs as root", name)
		}
	}

	final := stages[""]
	var ep []string
	_ = json.Unmarshal([]byte(final.all("ENTRYPOINT")[0]), &ep)
	if filepath.Base(ep[0]) != "fanout" || len(ep) != 1 {
		t.Errorf("the default image's ENTRYPOINT %v: want only the fanout binary, so that arguments are its flags", ep)
	}
	_, listenPort, _ := net.SplitHostPort(fanout.DefaultListen)
	exposed := strings.Fields(strings.Join(final.all("EXPOSE"), " "))
	for _, p := range []string{listenPort, "9100"} {
		if !slices.Contains(exposed, p) {
			t.Errorf("EXPOSE %v lacks %s", exposed, p)
		}
	}
	// The distroless image has no curl: the health check is the binary's own.
	hcs := final.all("HEALTHCHECK")
	if len(hcs) != 1 {
		t.Fatalf("the default image has %d HEALTHCHECKs, want 1", len(hcs))
	}
	_, cmd, ok := strings.Cut(hcs[0], "CMD ")
	var hc []string
	if !ok || json.Unmarshal([]byte(cmd), &hc) != nil || len(hc) != 2 || hc[0] != ep[0] || !hasCommand(hc[1]) {
		t.Errorf("HEALTHCHECK %q: want CMD [%q, \"healthcheck\"] in exec form", hcs[0], ep[0])
	}
}

// The build stage downloads the modules before it copies the sources (a
// cached layer): the files it copies for that exist, and they include the
// go.mod and go.sum of every module the daemon's go.mod replaces by a
// directory of the repository, without which go mod download fails.
func TestDockerfileCopiesTheModules(t *testing.T) {
	t.Parallel()
	build := dockerStages(t)["build"]
	if build == nil {
		t.Fatal("no build stage")
	}
	copied := map[string]bool{}
	for _, in := range build.instr {
		if in[0] == "RUN" {
			break
		}
		if in[0] != "COPY" {
			continue
		}
		f := strings.Fields(in[1])
		for _, src := range f[:len(f)-1] {
			if strings.HasPrefix(src, "--") {
				continue
			}
			if _, err := os.Stat(filepath.Join("..", "..", src)); err != nil {
				t.Errorf("COPY %s: %v", in[1], err)
			}
			copied[filepath.Clean(src)] = true
		}
	}
	mf, err := modfile.Parse("go.mod", repoFile(t, "go.mod"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range mf.Replace {
		if !modfile.IsDirectoryPath(r.New.Path) {
			continue
		}
		for _, f := range []string{"go.mod", "go.sum"} {
			if p := filepath.Join(r.New.Path, f); !copied[p] {
				t.Errorf("the build stage does not copy %s (of %s) before its first RUN", p, r.Old.Path)
			}
		}
	}
}

// testedKafkaVersion is the Kafka version bin/deps installs for the tests.
func testedKafkaVersion(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^KAFKA_VERSION=(\S+)$`).FindSubmatch(repoFile(t, "bin/deps"))
	if m == nil {
		t.Fatal("bin/deps sets no KAFKA_VERSION")
	}
	return string(m[1])
}

// hasCommand reports whether the fanout command line has a command name.
func hasCommand(name string) bool {
	return slices.ContainsFunc(newApp(io.Discard, io.Discard).Commands, func(c *cli.Command) bool { return c.Name == name })
}

func TestDockerignore(t *testing.T) {
	t.Parallel()
	lines := strings.Split(string(repoFile(t, ".dockerignore")), "\n")
	for _, want := range []string{".git", ".cache", ".run"} {
		if !slices.Contains(lines, want) && !slices.Contains(lines, "/"+want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}
