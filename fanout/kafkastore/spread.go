package kafkastore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// SpreadConfig configures one member of spread mode in the group
// (Store.Spread).
type SpreadConfig struct {
	// Node is the member's node id: its static group.instance.id
	// (KIP-345), so that a restart within the session timeout takes its
	// place back and moves nothing. Addr is its advertised client address,
	// Weight its share (at least 1).
	Node   string
	Addr   string
	Weight int
	// Client is the membership's own Kafka client: a JoinGroup waits for
	// every member of the group, and a broker answers one connection's
	// requests in order, so nothing else may wait behind it. The caller owns
	// it.
	Client sarama.Client
	// Heartbeat is the interval of the membership's heartbeats (0: one
	// second); the session timeout is the Store's.
	Heartbeat time.Duration
	// PartitionRefresh is how often the topic's partition count is read (0:
	// 10 s); a change makes the member join again, so that the leader plans
	// the new partitions.
	PartitionRefresh time.Duration
	// Planner computes each generation's plan when this member leads the
	// group; required.
	Planner Planner
	// Committed reports whether the group ever committed offsets of the
	// topic (PlanInput.Committed); nil means never.
	Committed func() bool
	Logger    *logrus.Entry
}

// Spread is one member of spread mode in the group fanout_<id>: it drives
// the group protocol itself (JoinGroup, SyncGroup, Heartbeat, LeaveGroup)
// with the static instance id of its node, plans with the Planner when the
// coordinator makes it the group's leader, and keeps which partitions the
// current generation grants it and which of them it holds (Reserve, each a
// Claim that fences the partition's commits). It joins again when it
// released a partition that moves (so that the leader hands it to its next
// owner), when the coordinator starts a rebalance, and when the topic's
// partition count changes. Its state is read by the claims' callers and by
// the Store's commits; one goroutine (run) talks to the coordinator.
type Spread struct {
	store *Store
	cfg   SpreadConfig
	log   *logrus.Entry

	start      sync.Once
	cancel     context.CancelFunc
	routines   actor.Group
	partitions atomic.Int32  // the topic's partition count as last read; 0 while unknown
	changed    chan struct{} // capacity 1: the plan may have changed (for the ownership loop)

	mu         sync.Mutex // guards what follows
	memberID   string     // "" while the member has no membership
	generation int32      // the generation last synced; -1 before
	live       bool       // a membership synced and not lost since
	session    int64      // of the membership: changes whenever one is lost
	sessions   int64
	plan       *Plan            // of generation; nil while not live
	granted    map[int32]bool   // the partitions generation lets this member hold
	held       map[int32]uint64 // the partitions reserved, with their tenure
	given      map[int32]bool   // granted partitions given back in this generation (they move)
	rejoin     bool             // join again at the next heartbeat: something was given back
	reported   []int32          // the partitions the last join said this member owns
	tenures    uint64           // the last tenure given
	bcast      chan struct{}    // closed and replaced at every change
	failures   int              // join failures since the last success
	lastErr    error            // the last join failure
	errs       uint64           // join failures so far (Join returns a new one)
}

// Spread returns the membership of cfg.Node in spread mode; nothing runs
// until Join.
func (s *Store) Spread(cfg SpreadConfig) *Spread {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.PartitionRefresh <= 0 {
		cfg.PartitionRefresh = 10 * time.Second
	}
	if cfg.Weight < 1 {
		cfg.Weight = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Spread{store: s, cfg: cfg, log: cfg.Logger.WithField("group", s.group), changed: make(chan struct{}, 1),
		generation: -1, granted: map[int32]bool{}, held: map[int32]uint64{}, given: map[int32]bool{},
		bcast: make(chan struct{})}
}

// Claim is the condition of one partition's commits in spread mode: the
// partition as this member reserved it (its tenure), in its membership. A
// commit under it carries the membership's member id, instance id and
// current generation, which the coordinator checks; the member sends it
// only while the tenure holds: the partition is still held by it, under
// the same membership, in a generation that lets it hold it. A member whose
// generation moved on, or whose membership the coordinator dropped, has the
// commit refused; a member that learnt it lost the partition sends none.
type Claim struct {
	s         *Spread
	Partition int32
	Member    string // the member id of the membership that reserved it
	Tenure    uint64 // tells this reserve from any other of the process
}

// String describes the claim for logs and errors.
func (c Claim) String() string {
	group := ""
	if c.s != nil {
		group = c.s.store.group
	}
	return fmt.Sprintf("group %s partition %d member %s tenure %d", group, c.Partition, c.Member, c.Tenure)
}

// claimed is the membership a commit of Claims is made under.
type claimed struct{ Member }

// Plan returns the plan of the generation in force, or nil while the member
// has no membership.
func (s *Spread) Plan() *Plan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plan
}

