package topology

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Fast failover (docs/failover.md). Where every Ready node of a location
// runs meshlet, the holder of the location's Lease marks itself with
// Kilo's leader annotation (value LeaderLeaseValue), so Kilo's rule — which
// kg nodes, kgctl and remote clusters apply to the annotations — elects it
// everywhere. The planner keeps deciding the leader with Kilo's rule; the
// Lease only adds who may carry the mark, in which order candidates take a
// free Lease, and one veto: a node does not lead while another node holds
// the Lease, or while it steps aside because it is degraded.

// Timings of the health rule (docs/failover.md#health). They are the
// planner's, so every agent judges alike.
const (
	// ProbeDeadAfter: a probed tunnel that answered nothing for this long
	// (about three probes) is dead.
	ProbeDeadAfter = 3 * time.Second
	// GatewayDeadAfter: an underlay gateway that answered before and then
	// nothing for this long is unreachable.
	GatewayDeadAfter = 5 * time.Second
	// StepAsideAfter: a leader degraded this long without a break gives
	// leadership up (hysteresis against a flapping link).
	StepAsideAfter = 2 * time.Second
	// GatewayRecoverAfter: a gateway must answer this long after an outage
	// before the node is a candidate again.
	GatewayRecoverAfter = 30 * time.Second
	// StepAsideCoolDown: a node that stepped aside for its tunnels is no
	// candidate for this long (a node that no longer leads cannot probe
	// its tunnels, so its recovery cannot be seen; leadership flaps at most
	// this often).
	StepAsideCoolDown = 5 * time.Minute
	// RankStagger: a candidate of rank k takes a free Lease only after it
	// has been free k times this long, so candidates take it in Kilo's
	// order.
	RankStagger = time.Second
	// StartupGrace: while no Lease exists yet, each node ahead in Kilo's
	// order that has not published its annotations yet delays a candidate
	// by this much, so a location's first leader is the one Kilo's rule
	// names when all its agents start together.
	StartupGrace = 5 * time.Second
)

// Reasons a node may not lead, or gives leadership up (stable: they are
// metric labels, Event reasons and meshlet.io/degraded values).
const (
	ReasonWireGuardDegraded  = "WireGuardDegraded"
	ReasonGatewayUnreachable = "GatewayUnreachable"
	// ReasonNotGoverned: the location is no longer under a Lease (a kg
	// node or a user's leader annotation arrived, or one node is left).
	ReasonNotGoverned = "NotGoverned"
)

// LeaseState is this agent's view of its location's Lease
// (agent/runtime/leadership).
type LeaseState struct {
	// Name is the Lease observed (the one the last plan named).
	Name string
	// Exists: the Lease object exists.
	Exists bool
	// Holder is its holderIdentity ("" = free: released or never taken).
	Holder   string
	Duration time.Duration
	// Fresh: the holder is presumed alive until Fresh + Duration. It is the
	// later of when this agent last saw the Lease change and when its view
	// of the Lease was last broken (a watch that failed proves nothing
	// about the holder), on this agent's clock.
	Fresh time.Time
	// StepAsides are the nodes that gave leadership up for their health,
	// with when (the Lease's meshlet.io/step-asides, and this agent's own
	// latest one).
	StepAsides map[string]StepAside
}

