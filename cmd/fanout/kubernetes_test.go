package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/internal/kube"
	"github.com/nanoservice/core-fanout/internal/promcheck"
)

// These tests check the Kubernetes manifests of deploy/kubernetes without a
// cluster: the files are parsed, the daemon's container is run through the
// daemon's own flag parser and Validate with its arguments and its
// environment expanded as the kubelet expands it, and its ports, probes and
// advertised address are compared with what the daemon then listens on and
// serves. The example worker's container is checked against the worker's
// flags in examples/worker; whether the KEDA queries' metrics exist is
// checked against running daemons in integration/monitoring_test.go.

const kubeDir = "deploy/kubernetes"

// kubeObjects loads a manifest file of deploy/kubernetes.
func kubeObjects(t *testing.T, name string) []kube.Object {
	t.Helper()
	objs, err := kube.Load(filepath.Join("..", "..", kubeDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// decode decodes o's spec into a new T.
func decode[T any](t *testing.T, o kube.Object) T {
	t.Helper()
	var spec T
	if err := o.Decode(&spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

// only returns the one object of kind in objs.
func only(t *testing.T, objs []kube.Object, kind string) kube.Object {
	t.Helper()
	of := kube.OfKind(objs, kind)
	if len(of) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(of), kind)
	}
	return of[0]
}

// selects reports whether a selector matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// daemonEnvVars returns the environment variables the daemon reads: its
// flags' and its secrets'.
func daemonEnvVars() map[string]bool {
	out := map[string]bool{}
	for _, f := range append(logFlags(), serveFlags()...) {
		if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
			for _, e := range ev.GetEnvVars() {
				out[e] = true
			}
		}
	}
	for _, s := range secrets {
		out["FANOUT_"+s] = true
	}
	return out
}

// portOf returns the port number of a host:port address.
func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return n
}

// kubeDaemon is the daemon's StatefulSet as the tests read it.
type kubeDaemon struct {
	name      string // the StatefulSet's
	spec      kube.WorkloadSpec
	container kube.Container
	services  map[string]kube.ServiceSpec // by name
	headless  string                      // the StatefulSet's governing Service
}

func loadKubeDaemon(t *testing.T) kubeDaemon {
	t.Helper()
	objs := kubeObjects(t, "fanout.yaml")
	sts := only(t, objs, "StatefulSet")
	d := kubeDaemon{name: sts.Metadata.Name, spec: decode[kube.WorkloadSpec](t, sts), services: map[string]kube.ServiceSpec{}}
	for _, o := range kube.OfKind(objs, "Service") {
		d.services[o.Metadata.Name] = decode[kube.ServiceSpec](t, o)
	}
	if cs := d.spec.Template.Spec.Containers; len(cs) != 1 {
		t.Fatalf("the StatefulSet has %d containers, want the daemon alone", len(cs))
	}
	d.container = d.spec.Template.Spec.Containers[0]
	d.headless = d.spec.ServiceName
	return d
}

// kubeNamespace is the namespace the checks expand the manifests in.
const kubeNamespace = "queues"

// checkKubeDaemon returns what is wrong with the daemons' StatefulSet: an
// environment variable the daemon does not read (other than a helper that
// other variables refer to), arguments or an environment the daemon
// refuses, container ports other than those it listens on, an advertised
// address other than its pod's stable name under the headless Service, a
// node id other than the pod's name, probes on paths its metrics handler
// does not serve (or serves only with the metrics token) or on another
// port, and less time to stop than it takes to drain. It sets the
// environment with t.Setenv.
func checkKubeDaemon(t *testing.T, d kubeDaemon) []string {
	t.Helper()
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	pod := metav(d.spec.Template.Metadata.Labels)
	if !selects(d.spec.Selector.MatchLabels, pod) {
		bad("the StatefulSet's selector %v does not match its pods' labels %v", d.spec.Selector.MatchLabels, pod)
	}
	c := d.container
	if repo, _, _ := strings.Cut(c.Image, ":"); repo != "nanoservice/fanout" {
		bad("image %q, want nanoservice/fanout (the Dockerfile's default target, as docker-compose.yml names it)", c.Image)
	}
	if len(c.Command) != 0 {
		bad("command %v replaces the image's entrypoint, the daemon", c.Command)
	}

	podName := d.name + "-1"
	env, referenced, err := c.Environ(func(path string) string {
		switch path {
		case "metadata.name":
			return podName
		case "metadata.namespace":
			return kubeNamespace
		}
		bad("env from field %s: not one these checks know", path)
		return ""
	}, func(name, key string) string { return "secret-" + name + "-" + key + "-0123456789" })
	if err != nil {
		return append(problems, err.Error())
	}
	accepted := daemonEnvVars()
	for _, kv := range env {
		name, _ := kube.Split(kv)
		switch {
		case accepted[name]:
		case strings.HasPrefix(name, "FANOUT_"):
			bad("env %s: the daemon reads no such variable", name)
		case !referenced[name]:
			bad("env %s: the daemon does not read it and no other variable refers to it", name)
		}
	}
	opts, err := parseDaemon(t, c.Args, env)
	if err != nil {
		return append(problems, err.Error())
	}

	// Ports: the container declares what the daemon listens on.
	clientPort, ok := c.Port(kube.IntOrString{Name: "client"})
	if !ok || clientPort != portOf(t, opts.Listen) {
		bad("container port client %d (declared %v), the daemon listens on %s", clientPort, ok, opts.Listen)
	}
	metricsPort, ok := c.Port(kube.IntOrString{Name: "metrics"})
	if !ok || opts.MetricsListen == "" || metricsPort != portOf(t, opts.MetricsListen) {
		bad("container port metrics %d (declared %v), the daemon serves metrics on %q", metricsPort, ok, opts.MetricsListen)
	}

	// The advertised address: the pod's name under the headless Service,
	// on the client port, and a node id per pod.
	headless, ok := d.services[d.headless]
	if !ok || headless.ClusterIP != "None" || !headless.PublishNotReadyAddresses || !selects(headless.Selector, pod) {
		bad("serviceName %q: want a headless Service (clusterIP None, publishNotReadyAddresses) selecting the pods, have %+v",
			d.headless, headless)
	}
	if want := fmt.Sprintf("%s.%s.%s.svc.cluster.local:%d", podName, d.headless, kubeNamespace, clientPort); opts.Advertise != want {
		bad("the daemon advertises %q, want %s", opts.Advertise, want)
	}
	if opts.NodeID != podName {
		bad("node id %q, want the pod's name %s", opts.NodeID, podName)
	}

	// Every Service selects the pods and targets ports the container has.
	for name, svc := range d.services {
		if !selects(svc.Selector, pod) {
			bad("Service %s selects %v, not the daemons %v", name, svc.Selector, pod)
		}
		for _, p := range svc.Ports {
			if _, ok := c.Port(p.TargetPort); !ok {
				bad("Service %s port %s targets %+v, which the container does not declare", name, p.Name, p.TargetPort)
			}
		}
	}

	// Probes: the paths the daemon's metrics handler serves, open even
	// with a metrics token, on the metrics port.
	snapshot := func(context.Context) metrics.Snapshot { return metrics.Snapshot{} }
	h := metrics.Handler(metrics.HandlerConfig{Collector: metrics.NewCollector(snapshot), Snapshot: snapshot, Token: "probe-test-token"})
	for _, p := range []struct {
		kind  string
		probe *kube.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			bad("no %s probe (HTTP GET %s)", p.kind, p.path)
			continue
		}
		get := p.probe.HTTPGet
		if port, ok := c.Port(get.Port); !ok || port != metricsPort {
			bad("%s probe on port %+v, want the metrics port %d", p.kind, get.Port, metricsPort)
		}
		if get.Path != p.path {
			bad("%s probe on %s, want %s", p.kind, get.Path, p.path)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, get.Path, nil))
		if rec.Code != http.StatusOK && rec.Code != http.StatusServiceUnavailable {
			bad("%s probe: GET %s answers %d", p.kind, get.Path, rec.Code)
		}
	}
	if c.StartupProbe != nil {
		bad("a startup probe: /readyz already tells when a daemon serves")
	}

	grace := d.spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || float64(*grace) <= opts.DrainTimeout.Seconds() {
		bad("terminationGracePeriodSeconds %v, want more than the drain timeout %v", grace, opts.DrainTimeout)
	}
	return problems
}

