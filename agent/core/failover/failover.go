// Package failover is meshlet's fast failover as pure decisions
// (docs/failover.md): judging this node's health probes, and deciding its
// part in its location's Lease. Where every Ready node of a location runs
// meshlet, the holder of the location's Lease marks itself with Kilo's
// leader annotation (value topology.LeaderLeaseValue), so Kilo's rule —
// which kg nodes, kgctl and remote clusters apply to the annotations —
// elects it everywhere. The planner (agent/core/planner) keeps deciding the
// leader with Kilo's rule (agent/core/topology); this package only adds
// who may carry the mark, in which order candidates take a free Lease, and
// one veto: a node does not lead while another node holds the Lease, or
// while it steps aside because it is degraded. It reads no clock: every
// time is an input.
package failover

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/meshlet/meshlet/agent/core/topology"
)

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
	// ReasonLeaving: the node is going away (cordoned, being deleted, or
	// its agent stops for good): its holder hands the Lease over at once,
	// and it is a candidate only when nobody else can lead. Unlike a
	// degraded node it does not cool down.
	ReasonLeaving = "Leaving"
	// ReasonForeignLeaseHolder: the location's Lease is held by a name
	// that is none of the location's Ready nodes (ForeignHolder). The
	// API server lets an agent take any meshlet Lease for its own node
	// (manifests/components/admission: it cannot tell which location a
	// node is in), so a node of another location, or a compromised one,
	// could otherwise keep a location leaderless for as long as it renews.
	ReasonForeignLeaseHolder = "ForeignLeaseHolder"
)

// States of a probed tunnel (TunnelState).
const (
	TunnelAlive = "alive" // answered within ProbeDeadAfter
	TunnelDead  = "dead"  // nothing for ProbeDeadAfter
	TunnelNew   = "new"   // probed for less than that, no answer yet
)

// lastAnswer is the tunnel's last answer, or when probing began.
func lastAnswer(t topology.TunnelProbe) time.Time {
	if t.Answered.After(t.Since) {
		return t.Answered
	}
	return t.Since
}

// TunnelState is the rule for one probed tunnel at now.
func TunnelState(t topology.TunnelProbe, now time.Time) string {
	switch {
	case !t.Answered.IsZero() && now.Sub(t.Answered) < ProbeDeadAfter:
		return TunnelAlive
	case now.Sub(lastAnswer(t)) >= ProbeDeadAfter:
		return TunnelDead
	}
	return TunnelNew
}

// holderAlive reports whether the Lease's holder renewed it recently enough,
// as this agent saw.
func holderAlive(l *topology.LeaseState, now time.Time) bool {
	return l.Holder != "" && now.Before(l.Fresh.Add(l.Duration))
}

