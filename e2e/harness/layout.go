package harness

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/meshlet/meshlet/agent/core/topology"
	"sync"
	"time"
)

// ClusterLayout is a cluster and its nodes.
type ClusterLayout struct {
	ClusterSpec
	Nodes []NodeSpec
}

// Layout is a whole mesh: clusters, their nodes, one ClusterMesh.
type Layout struct {
	Mesh     string // ClusterMesh name (default "mesh")
	NoMesh   bool   // no ClusterMesh at all (single-cluster scenarios)
	Clusters []ClusterLayout
}

// TwoByTwo is the standard mesh: two clusters, two locations each, two
// nodes per location (the first node of a location, by name, leads it).
func TwoByTwo() Layout {
	mk := func(name, pod, wg string, locs ...string) ClusterLayout {
		cl := ClusterLayout{ClusterSpec: ClusterSpec{Name: "cluster-" + name,
			PodNet: netip.MustParsePrefix(pod), WGSubnet: netip.MustParsePrefix(wg)}}
		for _, l := range locs {
			for i := 1; i <= 2; i++ {
				cl.Nodes = append(cl.Nodes, NodeSpec{Name: fmt.Sprintf("%s-%s%d", name, l, i), Location: l})
			}
		}
		return cl
	}
	return Layout{Clusters: []ClusterLayout{
		mk("a", "10.1.0.0/16", "100.66.0.0/24", "x", "y"),
		mk("b", "10.2.0.0/16", "100.66.1.0/24", "z", "w"),
	}}
}

// DualStack is a dual-stack mesh (docs/dual-stack.md): cluster-a with
// locations x (two nodes) and y (one), cluster-b with location z (two
// nodes); IPv4 and IPv6 pod CIDRs and underlay addresses on every node.
func DualStack() Layout {
	mk := func(name string, n int, locs map[string]int) ClusterLayout {
		cl := ClusterLayout{ClusterSpec: ClusterSpec{Name: "cluster-" + name,
			PodNet: netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", n)), WGSubnet: netip.MustParsePrefix(fmt.Sprintf("100.66.%d.0/24", n-1)),
			PodNet6: netip.MustParsePrefix(fmt.Sprintf("fd10:%d::/48", n)), WGSubnet6: netip.MustParsePrefix(fmt.Sprintf("fd4b:%d::/64", n))}}
		for _, l := range []string{"w", "x", "y", "z"} {
			for i := 1; i <= locs[l]; i++ {
				cl.Nodes = append(cl.Nodes, NodeSpec{Name: fmt.Sprintf("%s-%s%d", name, l, i), Location: l})
			}
		}
		return cl
	}
	return Layout{Clusters: []ClusterLayout{mk("a", 1, map[string]int{"x": 2, "y": 1}), mk("b", 2, map[string]int{"z": 2})}}
}

// IPv6Only is DualStack's mesh with no IPv4 anywhere
// (docs/dual-stack.md#ipv6-only): IPv6 pod CIDRs, underlay addresses,
// endpoints and mesh subnets.
func IPv6Only() Layout {
	l := DualStack()
	for i := range l.Clusters {
		cs := &l.Clusters[i].ClusterSpec
		cs.PodNet, cs.WGSubnet = cs.PodNet6, cs.WGSubnet6
		cs.PodNet6, cs.WGSubnet6 = netip.Prefix{}, netip.Prefix{}
	}
	return l
}

// Build creates the clusters, the ClusterMesh with its Secrets, every node,
// and then starts meshlet everywhere and waits until all are ready.
func (e *Env) Build(ctx context.Context, l Layout) error {
	if l.Mesh == "" {
		l.Mesh = "mesh"
	}
	var clusters []*Cluster
	for _, cl := range l.Clusters {
		c, err := e.AddCluster(ctx, cl.ClusterSpec)
		if err != nil {
			return err
		}
		clusters = append(clusters, c)
	}
	if !l.NoMesh {
		if err := e.ApplyMesh(ctx, l.Mesh, clusters...); err != nil {
			return err
		}
	}
	var nodes []*Node
	for i, cl := range l.Clusters {
		for _, ns := range cl.Nodes {
			n, err := clusters[i].AddNode(ctx, ns)
			if err != nil {
				return err
			}
			nodes = append(nodes, n)
		}
	}
	if err := StartAll(ctx, nodes...); err != nil {
		return err
	}
	return e.WaitConverged(ctx, 60*time.Second)
}