// The daemons' StatefulSet as shipped passes checkKubeDaemon.
func TestKubernetesDaemon(t *testing.T) {
	for _, p := range checkKubeDaemon(t, loadKubeDaemon(t)) {
		t.Error(p)
	}
}

// checkKubeDaemon finds each kind of mistake, on altered copies of the
// shipped StatefulSet.
func TestKubernetesDaemonChecksCanFail(t *testing.T) {
	env := func(d *kubeDaemon, name string) *kube.EnvVar {
		for i := range d.container.Env {
			if d.container.Env[i].Name == name {
				return &d.container.Env[i]
			}
		}
		t.Fatalf("the shipped container has no %s", name)
		return nil
	}
	port := func(d *kubeDaemon, name string) *int {
		for i := range d.container.Ports {
			if d.container.Ports[i].Name == name {
				return &d.container.Ports[i].ContainerPort
			}
		}
		t.Fatalf("the shipped container has no port %s", name)
		return nil
	}
	for _, tc := range []struct {
		name  string
		alter func(d *kubeDaemon)
		want  string
	}{
		{"a variable the daemon does not read", func(d *kubeDaemon) { env(d, "FANOUT_LISTEN").Name = "FANOUT_LISTEN_ADDR" },
			"env FANOUT_LISTEN_ADDR: the daemon reads no such variable"},
		{"a helper nobody refers to", func(d *kubeDaemon) {
			d.container.Env = append(d.container.Env, kube.EnvVar{Name: "ZONE", Value: "a"})
		}, "env ZONE: the daemon does not read it"},
		{"a flag the daemon does not know", func(d *kubeDaemon) { d.container.Args = []string{"--metrics-port", "9100"} },
			"the daemon rejects command"},
		{"a value the daemon refuses", func(d *kubeDaemon) { env(d, "FANOUT_OFFSET_STORE").Value = "etcd" }, "offset-store"},
		{"a container port the daemon does not listen on", func(d *kubeDaemon) { *port(d, "metrics") = 9101 },
			"container port metrics 9101"},
		{"an advertised name other than the pod's", func(d *kubeDaemon) {
			env(d, "FANOUT_ADVERTISE").Value = "$(POD_NAME).fanout-clients.$(POD_NAMESPACE).svc.cluster.local:4987"
		}, "the daemon advertises"},
		{"a shared node id", func(d *kubeDaemon) { env(d, "FANOUT_NODE_ID").Value = "fanout" }, "node id \"fanout\""},
		{"a probe path the daemon does not serve", func(d *kubeDaemon) { d.container.ReadinessProbe.HTTPGet.Path = "/ready" },
			"GET /ready answers 404"},
		{"a probe on the client port", func(d *kubeDaemon) {
			d.container.LivenessProbe.HTTPGet.Port = kube.IntOrString{Name: "client"}
		}, "liveness probe on port"},
		{"less time to stop than to drain", func(d *kubeDaemon) {
			five := 5
			d.spec.Template.Spec.TerminationGracePeriodSeconds = &five
		}, "terminationGracePeriodSeconds"},
		{"a Service port the container lacks", func(d *kubeDaemon) {
			svc := d.services[d.headless]
			svc.Ports = slices.Clone(svc.Ports)
			svc.Ports[0].TargetPort = kube.IntOrString{Name: "grpc"}
			d.services[d.headless] = svc
		}, "which the container does not declare"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := loadKubeDaemon(t)
			tc.alter(&d)
			problems := checkKubeDaemon(t, d)
			found := false
			for _, p := range problems {
				found = found || strings.Contains(p, tc.want)
			}
			if !found {
				t.Errorf("problems %q, want one with %q", problems, tc.want)
			}
		})
	}
}

