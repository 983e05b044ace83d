package main

import (
	"slices"
	"testing"
)

func TestLinkedAddrs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"none", []string{"PATH=/bin"}, nil},
		{"one link named kafka", []string{"KAFKA_PORT_9092_TCP_ADDR=172.17.0.2", "KAFKA_PORT_9092_TCP_PORT=9092"}, []string{"172.17.0.2:9092"}},
		{"three numbered links in order", []string{
			"KAFKA_3_PORT_9092_TCP_ADDR=10.0.0.3", "KAFKA_3_PORT_9092_TCP_PORT=9092",
			"KAFKA_1_PORT_9092_TCP_ADDR=10.0.0.1", "KAFKA_1_PORT_9092_TCP_PORT=9092",
			"KAFKA_2_PORT_9092_TCP_ADDR=10.0.0.2", "KAFKA_2_PORT_9092_TCP_PORT=19092",
		}, []string{"10.0.0.1:9092", "10.0.0.2:19092", "10.0.0.3:9092"}},
		{"a zookeeper link is not a kafka link", []string{"ZK_PORT_2181_TCP_ADDR=zk"}, nil},
		{"other prefixes ignored", []string{"KAFKAX_PORT_9092_TCP_ADDR=x", "MY_KAFKA_PORT_9092_TCP_ADDR=y"}, nil},
		{"duplicates dropped", []string{"KAFKA_PORT_9092_TCP_ADDR=a", "KAFKA_1_PORT_9092_TCP_ADDR=a"}, []string{"a:9092"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := linkedAddrs(tt.env, "KAFKA", 9092); !slices.Equal(got, tt.want) {
				t.Fatalf("linkedAddrs = %v, want %v", got, tt.want)
			}
		})
	}
	if got := linkedAddrs([]string{"ZK_PORT_2181_TCP_ADDR=zk", "ZK_1_PORT_2181_TCP_ADDR=zk1", "ZK_1_PORT_2181_TCP_PORT=2182"}, "ZK", 2181); !slices.Equal(got, []string{"zk:2181", "zk1:2182"}) {
		t.Fatalf("zookeeper links = %v", got)
	}
}

func TestSplitAll(t *testing.T) {
	t.Parallel()
	got := splitAll([]string{"a:1,b:2", " c:3 ", "", "d:4/chroot"})
	if want := []string{"a:1", "b:2", "c:3", "d:4/chroot"}; !slices.Equal(got, want) {
		t.Fatalf("splitAll = %v, want %v", got, want)
	}
}
