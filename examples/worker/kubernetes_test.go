package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nanoservice/core-fanout/internal/kube"
)

// checkWorkerContainer returns what is wrong with the worker's container
// in deploy/kubernetes/worker.yaml: a variable the worker does not read,
// arguments its flags refuse or settings it would not run with, and less
// time to stop than its --shutdown-timeout.
func checkWorkerContainer(spec kube.WorkloadSpec) []string {
	var problems []string
	if len(spec.Template.Spec.Containers) != 1 {
		return []string{"want one container, the worker"}
	}
	c := spec.Template.Spec.Containers[0]
	env, _, err := c.Environ(func(string) string { return "" }, func(string, string) string { return "" })
	if err != nil {
		return []string{err.Error()}
	}
	vars := map[string]string{}
	for _, kv := range env {
		name, value := kube.Split(kv)
		vars[name] = value
		found := false
		for _, v := range envVars {
			found = found || v == name
		}
		if !found {
			problems = append(problems, "env "+name+": the worker does not read it")
		}
	}
	var s settings
	fs := newFlags(&s, func(name string) string { return vars[name] })
	fs.SetOutput(&strings.Builder{})
	if len(c.Command) != 0 {
		problems = append(problems, "command replaces the image's entrypoint, the worker")
	}
	if err := fs.Parse(c.Args); err != nil {
		return append(problems, "args: "+err.Error())
	}
	if fs.NArg() != 0 {
		problems = append(problems, "args: stray "+strings.Join(fs.Args(), " "))
	}
	if err := s.check(); err != nil {
		problems = append(problems, err.Error())
	}
	if g := spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || float64(*g) <= s.shutdownTimeout.Seconds() {
		problems = append(problems, "terminationGracePeriodSeconds: want more than --shutdown-timeout "+s.shutdownTimeout.String())
	}
	return problems
}

func loadWorker(t *testing.T) kube.WorkloadSpec {
	t.Helper()
	objs, err := kube.Load(filepath.Join("..", "..", "deploy", "kubernetes", "worker.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dep, ok := kube.Find(objs, "Deployment", "fanout-worker")
	if !ok {
		t.Fatal("worker.yaml has no Deployment fanout-worker")
	}
	var spec kube.WorkloadSpec
	if err := dep.Decode(&spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

// The worker Deployment's container runs the worker with flags and
// variables it reads, and stops within its grace period.
func TestKubernetesWorker(t *testing.T) {
	t.Parallel()
	for _, p := range checkWorkerContainer(loadWorker(t)) {
		t.Error(p)
	}
}

// checkWorkerContainer finds each kind of mistake on altered copies.
func TestKubernetesWorkerChecksCanFail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		alter func(c *kube.Container, spec *kube.WorkloadSpec)
		want  string
	}{
		{"a variable the worker does not read", func(c *kube.Container, _ *kube.WorkloadSpec) { c.Env[0].Name = "FANOUT_ADDRS" },
			"env FANOUT_ADDRS: the worker does not read it"},
		{"an unknown flag", func(c *kube.Container, _ *kube.WorkloadSpec) { c.Args = append(c.Args, "--workers", "3") },
			"flag provided but not defined: -workers"},
		{"no target", func(c *kube.Container, _ *kube.WorkloadSpec) {
			c.Env = slices.DeleteFunc(c.Env, func(e kube.EnvVar) bool { return e.Name == "WORKER_TARGET" })
		}, "--target is required"},
		{"a grace period shorter than the shutdown", func(c *kube.Container, _ *kube.WorkloadSpec) {
			c.Args = append(c.Args, "--shutdown-timeout", "45s")
		}, "terminationGracePeriodSeconds"},
	} {
		spec := loadWorker(t)
		c := &spec.Template.Spec.Containers[0]
		tc.alter(c, &spec)
		problems := checkWorkerContainer(spec)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: problems %q, want one with %q", tc.name, problems, tc.want)
		}
	}
}