// The worker connects to a Service that reaches the daemons' client port,
// KEDA scales that worker Deployment on Prometheus queries of the job that
// prometheus.yml scrapes the daemons as, and that scrape finds the daemons
// through the headless Service on their metrics port.
func TestKubernetesWorkerAndScaling(t *testing.T) {
	d := loadKubeDaemon(t)
	clientPort, _ := d.container.Port(kube.IntOrString{Name: "client"})
	metricsPort, _ := d.container.Port(kube.IntOrString{Name: "metrics"})

	workers := kubeObjects(t, "worker.yaml")
	dep := only(t, workers, "Deployment")
	wspec := decode[kube.WorkloadSpec](t, dep)
	if !selects(wspec.Selector.MatchLabels, metav(wspec.Template.Metadata.Labels)) {
		t.Errorf("the worker's selector does not match its pods")
	}
	wc := wspec.Template.Spec.Containers[0]
	if repo, _, _ := strings.Cut(wc.Image, ":"); repo != "nanoservice/fanout-example-worker" {
		t.Errorf("worker image %q, want nanoservice/fanout-example-worker", wc.Image)
	}
	stage, ok := dockerStages(t)["example-worker"]
	if !ok {
		t.Fatal("the Dockerfile has no example-worker stage for the worker image")
	}
	if eps := stage.all("ENTRYPOINT"); len(eps) != 1 || !strings.Contains(eps[0], "example-worker") ||
		!strings.Contains(strings.Join(dockerStages(t)["build"].all("RUN"), " "), "-o /out/example-worker ./examples/worker") {
		t.Errorf("the example-worker stage does not run ./examples/worker: %v", eps)
	}
	env, _, err := wc.Environ(func(string) string { return "" }, func(string, string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	connect := ""
	for _, kv := range env {
		if name, value := kube.Split(kv); name == "FANOUT_CONNECT" {
			connect = value
		}
	}
	if connect == "" {
		t.Fatal("the worker has no FANOUT_CONNECT")
	}
	for _, addr := range strings.Split(connect, ",") {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("FANOUT_CONNECT %q: %v", connect, err)
		}
		svc, ok := d.services[strings.Split(host, ".")[0]]
		if !ok {
			t.Errorf("FANOUT_CONNECT %s: no Service %s in fanout.yaml", addr, host)
			continue
		}
		reaches := false
		for _, p := range svc.Ports {
			target, _ := d.container.Port(p.TargetPort)
			reaches = reaches || strconv.Itoa(p.Port) == port && target == clientPort
		}
		if !reaches {
			t.Errorf("FANOUT_CONNECT %s: the Service's port %s does not reach the daemons' client port %d", addr, port, clientPort)
		}
	}

	// The scrape: the headless Service's name in some namespace, the
	// metrics port, job fanout.
	var prom struct {
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			DNSSDConfigs []struct {
				Names []string `yaml:"names"`
				Type  string   `yaml:"type"`
				Port  int      `yaml:"port"`
			} `yaml:"dns_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(repoFile(t, kubeDir+"/prometheus.yml"), &prom); err != nil {
		t.Fatal(err)
	}
	if len(prom.ScrapeConfigs) != 1 || len(prom.ScrapeConfigs[0].DNSSDConfigs) != 1 {
		t.Fatalf("prometheus.yml: want one scrape job with one dns_sd_config, have %+v", prom.ScrapeConfigs)
	}
	job := prom.ScrapeConfigs[0].JobName
	sd := prom.ScrapeConfigs[0].DNSSDConfigs[0]
	if len(sd.Names) != 1 || !strings.HasPrefix(sd.Names[0], d.headless+".") || !strings.HasSuffix(sd.Names[0], ".svc.cluster.local") ||
		sd.Type != "A" || sd.Port != metricsPort {
		t.Errorf("prometheus.yml finds %v (%s) port %d, want the A records of the headless Service %s, port %d",
			sd.Names, sd.Type, sd.Port, d.headless, metricsPort)
	}

	scaled := only(t, kubeObjects(t, "keda.yaml"), "ScaledObject")
	so := decode[kube.ScaledObjectSpec](t, scaled)
	if ref := so.ScaleTargetRef; ref.Name != dep.Metadata.Name || (ref.Kind != "" && ref.Kind != "Deployment") {
		t.Errorf("KEDA scales %s %s, want the worker Deployment %s", ref.Kind, ref.Name, dep.Metadata.Name)
	}
	if so.MinReplicaCount == nil || *so.MinReplicaCount < 1 {
		t.Errorf("minReplicaCount %v: with no worker the daemon stops fetching and its lag stops growing; want at least 1", so.MinReplicaCount)
	}
	if so.MaxReplicaCount == nil || *so.MaxReplicaCount < *so.MinReplicaCount {
		t.Errorf("maxReplicaCount %v", so.MaxReplicaCount)
	}
	if len(so.Triggers) == 0 {
		t.Fatal("no KEDA trigger")
	}
	queried := map[string]bool{}
	for i, tr := range so.Triggers {
		if tr.Type != "prometheus" || !slices.Contains([]string{"AverageValue", "Value"}, tr.MetricType) {
			t.Errorf("trigger %d: type %s metricType %s, want prometheus with AverageValue or Value", i, tr.Type, tr.MetricType)
		}
		if v, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil || v <= 0 {
			t.Errorf("trigger %d: threshold %q", i, tr.Metadata["threshold"])
		}
		if !strings.HasPrefix(tr.Metadata["serverAddress"], "http") {
			t.Errorf("trigger %d: serverAddress %q", i, tr.Metadata["serverAddress"])
		}
		use, err := promcheck.Parse(tr.Metadata["query"])
		if err != nil {
			t.Errorf("trigger %d: %v", i, err)
			continue
		}
		for _, sel := range use.Selectors {
			queried[sel.Metric] = true
			jobs := 0
			for _, m := range sel.Matchers {
				if m.Label == "job" {
					jobs++
					if m.Op != "=" || m.Value != job {
						t.Errorf("trigger %d: %s{job%s%q}, want job=%q, the job prometheus.yml scrapes the daemons as", i, sel.Metric, m.Op, m.Value, job)
					}
				}
			}
			if jobs != 1 {
				t.Errorf("trigger %d: %s without a job matcher: it would add up every fanout cluster Prometheus scrapes", i, sel.Metric)
			}
		}
	}
	if want := []string{"fanout_consumer_lag", "fanout_oldest_pending_age_seconds"}; !slices.Equal(slices.Sorted(maps.Keys(queried)), want) {
		t.Errorf("KEDA queries %v, want the lag and the age of the oldest pending message %v", slices.Sorted(maps.Keys(queried)), want)
	}
}

// metav returns labels, or an empty map.
func metav(labels map[string]string) map[string]string {
	if labels == nil {
		return map[string]string{}
	}
	return labels
}