// StepAside is one node's giving leadership up.
type StepAside struct {
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// holderAlive reports whether the Lease's holder renewed it recently enough,
// as this agent saw.
func (l *LeaseState) holderAlive(now time.Time) bool {
	return l.Holder != "" && now.Before(l.Fresh.Add(l.Duration))
}

// Health is what this node's probes observed (agent/runtime/health), on
// this agent's clock.
type Health struct {
	// Peers are the probed tunnels to other leaders.
	Peers []TunnelProbe
	// Gateway is the underlay gateway's probe (Addr invalid = none).
	Gateway GatewayProbe
}

// TunnelProbe is one probed tunnel: since when it is probed, when the peer
// last answered (zero = never).
type TunnelProbe struct {
	PublicKey       Key
	Since, Answered time.Time
}

// States of a probed tunnel (TunnelState).
const (
	TunnelAlive = "alive" // answered within ProbeDeadAfter
	TunnelDead  = "dead"  // nothing for ProbeDeadAfter
	TunnelNew   = "new"   // probed for less than that, no answer yet
)

// last is the tunnel's last answer, or when probing began.
func (t TunnelProbe) last() time.Time {
	if t.Answered.After(t.Since) {
		return t.Answered
	}
	return t.Since
}

// TunnelState is the rule for one probed tunnel at now.
func TunnelState(t TunnelProbe, now time.Time) string {
	switch {
	case !t.Answered.IsZero() && now.Sub(t.Answered) < ProbeDeadAfter:
		return TunnelAlive
	case now.Sub(t.last()) >= ProbeDeadAfter:
		return TunnelDead
	}
	return TunnelNew
}

// GatewayProbe is the underlay gateway's probe: Answered is its last
// answer (zero = it never answered: not judged, as a gateway that drops
// pings), Recovered when it answered again after being unreachable.
type GatewayProbe struct {
	Addr                       netip.Addr
	Since, Answered, Recovered time.Time
}

// Leadership is this node's part in its location's Lease: what the
// leadership actuator does (agent/runtime/leadership).
type Leadership struct {
	Location string `json:"location"`
	// Lease is the Lease's name (in meshlet's namespace).
	Lease string `json:"lease"`
	// Governed: the location is under the Lease; otherwise Kilo's rule
	// alone elects its leader. Why says which.
	Governed bool   `json:"governed"`
	Why      string `json:"why"`
	// Holder is the Lease's holder as observed.
	Holder string `json:"holder,omitempty"`
	// Candidates are the nodes that may take the Lease, in Kilo's order.
	Candidates []string `json:"candidates,omitempty"`
	// Candidate: this node competes for a free Lease once it has been
	// free for Wait (its rank in Kilo's order).
	Candidate bool          `json:"candidate"`
	Wait      time.Duration `json:"wait,omitempty"`
	// Hold: keep renewing the Lease while this node holds it.
	Hold bool `json:"hold"`
	// Release: give the Lease up now, and why.
	Release string `json:"release,omitempty"`
	// StepAside: this node leads and gives leadership up for its health
	// (the reason); the actuator records it in the Lease.
	StepAside string `json:"stepAside,omitempty"`
	// Claim: carry the marked leader annotation (this node holds the
	// Lease); Unmark: nodes whose marked leader annotation must go.
	Claim  bool     `json:"claim,omitempty"`
	Unmark []string `json:"unmark,omitempty"`
	// Degraded is this node's own health judgement ("" = fit to lead),
	// published in meshlet.io/degraded.
	Degraded string `json:"degraded,omitempty"`
}

// Probes are what this node's health probes watch.
type Probes struct {
	// Source is the address the tunnel probes leave from (this leader's
	// WireGuard IP), so answers come back through the tunnel.
	Source netip.Addr    `json:"source,omitzero"`
	Peers  []ProbeTarget `json:"peers,omitempty"`
	// Gateway is the underlay gateway to probe (invalid = none).
	Gateway netip.Addr `json:"gateway,omitzero"`
}

// ProbeTarget is one tunnel to probe: the peer's WireGuard IP.
type ProbeTarget struct {
	Name      string     `json:"name"`
	Cluster   string     `json:"cluster,omitempty"`
	PublicKey Key        `json:"publicKey"`
	Addr      netip.Addr `json:"addr"`
}

// LeaseName is the name of a location's Lease: meshlet-leader-<location>
// when that is a valid object name of at most 63 characters, else a
// readable prefix and a hash of the location (Kilo allows any string).
func LeaseName(location string) string {
	const prefix = "meshlet-leader-"
	if n := prefix + location; len(n) <= 63 && len(validation.IsDNS1123Label(n)) == 0 {
		return n
	}
	sum := sha256.Sum256([]byte(location))
	var b strings.Builder
	for _, r := range strings.ToLower(location) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), "-")
	if len(s) > 30 {
		s = strings.TrimRight(s[:30], "-")
	}
	if s != "" {
		s += "-"
	}
	return prefix + s + hex.EncodeToString(sum[:6])
}

