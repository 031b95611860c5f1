package cluster

import (
	"reflect"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
)

// objects holds one cluster's Nodes and Peers converted for the planner.
// Objects are converted once, when they change, so a snapshot costs a copy
// rather than a conversion of every object. The caller locks.
type objects struct {
	cluster string // "" = local
	limits  kilo.Limits
	nodes   map[string]kilo.NodeResult
	peers   map[string]convertedPeer
	// skews holds, per remote node, its last-seen minus the time this
	// agent saw it change (the remote clock's offset from this one, less
	// the watch's delay and last-seen's rounding down to the second).
	skews map[string]time.Duration
}

type convertedPeer struct {
	peer       topology.Peer
	ok         bool
	rejections []topology.Rejection
	created    time.Time // the oldest Peers are kept over limits.Peers
}

func newObjects(cluster string, limits kilo.Limits) objects {
	return objects{cluster: cluster, limits: limits, nodes: map[string]kilo.NodeResult{}, peers: map[string]convertedPeer{}, skews: map[string]time.Duration{}}
}

// setNode stores a Node and reports whether the planner could see a
// difference. Every agent refreshes its last-seen every ~30 s, so with
// 10,000 remote Nodes most events change nothing else; those do not wake the
// loop. A last-seen that was old enough for the node to have dropped out of
// the mesh does wake it (the node is back); a node going stale is noticed at
// the moment it does (planner.NextChange).
//
// A remote node also records when this agent heard its last-seen change
// (topology.Node.Heard), by which the planner judges it with the remote
// cluster's own clock (docs/clustermesh.md#liveness).
func (o *objects) setNode(n *corev1.Node, deleted bool, now time.Time) bool {
	if deleted {
		delete(o.nodes, n.Name)
		delete(o.skews, n.Name)
		return true
	}
	r := o.limits.ConvertNode(n, o.cluster)
	old, ok := o.nodes[n.Name]
	if ok && overLimit(r.Rejections, topology.AnnotationAllowedLocationIPs) {
		// As for a Peer: an edit over the limit keeps the last accepted
		// value in force while the rejection is reported.
		r.Node.AllowedLocationIPs = old.Node.AllowedLocationIPs
	}
	last := old.Node.LastSeen
	if o.cluster != "" {
		switch {
		case !ok:
			r.Node.Heard = now
		case !r.Node.LastSeen.Equal(old.Node.LastSeen):
			r.Node.Heard, r.Node.HeardChange = now, true
			o.skews[n.Name] = r.Node.LastSeen.Sub(now)
		default:
			r.Node.Heard, r.Node.HeardChange = old.Node.Heard, old.Node.HeardChange
		}
		last = old.Node.Heard
	}
	o.nodes[n.Name] = r
	if !ok || now.Sub(last) > topology.HeardRefresh {
		return true
	}
	a, b := old, r
	a.Node.LastSeen, b.Node.LastSeen = time.Time{}, time.Time{}
	a.Node.Heard, b.Node.Heard = time.Time{}, time.Time{}
	a.Node.HeardChange, b.Node.HeardChange = false, false
	return !reflect.DeepEqual(a, b)
}

// clockSkew is the remote cluster's clock minus this agent's, as the
// median of its nodes' latest samples (robust to a few nodes with wrong
// clocks); false before any last-seen change was heard.
func (o *objects) clockSkew() (time.Duration, bool) {
	if len(o.skews) == 0 {
		return 0, false
	}
	s := make([]time.Duration, 0, len(o.skews))
	for _, d := range o.skews {
		s = append(s, d)
	}
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], true
}

func (o *objects) setPeer(p *kilo.Peer, deleted bool) {
	if deleted {
		delete(o.peers, p.Name)
		return
	}
	tp, rejs, ok := o.limits.PeerToTopology(p, o.cluster)
	created := p.CreationTimestamp.Time
	if old, had := o.peers[p.Name]; !ok && had && old.ok {
		// An edit that fails validation keeps the last valid version in
		// force (its session too) while the rejection is reported.
		o.peers[p.Name] = convertedPeer{peer: old.peer, ok: true, rejections: rejs, created: created}
		return
	}
	o.peers[p.Name] = convertedPeer{peer: tp, ok: ok, rejections: rejs, created: created}
}

// overLimit reports whether rejs reject field for a limit.
func overLimit(rejs []topology.Rejection, field string) bool {
	for _, r := range rejs {
		if r.Reason == topology.ReasonLimitExceeded && r.Field == field {
			return true
		}
	}
	return false
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

// state returns the converted objects sorted by name, within the count
// limits, and the rejections met while converting them.
func (o *objects) state() ([]topology.Node, []topology.Peer, []topology.Rejection) {
	all := make([]kilo.NodeResult, 0, len(o.nodes))
	for _, name := range sortedKeys(o.nodes) {
		all = append(all, o.nodes[name])
	}
	// A remote cluster's nodes over the limit are left out with their own
	// rejections: one rejection says it for all of them.
	all, rejs := limitNodes(o.cluster, o.limits, all)
	nodes := make([]topology.Node, 0, len(all))
	for _, r := range all {
		nodes = append(nodes, r.Node)
		rejs = append(rejs, r.Rejections...)
	}
	var valid []convertedPeer
	for _, name := range sortedKeys(o.peers) {
		p := o.peers[name]
		if p.ok {
			valid = append(valid, p)
		}
		rejs = append(rejs, p.rejections...)
	}
	valid, r := limitPeers(o.cluster, o.limits, valid)
	rejs = append(rejs, r...)
	var peers []topology.Peer
	for _, p := range valid {
		peers = append(peers, p.peer)
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
