// Package topology is meshlet's planner: a pure function from a snapshot of
// the clusters (nodes, Kilo peers, ClusterMesh entries) to one node's desired
// network state. It performs no I/O, reads no clock (time comes in the
// snapshot) and imports no client-go, netlink or wgctrl, so every Kilo
// compatibility rule can be table-tested here.
package topology

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"
)

// Key is a WireGuard key (Curve25519, 32 bytes), wire-compatible with
// wgtypes.Key.
type Key [32]byte

// ParseKey decodes a base64 WireGuard key of exactly 32 bytes.
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return k, fmt.Errorf("invalid base64 key: %w", err)
	}
	if len(b) != len(k) {
		return k, fmt.Errorf("key must be 32 bytes, got %d", len(b))
	}
	copy(k[:], b)
	return k, nil
}

// String returns the key in WireGuard's base64 form.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// IsZero reports whether the key is unset.
func (k Key) IsZero() bool { return k == Key{} }

// Granularity is Kilo's --mesh-granularity.
type Granularity string

const (
	GranularityLocation Granularity = "location"
	GranularityFull     Granularity = "full"
	GranularityCross    Granularity = "cross"
)

// Encapsulate is Kilo's --encapsulate.
type Encapsulate string

const (
	EncapsulateNever       Encapsulate = "never"
	EncapsulateCrossSubnet Encapsulate = "crosssubnet"
	EncapsulateAlways      Encapsulate = "always"
)

// Compatibility is Kilo's --compatibility.
type Compatibility string

const (
	CompatibilityNone   Compatibility = ""
	CompatibilityCilium Compatibility = "cilium"
	// CompatibilityFlannel: flannel routes inside a location over its
	// VXLAN device flannel.1, through which Kilo's tunnelled routes go,
	// to each node's pod subnet address (docs/dropin.md#flannel).
	CompatibilityFlannel Compatibility = "flannel"
)

// Settings are the agent's flags that shape the plan.
type Settings struct {
	Interface   string       // default "kilo0"
	Granularity Granularity  // default location
	Subnet      netip.Prefix // mesh subnet, default 10.4.0.0/16
	// DualStackSubnet is --dual-stack-subnet: the mesh subnet of the other
	// address family than Subnet. Set, the mesh carries both families
	// (docs/dual-stack.md); zero, it carries Subnet's alone, as kg does.
	DualStackSubnet netip.Prefix
	Port            int           // listen port, default 51820
	Encapsulate     Encapsulate   // default always (Kilo's default)
	Local           bool          // --local: routes inside a location
	Compatibility   Compatibility // "" or cilium
	TopologyLabel   string        // default topology.kubernetes.io/region
	ServiceCIDRs    []netip.Prefix
	// ClusterName selects this cluster's entry in ClusterMesh objects; empty
	// means the entry marked local.
	ClusterName string
	// MTU is the WireGuard interface MTU; 0 means auto (the default route
	// interface's MTU − 80, Kilo's rule).
	MTU int
	// PrivateIP, when set, is this node's private IP (with its mask)
	// instead of the discovered one.
	PrivateIP netip.Prefix
	// InternalCIDRs, when set, limit the discovery of the private IP to
	// addresses inside them (kg's --internal-cidr).
	InternalCIDRs []netip.Prefix
	// HealthProbes: leaders probe the other leaders through the tunnel and
	// nodes of Lease-governed locations their underlay gateway
	// (docs/failover.md#health); the plan lists what to probe and this
	// node publishes what its probes found.
	HealthProbes bool
	// CNI: Kilo is the CNI (kg's --cni): traffic from this node's pod
	// subnet is masqueraded through the NAT chain, and with ForwardRules
	// the pod subnets are accepted in FORWARD (kg's
	// --iptables-forward-rules).
	CNI, ForwardRules bool
	// PrivateEndpoint: the node advertises its private IP as its endpoint
	// (kg's --prioritise-private-addresses).
	PrivateEndpoint bool
}

