package diagnose

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// The named findings: the faults users hit and search for (issue 22), each
// with a stable ID, its evidence and a runbook entry of the same name in
// docs/runbooks.md. Each is decided here from data the agents and the API
// already have; the node-local ones are computed by the node's agent (its
// `meshlet status`) and relayed by `meshlet diagnose`.
const (
	// IDLocationLabel: a node carries kilo.squat.ai/location as a label
	// (Kilo reads only the annotation) and its location is not that label's.
	IDLocationLabel = "LocationLabelNotAnnotation"
	// IDTopologyLabel: a node has no location (no annotation, no label named
	// by --topology-label) but a topology label of another name that names
	// a location of the cluster.
	IDTopologyLabel = "TopologyLabelNotRead"
	// IDDuplicateKey: two nodes publish one WireGuard public key (a cloned
	// image with its key file).
	IDDuplicateKey = "DuplicatePublicKey"
	// IDNATNoKeepalive: a peer's packets arrive from another address than
	// the node advertises (NAT), and the node has no persistent keepalive.
	IDNATNoKeepalive = "NATWithoutKeepalive"
	// IDNoReply: this node has sent handshakes to a peer and received
	// nothing from it, ever.
	IDNoReply = "NoHandshakeReply"
	// IDPrivateEndpoint: this node has sent handshakes to a peer in another
	// location at a private address, reached only through its default
	// route, and heard nothing: no route joins the two private networks.
	IDPrivateEndpoint = "PrivateEndpointNotRouted"
	// IDLeaderPathDropped: a non-leader's echoes to its leader's WireGuard
	// IP (routed through the leader) go unanswered while the leader's own
	// address answers: the network drops packets not addressed to the
	// nodes themselves, so the leader cannot forward for it.
	IDLeaderPathDropped = "ForwardedTrafficDropped"
	// IDPathMTU: a leader's full-size probes through a live tunnel go
	// unanswered: the path carries less than the WireGuard interface's
	// MTU plus WireGuard's overhead.
	IDPathMTU = "PathMTUTooSmall"
	// IDInboundBlocked: the peer receives this node's handshakes and
	// answers, and nothing reaches this node: its inbound UDP is dropped.
	IDInboundBlocked = "InboundWireGuardBlocked"
	// IDIPForwardOff: a leader with non-leaders has net.ipv4.ip_forward 0.
	IDIPForwardOff = "LeaderIPForwardOff"
	// IDPeerDNS: a peer's endpoint is a DNS name that does not resolve.
	IDPeerDNS = "PeerEndpointUnresolvable"
	// IDCiliumTunl: --compatibility=cilium, the plan needs Cilium's IPIP
	// device and the node has no cilium_tunl.
	IDCiliumTunl = "CiliumTunlMissing"
	// IDHostRoute: the host routes a destination of the plan itself (its
	// default route, a connected network, a CNI's or DHCP's route): meshlet
	// leaves that route alone and does not route the destination through
	// the mesh on this node (docs/security.md#claims).
	IDHostRoute = "HostRouteConflict"
	// IDPeerAdmission: the API server refuses a valid Peer (a validating
	// webhook, Kilo's `kg webhook` or another, denies it or cannot be
	// called), so no Peer can be added or changed.
	IDPeerAdmission = "PeerAdmissionRefused"
	// IDSecondFamilyNotMeshed: nodes have pod CIDRs of two families and the
	// mesh carries one (no --dual-stack-subnet): their pods of the other
	// family reach no other location.
	IDSecondFamilyNotMeshed = "SecondFamilyNotMeshed"
	// IDSingleFamilySegment: in a dual-stack mesh, a segment led by kg
	// (which plans one family) carries the first family alone.
	IDSingleFamilySegment = "SegmentLedByKgSingleFamily"
)

