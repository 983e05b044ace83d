//go:build integration

package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// A daemon whose client or metrics port is taken exits at once and says
// which flag to change, and the daemon holding the port runs on.
func TestPortTakenSaysWhichFlag(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	listen, metrics := procFreeAddr(t), procFreeAddr(t)
	first := procStart(t, procDaemonArgs(t, uniqueName(t, "svc"), topic, listen, "--metrics-listen", metrics)...)
	testutil.WaitFor(t, 30*time.Second, "the first daemon to serve metrics", func() bool {
		resp, err := http.Get("http://" + metrics + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"--listen", procDaemonArgs(t, uniqueName(t, "svc"), topic, listen)},
		{"--metrics-listen", procDaemonArgs(t, uniqueName(t, "svc"), topic, procFreeAddr(t), "--metrics-listen", metrics)},
	} {
		p := procStart(t, tc.args...)
		if code := p.wait(t, 30*time.Second); code == 0 {
			t.Fatalf("a daemon on a taken %s port exited 0:\n%s", tc.flag, p.output())
		}
		if out := p.output(); !strings.Contains(out, "address already in use") || !strings.Contains(out, "its own "+tc.flag+" ") {
			t.Errorf("a taken %s port: the error does not say which flag to change:\n%s", tc.flag, out)
		}
	}
	if first.exited() {
		t.Errorf("the daemon holding the ports exited:\n%s", first.output())
	}
}
