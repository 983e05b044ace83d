// Package actor is the daemon's one way to start a goroutine: every
// goroutine is owned by a Group, which tracks it for Wait and logs its
// start, its stop and any panic with the goroutine's name.
package actor

import (
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/sirupsen/logrus"
)

// Group owns goroutines. The zero value is ready to use.
type Group struct {
	wg sync.WaitGroup
}

// Go runs fn in a goroutine of g named name, logging through log. A panic
// in fn is logged with its stack; then onPanic, when not nil, is called with
// the value and the goroutine ends normally (the owner cleans up, e.g. a
// connection closes), else the panic is raised again and the process dies,
// as for any unowned goroutine.
func (g *Group) Go(log *logrus.Entry, name string, fn func(), onPanic func(v any)) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer func() {
			if v := recover(); v != nil {
				log.WithFields(logrus.Fields{
					"goroutine": name,
					"panic":     fmt.Sprint(v),
					"stack":     string(debug.Stack()),
				}).Error("goroutine panicked")
				if onPanic == nil {
					panic(v)
				}
				onPanic(v)
			}
		}()
		debugOn := log.Logger.IsLevelEnabled(logrus.DebugLevel)
		if debugOn {
			log.WithField("goroutine", name).Debug("goroutine started")
		}
		fn()
		if debugOn {
			log.WithField("goroutine", name).Debug("goroutine stopped")
		}
	}()
}

// Wait returns once every goroutine started by Go has returned.
func (g *Group) Wait() { g.wg.Wait() }
