package kube

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const manifests = `
apiVersion: v1
kind: Service
metadata: {name: s}
spec:
  clusterIP: None
  ports:
    - {name: a, port: 80, targetPort: web}
    - {name: b, port: 81, targetPort: 8081}
---
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  template:
    spec:
      containers:
        - name: c
          ports: [{name: web, containerPort: 8080}, {containerPort: 8081}]
          env:
            - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: TOKEN, valueFrom: {secretKeyRef: {name: sec, key: tok}}}
            - {name: ADDR, value: "$(POD).s:$(PORT)"}
            - {name: PORT, value: "1"}
            - {name: LATE, value: "$(PORT)/$$(POD)/$$$(POD)"}
`

func load(t *testing.T, text string) []Object {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestLoadAndPorts(t *testing.T) {
	t.Parallel()
	objs := load(t, manifests)
	if len(objs) != 2 || len(OfKind(objs, "Service")) != 1 {
		t.Fatalf("objects %+v", objs)
	}
	svcObj, ok := Find(objs, "Service", "s")
	var svc ServiceSpec
	if !ok || svcObj.Decode(&svc) != nil || svc.ClusterIP != "None" || len(svc.Ports) != 2 {
		t.Fatalf("service %+v", svc)
	}
	d, _ := Find(objs, "Deployment", "d")
	var w WorkloadSpec
	if err := d.Decode(&w); err != nil {
		t.Fatal(err)
	}
	c := w.Template.Spec.Containers[0]
	for i, want := range []int{8080, 8081} {
		if got, ok := c.Port(svc.Ports[i].TargetPort); !ok || got != want {
			t.Errorf("target port %+v resolves to %d %v, want %d", svc.Ports[i].TargetPort, got, ok, want)
		}
	}
	if _, ok := c.Port(IntOrString{Name: "nope"}); ok {
		t.Error("a port name the container lacks resolves")
	}
}

// Variables expand as the kubelet expands them, except that a reference to
// a variable not defined before fails.
func TestEnviron(t *testing.T) {
	t.Parallel()
	objs := load(t, manifests)
	d, _ := Find(objs, "Deployment", "d")
	var w WorkloadSpec
	if err := d.Decode(&w); err != nil {
		t.Fatal(err)
	}
	c := w.Template.Spec.Containers[0]
	field := func(p string) string { return "pod-0:" + p }
	secret := func(n, k string) string { return n + "/" + k }
	if _, _, err := c.Environ(field, secret); err == nil || !strings.Contains(err.Error(), "ADDR refers to $(PORT), not defined before it") {
		t.Fatalf("Environ with a forward reference: %v", err)
	}
	c.Env[2], c.Env[3] = c.Env[3], c.Env[2]
	env, refs, err := c.Environ(field, secret)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"POD=pod-0:metadata.name", "TOKEN=sec/tok", "PORT=1", "ADDR=pod-0:metadata.name.s:1", "LATE=1/$(POD)/$pod-0:metadata.name"}
	if !slices.Equal(env, want) {
		t.Fatalf("Environ = %q, want %q", env, want)
	}
	if !refs["POD"] || !refs["PORT"] || refs["TOKEN"] {
		t.Fatalf("referenced %v", refs)
	}
	if n, v := Split(env[3]); n != "ADDR" || v != "pod-0:metadata.name.s:1" {
		t.Fatalf("Split = %q %q", n, v)
	}
}