// PeerAdmission is what the API server answered to a server-side dry run
// of creating a valid Peer (`meshlet diagnose` asks once; a dry run calls
// the validating webhooks and stores nothing).
type PeerAdmission struct {
	// Err is the API server's refusal; "" = accepted.
	Err string
	// Webhooks are the validating webhooks whose rules match Peers
	// ("configuration/webhook"), where they could be listed.
	Webhooks []string
}

// peerAdmission is the finding of a refused dry run.
func peerAdmission(cluster string, a *PeerAdmission) []Finding {
	if a == nil || a.Err == "" {
		return nil
	}
	hooks := "none could be listed"
	if len(a.Webhooks) > 0 {
		hooks = strings.Join(a.Webhooks, ", ")
	}
	return []Finding{{Severity: Error, Check: "peer admission", ID: IDPeerAdmission, Subject: "cluster " + cluster,
		Message:  "the API server refuses a valid Peer: no Peer can be created or changed, so no new laptop or VM joins the mesh",
		Evidence: []string{"server-side dry run of creating a valid Peer: " + a.Err, "validating webhooks matching peers.kilo.squat.ai: " + hooks},
		Fix:      "bring the webhook's Service and pods back (Kilo's `kg webhook`), or delete its ValidatingWebhookConfiguration if nothing serves it any more",
		Runbook:  runbook(IDPeerAdmission)}}
}

// runbook is the runbook entry of a finding.
func runbook(id string) string { return "docs/runbooks.md#" + strings.ToLower(id) }

// initiationBytes is the size of a WireGuard handshake initiation's UDP
// payload; unansweredInitiations of them sent with nothing received and no
// handshake mean the peer never answered for at least
// (unansweredInitiations-1) × REKEY_TIMEOUT (5 s): a healthy peer answers
// the first in milliseconds (docs/wireguard.md).
const (
	initiationBytes       = 148
	unansweredInitiations = 3
)

// topologyLabels are the labels people set to place nodes, other than the
// one --topology-label names (Kilo reads only that one).
var topologyLabels = []string{
	topology.AnnotationLocation,
	"topology.kubernetes.io/region",
	"topology.kubernetes.io/zone",
	"failure-domain.beta.kubernetes.io/region",
	"failure-domain.beta.kubernetes.io/zone",
}

// Unresolved is an endpoint the agent's last apply could not resolve.
type Unresolved struct {
	Peer, Endpoint, Error string
}

// NodeFacts is what one node's agent knows of itself, for the findings its
// `meshlet status` reports.
type NodeFacts struct {
	Node     string
	Settings topology.Settings
	// Snapshot is the agent's view of its cluster (its own Node among them).
	Snapshot topology.Snapshot
	Plan     topology.Plan
	// Peers are the device's peers (status.Peers).
	Peers []AgentPeer
	// IPForward is net.ipv4.ip_forward as read now ("" = not read).
	IPForward  string
	Unresolved []Unresolved
	// PathMTUs are what this leader's full-size probes of its live tunnels
	// saw.
	PathMTUs []PathMTU
	// LeaderPath is what this non-leader's probes of the path through its
	// leader saw (nil: none ran).
	LeaderPath *LeaderPath
	// EndpointRoutes are the underlay's routes to the peers' endpoint
	// addresses, as read now (absent: not read, or no route).
	EndpointRoutes map[netip.Addr]EndpointRoute
}

// LeaderPath is a non-leader's probes of the path through its leader
// (agent/runtime/health): Unanswered rounds in a row of an echo to the
// leader's WireGuard IP, and whether the leader's private IP answered in
// the last of them.
type LeaderPath struct {
	Leader         string
	Via, Direct    netip.Addr
	Unanswered     int
	DirectAnswered bool
}

// PathMTU is one tunnel's full-size probes (agent/runtime/health):
// Unanswered echoes of MTU bytes in a row while the tunnel was alive.
type PathMTU struct {
	Name, Cluster string
	Addr          netip.Addr
	MTU           int
	Unanswered    int
}

