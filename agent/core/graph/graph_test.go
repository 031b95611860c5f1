package graph

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/awalterschulze/gographviz"

	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
)

func TestDot(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	k := func(i byte) topology.Key { var x topology.Key; x[0] = i; return x }
	p := netip.MustParsePrefix
	node := func(i byte, name, loc, priv, pod string) topology.Node {
		return topology.Node{Name: name, LocationAnnotation: loc, Endpoint: strings.Split(priv, "/")[0] + ":51820", PublicKey: k(i),
			InternalIP: p(priv), PodCIDRs: []netip.Prefix{p(pod)}, LastSeen: now}
	}
	remote := node(9, "b-1", "z", "172.16.0.1/24", "10.2.1.0/24")
	remote.WireGuardIP = p("100.66.1.1/24")
	snap := topology.Snapshot{Now: now,
		Nodes: []topology.Node{node(1, "a-1", "x", "192.168.0.1/24", "10.1.1.0/24"), node(2, "a-2", "x", "192.168.0.2/24", "10.1.2.0/24"),
			node(3, "a-3", "y", "192.168.1.3/24", "10.1.3.0/24")},
		Peers:   []topology.Peer{{Name: "laptop", PublicKey: k(50), AllowedIPs: []netip.Prefix{p("10.5.0.1/32")}}},
		Meshes:  []topology.Mesh{{Namespace: "kilo-system", Name: "m", Clusters: []topology.MeshCluster{{Name: "a", Local: true, AllowedNetworks: []netip.Prefix{p("10.1.0.0/16")}}, {Name: "b", AllowedNetworks: []netip.Prefix{p("10.2.0.0/16"), p("100.66.1.0/24")}}}}},
		Remotes: []topology.RemoteCluster{{Name: "b", Synced: true, Nodes: []topology.Node{remote}}},
	}
	self := topology.Self{Name: "a-1", PublicKey: k(1), DefaultInterface: "eth0",
		Addresses: []topology.HostAddress{{Interface: "eth0", Prefix: p("192.168.0.1/24")}}}
	snap.Settings.ClusterName = "a"
	plan := planner.Compute(snap, self)
	out, err := Dot(plan, snap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gographviz.Read([]byte(out)); err != nil {
		t.Fatalf("not valid dot: %v\n%s", err, out)
	}
	for _, want := range []string{
		`"a/a-1"->"a/a-2"`,       // leader to its node
		`"a/a-1"->"a/a-3"`,       // the two leaders of cluster a
		`"a/a-1"->"peer/laptop"`, // a leader to a Peer
		`"a/a-1"->"b/b-1"`,       // to the remote leader
		`wg 10.4.0.1/16`,         // a leader's WireGuard IP
		`label="b"`, `label="location:x"`,
	} {
		if !strings.Contains(strings.ReplaceAll(out, " ", ""), strings.ReplaceAll(want, " ", "")) {
			t.Errorf("dot lacks %s:\n%s", want, out)
		}
	}
}