// Self is what the agent observed on this node (no Kubernetes object holds
// it). The planner decides from it: the private IP and its interface, the
// endpoint, the MTU, the endpoints learned, the peers to preserve.
type Self struct {
	Name string
	// PublicKey is this node's WireGuard public key.
	PublicKey Key
	// Version is this meshlet's version, published in meshlet.io/version.
	Version string
	// Addresses are the host's global unicast addresses, except those of
	// the WireGuard interface, the tunnels and Cilium's own devices.
	Addresses []HostAddress
	// HostnameAddrs are the addresses the node's hostname resolves to.
	HostnameAddrs []netip.Addr
	// DefaultInterface is the interface of the IPv4 default route ("" =
	// none) and DefaultMTU its MTU (0 = unknown).
	DefaultInterface string
	DefaultMTU       int
	// CiliumHostIP is the IPv4 address of cilium_host, if any.
	CiliumHostIP netip.Prefix
	// TunnelDevice is the IPIP device present on the node: "cilium_tunl",
	// "tunl0" or "" when none exists yet.
	TunnelDevice string
	// Device is the WireGuard device's peers as read.
	Device []DevicePeer
	// DefaultGateway is the gateway of the IPv4 default route (invalid =
	// none or on-link).
	DefaultGateway netip.Addr
	// Health is what this node's probes observed (nil = not probed).
	Health *Health
	// CNI is Kilo's CNI configuration list as read (Settings.CNI only).
	CNI CNIState
	// Advertised, when set, is the endpoint the node keeps advertising
	// unless it has a force-endpoint (Kilo's rule for its own node: the
	// published endpoint stays): meshlet plan plans with the dump's; the
	// agent leaves it empty and advertises what it discovers now
	// (docs/kilo-compatibility.md#own-address).
	Advertised string
	// Sessions is what the WireGuard device's watch saw of the sessions
	// under the half-dead rule (docs/kilo-compatibility.md#half-dead), and
	// what was done to them.
	Sessions []SessionObservation
	// HostRoutes are the routes of the host that are neither meshlet's
	// nor kg's (the default route, connected networks, a CNI's or DHCP's):
	// the plan routes none of their destinations (docs/architecture.md#host).
	HostRoutes []HostRoute
	// Leaving, when set, is why this node's agent stops for good (its
	// DaemonSet is gone, say): it hands its location's Lease over before it
	// exits (docs/failover.md#restart).
	Leaving string
}

// HostRoute is a route of the host that meshlet does not own: its table
// (0 = main), destination and how the host describes it.
type HostRoute struct {
	Table int
	Dst   netip.Prefix
	// Desc is the route as `ip route` would show it, for the rejection.
	Desc string
}

// CNIState is the CNI configuration list as the agent read it: the
// subnet of its IPAM range (zero: none yet), or why it cannot be written.
type CNIState struct {
	Subnet netip.Prefix
	Err    string
}

// Why a node is going away (Node.Leaving).
const (
	LeavingCordoned = "NodeCordoned"
	LeavingDeleting = "NodeDeleting"
)

