package main

import (
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/planner"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// The scenario: one cluster, Cozystack-style settings (Cilium compatibility,
// --local=false, --encapsulate=crosssubnet), two locations.
//
//	location a: leader (segment leader), worker (non-leader)
//	location b: remote (alone, so its own leader)
//
// Every node has a private address on its location's subnet (its Kubernetes
// InternalIP) and a public address (its WireGuard endpoint) on one shared
// underlay bridge. Location b's private subnet is not reachable from
// location a except through WireGuard, as in a real multi-site cluster.
// Each node has a cilium_host address inside its pod CIDR (Cilium's router
// IP, the cni-compatibility-ip), and worker and remote have a pod: a network
// namespace behind a veth, like a Cilium endpoint.
//
// The cluster is dual-stack (docs/dual-stack.md): every node also has an
// IPv6 private address on its location's IPv6 subnet (the two subnets share
// the bridge, nothing routes between them), an IPv6 pod CIDR, and the pods
// an IPv6 address; IPv6 reaches the leader on the underlay (IPIP carries
// IPv4 alone) and crosses locations through kilo0.
//
// The remote site is a second location of the same cluster rather than a
// second cluster: the datapath under test (non-leader -> IPIP -> leader ->
// kilo0 -> remote, replies through table 1107) is the same, and one
// snapshot describes all three nodes.

// underlay is each node's interface towards the bridge.
const underlay = "eth0"

// tunnelDev is the IPIP device every node has before it is planned, as
// Cilium creates it with enable-ipip-termination.
const tunnelDev = topology.TunnelCilium

// nodeDef is one node of the scenario as data.
type nodeDef struct {
	Name     string
	Location string
	Leader   bool
	// Private is the node's InternalIP with its subnet (on eth0).
	Private netip.Prefix
	// Public is the WireGuard endpoint address (on eth0, /24 of publicNet).
	Public netip.Addr
	// CiliumHost is the cilium_host address (cni-compatibility-ip).
	CiliumHost netip.Prefix
	PodCIDR    netip.Prefix
	// Pod is the address of the node's pod namespace; zero = no pod.
	Pod netip.Addr
	// Private6, PodCIDR6 and Pod6 are the same of IPv6.
	Private6, PodCIDR6 netip.Prefix
	Pod6               netip.Addr
}

// version is what every agent of the scenario publishes as meshlet.io/version:
// the plans the guest computes are those of nodes that run meshlet.
const version = "kernel-lane"

var publicNet = netip.MustParsePrefix("198.51.100.0/24")

var (
	leaderNode = nodeDef{
		Name: "leader", Location: "a", Leader: true,
		Private:    netip.MustParsePrefix("192.168.1.10/24"),
		Public:     netip.MustParseAddr("198.51.100.10"),
		CiliumHost: netip.MustParsePrefix("10.244.0.1/32"),
		PodCIDR:    netip.MustParsePrefix("10.244.0.0/24"),
		Private6:   netip.MustParsePrefix("fd00:a::10/64"),
		PodCIDR6:   netip.MustParsePrefix("fd10:244::/64"),
	}
	workerNode = nodeDef{
		Name: "worker", Location: "a",
		Private:    netip.MustParsePrefix("192.168.1.11/24"),
		Public:     netip.MustParseAddr("198.51.100.11"),
		CiliumHost: netip.MustParsePrefix("10.244.1.1/32"),
		PodCIDR:    netip.MustParsePrefix("10.244.1.0/24"),
		Pod:        netip.MustParseAddr("10.244.1.10"),
		Private6:   netip.MustParsePrefix("fd00:a::11/64"),
		PodCIDR6:   netip.MustParsePrefix("fd10:244:0:1::/64"),
		Pod6:       netip.MustParseAddr("fd10:244:0:1::10"),
	}
	remoteNode = nodeDef{
		Name: "remote", Location: "b",
		Private:    netip.MustParsePrefix("192.168.2.20/24"),
		Public:     netip.MustParseAddr("198.51.100.20"),
		CiliumHost: netip.MustParsePrefix("10.244.2.1/32"),
		PodCIDR:    netip.MustParsePrefix("10.244.2.0/24"),
		Pod:        netip.MustParseAddr("10.244.2.10"),
		Private6:   netip.MustParsePrefix("fd00:b::20/64"),
		PodCIDR6:   netip.MustParsePrefix("fd10:244:0:2::/64"),
		Pod6:       netip.MustParseAddr("fd10:244:0:2::10"),
	}
	scenarioNodes = []nodeDef{leaderNode, workerNode, remoteNode}
)

// wgPort is every node's WireGuard listen port.
const wgPort = 51820

func (n nodeDef) endpoint() string {
	return netip.AddrPortFrom(n.Public, wgPort).String()
}

// settings are the agent flags of the scenario (Cozystack's Kilo setup).
func settings() topology.Settings {
	return topology.Settings{
		Interface:       "kilo0",
		Granularity:     topology.GranularityLocation,
		Subnet:          netip.MustParsePrefix("10.4.0.0/16"),
		DualStackSubnet: netip.MustParsePrefix("fd4b::/64"),
		Port:            wgPort,
		Encapsulate:     topology.EncapsulateCrossSubnet,
		Local:           false,
		Compatibility:   topology.CompatibilityCilium,
	}
}

// keys holds every node's private key.
type keys map[string]wgtypes.Key

func generateKeys() (keys, error) {
	ks := keys{}
	for _, n := range scenarioNodes {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			return nil, err
		}
		ks[n.Name] = k
	}
	return ks, nil
}

