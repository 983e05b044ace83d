package kafkastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// Leader is what a leader's membership says of it: its term's epoch, node id
// and client address, as JSON in the user data of its member metadata (a
// consumer subscription to the topic), which Describe reads back.
type Leader struct {
	Epoch uint64 `json:"epoch"`
	Node  string `json:"node"`
	Addr  string `json:"addr"`
}

// maxJoins bounds the JoinGroup/SyncGroup rounds of one Join: a round ends
// early only when another member's join started a rebalance meanwhile.
const maxJoins = 3

// Join makes this process the group's member, with InstanceID and the
// metadata of l: the coordinator replaces the member that held InstanceID
// (its commits and heartbeats are refused from now on) or, in an empty
// group, starts a new generation. It returns the membership once SyncGroup
// has confirmed it; the member is assigned every partition of the topic
// (for Kafka's tools: fanout consumes them all). An error wrapping
// offsets.ErrFenced means another join displaced this one meanwhile.
func (s *Store) Join(ctx context.Context, l Leader) (Member, error) {
	ud, err := json.Marshal(l)
	if err != nil {
		return Member{}, fmt.Errorf("kafkastore: encode leader metadata: %w", err)
	}
	parts := s.knownPartitions()
	instance := InstanceID
	memberID := ""
	for round := 1; ; round++ {
		if err := ctx.Err(); err != nil {
			return Member{}, fmt.Errorf("kafkastore: join group %s: %w", s.group, err)
		}
		coord, err := s.coordinator()
		if err != nil {
			return Member{}, err
		}
		join := sarama.NewJoinGroupRequest(s.client.Config().Version)
		join.GroupId, join.MemberId, join.GroupInstanceId = s.group, memberID, &instance
		join.SessionTimeout = int32(s.session.Milliseconds())
		join.RebalanceTimeout = join.SessionTimeout
		join.ProtocolType = protocolType
		if err := join.AddGroupProtocolMetadata(protocolName, &sarama.ConsumerGroupMemberMetadata{
			Topics: []string{s.topic}, UserData: ud,
		}); err != nil {
			return Member{}, fmt.Errorf("kafkastore: encode join of group %s: %w", s.group, err)
		}
		jr, err := coord.JoinGroup(join)
		if err != nil {
			return Member{}, s.brokerError("join", coord, err)
		}
		switch jr.Err {
		case sarama.ErrNoError:
		case sarama.ErrMemberIdRequired: // not for a static member, but harmless: join again with the id
			memberID = jr.MemberId
			if round < maxJoins {
				continue
			}
			fallthrough
		case sarama.ErrInconsistentGroupProtocol:
			return Member{}, s.otherMode(ctx, "join", jr.Err, ModeLeader)
		default:
			return Member{}, s.joinError("join", jr.Err)
		}

		sync := &sarama.SyncGroupRequest{Version: 5, GroupId: s.group, GenerationId: jr.GenerationId,
			MemberId: jr.MemberId, GroupInstanceId: &instance}
		pt, pn := protocolType, protocolName
		sync.ProtocolType, sync.ProtocolName = &pt, &pn
		if jr.LeaderId == jr.MemberId {
			// The group's leader assigns: this member every partition,
			// anybody else (not a fanout leader) nothing.
			for _, m := range jr.Members {
				a := &sarama.ConsumerGroupMemberAssignment{}
				if m.MemberId == jr.MemberId && len(parts) > 0 {
					a.Topics = map[string][]int32{s.topic: slices.Sorted(slices.Values(parts))}
				}
				if err := sync.AddGroupAssignmentMember(m.MemberId, a); err != nil {
					return Member{}, fmt.Errorf("kafkastore: encode assignment of group %s: %w", s.group, err)
				}
			}
		}
		sr, err := coord.SyncGroup(sync)
		if err != nil {
			return Member{}, s.brokerError("sync", coord, err)
		}
		switch {
		case sr.Err == sarama.ErrNoError:
			return Member{Group: s.group, Generation: jr.GenerationId, MemberID: jr.MemberId, Epoch: l.Epoch, Node: l.Node}, nil
		case sr.Err == sarama.ErrRebalanceInProgress && round < maxJoins:
			memberID = jr.MemberId // another member joined meanwhile: join again
		default:
			return Member{}, s.joinError("sync", sr.Err)
		}
	}
}