// pathMTUUnanswered is how many full-size probes in a row (15 s apart) make
// the finding.
const pathMTUUnanswered = 2

// wireGuardOverhead is what WireGuard adds to an IPv4 packet: outer IPv4
// and UDP headers, its own header and tag (docs/wireguard.md).
const wireGuardOverhead = 80

// pathMTU: a live tunnel that loses full-size packets.
func pathMTU(f NodeFacts) []Finding {
	if !f.Plan.Leader {
		return nil
	}
	var fs []Finding
	for _, m := range f.PathMTUs {
		if m.Unanswered < pathMTUUnanswered {
			continue
		}
		peer := m.Name
		if m.Cluster != "" {
			peer += " (cluster " + m.Cluster + ")"
		}
		fs = append(fs, Finding{Severity: Error, Check: "path MTU", ID: IDPathMTU, Subject: "node " + f.Node,
			Message: fmt.Sprintf("full-size packets to %s are lost: the tunnel answers small probes, but not an echo of %d B (%s's MTU), which crosses the underlay as %d B: the path carries less and drops the rest, so pings pass and big transfers stall",
				peer, m.MTU, orNone(f.Plan.WireGuard.Interface), m.MTU+wireGuardOverhead),
			Evidence: []string{fmt.Sprintf("echo of %d B to %s (%s's WireGuard IP) through the tunnel: unanswered %d times in a row, 15 s apart, while the tunnel's small probes were answered", m.MTU, m.Addr, m.Name, m.Unanswered)},
			Fix:      fmt.Sprintf("lower the WireGuard MTU on the nodes of both locations (--mtu, Kilo's flag: the path's MTU − %d; 1280 fits any IPv4 path), or let the path's routers send ICMP \"fragmentation needed\" back", wireGuardOverhead),
			Runbook:  runbook(IDPathMTU)})
	}
	return fs
}

// leaderPathDropped is how many rounds in a row (5 s apart) make the
// finding: one lost echo is no fault.
const leaderPathDropped = 3

// leaderPath: the path through the leader drops what the leader itself
// answers.
func leaderPath(f NodeFacts) []Finding {
	lp := f.LeaderPath
	if lp == nil || f.Plan.Leader || lp.Unanswered < leaderPathDropped || !lp.DirectAnswered {
		return nil
	}
	return []Finding{{Severity: Error, Check: "forwarding", ID: IDLeaderPathDropped, Subject: "node " + f.Node,
		Message: fmt.Sprintf("this node's traffic through its leader %s is dropped on the way: %s's WireGuard IP %s, reached through %s as everything this node sends to the mesh, does not answer, while %s's own address %s does — the network between drops packets not addressed to the nodes themselves (cloud anti-spoofing, source/destination check)",
			lp.Leader, lp.Leader, lp.Via, lp.Leader, lp.Leader, lp.Direct),
		Evidence: []string{fmt.Sprintf("echo to %s (%s's WireGuard IP, routed through it): unanswered %d times in a row, 5 s apart", lp.Via, lp.Leader, lp.Unanswered),
			fmt.Sprintf("echo to %s (%s's private IP, direct): answered", lp.Direct, lp.Leader)},
		Fix:     "let the nodes of this location send and receive packets of other addresses: AWS: disable the source/destination check; OpenStack: allowed-address-pairs for the pod and WireGuard CIDRs (or port security off); GCP: canIpForward; or encapsulate within the location (--encapsulate=always)",
		Runbook: runbook(IDLeaderPathDropped)}}
}

// EndpointRoute is the host's route to a peer's endpoint address, leaving
// out meshlet's own routes and the WireGuard interface (netlinkx).
type EndpointRoute struct {
	// Prefix is the route's destination: 0.0.0.0/0 is the default route.
	Prefix netip.Prefix
	// Gateway is its next hop (invalid: on-link).
	Gateway   netip.Addr
	Interface string
}

