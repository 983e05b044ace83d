// Package kube reads the Kubernetes manifests fanout ships (deploy/kubernetes)
// for the tests that check them against the daemon and the example worker:
// the few fields of Services, StatefulSets, Deployments and KEDA
// ScaledObjects those tests read, and a container's environment expanded as
// the kubelet expands it.
package kube

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Object is one manifest; Spec is the part of its kind.
type Object struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   Metadata  `yaml:"metadata"`
	Spec       yaml.Node `yaml:"spec"`
}

// Metadata is an object's name and labels.
type Metadata struct {
	Name   string            `yaml:"name"`
	Labels map[string]string `yaml:"labels"`
}

// IntOrString is a port given by number or by name.
type IntOrString struct {
	Int  int
	Name string
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (v *IntOrString) UnmarshalYAML(n *yaml.Node) error {
	if i, err := strconv.Atoi(n.Value); err == nil && n.Tag == "!!int" {
		v.Int = i
		return nil
	}
	v.Name = n.Value
	return nil
}

// ServiceSpec is a Service's spec.
type ServiceSpec struct {
	ClusterIP                string            `yaml:"clusterIP"`
	PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
	Selector                 map[string]string `yaml:"selector"`
	Ports                    []struct {
		Name       string      `yaml:"name"`
		Port       int         `yaml:"port"`
		TargetPort IntOrString `yaml:"targetPort"`
	} `yaml:"ports"`
}

// WorkloadSpec is a StatefulSet's or a Deployment's spec.
type WorkloadSpec struct {
	ServiceName string `yaml:"serviceName"`
	Replicas    *int   `yaml:"replicas"`
	Selector    struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata Metadata `yaml:"metadata"`
		Spec     PodSpec  `yaml:"spec"`
	} `yaml:"template"`
}

// PodSpec is a pod template's spec.
type PodSpec struct {
	TerminationGracePeriodSeconds *int        `yaml:"terminationGracePeriodSeconds"`
	Containers                    []Container `yaml:"containers"`
}

// Container is one container of a pod.
type Container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []EnvVar `yaml:"env"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *Probe `yaml:"readinessProbe"`
	LivenessProbe  *Probe `yaml:"livenessProbe"`
	StartupProbe   *Probe `yaml:"startupProbe"`
}

// EnvVar is one variable of a container's environment.
type EnvVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

// Probe is a container probe; only HTTP GET probes are read.
type Probe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port IntOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

// ScaledObjectSpec is a KEDA ScaledObject's spec.
type ScaledObjectSpec struct {
	ScaleTargetRef struct {
		Kind string `yaml:"kind"`
		Name string `yaml:"name"`
	} `yaml:"scaleTargetRef"`
	MinReplicaCount *int `yaml:"minReplicaCount"`
	MaxReplicaCount *int `yaml:"maxReplicaCount"`
	Triggers        []struct {
		Type       string            `yaml:"type"`
		MetricType string            `yaml:"metricType"`
		Metadata   map[string]string `yaml:"metadata"`
	} `yaml:"triggers"`
}

// Load reads the manifests of a multi-document YAML file.
func Load(path string) ([]Object, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []Object
	for {
		var o Object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if o.Kind == "" {
			continue // an empty document
		}
		out = append(out, o)
	}
}

// Find returns the object of kind and name, and false when there is none.
func Find(objs []Object, kind, name string) (Object, bool) {
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o, true
		}
	}
	return Object{}, false
}

// OfKind returns the objects of kind.
func OfKind(objs []Object, kind string) []Object {
	var out []Object
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// Decode decodes the object's spec into spec (a *ServiceSpec, ...).
func (o Object) Decode(spec any) error {
	if err := o.Spec.Decode(spec); err != nil {
		return fmt.Errorf("%s %s: %w", o.Kind, o.Metadata.Name, err)
	}
	return nil
}

// Port returns the number of the container's port p (by number or name),
// and false when the container has no such port.
func (c Container) Port(p IntOrString) (int, bool) {
	for _, cp := range c.Ports {
		if p.Name != "" && cp.Name == p.Name || p.Name == "" && cp.ContainerPort == p.Int {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// reference is a dependent variable reference, $(NAME), or its escape $$.
var reference = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// Environ returns the container's environment as NAME=value, expanded as
// the kubelet does: $(NAME) takes the value of a variable defined before it
// in the list, $$ is a $. A value from a field (fieldRef) is field(path); a
// value from a secret is secret(name, key). Unlike the kubelet, which leaves
// a reference to an undefined variable as it is, Environ fails on one: in a
// manifest it is a mistake. Referenced lists the names some value refers to.
func (c Container) Environ(field func(path string) string, secret func(name, key string) string) (env []string, referenced map[string]bool, err error) {
	defined := map[string]string{}
	referenced = map[string]bool{}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v = field(e.ValueFrom.FieldRef.FieldPath)
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			v = secret(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		case e.ValueFrom != nil:
			return nil, nil, fmt.Errorf("container %s: %s: a valueFrom these checks do not read", c.Name, e.Name)
		default:
			var bad error
			v = reference.ReplaceAllStringFunc(v, func(ref string) string {
				if ref == "$$" {
					return "$"
				}
				name := ref[2 : len(ref)-1]
				val, ok := defined[name]
				if !ok {
					bad = fmt.Errorf("container %s: %s refers to $(%s), not defined before it", c.Name, e.Name, name)
				}
				referenced[name] = true
				return val
			})
			if bad != nil {
				return nil, nil, bad
			}
		}
		if _, dup := defined[e.Name]; dup {
			return nil, nil, fmt.Errorf("container %s: %s defined twice", c.Name, e.Name)
		}
		defined[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env, referenced, nil
}

// Split returns the name and value of a NAME=value environment entry.
func Split(kv string) (name, value string) {
	name, value, _ = strings.Cut(kv, "=")
	return name, value
}
