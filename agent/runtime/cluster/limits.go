package cluster

import (
	"fmt"
	"sort"
	"time"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// Count limits (kilo.Limits.Peers, RemoteNodes): a cluster over one keeps
// its oldest objects in the plan — by creation time, which the API server
// sets and nobody can forge, then name — and leaves the rest out with one
// rejection. Objects created later cannot push out the ones that work, and
// every agent picks the same ones. The limits are per cluster, so a remote
// cluster over its limit takes nothing from the local one or from another
// remote cluster (docs/security.md#hostile-input).

// aged is one object's name and creation time.
type aged struct {
	name    string
	created time.Time
}

// leftOut returns, when there are more than limit objects (limit > 0), the
// names of all but the limit oldest, and the oldest of those left out.
func leftOut(objs []aged, limit int) (map[string]bool, string) {
	if limit <= 0 || len(objs) <= limit {
		return nil, ""
	}
	s := append([]aged(nil), objs...)
	sort.Slice(s, func(i, j int) bool {
		if !s[i].created.Equal(s[j].created) {
			return s[i].created.Before(s[j].created)
		}
		return s[i].name < s[j].name
	})
	out := make(map[string]bool, len(s)-limit)
	for _, o := range s[limit:] {
		out[o.name] = true
	}
	return out, s[limit].name
}

// countRejection is the one rejection of a cluster over a count limit, on
// the oldest object left out. Its text has no count, so a cluster that keeps
// growing does not write a new Event at every change (meshlet status shows
// the counts).
func countRejection(kind, cluster, first string, limit int, flag string) topology.Rejection {
	where := "the local cluster"
	if cluster != "" {
		where = "remote cluster " + cluster
	}
	return topology.Rejection{Object: topology.ObjectRef{Kind: kind, Cluster: cluster, Name: first}, Reason: topology.ReasonLimitExceeded,
		Message: fmt.Sprintf("%s has more than %d %ss (--%s): the %d oldest are meshed; this %s and those created after it are not",
			where, limit, kind, flag, limit, kind)}
}

// isCountRejection reports whether r is a cluster over a count limit.
func isCountRejection(r topology.Rejection) bool {
	return r.Reason == topology.ReasonLimitExceeded && r.Field == ""
}

// limitNodes applies limits.RemoteNodes to a remote cluster's nodes
// (sorted by name; local nodes are never limited).
func limitNodes(cluster string, limits kilo.Limits, nodes []kilo.NodeResult) ([]kilo.NodeResult, []topology.Rejection) {
	if cluster == "" || limits.RemoteNodes <= 0 || len(nodes) <= limits.RemoteNodes {
		return nodes, nil
	}
	objs := make([]aged, len(nodes))
	for i, n := range nodes {
		objs[i] = aged{n.Node.Name, n.Created}
	}
	out, first := leftOut(objs, limits.RemoteNodes)
	kept := make([]kilo.NodeResult, 0, limits.RemoteNodes)
	for _, n := range nodes {
		if !out[n.Node.Name] {
			kept = append(kept, n)
		}
	}
	return kept, []topology.Rejection{countRejection(kilo.KindNode, cluster, first, limits.RemoteNodes, "max-remote-nodes")}
}

// limitPeers applies limits.Peers to a cluster's valid Peers (sorted by
// name).
func limitPeers(cluster string, limits kilo.Limits, peers []convertedPeer) ([]convertedPeer, []topology.Rejection) {
	if limits.Peers <= 0 || len(peers) <= limits.Peers {
		return peers, nil
	}
	objs := make([]aged, len(peers))
	for i, p := range peers {
		objs[i] = aged{p.peer.Name, p.created}
	}
	out, first := leftOut(objs, limits.Peers)
	kept := make([]convertedPeer, 0, limits.Peers)
	for _, p := range peers {
		if !out[p.peer.Name] {
			kept = append(kept, p)
		}
	}
	return kept, []topology.Rejection{countRejection(kilo.KindPeer, cluster, first, limits.Peers, "max-peers")}
}