// NodeFindings are the named findings about one node that its agent can
// prove alone.
func NodeFindings(f NodeFacts) []Finding {
	var fs []Finding
	self := func(x Finding) bool { return x.Subject == "node "+f.Node }
	for _, x := range LocationFindings(f.Snapshot.Nodes, f.Settings) {
		if self(x) {
			fs = append(fs, x)
		}
	}
	for _, x := range duplicateKeys(f.Snapshot) {
		if slices.Contains(x.nodes, f.Node) {
			fs = append(fs, x.Finding)
		}
	}
	fs = append(fs, noReply(f)...)
	fs = append(fs, ipForward(f)...)
	fs = append(fs, leaderPath(f)...)
	fs = append(fs, pathMTU(f)...)
	fs = append(fs, unresolved(f.Node, f.Unresolved)...)
	fs = append(fs, ciliumTunl(f)...)
	fs = append(fs, hostRoutes(f)...)
	return fs
}

// hostRoutes are the plan's destinations this node's host routes itself
// (the rejections of topology.WithoutHostRoutes), one finding each.
func hostRoutes(f NodeFacts) []Finding {
	var fs []Finding
	for _, r := range f.Plan.Rejections {
		if r.Reason != topology.ReasonHostRoute || r.Object.Kind != "Node" || r.Object.Name != f.Node {
			continue
		}
		fs = append(fs, Finding{Severity: Error, Check: "routes", ID: IDHostRoute, Subject: "node " + f.Node,
			Message:  "the host routes a destination of the plan itself: " + r.Message,
			Evidence: []string{r.Message},
			Fix:      "if the mesh should carry it on this node, remove the host's route (ip route del …); else narrow the claim that brings it (its Event names it)",
			Runbook:  runbook(IDHostRoute)})
	}
	return fs
}

// LocationFindings: nodes whose location is not what their labels say they
// meant — kilo.squat.ai/location set as a label (Kilo reads only the
// annotation), or a topology label other than --topology-label naming a
// location of the cluster on a node that has none.
func LocationFindings(nodes []topology.Node, set topology.Settings) []Finding {
	set = topology.Defaults(set)
	locations := map[string]bool{}
	for _, n := range nodes {
		if l := topology.NodeLocation(n, set); l != "" {
			locations[l] = true
		}
	}
	var fs []Finding
	for _, n := range nodes {
		loc := topology.NodeLocation(n, set)
		if v, ok := n.Labels[topology.AnnotationLocation]; ok && n.LocationAnnotation == "" && v != loc {
			fs = append(fs, Finding{Severity: Error, Check: "location", ID: IDLocationLabel, Subject: "node " + n.Name,
				Message: fmt.Sprintf("has %s=%s as a label, not as the annotation Kilo reads: it is in %s, not in location %s", topology.AnnotationLocation, v, locName(loc), v),
				Evidence: []string{fmt.Sprintf("label %s=%s", topology.AnnotationLocation, v), "annotation " + topology.AnnotationLocation + " absent",
					fmt.Sprintf("label %s=%s (--topology-label)", set.TopologyLabel, orNone(n.Labels[set.TopologyLabel]))},
				Fix:     fmt.Sprintf("kubectl annotate node %s %s=%s (Talos: machine.nodeAnnotations)", n.Name, topology.AnnotationLocation, v),
				Runbook: runbook(IDLocationLabel)})
			continue
		}
		if loc != "" {
			continue
		}
		for _, k := range topologyLabels {
			if v := n.Labels[k]; k != set.TopologyLabel && v != "" && locations[v] {
				fs = append(fs, Finding{Severity: Error, Check: "location", ID: IDTopologyLabel, Subject: "node " + n.Name,
					Message: fmt.Sprintf("has no location: label %s=%s names location %s, but the agents read the location from %s (--topology-label), which it lacks", k, v, v, set.TopologyLabel),
					Evidence: []string{fmt.Sprintf("label %s=%s", k, v), "annotation " + topology.AnnotationLocation + " absent",
						"label " + set.TopologyLabel + " absent", fmt.Sprintf("other nodes are in location %s", v)},
					Fix:     fmt.Sprintf("kubectl annotate node %s %s=%s, or run every agent with --topology-label=%s", n.Name, topology.AnnotationLocation, v, k),
					Runbook: runbook(IDTopologyLabel)})
				break
			}
		}
	}
	return fs
}