func (ks keys) public(name string) topology.Key {
	return topology.Key(ks[name].PublicKey())
}

// snapshot is the planner input every node sees: the three Node objects as
// the watchers would have parsed them from their annotations.
func snapshot(ks keys, now time.Time) topology.Snapshot {
	var nodes []topology.Node
	for _, n := range scenarioNodes {
		nodes = append(nodes, topology.Node{
			Name:                n.Name,
			LocationAnnotation:  n.Location,
			Leader:              n.Leader,
			Endpoint:            n.endpoint(),
			InternalIP:          n.Private,
			PublicKey:           ks.public(n.Name),
			PodCIDRs:            []netip.Prefix{n.PodCIDR},
			LastSeen:            now,
			Granularity:         topology.GranularityLocation,
			CNICompatibilityIP:  n.CiliumHost,
			Ready:               true,
			DualStackPodCIDR:    n.PodCIDR6,
			DualStackInternalIP: n.Private6,
			MeshletVersion:      version,
		})
	}
	return topology.Snapshot{Now: now, Settings: settings(), Nodes: nodes}
}

// self is what node n knows about itself that no object holds.
func self(n nodeDef, ks keys) topology.Self {
	s := topology.Self{
		Name:             n.Name,
		PublicKey:        ks.public(n.Name),
		DefaultInterface: underlay,
		Addresses:        []topology.HostAddress{{Interface: underlay, Prefix: n.Private}, {Interface: underlay, Prefix: n.Private6}},
		CiliumHostIP:     n.CiliumHost,
		TunnelDevice:     tunnelDev,
		Version:          version,
	}
	if ap, err := netip.ParseAddrPort(n.endpoint()); err == nil && ap.Addr() != n.Private.Addr() {
		s.Addresses = append(s.Addresses, topology.HostAddress{Interface: underlay, Prefix: netip.PrefixFrom(ap.Addr(), 32)})
	}
	return s
}

// plans computes every node's plan from the same snapshot.
func plans(ks keys, now time.Time) map[string]topology.Plan {
	return plansOf(snapshot(ks, now), ks)
}

// plansLedBy is plans with node lead leading location a: the snapshot the
// agents see once lead holds the location's Lease, whose mark
// (kilo.squat.ai/leader, docs/failover.md#marks) it carries instead of
// node "leader".
func plansLedBy(ks keys, now time.Time, lead string) map[string]topology.Plan {
	snap := snapshot(ks, now)
	for i, n := range snap.Nodes {
		if n.LocationAnnotation == leaderNode.Location {
			snap.Nodes[i].Leader = n.Name == lead
		}
	}
	return plansOf(snap, ks)
}

func plansOf(snap topology.Snapshot, ks keys) map[string]topology.Plan {
	out := map[string]topology.Plan{}
	for _, n := range scenarioNodes {
		out[n.Name] = planner.Compute(snap, self(n, ks))
	}
	return out
}
