package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// committedAll reads the offsets a stopped daemon committed for id and topic
// (with the daemon's own store: zkstore, or kafkastore for store "kafka")
// and returns their sum, which equals the topic's message count when every
// message was acked. Partitions whose committed offset is below the
// high-water mark are named in the error.
func (e *env) committedAll(id, topic, store string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var offs map[int32]int64
	var err error
	if store == "kafka" {
		offs, err = kafkastore.New(e.client, id, topic, 0).Load(ctx)
	} else {
		quiet := logrus.New()
		quiet.SetLevel(logrus.WarnLevel)
		conn, cerr := zkstore.Connect(ctx, []string{e.zk}, 10*time.Second, logrus.NewEntry(quiet))
		if cerr != nil {
			return 0, cerr
		}
		defer conn.Close()
		offs, err = zkstore.New(conn, "", id, topic).Load(ctx)
	}
	if err != nil {
		return 0, err
	}
	hw, err := e.highWaters(topic)
	if err != nil {
		return 0, err
	}
	var sum int64
	var behind []string
	for p, h := range hw {
		sum += offs[p]
		if offs[p] != h {
			behind = append(behind, fmt.Sprintf("partition %d committed %d of %d", p, offs[p], h))
		}
	}
	if len(behind) > 0 {
		return sum, fmt.Errorf("fanout %s did not commit every message: %v", id, behind)
	}
	return sum, nil
}
