// Package graph draws a mesh as Graphviz dot, in the spirit of `kgctl
// graph`: every cluster a box, every location (segment) a box inside it
// with its nodes, the leader first and bold with its WireGuard IP and
// endpoint, edges from each leader to its nodes, between the leaders of a
// cluster, to the cluster's Peers (dashed) and to the leaders of the remote
// clusters (bold). It is pure: it draws a plan and the snapshot it came
// from.
package graph

import (
	"net/netip"
	"sort"
	"strings"

	"github.com/awalterschulze/gographviz"

	"github.com/meshlet/meshlet/agent/core/topology"
)

// Dot draws the mesh as seen by a leader's plan: its cluster's segments and
// Peers, and the remote clusters it peers with. snap is the plan's input
// (node details for the labels).
func Dot(plan topology.Plan, snap topology.Snapshot) (string, error) {
	d := &drawing{g: gographviz.NewGraph(), nodes: map[string]topology.Node{}}
	for _, n := range snap.Nodes {
		d.nodes[key(plan.Cluster, n.Name)] = n
	}
	for _, rc := range snap.Remotes {
		for _, n := range rc.Nodes {
			d.nodes[key(rc.Name, n.Name)] = n
		}
	}
	if err := d.draw(plan); err != nil {
		return "", err
	}
	return d.g.String(), nil
}

type drawing struct {
	g     *gographviz.Graph
	nodes map[string]topology.Node // by key(cluster, name)
	err   error
}

func key(cluster, node string) string { return cluster + "/" + node }

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

func (d *drawing) check(err error) {
	if d.err == nil && err != nil {
		d.err = err
	}
}

func (d *drawing) draw(plan topology.Plan) error {
	const root = "mesh"
	d.g.Name = root
	d.check(d.g.SetDir(true))
	for k, v := range map[gographviz.Attr]string{gographviz.Label: quote(plan.Cluster), gographviz.LabelLOC: "t",
		gographviz.OutputOrder: "nodesfirst", gographviz.Overlap: "false", gographviz.Compound: "true"} {
		d.check(d.g.AddAttr(root, string(k), v))
	}
	local := d.cluster(root, plan.Cluster, plan.Segments)
	peers := d.peers(root, plan)
	for _, l := range local {
		for _, p := range peers {
			d.edge(l, p, map[gographviz.Attr]string{gographviz.Style: "dashed"})
		}
	}
	remotes := append([]topology.RemoteInfo(nil), plan.Remotes...)
	sort.Slice(remotes, func(i, j int) bool { return remotes[i].Cluster < remotes[j].Cluster })
	for _, r := range remotes {
		leaders := d.cluster(root, r.Cluster, r.Segments)
		for _, l := range local {
			for _, rl := range leaders {
				d.edge(l, rl, map[gographviz.Attr]string{gographviz.Style: "bold", gographviz.Color: "blue"})
			}
		}
	}
	return d.err
}

// cluster draws one cluster's segments and returns its leaders' node ids.
func (d *drawing) cluster(parent, name string, segs []topology.SegmentInfo) []string {
	sub := quote("cluster_" + name)
	if name == "" {
		sub = quote("cluster_local")
	}
	d.check(d.g.AddSubGraph(parent, sub, map[string]string{string(gographviz.Label): quote(orLocal(name)), string(gographviz.Style): "rounded"}))
	var leaders []string
	for _, s := range segs {
		loc := quote("cluster_" + name + "_" + s.Name)
		d.check(d.g.AddSubGraph(sub, loc, map[string]string{string(gographviz.Label): quote(s.Name), string(gographviz.Style): `"dashed,rounded"`}))
		// A segment with a second WireGuard IP carries both families
		// (docs/dual-stack.md): its nodes show their second addresses.
		dual := s.DualStackWireGuardIP.IsValid()
		leader := d.node(loc, name, s.Leader, []netip.Prefix{s.WireGuardIP, s.DualStackWireGuardIP}, true, dual)
		leaders = append(leaders, leader)
		for _, n := range s.Nodes {
			if n != s.Leader {
				d.edge(leader, d.node(loc, name, n, nil, false, dual), nil)
			}
		}
	}
	for i := range leaders {
		for j := i + 1; j < len(leaders); j++ {
			d.edge(leaders[i], leaders[j], nil)
		}
	}
	return leaders
}

func orLocal(name string) string {
	if name == "" {
		return "local cluster"
	}
	return name
}

// node adds a node with its label (name, pod CIDR, private IP, and for a
// leader its WireGuard IP and endpoint) and returns its id.
func (d *drawing) node(sub, cluster, name string, wgIPs []netip.Prefix, leader, dual bool) string {
	id := quote(key(cluster, name))
	label := []string{name}
	if n, ok := d.nodes[key(cluster, name)]; ok {
		for _, c := range n.PodCIDRs {
			label = append(label, c.String())
		}
		if dual && n.DualStackPodCIDR.IsValid() {
			label = append(label, n.DualStackPodCIDR.String())
		}
		if n.InternalIP.IsValid() {
			label = append(label, n.InternalIP.Addr().String())
		}
		if dual && n.DualStackInternalIP.IsValid() {
			label = append(label, n.DualStackInternalIP.Addr().String())
		}
		if leader && n.Endpoint != "" {
			label = append(label, n.Endpoint)
		}
	}
	attrs := map[string]string{string(gographviz.Shape): "ellipse"}
	if leader {
		for _, ip := range wgIPs {
			if ip.IsValid() {
				label = append(label, "wg "+ip.String())
			}
		}
		attrs[string(gographviz.Style)] = "bold"
		attrs[string(gographviz.Rank)] = "1"
	}
	attrs[string(gographviz.Label)] = quote(strings.Join(label, `\n`))
	d.check(d.g.AddNode(sub, id, attrs))
	return id
}

// peers draws the cluster's Kilo Peers (the plan's WireGuard peers of kind
// peer) and returns their ids.
func (d *drawing) peers(parent string, plan topology.Plan) []string {
	var ids []string
	sub := quote("cluster_peers")
	added := false
	for _, p := range plan.WireGuard.Peers {
		if p.Kind != topology.KindPeer {
			continue
		}
		if !added {
			d.check(d.g.AddSubGraph(parent, sub, map[string]string{string(gographviz.Label): quote("peers"), string(gographviz.Style): `"dashed,rounded"`}))
			added = true
		}
		id := quote("peer/" + p.Name)
		label := p.Name
		if p.Endpoint != "" {
			label += `\n` + p.Endpoint
		}
		d.check(d.g.AddNode(sub, id, map[string]string{string(gographviz.Shape): "box", string(gographviz.Label): quote(label)}))
		ids = append(ids, id)
	}
	return ids
}

// edge joins a and b both ways (WireGuard peers, or a leader and its node).
func (d *drawing) edge(a, b string, attrs map[gographviz.Attr]string) {
	as := map[string]string{string(gographviz.Dir): "both"}
	for k, v := range attrs {
		as[string(k)] = v
	}
	d.check(d.g.AddEdge(a, b, true, as))
}