func locName(l string) string {
	if l == "" {
		return "no location (a segment of its own)"
	}
	return "location " + l
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// keyFinding is a duplicate-key finding and the nodes it names.
type keyFinding struct {
	Finding
	nodes []string
}

// duplicateKeys: nodes of the local and remote clusters that publish one
// public key. WireGuard tells peers apart by key alone, so at most one of
// them is meshed.
func duplicateKeys(snap topology.Snapshot) []keyFinding {
	byKey := map[topology.Key][]string{}
	add := func(cluster string, nodes []topology.Node) {
		for _, n := range nodes {
			if !n.PublicKey.IsZero() {
				byKey[n.PublicKey] = append(byKey[n.PublicKey], qualified(cluster, n.Name))
			}
		}
	}
	add("", snap.Nodes)
	for _, r := range snap.Remotes {
		add(r.Name, r.Nodes)
	}
	var out []keyFinding
	for k, names := range byKey {
		if len(names) < 2 {
			continue
		}
		sort.Strings(names)
		key := k.String()
		out = append(out, keyFinding{nodes: names, Finding: Finding{Severity: Error, Check: "keys", ID: IDDuplicateKey,
			Subject:  "nodes " + strings.Join(names, ", "),
			Message:  fmt.Sprintf("%d nodes publish one WireGuard public key (%s…): WireGuard tells peers apart by key, so only one of them is meshed", len(names), key[:8]),
			Evidence: []string{fmt.Sprintf("annotation %s=%s on %s", topology.AnnotationKey, key, strings.Join(names, ", "))},
			Fix:      "on all but one of them delete the agent's key file (a cloned image's; --key-file) and restart the agent: it creates a new key",
			Runbook:  runbook(IDDuplicateKey)}})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Subject < out[j].Subject })
	return out
}

// noReply: peers this node has sent handshake initiations to and received
// nothing from, ever (the device's counters since it was created). When
// the peer is in another location and its endpoint is a private address
// this node reaches only through its default route, the likely cause is
// named instead: no route between the two private networks.
func noReply(f NodeFacts) []Finding {
	node := f.Node
	var fs []Finding
	for _, p := range f.Peers {
		if p.LastHandshake.IsZero() && p.RxBytes == 0 && p.TxBytes >= unansweredInitiations*initiationBytes {
			if x, ok := privateEndpoint(f, p); ok {
				fs = append(fs, x)
				continue
			}
			fs = append(fs, Finding{Severity: Error, Check: "handshakes", ID: IDNoReply, Subject: "node " + node,
				Message:  fmt.Sprintf("peer %s (%s) never answered: %d B of handshakes sent to %s, nothing received", p.Name, p.Kind, p.TxBytes, orNone(p.Endpoint)),
				Evidence: []string{fmt.Sprintf("peer %s: tx %d B (≥ %d handshake initiations), rx 0 B, last handshake never", p.Name, p.TxBytes, p.TxBytes/initiationBytes)},
				Fix:      "open UDP " + portOf(p.Endpoint) + " both ways between this node and " + orNone(p.Endpoint) + " (cloud firewall, security group); `meshlet status` on the peer says which way is dropped",
				Runbook:  runbook(IDNoReply)})
		}
	}
	return fs
}

