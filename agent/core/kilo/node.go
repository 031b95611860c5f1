package kilo

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// KindNode is the ObjectRef kind of rejections about Nodes.
const KindNode = "Node"

// NodeResult is a Node converted for the planner.
type NodeResult struct {
	Node topology.Node
	// Rejections lists the annotations and fields that were malformed. The
	// node still converts, with those fields empty (or with Kilo's default).
	Rejections []topology.Rejection
	// Created is the Node's creation time: the oldest Nodes of a remote
	// cluster over Limits.RemoteNodes are the ones planned.
	Created time.Time
}

// NodeToTopology converts a Node of cluster ("" = local) for the planner; see
// ConvertNode.
func NodeToTopology(node *corev1.Node, cluster string) (topology.Node, []topology.Rejection) {
	r := ConvertNode(node, cluster)
	return r.Node, r.Rejections
}

// ConvertNode converts a Node of cluster ("" = local) for the planner, with
// Kilo 0.7's semantics:
//   - Labels: all of them are kept (they are small, and the planner needs the
//     topology label and the Peers' nodeSelectors, which can name any label).
//   - Ready: the NodeReady condition, true when the node has none (Kilo does
//     not look at it; a node without conditions must not drop out).
//   - ExternalIPs: status.addresses of type ExternalIP, IPv4 first.
//   - PodCIDRs: spec.podCIDR (else the first of spec.podCIDRs), masked: Kilo
//     routes one pod CIDR per node, so a dual-stack node's second family is
//     not part of the mesh (docs/kilo-compatibility.md); DualStackPodCIDR
//     is the first of spec.podCIDRs of the other family, which only a
//     dual-stack mesh uses (docs/dual-stack.md).
//   - Endpoint: force-endpoint if valid, else endpoint (Kilo's fall-back);
//     ForceEndpoint and ClusterMeshEndpoint are kept separately for the
//     remote chain, and Node.MalformedEndpoint records a malformed one.
//   - InternalIP: force-internal-ip if valid ("" or "-" mean none and win
//     over internal-ip), else internal-ip.
//
// Every malformed annotation is one Rejection (Field = annotation key); a nil
// node converts to the zero Node. The default limits apply (see
// Limits.ConvertNode).
func ConvertNode(node *corev1.Node, cluster string) NodeResult {
	return DefaultLimits.ConvertNode(node, cluster)
}