// NodeLocation is a node's location: its location annotation, else its
// topology label (Kilo's rule).
func NodeLocation(n Node, set Settings) string { return n.location(withDefaults(set)) }

// Governance says whether the leader of a segment (its Ready nodes) is
// chosen with a Lease, and why (docs/failover.md#governed): only where
// every node runs meshlet (kg cannot follow a Lease) and no user set a
// leader annotation (a user's choice is Kilo's rule's input), in location
// granularity, with at least two nodes to choose from.
func Governance(nodes []Node, set Settings) (bool, string) {
	set = withDefaults(set)
	if set.Granularity != GranularityLocation {
		return false, "mesh granularity " + string(set.Granularity) + ": every node is its own segment (Kilo's rule)"
	}
	var kg, user []string
	for _, n := range nodes {
		if n.MeshletVersion == "" {
			kg = append(kg, n.Name)
		}
		if n.Leader && !n.LeaderMark {
			user = append(user, n.Name)
		}
	}
	switch {
	case len(kg) > 0:
		return false, "kg runs on " + strings.Join(kg, ", ") + " and cannot follow a Lease: Kilo's rule (failover when last-seen ages out, 60 s)"
	case len(user) > 0:
		return false, "leader annotation set by hand on " + strings.Join(user, ", ") + ": Kilo's rule"
	case len(nodes) < 2:
		return false, "one node: nothing to fail over to"
	}
	return true, "every node runs meshlet: the holder of the Lease leads"
}

