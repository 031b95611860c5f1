package cluster

import (
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshlet/meshlet/agent/kilo"
	"github.com/meshlet/meshlet/agent/topology"
)

// objects holds one cluster's Nodes and Peers converted for the planner.
// Objects are converted once, when they change, so a snapshot costs a copy
// rather than a conversion of every object. The caller locks.
type objects struct {
	cluster string // "" = local
	nodes   map[string]kilo.NodeResult
	peers   map[string]convertedPeer
}

type convertedPeer struct {
	peer       topology.Peer
	ok         bool
	rejections []topology.Rejection
}

func newObjects(cluster string) objects {
	return objects{cluster: cluster, nodes: map[string]kilo.NodeResult{}, peers: map[string]convertedPeer{}}
}

func (o *objects) setNode(n *corev1.Node, deleted bool) {
	if deleted {
		delete(o.nodes, n.Name)
		return
	}
	o.nodes[n.Name] = kilo.ConvertNode(n, o.cluster)
}

func (o *objects) setPeer(p *kilo.Peer, deleted bool) {
	if deleted {
		delete(o.peers, p.Name)
		return
	}
	tp, rejs, ok := kilo.PeerToTopology(p, o.cluster)
	o.peers[p.Name] = convertedPeer{peer: tp, ok: ok, rejections: rejs}
}

// retain drops the objects not named in keep (after a relist).
func retain[V any](m map[string]V, keep []string) {
	have := make(map[string]bool, len(keep))
	for _, k := range keep {
		have[k] = true
	}
	for k := range m {
		if !have[k] {
			delete(m, k)
		}
	}
}

// state returns the converted objects sorted by name, and the rejections
// met while converting them.
func (o *objects) state() ([]topology.Node, []topology.Peer, []topology.Rejection) {
	nodes := make([]topology.Node, 0, len(o.nodes))
	var rejs []topology.Rejection
	for _, name := range sortedKeys(o.nodes) {
		r := o.nodes[name]
		nodes = append(nodes, r.Node)
		rejs = append(rejs, r.Rejections...)
	}
	var peers []topology.Peer
	for _, name := range sortedKeys(o.peers) {
		p := o.peers[name]
		if p.ok {
			peers = append(peers, p.peer)
		}
		rejs = append(rejs, p.rejections...)
	}
	return nodes, peers, rejs
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
