package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux the harness runs on).
const clockTicks = 100

// cpuSeconds is a process's user + system CPU time so far.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may contain spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return float64(ut+st) / clockTicks, nil
}

// machineCPU returns the busy and total jiffies of all CPUs (/proc/stat).
func machineCPU() (busy, total int64) {
	b, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i < 8 {
			total += n
		}
		if i != 3 && i != 4 && i < 8 {
			busy += n
		}
	}
	return busy, total
}

// memMB returns VmRSS and VmHWM (peak RSS) of a process in MB (10^6 bytes).
func memMB(pid int) (rss, hwm float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if k == "VmRSS" {
			rss = kb * 1024 / 1e6
		} else {
			hwm = kb * 1024 / 1e6
		}
	}
	return rss, hwm, nil
}

// procs are the processes the driver started and has not yet reaped; killAll
// ends them (on failure or a signal).
var procs = struct {
	sync.Mutex
	m map[*exec.Cmd]bool
}{m: map[*exec.Cmd]bool{}}

func track(c *exec.Cmd)   { procs.Lock(); procs.m[c] = true; procs.Unlock() }
func untrack(c *exec.Cmd) { procs.Lock(); delete(procs.m, c); procs.Unlock() }

func killAll() {
	procs.Lock()
	defer procs.Unlock()
	for c := range procs.m {
		if c.Process != nil {
			_ = c.Process.Signal(syscall.SIGKILL)
		}
	}
}

// tailBuf keeps the last lines written to it.
type tailBuf struct {
	mu    sync.Mutex
	lines []string
}

func (t *tailBuf) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, s)
	if len(t.lines) > 40 {
		t.lines = t.lines[len(t.lines)-40:]
	}
}

func (t *tailBuf) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// worker is a fanout-bench subprocess (client, sarama or idle).
type worker struct {
	name     string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	stdout   bytes.Buffer
	stderr   tailBuf
	progress atomic.Int64  // the last "progress N"
	events   chan string   // other "connected N" lines
	exited   chan struct{} // closed once the process has exited
	err      error         // Wait's error, set before exited is closed
}

func startWorker(name, self string, args ...string) (*worker, error) {
	w := &worker{name: name, events: make(chan string, 4), exited: make(chan struct{})}
	w.cmd = exec.Command(self, args...)
	w.cmd.Stdout = &w.stdout
	var err error
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	se, err := w.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	track(w.cmd)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(se)
		for sc.Scan() {
			line := sc.Text()
			if n, ok := strings.CutPrefix(line, "progress "); ok {
				v, _ := strconv.ParseInt(n, 10, 64)
				w.progress.Store(v)
				continue
			}
			if strings.HasPrefix(line, "connected ") {
				select {
				case w.events <- line:
				default:
				}
			}
			w.stderr.add(line)
		}
	}()
	go func() {
		<-scanned
		w.err = w.cmd.Wait()
		untrack(w.cmd)
		close(w.exited)
	}()
	return w, nil
}

// finish closes the worker's standard input (its signal to stop), waits for
// it and decodes its Result.
func (w *worker) finish(timeout time.Duration) (Result, error) {
	_ = w.stdin.Close()
	select {
	case <-w.exited:
	case <-time.After(timeout):
		_ = w.cmd.Process.Kill()
		<-w.exited
		return Result{}, fmt.Errorf("%s did not stop within %s; its stderr:\n%s", w.name, timeout, w.stderr.String())
	}
	var r Result
	if w.err != nil {
		return r, fmt.Errorf("%s: %v; its stderr:\n%s", w.name, w.err, w.stderr.String())
	}
	if err := jsonDecode(w.stdout.Bytes(), &r); err != nil {
		return r, fmt.Errorf("%s: bad result %q: %v", w.name, w.stdout.String(), err)
	}
	return r, nil
}
