package failover

import (
	"net/netip"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/topology"
)

func TestLeaseName(t *testing.T) {
	for loc, want := range map[string]string{
		"x":                "meshlet-leader-x",
		"eu-west-1":        "meshlet-leader-eu-west-1",
		"Frankfurt Rack/2": "meshlet-leader-frankfurt-rack-2-" + LeaseName("Frankfurt Rack/2")[len(LeaseName("Frankfurt Rack/2"))-12:],
	} {
		if got := LeaseName(loc); got != want {
			t.Errorf("LeaseName(%q) = %q, want %q", loc, got, want)
		}
	}
	if LeaseName("a.b") == LeaseName("a-b") {
		t.Error("two locations share a Lease")
	}
}

// TestTunnelState: alive when it answered within ProbeDeadAfter, dead when
// nothing came for that long since its last answer or since probing began,
// new in between.
func TestTunnelState(t *testing.T) {
	probe := func(since, answered time.Duration) topology.TunnelProbe {
		p := topology.TunnelProbe{Since: now.Add(-since)}
		if answered >= 0 {
			p.Answered = now.Add(-answered)
		}
		return p
	}
	const never = -1
	for _, tc := range []struct {
		name  string
		probe topology.TunnelProbe
		want  string
	}{
		{"answered a second ago", probe(time.Minute, time.Second), TunnelAlive},
		{"answered just inside the window", probe(time.Minute, ProbeDeadAfter-time.Millisecond), TunnelAlive},
		{"nothing for the window", probe(time.Minute, ProbeDeadAfter), TunnelDead},
		{"never answered, probed for less than the window", probe(time.Second, never), TunnelNew},
		{"never answered, probed for the window", probe(ProbeDeadAfter, never), TunnelDead},
		{"answered long ago, probing began again a second ago", probe(time.Second, time.Hour), TunnelNew},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := TunnelState(tc.probe, now); got != tc.want {
				t.Errorf("state %s, want %s", got, tc.want)
			}
		})
	}
}

// TestJudge is docs/failover.md#health: tunnels up when one answers, down
// when every one is dead — WireGuard-degraded only while a dead tunnel's
// peer says it reaches others, since the last answer + ProbeDeadAfter; the
// gateway down once it answered and then nothing for GatewayDeadAfter,
// recovering for GatewayRecoverAfter after it answers again.
func TestJudge(t *testing.T) {
	tunnel := func(k int, since, answered time.Duration) topology.TunnelProbe {
		return topology.TunnelProbe{PublicKey: key(k), Since: now.Add(-since), Answered: now.Add(-answered)}
	}
	fresh := topology.TunnelProbe{PublicKey: key(3), Since: now.Add(-time.Second)}
	gw := func(answered, recovered time.Duration) *topology.Health {
		g := topology.GatewayProbe{Addr: netip.MustParseAddr("10.0.1.254"), Since: now.Add(-time.Hour), Answered: now.Add(-answered)}
		if recovered > 0 {
			g.Recovered = now.Add(-recovered)
		}
		return &topology.Health{Gateway: g}
	}
	// key(1)'s node reaches others; key(2)'s publishes its tunnels are down.
	tunnelsOf := func(k topology.Key) string {
		return map[topology.Key]string{key(1): topology.TunnelsUp, key(2): topology.TunnelsDown}[k]
	}
	for _, tc := range []struct {
		name string
		h    *topology.Health
		want Judgement
	}{
		{name: "not probed", want: Judgement{}},
		{name: "a tunnel answers: up", h: &topology.Health{Peers: []topology.TunnelProbe{tunnel(1, time.Minute, time.Second)}},
			want: Judgement{Tunnels: topology.TunnelsUp}},
		{name: "one answers among dead ones: up", h: &topology.Health{Peers: []topology.TunnelProbe{tunnel(1, time.Minute, time.Minute), tunnel(2, time.Minute, time.Second)}},
			want: Judgement{Tunnels: topology.TunnelsUp}},
		{name: "every tunnel dead, no peer reaching others: down, a broken mesh is not this node's fault",
			h:    &topology.Health{Peers: []topology.TunnelProbe{tunnel(2, time.Minute, 10*time.Second), tunnel(9, time.Minute, 20*time.Second)}},
			want: Judgement{Tunnels: topology.TunnelsDown, WireGuardOnset: now.Add(-10*time.Second + ProbeDeadAfter)}},
		{name: "every tunnel dead while a peer reaches others: WireGuard-degraded since the last answer + ProbeDeadAfter",
			h:    &topology.Health{Peers: []topology.TunnelProbe{tunnel(1, time.Minute, 20*time.Second), tunnel(2, time.Minute, 5*time.Second)}},
			want: Judgement{Tunnels: topology.TunnelsDown, WireGuardDegraded: true, WireGuardOnset: now.Add(-5*time.Second + ProbeDeadAfter)}},
		{name: "dead and new ones: nothing judged yet", h: &topology.Health{Peers: []topology.TunnelProbe{tunnel(1, time.Minute, time.Minute), fresh}},
			want: Judgement{}},
		{name: "the gateway answers", h: gw(time.Second, 0), want: Judgement{}},
		{name: "the gateway silent for GatewayDeadAfter: down since", h: gw(GatewayDeadAfter+time.Second, 0),
			want: Judgement{GatewayDown: true, GatewayOnset: now.Add(-time.Second)}},
		{name: "the gateway answering again, not for GatewayRecoverAfter yet: recovering", h: gw(time.Second, GatewayRecoverAfter-time.Second),
			want: Judgement{GatewayRecovering: true}},
		{name: "the gateway answering again for GatewayRecoverAfter: fine", h: gw(time.Second, GatewayRecoverAfter), want: Judgement{}},
		{name: "a gateway that never answered is not judged",
			h: &topology.Health{Gateway: topology.GatewayProbe{Addr: netip.MustParseAddr("10.0.1.254"), Since: now.Add(-time.Hour)}}, want: Judgement{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "judgement", Judge(tc.h, now, tunnelsOf), tc.want)
		})
	}
}