// Node is one Kubernetes node as the planner needs it, already parsed from
// its annotations (see agent/core/kilo). Malformed annotations never reach here.
type Node struct {
	Name   string
	Labels map[string]string // only labels the planner may use (topology, selectors)
	// LocationAnnotation is kilo.squat.ai/location ("" = use the topology label).
	LocationAnnotation string
	Leader             bool // kilo.squat.ai/leader present
	// Endpoint is the endpoint annotation (force-endpoint already applied).
	Endpoint string
	// ForceEndpoint is kilo.squat.ai/force-endpoint, kept separately for the
	// remote endpoint chain.
	ForceEndpoint string
	// ClusterMeshEndpoint is kilo.squat.ai/clustermesh-endpoint.
	ClusterMeshEndpoint string
	ExternalIPs         []netip.Addr
	InternalIP          netip.Prefix // zero = none
	// InternalIPForced: InternalIP is the force-internal-ip annotation's
	// (zero for "" or "-": the node has no private IP), which wins over
	// what the node's agent discovers (Kilo's rule).
	InternalIPForced bool
	PublicKey        Key
	WireGuardIP      netip.Prefix // zero = none
	PodCIDRs         []netip.Prefix
	// DualStackPodCIDR is the first of spec.podCIDRs of the other family
	// than PodCIDRs' (zero = none); DualStackInternalIP and
	// DualStackWireGuardIP are meshlet.io/dual-stack-internal-ip and
	// meshlet.io/dual-stack-wireguard-ip. The plan uses them only in a
	// dual-stack mesh, on segments led by meshlet (Local.WithDualStack).
	DualStackPodCIDR     netip.Prefix
	DualStackInternalIP  netip.Prefix
	DualStackWireGuardIP netip.Prefix
	LastSeen             time.Time // zero = never
	PersistentKeepalive  int       // seconds
	AllowedLocationIPs   []netip.Prefix
	DiscoveredEndpoints  map[Key]netip.AddrPort
	Granularity          Granularity
	CNICompatibilityIP   netip.Prefix // cilium_host IP, zero = none
	// LeaderMark: the leader annotation is meshlet's own (value
	// LeaderLeaseValue), written by the holder of the location's Lease; any
	// other value is the user's (docs/failover.md#marks).
	LeaderMark bool
	// Tunnels is meshlet.io/tunnels: what a meshlet leader's probes found
	// of its tunnels to the other leaders (TunnelsUp, TunnelsDown, "").
	Tunnels string
	// Degraded is meshlet.io/degraded: why the node may not lead now ("" =
	// it may).
	Degraded string
	// Leaving is why the node is going away (NodeCordoned: spec.unschedulable,
	// a drain's first step; NodeDeleting: a deletion timestamp), "" when it
	// is not: its holder hands the location's Lease over at once
	// (docs/failover.md#restart).
	Leaving string
	// Heard is when this agent last saw the node's last-seen change, on
	// this agent's clock; HeardChange is false while it has only seen the
	// first value (remote nodes only: zero = judge last-seen against the
	// snapshot's time; docs/clustermesh.md#liveness).
	Heard       time.Time
	HeardChange bool
	// Ready is the node's kubelet Ready condition (true when unknown). Kilo's
	// topology ignores it (readiness is annotations + last-seen), so the
	// planner does too, to agree with kg nodes; it is kept for display.
	Ready bool
	// MeshletVersion is meshlet.io/version: "" means the node runs kg —
	// also when the version is there but stale (MarksStale).
	MeshletVersion string
	// MarksStale: the node carries meshlet's marks (version, tunnels,
	// degraded) but its last-seen was refreshed after meshlet's last write
	// (meshlet.io/seen): it runs kg now, and the marks are ignored.
	MarksStale bool
	// MalformedEndpoint is set when the endpoint other clusters would use is
	// malformed: the first present source of the remote endpoint chain
	// (clustermesh-endpoint → force-endpoint → ExternalIP → endpoint,
	// docs/clustermesh.md) does not parse. Such a node is skipped as a
	// remote leader rather than falling through to the next source, which
	// could point somewhere the operator did not intend. In-cluster use is
	// unaffected: Kilo itself falls back from force-endpoint to endpoint.
	MalformedEndpoint bool
	// Created is the Node's creation time: of two nodes claiming one
	// prefix, the older keeps it (docs/security.md#claims).
	Created time.Time
	// ReportedIPs are the addresses of the node's status.addresses
	// (InternalIP, ExternalIP): no other node may take one as its private
	// IP.
	ReportedIPs []netip.Addr
	// PrivateIPRefused is the planner's (ClaimNodeAddresses): the private
	// IP is another node's address, or overlaps an earlier claim, so it is
	// routed to this node from no other location.
	PrivateIPRefused bool
	// DualStackRefused is the same for DualStackInternalIP.
	DualStackRefused bool
}

// KeepaliveRule is one entry of a Peer's meshlet.io/node-persistent-keepalive
// annotation: the first rule matching this node gives the keepalive.
type KeepaliveRule struct {
	Value        int
	Location     string
	NodeSelector map[string]string
}

// Peer is one Kilo Peer object, validated.
type Peer struct {
	Name                string
	AllowedIPs          []netip.Prefix
	Endpoint            string // host:port, "" = none
	PersistentKeepalive int
	PresharedKey        *Key
	PublicKey           Key
	NodeKeepalive       []KeepaliveRule
	// Created is the Peer's creation time: of two Peers claiming one
	// prefix, the older keeps it (then the name decides).
	Created time.Time
}

// MeshCluster is one entry of a ClusterMesh's spec.clusters.
type MeshCluster struct {
	Name                string
	Local               bool
	AllowedNetworks     []netip.Prefix
	WireGuardPort       int
	PersistentKeepalive int
}

// Mesh is one validated ClusterMesh object.
type Mesh struct {
	Namespace string
	Name      string
	Clusters  []MeshCluster
}

// RemoteCluster is what a leader's watcher knows of one remote cluster.
type RemoteCluster struct {
	Name  string
	Nodes []Node
	Peers []Peer
	// Synced is false until the watcher has listed the cluster once; an
	// unsynced cluster contributes only its allowedNetworks routes.
	Synced bool
	// ObservedAt is the time up to which Nodes are known to be current. The
	// agent advances it while the watch is healthy and freezes it while the
	// remote API is unreachable, so last-seen ages do not grow during an
	// outage and no remote leader is dropped because of it. Zero = Now.
	ObservedAt time.Time
}

