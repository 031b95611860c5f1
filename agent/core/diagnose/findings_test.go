package diagnose

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// ids is the "ID subject" of each named finding.
func ids(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		if f.ID != "" {
			out = append(out, f.ID+" "+f.Subject)
		}
	}
	slices.Sort(out)
	return out
}

func TestNodeFindings(t *testing.T) {
	nodes := func() []topology.Node {
		return []topology.Node{node("a1", "x", 1, "v1"), node("a2", "x", 2, "v1"), node("b1", "y", 3, "v1")}
	}
	leader := topology.Plan{Leader: true, Location: "x", Segments: []topology.SegmentInfo{{Location: "x", Leader: "a1", Nodes: []string{"a1", "a2"}}}}
	alone := topology.Plan{Leader: true, Location: "y", Segments: []topology.SegmentInfo{{Location: "y", Leader: "a1", Nodes: []string{"a1"}}}}
	blocked := AgentPeer{Name: "b1", Kind: "segment", Endpoint: "192.168.0.3:51820", TxBytes: 3 * initiationBytes}
	defaultRoute := EndpointRoute{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("192.168.50.254"), Interface: "eth0"}
	for _, tc := range []struct {
		name   string
		facts  func(*NodeFacts)
		want   []string
		detail string // a substring of the first finding's evidence
	}{
		{name: "healthy leader", facts: func(f *NodeFacts) {
			f.Peers = []AgentPeer{{Name: "b1", Kind: "segment", TxBytes: 10_000, RxBytes: 9_000, LastHandshake: now}}
		}},
		{name: "location label, not annotation", facts: func(f *NodeFacts) {
			f.Snapshot.Nodes[0].LocationAnnotation = ""
			f.Snapshot.Nodes[0].Labels = map[string]string{topology.AnnotationLocation: "x"}
		}, want: []string{IDLocationLabel + " node a1"}, detail: "label kilo.squat.ai/location=x"},
		{name: "location label that agrees with the annotation", facts: func(f *NodeFacts) {
			f.Snapshot.Nodes[0].Labels = map[string]string{topology.AnnotationLocation: "x"}
		}},
		{name: "location label equal to the topology label's location", facts: func(f *NodeFacts) {
			f.Snapshot.Nodes[0].LocationAnnotation = ""
			f.Snapshot.Nodes[0].Labels = map[string]string{topology.AnnotationLocation: "x", "topology.kubernetes.io/region": "x"}
		}},
		{name: "zone label while --topology-label is region", facts: func(f *NodeFacts) {
			f.Snapshot.Nodes[0].LocationAnnotation = ""
			f.Snapshot.Nodes[0].Labels = map[string]string{"topology.kubernetes.io/zone": "y"}
		}, want: []string{IDTopologyLabel + " node a1"}, detail: "label topology.kubernetes.io/zone=y"},
		{name: "zone label naming no location", facts: func(f *NodeFacts) {
			f.Snapshot.Nodes[0].LocationAnnotation = ""
			f.Snapshot.Nodes[0].Labels = map[string]string{"topology.kubernetes.io/zone": "eu-1a"}
		}},
		{name: "zone label is the topology label", facts: func(f *NodeFacts) {
			f.Settings.TopologyLabel = "topology.kubernetes.io/zone"
			f.Snapshot.Nodes[0].LocationAnnotation = ""
			f.Snapshot.Nodes[0].Labels = map[string]string{"topology.kubernetes.io/zone": "y"}
		}},
		{name: "own key on another node", facts: func(f *NodeFacts) { f.Snapshot.Nodes[2].PublicKey = f.Snapshot.Nodes[0].PublicKey },
			want: []string{IDDuplicateKey + " nodes a1, b1"}, detail: "on a1, b1"},
		{name: "two others share a key", facts: func(f *NodeFacts) { f.Snapshot.Nodes[2].PublicKey = f.Snapshot.Nodes[1].PublicKey }},
		{name: "a destination the host routes itself", facts: func(f *NodeFacts) {
			msg := "10.9.0.0/24 is routed by the host (10.9.0.0/24 dev eth0 proto boot): left as it is, not routed through the mesh"
			f.Plan.Rejections = []topology.Rejection{{Object: topology.ObjectRef{Kind: "Node", Name: "a1"}, Field: "routes", Reason: topology.ReasonHostRoute, Message: msg},
				{Object: topology.ObjectRef{Kind: "Node", Name: "a2"}, Field: "routes", Reason: topology.ReasonHostRoute, Message: "another node's"}}
		}, want: []string{IDHostRoute + " node a1"}, detail: "(10.9.0.0/24 dev eth0 proto boot)"},
		{name: "three initiations unanswered", facts: func(f *NodeFacts) { f.Peers = []AgentPeer{blocked} },
			want: []string{IDNoReply + " node a1"}, detail: "tx 444 B (≥ 3 handshake initiations), rx 0 B"},
		{name: "private endpoint in another location, only the default route to it", facts: func(f *NodeFacts) {
			p := blocked
			p.Location = "y"
			f.Peers = []AgentPeer{p}
			f.EndpointRoutes = map[netip.Addr]EndpointRoute{netip.MustParseAddr("192.168.0.3"): defaultRoute}
		}, want: []string{IDPrivateEndpoint + " node a1"}, detail: "route to 192.168.0.3: default (via 192.168.50.254 dev eth0)"},
		{name: "private endpoint of a remote cluster's leader, only the default route to it", facts: func(f *NodeFacts) {
			p := blocked
			p.Kind, p.Cluster = "remote", "cluster-b"
			p.Endpoint = "100.64.7.9:51820"
			f.Peers = []AgentPeer{p}
			f.EndpointRoutes = map[netip.Addr]EndpointRoute{netip.MustParseAddr("100.64.7.9"): defaultRoute}
		}, want: []string{IDPrivateEndpoint + " node a1"}, detail: "route to 100.64.7.9: default"},
		{name: "private endpoint on a connected network: the firewall's", facts: func(f *NodeFacts) {
			p := blocked
			p.Location = "y"
			f.Peers = []AgentPeer{p}
			f.EndpointRoutes = map[netip.Addr]EndpointRoute{netip.MustParseAddr("192.168.0.3"): {Prefix: netip.MustParsePrefix("192.168.0.0/24"), Interface: "eth0"}}
		}, want: []string{IDNoReply + " node a1"}},
		{name: "private endpoint through a specific route (VPN, peering)", facts: func(f *NodeFacts) {
			p := blocked
			p.Location = "y"
			f.Peers = []AgentPeer{p}
			f.EndpointRoutes = map[netip.Addr]EndpointRoute{netip.MustParseAddr("192.168.0.3"): {Prefix: netip.MustParsePrefix("192.168.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"), Interface: "wg-vpn"}}
		}, want: []string{IDNoReply + " node a1"}},
		{name: "public endpoint through the default route", facts: func(f *NodeFacts) {
			p := blocked
			p.Location, p.Endpoint = "y", "203.0.113.7:51820"
			f.Peers = []AgentPeer{p}
			f.EndpointRoutes = map[netip.Addr]EndpointRoute{netip.MustParseAddr("203.0.113.7"): defaultRoute}
		}, want: []string{IDNoReply + " node a1"}},
		{name: "private endpoint, route not read", facts: func(f *NodeFacts) {
			p := blocked
			p.Location = "y"
			f.Peers = []AgentPeer{p}
		}, want: []string{IDNoReply + " node a1"}},
		{name: "private endpoint in this location (full granularity)", facts: func(f *NodeFacts) {
			p := blocked
			p.Location = "x"
			f.Peers = []AgentPeer{p}
			f.EndpointRoutes = map[netip.Addr]EndpointRoute{netip.MustParseAddr("192.168.0.3"): defaultRoute}
		}, want: []string{IDNoReply + " node a1"}},
		{name: "non-leader: the path through its leader drops, the leader answers", facts: func(f *NodeFacts) {
			f.Plan.Leader, f.LeaderPath = false, &LeaderPath{Leader: "a2", Via: netip.MustParseAddr("10.4.0.1"), Direct: netip.MustParseAddr("192.168.0.2"), Unanswered: 3, DirectAnswered: true}
		}, want: []string{IDLeaderPathDropped + " node a1"}, detail: "unanswered 3 times in a row"},
		{name: "non-leader: two unanswered rounds, not yet", facts: func(f *NodeFacts) {
			f.Plan.Leader, f.LeaderPath = false, &LeaderPath{Leader: "a2", Via: netip.MustParseAddr("10.4.0.1"), Direct: netip.MustParseAddr("192.168.0.2"), Unanswered: 2, DirectAnswered: true}
		}},
		{name: "non-leader: the leader answers nothing (down: failover's case)", facts: func(f *NodeFacts) {
			f.Plan.Leader, f.LeaderPath = false, &LeaderPath{Leader: "a2", Via: netip.MustParseAddr("10.4.0.1"), Direct: netip.MustParseAddr("192.168.0.2"), Unanswered: 5, DirectAnswered: false}
		}},
		{name: "non-leader: the path answers", facts: func(f *NodeFacts) {
			f.Plan.Leader, f.LeaderPath = false, &LeaderPath{Leader: "a2", Via: netip.MustParseAddr("10.4.0.1"), Direct: netip.MustParseAddr("192.168.0.2"), Unanswered: 0, DirectAnswered: false}
		}},
		{name: "leader: a tunnel losing full-size packets", facts: func(f *NodeFacts) {
			f.Plan.WireGuard.Interface = "kilo0"
			f.PathMTUs = []PathMTU{{Name: "b1", Addr: netip.MustParseAddr("10.4.0.2"), MTU: 1420, Unanswered: 2}, {Name: "c1", Addr: netip.MustParseAddr("10.4.0.3"), MTU: 1420}}
		}, want: []string{IDPathMTU + " node a1"}, detail: "echo of 1420 B to 10.4.0.2 (b1's WireGuard IP) through the tunnel: unanswered 2 times"},
		{name: "leader: one full-size probe lost, not yet", facts: func(f *NodeFacts) {
			f.PathMTUs = []PathMTU{{Name: "b1", Addr: netip.MustParseAddr("10.4.0.2"), MTU: 1420, Unanswered: 1}}
		}},
		{name: "two initiations: not yet", facts: func(f *NodeFacts) {
			p := blocked
			p.TxBytes = 2 * initiationBytes
			f.Peers = []AgentPeer{p}
		}},
		{name: "answered once, then silent: the peer-down check's", facts: func(f *NodeFacts) {
			p := blocked
			p.RxBytes = 92
			f.Peers = []AgentPeer{p}
		}},
		{name: "idle peer", facts: func(f *NodeFacts) { f.Peers = []AgentPeer{{Name: "b1", Kind: "segment"}} }},
		{name: "leader with non-leaders, ip_forward 0", facts: func(f *NodeFacts) { f.IPForward = "0" },
			want: []string{IDIPForwardOff + " node a1"}, detail: "net.ipv4.ip_forward = 0"},
		{name: "leader alone, ip_forward 0", facts: func(f *NodeFacts) { f.IPForward, f.Plan = "0", alone }},
		{name: "non-leader, ip_forward 0", facts: func(f *NodeFacts) { f.IPForward, f.Plan.Leader = "0", false }},
		{name: "ip_forward not read", facts: func(f *NodeFacts) { f.IPForward = "" }},
		{name: "peer DNS name unresolvable", facts: func(f *NodeFacts) {
			f.Unresolved = []Unresolved{{Peer: "laptop", Endpoint: "gone.example.invalid:51820", Error: "lookup gone.example.invalid: no such host"}}
		}, want: []string{IDPeerDNS + " node a1"}, detail: "no such host"},
		{name: "cilium without cilium_tunl", facts: func(f *NodeFacts) {
			f.Settings.Compatibility = topology.CompatibilityCilium
			f.Plan.Tunnel = topology.Tunnel{Name: topology.TunnelIPIP, Create: true}
		}, want: []string{IDCiliumTunl + " node a1"}, detail: "no link cilium_tunl"},
		{name: "cilium with cilium_tunl", facts: func(f *NodeFacts) {
			f.Settings.Compatibility = topology.CompatibilityCilium
			f.Plan.Tunnel = topology.Tunnel{Name: topology.TunnelCilium}
		}},
		{name: "cilium, no tunnel needed", facts: func(f *NodeFacts) { f.Settings.Compatibility = topology.CompatibilityCilium }},
		{name: "no cilium, tunl0", facts: func(f *NodeFacts) { f.Plan.Tunnel = topology.Tunnel{Name: topology.TunnelIPIP, Create: true} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NodeFacts{Node: "a1", Snapshot: topology.Snapshot{Now: now, Nodes: nodes()}, Plan: leader, IPForward: "1"}
			if tc.facts != nil {
				tc.facts(&f)
			}
			fs := NodeFindings(f)
			if got := ids(fs); !slices.Equal(got, tc.want) {
				t.Fatalf("findings %q, want %q: %+v", got, tc.want, fs)
			}
			for _, x := range fs {
				if x.Severity != Error || x.Fix == "" || len(x.Evidence) == 0 || x.Runbook != "docs/runbooks.md#"+strings.ToLower(x.ID) {
					t.Errorf("finding %s lacks severity error, fix, evidence or runbook: %+v", x.ID, x)
				}
			}
			if tc.detail != "" && !strings.Contains(strings.Join(fs[0].Evidence, "\n"), tc.detail) {
				t.Errorf("evidence %q lacks %q", fs[0].Evidence, tc.detail)
			}
		})
	}
}