// kiloOrder sorts nodes as Kilo's rule prefers them (findLeader): the
// leader annotation with a public endpoint, the annotation, a public
// endpoint, then by name.
func kiloOrder(nodes []*Node) []*Node {
	out := slices.Clone(nodes)
	rank := func(n *Node) int {
		pub := isPublic(endpointAddr(n.Endpoint))
		switch {
		case n.Leader && pub:
			return 0
		case n.Leader:
			return 1
		case pub:
			return 2
		}
		return 3
	}
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i]), rank(out[j])
		if ri != rj {
			return ri < rj
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// health is this node's judgement of its own probes.
type health struct {
	// tunnels: TunnelsUp, TunnelsDown or "" (nothing judged).
	tunnels string
	// wgDegraded: every tunnel is dead while one of its peers reaches
	// others; since wgOnset.
	wgDegraded bool
	wgOnset    time.Time
	// gwDown since gwOnset; gwRecovering: it answers again, not long
	// enough yet.
	gwDown       bool
	gwOnset      time.Time
	gwRecovering bool
}

// judgeHealth applies the rule of docs/failover.md#health to Self.Health.
func (p *planner) judgeHealth() health {
	var h health
	hp := p.self.Health
	if hp == nil {
		return h
	}
	now := p.snap.Now
	alive, dead := 0, 0
	var lastAnswer time.Time
	reachesOthers := false
	for _, t := range hp.Peers {
		switch TunnelState(t, now) {
		case TunnelAlive:
			alive++
		case TunnelDead:
			dead++
			if p.tunnelsOf(t.PublicKey) == TunnelsUp {
				reachesOthers = true
			}
		}
		if ref := t.last(); ref.After(lastAnswer) {
			lastAnswer = ref
		}
	}
	switch {
	case alive > 0:
		h.tunnels = TunnelsUp
	case dead > 0 && dead == len(hp.Peers):
		h.tunnels = TunnelsDown
		h.wgDegraded = reachesOthers
		h.wgOnset = lastAnswer.Add(ProbeDeadAfter)
	}
	g := hp.Gateway
	if g.Addr.IsValid() && !g.Answered.IsZero() {
		if now.Sub(g.Answered) >= GatewayDeadAfter {
			h.gwDown, h.gwOnset = true, g.Answered.Add(GatewayDeadAfter)
		} else if !g.Recovered.IsZero() && now.Sub(g.Recovered) < GatewayRecoverAfter {
			h.gwRecovering = true
		}
	}
	return h
}

// tunnelsOf is what the node with key k publishes of its tunnels (local
// segment leaders and remote leaders).
func (p *planner) tunnelsOf(k Key) string {
	for i := range p.snap.Nodes {
		if p.snap.Nodes[i].PublicKey == k {
			return p.snap.Nodes[i].Tunnels
		}
	}
	for _, r := range p.snap.Remotes {
		for i := range r.Nodes {
			if r.Nodes[i].PublicKey == k {
				return r.Nodes[i].Tunnels
			}
		}
	}
	return ""
}

// leadership decides this node's part in its location's Lease and applies
// the veto to the segment's leader (see the top of this file). It runs
// after the segments are built and before the role is read from them.
func (p *planner) leadership(h health) {
	lease := p.snap.Lease
	if lease == nil {
		return
	}
	now := p.snap.Now
	l := &Leadership{Holder: lease.Holder}
	p.plan.Leadership = l
	seg := p.selfSegment
	if seg == nil {
		// Not in the mesh (not Ready in Kilo's sense): it may still hold
		// the Lease or a mark from before.
		l.Why = "this node is not Ready in Kilo's sense"
		if lease.Holder == p.self.Name {
			l.Release = ReasonNotGoverned
		}
		return
	}
	l.Location = p.selfNode.location(p.set)
	l.Lease = LeaseName(l.Location)
	if seg.key != locationPrefix+l.Location {
		l.Lease = ""
	}
	if lease.Name != l.Lease {
		// The agent watches another Lease (this node's location just
		// changed): nothing is known of this one yet.
		lease = &LeaseState{Name: l.Lease, Exists: true}
	}
	nodes := make([]Node, len(seg.nodes))
	for i, n := range seg.nodes {
		nodes[i] = *n
	}
	l.Governed, l.Why = Governance(nodes, p.set)
	if l.Lease == "" && l.Governed {
		l.Governed, l.Why = false, "no private IP: the node is its own segment"
	}
	cooling := func(name string) bool {
		sa, ok := lease.StepAsides[name]
		return ok && now.Before(sa.At.Add(StepAsideCoolDown))
	}
	// This node's own health.
	switch {
	case h.gwDown || h.gwRecovering:
		l.Degraded = ReasonGatewayUnreachable
	case h.wgDegraded || cooling(p.self.Name):
		l.Degraded = ReasonWireGuardDegraded
	}
	if !l.Governed {
		if lease.Holder == p.self.Name {
			l.Release = ReasonNotGoverned
		}
		// Kilo's rule alone: meshlet's mark goes, unless only this node is
		// left (it leads anyway, and keeps leading when others come back).
		if p.selfNode.LeaderMark && len(seg.nodes) > 1 {
			l.Unmark = []string{p.self.Name}
		}
		return
	}
	alive := lease.holderAlive(now)
	// A leader gives leadership up once degraded for StepAsideAfter; a
	// node that did is no candidate while it cools down, nor one whose
	// gateway is down or not answering long enough again.
	failing := h.gwDown && !now.Before(h.gwOnset.Add(StepAsideAfter)) ||
		h.wgDegraded && !now.Before(h.wgOnset.Add(StepAsideAfter))
	unfit := failing || cooling(p.self.Name)
	fit := !unfit && !h.gwDown && !h.gwRecovering
	var others []*Node
	for _, n := range kiloOrder(seg.nodes) {
		switch {
		case n.Name == p.self.Name:
			if fit {
				l.Candidates = append(l.Candidates, n.Name)
			}
		case n.Degraded != "", cooling(n.Name), n.Name == lease.Holder && !alive:
			// Degraded, cooling down, or a holder that stopped renewing
			// (presumed dead): not a candidate.
		default:
			l.Candidates = append(l.Candidates, n.Name)
			others = append(others, n)
		}
	}
	// A node that is not fit still competes when nobody else can lead.
	l.Candidate = fit || len(others) == 0
	otherHolds := alive && lease.Holder != p.self.Name
	kiloSelf := seg.leaderNode().Name == p.self.Name
	giveUp := unfit && len(others) > 0
	if giveUp && !otherHolds && (kiloSelf || lease.Holder == p.self.Name) {
		l.StepAside = ReasonWireGuardDegraded
		if h.gwDown {
			l.StepAside = ReasonGatewayUnreachable
		}
	}
	if lease.Holder == p.self.Name {
		switch {
		case giveUp:
			l.Release = l.StepAside
			if l.Release == "" {
				l.Release = ReasonWireGuardDegraded
			}
		default:
			l.Hold = true
			l.Claim = true
		}
	}
	if l.Claim {
		for _, n := range seg.nodes {
			if n.LeaderMark && n.Name != p.self.Name {
				l.Unmark = append(l.Unmark, n.Name)
			}
		}
	}
	if l.Candidate {
		l.Wait = p.candidateWait(l.Candidates)
	}
	if (otherHolds || giveUp) && kiloSelf {
		p.vetoSelf(seg)
	}
}

// candidateWait is how long a free Lease must have been free before this
// node takes it: RankStagger per candidate ahead of it in Kilo's order —
// not counting the holder, for a Lease is only taken once its holder gave
// it up or stopped renewing — and while no Lease exists, StartupGrace per
// node ahead of it that has not published its annotations yet (its agent
// is starting).
func (p *planner) candidateWait(candidates []string) time.Duration {
	rank := 0
	for _, c := range candidates {
		if c == p.self.Name {
			break
		}
		if c != p.snap.Lease.Holder {
			rank++
		}
	}
	wait := time.Duration(rank) * RankStagger
	if p.snap.Lease.Exists || isPublic(endpointAddr(p.endpoint)) {
		return wait
	}
	loc := p.selfNode.location(p.set)
	for i := range p.snap.Nodes {
		n := &p.snap.Nodes[i]
		if n.Name < p.self.Name && n.LastSeen.IsZero() && n.location(p.set) == loc && !slices.Contains(candidates, n.Name) {
			wait += StartupGrace
		}
	}
	return wait
}

// vetoSelf makes the next node in Kilo's order this node's view of the
// segment's leader: it does not lead, and routes through that node.
func (p *planner) vetoSelf(seg *segment) {
	if len(seg.nodes) < 2 {
		return
	}
	rest := make([]*Node, 0, len(seg.nodes)-1)
	for _, n := range seg.nodes {
		if n.Name != p.self.Name {
			rest = append(rest, n)
		}
	}
	l := rest[findLeader(rest)]
	for i, n := range seg.nodes {
		if n == l {
			seg.leader = i
		}
	}
	for i := range p.plan.Segments {
		if p.plan.Segments[i].Name == seg.key {
			p.plan.Segments[i].Leader = l.Name
		}
	}
}

// publishHealth publishes what this node's probes found and its own
// judgement, and lists what its probes are to watch
// (Settings.HealthProbes).
func (p *planner) publishHealth(h health) {
	if !p.set.HealthProbes {
		return
	}
	tunnels := ""
	if p.plan.Leader {
		tunnels = h.tunnels
	}
	p.plan.Annotations[AnnotationTunnels] = tunnels
	pr := &Probes{}
	if p.plan.Leader {
		pr.Source = p.plan.WireGuardIP.Addr()
		pr.Peers = p.probeTargets
	}
	if l := p.plan.Leadership; l != nil {
		p.plan.Annotations[AnnotationDegraded] = l.Degraded
		if l.Governed {
			pr.Gateway = p.self.DefaultGateway
		}
	}
	if pr.Source.IsValid() || pr.Gateway.IsValid() {
		p.plan.Probes = pr
	}
}

// probe adds a tunnel to the probes: the peer's WireGuard IP, which its
// kernel answers through the tunnel.
func (p *planner) probe(wp WireGuardPeer, addr netip.Addr) {
	if p.set.HealthProbes && addr.IsValid() {
		p.probeTargets = append(p.probeTargets, ProbeTarget{Name: wp.Name, Cluster: wp.Cluster, PublicKey: wp.PublicKey, Addr: addr})
	}
}