// knownPartitions returns the topic's partitions as the client's metadata
// already knows them, without asking the brokers: the assignment they make
// is informative only, and a missing topic must not delay a join by the
// client's metadata retries.
func (s *Store) knownPartitions() []int32 {
	topics, err := s.client.Topics() // the cached metadata
	if err != nil || !slices.Contains(topics, s.topic) {
		return nil
	}
	parts, _ := s.client.Partitions(s.topic)
	return parts
}

// joinError describes a refused JoinGroup or SyncGroup.
func (s *Store) joinError(what string, kerr sarama.KError) error {
	switch kerr {
	case sarama.ErrFencedInstancedId, sarama.ErrUnknownMemberId, sarama.ErrIllegalGeneration, sarama.ErrRebalanceInProgress:
		return fmt.Errorf("kafkastore: %s group %s: displaced by another join: %w: %w", what, s.group, offsets.ErrFenced, kerr)
	case sarama.ErrInconsistentGroupProtocol:
		return fmt.Errorf("kafkastore: %s group %s: %w (the group is used by consumers that are not fanout: give fanout its own --id)", what, s.group, kerr)
	case sarama.ErrInvalidSessionTimeout:
		return fmt.Errorf("kafkastore: %s group %s: session timeout %v: %w (the brokers' group.min.session.timeout.ms and group.max.session.timeout.ms bound it)",
			what, s.group, s.session, kerr)
	}
	return s.groupError(what, kerr)
}

// Heartbeat keeps membership m alive: call it well within the session
// timeout. An error wrapping offsets.ErrFenced means m is no longer the
// group's member (replaced by a later Join, expired, or the group is
// rebalancing): its commits are refused.
func (s *Store) Heartbeat(ctx context.Context, m Member) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kafkastore: heartbeat of %v: %w", m, err)
	}
	coord, err := s.coordinator()
	if err != nil {
		return err
	}
	instance := m.instance()
	resp, err := coord.Heartbeat(&sarama.HeartbeatRequest{Version: 4, GroupId: m.Group, GenerationId: m.Generation,
		MemberId: m.MemberID, GroupInstanceId: &instance})
	if err != nil {
		return s.brokerError("heartbeat", coord, err)
	}
	switch {
	case resp.Err == sarama.ErrNoError:
		return nil
	case fencedError(resp.Err):
		return fmt.Errorf("kafkastore: %v is no longer the group's member: %w: %w", m, offsets.ErrFenced, resp.Err)
	}
	return s.groupError("heartbeat", resp.Err)
}

// Leave ends membership m, if it still is the group's member (a replaced
// one's leave is refused, and leaves its successor in place).
func (s *Store) Leave(ctx context.Context, m Member) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kafkastore: leave %v: %w", m, err)
	}
	coord, err := s.coordinator()
	if err != nil {
		return err
	}
	// Version 2 names the member id alone: a newer version with the
	// instance id lets some coordinators remove whoever holds it now.
	resp, err := coord.LeaveGroup(&sarama.LeaveGroupRequest{Version: 2, GroupId: m.Group, MemberId: m.MemberID})
	if err != nil {
		return s.brokerError("leave", coord, err)
	}
	if resp.Err != sarama.ErrNoError {
		if fencedError(resp.Err) {
			return fmt.Errorf("kafkastore: leave: %v is no longer the group's member: %w: %w", m, offsets.ErrFenced, resp.Err)
		}
		return s.groupError("leave", resp.Err)
	}
	return nil
}

