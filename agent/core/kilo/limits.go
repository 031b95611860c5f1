package kilo

import (
	"fmt"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Limits bound what one object or one cluster brings into the plan, so that
// hostile input has a bounded cost (docs/security.md#hostile-input). Kilo
// has none of them: each is a deviation (docs/kilo-compatibility.md#limits).
// Zero means no limit, Kilo's behaviour.
type Limits struct {
	// PeerAllowedIPs: entries of one Peer's spec.allowedIPs; a Peer with
	// more is rejected (--max-peer-allowed-ips).
	PeerAllowedIPs int
	// AllowedLocationIPs: prefixes of one node's allowed-location-ips; an
	// annotation with more is ignored (--max-allowed-location-ips).
	AllowedLocationIPs int
	// Peers: Peers of one cluster (the local one, each remote one); the
	// oldest are planned, the others left out (--max-peers).
	Peers int
	// RemoteNodes: Nodes of one remote cluster; the oldest are planned,
	// the others left out (--max-remote-nodes).
	RemoteNodes int
}

// DefaultLimits are the agent's defaults, far above what a Kilo mesh uses:
// a Peer routes a handful of CIDRs, a location a few networks, a cluster has
// tens to hundreds of Peers, and Kubernetes supports clusters of up to
// 5,000 nodes.
var DefaultLimits = Limits{PeerAllowedIPs: 1000, AllowedLocationIPs: 1000, Peers: 10000, RemoteNodes: 5000}

// maxListed is how many problems of one field a rejection lists: a hostile
// object may have thousands, and each rejection becomes an Event.
const maxListed = 10

// limitRejection is one object over a per-object limit (the watchers keep
// only the first limit+1 entries of such an object: no exact count).
func limitRejection(ref topology.ObjectRef, field string, limit int, flag, effect string) topology.Rejection {
	return topology.Rejection{Object: ref, Field: field, Reason: topology.ReasonLimitExceeded,
		Message: fmt.Sprintf("more than %d entries (--%s): %s", limit, flag, effect)}
}