// Changed receives a value (capacity 1, never closed) whenever Plan or
// Session may have changed.
func (s *Spread) Changed() <-chan struct{} { return s.changed }

// Session identifies the current membership, 0 while there is none: it
// changes whenever a membership is lost (the coordinator dropped it, or no
// heartbeat was answered for the session timeout), and every partition may
// be taken over then.
func (s *Spread) Session() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live {
		return 0
	}
	return s.session
}

// Join starts the membership (once) and waits until it has one, returning
// its session; or returns the next failure to join (a coordinator out of
// reach, the group held by the other mode), or ctx's error.
func (s *Spread) Join(ctx context.Context) (int64, error) {
	s.start.Do(func() {
		rctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		s.routines.Go(s.log, "spread group membership", func() { s.run(rctx) }, nil)
		s.routines.Go(s.log, "spread partition count", func() { s.watchPartitions(rctx) }, nil)
	})
	s.mu.Lock()
	seen := s.errs
	s.mu.Unlock()
	for {
		s.mu.Lock()
		live, session, errs, last, ch := s.live, s.session, s.errs, s.lastErr, s.bcast
		s.mu.Unlock()
		switch {
		case live:
			return session, nil
		case errs != seen:
			return 0, last
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("kafkastore: join group %s: %w", s.store.group, ctx.Err())
		}
	}
}

// Reserve makes partition p this member's once the generation in force
// lets it hold p (its previous holder released it and joined again, or
// left), and returns the Claim of its commits. A reserve again of a
// partition held gives a new tenure: the earlier one's commits are refused.
// waiting is told, once per holder, of the member that holds p meanwhile.
func (s *Spread) Reserve(ctx context.Context, p int32, waiting func(holder string)) (Claim, error) {
	told := ""
	for {
		s.mu.Lock()
		if s.live && s.granted[p] && !s.given[p] {
			s.tenures++
			s.held[p] = s.tenures
			c := Claim{s: s, Partition: p, Member: s.memberID, Tenure: s.tenures}
			s.mu.Unlock()
			return c, nil
		}
		holder, ch := s.plan.HolderOf(p), s.bcast
		s.mu.Unlock()
		if holder != "" && holder != s.cfg.Node && holder != told && waiting != nil {
			told = holder
			waiting(holder)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return Claim{}, fmt.Errorf("kafkastore: reserve partition %d in group %s: %w", p, s.store.group, ctx.Err())
		}
	}
}

// ErrNotHeld is wrapped by Release when the claim no longer holds: the
// partition was lost (the membership, or the generation that granted it),
// or reserved again since.
var ErrNotHeld = errors.New("kafkastore: the claim no longer holds")

// Release gives back the partition of c, after its last commit. A partition
// that the plan in force assigns elsewhere moves: the member joins again at
// its next heartbeat, without it, so that the leader grants it to its next
// owner; one still assigned to this member stays its own, for the next
// Reserve.
func (s *Spread) Release(c Claim) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.holds(c) {
		return fmt.Errorf("kafkastore: release %v: %w", c, ErrNotHeld)
	}
	delete(s.held, c.Partition)
	if !s.targeted(c.Partition) {
		s.given[c.Partition] = true
		s.rejoin = true
	}
	s.signal()
	return nil
}

// Watch returns nil once c no longer holds, or ctx's error.
func (s *Spread) Watch(ctx context.Context, c Claim) error {
	for {
		s.mu.Lock()
		ok, ch := s.holds(c), s.bcast
		s.mu.Unlock()
		if !ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("kafkastore: watch %v: %w", c, ctx.Err())
		}
	}
}