func TestCheckFindings(t *testing.T) {
	three := func() []topology.Node {
		return []topology.Node{node("a1", "x", 1, "v1"), node("b1", "y", 2, "v1"), node("c1", "z", 3, "v1")}
	}
	up := func(name string) AgentPeer {
		return AgentPeer{Name: name, Kind: "segment", State: "up", Endpoint: "192.168.0.9:51820", TxBytes: 5000, RxBytes: 5000, LastHandshake: now}
	}
	for _, tc := range []struct {
		name   string
		change func(*Input)
		want   []string
	}{
		{name: "healthy, agents read", change: func(in *Input) {
			in.Agents = map[string]Agent{"a1": {Peers: []AgentPeer{up("b1"), up("c1")}}, "b1": {Peers: []AgentPeer{up("a1"), up("c1")}}}
		}},
		{name: "label without annotation, from the API", change: func(in *Input) {
			in.Snapshot.Nodes[1].LocationAnnotation = ""
			in.Snapshot.Nodes[1].Labels = map[string]string{topology.AnnotationLocation: "y"}
		}, want: []string{IDLocationLabel + " node b1"}},
		{name: "cloned key, from the API and from both agents: once", change: func(in *Input) {
			in.Snapshot.Nodes[1].PublicKey = in.Snapshot.Nodes[0].PublicKey
			f := duplicateKeys(in.Snapshot)[0].Finding
			in.Agents = map[string]Agent{"a1": {Findings: []Finding{f}}, "b1": {Findings: []Finding{f}}}
		}, want: []string{IDDuplicateKey + " nodes a1, b1"}},
		{name: "behind NAT without keepalive", change: func(in *Input) {
			p := up("b1")
			p.Endpoint, p.Learned = "192.168.0.2:51820", "172.20.0.9:40001"
			in.Agents = map[string]Agent{"a1": {Peers: []AgentPeer{p}}, "c1": {Peers: []AgentPeer{p}}}
		}, want: []string{IDNATNoKeepalive + " node b1"}},
		{name: "behind NAT with keepalive", change: func(in *Input) {
			in.Snapshot.Nodes[1].PersistentKeepalive = 25
			p := up("b1")
			p.Learned = "172.20.0.9:40001"
			in.Agents = map[string]Agent{"a1": {Peers: []AgentPeer{p}}}
		}},
		{name: "DNS endpoint: learned is what it resolved to", change: func(in *Input) {
			p := up("b1")
			p.Endpoint, p.Learned = "b1.example.com:51820", "192.168.0.2:51820"
			in.Agents = map[string]Agent{"a1": {Peers: []AgentPeer{p}}}
		}},
		{name: "inbound dropped at b1: a1 receives and answers", change: func(in *Input) {
			toA := AgentPeer{Name: "a1", Kind: "segment", Endpoint: "192.168.0.1:51820", TxBytes: 4 * initiationBytes}
			toB := AgentPeer{Name: "b1", Kind: "segment", Endpoint: "192.168.0.2:51820", TxBytes: 8 * 92, RxBytes: 4 * initiationBytes}
			in.Agents = map[string]Agent{"b1": {Peers: []AgentPeer{toA}, Findings: noReply(NodeFacts{Node: "b1", Peers: []AgentPeer{toA}})}, "a1": {Peers: []AgentPeer{toB}}}
		}, want: []string{IDInboundBlocked + " node b1", IDNoReply + " node b1"}},
		{name: "a valid Peer refused by a webhook", change: func(in *Input) {
			in.PeerAdmission = &PeerAdmission{Err: `admission webhook "peers.kilo.squat.ai" denied the request`, Webhooks: []string{"kilo-peer-validation/peers.kilo.squat.ai"}}
		}, want: []string{IDPeerAdmission + " cluster a"}},
		{name: "a valid Peer accepted", change: func(in *Input) {
			in.PeerAdmission = &PeerAdmission{Webhooks: []string{"kilo-peer-validation/peers.kilo.squat.ai"}}
		}},
		{name: "nothing reaches the peer either: no reply only", change: func(in *Input) {
			toA := AgentPeer{Name: "a1", Kind: "segment", Endpoint: "192.168.0.1:51820", TxBytes: 4 * initiationBytes}
			toB := AgentPeer{Name: "b1", Kind: "segment", Endpoint: "192.168.0.2:51820", TxBytes: 4 * initiationBytes}
			in.Agents = map[string]Agent{"b1": {Peers: []AgentPeer{toA}, Findings: noReply(NodeFacts{Node: "b1", Peers: []AgentPeer{toA}})},
				"a1": {Peers: []AgentPeer{toB}, Findings: noReply(NodeFacts{Node: "a1", Peers: []AgentPeer{toB}})}}
		}, want: []string{IDNoReply + " node a1", IDNoReply + " node b1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := input(three(), tc.change)
			fs := Check(in)
			if got := ids(fs); !slices.Equal(got, tc.want) {
				t.Fatalf("findings %q, want %q", got, tc.want)
			}
			if len(tc.want) > 0 && Errors(fs) == 0 {
				t.Errorf("no error: diagnose would exit 0")
			}
		})
	}
}

