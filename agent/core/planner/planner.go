// Package planner is meshlet's planner: a pure function from a snapshot of
// the clusters (nodes, Kilo peers, ClusterMesh entries, the location's
// Lease) and what the agent observed on its node to that node's desired
// network state. It performs no I/O and reads no clock (time comes in the
// snapshot), and is a pipeline of stages whose hand-offs are their
// signatures: Kilo's rules (agent/core/topology) decide the topology, the
// device and the routes; failover (agent/core/failover) decides the
// node's part in its location's Lease between the two. Kilo's own code has
// the same shape: NewTopology, then Conf and Routes from it.
package planner

import (
	"net/netip"
	"time"

	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/sessions"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// Compute returns the desired network state of node self.Name. It is
// deterministic: the same input gives the same output, in the same order.
func Compute(snap topology.Snapshot, self topology.Self) topology.Plan {
	set := topology.Defaults(snap.Settings)
	// This node's own facts, then Kilo's topology with them.
	host := topology.DecideHost(self, set, topology.Published(snap.Nodes, self.Name))
	local := topology.Segments(snap, set, self, host)
	// The Lease: this node's part, and whether it must not lead.
	judged := failover.Judge(self.Health, snap.Now, topology.PublishedTunnels(snap))
	decision := failover.Decide(failover.Input{Lease: snap.Lease, Now: snap.Now, Settings: set, Self: self.Name,
		SelfNode: local.Self, Segment: local.SelfSegment, Endpoint: host.Endpoint, Nodes: snap.Nodes, Judgement: judged, Leaving: self.Leaving})
	if decision.Veto {
		local = local.WithoutLeader(self.Name)
	}
	// The second address family rides on the final topology.
	local, dualRejs := local.WithDualStack(set)
	pl := topology.Plan{
		Node: self.Name, Cluster: set.ClusterName,
		PrivateIP: host.Private.Prefix, PrivateInterface: host.Private.Interface, Endpoint: host.Endpoint,
		DualStackPrivateIP: host.DualStackPrivate.Prefix, IPv6Forwarding: set.CarriesIPv6(),
		WireGuard:  topology.Device{Interface: set.Interface, ListenPort: set.Port, MTU: host.MTU},
		Leadership: decision.Leadership, Segments: local.Infos(set),
	}
	rejections := append(append(append([]topology.Rejection(nil), snap.Rejections...), local.Rejections...), dualRejs...)
	cniSubnet, rejs := topology.CNIRange(set, self, topology.Published(snap.Nodes, self.Name))
	pl.CNISubnet = cniSubnet
	rejections = append(rejections, rejs...)
	// Every prefix a writer claims, by one rule in its order: the nodes'
	// addresses, the remote clusters' reservations, the Peers, the
	// allowed-location-ips (topology/claims.go).
	claims, rejs := topology.ClaimNodeAddresses(local, snap.Nodes, set)
	rejections = append(rejections, rejs...)
	remotes, rejs := topology.ResolveRemotes(snap.Meshes, set, claims)
	rejections = append(rejections, rejs...)
	peers, rejs := topology.ValidatePeers(snap.Peers, local, self.Name, self.PublicKey, claims)
	rejections = append(rejections, rejs...)
	rejections = append(rejections, topology.ClaimAllowedLocationIPs(local, claims, set)...)
	var targets []topology.ProbeTarget
	if seg := local.SelfSegment; seg != nil {
		pl.Leader = seg.LeaderNode().Name == self.Name
		pl.Segment = seg.Key
		pl.Location = topology.NodeLocation(*local.Self, set)
		if pl.Leader {
			pl.WireGuardIP = netip.PrefixFrom(seg.WireGuardIP, set.Subnet.Bits())
			pl.WireGuard.Up = true
			pl.WireGuard.Addresses = []netip.Prefix{pl.WireGuardIP}
			if seg.DualStackWireGuardIP.IsValid() {
				pl.DualStackWireGuardIP = netip.PrefixFrom(seg.DualStackWireGuardIP, set.DualStackSubnet.Bits())
				pl.WireGuard.Addresses = append(pl.WireGuard.Addresses, pl.DualStackWireGuardIP)
			}
		}
		discovered := topology.Discovered(self, local)
		dev := topology.DevicePeers(topology.DeviceInput{Settings: set, Self: self, Local: local, Leader: pl.Leader, Peers: peers,
			Discovered: discovered, Remotes: remotes, States: snap.Remotes, Claims: claims, Now: snap.Now})
		pl.WireGuard.Peers, pl.Remotes, targets = dev.Peers, dev.Remotes, dev.Probes
		rejections = append(rejections, dev.Rejections...)
		routes := topology.Routes(topology.RouteInput{Settings: set, Self: self, Host: host, Local: local, Leader: pl.Leader,
			Peers: peers, Remotes: remotes, Discovered: discovered})
		pl.Routes, pl.Rules, pl.Tunnel = routes.Routes, routes.Rules, routes.Tunnel
		rejections = append(rejections, routes.Rejections...)
		pl.Routes, rejs = topology.WithoutHostRoutes(pl.Routes, self.HostRoutes, self.Name)
		rejections = append(rejections, rejs...)
		pl.NAT = topology.NATFor(local, peers, remotes, set)
		pl.StatusWriter = len(snap.Meshes) > 0 && local.StatusWriter() == self.Name
		pl.Forward = topology.ForwardFor(local, pl.Leader, set)
	}
	// What this node publishes: Kilo's annotations, its health, the
	// endpoints it learned.
	pl.Annotations = topology.Annotations(self, host, set, snap.Now, pl.WireGuardIP, pl.Leader)
	for k, v := range topology.DualStackAnnotations(set, host, pl.DualStackWireGuardIP, snap.Published) {
		pl.Annotations[k] = v
	}
	if l := pl.Leadership; l != nil && l.Claim {
		// The Lease's holder carries meshlet's leader mark, which kg and
		// kgctl follow (docs/failover.md#marks); a location with a user's
		// leader annotation has no Lease to claim (failover.Governance).
		pl.Annotations[topology.AnnotationLeader] = topology.LeaderLeaseValue
	}
	if set.HealthProbes {
		ann, probes := failover.Publish(judged, pl.Leadership, pl.Leader, pl.WireGuardIP.Addr(), self.DefaultGateway, targets)
		for k, v := range ann {
			pl.Annotations[k] = v
		}
		pl.Probes = probes
		if lp := leaderPath(local, pl.Leader); lp != nil {
			if pl.Probes == nil {
				pl.Probes = &topology.Probes{}
			}
			pl.Probes.LeaderPath = lp
		}
	}
	pl.Annotations[topology.AnnotationDiscoveredEndpoints] = topology.FormatDiscoveredEndpoints(topology.DiscoveredToPublish(self, local, pl.WireGuard.Peers))
	pl.Annotations = topology.WithLastSeen(pl.Annotations, snap.Published, snap.Now)
	pl.Sessions = sessions.Judge(underSessionRule(self.Sessions, pl.WireGuard.Peers), sessions.DefaultPolicy)
	pl.Rejections = rejections
	return topology.Normalize(pl, local, set, self.Name)
}

// underSessionRule keeps the observed sessions of the planned peers that
// are under the half-dead rule (a SessionProbe): a peer that left the plan,
// or is no longer run by kg, is not acted on.
func underSessionRule(obs []topology.SessionObservation, peers []topology.WireGuardPeer) []topology.SessionObservation {
	if len(obs) == 0 {
		return nil
	}
	ruled := make(map[topology.Key]bool, len(obs))
	for i := range peers {
		if peers[i].SessionProbe.IsValid() {
			ruled[peers[i].PublicKey] = true
		}
	}
	var out []topology.SessionObservation
	for _, o := range obs {
		if ruled[o.PublicKey] {
			out = append(out, o)
		}
	}
	return out
}

// leaderPath is a non-leader's probe of the path through its leader (nil
// on a leader, or when the leader has no WireGuard IP or private IP).
func leaderPath(local topology.Local, leader bool) *topology.LeaderPathProbe {
	seg := local.SelfSegment
	if leader || seg == nil || !seg.WireGuardIP.IsValid() {
		return nil
	}
	ln := seg.LeaderNode()
	if !ln.InternalIP.IsValid() {
		return nil
	}
	return &topology.LeaderPathProbe{Leader: ln.Name, Via: seg.WireGuardIP, Direct: ln.InternalIP.Addr()}
}

// NextChange is when the plan of node self changes by the passing of time
// alone, with nothing in the API or on the host to say so; zero when it
// does not. The loop plans at that moment and otherwise only on events and
// its resync, so an idle node plans about twice a minute
// (docs/performance.md#idle). The moments: a node's last-seen leaving
// Kilo's ready window (topology.NextReadinessChange), this node's own
// last-seen due for its refresh (topology.LastSeenRefresh; while a run
// refreshes it, the refresh after that one), and a step-aside's cool-down
// ending (failover.CoolDownEnd), and this node's probes judged otherwise
// (failover.HealthChange). The holder of the Lease going silent is not
// among them: the agent that watches the Lease knows when its view runs
// out (agent/runtime/leadership).
func NextChange(snap topology.Snapshot, self topology.Self) time.Time {
	next := topology.Earliest(topology.NextReadinessChange(snap), failover.CoolDownEnd(snap.Lease, snap.Now),
		failover.HealthChange(self.Health, snap.Now))
	for i := range snap.Nodes {
		if n := &snap.Nodes[i]; n.Name == self.Name && !n.LastSeen.IsZero() {
			due := n.LastSeen.Add(topology.LastSeenRefresh)
			if !due.After(snap.Now) {
				due = snap.Now.Add(topology.LastSeenRefresh)
			}
			next = topology.Earliest(next, due)
		}
	}
	return next
}