// Leave stops the membership and leaves the group, so that the others take
// its partitions over at once (a static member that does not leave keeps
// them until its session timeout). Call it after the partitions' last
// commits. It does nothing when Join never ran.
func (s *Spread) Leave(ctx context.Context) error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.routines.Wait()
	s.mu.Lock()
	memberID := s.memberID
	s.lose()
	s.mu.Unlock()
	if memberID == "" {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kafkastore: leave group %s: %w", s.store.group, err)
	}
	coord, err := s.coordinator()
	if err != nil {
		return err
	}
	instance := s.cfg.Node
	resp, err := coord.LeaveGroup(&sarama.LeaveGroupRequest{Version: 3, GroupId: s.store.group,
		Members: []sarama.MemberIdentity{{MemberId: memberID, GroupInstanceId: &instance}}})
	if err != nil {
		return s.brokerError("leave", coord, err)
	}
	kerr := resp.Err
	if kerr == sarama.ErrNoError && len(resp.Members) == 1 {
		kerr = resp.Members[0].Err
	}
	if kerr != sarama.ErrNoError {
		return s.groupError("leave", kerr)
	}
	s.log.WithField("member", memberID).Info("left the group: the others take this member's partitions over")
	return nil
}

// holds reports whether c still holds. s.mu must be held.
func (s *Spread) holds(c Claim) bool {
	return c.s == s && s.live && c.Member == s.memberID && s.held[c.Partition] == c.Tenure && s.granted[c.Partition]
}

// targeted reports whether the plan in force assigns p to this member.
// s.mu must be held.
func (s *Spread) targeted(p int32) bool {
	o, ok := s.plan.Owner(s.cfg.Node)
	if !ok {
		return false
	}
	_, ok = slices.BinarySearch(o.Target, p)
	return ok
}