// ClockSkewWarn is the clock skew between clusters (or of a node's
// last-seen from its API server) above which meshlet warns (meshlet
// diagnose, the agent's log).
const ClockSkewWarn = 5 * time.Second

// Snapshot is everything the planner reads.
type Snapshot struct {
	Now      time.Time
	Settings Settings
	Nodes    []Node // local cluster
	Peers    []Peer // local cluster
	Meshes   []Mesh
	Remotes  []RemoteCluster
	// Rejections found while turning objects into this snapshot; the planner
	// passes them through so the plan lists every rejection.
	Rejections []Rejection
	// Lease is this agent's view of its location's Lease; nil = no Lease
	// information (meshlet plan): Kilo's rule alone, no Leadership in the
	// plan.
	Lease *LeaseState
	// Published is this node's own annotations as the API server has them
	// (nil: unknown, as in meshlet plan): the plan keeps last-seen as
	// published while it needs no refresh (WithLastSeen).
	Published map[string]string `json:"published,omitempty"`
}

// PeerKind tells where a WireGuard peer comes from.
type PeerKind string

const (
	KindSegment PeerKind = "segment"
	KindPeer    PeerKind = "peer"
	KindRemote  PeerKind = "remote"
)

// KeepaliveSource says which rule of the keepalive precedence chose a value.
type KeepaliveSource string

const (
	KeepaliveNone           KeepaliveSource = ""
	KeepalivePeerAnnotation KeepaliveSource = "peer-annotation"
	KeepalivePeerSpec       KeepaliveSource = "peer-spec"
	KeepaliveRemoteCluster  KeepaliveSource = "remote-cluster"
	KeepaliveLocalCluster   KeepaliveSource = "local-cluster"
	KeepaliveNodeAnnotation KeepaliveSource = "node-annotation"
)

// WireGuardPeer is one desired peer of the WireGuard device.
type WireGuardPeer struct {
	Name      string   `json:"name"`
	Kind      PeerKind `json:"kind"`
	Cluster   string   `json:"cluster"`
	Location  string   `json:"location"`
	PublicKey Key      `json:"publicKey"`
	// Endpoint is "host:port" (host may be a DNS name) or "" for none.
	Endpoint            string          `json:"endpoint"`
	EndpointSource      string          `json:"endpointSource,omitempty"`
	AllowedIPs          []netip.Prefix  `json:"allowedIPs"`
	PersistentKeepalive int             `json:"persistentKeepalive"`
	KeepaliveSource     KeepaliveSource `json:"keepaliveSource,omitempty"`
	PresharedKey        *Key            `json:"-"`
	// Roaming peers (keepalive > 0 or no configured endpoint) keep the
	// endpoint their device learned: the actuator must not overwrite it.
	Roaming bool `json:"roaming"`
	// SessionProbe is set for a peer run by kg, which forgets its sessions
	// whenever it reconfigures (docs/kilo-compatibility.md#half-dead): the
	// device's watch records that session (Self.Sessions), and when its
	// traffic goes unanswered the plan has this address (the peer's
	// WireGuard IP) probed before the peer is re-created (Plan.Sessions).
	SessionProbe netip.Addr `json:"sessionProbe,omitzero"`
}

// Device is the desired WireGuard device.
type Device struct {
	Interface  string          `json:"interface"`
	ListenPort int             `json:"listenPort"`
	MTU        int             `json:"mtu"`
	Up         bool            `json:"up"`
	Addresses  []netip.Prefix  `json:"addresses"`
	Peers      []WireGuardPeer `json:"peers"`
}

// Route is one desired route. Table 0 means main.
type Route struct {
	Dst    netip.Prefix `json:"dst"`
	Gw     netip.Addr   `json:"gw"`
	Dev    string       `json:"dev"`
	Src    netip.Addr   `json:"src"`
	Table  int          `json:"table"` // 0 = main
	OnLink bool         `json:"onlink"`
}

// Rule is one desired policy routing rule.
type Rule struct {
	Iif   string       `json:"iif"`
	Src   netip.Prefix `json:"src"`
	Dst   netip.Prefix `json:"dst"`
	Table int          `json:"table"`
}