// TestGovernance is docs/failover.md#governed: a Lease chooses the leader
// only in location granularity, where every node runs meshlet, no user set
// a leader annotation, and there are two nodes at least.
func TestGovernance(t *testing.T) {
	three := []topology.Node{xnode(1), xnode(2), xnode(3)}
	for _, tc := range []struct {
		name     string
		nodes    []topology.Node
		set      topology.Settings
		governed bool
		why      string
	}{
		{"every node runs meshlet", three, topology.Settings{}, true, "every node runs meshlet: the holder of the Lease leads"},
		{"meshlet's own mark is not a user's", []topology.Node{xnode(1, marked), xnode(2)}, topology.Settings{}, true, "every node runs meshlet: the holder of the Lease leads"},
		{"full granularity", three, topology.Settings{Granularity: topology.GranularityFull}, false, "mesh granularity full: every node is its own segment (Kilo's rule)"},
		{"cross granularity", three, topology.Settings{Granularity: topology.GranularityCross}, false, "mesh granularity cross: every node is its own segment (Kilo's rule)"},
		{"kg nodes", []topology.Node{xnode(1, kg), xnode(2), xnode(3, kg)}, topology.Settings{}, false,
			"kg runs on x-1, x-3 and cannot follow a Lease: Kilo's rule (failover when last-seen ages out, 60 s)"},
		{"a leader annotation set by hand", []topology.Node{xnode(1), xnode(2, byHand)}, topology.Settings{}, false, "leader annotation set by hand on x-2: Kilo's rule"},
		{"kg is said before a hand-set annotation", []topology.Node{xnode(1, byHand), xnode(2, kg)}, topology.Settings{}, false,
			"kg runs on x-2 and cannot follow a Lease: Kilo's rule (failover when last-seen ages out, 60 s)"},
		{"one node", []topology.Node{xnode(1)}, topology.Settings{}, false, "one node: nothing to fail over to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			governed, why := Governance(tc.nodes, tc.set)
			if governed != tc.governed || why != tc.why {
				t.Errorf("governed %v (%s), want %v (%s)", governed, why, tc.governed, tc.why)
			}
		})
	}
}