// ConvertNode converts a Node as the function ConvertNode does, with an
// allowed-location-ips annotation of more than l.AllowedLocationIPs
// entries ignored (one Rejection, reason LimitExceeded).
func (l Limits) ConvertNode(node *corev1.Node, cluster string) NodeResult {
	var r NodeResult
	if node == nil {
		return r
	}
	ref := topology.ObjectRef{Kind: KindNode, Cluster: cluster, Name: node.Name}
	reject := func(field string, reason topology.Reason, err error) {
		r.Rejections = append(r.Rejections, topology.Rejection{Object: ref, Field: field, Reason: reason, Message: err.Error()})
	}
	a := node.Annotations
	n := &r.Node
	n.Name = node.Name
	r.Created = node.CreationTimestamp.Time
	n.Created = r.Created
	if len(node.Labels) > 0 {
		n.Labels = make(map[string]string, len(node.Labels))
		for k, v := range node.Labels {
			n.Labels[k] = v
		}
	}
	n.LocationAnnotation = a[topology.AnnotationLocation]
	n.MeshletVersion = a[topology.AnnotationVersion]
	var leader string
	leader, n.Leader = a[topology.AnnotationLeader]
	n.LeaderMark = n.Leader && leader == topology.LeaderLeaseValue
	n.Tunnels = a[topology.AnnotationTunnels]
	n.Degraded = a[topology.AnnotationDegraded]

	n.ExternalIPs = externalIPs(node, reject)
	n.ReportedIPs = reportedIPs(node)
	convertEndpoints(n, a, reject)
	n.InternalIP, n.InternalIPForced = internalIP(a, reject)

	var err error
	if n.PublicKey, err = ParseKeyAnnotation(a[topology.AnnotationKey]); err != nil {
		reject(topology.AnnotationKey, topology.ReasonInvalidKey, err)
	}
	if n.WireGuardIP, err = ParsePrefix(a[topology.AnnotationWireGuardIP]); err != nil {
		reject(topology.AnnotationWireGuardIP, topology.ReasonInvalidCIDR, err)
	}
	if n.DualStackInternalIP, err = ParsePrefix(a[topology.AnnotationDualStackInternalIP]); err != nil {
		reject(topology.AnnotationDualStackInternalIP, topology.ReasonInvalidCIDR, err)
	}
	if n.DualStackWireGuardIP, err = ParsePrefix(a[topology.AnnotationDualStackWireGuardIP]); err != nil {
		reject(topology.AnnotationDualStackWireGuardIP, topology.ReasonInvalidCIDR, err)
	}
	if n.CNICompatibilityIP, err = ParsePrefix(a[topology.AnnotationCNICompatibilityIP]); err != nil {
		reject(topology.AnnotationCNICompatibilityIP, topology.ReasonInvalidCIDR, err)
	}
	if n.LastSeen, err = ParseLastSeen(a[topology.AnnotationLastSeen]); err != nil {
		reject(topology.AnnotationLastSeen, topology.ReasonInvalidAnnotation, err)
	}
	// meshlet's marks count while meshlet wrote the node's last-seen; a
	// meshlet older than meshlet.io/seen leaves it out and is trusted.
	if s, ok := a[topology.AnnotationSeen]; ok && n.MeshletVersion != "" {
		if seen, err := ParseLastSeen(s); err != nil || n.LastSeen.After(seen) {
			n.MarksStale = true
			n.MeshletVersion, n.Tunnels, n.Degraded = "", "", ""
		}
	}
	if n.PersistentKeepalive, err = ParsePersistentKeepalive(a[topology.AnnotationPersistentKeepalive]); err != nil {
		reject(topology.AnnotationPersistentKeepalive, topology.ReasonInvalidAnnotation, err)
	}
	// Partial results are kept on purpose (Kilo drops only the bad entries).
	// Over the limit, counted in non-empty entries (what the watchers keep
	// of it: TransformNode), the annotation is not parsed.
	if _, over := firstEntries(a[topology.AnnotationAllowedLocationIPs], l.AllowedLocationIPs); l.AllowedLocationIPs > 0 && over {
		r.Rejections = append(r.Rejections, limitRejection(ref, topology.AnnotationAllowedLocationIPs, l.AllowedLocationIPs,
			"max-allowed-location-ips", "the annotation is ignored (the agents keep its last accepted value)"))
	} else if n.AllowedLocationIPs, err = ParseAllowedLocationIPs(a[topology.AnnotationAllowedLocationIPs]); err != nil {
		reject(topology.AnnotationAllowedLocationIPs, topology.ReasonInvalidCIDR, err)
	}
	if n.DiscoveredEndpoints, err = ParseDiscoveredEndpoints(a[topology.AnnotationDiscoveredEndpoints]); err != nil {
		reject(topology.AnnotationDiscoveredEndpoints, topology.ReasonInvalidEndpoint, err)
	}
	if n.Granularity, err = ParseGranularity(a[topology.AnnotationGranularity]); err != nil {
		reject(topology.AnnotationGranularity, topology.ReasonInvalidAnnotation, err)
	}

	n.PodCIDRs = podCIDRs(node, reject)
	n.DualStackPodCIDR = dualStackPodCIDR(node, n.PodCIDRs, reject)
	n.Ready = nodeReady(node)
	// Kilo's topology ignores both; only the Lease's holder reads them
	// (docs/failover.md#restart).
	switch {
	case node.DeletionTimestamp != nil:
		n.Leaving = topology.LeavingDeleting
	case node.Spec.Unschedulable:
		n.Leaving = topology.LeavingCordoned
	}
	return r
}