// Tunnel is the IPIP device the plan routes through.
type Tunnel struct {
	// Name is the device the routes use ("cilium_tunl" or "tunl0"); "" when
	// the plan needs no tunnel.
	Name string `json:"name,omitempty"`
	// Create asks the actuator to create tunl0 when it does not exist.
	Create bool `json:"create,omitempty"`
}

// NAT is the desired MASQUERADE setup: traffic from Sources is masqueraded
// unless it goes to one of Exceptions.
type NAT struct {
	// Sources: POSTROUTING jumps to the chain for traffic from these.
	Sources []netip.Prefix `json:"sources"`
	// Destinations: POSTROUTING jumps to the chain for traffic to these
	// (this location's allowed-location-ips, as Kilo does).
	Destinations []netip.Prefix `json:"destinations,omitempty"`
	// Exceptions: the chain RETURNs (no masquerade) for these destinations.
	Exceptions []netip.Prefix `json:"exceptions"`
}

// Reason classifies a rejection (also the metric label).
type Reason string

// ObjectRef names the Kubernetes object a rejection is about.
type ObjectRef struct {
	Kind      string `json:"kind"`                // Node, Peer, ClusterMesh
	Cluster   string `json:"cluster,omitempty"`   // "" = local
	Namespace string `json:"namespace,omitempty"` // ClusterMesh only
	Name      string `json:"name"`
}

func (o ObjectRef) String() string {
	s := o.Kind + "/"
	if o.Cluster != "" {
		s = o.Cluster + ":" + s
	}
	if o.Namespace != "" {
		s += o.Namespace + "/"
	}
	return s + o.Name
}

// MarshalJSON writes the object as one readable string ("cluster:Kind/name")
// next to its parts.
func (r Rejection) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Object    string `json:"object"`
		Kind      string `json:"kind"`
		Cluster   string `json:"cluster,omitempty"`
		Namespace string `json:"namespace,omitempty"`
		Name      string `json:"name"`
		Field     string `json:"field,omitempty"`
		Reason    Reason `json:"reason"`
		Message   string `json:"message"`
		Reporter  string `json:"reporter,omitempty"`
	}{r.Object.String(), r.Object.Kind, r.Object.Cluster, r.Object.Namespace, r.Object.Name, r.Field, r.Reason, r.Message, r.Reporter})
}

