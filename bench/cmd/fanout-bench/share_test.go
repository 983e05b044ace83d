package main

import (
	"math"
	"strings"
	"testing"
)

// Output of ShareConsumerPerformance --threads 4 --show-detailed-stats with
// 300,000 records, as Kafka 4.4 printed it (two threads' lines run together).
const shareOut = `start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg, fetch.time.ms
2026-12-02 12:22:06:299, 2026-12-02 12:22:11:489, 0.0001, 0.0000, 0.1927, 1, 5190 for share consumer 12026-12-02 12:22:06:298, 2026-12-02 12:22:11:488, 0.0001, 0.0000, 0.1927, 1, 5190 for share consumer 3

2026-12-02 12:22:06:294, 2026-12-02 12:22:11:495, 0.0001, 0.0000, 0.1923, 1, 5201 for share consumer 4
2026-12-02 12:22:06:298, 2026-12-02 12:22:11:498, 0.0001, 0.0000, 0.1923, 1, 5200 for share consumer 2
2026-12-02 12:22:11:495, 2026-12-02 12:22:11:998, 4.3180, 8.5844, 90013.9165, 45278, 503 for share consumer 4
2026-12-02 12:22:11:488, 2026-12-02 12:22:12:005, 3.7701, 7.2920, 76462.2824, 39532, 517 for share consumer 3
2026-12-02 12:22:11:489, 2026-12-02 12:22:12:008, 3.8578, 7.4330, 77940.2697, 40452, 519 for share consumer 1
2026-12-02 12:22:11:498, 2026-12-02 12:22:12:005, 3.6825, 7.2632, 76159.7633, 38614, 507 for share consumer 2
2026-12-02 12:22:06:038, 2026-12-02 12:22:12:454, 28.6102, 4.4592, 46758.1047, 300000, 6416
`

func TestShareSteady(t *testing.T) {
	r, err := shareSteady(Row{Size: 100}, shareOut, 300000)
	if err != nil {
		t.Fatal(err)
	}
	r.finish()
	if r.Messages != 300000 {
		t.Errorf("messages %d, want 300000", r.Messages)
	}
	// Steady: 299,996 records from 12:22:11.488 to 12:22:12.454 (966 ms).
	if want := 299996 / 0.966; math.Abs(r.MsgPerS-want) > 1 {
		t.Errorf("rate %.0f, want %.0f", r.MsgPerS, want)
	}
	if want := 300000 / 6.416; math.Abs(r.ToolMsgPerS-want) > 1 {
		t.Errorf("tool rate %.0f, want %.0f", r.ToolMsgPerS, want)
	}
}

// The spread runs get their own table, one line per store and member
// count, with each member's CPU per message; a spread run that missed a
// commit fails.
func TestSpreadReport(t *testing.T) {
	r := &report{Plan: quickPlan(), Throughput: []Row{
		{Size: 100, Consumer: "E fanout spread", K: 4, Members: 2, Expected: 10, Messages: 10, Committed: 10,
			Seconds: 1, MsgPerS: 10, DaemonCPUPerM: 20, MemberCPUPerM: []float64{19.5, 20.5}, MemberMessages: []int64{6, 4}},
		{Size: 100, Consumer: "E fanout spread", K: 4, Members: 2, Store: "kafka", Expected: 10, Messages: 10, Committed: 10,
			Seconds: 2, MsgPerS: 5, DaemonCPUPerM: 30, MemberCPUPerM: []float64{29.5, 30.5}, MemberMessages: []int64{5, 5}},
		{Size: 100, Consumer: "E fanout spread", K: 4, Members: 3, Expected: 10, Messages: 10, Committed: 9},
	}}
	md := r.markdown()
	for _, want := range []string{
		"| 100 B | ZooKeeper | 2 | 10 | 10 | 0.00 | 20.0 | 19.5, 20.5 | 6, 4 | 0 |",
		"| 100 B | Kafka | 2 | 10 | 5 | 0.00 | 30.0 | 29.5, 30.5 | 5, 5 | 0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks the spread line %s:\n%s", want, md)
		}
	}
	if f := r.failures(); len(f) != 1 || !strings.Contains(f[0], "3 member(s), ZooKeeper: committed offsets sum to 9") {
		t.Errorf("failures = %q", f)
	}
}