// rejectFunc records one malformed field.
type rejectFunc func(field string, reason topology.Reason, err error)

// convertEndpoints sets the endpoints: force-endpoint when valid, else
// endpoint (Kilo's fall-back); the remote chain's sources kept apart, and
// MalformedEndpoint when its first present source does not parse.
func convertEndpoints(n *topology.Node, a map[string]string, reject rejectFunc) {
	// parse records a rejection and reports whether the annotation was
	// present but malformed.
	parse := func(key string) (Endpoint, bool) {
		ep, err := ParseEndpoint(a[key])
		if err != nil {
			reject(key, topology.ReasonInvalidEndpoint, err)
			return Endpoint{}, true
		}
		return ep, false
	}
	cmEP, cmBad := parse(topology.AnnotationClusterMeshEndpoint)
	forceEP, forceBad := parse(topology.AnnotationForceEndpoint)
	ep, epBad := parse(topology.AnnotationEndpoint)
	n.ClusterMeshEndpoint = cmEP.String()
	n.ForceEndpoint = forceEP.String()
	n.Endpoint = ep.String()
	if !forceEP.IsZero() {
		n.Endpoint = forceEP.String()
	}
	// Walk the remote chain to its first present source.
	switch {
	case a[topology.AnnotationClusterMeshEndpoint] != "":
		n.MalformedEndpoint = cmBad
	case a[topology.AnnotationForceEndpoint] != "":
		n.MalformedEndpoint = forceBad
	case len(n.ExternalIPs) > 0:
	default:
		n.MalformedEndpoint = epBad
	}
}

// internalIP is force-internal-ip when valid ("" or "-" mean none and win
// over internal-ip; forced), else internal-ip.
func internalIP(a map[string]string, reject rejectFunc) (netip.Prefix, bool) {
	internal, err := ParsePrefix(a[topology.AnnotationInternalIP])
	if err != nil {
		reject(topology.AnnotationInternalIP, topology.ReasonInvalidCIDR, err)
	}
	if s, ok := a[topology.AnnotationForceInternalIP]; ok {
		p, none, err := ParseForceInternalIP(s)
		switch {
		case err != nil:
			reject(topology.AnnotationForceInternalIP, topology.ReasonInvalidCIDR, err)
		case none:
			return netip.Prefix{}, true
		default:
			return p, true
		}
	}
	return internal, false
}

// externalIPs returns the node's ExternalIP addresses, IPv4 first (stable
// within a family), without duplicates.
func externalIPs(node *corev1.Node, reject rejectFunc) []netip.Addr {
	var v4, v6 []netip.Addr
	for _, addr := range node.Status.Addresses {
		if addr.Type != corev1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(addr.Address)
		if err != nil || ip.Zone() != "" {
			reject("status.addresses", topology.ReasonInvalidEndpoint, fmt.Errorf("invalid ExternalIP %s", quote(addr.Address)))
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() {
			if !slices.Contains(v4, ip) {
				v4 = append(v4, ip)
			}
		} else if !slices.Contains(v6, ip) {
			v6 = append(v6, ip)
		}
	}
	return append(v4, v6...)
}

// reportedIPs are the node's addresses in status.addresses (InternalIP and
// ExternalIP; malformed ones are left out, externalIPs reports those): no
// other node may take one as its private IP (docs/security.md#claims).
func reportedIPs(node *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, addr := range node.Status.Addresses {
		if addr.Type != corev1.NodeInternalIP && addr.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(addr.Address); err == nil && ip.Zone() == "" && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// podCIDRs returns the node's pod CIDR as Kilo reads it: spec.podCIDR, which
// the API server keeps equal to spec.podCIDRs[0]; the first of spec.podCIDRs
// when only that is set.
func podCIDRs(node *corev1.Node, reject rejectFunc) []netip.Prefix {
	field, s := "spec.podCIDR", node.Spec.PodCIDR
	if s == "" && len(node.Spec.PodCIDRs) > 0 {
		field, s = "spec.podCIDRs", node.Spec.PodCIDRs[0]
	}
	if s == "" {
		return nil
	}
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		reject(field, topology.ReasonInvalidCIDR, fmt.Errorf("invalid pod CIDR %s: %w", quote(s), err))
		return nil
	}
	return []netip.Prefix{p.Masked()}
}

// dualStackPodCIDR is the first of spec.podCIDRs of the other family than
// the node's pod CIDR (Kilo's); zero when there is none.
func dualStackPodCIDR(node *corev1.Node, first []netip.Prefix, reject rejectFunc) netip.Prefix {
	if len(first) == 0 {
		return netip.Prefix{}
	}
	for _, s := range node.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			reject("spec.podCIDRs", topology.ReasonInvalidCIDR, fmt.Errorf("invalid pod CIDR %s: %w", quote(s), err))
			return netip.Prefix{}
		}
		if p.Addr().Is4() != first[0].Addr().Is4() {
			return p.Masked()
		}
	}
	return netip.Prefix{}
}