// TestDecide is this node's part in its location's Lease: candidates in
// Kilo's order (neither degraded, cooling down nor a holder that stopped
// renewing), the rank stagger and startup grace, holding and claiming,
// stepping aside after StepAsideAfter degraded and cooling down
// StepAsideCoolDown after, releasing where no Lease governs, and the veto
// on Kilo's leader while another node holds the Lease or it steps aside.
func TestDecide(t *testing.T) {
	const governedWhy = "every node runs meshlet: the holder of the Lease leads"
	// A governed location x, changed by f.
	gov := func(f func(l *topology.Leadership)) *topology.Leadership {
		l := &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Governed: true, Why: governedWhy}
		f(l)
		return l
	}
	three := func(fs ...func(ns []topology.Node)) []topology.Node {
		ns := []topology.Node{xnode(1), xnode(2), xnode(3)}
		for _, f := range fs {
			f(ns)
		}
		return ns
	}
	on := func(i int, f func(*topology.Node)) func([]topology.Node) {
		return func(ns []topology.Node) { f(&ns[i-1]) }
	}
	all := []string{"x-1", "x-2", "x-3"}
	for _, tc := range []struct {
		name string
		in   Input
		want Decision
		bug  string // a known bug: the case shows the right decision and is skipped
	}{
		{name: "no Lease information: Kilo's rule alone", in: input("x-1", three(), nil, Judgement{})},
		{name: "not Ready: it releases a Lease it holds",
			in:   input("x-9", three(), held("x-9", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Holder: "x-9", Why: "this node is not Ready in Kilo's sense", Release: ReasonNotGoverned}}},
		{name: "not governed (a kg node): the holder releases, its mark goes",
			in: input("x-1", three(on(1, marked), on(3, kg)), held("x-1", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Holder: "x-1", Release: ReasonNotGoverned, Unmark: []string{"x-1"},
				Why: "kg runs on x-3 and cannot follow a Lease: Kilo's rule (failover when last-seen ages out, 60 s)"}}},
		{name: "not governed (a hand-set leader annotation): nothing to do, no veto",
			in:   input("x-1", three(on(2, byHand)), held("", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Why: "leader annotation set by hand on x-2: Kilo's rule"}}},
		{name: "not governed, alone: the holder releases, its mark stays (it leads anyway)",
			in: input("x-1", []topology.Node{xnode(1, marked)}, held("x-1", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Holder: "x-1", Release: ReasonNotGoverned,
				Why: "one node: nothing to fail over to"}}},
		{name: "a node without private IP is its own segment: no Lease",
			in: func() Input {
				in := input("x-1", []topology.Node{xnode(1)}, held("", 0), Judgement{})
				in.Segment.Key = "node:x-1"
				return in
			}(),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Why: "one node: nothing to fail over to"}}},
		{name: "no Lease yet: the first in Kilo's order takes it at once",
			in:   input("x-1", three(), &topology.LeaseState{Name: "meshlet-leader-x"}, Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) { l.Candidates, l.Candidate = all, true })}},
		{name: "no Lease yet: a stagger per candidate ahead, a grace per node ahead whose agent has not published yet",
			in: input("x-3", three(on(1, unseen)), &topology.LeaseState{Name: "meshlet-leader-x"}, Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Candidates, l.Candidate, l.Wait = []string{"x-2", "x-3"}, true, RankStagger+StartupGrace
			})}},
		{name: "no Lease yet, a public endpoint: no grace (Kilo's rule names it whatever the others publish)",
			in:   input("x-3", three(on(1, unseen), on(3, public)), &topology.LeaseState{Name: "meshlet-leader-x"}, Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) { l.Candidates, l.Candidate = []string{"x-3", "x-2"}, true })}},
		{name: "a Lease exists: no grace",
			in: input("x-3", three(on(1, unseen)), held("", 0), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Candidates, l.Candidate, l.Wait = []string{"x-2", "x-3"}, true, RankStagger
			})}},
		{name: "another node holds: Kilo's leader is vetoed, first to take over (the holder is not counted ahead)",
			in:   input("x-1", three(), held("x-2", time.Second), Judgement{}),
			want: Decision{Veto: true, Leadership: gov(func(l *topology.Leadership) { l.Holder, l.Candidates, l.Candidate = "x-2", all, true })}},
		{name: "another node holds: the third waits one stagger",
			in: input("x-3", three(on(1, marked)), held("x-1", time.Second), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Candidate, l.Wait = "x-1", all, true, RankStagger
			})}},
		{name: "the holder stopped renewing: no candidate",
			in: input("x-2", three(on(1, marked)), held("x-1", 4*time.Second), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Candidate = "x-1", []string{"x-2", "x-3"}, true
			})}},
		{name: "this node holds: it renews, claims the mark and unmarks the others",
			in: input("x-2", three(on(1, marked)), held("x-2", 0), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Candidate, l.Wait, l.Hold, l.Claim, l.Unmark = "x-2", all, true, RankStagger, true, true, []string{"x-1"}
			})}},
		{name: "this node holds and cannot reach the API: it keeps holding",
			in: input("x-1", three(on(1, marked)), held("x-1", time.Minute), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Candidate, l.Hold, l.Claim = "x-1", all, true, true, true
			})}},
		{name: "degraded and cooling nodes are no candidates",
			in: input("x-1", three(on(1, marked), on(2, gatewayBad)), steppedAside(held("x-1", 0), "x-3", time.Minute), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Candidate, l.Hold, l.Claim = "x-1", []string{"x-1"}, true, true, true
			})}},
		{name: "the gateway down, not for StepAsideAfter yet: degraded, no candidate, still holding",
			in: input("x-1", three(on(1, marked)), held("x-1", 0), Judgement{GatewayDown: true, GatewayOnset: now.Add(-StepAsideAfter + time.Millisecond)}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Hold, l.Claim, l.Degraded = "x-1", []string{"x-2", "x-3"}, true, true, ReasonGatewayUnreachable
			})}},
		{name: "the gateway down for StepAsideAfter: the leader steps aside, releases and is vetoed",
			in: input("x-1", three(on(1, marked)), held("x-1", 0), Judgement{GatewayDown: true, GatewayOnset: now.Add(-StepAsideAfter)}),
			want: Decision{Veto: true, Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Release, l.StepAside, l.Degraded = "x-1", []string{"x-2", "x-3"}, ReasonGatewayUnreachable, ReasonGatewayUnreachable, ReasonGatewayUnreachable
			})}},
		{name: "WireGuard-degraded, not for StepAsideAfter yet: it says so and keeps leading",
			in: input("x-1", three(on(1, marked)), held("x-1", 0), Judgement{WireGuardDegraded: true, WireGuardOnset: now.Add(-time.Second)}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Candidate, l.Hold, l.Claim, l.Degraded = "x-1", all, true, true, true, ReasonWireGuardDegraded
			})}},
		{name: "WireGuard-degraded for StepAsideAfter: it steps aside",
			in: input("x-1", three(on(1, marked)), held("x-1", 0), Judgement{WireGuardDegraded: true, WireGuardOnset: now.Add(-StepAsideAfter)}),
			want: Decision{Veto: true, Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Release, l.StepAside, l.Degraded = "x-1", []string{"x-2", "x-3"}, ReasonWireGuardDegraded, ReasonWireGuardDegraded, ReasonWireGuardDegraded
			})}},
		{name: "degraded with nobody else fit: it keeps leading",
			in: input("x-1", three(on(1, marked), on(2, gatewayBad), on(3, gatewayBad)), held("x-1", 0), Judgement{WireGuardDegraded: true, WireGuardOnset: now.Add(-time.Minute)}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidate, l.Hold, l.Claim, l.Degraded = "x-1", true, true, true, ReasonWireGuardDegraded
			})}},
		{name: "degraded while another node holds: no step-aside to record, vetoed",
			in: input("x-1", three(on(1, marked)), held("x-2", 0), Judgement{GatewayDown: true, GatewayOnset: now.Add(-time.Minute)}),
			want: Decision{Veto: true, Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Degraded = "x-2", []string{"x-2", "x-3"}, ReasonGatewayUnreachable
			})}},
		{name: "the gateway answering again, not long enough: no candidate",
			in: input("x-2", three(on(1, marked)), held("x-1", 0), Judgement{GatewayRecovering: true}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Degraded = "x-1", []string{"x-1", "x-3"}, ReasonGatewayUnreachable
			})}},
		{name: "cooling down after its step-aside: no candidate; Kilo's leader by its stale mark steps aside and is vetoed",
			in: input("x-1", three(on(1, marked)), steppedAside(held("", 0), "x-1", StepAsideCoolDown-time.Second), Judgement{}),
			want: Decision{Veto: true, Leadership: gov(func(l *topology.Leadership) {
				l.Candidates, l.StepAside, l.Degraded = []string{"x-2", "x-3"}, ReasonWireGuardDegraded, ReasonWireGuardDegraded
			})}},
		{name: "the cool-down over: a candidate again, no preemption of the holder",
			in: input("x-1", three(on(2, marked)), steppedAside(held("x-2", 0), "x-1", StepAsideCoolDown), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Candidate = "x-2", []string{"x-2", "x-1", "x-3"}, true
			})}},
		{name: "the holder's node cordoned: it steps aside, releases at once and is vetoed; no degradation, no cool-down",
			in: input("x-1", three(on(1, marked), on(1, cordoned)), held("x-1", 0), Judgement{}),
			want: Decision{Veto: true, Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Release, l.StepAside = "x-1", []string{"x-2", "x-3"}, ReasonLeaving, ReasonLeaving
			})}},
		{name: "the holder's agent stops for good (its DaemonSet is gone): it releases at once",
			in: func() Input {
				in := input("x-1", three(on(1, marked)), held("x-1", 0), Judgement{})
				in.Leaving = "its DaemonSet is gone"
				return in
			}(),
			want: Decision{Veto: true, Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidates, l.Release, l.StepAside = "x-1", []string{"x-2", "x-3"}, ReasonLeaving, ReasonLeaving
			})}},
		{name: "a cordoned node is no candidate; the next takes a released Lease at once",
			in: input("x-3", three(on(1, cordoned)), held("", 0), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Candidates, l.Candidate, l.Wait = []string{"x-2", "x-3"}, true, RankStagger
			})}},
		{name: "every node cordoned: the holder keeps leading (nobody else can)",
			in: input("x-1", three(on(1, marked), on(1, cordoned), on(2, cordoned), on(3, cordoned)), held("x-1", 0), Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Holder, l.Candidate, l.Hold, l.Claim = "x-1", true, true, true
			})}},
		{name: "the agent still watches another Lease (the location changed): nothing is known of this one, taken to exist",
			in: input("x-3", three(on(1, unseen)), &topology.LeaseState{Name: "meshlet-leader-old"}, Judgement{}),
			want: Decision{Leadership: gov(func(l *topology.Leadership) {
				l.Candidates, l.Candidate, l.Wait = []string{"x-2", "x-3"}, true, RankStagger
			})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.bug != "" {
				t.Skip("BUG: " + tc.bug)
			}
			check(t, "decision", Decide(tc.in), tc.want)
		})
	}
}