// signal wakes whoever waits for a change. s.mu must be held.
func (s *Spread) signal() {
	close(s.bcast)
	s.bcast = make(chan struct{})
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// resolve returns the membership a commit under conds (Claims of this
// member) is made under: the member id and the generation in force. It
// fails with offsets.ErrFenced when one of them no longer holds.
func (s *Spread) resolve(conds []offsets.Condition) (claimed, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cond := range conds {
		c, ok := cond.(Claim)
		if !ok || c.s != s {
			return claimed{}, fmt.Errorf("condition %v (%T) is not a claim of this member: %w", cond, cond, offsets.ErrFenced)
		}
		if !s.holds(c) {
			return claimed{}, fmt.Errorf("%v no longer holds (the partition moved, or the membership was lost): %w", c, offsets.ErrFenced)
		}
	}
	return claimed{Member{Group: s.store.group, Generation: s.generation, MemberID: s.memberID, Node: s.cfg.Node,
		Instance: s.cfg.Node}}, nil
}

// lose forgets the membership: every partition is lost. s.mu must be held.
func (s *Spread) lose() {
	s.memberID, s.generation, s.plan = "", -1, nil
	if s.live {
		s.live = false
	}
	clear(s.granted)
	clear(s.held)
	clear(s.given)
	s.rejoin, s.reported = false, nil
	s.signal()
}

// errRejoin: the round ended because a rebalance is due; join again at once.
var errRejoin = errors.New("kafkastore: join again")

// run drives the membership until ctx ends: join and sync, then heartbeat
// until a rebalance is due, again and again; failures are logged and retried
// with backoff.
func (s *Spread) run(ctx context.Context) {
	s.readPartitions() // before the first join, which says it
	b := backoff.Backoff{Min: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: true}
	for ctx.Err() == nil {
		err := s.round(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errRejoin) {
			b.Reset()
			continue
		}
		s.mu.Lock()
		s.failures++
		s.errs++
		s.lastErr = err
		n := s.failures
		s.signal()
		s.mu.Unlock()
		wait := b.Next()
		log := s.log.WithError(err).WithField("retry_in", wait.Round(time.Millisecond))
		if n == 1 || n%10 == 0 {
			log.WithField("failures", n).Warn("spread mode: the group membership failed; joining again")
		} else {
			log.Debug("spread mode: the group membership failed; joining again")
		}
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// round joins the group, syncs, and heartbeats until a rebalance is due
// (errRejoin) or the membership failed.
func (s *Spread) round(ctx context.Context) error {
	if err := s.joinAndSync(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.failures = 0
	s.mu.Unlock()
	return s.heartbeats(ctx)
}

// joinState returns what this member's join says: its member id, the
// partitions it owns (granted and not given back, and held), and its
// metadata. It notes the partitions reported.
func (s *Spread) joinState() (string, *sarama.ConsumerGroupMemberMetadata, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	owned := map[int32]bool{}
	for p := range s.granted {
		if !s.given[p] {
			owned[p] = true
		}
	}
	for p := range s.held {
		owned[p] = true
	}
	s.reported = slices.Sorted(maps.Keys(owned))
	s.rejoin = false
	meta := memberMeta{Node: s.cfg.Node, Addr: s.cfg.Addr, Weight: s.cfg.Weight, Partitions: s.partitions.Load()}
	if s.plan != nil {
		meta.Initial, meta.Planned = s.plan.Initial, true
	}
	md, err := encodeJoin(s.store.topic, meta, s.reported, s.generation)
	return s.memberID, md, err
}

// joinAndSync makes one JoinGroup and SyncGroup round, planning when the
// coordinator names this member the group's leader, and applies the
// assignment it gets.
func (s *Spread) joinAndSync(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	memberID, md, err := s.joinState()
	if err != nil {
		return err
	}
	coord, err := s.coordinator()
	if err != nil {
		return err
	}
	instance := s.cfg.Node
	join := sarama.NewJoinGroupRequest(s.cfg.Client.Config().Version)
	join.GroupId, join.MemberId, join.GroupInstanceId = s.store.group, memberID, &instance
	join.SessionTimeout = int32(s.store.session.Milliseconds())
	join.RebalanceTimeout = join.SessionTimeout
	join.ProtocolType = protocolType
	if err := join.AddGroupProtocolMetadata(spreadProtocol, md); err != nil {
		return fmt.Errorf("kafkastore: encode join of group %s: %w", s.store.group, err)
	}
	jr, err := coord.JoinGroup(join)
	if err != nil {
		return s.brokerError("join", coord, err)
	}
	switch jr.Err {
	case sarama.ErrNoError:
	case sarama.ErrUnknownMemberId, sarama.ErrFencedInstancedId:
		return s.dropped("join", jr.Err)
	case sarama.ErrRebalanceInProgress:
		return errRejoin
	case sarama.ErrInconsistentGroupProtocol:
		return s.store.otherMode(ctx, "join", jr.Err, ModeSpread)
	default:
		return s.groupError("join", jr.Err)
	}
	s.mu.Lock()
	if s.memberID != "" && s.memberID != jr.MemberId {
		s.log.WithFields(logrus.Fields{"member": s.memberID, "now": jr.MemberId}).Warn("spread mode: the coordinator gave this member another member id: its partitions are lost")
		s.lose()
	}
	s.memberID = jr.MemberId
	s.mu.Unlock()

	sync := &sarama.SyncGroupRequest{Version: 5, GroupId: s.store.group, GenerationId: jr.GenerationId,
		MemberId: jr.MemberId, GroupInstanceId: &instance}
	pt, pn := protocolType, spreadProtocol
	sync.ProtocolType, sync.ProtocolName = &pt, &pn
	if jr.LeaderId == jr.MemberId && len(jr.Members) > 0 {
		if err := s.lead(jr, sync); err != nil {
			return err
		}
	}
	sr, err := coord.SyncGroup(sync)
	if err != nil {
		return s.brokerError("sync", coord, err)
	}
	switch sr.Err {
	case sarama.ErrNoError:
	case sarama.ErrRebalanceInProgress, sarama.ErrIllegalGeneration:
		return errRejoin
	case sarama.ErrUnknownMemberId, sarama.ErrFencedInstancedId:
		return s.dropped("sync", sr.Err)
	default:
		return s.groupError("sync", sr.Err)
	}
	a, err := sr.GetMemberAssignment()
	if err != nil {
		return fmt.Errorf("kafkastore: the assignment of group %s generation %d: %w", s.store.group, jr.GenerationId, err)
	}
	held, plan, err := decodeAssignment(s.store.topic, a)
	if err != nil {
		return fmt.Errorf("kafkastore: group %s generation %d: %w", s.store.group, jr.GenerationId, err)
	}
	if plan == nil {
		return fmt.Errorf("kafkastore: group %s generation %d: the leader (member %s) sent this member no spread plan: "+
			"is every member of the group a fanout of --assignment spread?", s.store.group, jr.GenerationId, jr.LeaderId)
	}
	s.apply(jr.GenerationId, held, plan)
	return nil
}

// lead computes the plan of the generation jr begins, as the group's
// leader, and puts every member's assignment in sync.
func (s *Spread) lead(jr *sarama.JoinGroupResponse, sync *sarama.SyncGroupRequest) error {
	in := PlanInput{Generation: jr.GenerationId, Leader: s.cfg.Node}
	for _, m := range jr.Members {
		in.Members = append(in.Members, decodeJoin(s.store.topic, m.MemberId, m.Metadata))
	}
	s.mu.Lock()
	in.Previous = s.plan
	s.mu.Unlock()
	if s.cfg.Committed != nil {
		in.Committed = s.cfg.Committed()
	}
	plan := s.cfg.Planner(in)
	plan.Generation, plan.Leader = jr.GenerationId, s.cfg.Node
	for _, m := range in.Members {
		a, err := encodeAssignment(s.store.topic, &plan, m.Node)
		if err != nil {
			return err
		}
		if m.Node == "" {
			a.Topics = map[string][]int32{} // not a spread member: nothing
		}
		if err := sync.AddGroupAssignmentMember(m.MemberID, a); err != nil {
			return fmt.Errorf("kafkastore: encode assignment of group %s: %w", s.store.group, err)
		}
	}
	s.log.WithFields(logrus.Fields{"generation": jr.GenerationId, "members": len(in.Members), "partitions": plan.Partitions,
		"plan": plan.String()}).Info("spread mode: planned the group's generation as its leader")
	return nil
}

// apply takes the assignment of generation gen: the partitions this member
// may hold, and the plan. A partition held and no longer granted is lost
// (its Watch returns); one granted, not held and assigned elsewhere is
// given back at once.
func (s *Spread) apply(gen int32, held []int32, plan *Plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := !s.live
	s.generation, s.plan = gen, plan
	clear(s.granted)
	clear(s.given)
	for _, p := range held {
		s.granted[p] = true
	}
	var lost []int32
	for p := range s.held {
		if !s.granted[p] {
			delete(s.held, p)
			lost = append(lost, p)
		}
	}
	for p := range s.granted {
		if s.held[p] == 0 && !s.targeted(p) {
			s.given[p] = true
			s.rejoin = true
		}
	}
	if first {
		s.live = true
		s.sessions++
		s.session = s.sessions
	}
	s.signal()
	log := s.log.WithFields(logrus.Fields{"generation": gen, "leader": plan.Leader, "held": Ranges(held),
		"plan": plan.String()})
	if len(lost) > 0 {
		slices.Sort(lost)
		log.WithField("lost", Ranges(lost)).Warn("spread mode: the generation no longer lets this member hold some partitions it held: dropped")
	} else {
		log.Info("spread mode: joined the group's generation")
	}
}

// dropped handles a refusal that says the membership is gone (expired,
// replaced by another process with this node id): every partition is lost,
// and the next round joins anew.
func (s *Spread) dropped(what string, kerr sarama.KError) error {
	s.mu.Lock()
	memberID := s.memberID
	if memberID != "" || s.live {
		s.lose()
	}
	s.mu.Unlock()
	if kerr == sarama.ErrFencedInstancedId {
		return fmt.Errorf("kafkastore: %s group %s: another process joined with this node id (%s), which replaced this member: "+
			"give every daemon its own --node-id: %w", what, s.store.group, s.cfg.Node, kerr)
	}
	return fmt.Errorf("kafkastore: %s group %s: the coordinator no longer knows member %q (its session expired): every partition is lost: %w",
		what, s.store.group, memberID, kerr)
}

// heartbeats keeps the membership alive until a rebalance is due
// (errRejoin: the coordinator began one, this member gave partitions back,
// or the topic's partition count changed) or the membership is lost: the
// coordinator refused it, or answered no heartbeat for the session timeout.
func (s *Spread) heartbeats(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		s.mu.Lock()
		memberID, gen, rejoin := s.memberID, s.generation, s.rejoin
		var known int32
		if s.plan != nil {
			known = s.plan.Partitions
		}
		s.mu.Unlock()
		if n := s.partitions.Load(); n > known {
			s.log.WithFields(logrus.Fields{"partitions": n, "planned": known}).Info("spread mode: the topic's partition count changed: joining again")
			return errRejoin
		}
		if rejoin {
			return errRejoin
		}
		err := s.heartbeat(memberID, gen)
		switch {
		case err == nil:
			lastOK = time.Now()
		case errors.Is(err, errRejoin):
			return err
		case errors.Is(err, offsets.ErrFenced):
			return err
		case time.Since(lastOK) >= s.store.session:
			s.mu.Lock()
			s.lose()
			s.mu.Unlock()
			return fmt.Errorf("kafkastore: no heartbeat answered for the session timeout %v: the coordinator may have dropped this member: every partition is dropped: %w",
				s.store.session, err)
		default:
			s.log.WithError(err).Debug("spread mode: heartbeat failed")
		}
	}
}

// heartbeat sends one Heartbeat: errRejoin when a rebalance is under way,
// an error wrapping offsets.ErrFenced when the membership is gone.
func (s *Spread) heartbeat(memberID string, gen int32) error {
	coord, err := s.coordinator()
	if err != nil {
		return err
	}
	instance := s.cfg.Node
	resp, err := coord.Heartbeat(&sarama.HeartbeatRequest{Version: 4, GroupId: s.store.group, GenerationId: gen,
		MemberId: memberID, GroupInstanceId: &instance})
	if err != nil {
		return s.brokerError("heartbeat", coord, err)
	}
	switch resp.Err {
	case sarama.ErrNoError:
		return nil
	case sarama.ErrRebalanceInProgress, sarama.ErrIllegalGeneration:
		return errRejoin
	case sarama.ErrUnknownMemberId, sarama.ErrFencedInstancedId:
		return fmt.Errorf("%w: %w", s.dropped("heartbeat", resp.Err), offsets.ErrFenced)
	}
	return s.groupError("heartbeat", resp.Err)
}

// watchPartitions reads the topic's partition count every
// PartitionRefresh, until ctx ends.
func (s *Spread) watchPartitions(ctx context.Context) {
	for backoff.Sleep(ctx, s.cfg.PartitionRefresh) {
		s.readPartitions()
	}
}

// readPartitions reads the topic's partition count; a failure keeps the
// last one.
func (s *Spread) readPartitions() {
	if err := s.cfg.Client.RefreshMetadata(s.store.topic); err != nil {
		return
	}
	if parts, err := s.cfg.Client.Partitions(s.store.topic); err == nil {
		s.partitions.Store(int32(len(parts)))
	}
}

// coordinator returns the group's coordinator on the membership's client.
func (s *Spread) coordinator() (*sarama.Broker, error) {
	b, err := s.cfg.Client.Coordinator(s.store.group)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: coordinator of group %s: %w", s.store.group, err)
	}
	return b, nil
}

// groupError describes an error code of the coordinator (Store.joinError),
// refreshing the coordinator on the membership's client too when it moved.
func (s *Spread) groupError(what string, kerr sarama.KError) error {
	switch kerr {
	case sarama.ErrNotCoordinatorForConsumer, sarama.ErrConsumerCoordinatorNotAvailable, sarama.ErrOffsetsLoadInProgress:
		_ = s.cfg.Client.RefreshCoordinator(s.store.group)
	}
	return s.store.joinError(what, kerr)
}

// brokerError describes a request that failed on its way, and refreshes
// the coordinator on the membership's client.
func (s *Spread) brokerError(what string, coord *sarama.Broker, err error) error {
	_ = s.cfg.Client.RefreshCoordinator(s.store.group)
	return fmt.Errorf("kafkastore: %s of group %s at coordinator %s: %w", what, s.store.group, coord.Addr(), err)
}