// cgnat is the shared address space (RFC 6598), private like RFC 1918's.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// privateEndpoint is the finding for a never-answering peer in another
// location whose endpoint is a private address reached only through the
// default route.
func privateEndpoint(f NodeFacts, p AgentPeer) (Finding, bool) {
	ap, err := netip.ParseAddrPort(p.Endpoint)
	if err != nil {
		return Finding{}, false
	}
	a := ap.Addr().Unmap()
	r, routed := f.EndpointRoutes[a]
	otherLocation := p.Kind == string(topology.KindRemote) || p.Kind == string(topology.KindSegment) && p.Location != f.Plan.Location
	if !(a.IsPrivate() || cgnat.Contains(a)) || !otherLocation || !routed || r.Prefix.Bits() != 0 {
		return Finding{}, false
	}
	where := "location " + orNone(p.Location)
	if p.Kind == string(topology.KindRemote) {
		where = "cluster " + p.Cluster
	}
	via := "via " + r.Gateway.String()
	if !r.Gateway.IsValid() {
		via = "on-link"
	}
	return Finding{Severity: Error, Check: "handshakes", ID: IDPrivateEndpoint, Subject: "node " + f.Node,
		Message: fmt.Sprintf("peer %s (%s) never answered at %s, a private address: this node reaches it only through its default route, so unless a route joins the two private networks (VPN, peering) the handshakes go nowhere", p.Name, where, p.Endpoint),
		Evidence: []string{fmt.Sprintf("peer %s: tx %d B (≥ %d handshake initiations), rx 0 B, last handshake never", p.Name, p.TxBytes, p.TxBytes/initiationBytes),
			fmt.Sprintf("route to %s: default (%s dev %s), no route specific to it", a, via, orNone(r.Interface))},
		Fix: fmt.Sprintf("give %s an address this node can reach: kubectl annotate node %s %s=<public IP>:%s, or route the two private networks to each other",
			p.Name, p.Name, topology.AnnotationForceEndpoint, portOf(p.Endpoint)),
		Runbook: runbook(IDPrivateEndpoint)}, true
}

func portOf(endpoint string) string {
	if ap, err := netip.ParseAddrPort(endpoint); err == nil {
		return fmt.Sprint(ap.Port())
	}
	if i := strings.LastIndexByte(endpoint, ':'); i >= 0 {
		return endpoint[i+1:]
	}
	return "51820"
}

// ipForward: a leader forwards its non-leaders' traffic (and its peers' to
// them); with ip_forward 0 the kernel drops it.
func ipForward(f NodeFacts) []Finding {
	if !f.Plan.Leader || f.IPForward != "0" {
		return nil
	}
	var via []string
	for _, s := range f.Plan.Segments {
		if s.Leader == f.Node {
			for _, n := range s.Nodes {
				if n != f.Node {
					via = append(via, n)
				}
			}
		}
	}
	if len(via) == 0 {
		return nil
	}
	return []Finding{{Severity: Error, Check: "forwarding", ID: IDIPForwardOff, Subject: "node " + f.Node,
		Message:  fmt.Sprintf("leads %s for %s but net.ipv4.ip_forward is 0: their traffic through the tunnel is dropped here", locName(f.Plan.Location), strings.Join(via, ", ")),
		Evidence: []string{"net.ipv4.ip_forward = 0 (read now)", "role leader, non-leaders " + strings.Join(via, ", ")},
		Fix:      "sysctl -w net.ipv4.ip_forward=1 and find what turns it off (meshlet sets it each reconcile: a read-only /proc/sys makes that fail)",
		Runbook:  runbook(IDIPForwardOff)}}
}

func unresolved(node string, us []Unresolved) []Finding {
	var fs []Finding
	for _, u := range us {
		fs = append(fs, Finding{Severity: Error, Check: "peer dns", ID: IDPeerDNS, Subject: "node " + node,
			Message:  fmt.Sprintf("peer %s's endpoint %s does not resolve: the device keeps the address it had, if any", u.Peer, u.Endpoint),
			Evidence: []string{u.Error},
			Fix:      "fix the DNS name in the Peer's spec.endpoint.dnsOrIP.dns (or use an IP), or its DNS record",
			Runbook:  runbook(IDPeerDNS)})
	}
	return fs
}