// TestCiliumTunlFromPlanner: the finding follows the planner's tunnel
// choice for a node of a two-node location on Cilium's flags.
func TestCiliumTunlFromPlanner(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tunnel      string
		encapsulate topology.Encapsulate
		want        bool
	}{
		{name: "no cilium_tunl, encapsulated", encapsulate: topology.EncapsulateAlways, want: true},
		{name: "cilium_tunl, encapsulated", tunnel: topology.TunnelCilium, encapsulate: topology.EncapsulateAlways},
		{name: "no cilium_tunl, never encapsulated", encapsulate: topology.EncapsulateNever},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := topology.Settings{Compatibility: topology.CompatibilityCilium, Encapsulate: tc.encapsulate, Local: true}
			snap := topology.Snapshot{Now: now, Settings: set, Nodes: []topology.Node{node("c1", "c", 1, "v1"), node("c2", "c", 2, "v1")}}
			for _, n := range snap.Nodes {
				self := n.Name
				plan := planner.Compute(snap, topology.Self{Name: self, PublicKey: n.PublicKey, TunnelDevice: tc.tunnel})
				got := slices.Contains(IDs(NodeFindings(NodeFacts{Node: self, Settings: set, Snapshot: snap, Plan: plan})), IDCiliumTunl)
				if got != tc.want {
					t.Errorf("%s: %s reported %v, want %v (planned tunnel %+v)", self, IDCiliumTunl, got, tc.want, plan.Tunnel)
				}
			}
		})
	}
}

