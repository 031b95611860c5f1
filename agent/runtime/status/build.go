package status

import (
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/agent/runtime/grants"
	"github.com/meshlet/meshlet/agent/runtime/metrics"
	"github.com/meshlet/meshlet/agent/runtime/reconcile"
	"github.com/meshlet/meshlet/wg"
)

// Input is what the running agent knows at one moment; Build assembles it
// into a Status without deciding anything itself: roles, peers and routes
// are the last plan's, health is the metrics' rule, drift the actuator's.
type Input struct {
	Node, Cluster, Version string
	Now                    time.Time
	// Run is the last reconcile (HaveRun false before the first plan);
	// Ready is the loop's readiness.
	Run     reconcile.Run
	HaveRun bool
	Ready   bool
	// Device is the WireGuard device as read now (DeviceErr when it could
	// not be), Health each of its peers' state.
	Device    wg.DeviceStats
	DeviceErr error
	Health    map[wgtypes.Key]metrics.Health
	Drift     []string
	DriftErr  error
	Remotes   []cluster.RemoteStatus
	// Leadership is the elector's state (nil without Leases); the
	// decisions come from the plan.
	Leadership *Leadership
	// FeaturesOff are the features the agent's grants or the cluster's
	// CRDs do not allow (agent/runtime/grants).
	FeaturesOff []grants.Feature
	// What NodeFindings needs besides the plan and the device: the flags,
	// the agent's snapshot of its cluster, net.ipv4.ip_forward as read now
	// ("" = not read), the endpoints the last apply could not resolve.
	Settings   topology.Settings
	Snapshot   topology.Snapshot
	IPForward  string
	Unresolved []diagnose.Unresolved
	// EndpointRoutes: the underlay's routes to the peers' endpoint
	// addresses (nil: not read).
	EndpointRoutes map[netip.Addr]diagnose.EndpointRoute
	// LeaderPath: a non-leader's probes of the path through its leader
	// (nil: none).
	LeaderPath *diagnose.LeaderPath
	// PathMTUs: a leader's full-size probes of its tunnels.
	PathMTUs []diagnose.PathMTU
}

// Build assembles the status.
func Build(in Input) Status {
	plan := in.Run.Plan
	s := Status{
		Node: in.Node, Cluster: in.Cluster, Version: in.Version, At: in.Now,
		Segment: plan.Segment, Location: plan.Location, WireGuardIP: plan.WireGuardIP, PrivateIP: plan.PrivateIP,
		DualStackWireGuardIP: plan.DualStackWireGuardIP, DualStackPrivateIP: plan.DualStackPrivateIP,
		Endpoint: plan.Endpoint, Routes: plan.Routes, Rules: plan.Rules, Rejections: plan.Rejections,
		Drift: in.Drift, Peers: []Peer{}, FeaturesOff: in.FeaturesOff, ClusterMeshStatusWriter: plan.StatusWriter,
		LastRun: Run{At: in.Run.At, Duration: in.Run.Duration, Error: in.Run.Error, Ready: in.Ready},
		Device:  Device{Interface: in.Device.Interface, Type: in.Device.Type, ListenPort: in.Device.ListenPort, MTU: plan.WireGuard.MTU},
	}
	switch {
	case !in.HaveRun:
		s.Role = "starting (no plan yet)"
	case plan.Segment == "":
		s.Role = "not in the mesh (node not Ready in Kilo's sense)"
	case plan.Leader:
		s.Role = "leader"
	default:
		s.Role = "non-leader"
	}
	if s.Device.Interface == "" {
		s.Device.Interface = plan.WireGuard.Interface
	}
	if in.Device.PublicKey != (wgtypes.Key{}) {
		s.Device.PublicKey = in.Device.PublicKey.String()
	}
	if in.DeviceErr != nil {
		s.Device.Error = in.DeviceErr.Error()
	}
	if in.DriftErr != nil {
		s.Drift = append(s.Drift, "drift not fully read: "+in.DriftErr.Error())
	}

	onDevice := make(map[wgtypes.Key]wg.PeerStats, len(in.Device.Peers))
	for _, p := range in.Device.Peers {
		onDevice[p.PublicKey] = p
	}
	planned := map[wgtypes.Key]bool{}
	for _, pp := range plan.WireGuard.Peers {
		key := wgtypes.Key(pp.PublicKey)
		planned[key] = true
		p := Peer{
			Name: pp.Name, Kind: string(pp.Kind), Cluster: pp.Cluster, Location: pp.Location, PublicKey: key.String(),
			Endpoint: pp.Endpoint, EndpointSource: pp.EndpointSource, Roaming: pp.Roaming,
			Keepalive: pp.PersistentKeepalive, KeepaliveSource: string(pp.KeepaliveSource), AllowedIPs: pp.AllowedIPs,
			State: "missing",
		}
		if d, ok := onDevice[key]; ok {
			fill(&p, d, in.Health[key])
		} else if in.DeviceErr != nil {
			p.State = "unknown"
		}
		s.Peers = append(s.Peers, p)
	}
	// Peers on the device the plan does not have: the next reconcile
	// removes them.
	for _, d := range in.Device.Peers {
		if planned[d.PublicKey] {
			continue
		}
		p := Peer{Name: d.PublicKey.String()[:8] + "…", Kind: "not in the plan", PublicKey: d.PublicKey.String(), AllowedIPs: d.AllowedIPs,
			Keepalive: int(d.PersistentKeepalive.Seconds())}
		fill(&p, d, in.Health[d.PublicKey])
		s.Peers = append(s.Peers, p)
	}

	mesh := map[string]string{}
	leaders := map[string][]string{}
	for _, r := range plan.Remotes {
		mesh[r.Cluster], leaders[r.Cluster] = r.Mesh, r.Leaders
	}
	for _, r := range in.Remotes {
		s.Remotes = append(s.Remotes, Remote{RemoteStatus: r, Mesh: mesh[r.Cluster], Leaders: leaders[r.Cluster]})
	}
	if in.Leadership != nil {
		l := *in.Leadership
		if plan.Leadership != nil {
			l.Leadership = *plan.Leadership
		}
		s.Leadership = &l
	}
	if in.HaveRun {
		peers := make([]diagnose.AgentPeer, 0, len(s.Peers))
		for _, p := range s.Peers {
			peers = append(peers, p.Agent())
		}
		s.Findings = diagnose.NodeFindings(diagnose.NodeFacts{Node: in.Node, Settings: in.Settings, Snapshot: in.Snapshot, Plan: plan,
			Peers: peers, IPForward: in.IPForward, Unresolved: in.Unresolved, EndpointRoutes: in.EndpointRoutes, LeaderPath: in.LeaderPath, PathMTUs: in.PathMTUs})
	}
	return s
}

// fill sets what the device says of a peer.
func fill(p *Peer, d wg.PeerStats, h metrics.Health) {
	if d.Endpoint.IsValid() && !sameEndpoint(p.Endpoint, d.Endpoint) {
		p.Learned = d.Endpoint.String()
	}
	p.LastHandshake, p.RxBytes, p.TxBytes = d.LastHandshake, d.ReceiveBytes, d.TransmitBytes
	p.State, p.Allowed = h.State, h.Allowed
	if p.State == "" {
		p.State = "unknown"
	}
}

// sameEndpoint reports whether the device's endpoint is the planned one
// (a planned DNS name is never "the same": the device shows what it
// resolved to).
func sameEndpoint(planned string, device netip.AddrPort) bool {
	ap, err := netip.ParseAddrPort(planned)
	return err == nil && ap == device
}