// nodeReady reports the NodeReady condition; true when absent.
func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return true
}

// NodeAnnotations formats the Kilo annotations that describe n, the inverse
// of ConvertNode for the annotation fields: ConvertNode of a Node carrying
// them gives back n's annotation fields. Zero fields are left out. It is what
// tests and `meshlet plan` fixtures use to build Nodes.
func NodeAnnotations(n topology.Node) map[string]string {
	a := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			a[k] = v
		}
	}
	set(topology.AnnotationLocation, n.LocationAnnotation)
	if n.Leader {
		a[topology.AnnotationLeader] = ""
		if n.LeaderMark {
			a[topology.AnnotationLeader] = topology.LeaderLeaseValue
		}
	}
	set(topology.AnnotationTunnels, n.Tunnels)
	set(topology.AnnotationDegraded, n.Degraded)
	set(topology.AnnotationEndpoint, n.Endpoint)
	set(topology.AnnotationForceEndpoint, n.ForceEndpoint)
	set(topology.AnnotationClusterMeshEndpoint, n.ClusterMeshEndpoint)
	set(topology.AnnotationInternalIP, topology.FormatPrefix(n.InternalIP))
	set(topology.AnnotationKey, FormatKey(n.PublicKey))
	set(topology.AnnotationWireGuardIP, topology.FormatPrefix(n.WireGuardIP))
	set(topology.AnnotationCNICompatibilityIP, topology.FormatPrefix(n.CNICompatibilityIP))
	set(topology.AnnotationDualStackInternalIP, topology.FormatPrefix(n.DualStackInternalIP))
	set(topology.AnnotationDualStackWireGuardIP, topology.FormatPrefix(n.DualStackWireGuardIP))
	if !n.LastSeen.IsZero() {
		a[topology.AnnotationLastSeen] = topology.FormatLastSeen(n.LastSeen)
	}
	if n.PersistentKeepalive != 0 {
		a[topology.AnnotationPersistentKeepalive] = FormatPersistentKeepalive(n.PersistentKeepalive)
	}
	if len(n.AllowedLocationIPs) > 0 {
		a[topology.AnnotationAllowedLocationIPs] = topology.FormatAllowedLocationIPs(n.AllowedLocationIPs)
	}
	if len(n.DiscoveredEndpoints) > 0 {
		a[topology.AnnotationDiscoveredEndpoints] = topology.FormatDiscoveredEndpoints(n.DiscoveredEndpoints)
	}
	set(topology.AnnotationGranularity, string(n.Granularity))
	set(topology.AnnotationVersion, n.MeshletVersion)
	return a
}
