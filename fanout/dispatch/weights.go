package dispatch

// Canary weights (WeightedSink). While every joined client has the default
// weight, clients take turns in the ready ring (round-robin), as ever. Once
// one has another weight, each message goes to the client with room chosen
// by smooth weighted round-robin (the rule of nginx's upstreams): every
// client with room adds its weight to its current weight, the one with the
// highest current weight gets the message and loses the sum of the weights.
// Over any stretch in which the same clients have room, each gets its share
// of the messages within one message, spread evenly rather than in bursts.
// Credit still applies: a client without room takes no turn and gains
// nothing meanwhile. A pick costs O(clients with room), where round-robin
// costs O(1); BenchmarkDispatchAck measures both.

// pickWeighted returns the client with room whose turn it is by weight, or
// nil when none has room; clients without room leave the ready ring. It
// avoids the client avoid (the previous holder of the redelivery that goes
// next) when another has room.
func (s *state) pickWeighted(avoid uint64) *client {
	s.ready.filter(func(c *client) bool {
		if c.hasRoom() {
			return true
		}
		c.inReady = false
		return false
	})
	var best, avoided *client
	var total int64
	for i := range s.ready.len() {
		c := s.ready.at(i)
		c.cw += c.weight
		total += c.weight
		switch {
		case c.id == avoid:
			avoided = c
		case best == nil || c.cw > best.cw:
			best = c
		}
	}
	if best == nil {
		best = avoided
	}
	if best != nil {
		best.cw -= total
	}
	return best
}