// Description is a group's state and members, as DescribeGroups shows them.
type Description struct {
	Group        string
	State        string // Empty, PreparingRebalance, CompletingRebalance, Stable, Dead; "" for no group
	ProtocolType string
	Protocol     string        // the members' protocol: a leader's, spread mode's, another consumer's; "" while none
	Members      []GroupMember // by member id
}

// The assignment modes as the group's protocol tells them (Description.Mode).
const (
	ModeLeader = "leader"
	ModeSpread = "spread"
)

// Mode is the fanout assignment mode of the group's members, as their
// protocol says: ModeLeader, ModeSpread, or "" (no member, or not fanout's).
func (d Description) Mode() string {
	switch d.Protocol {
	case protocolName:
		return ModeLeader
	case spreadProtocol:
		return ModeSpread
	}
	return ""
}

// Plan returns the newest plan the group's spread members carry, and the
// member whose plan it is (nil when none carries one: no member, the group
// rebalancing, or not spread mode).
func (d Description) Plan() *Plan {
	var newest *Plan
	for _, m := range d.Members {
		if m.Plan != nil && (newest == nil || m.Plan.Generation > newest.Generation) {
			newest = m.Plan
		}
	}
	return newest
}

// Nodes names the group's members for messages: a leader's node id, a
// spread member's instance id (its node id), or the member id.
func (d Description) Nodes() string {
	var names []string
	for _, m := range d.Members {
		switch {
		case m.Leader != nil && m.Leader.Node != "" && d.Mode() == ModeLeader:
			names = append(names, m.Leader.Node)
		case m.InstanceID != "":
			names = append(names, m.InstanceID)
		default:
			names = append(names, m.MemberID)
		}
	}
	return strings.Join(names, ", ")
}

// ErrOtherMode: the group's members run the other --assignment than this
// member; the coordinator keeps the two from sharing the group.
var ErrOtherMode = errors.New("kafkastore: the group is used by fanout members of the other --assignment")

// otherMode describes a join refused with kerr (INCONSISTENT_GROUP_PROTOCOL)
// by this member of mode mine: the group's members run the other mode
// (ErrOtherMode, naming both), or are not fanout's.
func (s *Store) otherMode(ctx context.Context, what string, kerr sarama.KError, mine string) error {
	if d, err := s.Describe(ctx); err == nil {
		if theirs := d.Mode(); theirs != "" && theirs != mine {
			return d.otherModeError(s.group, mine)
		}
	}
	return s.joinError(what, kerr)
}

// otherModeError is ErrOtherMode for a member of mode mine in group.
func (d Description) otherModeError(group, mine string) error {
	return fmt.Errorf("kafkastore: group %s: its members (%s) run --assignment %s, this member --assignment %s: "+
		"run every member of a cluster with the same --assignment (stop the others first to change it): %w",
		group, d.Nodes(), d.Mode(), mine, ErrOtherMode)
}

// GroupMember is one member of a Description.
type GroupMember struct {
	MemberID   string
	InstanceID string // "" for a dynamic member
	ClientID   string
	Host       string
	// Leader is what a fanout leader's metadata says; nil when the
	// coordinator shows no metadata (the group is rebalancing) or it is not
	// a fanout leader's (LeaderErr says why).
	Leader    *Leader
	LeaderErr error
	// Held and Plan are a spread member's: the partitions its assignment
	// lets it hold and the plan it carries (nil while the group rebalances,
	// or when it does not decode: PlanErr says why).
	Held    []int32
	Plan    *Plan
	PlanErr error
}

