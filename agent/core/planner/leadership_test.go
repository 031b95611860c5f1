package planner

import (
	"reflect"
	"testing"
	"time"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// failoverSite: location x with three meshlet nodes (x-1, x-2, x-3),
// location y with one (y-1, the other segment's leader).
func failoverSite() []topology.Node {
	var ns []topology.Node
	for i, name := range []string{"x-1", "x-2", "x-3"} {
		n := node(i+1, name, "x", "10.0.1."+string(rune('1'+i))+"/24", "10.0.1."+string(rune('1'+i))+":51820", "10.244."+string(rune('1'+i))+".0/24")
		n.MeshletVersion = "v1"
		ns = append(ns, n)
	}
	y := node(9, "y-1", "y", "10.0.2.1/24", "10.0.2.1:51820", "10.244.9.0/24")
	y.MeshletVersion = "v1"
	y.WireGuardIP = pfx("10.4.0.2/16")
	return append(ns, y)
}

func mark(ns []topology.Node, name string) {
	for i := range ns {
		if ns[i].Name == name {
			ns[i].Leader, ns[i].LeaderMark = true, true
		}
	}
}

func withNode(ns []topology.Node, name string, f func(*topology.Node)) []topology.Node {
	for i := range ns {
		if ns[i].Name == name {
			f(&ns[i])
		}
	}
	return ns
}

// planAt is the plan of node self (a meshlet node) of nodes, with the
// Lease as read and its probes' health.
func planAt(nodes []topology.Node, self string, lease *topology.LeaseState, health *topology.Health) topology.Plan {
	var n topology.Node
	for _, m := range nodes {
		if m.Name == self {
			n = m
		}
	}
	s := selfOf(n, "eth0")
	s.Version = "v1"
	s.Health = health
	return Compute(topology.Snapshot{Now: now, Nodes: nodes, Lease: lease}, s)
}

// held is a Lease held by holder, renewed age ago.
func held(holder string, age time.Duration) *topology.LeaseState {
	return &topology.LeaseState{Name: "meshlet-leader-x", Exists: true, Holder: holder, Duration: 3 * time.Second, Fresh: now.Add(-age)}
}

// deadTunnels: this node probed y-1 for a minute, and it last answered
// ago.
func deadTunnels(ago time.Duration) *topology.Health {
	return &topology.Health{Peers: []topology.TunnelProbe{{PublicKey: key(9), Since: now.Add(-time.Minute), Answered: now.Add(-ago)}}}
}

func TestLeadership(t *testing.T) {
	type want struct {
		leader                   bool
		leaderOfX                string
		governed, candidate      bool
		wait                     time.Duration
		hold, claim              bool
		release, stepAside, degr string
		unmark                   []string
		candidates               []string
	}
	cases := []struct {
		name   string
		self   string
		nodes  func() []topology.Node
		lease  *topology.LeaseState
		health *topology.Health
		want   want
	}{
		{
			name: "no Lease yet: Kilo's rule leads, the first in Kilo's order takes the Lease at once",
			self: "x-1", nodes: failoverSite, lease: &topology.LeaseState{Name: "meshlet-leader-x"},
			want: want{leader: true, leaderOfX: "x-1", governed: true, candidate: true, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "no Lease yet: the second waits a stagger, and a grace for a node ahead whose agent is starting",
			self: "x-3", nodes: func() []topology.Node {
				return withNode(failoverSite(), "x-1", func(n *topology.Node) { n.LastSeen = time.Time{} })
			}, lease: &topology.LeaseState{Name: "meshlet-leader-x"},
			want: want{leaderOfX: "x-2", governed: true, candidate: true, wait: failover.RankStagger + failover.StartupGrace, candidates: []string{"x-2", "x-3"}},
		},
		{
			name: "x-1 holds: x-2 follows it, first to take over (the holder is not ahead of it: a Lease is taken only from a gone holder)",
			self: "x-2", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-1", time.Second),
			want: want{leaderOfX: "x-1", governed: true, candidate: true, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "x-1 holds: x-3 second",
			self: "x-3", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-1", time.Second),
			want: want{leaderOfX: "x-1", governed: true, candidate: true, wait: failover.RankStagger, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "x-1 stopped renewing: it is no candidate, x-2 is first (its mark still makes it Kilo's leader)",
			self: "x-2", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-1", 4*time.Second),
			want: want{leaderOfX: "x-1", governed: true, candidate: true, candidates: []string{"x-2", "x-3"}},
		},
		{
			name: "x-2 took the Lease: it marks itself and unmarks x-1; it leads once the marks are seen",
			self: "x-2", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-2", 0),
			want: want{leaderOfX: "x-1", governed: true, candidate: true, wait: failover.RankStagger, hold: true, claim: true, unmark: []string{"x-1"}, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "x-2 holds and is marked: it leads",
			self: "x-2", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-2"); return ns }, lease: held("x-2", 0),
			want: want{leader: true, leaderOfX: "x-2", governed: true, candidate: true, hold: true, claim: true, candidates: []string{"x-2", "x-1", "x-3"}},
		},
		{
			name: "x-1 still marked but x-2 holds: x-1 does not lead (veto) and routes through x-2",
			self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-2", 0),
			want: want{leaderOfX: "x-2", governed: true, candidate: true, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "x-1 holds and cannot reach the API: nobody else holds, it keeps leading",
			self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-1", time.Minute),
			want: want{leader: true, leaderOfX: "x-1", governed: true, candidate: true, hold: true, claim: true, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "a kg node in the location: Kilo's rule, the holder releases and drops its mark",
			self: "x-1", nodes: func() []topology.Node {
				ns := failoverSite()
				mark(ns, "x-1")
				return withNode(ns, "x-3", func(n *topology.Node) { n.MeshletVersion = "" })
			}, lease: held("x-1", 0),
			want: want{leader: true, leaderOfX: "x-1", release: failover.ReasonNotGoverned, unmark: []string{"x-1"}},
		},
		{
			name: "a user's leader annotation: Kilo's rule elects that node",
			self: "x-1", nodes: func() []topology.Node {
				return withNode(failoverSite(), "x-3", func(n *topology.Node) { n.Leader = true })
			}, lease: &topology.LeaseState{Name: "meshlet-leader-x"},
			want: want{leaderOfX: "x-3"},
		},
		{
			name: "tunnels dead while y-1 reaches others, for long enough: the leader steps aside",
			self: "x-1", nodes: func() []topology.Node {
				ns := failoverSite()
				mark(ns, "x-1")
				return withNode(ns, "y-1", func(n *topology.Node) { n.Tunnels = topology.TunnelsUp })
			}, lease: held("x-1", 0), health: deadTunnels(failover.ProbeDeadAfter + failover.StepAsideAfter),
			want: want{leaderOfX: "x-2", governed: true, release: failover.ReasonWireGuardDegraded, stepAside: failover.ReasonWireGuardDegraded,
				degr: failover.ReasonWireGuardDegraded, candidates: []string{"x-2", "x-3"}},
		},
		{
			name: "tunnels dead, not long enough yet: it keeps leading and says it is degraded",
			self: "x-1", nodes: func() []topology.Node {
				ns := failoverSite()
				mark(ns, "x-1")
				return withNode(ns, "y-1", func(n *topology.Node) { n.Tunnels = topology.TunnelsUp })
			}, lease: held("x-1", 0), health: deadTunnels(failover.ProbeDeadAfter + failover.StepAsideAfter/2),
			want: want{leader: true, leaderOfX: "x-1", governed: true, candidate: true, hold: true, claim: true,
				degr: failover.ReasonWireGuardDegraded, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "tunnels dead but no peer shows it reaches others: no judgement, it keeps leading",
			self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns },
			lease: held("x-1", 0), health: deadTunnels(time.Minute),
			want: want{leader: true, leaderOfX: "x-1", governed: true, candidate: true, hold: true, claim: true, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "degraded with nobody fit to take over: it keeps leading",
			self: "x-1", nodes: func() []topology.Node {
				ns := failoverSite()
				mark(ns, "x-1")
				ns = withNode(ns, "x-2", func(n *topology.Node) { n.Degraded = failover.ReasonGatewayUnreachable })
				ns = withNode(ns, "x-3", func(n *topology.Node) { n.Degraded = failover.ReasonGatewayUnreachable })
				return withNode(ns, "y-1", func(n *topology.Node) { n.Tunnels = topology.TunnelsUp })
			}, lease: held("x-1", 0), health: deadTunnels(time.Minute),
			want: want{leader: true, leaderOfX: "x-1", governed: true, candidate: true, hold: true, claim: true, degr: failover.ReasonWireGuardDegraded},
		},
		{
			name: "cooling down after a step-aside: no candidate, does not lead on its stale mark",
			self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns },
			lease: func() *topology.LeaseState {
				l := held("", 0)
				l.StepAsides = map[string]topology.StepAside{"x-1": {Reason: failover.ReasonWireGuardDegraded, At: now.Add(-time.Minute)}}
				return l
			}(),
			want: want{leaderOfX: "x-2", governed: true, stepAside: failover.ReasonWireGuardDegraded, degr: failover.ReasonWireGuardDegraded, candidates: []string{"x-2", "x-3"}},
		},
		{
			name: "cool-down over: a candidate again (the holder keeps leading: no preemption)",
			self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-2"); return ns },
			lease: func() *topology.LeaseState {
				l := held("x-2", 0)
				l.StepAsides = map[string]topology.StepAside{"x-1": {Reason: failover.ReasonWireGuardDegraded, At: now.Add(-failover.StepAsideCoolDown)}}
				return l
			}(),
			want: want{leaderOfX: "x-2", governed: true, candidate: true, candidates: []string{"x-2", "x-1", "x-3"}},
		},
		{
			name: "the underlay gateway stopped answering: the leader steps aside",
			self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-1", 0),
			health: &topology.Health{Gateway: topology.GatewayProbe{Addr: addr("10.0.1.254"), Since: now.Add(-time.Hour), Answered: now.Add(-failover.GatewayDeadAfter - failover.StepAsideAfter)}},
			want: want{leaderOfX: "x-2", governed: true, release: failover.ReasonGatewayUnreachable, stepAside: failover.ReasonGatewayUnreachable,
				degr: failover.ReasonGatewayUnreachable, candidates: []string{"x-2", "x-3"}},
		},
		{
			name: "a gateway that never answered is not judged",
			self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-1", 0),
			health: &topology.Health{Gateway: topology.GatewayProbe{Addr: addr("10.0.1.254"), Since: now.Add(-time.Hour)}},
			want:   want{leader: true, leaderOfX: "x-1", governed: true, candidate: true, hold: true, claim: true, candidates: []string{"x-1", "x-2", "x-3"}},
		},
		{
			name: "a gateway answering again not long enough: the leader stays, a non-leader is no candidate",
			self: "x-2", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-1", 0),
			health: &topology.Health{Gateway: topology.GatewayProbe{Addr: addr("10.0.1.254"), Since: now.Add(-time.Hour), Answered: now, Recovered: now.Add(-10 * time.Second)}},
			want:   want{leaderOfX: "x-1", governed: true, degr: failover.ReasonGatewayUnreachable, candidates: []string{"x-1", "x-3"}},
		},
		{
			name: "another node says it is degraded: skipped in the order",
			self: "x-3", nodes: func() []topology.Node {
				return withNode(failoverSite(), "x-2", func(n *topology.Node) { n.Degraded = failover.ReasonGatewayUnreachable })
			}, lease: held("x-1", 4*time.Second),
			want: want{leaderOfX: "x-1", governed: true, candidate: true, candidates: []string{"x-3"}},
		},
		{
			name: "a public endpoint comes first in Kilo's order",
			self: "x-1", nodes: func() []topology.Node {
				return withNode(failoverSite(), "x-3", func(n *topology.Node) { n.Endpoint = "198.51.100.3:51820" })
			}, lease: &topology.LeaseState{Name: "meshlet-leader-x", Exists: true},
			want: want{leaderOfX: "x-3", governed: true, candidate: true, wait: failover.RankStagger, candidates: []string{"x-3", "x-1", "x-2"}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pl := planAt(c.nodes(), c.self, c.lease, c.health)
			l := pl.Leadership
			if l == nil {
				t.Fatal("no leadership in the plan")
			}
			var leaderOfX string
			for _, sg := range pl.Segments {
				if sg.Location == "x" {
					leaderOfX = sg.Leader
				}
			}
			got := want{leader: pl.Leader, leaderOfX: leaderOfX, governed: l.Governed, candidate: l.Candidate, wait: l.Wait,
				hold: l.Hold, claim: l.Claim, release: l.Release, stepAside: l.StepAside, degr: l.Degraded, unmark: l.Unmark, candidates: l.Candidates}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v\n(why: %s)", got, c.want, l.Why)
			}
		})
	}
}

// TestLeaderMarkPublished: the Lease's holder publishes meshlet's leader
// mark with its annotations (the Publisher, the one writer of the Node,
// writes it); a location with a user's leader annotation is Kilo's rule
// alone, and gets no mark.
func TestLeaderMarkPublished(t *testing.T) {
	cases := []struct {
		name  string
		self  string
		nodes func() []topology.Node
		lease *topology.LeaseState
		want  string // the leader annotation in the plan's ("" = none)
	}{
		{name: "the holder, not yet marked", self: "x-2", nodes: failoverSite, lease: held("x-2", 0), want: topology.LeaderLeaseValue},
		{name: "the holder, marked", self: "x-2", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-2"); return ns },
			lease: held("x-2", 0), want: topology.LeaderLeaseValue},
		{name: "a user's leader annotation in the location", self: "x-2", nodes: func() []topology.Node {
			return withNode(failoverSite(), "x-2", func(n *topology.Node) { n.Leader = true })
		}, lease: held("x-2", 0)},
		{name: "not the holder", self: "x-1", nodes: func() []topology.Node { ns := failoverSite(); mark(ns, "x-1"); return ns }, lease: held("x-2", 0)},
		{name: "no Lease: Kilo's rule alone", self: "x-1", nodes: failoverSite},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pl := planAt(c.nodes(), c.self, c.lease, nil)
			if got := pl.Annotations[topology.AnnotationLeader]; got != c.want {
				t.Errorf("leader annotation %q, want %q", got, c.want)
			}
		})
	}
}

func TestNoLeaseIsKilosRule(t *testing.T) {
	nodes := failoverSite()
	mark(nodes, "x-2")
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes}, selfOf(nodes[1], "eth0"))
	if pl.Leadership != nil || pl.Probes != nil || !pl.Leader {
		t.Fatalf("without Lease information: leadership %+v probes %+v leader %v; want Kilo's rule alone", pl.Leadership, pl.Probes, pl.Leader)
	}
	if _, ok := pl.Annotations[topology.AnnotationTunnels]; ok {
		t.Error("tunnels published without health probes")
	}
}

func TestHealthPublishedAndProbes(t *testing.T) {
	nodes := failoverSite()
	mark(nodes, "x-1")
	cases := []struct {
		name    string
		health  *topology.Health
		tunnels string
	}{
		{"not probed yet", nil, ""},
		{"new: nothing judged", &topology.Health{Peers: []topology.TunnelProbe{{PublicKey: key(9), Since: now.Add(-time.Second)}}}, ""},
		{"answering", &topology.Health{Peers: []topology.TunnelProbe{{PublicKey: key(9), Since: now.Add(-time.Minute), Answered: now.Add(-time.Second)}}}, topology.TunnelsUp},
		{"dead", deadTunnels(failover.ProbeDeadAfter), topology.TunnelsDown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := selfOf(nodes[0], "eth0")
			s.Version = "v1"
			s.Health = c.health
			s.DefaultGateway = addr("10.0.1.254")
			pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Lease: held("x-1", 0), Settings: topology.Settings{HealthProbes: true}}, s)
			if got := pl.Annotations[topology.AnnotationTunnels]; got != c.tunnels {
				t.Errorf("tunnels = %q, want %q", got, c.tunnels)
			}
			want := &topology.Probes{Source: addr("10.4.0.1"), Gateway: addr("10.0.1.254"),
				Peers: []topology.ProbeTarget{{Name: "y-1", PublicKey: key(9), Addr: addr("10.4.0.2")}}}
			if !reflect.DeepEqual(pl.Probes, want) {
				t.Errorf("probes = %+v, want %+v", pl.Probes, want)
			}
		})
	}
	// A non-leader probes no tunnel and publishes none; it probes the path
	// through its leader.
	s := selfOf(nodes[1], "eth0")
	s.Version = "v1"
	pl := Compute(topology.Snapshot{Now: now, Nodes: nodes, Lease: held("x-1", 0), Settings: topology.Settings{HealthProbes: true}}, s)
	want := &topology.Probes{LeaderPath: &topology.LeaderPathProbe{Leader: "x-1", Via: addr("10.4.0.1"), Direct: nodes[0].InternalIP.Addr()}}
	if !reflect.DeepEqual(pl.Probes, want) || pl.Annotations[topology.AnnotationTunnels] != "" {
		t.Errorf("non-leader: probes %+v (leader path %+v) tunnels %q; want %+v", pl.Probes, pl.Probes.LeaderPath, pl.Annotations[topology.AnnotationTunnels], want.LeaderPath)
	}
	// Without health probes, none.
	pl = Compute(topology.Snapshot{Now: now, Nodes: nodes, Lease: held("x-1", 0)}, s)
	if pl.Probes != nil {
		t.Errorf("non-leader without health probes: probes %+v", pl.Probes)
	}
}

