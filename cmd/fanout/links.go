package main

import (
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// environ is os.Environ, a variable for tests.
var environ = os.Environ

// linkedAddrs finds the servers that Docker links expose as environment
// variables: for prefix KAFKA and port 9092, KAFKA_PORT_9092_TCP_ADDR and
// _PORT (a link named kafka), then KAFKA_1_PORT_9092_TCP_ADDR,
// KAFKA_2_..., in order. It returns every one present, so a daemon linked
// to three brokers uses all three, or nil when there is none.
func linkedAddrs(env []string, prefix string, port int) []string {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	re := regexp.MustCompile(`^` + prefix + `(?:_(\d+))?_PORT_` + strconv.Itoa(port) + `_TCP_ADDR$`)
	type link struct {
		n    int
		addr string
	}
	var links []link
	for k, host := range vars {
		m := re.FindStringSubmatch(k)
		if m == nil || host == "" {
			continue
		}
		n := 0
		if m[1] != "" {
			n, _ = strconv.Atoi(m[1])
		}
		p := vars[strings.TrimSuffix(k, "_ADDR")+"_PORT"]
		if p == "" {
			p = strconv.Itoa(port)
		}
		links = append(links, link{n, net.JoinHostPort(host, p)})
	}
	slices.SortFunc(links, func(a, b link) int { return a.n - b.n })
	var out []string
	for _, l := range links {
		if !slices.Contains(out, l.addr) {
			out = append(out, l.addr)
		}
	}
	return out
}

// splitAll splits comma-separated entries, as a flag given once with
// "a:1,b:2" or an environment variable holds, and drops empty ones.
func splitAll(in []string) []string {
	var out []string
	for _, s := range in {
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}
