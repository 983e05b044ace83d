package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/internal/actor"
)

// proc is a daemon or client process of the run, restarted under the same
// role after a fault. Its output is appended to one log across restarts.
type proc struct {
	role string
	bin  string
	args func(incarnation int) []string
	log  string
	env  []string     // added to the environment
	g    *actor.Group // reapers
	lg   *logrus.Entry

	mu          sync.Mutex // guards the fields below
	cmd         *exec.Cmd
	exited      chan struct{}
	incarnation int
	busy        bool // a fault holds it
}

// start starts a new incarnation.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s log: %w", p.role, err)
	}
	defer f.Close()
	p.incarnation++
	fmt.Fprintf(f, "===== chaos: %s incarnation %d starts at %s\n", p.role, p.incarnation, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args(p.incarnation)...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	// The process dies with the run, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.role, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	p.g.Go(p.lg, "reap "+p.role, func() {
		_ = cmd.Wait()
		close(exited)
	}, nil)
	return nil
}

// signal sends sig to the current incarnation.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// running reports whether the current incarnation is alive.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends sig and waits for the exit, up to grace; then KILL.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return
	}
	p.signal(syscall.SIGCONT) // a stopped process cannot act on TERM
	p.signal(sig)
	select {
	case <-exited:
	case <-time.After(grace):
		p.signal(syscall.SIGKILL)
		<-exited
	}
}

// claim marks p as held by a fault; false if another fault holds it.
func (p *proc) claim() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy {
		return false
	}
	p.busy = true
	return true
}

func (p *proc) release() {
	p.mu.Lock()
	p.busy = false
	p.mu.Unlock()
}