func TestRemoteAgeByTheRemoteClock(t *testing.T) {
	snap := twoClusters()
	behind := snap.Now.Add(-90 * time.Second) // cluster-b's clock
	cases := []struct {
		name  string
		node  func(n *topology.Node)
		alive bool
	}{
		{"90 s behind, its last-seen changing: alive", func(n *topology.Node) {
			n.LastSeen, n.Heard, n.HeardChange = behind, snap.Now.Add(-5*time.Second), true
		}, true},
		{"stopped: not heard changing for the window", func(n *topology.Node) {
			n.LastSeen, n.Heard, n.HeardChange = behind, snap.Now.Add(-topology.ReadyWindow), true
		}, false},
		{"first sighting, close to its cluster's newest: alive", func(n *topology.Node) {
			n.LastSeen, n.Heard, n.HeardChange = behind.Add(-10*time.Second), snap.Now, false
		}, true},
		{"first sighting, far behind its cluster's newest: stale", func(n *topology.Node) {
			n.LastSeen, n.Heard, n.HeardChange = behind.Add(-2*time.Minute), snap.Now, false
		}, false},
		{"no arrival information: Kilo's rule against now", func(n *topology.Node) {
			n.LastSeen, n.Heard, n.HeardChange = behind, time.Time{}, false
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := twoClusters()
			rc := &s.Remotes[0]
			for i := range rc.Nodes {
				rc.Nodes[i].LastSeen, rc.Nodes[i].Heard, rc.Nodes[i].HeardChange = behind, snap.Now.Add(-time.Second), true
			}
			c.node(&rc.Nodes[0]) // bx-1, leader of x
			pl := Compute(s, selfOf(s.Nodes[1], "eth0"))
			var has bool
			for _, l := range pl.Remotes[0].Leaders {
				has = has || l == "bx-1"
			}
			if has != c.alive {
				t.Errorf("bx-1 a remote leader: %v, want %v (leaders %v)", has, c.alive, pl.Remotes[0].Leaders)
			}
		})
	}
}

func TestNextReadinessChangeRemoteHeard(t *testing.T) {
	s := twoClusters()
	s.Nodes = nil
	rc := &s.Remotes[0]
	for i := range rc.Nodes {
		rc.Nodes[i].LastSeen, rc.Nodes[i].Heard, rc.Nodes[i].HeardChange = now.Add(-90*time.Second), now.Add(-time.Duration(10+i)*time.Second), true
	}
	if got, want := topology.NextReadinessChange(s), rc.Nodes[2].Heard.Add(topology.ReadyWindow); !got.Equal(want) {
		t.Errorf("next change %v, want %v (the earliest Heard + 60 s)", got, want)
	}
	rc.Nodes = rc.Nodes[:1]
	s.Remotes[0].ObservedAt = now.Add(-time.Minute)
	if got := topology.NextReadinessChange(s); !got.IsZero() {
		t.Errorf("frozen cluster: next change %v, want none", got)
	}
}
