package planner

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// benchSnapshot: a local cluster of 100 nodes in 5 locations and 10 remote
// clusters of 1000 nodes each (10 locations per cluster).
func benchSnapshot() (topology.Snapshot, topology.Self) {
	snap := topology.Snapshot{Now: now}
	for i := 0; i < 100; i++ {
		n := node(1000+i, fmt.Sprintf("local-%03d", i), fmt.Sprintf("loc-%d", i%5),
			fmt.Sprintf("10.0.%d.%d/16", i/250, i%250+1), fmt.Sprintf("10.0.%d.%d:51820", i/250, i%250+1),
			fmt.Sprintf("10.244.%d.0/24", i))
		n.PublicKey = benchKey(0, i)
		snap.Nodes = append(snap.Nodes, n)
	}
	mesh := topology.Mesh{Namespace: "kilo-system", Name: "big", Clusters: []topology.MeshCluster{{Name: "local", Local: true, AllowedNetworks: pfxs("10.244.0.0/16")}}}
	for c := 1; c <= 10; c++ {
		rc := topology.RemoteCluster{Name: fmt.Sprintf("remote-%02d", c), Synced: true}
		mesh.Clusters = append(mesh.Clusters, topology.MeshCluster{Name: rc.Name, WireGuardPort: 51820,
			AllowedNetworks: pfxs(fmt.Sprintf("10.%d.0.0/16", 100+c), fmt.Sprintf("100.%d.0.0/16", 100+c))})
		for i := 0; i < 1000; i++ {
			n := topology.Node{
				Name: fmt.Sprintf("r%02d-%04d", c, i), LocationAnnotation: fmt.Sprintf("site-%d", i%10),
				PublicKey: benchKey(c, i), LastSeen: now, Endpoint: "192.0.2.1:51820",
				InternalIP: netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(100 + c), 0, byte(i / 250), byte(i%250 + 1)}), 32),
				PodCIDRs:   []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + c), byte(i / 4), byte(i % 4 * 64)}), 26)},
			}
			n.InternalIP = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(100 + c), byte(i / 250), byte(i%250 + 1)}), 32)
			if i < 10 {
				n.WireGuardIP = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(100 + c), 255, byte(i + 1)}), 16)
			}
			rc.Nodes = append(rc.Nodes, n)
		}
		snap.Remotes = append(snap.Remotes, rc)
	}
	snap.Meshes = []topology.Mesh{mesh}
	return snap, selfOf(snap.Nodes[0], "eth0")
}

func benchKey(c, i int) topology.Key {
	var k topology.Key
	k[0], k[1], k[2] = byte(c), byte(i>>8), byte(i)
	k[31] = 7
	return k
}

// BenchmarkPlan: the planner for a leader of a 100-node cluster meshed
// with 10 remote clusters of 1000 nodes (target: under 50 ms per plan).
func BenchmarkPlan(b *testing.B) {
	snap, self := benchSnapshot()
	benchPlan(b, snap, self, func(pl topology.Plan) bool { return pl.Leader && len(pl.WireGuard.Peers) >= 100 })
}

// benchPlan measures Compute on one input, once the plan is what ok wants.
func benchPlan(b *testing.B, snap topology.Snapshot, self topology.Self, ok func(topology.Plan) bool) {
	pl := Compute(snap, self)
	if !ok(pl) {
		b.Fatalf("leader=%v peers=%d rejections=%v", pl.Leader, len(pl.WireGuard.Peers), pl.Rejections[:min(3, len(pl.Rejections))])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		Compute(snap, self)
	}
	b.ReportMetric(float64(len(pl.WireGuard.Peers)), "peers")
	b.ReportMetric(float64(len(pl.Routes)), "routes")
}

// BenchmarkPlanDualStack: BenchmarkPlan's mesh dual-stack, every node
// with an IPv6 pod CIDR and private IP (goal: at most twice BenchmarkPlan's
// time and allocations; docs/performance.md#data-plane-and-planner).
func BenchmarkPlanDualStack(b *testing.B) {
	snap, self := benchSnapshot()
	for i := range snap.Nodes {
		snap.Nodes[i].MeshletVersion = "v1"
	}
	snap, self = withSecondFamily(snap, self)
	self.Version = "v1"
	for i := range snap.Remotes {
		for j := range snap.Remotes[i].Nodes {
			snap.Remotes[i].Nodes[j].MeshletVersion = "v1"
		}
		snap.Meshes[0].Clusters[i+1].AllowedNetworks = append(snap.Meshes[0].Clusters[i+1].AllowedNetworks, pfx(fmt.Sprintf("fd%x::/16", 0x20+i)))
	}
	snap.Meshes[0].Clusters[0].AllowedNetworks = append(snap.Meshes[0].Clusters[0].AllowedNetworks, pfx("fd10:244::/32"))
	snap.Settings.DualStackSubnet = pfx("fd4b::/64")
	benchPlan(b, snap, self, func(pl topology.Plan) bool {
		return pl.Leader && len(pl.WireGuard.Peers) >= 100 && pl.DualStackWireGuardIP.IsValid()
	})
}