// Describe returns the group's state and members.
func (s *Store) Describe(ctx context.Context) (Description, error) {
	if err := ctx.Err(); err != nil {
		return Description{}, fmt.Errorf("kafkastore: describe group %s: %w", s.group, err)
	}
	coord, err := s.coordinator()
	if err != nil {
		return Description{}, err
	}
	resp, err := coord.DescribeGroups(&sarama.DescribeGroupsRequest{Version: 5, Groups: []string{s.group}})
	if err != nil {
		return Description{}, s.brokerError("describe", coord, err)
	}
	if len(resp.Groups) != 1 {
		return Description{}, fmt.Errorf("kafkastore: describe group %s: %d groups in the answer", s.group, len(resp.Groups))
	}
	g := resp.Groups[0]
	switch g.Err {
	case sarama.ErrNoError:
	case sarama.ErrGroupIDNotFound:
		return Description{}, nil
	default:
		return Description{}, s.groupError("describe", g.Err)
	}
	d := Description{Group: s.group, State: g.State, ProtocolType: g.ProtocolType, Protocol: g.Protocol}
	for id, m := range g.Members {
		gm := GroupMember{MemberID: id, ClientID: m.ClientId, Host: m.ClientHost}
		if m.GroupInstanceId != nil {
			gm.InstanceID = *m.GroupInstanceId
		}
		switch {
		case d.Mode() == ModeSpread:
			a, err := m.GetMemberAssignment()
			if err == nil {
				gm.Held, gm.Plan, err = decodeAssignment(s.topic, a)
			}
			gm.PlanErr = err
		case len(m.MemberMetadata) > 0:
			gm.Leader, gm.LeaderErr = decodeLeader(m)
		}
		d.Members = append(d.Members, gm)
	}
	slices.SortFunc(d.Members, func(a, b GroupMember) int { return strings.Compare(a.MemberID, b.MemberID) })
	return d, nil
}

// decodeLeader reads a fanout leader's metadata.
func decodeLeader(m *sarama.GroupMemberDescription) (*Leader, error) {
	md, err := m.GetMemberMetadata()
	if err != nil {
		return nil, fmt.Errorf("member metadata is not a consumer subscription: %w", err)
	}
	var l Leader
	if err := json.Unmarshal(md.UserData, &l); err != nil {
		return nil, fmt.Errorf("member user data %q is not a fanout leader's: %w", md.UserData, err)
	}
	return &l, nil
}

// ErrForeignMember: the group has a member that is not a fanout leader (a
// consumer given fanout's group id, or a corrupt member): fanout cannot
// lead while it is there.
var ErrForeignMember = errors.New("kafkastore: the group has a member that is not a fanout leader")

// Holder returns the member that holds InstanceID: the leader the group
// names. ok is false when nobody does. It fails with ErrForeignMember when
// the group has any other member, or the holder's metadata is not a
// leader's; and without ErrForeignMember while the coordinator shows no
// metadata (a rebalance is under way).
func (d Description) Holder() (m GroupMember, ok bool, err error) {
	if d.Mode() == ModeSpread && len(d.Members) > 0 {
		return GroupMember{}, false, d.otherModeError(d.Group, ModeLeader)
	}
	for _, gm := range d.Members {
		if gm.InstanceID != InstanceID {
			return GroupMember{}, false, fmt.Errorf("member %s (instance %q, client %s at %s): %w",
				gm.MemberID, gm.InstanceID, gm.ClientID, gm.Host, ErrForeignMember)
		}
	}
	if d.ProtocolType != "" && d.ProtocolType != protocolType {
		return GroupMember{}, false, fmt.Errorf("protocol type %q: %w", d.ProtocolType, ErrForeignMember)
	}
	if len(d.Members) == 0 {
		return GroupMember{}, false, nil
	}
	gm := d.Members[0]
	switch {
	case gm.LeaderErr != nil:
		return GroupMember{}, false, fmt.Errorf("member %s: %w: %w", gm.MemberID, ErrForeignMember, gm.LeaderErr)
	case gm.Leader == nil:
		return GroupMember{}, false, fmt.Errorf("group in state %s shows no member metadata", d.State)
	}
	return gm, true, nil
}