// ciliumTunl: with --compatibility=cilium the encapsulated routes go through
// Cilium's IPIP device; without it (Cilium without
// enable-ipip-termination) the plan falls back to tunl0.
func ciliumTunl(f NodeFacts) []Finding {
	if f.Settings.Compatibility != topology.CompatibilityCilium || f.Plan.Tunnel.Name == "" || f.Plan.Tunnel.Name == topology.TunnelCilium {
		return nil
	}
	return []Finding{{Severity: Error, Check: "cilium", ID: IDCiliumTunl, Subject: "node " + f.Node,
		Message:  fmt.Sprintf("--compatibility=cilium and the routes need an IPIP device, but there is no %s: the plan falls back to %s", topology.TunnelCilium, f.Plan.Tunnel.Name),
		Evidence: []string{"no link " + topology.TunnelCilium + " on the node", fmt.Sprintf("planned tunnel %s (create %v)", f.Plan.Tunnel.Name, f.Plan.Tunnel.Create)},
		Fix:      "run Cilium with enable-ipip-termination=true (Helm: enableIPIPTermination), or --encapsulate=never where the nodes of a location share a subnet",
		Runbook:  runbook(IDCiliumTunl)}}
}

// crossAgent are the findings that need two agents' reports: a node behind
// NAT without keepalive (its peer's device learned another address than it
// advertises), and inbound UDP dropped at a node (its peer receives and
// answers, nothing arrives).
func crossAgent(in Input, add func(Finding)) {
	names := make([]string, 0, len(in.Agents))
	for n := range in.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	nodes := map[string]topology.Node{}
	for _, n := range in.Snapshot.Nodes {
		nodes[n.Name] = n
	}
	natted := map[string]bool{}
	for _, seer := range names {
		for _, p := range in.Agents[seer].Peers {
			n, ok := nodes[p.Name]
			if p.Kind != string(topology.KindSegment) || !ok || p.Learned == "" || n.PersistentKeepalive > 0 || natted[p.Name] {
				continue
			}
			if _, err := netip.ParseAddrPort(p.Endpoint); err != nil {
				continue // a DNS name: the device shows what it resolved to
			}
			natted[p.Name] = true
			add(Finding{Severity: Error, Check: "nat", ID: IDNATNoKeepalive, Subject: "node " + p.Name,
				Message: fmt.Sprintf("is behind NAT (or sends from another address than it advertises): %s receives its packets from %s, it advertises %s, and it has no persistent keepalive, so the mapping expires and %s cannot reach it", seer, p.Learned, p.Endpoint, seer),
				Evidence: []string{fmt.Sprintf("%s's device: peer %s endpoint %s (learned), planned %s", seer, p.Name, p.Learned, p.Endpoint),
					"annotation " + topology.AnnotationPersistentKeepalive + " absent on " + p.Name},
				Fix:     fmt.Sprintf("kubectl annotate node %s %s=25", p.Name, topology.AnnotationPersistentKeepalive),
				Runbook: runbook(IDNATNoKeepalive)})
		}
	}
	for _, node := range names {
		for _, f := range in.Agents[node].Findings {
			if f.ID != IDNoReply && f.ID != IDPrivateEndpoint {
				continue
			}
			for _, p := range in.Agents[node].Peers {
				if !strings.HasPrefix(f.Message, "peer "+p.Name+" ") {
					continue
				}
				other, ok := in.Agents[p.Name]
				if !ok {
					continue
				}
				for _, op := range other.Peers {
					if op.Name == node && op.RxBytes > 0 && op.TxBytes > 0 && op.LastHandshake.IsZero() {
						add(Finding{Severity: Error, Check: "handshakes", ID: IDInboundBlocked, Subject: "node " + node,
							Message: fmt.Sprintf("inbound WireGuard is dropped here: %s receives this node's handshakes and answers, nothing from %s arrives", p.Name, p.Name),
							Evidence: []string{fmt.Sprintf("%s: peer %s tx %d B, rx 0 B, no handshake", node, p.Name, p.TxBytes),
								fmt.Sprintf("%s: peer %s rx %d B, tx %d B, no handshake", p.Name, node, op.RxBytes, op.TxBytes)},
							Fix:     "open inbound UDP " + portOf(op.Endpoint) + " to " + node + " (cloud firewall, security group, host nftables)",
							Runbook: runbook(IDInboundBlocked)})
					}
				}
			}
		}
	}
}