// UnmarshalJSON reads what MarshalJSON writes (`meshlet status -o json`
// decodes an agent's rejections).
func (r *Rejection) UnmarshalJSON(b []byte) error {
	var v struct {
		Kind, Cluster, Namespace, Name, Field, Message, Reporter string
		Reason                                                   Reason
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Rejection{Object: ObjectRef{Kind: v.Kind, Cluster: v.Cluster, Namespace: v.Namespace, Name: v.Name},
		Field: v.Field, Reason: v.Reason, Message: v.Message, Reporter: v.Reporter}
	return nil
}

// Rejection is input the planner refused, with the reason.
type Rejection struct {
	Object  ObjectRef `json:"object"`
	Field   string    `json:"field,omitempty"`
	Reason  Reason    `json:"reason"`
	Message string    `json:"message"`
	// Reporter is the node that writes the rejection's Event, so a cluster
	// writes one Event per rejection, not one per node: a node running
	// meshlet reports its own annotations; everything else is reported by
	// the first segment leader (by name) that runs meshlet — it watches the
	// remote clusters too.
	Reporter string `json:"reporter,omitempty"`
}

// Plan is one node's desired network state.
type Plan struct {
	Node string `json:"node"`
	// PrivateIP and PrivateInterface are this node's private address and
	// the underlay interface carrying it (routes to other nodes leave
	// through it); Endpoint is what it advertises.
	PrivateIP        netip.Prefix `json:"privateIP,omitzero"`
	PrivateInterface string       `json:"privateInterface,omitempty"`
	Endpoint         string       `json:"endpoint,omitempty"`
	Cluster          string       `json:"cluster,omitempty"`
	Leader           bool         `json:"leader"`
	Segment          string       `json:"segment"`
	Location         string       `json:"location,omitempty"`
	WireGuardIP      netip.Prefix `json:"wireguardIP"`
	// DualStackPrivateIP and DualStackWireGuardIP are this node's addresses
	// of the dual-stack subnet's family (Settings.DualStackSubnet).
	DualStackPrivateIP   netip.Prefix `json:"dualStackPrivateIP,omitzero"`
	DualStackWireGuardIP netip.Prefix `json:"dualStackWireguardIP,omitzero"`
	WireGuard            Device       `json:"wireguard"`
	// IPv6Forwarding: the mesh carries IPv6 (a dual-stack or IPv6 subnet),
	// so the host forwards IPv6 (net.ipv6.conf.all.forwarding).
	IPv6Forwarding bool    `json:"ipv6Forwarding,omitempty"`
	Routes         []Route `json:"routes"`
	Rules          []Rule  `json:"rules"`
	Tunnel         Tunnel  `json:"tunnel"`
	NAT            NAT     `json:"nat"`
	// Forward are the prefixes accepted in FORWARD, to and from (kg's
	// --iptables-forward-rules with --cni).
	Forward []netip.Prefix `json:"forward,omitempty"`
	// CNISubnet is the IPAM range to write into the CNI configuration
	// list (kg's --cni); zero: leave the file alone.
	CNISubnet   netip.Prefix      `json:"cniSubnet,omitzero"`
	Annotations map[string]string `json:"annotations"`
	Rejections  []Rejection       `json:"rejections"`
	// Segments describes the computed topology, for people and kgctl-like
	// output.
	Segments []SegmentInfo `json:"segments"`
	// Remotes lists the remote clusters this node routes to.
	Remotes []RemoteInfo `json:"remotes,omitempty"`
	// Leadership is this node's part in its location's Lease; nil without
	// Lease information (docs/failover.md).
	Leadership *Leadership `json:"leadership,omitempty"`
	// StatusWriter: this node writes the status of its cluster's
	// ClusterMeshes (Local.StatusWriter; docs/clustermesh.md#status).
	StatusWriter bool `json:"statusWriter,omitempty"`
	// Probes are what this node's health probes watch (Settings.HealthProbes).
	Probes *Probes `json:"probes,omitempty"`
	// Sessions is what to do now about the sessions under the half-dead
	// rule (peers with a SessionProbe), from Self.Sessions; nil when there
	// is nothing to do or to wait for.
	Sessions *SessionActions `json:"sessions,omitempty"`
}

// SegmentInfo is one segment of the local cluster's topology.
type SegmentInfo struct {
	Name        string       `json:"name"`
	Location    string       `json:"location"`
	Leader      string       `json:"leader"`
	Nodes       []string     `json:"nodes"`
	WireGuardIP netip.Prefix `json:"wireguardIP,omitzero"`
	// DualStackWireGuardIP is the segment's address of the dual-stack
	// subnet (zero: single-stack, or the segment carries one family).
	DualStackWireGuardIP netip.Prefix `json:"dualStackWireguardIP,omitzero"`
}

// RemoteInfo summarises one remote cluster in the plan.
type RemoteInfo struct {
	Cluster         string         `json:"cluster"`
	Mesh            string         `json:"mesh"`
	AllowedNetworks []netip.Prefix `json:"allowedNetworks"`
	Leaders         []string       `json:"leaders"`
	Synced          bool           `json:"synced"`
	// Segments are the remote cluster's segments as this leader sees them
	// (leaders elected with Kilo's rules, their nodes); only on leaders.
	Segments []SegmentInfo `json:"segments,omitempty"`
}

// MarshalText encodes the key as base64, so JSON and YAML show the usual form.
func (k Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText decodes a base64 key.
func (k *Key) UnmarshalText(b []byte) error {
	p, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = p
	return nil
}

// Reasons for rejections. They are stable: they label
// meshlet_rejections_total and Kubernetes Events.
const (
	ReasonInvalidKey           Reason = "InvalidKey"
	ReasonInvalidCIDR          Reason = "InvalidCIDR"
	ReasonInvalidEndpoint      Reason = "InvalidEndpoint"
	ReasonInvalidAnnotation    Reason = "InvalidAnnotation"
	ReasonInvalidPeer          Reason = "InvalidPeer"
	ReasonInvalidClusterMesh   Reason = "InvalidClusterMesh"
	ReasonNetworksOverlap      Reason = "NetworksOverlap"
	ReasonOutsideAllowed       Reason = "OutsideAllowedNetworks"
	ReasonOverlapsLocal        Reason = "OverlapsLocalCluster"
	ReasonDefaultRoute         Reason = "DefaultRoute"
	ReasonDuplicateKey         Reason = "DuplicatePublicKey"
	ReasonDuplicateWireGuardIP Reason = "DuplicateWireGuardIP"
	ReasonOwnKey               Reason = "OwnKey"
	ReasonDuplicateAllowedIP   Reason = "DuplicateAllowedIP"
	ReasonNoPublicKey          Reason = "NoPublicKey"
	// ReasonMeshConflict: a cluster declared with different allowedNetworks
	// in two ClusterMeshes (the earlier mesh wins).
	ReasonMeshConflict Reason = "ClusterMeshConflict"
	// ReasonUnsafeKubeconfig: a remote cluster's kubeconfig Secret carries
	// something other than inline credentials (an exec plugin, an auth
	// provider, a file path), or is not a kubeconfig; the cluster is not
	// connected (docs/security.md#kubeconfig).
	ReasonUnsafeKubeconfig Reason = "UnsafeKubeconfig"
	// ReasonInvalidCNIConfig: the CNI configuration list (kg's --cni-path)
	// cannot be read or is not one meshlet can write the pod CIDR into;
	// it is left as it is.
	ReasonInvalidCNIConfig Reason = "InvalidCNIConfig"
	// ReasonLimitExceeded: input over one of meshlet's bounds on hostile
	// input (a Peer's allowedIPs, a node's allowed-location-ips, the Peers
	// of a cluster, the Nodes of a remote cluster); the field or the flag is
	// named (docs/kilo-compatibility.md#limits).
	ReasonLimitExceeded Reason = "LimitExceeded"
	// ReasonTooBroad: a prefix broader than anyone may claim
	// (MinClaimBits4, MinClaimBits6; docs/security.md#claims).
	ReasonTooBroad Reason = "PrefixTooBroad"
	// ReasonDuplicatePrivateIP: a node's private IP is another node's
	// address, or overlaps what an earlier owner holds: it is not routed to
	// the node from other locations.
	ReasonDuplicatePrivateIP Reason = "DuplicatePrivateIP"
	// ReasonHostRoute: the host already routes a destination of the plan
	// (its default route, a connected network, a CNI's or DHCP's route):
	// meshlet leaves that route alone and does not install its own.
	ReasonHostRoute Reason = "HostRouteConflict"
	// ReasonSingleFamily: in a dual-stack mesh, a segment carries only
	// the first family, because its leader runs kg (Kilo plans one
	// family), or a node's address of the second family is refused.
	ReasonSingleFamily Reason = "SingleFamily"
	// ReasonNoPrivateIP: in cross granularity, a node that shares its
	// location with others has no private IP, over which they would reach
	// it: none of them routes to it.
	ReasonNoPrivateIP Reason = "NoPrivateIP"
)

// SessionObservation is one session under the half-dead rule (a peer with
// a SessionProbe) as the WireGuard device's watch last read it, and what
// was done to it: facts only, stamped with the agent's clock; the rule
// that judges them is the planner's (agent/core/sessions).
type SessionObservation struct {
	PublicKey Key
	// At is when the counters were read; Rx and Tx count since the peer
	// was (re)created; Handshake is its last one (zero: none).
	At        time.Time
	Rx, Tx    int64
	Handshake time.Time
	// UnansweredFrom is set while traffic has gone out and nothing come
	// back: the reading before the one that first saw it (the first
	// unanswered packet left after it), first seen at UnansweredSeen. Zero
	// once the peer answers, and when it is re-created.
	UnansweredFrom, UnansweredSeen time.Time
	// Probed is the reading on which the probe of the current unanswered
	// stretch was sent (zero: none): the rule's times count from what it
	// saw, not from the run of the loop that acted a moment later.
	Probed time.Time
	// Recreated is the reading on which the peer was last removed and added
	// back (zero: never), Unheard how many times since it was last heard
	// from, Retried whether that last re-creation was retried once.
	Recreated time.Time
	Unheard   int
	Retried   bool
}

// SessionActions is what to do about the sessions under the half-dead rule:
// probe a peer, re-create it (Recreate: the session is half-dead; Retry: its
// fresh handshake went unanswered), and when to judge again if nothing new
// happens on the wire (a probe's timeout, a retry's window; zero: never) —
// the device's watch wakes the loop at its first reading from then on.
type SessionActions struct {
	Probe    []Key     `json:"probe,omitempty"`
	Recreate []Key     `json:"recreate,omitempty"`
	Retry    []Key     `json:"retry,omitempty"`
	Recheck  time.Time `json:"recheck,omitzero"`
}
