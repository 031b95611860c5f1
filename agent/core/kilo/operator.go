package kilo

import (
	"sort"
	"strings"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// OperatorLabelPrefix marks the Peers kilo-clustermesh-operator creates for
// the nodes of other clusters (docs/migration.md). meshlet peers with remote
// clusters itself, from the ClusterMesh, so such a Peer would only collide
// with meshlet's own remote peers (the same public keys: DuplicatePublicKey,
// or OwnKey for this cluster's nodes mirrored in a remote cluster).
const OperatorLabelPrefix = "kilo-clustermesh.io/"

// ReasonOperatorPeer is the rejection (and Event) reason of such a Peer.
const ReasonOperatorPeer topology.Reason = "ClusterMeshOperatorPeer"

// operatorLabels returns the operator's label keys on a Peer, sorted.
func operatorLabels(p *Peer) []string {
	var keys []string
	for k := range p.Labels {
		if strings.HasPrefix(k, OperatorLabelPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// operatorPeerRejection is the one rejection of an operator Peer: meshlet
// ignores it and says what to delete.
func operatorPeerRejection(p *Peer, ref topology.ObjectRef, keys []string) topology.Rejection {
	return topology.Rejection{Object: ref, Field: "metadata.labels[" + keys[0] + "]", Reason: ReasonOperatorPeer,
		Message: "made by kilo-clustermesh-operator for a node of another cluster; meshlet peers with remote clusters itself " +
			"(ClusterMesh), so this Peer is ignored. Once the operator is uninstalled, delete it: kubectl delete peers.kilo.squat.ai " +
			p.Name + " (all of them: kubectl delete peers.kilo.squat.ai -l " + keys[0] + ")"}
}

// keepOperatorLabels copies the operator's labels (and only those) from
// in to out, for TransformPeer.
func keepOperatorLabels(in, out *Peer) {
	for _, k := range operatorLabels(in) {
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		out.Labels[k] = in.Labels[k]
	}
}
