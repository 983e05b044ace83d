package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// spreadRun is (E): the same preloaded topic drained by m daemons in spread
// mode with the offset store store, each serving the partitions its
// assignment gives it, and k client
// processes given every member's address (the Go client keeps a session
// with each, its credit split over them). The
// rate counts acked messages from the first ack to the last; each member's
// CPU is divided by the messages it acked (its fanout_messages_acked_total),
// so that the per-message cost of each member shows whether it stays flat
// while each handles 1/m of the messages.
func (e *env) spreadRun(topic string, n, m, k, inFlight int, store string) (Row, error) {
	r := Row{Consumer: "E fanout spread", K: k, Members: m}
	id := fmt.Sprintf("%s-spread%d", topic, m)
	args := []string{"--assignment", "spread"}
	if store != "zookeeper" {
		r.Store, id = store, id+"-"+store
		args = append(args, "--offset-store", store)
	}
	say("   E: %d spread member(s) + %d client processes, offsets in %s", m, k, storeLabel(store))
	var ds []*daemon
	defer func() {
		for _, d := range ds {
			d.stop()
		}
	}()
	for i := range m {
		d, err := e.startDaemon(id, topic, fmt.Sprintf("bench-%d", i+1), args...)
		if err != nil {
			return r, err
		}
		ds = append(ds, d)
	}
	if err := waitAssigned(ds, 8, 90*time.Second); err != nil {
		return r, err
	}
	cpu0 := make([]float64, m)
	for i, d := range ds {
		c, err := cpuSeconds(d.pid())
		if err != nil {
			return r, err
		}
		cpu0[i] = c
	}
	var addrs []string
	for _, d := range ds {
		addrs = append(addrs, d.addr)
	}
	var ws []*worker
	for i := range k {
		w, err := startWorker(fmt.Sprintf("client %d", i), e.self, "client", "--addr", strings.Join(addrs, ","),
			"--max-in-flight", strconv.Itoa(inFlight))
		if err != nil {
			return r, err
		}
		ws = append(ws, w)
	}
	busy0, total0 := machineCPU()
	t0 := time.Now()
	stop := showProgress(fmt.Sprintf("E spread M=%d", m), int64(n), ws)
	err := waitSum(ws, int64(n), 5*time.Minute)
	stop()
	elapsed := time.Since(t0).Seconds()
	busy1, total1 := machineCPU()
	r.MachineBusyPct = float64(busy1-busy0) / float64(max(total1-total0, 1)) * 100
	var daemonCPU float64
	for i, d := range ds {
		c, _ := cpuSeconds(d.pid())
		acked, aerr := scrapeCounter(d.metrics, "fanout_messages_acked_total")
		if aerr != nil {
			err = errors.Join(err, aerr)
		}
		daemonCPU += c - cpu0[i]
		r.MemberCPUPerM = append(r.MemberCPUPerM, (c-cpu0[i])/max(acked, 1)*1e6)
		r.MemberMessages = append(r.MemberMessages, int64(acked))
		_, hwm, _ := memMB(d.pid())
		r.DaemonPeakRSSMB = max(r.DaemonPeakRSSMB, hwm)
	}
	r.DaemonCores = daemonCPU / elapsed
	var clientCPU float64
	for _, w := range ws {
		c, _ := cpuSeconds(w.cmd.Process.Pid)
		clientCPU += c
	}
	var first, last int64
	for _, w := range ws {
		res, ferr := w.finish(30 * time.Second)
		if ferr != nil {
			err = errors.Join(err, ferr)
			continue
		}
		r.Messages += res.Messages
		r.Redelivered += res.Redelivered
		if res.Messages > 0 {
			if first == 0 || res.FirstNS < first {
				first = res.FirstNS
			}
			last = max(last, res.LastNS)
		}
	}
	if err != nil {
		return r, fmt.Errorf("%w\n(daemon logs: %s-bench-*.log)", err, id)
	}
	r.Seconds = float64(last-first) / 1e9
	r.DaemonCPUPerM = daemonCPU / float64(max(r.Messages, 1)) * 1e6
	r.ClientCPUPerM = clientCPU / float64(max(r.Messages, 1)) * 1e6
	for _, d := range ds {
		d.stop()
	}
	ds = nil
	r.Committed, err = e.committedAll(id, topic, store)
	return r, err
}

// readyPartitions matches a spread member's /readyz: "member: serving
// partitions [0 1 2] (generation 3)".
var readyPartitions = regexp.MustCompile(`^member: serving partitions \[([0-9 ]*)\]`)

// waitAssigned waits until every member is ready (it serves every partition
// its assignment gives it) and the members together serve the topic's
// partitions, so that the clients start on a settled assignment.
func waitAssigned(ds []*daemon, partitions int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		total, last := 0, ""
		for _, d := range ds {
			body, code, err := httpGetText("http://" + d.metrics + "/readyz")
			last = fmt.Sprintf("%s: %d %q %v", d.log, code, body, err)
			m := readyPartitions.FindStringSubmatch(body)
			if err != nil || code != http.StatusOK || m == nil {
				total = -1
				break
			}
			total += len(strings.Fields(m[1]))
		}
		if total == partitions {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("spread members not serving %d partitions after %s; last: %s", partitions, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrapeCounter returns the value of an unlabelled metric on /metrics.
func scrapeCounter(addr, name string) (float64, error) {
	body, code, err := httpGetText("http://" + addr + "/metrics")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: %d %v", addr, code, err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("scrape %s: no %s", addr, name)
}

// httpGetText returns the body and status of GET url.
func httpGetText(url string) (string, int, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}