// TestPublish: meshlet.io/tunnels (a leader's judgement), meshlet.io/degraded
// (with Lease information), and the probes: a leader's tunnels from its
// WireGuard IP, the underlay gateway where a Lease governs.
func TestPublish(t *testing.T) {
	wgIP, gateway := netip.MustParseAddr("10.4.0.1"), netip.MustParseAddr("10.0.1.254")
	targets := []topology.ProbeTarget{{Name: "y-1", PublicKey: key(9), Addr: netip.MustParseAddr("10.4.0.2")}}
	up := Judgement{Tunnels: topology.TunnelsUp}
	governed := &topology.Leadership{Governed: true, Degraded: ReasonGatewayUnreachable}
	for _, tc := range []struct {
		name       string
		h          Judgement
		l          *topology.Leadership
		leader     bool
		wantAnn    map[string]string
		wantProbes *topology.Probes
	}{
		{name: "a leader of a governed location: its tunnels, its fitness, the tunnels and the gateway to probe", h: up, l: governed, leader: true,
			wantAnn:    map[string]string{topology.AnnotationTunnels: topology.TunnelsUp, topology.AnnotationDegraded: ReasonGatewayUnreachable},
			wantProbes: &topology.Probes{Source: wgIP, Peers: targets, Gateway: gateway}},
		{name: "a non-leader of a governed location: no tunnels, the gateway only", h: up, l: governed,
			wantAnn:    map[string]string{topology.AnnotationTunnels: "", topology.AnnotationDegraded: ReasonGatewayUnreachable},
			wantProbes: &topology.Probes{Gateway: gateway}},
		{name: "a leader where Kilo's rule governs: its tunnels, no gateway", h: up, l: &topology.Leadership{}, leader: true,
			wantAnn:    map[string]string{topology.AnnotationTunnels: topology.TunnelsUp, topology.AnnotationDegraded: ""},
			wantProbes: &topology.Probes{Source: wgIP, Peers: targets}},
		{name: "a non-leader where Kilo's rule governs: nothing to probe", h: up, l: &topology.Leadership{},
			wantAnn: map[string]string{topology.AnnotationTunnels: "", topology.AnnotationDegraded: ""}},
		{name: "no Lease information: no degraded annotation", h: up, leader: true,
			wantAnn:    map[string]string{topology.AnnotationTunnels: topology.TunnelsUp},
			wantProbes: &topology.Probes{Source: wgIP, Peers: targets}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann, probes := Publish(tc.h, tc.l, tc.leader, wgIP, gateway, targets)
			check(t, "annotations", ann, tc.wantAnn)
			check(t, "probes", probes, tc.wantProbes)
		})
	}
}

