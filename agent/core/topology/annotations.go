package topology

import (
	"encoding/json"
	"net/netip"
	"sort"
	"strconv"
	"time"
)

// Kilo's annotation keys (kilo.squat.ai/...), plus the multi-cluster and
// meshlet ones. Parsing lives in agent/core/kilo; formatting lives here because
// the planner decides what this node publishes.
const (
	AnnotationPrefix = "kilo.squat.ai/"

	// Set by users.
	AnnotationLocation            = AnnotationPrefix + "location"
	AnnotationLeader              = AnnotationPrefix + "leader"
	AnnotationForceEndpoint       = AnnotationPrefix + "force-endpoint"
	AnnotationForceInternalIP     = AnnotationPrefix + "force-internal-ip"
	AnnotationPersistentKeepalive = AnnotationPrefix + "persistent-keepalive"
	AnnotationAllowedLocationIPs  = AnnotationPrefix + "allowed-location-ips"

	// Written by the node agent.
	AnnotationEndpoint            = AnnotationPrefix + "endpoint"
	AnnotationInternalIP          = AnnotationPrefix + "internal-ip"
	AnnotationKey                 = AnnotationPrefix + "key"
	AnnotationLastSeen            = AnnotationPrefix + "last-seen"
	AnnotationWireGuardIP         = AnnotationPrefix + "wireguard-ip"
	AnnotationDiscoveredEndpoints = AnnotationPrefix + "discovered-endpoints"
	AnnotationGranularity         = AnnotationPrefix + "granularity"
	AnnotationCNICompatibilityIP  = AnnotationPrefix + "cni-compatibility-ip"

	// kilo-clustermesh-operator: highest-priority endpoint for other clusters.
	AnnotationClusterMeshEndpoint = AnnotationPrefix + "clustermesh-endpoint"

	// meshlet's per-node keepalive rules on a Peer object.
	AnnotationNodePersistentKeepalive = "meshlet.io/node-persistent-keepalive"
	// AnnotationVersion marks a node run by meshlet (its version); a node
	// without it is run by kg (docs/kilo-compatibility.md#mixed).
	AnnotationVersion = "meshlet.io/version"
	// AnnotationTunnels: a leader's probes of its tunnels (TunnelsUp,
	// TunnelsDown), so other leaders can tell a cut-off leader from a
	// broken mesh (docs/failover.md#health).
	AnnotationTunnels = "meshlet.io/tunnels"
	// AnnotationDegraded: why a node may not lead now (a Reason*), "" when
	// it may.
	AnnotationDegraded = "meshlet.io/degraded"
	// AnnotationSeen is the last-seen meshlet wrote, written with it: a
	// node whose last-seen is newer was refreshed by someone else (kg took
	// the node back), so meshlet's marks on it are stale and it runs kg
	// (docs/kilo-compatibility.md#mixed).
	AnnotationSeen = "meshlet.io/seen"

	// AnnotationDualStackInternalIP and AnnotationDualStackWireGuardIP are
	// a node's private IP and (on a leader) WireGuard IP of the dual-stack
	// subnet's family, in the formats of Kilo's internal-ip and
	// wireguard-ip; written only in a dual-stack mesh (docs/dual-stack.md).
	// kg and kgctl read no meshlet.io/ annotation.
	AnnotationDualStackInternalIP  = "meshlet.io/dual-stack-internal-ip"
	AnnotationDualStackWireGuardIP = "meshlet.io/dual-stack-wireguard-ip"

	// LeaderLeaseValue is the value of the leader annotation meshlet writes
	// on the holder of a location's Lease; Kilo looks only at the
	// annotation's presence, so kg and kgctl follow it, and any other value
	// is a user's, which meshlet never touches (docs/failover.md#marks).
	LeaderLeaseValue = "meshlet.io/lease"
)

// Values of meshlet.io/tunnels.
const (
	TunnelsUp   = "up"   // at least one probed tunnel answers
	TunnelsDown = "down" // every probed tunnel is dead
)

// DiscoveredEndpoint is one value of the discovered-endpoints annotation; the
// field names are those of Go's net.UDPAddr, which Kilo marshals.
type DiscoveredEndpoint struct {
	IP   string `json:"IP"`
	Port int    `json:"Port"`
	Zone string `json:"Zone"`
}

// FormatPrefix formats a CIDR annotation value; the zero prefix is "".
func FormatPrefix(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// FormatLastSeen formats the last-seen annotation (unix seconds).
func FormatLastSeen(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// FormatDiscoveredEndpoints formats the discovered-endpoints annotation as
// Kilo does (JSON object keyed by base64 public key). Keys are sorted by
// encoding/json, so the output is deterministic.
func FormatDiscoveredEndpoints(m map[Key]netip.AddrPort) string {
	out := make(map[string]DiscoveredEndpoint, len(m))
	for k, ap := range m {
		if !ap.IsValid() {
			continue
		}
		out[k.String()] = DiscoveredEndpoint{IP: ap.Addr().WithZone("").String(), Port: int(ap.Port()), Zone: ap.Addr().Zone()}
	}
	b, _ := json.Marshal(out) // map[string]struct of strings and ints cannot fail
	return string(b)
}

// FormatAllowedLocationIPs formats the allowed-location-ips annotation.
func FormatAllowedLocationIPs(ps []netip.Prefix) string {
	s := make([]string, 0, len(ps))
	for _, p := range ps {
		s = append(s, p.String())
	}
	sort.Strings(s)
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}