// TestRunbookSections: every finding's runbook entry exists in
// docs/runbooks.md's part for diagnose, and that part has no other.
func TestRunbookSections(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	_, part, ok := strings.Cut(string(doc), "\n# Runbooks for `meshlet diagnose`")
	if !ok {
		t.Fatal("docs/runbooks.md has no part for meshlet diagnose's findings")
	}
	ids := []string{IDLocationLabel, IDTopologyLabel, IDDuplicateKey, IDNATNoKeepalive, IDNoReply, IDInboundBlocked, IDIPForwardOff, IDPeerDNS, IDCiliumTunl, IDPeerAdmission, IDPrivateEndpoint, IDLeaderPathDropped, IDPathMTU, IDHostRoute,
		IDSecondFamilyNotMeshed, IDSingleFamilySegment}
	var sections []string
	for _, l := range strings.Split(part, "\n") {
		if h, ok := strings.CutPrefix(l, "## "); ok {
			sections = append(sections, h)
		}
	}
	slices.Sort(ids)
	slices.Sort(sections)
	if !slices.Equal(ids, sections) {
		t.Errorf("sections %q, want one per finding ID %q", sections, ids)
	}
}

// TestFamilyFindings: a dual-stack cluster meshed in one family is named,
// and in a dual-stack mesh the segment whose leader runs kg.
func TestFamilyFindings(t *testing.T) {
	nodes := func(bVersion string) []topology.Node {
		ns := []topology.Node{node("a1", "x", 1, "v1"), node("a2", "x", 2, "v1"), node("b1", "y", 3, bVersion)}
		for i := range ns {
			ns[i].DualStackPodCIDR = netip.MustParsePrefix(fmt.Sprintf("fd10::%x:0:0:0/64", i))
		}
		return ns
	}
	for _, tc := range []struct {
		name      string
		dualStack string
		bVersion  string
		want      []string
	}{
		{"single-stack", "", "", []string{IDSecondFamilyNotMeshed + " mesh"}},
		{"dual-stack, b1 runs kg", "fd4b::/64", "", []string{IDSingleFamilySegment + " node b1"}},
		{"dual-stack, all meshlet", "fd4b::/64", "v1", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := topology.Snapshot{Now: now, Nodes: nodes(tc.bVersion)}
			if tc.dualStack != "" {
				snap.Settings.DualStackSubnet = netip.MustParsePrefix(tc.dualStack)
			}
			ref := planner.Compute(snap, topology.Self{Name: "a1", PublicKey: snap.Nodes[0].PublicKey, Version: "v1"})
			var got []string
			for _, f := range FamilyFindings(snap, ref) {
				got = append(got, f.ID+" "+f.Subject)
				if f.Runbook == "" || f.Fix == "" || len(f.Evidence) == 0 {
					t.Errorf("finding %s lacks runbook, fix or evidence: %+v", f.ID, f)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("findings %q, want %q", got, tc.want)
			}
		})
	}
}