// StartAll starts meshlet on nodes and waits for all of them.
func StartAll(ctx context.Context, nodes ...*Node) error {
	for _, n := range nodes {
		if err := n.start(); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.WaitReady(ctx, 90*time.Second)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Cluster returns the cluster called name, or nil.
func (e *Env) Cluster(name string) *Cluster {
	for _, c := range e.Clusters() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// WaitConverged waits until the mesh agrees with itself: in every location
// exactly one node publishes a wireguard-ip and reports meshlet_leader 1,
// and every leader's device has one peer per other leader of the mesh.
// Right after start every node briefly leads (it sees no other Ready node
// yet), so tests and the demo wait for this before looking.
func (e *Env) WaitConverged(ctx context.Context, timeout time.Duration) error {
	return Poll(ctx, timeout, 200*time.Millisecond, "mesh converged", func() (bool, error) {
		leaders := map[string]*Node{}
		var running int
		for _, n := range e.Nodes() {
			if !n.Running() {
				continue
			}
			running++
			ann, err := n.Cluster.Annotations(ctx, n.Name)
			if err != nil {
				return false, err
			}
			m, err := n.Metrics(ctx)
			if err != nil {
				return false, err
			}
			isLeader, _ := m.Value("meshlet_leader")
			hasIP := ann[topology.AnnotationWireGuardIP] != ""
			if hasIP != (isLeader == 1) {
				return false, fmt.Errorf("%s: wireguard-ip %q but meshlet_leader %v", n.Name, ann[topology.AnnotationWireGuardIP], isLeader)
			}
			if !hasIP {
				continue
			}
			k := n.Cluster.Name + "/" + n.Location
			if o := leaders[k]; o != nil {
				return false, fmt.Errorf("%s has two leaders: %s and %s", k, o.Name, n.Name)
			}
			leaders[k] = n
		}
		for _, l := range leaders {
			dev, err := l.Device()
			if err != nil || dev == nil {
				return false, fmt.Errorf("%s: device: %v", l.Name, err)
			}
			if len(dev.Peers) != len(leaders)-1 {
				return false, fmt.Errorf("%s has %d peers, want %d", l.Name, len(dev.Peers), len(leaders)-1)
			}
		}
		return running > 0, nil
	})
}

// OneCluster is cluster-a of Small alone, without a ClusterMesh: one
// location x of aNodes nodes.
func OneCluster(aNodes int) Layout {
	l := Small(aNodes)
	l.NoMesh = true
	l.Clusters = l.Clusters[:1]
	return l
}

// Small is a quick mesh for the focused scenarios: cluster-a with one
// location of aNodes nodes, cluster-b with one node in each of bLocs
// locations.
func Small(aNodes int, bLocs ...string) Layout {
	l := Layout{Clusters: []ClusterLayout{
		{ClusterSpec: ClusterSpec{Name: "cluster-a", PodNet: netip.MustParsePrefix("10.1.0.0/16"),
			WGSubnet: netip.MustParsePrefix("100.66.0.0/24")}},
		{ClusterSpec: ClusterSpec{Name: "cluster-b", PodNet: netip.MustParsePrefix("10.2.0.0/16"),
			WGSubnet: netip.MustParsePrefix("100.66.1.0/24")}},
	}}
	for i := 1; i <= aNodes; i++ {
		l.Clusters[0].Nodes = append(l.Clusters[0].Nodes, NodeSpec{Name: fmt.Sprintf("a-x%d", i), Location: "x"})
	}
	for _, loc := range bLocs {
		l.Clusters[1].Nodes = append(l.Clusters[1].Nodes, NodeSpec{Name: "b-" + loc + "1", Location: loc})
	}
	return l
}