// TestDecideForeignHolder: a Lease held by a name that is none of the
// location's Ready nodes — a node of another location (which the API
// server's admission policy lets take it: manifests/components/admission),
// a name of no node, a node of the location not Ready — is no valid
// holder: the Lease is free for the candidates (in Kilo's order, as after
// a release), Kilo's leader is not vetoed, and the plan says why. A Ready
// node of the location holding it, or a location under Kilo's rule, is as
// before.
func TestDecideForeignHolder(t *testing.T) {
	const governedWhy = "every node runs meshlet: the holder of the Lease leads"
	ignored := func(holder string) string {
		return governedWhy + "; the Lease's holder " + holder + " is not a Ready node of location x: ignored (ForeignLeaseHolder)"
	}
	all := []string{"x-1", "x-2", "x-3"}
	three := []topology.Node{xnode(1), xnode(2), xnode(3)}
	elsewhere := func(n *topology.Node) { n.LocationAnnotation = "y" }
	for _, tc := range []struct {
		name string
		in   Input
		want Decision
	}{
		{name: "a node of another location holds, renewing: Kilo's leader leads, first to take the Lease",
			in: func() Input {
				in := input("x-1", three, held("x-9", 0), Judgement{})
				in.Nodes = append(in.Nodes, xnode(9, elsewhere)) // published, in location y's segment
				return in
			}(),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Governed: true, Why: ignored("x-9"),
				Holder: "x-9", Candidates: all, Candidate: true}}},
		{name: "a name of no node holds: the second candidate waits one stagger",
			in: input("x-2", three, held("evil", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Governed: true, Why: ignored("evil"),
				Holder: "evil", Candidates: all, Candidate: true, Wait: RankStagger}}},
		{name: "a node of the location that is not Ready holds: ignored alike",
			in: input("x-1", []topology.Node{xnode(1), xnode(2), xnode(3), xnode(4, unseen)}, held("x-4", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Governed: true, Why: ignored("x-4"),
				Holder: "x-4", Candidates: all, Candidate: true}}},
		{name: "a foreign holder and a degraded Kilo's leader: it steps aside, as with a free Lease",
			in: input("x-1", three, held("evil", 0), Judgement{GatewayDown: true, GatewayOnset: now.Add(-StepAsideAfter)}),
			want: Decision{Veto: true, Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Governed: true, Why: ignored("evil"),
				Holder: "evil", Candidates: []string{"x-2", "x-3"}, StepAside: ReasonGatewayUnreachable, Degraded: ReasonGatewayUnreachable}}},
		{name: "the control: a Ready node of the location holds, and Kilo's leader is vetoed",
			in: input("x-1", three, held("x-2", 0), Judgement{}),
			want: Decision{Veto: true, Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Governed: true, Why: governedWhy,
				Holder: "x-2", Candidates: all, Candidate: true}}},
		{name: "the control: this node holds",
			in: input("x-1", three, held("x-1", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Governed: true, Why: governedWhy,
				Holder: "x-1", Candidates: all, Candidate: true, Hold: true, Claim: true}}},
		{name: "under Kilo's rule the holder does not matter: nothing said",
			in: input("x-1", []topology.Node{xnode(1), xnode(2, kg)}, held("evil", 0), Judgement{}),
			want: Decision{Leadership: &topology.Leadership{Location: "x", Lease: "meshlet-leader-x", Holder: "evil",
				Why: "kg runs on x-2 and cannot follow a Lease: Kilo's rule (failover when last-seen ages out, 60 s)"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, "decision", Decide(tc.in), tc.want)
		})
	}
}

// TestForeignHolder: a free Lease and a holder among the location's nodes
// are valid; any other name is not.
func TestForeignHolder(t *testing.T) {
	nodes := []string{"x-1", "x-2"}
	for holder, want := range map[string]bool{"": false, "x-1": false, "x-2": false, "y-1": true, "x-1 ": true} {
		if got := ForeignHolder(holder, nodes); got != want {
			t.Errorf("ForeignHolder(%q) = %v, want %v", holder, got, want)
		}
	}
}