// checkFindings adds the named findings: those the API shows, those the
// agents report (each once), those that need two agents.
func checkFindings(in Input, add func(Finding)) {
	seen := map[string]bool{}
	once := func(f Finding) {
		if k := f.ID + "\x00" + f.Subject; !seen[k] {
			seen[k] = true
			add(f)
		}
	}
	for _, f := range LocationFindings(in.Snapshot.Nodes, in.Snapshot.Settings) {
		once(f)
	}
	for _, f := range duplicateKeys(in.Snapshot) {
		once(f.Finding)
	}
	for _, f := range peerAdmission(in.Cluster, in.PeerAdmission) {
		once(f)
	}
	for _, f := range FamilyFindings(in.Snapshot, reference(in)) {
		once(f)
	}
	names := make([]string, 0, len(in.Agents))
	for n := range in.Agents {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, f := range in.Agents[n].Findings {
			once(f)
		}
	}
	crossAgent(in, once)
}

// FamilyFindings: a dual-stack cluster meshed in one family (its nodes'
// second pod CIDRs named), and, in a dual-stack mesh, each segment whose
// leader runs kg (ref's rejections: topology.ReasonSingleFamily).
func FamilyFindings(snap topology.Snapshot, ref topology.Plan) []Finding {
	set := topology.Defaults(snap.Settings)
	if !set.DualStack() {
		var dual []string
		for _, n := range snap.Nodes {
			if n.DualStackPodCIDR.IsValid() && len(topology.NotReady(n, snap.Now)) == 0 {
				dual = append(dual, n.Name+" "+n.DualStackPodCIDR.String())
			}
		}
		if len(dual) == 0 {
			return nil
		}
		other := "IPv6"
		if set.Subnet.Addr().Is6() {
			other = "IPv4"
		}
		return []Finding{{Severity: Warning, Check: "address families", ID: IDSecondFamilyNotMeshed, Subject: "mesh",
			Message: fmt.Sprintf("%d nodes have %s pod CIDRs, and the mesh carries %s's family alone (as Kilo): their %s pods reach no other location or cluster",
				len(dual), other, set.Subnet, other),
			Evidence: append([]string{"no --dual-stack-subnet"}, dual...),
			Fix:      fmt.Sprintf("give every agent --dual-stack-subnet with an %s CIDR for the leaders' WireGuard IPs (chart: dualStackTransitCIDR; docs/dual-stack.md)", other),
			Runbook:  runbook(IDSecondFamilyNotMeshed)}}
	}
	var fs []Finding
	for _, r := range ref.Rejections {
		if r.Reason != topology.ReasonSingleFamily || r.Object.Kind != "Node" {
			continue
		}
		fs = append(fs, Finding{Severity: Warning, Check: "address families", ID: IDSingleFamilySegment, Subject: "node " + r.Object.Name,
			Message: r.Message, Evidence: []string{"node " + r.Object.Name + " leads its segment and publishes no " + topology.AnnotationVersion + " (kg)"},
			Fix:     "run meshlet on the segment's nodes (docs/dropin.md), or lead the segment from a node that runs it (docs/failover.md#marks)",
			Runbook: runbook(IDSingleFamilySegment)})
	}
	return fs
}

// IDs lists the IDs of the named findings among fs.
func IDs(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		if f.ID != "" {
			out = append(out, f.ID)
		}
	}
	return out
}