// ForeignHolder reports whether holder, the holder of a location's Lease,
// is no valid holder: a name ("" is a free Lease) that is none of nodes,
// the location's Ready nodes (its segment) as this agent sees them. Such a
// holder is treated as none (docs/security.md#admission): the candidates
// take the Lease over, and Kilo's leader is not vetoed meanwhile.
func ForeignHolder(holder string, nodes []string) bool {
	return holder != "" && !slices.Contains(nodes, holder)
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

// Governance says whether the leader of a segment (its Ready nodes) is
// chosen with a Lease, and why (docs/failover.md#governed): only where
// every node runs meshlet (kg cannot follow a Lease) and no user set a
// leader annotation (a user's choice is Kilo's rule's input), in location
// granularity, with at least two nodes to choose from.
func Governance(nodes []topology.Node, set topology.Settings) (bool, string) {
	set = topology.Defaults(set)
	if set.Granularity != topology.GranularityLocation {
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

// Judgement is this node's judgement of its own probes.
type Judgement struct {
	// Tunnels: topology.TunnelsUp, TunnelsDown or "" (nothing judged).
	Tunnels string
	// WireGuardDegraded: every tunnel is dead while one of its peers
	// reaches others; since WireGuardOnset.
	WireGuardDegraded bool
	WireGuardOnset    time.Time
	// GatewayDown since GatewayOnset; GatewayRecovering: it answers
	// again, not long enough yet.
	GatewayDown       bool
	GatewayOnset      time.Time
	GatewayRecovering bool
}

// Judge applies the rule of docs/failover.md#health to what the probes
// observed (nil: not probed). tunnelsOf is what the node of a public key
// publishes of its own tunnels (meshlet.io/tunnels): a peer that still
// reaches others tells a cut-off node from a broken mesh.
func Judge(hp *topology.Health, now time.Time, tunnelsOf func(topology.Key) string) Judgement {
	var h Judgement
	if hp == nil {
		return h
	}
	alive, dead := 0, 0
	var last time.Time
	reachesOthers := false
	for _, t := range hp.Peers {
		switch TunnelState(t, now) {
		case TunnelAlive:
			alive++
		case TunnelDead:
			dead++
			if tunnelsOf(t.PublicKey) == topology.TunnelsUp {
				reachesOthers = true
			}
		}
		if ref := lastAnswer(t); ref.After(last) {
			last = ref
		}
	}
	switch {
	case alive > 0:
		h.Tunnels = topology.TunnelsUp
	case dead > 0 && dead == len(hp.Peers):
		h.Tunnels = topology.TunnelsDown
		h.WireGuardDegraded = reachesOthers
		h.WireGuardOnset = last.Add(ProbeDeadAfter)
	}
	g := hp.Gateway
	if g.Addr.IsValid() && !g.Answered.IsZero() {
		if now.Sub(g.Answered) >= GatewayDeadAfter {
			h.GatewayDown, h.GatewayOnset = true, g.Answered.Add(GatewayDeadAfter)
		} else if !g.Recovered.IsZero() && now.Sub(g.Recovered) < GatewayRecoverAfter {
			h.GatewayRecovering = true
		}
	}
	return h
}

// Input is what Decide reads: the Lease as this agent sees it, this node
// and its segment as Kilo's rule built them (agent/core/topology), its
// health.
type Input struct {
	Lease    *topology.LeaseState
	Now      time.Time
	Settings topology.Settings
	// Self is this node's name, SelfNode its overlaid node (nil: it is not
	// Ready in Kilo's sense) and Segment its segment; Endpoint what it
	// advertises.
	Self     string
	SelfNode *topology.Node
	Segment  *topology.Segment
	Endpoint string
	// Nodes are every node of the local cluster as published (those not
	// Ready yet delay a first election: StartupGrace).
	Nodes     []topology.Node
	Judgement Judgement
	// Leaving: why this node's agent stops for good ("" = it does not;
	// topology.Self.Leaving).
	Leaving string
}

// Decision is this node's part in its location's Lease (nil without Lease
// information: Kilo's rule alone) and whether it must not lead although
// Kilo's rule names it (Veto: another node holds the Lease, or it steps
// aside).
type Decision struct {
	Leadership *topology.Leadership
	Veto       bool
}

// Decide decides this node's part in its location's Lease. The steps
// run in order, each a method of decision reading what the ones before
// it settled: where the node is and which Lease is its location's
// (locate), whether Kilo's rule alone governs it (govern), its own
// health, the Lease's holder, the candidates in Kilo's order, stepping
// aside, and what it does with a Lease it holds.
func Decide(in Input) Decision {
	if in.Lease == nil {
		return Decision{}
	}
	d := &decision{in: in, set: topology.Defaults(in.Settings), lease: in.Lease, l: &topology.Leadership{Holder: in.Lease.Holder}}
	out := Decision{Leadership: d.l}
	if in.Segment == nil || in.SelfNode == nil {
		// Not in the mesh (not Ready in Kilo's sense): it may still hold
		// the Lease or a mark from before.
		d.l.Why = "this node is not Ready in Kilo's sense"
		if d.lease.Holder == in.Self {
			d.l.Release = ReasonNotGoverned
		}
		return out
	}
	d.locate()
	d.ownHealth()
	if !d.govern() {
		return out
	}
	d.ignoreForeignHolder()
	d.rank()
	d.stepAside()
	d.holderPart()
	if d.l.Candidate {
		d.l.Wait = candidateWait(in, d.lease, d.l.Candidates)
	}
	out.Veto = (d.otherHolds || d.giveUp) && d.kiloSelf
	return out
}

// decision is Decide's state between its steps.
type decision struct {
	in    Input
	set   topology.Settings // in.Settings with Kilo's defaults
	lease *topology.LeaseState
	l     *topology.Leadership
	// failing: degraded for StepAsideAfter; unfit: failing, cooling down
	// or leaving; fit: a candidate in its own right.
	failing, unfit, fit bool
	// others: the candidates that are not this node.
	others []*topology.Node
	// otherHolds: a live holder that is not this node; kiloSelf: Kilo's
	// rule names this node; giveUp: unfit while another can lead.
	otherHolds, kiloSelf, giveUp bool
}

// cooling: name stepped aside less than StepAsideCoolDown ago.
func (d *decision) cooling(name string) bool {
	sa, ok := d.lease.StepAsides[name]
	return ok && d.in.Now.Before(sa.At.Add(StepAsideCoolDown))
}

// locate names the node's location and its Lease ("" when the node is its
// own segment).
func (d *decision) locate() {
	l := d.l
	set := d.set
	l.Location = topology.NodeLocation(*d.in.SelfNode, set)
	l.Lease = LeaseName(l.Location)
	if d.in.Segment.Key != topology.LocationSegment(l.Location) {
		l.Lease = ""
	}
	if d.lease.Name != l.Lease {
		// The agent watches another Lease (this node's location just
		// changed): nothing is known of this one yet.
		d.lease = &topology.LeaseState{Name: l.Lease, Exists: true}
		l.Holder = ""
	}
}

// ownHealth marks the node degraded by its own judgement.
func (d *decision) ownHealth() {
	h := d.in.Judgement
	switch {
	case h.GatewayDown || h.GatewayRecovering:
		d.l.Degraded = ReasonGatewayUnreachable
	case h.WireGuardDegraded || d.cooling(d.in.Self):
		d.l.Degraded = ReasonWireGuardDegraded
	}
}

// govern reports whether the Lease governs the segment; when not, Kilo's
// rule alone decides: a held Lease is released, and meshlet's mark goes
// unless only this node is left (it leads anyway, and keeps leading when
// others come back).
func (d *decision) govern() bool {
	l, seg := d.l, d.in.Segment
	nodes := make([]topology.Node, len(seg.Nodes))
	for i, n := range seg.Nodes {
		nodes[i] = *n
	}
	l.Governed, l.Why = Governance(nodes, d.set)
	if l.Lease == "" && l.Governed {
		l.Governed, l.Why = false, "no private IP: the node is its own segment"
	}
	if l.Governed {
		return true
	}
	if d.lease.Holder == d.in.Self {
		l.Release = ReasonNotGoverned
	}
	if d.in.SelfNode.LeaderMark && len(seg.Nodes) > 1 {
		l.Unmark = []string{d.in.Self}
	}
	return false
}

// ignoreForeignHolder treats the Lease as free when its holder is no
// Ready node of this location (a node elsewhere took the Lease, or it
// moved away while holding it): the holder leads nothing here and is
// reported as ignored.
func (d *decision) ignoreForeignHolder() {
	seg := d.in.Segment
	names := make([]string, len(seg.Nodes))
	for i, n := range seg.Nodes {
		names[i] = n.Name
	}
	if ForeignHolder(d.lease.Holder, names) {
		free := *d.lease
		free.Holder = ""
		d.lease = &free
		d.l.Why += "; the Lease's holder " + d.l.Holder + " is not a Ready node of location " + d.l.Location + ": ignored (" + ReasonForeignLeaseHolder + ")"
	}
}

// rank lists the candidates in Kilo's order. A leader gives leadership up
// once degraded for StepAsideAfter; a node that did is no candidate while
// it cools down, nor one whose gateway is down or not answering long
// enough again. A node that is going away leads only when nobody else
// can; its holder hands the Lease over at once (docs/failover.md#restart).
func (d *decision) rank() {
	in, h, l, now := d.in, d.in.Judgement, d.l, d.in.Now
	alive := holderAlive(d.lease, now)
	d.failing = h.GatewayDown && !now.Before(h.GatewayOnset.Add(StepAsideAfter)) ||
		h.WireGuardDegraded && !now.Before(h.WireGuardOnset.Add(StepAsideAfter))
	leaving := in.Leaving != "" || in.SelfNode.Leaving != ""
	d.unfit = d.failing || d.cooling(in.Self) || leaving
	d.fit = !d.unfit && !h.GatewayDown && !h.GatewayRecovering
	for _, n := range topology.KiloOrder(in.Segment.Nodes) {
		switch {
		case n.Name == in.Self:
			if d.fit {
				l.Candidates = append(l.Candidates, n.Name)
			}
		case n.Degraded != "", n.Leaving != "", d.cooling(n.Name), n.Name == d.lease.Holder && !alive:
			// Degraded, going away, cooling down, or a holder that stopped
			// renewing (presumed dead): not a candidate.
		default:
			l.Candidates = append(l.Candidates, n.Name)
			d.others = append(d.others, n)
		}
	}
	// A node that is not fit still competes when nobody else can lead.
	l.Candidate = d.fit || len(d.others) == 0
	d.otherHolds = alive && d.lease.Holder != in.Self
	d.kiloSelf = in.Segment.LeaderNode().Name == in.Self
	d.giveUp = d.unfit && len(d.others) > 0
}

// stepAside records why a node that leads, or that Kilo's rule names,
// gives leadership up.
func (d *decision) stepAside() {
	if !d.giveUp || d.otherHolds || !(d.kiloSelf || d.lease.Holder == d.in.Self) {
		return
	}
	switch {
	case !d.failing && !d.cooling(d.in.Self):
		d.l.StepAside = ReasonLeaving
	case d.in.Judgement.GatewayDown:
		d.l.StepAside = ReasonGatewayUnreachable
	default:
		d.l.StepAside = ReasonWireGuardDegraded
	}
}

// holderPart decides what the holder does with its Lease: release it when
// giving up, or hold it, claim leadership and take the others' marks.
func (d *decision) holderPart() {
	l := d.l
	if d.lease.Holder != d.in.Self {
		return
	}
	if d.giveUp {
		l.Release = l.StepAside
		if l.Release == "" {
			l.Release = ReasonWireGuardDegraded
		}
		return
	}
	l.Hold, l.Claim = true, true
	for _, n := range d.in.Segment.Nodes {
		if n.LeaderMark && n.Name != d.in.Self {
			l.Unmark = append(l.Unmark, n.Name)
		}
	}
}

// candidateWait is how long a free Lease must have been free before this
// node takes it: RankStagger per candidate ahead of it in Kilo's order —
// not counting the holder, for a Lease is only taken once its holder gave
// it up or stopped renewing — and while no Lease exists, StartupGrace per
// node ahead of it that has not published its annotations yet (its agent
// is starting).
func candidateWait(in Input, lease *topology.LeaseState, candidates []string) time.Duration {
	rank := 0
	for _, c := range candidates {
		if c == in.Self {
			break
		}
		if c != lease.Holder {
			rank++
		}
	}
	wait := time.Duration(rank) * RankStagger
	if lease.Exists || topology.IsPublicEndpoint(in.Endpoint) {
		return wait
	}
	set := topology.Defaults(in.Settings)
	loc := topology.NodeLocation(*in.SelfNode, set)
	for i := range in.Nodes {
		n := in.Nodes[i]
		if n.Name < in.Self && n.LastSeen.IsZero() && topology.NodeLocation(n, set) == loc && !slices.Contains(candidates, n.Name) {
			wait += StartupGrace
		}
	}
	return wait
}

// Publish is what this node publishes of its health and lists for its
// probes to watch (Settings.HealthProbes): meshlet.io/tunnels (a leader's
// judgement of its tunnels), meshlet.io/degraded (its own fitness), and the
// probes: from its WireGuard IP through the tunnels to targets when it
// leads, to its underlay gateway when its location is governed.
func Publish(h Judgement, l *topology.Leadership, leader bool, wireGuardIP, gateway netip.Addr, targets []topology.ProbeTarget) (map[string]string, *topology.Probes) {
	ann := map[string]string{}
	tunnels := ""
	if leader {
		tunnels = h.Tunnels
	}
	ann[topology.AnnotationTunnels] = tunnels
	pr := &topology.Probes{}
	if leader {
		pr.Source = wireGuardIP
		pr.Peers = targets
	}
	if l != nil {
		ann[topology.AnnotationDegraded] = l.Degraded
		if l.Governed {
			pr.Gateway = gateway
		}
	}
	if pr.Source.IsValid() || pr.Gateway.IsValid() {
		return ann, pr
	}
	return ann, nil
}

// HealthChange is the earliest moment after now when Judge or Decide
// decide otherwise on hp by the passing of time alone, where no new
// observation says so (zero: none): a dead tunnel's or a down gateway's
// StepAsideAfter running out, a recovered gateway's GatewayRecoverAfter.
// A tunnel going dead or the gateway going down or answering again is an
// observation: the probes see it on their round and wake the loop
// (agent/runtime/health). The loop plans at these moments
// (planner.NextChange) instead of the probes waking it on every round
// while something is dead — on a leader with many dead tunnels, a run
// after every run.
func HealthChange(hp *topology.Health, now time.Time) time.Time {
	var next time.Time
	if hp == nil {
		return next
	}
	later := func(t time.Time) {
		if t.After(now) {
			next = topology.Earliest(next, t)
		}
	}
	for _, t := range hp.Peers {
		if dead := lastAnswer(t).Add(ProbeDeadAfter); !now.Before(dead) {
			later(dead.Add(StepAsideAfter))
		}
	}
	if g := hp.Gateway; g.Addr.IsValid() && !g.Answered.IsZero() {
		if down := g.Answered.Add(GatewayDeadAfter); !now.Before(down) {
			later(down.Add(StepAsideAfter))
		}
		if !g.Recovered.IsZero() {
			later(g.Recovered.Add(GatewayRecoverAfter))
		}
	}
	return next
}

// CoolDownEnd is the earliest time after now at which a node of the Lease's
// step-asides stops cooling down (and may lead again); zero when none does.
// Nothing in the API changes at that moment, so the loop plans then.
func CoolDownEnd(l *topology.LeaseState, now time.Time) time.Time {
	var next time.Time
	if l == nil {
		return next
	}
	for _, sa := range l.StepAsides {
		if t := sa.At.Add(StepAsideCoolDown); t.After(now) {
			next = topology.Earliest(next, t)
		}
	}
	return next
}
