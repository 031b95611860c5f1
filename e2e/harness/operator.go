package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/agent/core/clustermesh"
	"github.com/meshlet/meshlet/agent/core/kilo"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/wg"
)

// A mesh of kilo-clustermesh-operator, for the move to meshlet
// (docs/migration.md#operator): the operator's Peers, labelled, one per node
// of every other cluster, which kg configures as any other Peer and meshlet
// ignores with a rejection (agent/core/kilo/operator.go); its CRD
// (manifests/testdata/kilo-clustermesh-operator); and kg on every node.

// The labels the operator puts on every Peer it writes.
const (
	OperatorLabelMesh          = "kilo-clustermesh.io/mesh"
	OperatorLabelSourceCluster = "kilo-clustermesh.io/source-cluster"
)

// OperatorEntry is what the operator reads of one cluster's entry in its
// ClusterMesh to write that cluster's nodes as Peers elsewhere.
type OperatorEntry struct {
	Name string
	// PodCIDRs: a node whose first pod CIDR is outside them is skipped.
	PodCIDRs []netip.Prefix
	// Networks are all of the entry's networks (podCIDRs, wireguardCIDR,
	// serviceCIDR, additionalCIDRs).
	Networks            []netip.Prefix
	WireguardPort       int
	PersistentKeepalive int
}

// OperatorPeerName is the name the operator gives the Peer of node of
// cluster src in mesh.
func OperatorPeerName(mesh, src, node string) string { return mesh + "--" + src + "--" + node }

// WriteOperatorPeers writes into c what kilo-clustermesh-operator writes
// into every cluster of mesh for the nodes of another cluster, src (its
// entry e): one Peer per node that has a key, a WireGuard IP and a first
// pod CIDR inside e.PodCIDRs, in the order the API lists the nodes. Its
// allowed IPs are that pod CIDR and the WireGuard IP as a host route (the
// InternalIP too where e.Networks cover it), and on the first node's Peer
// the networks of e that no node covers (a service CIDR: the operator's
// "anchor"); its endpoint is kilo.squat.ai/clustermesh-endpoint, else
// force-endpoint, else the first ExternalIP with e.WireguardPort; its
// keepalive e.PersistentKeepalive. The operator does not watch Nodes: like
// it, this writes once. It returns the Peers' names.
func (c *Cluster) WriteOperatorPeers(ctx context.Context, mesh string, src *Cluster, e OperatorEntry) ([]string, error) {
	nodes, err := src.Admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: listing nodes: %w", src.Name, err)
	}
	var valid []*corev1.Node
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Annotations[topology.AnnotationKey] == "" || n.Annotations[topology.AnnotationWireGuardIP] == "" || len(n.Spec.PodCIDRs) == 0 {
			continue
		}
		if pod, err := netip.ParsePrefix(n.Spec.PodCIDRs[0]); err != nil || !coveredBy(pod, e.PodCIDRs) {
			continue
		}
		valid = append(valid, n)
	}
	if len(valid) == 0 {
		return nil, fmt.Errorf("cluster %s: no node the operator would copy (key, wireguard-ip, pod CIDR)", src.Name)
	}
	// The networks no node covers go on the first node's Peer.
	var anchor []string
	for _, nw := range e.Networks {
		covered := false
		for _, n := range valid {
			covered = covered || nodeCovers(n, nw)
		}
		if !covered {
			anchor = append(anchor, nw.String())
		}
	}
	var names []string
	for i, n := range valid {
		wgIP, err := netip.ParsePrefix(n.Annotations[topology.AnnotationWireGuardIP])
		if err != nil {
			return nil, fmt.Errorf("node %s: wireguard-ip: %w", n.Name, err)
		}
		allowed := []string{n.Spec.PodCIDRs[0], netip.PrefixFrom(wgIP.Addr(), wgIP.Addr().BitLen()).String()}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && containedIn(ip, e.Networks) {
				allowed = append(allowed, netip.PrefixFrom(ip, ip.BitLen()).String())
			}
		}
		if i == 0 {
			allowed = append(allowed, anchor...)
		}
		ep, err := operatorEndpoint(n, e.WireguardPort)
		if err != nil {
			return nil, err
		}
		p := kilo.Peer{
			TypeMeta: metav1.TypeMeta{APIVersion: "kilo.squat.ai/v1alpha1", Kind: "Peer"},
			ObjectMeta: metav1.ObjectMeta{Name: OperatorPeerName(mesh, src.Name, n.Name),
				Labels: map[string]string{OperatorLabelMesh: mesh, OperatorLabelSourceCluster: src.Name}},
			Spec: kilo.PeerSpec{AllowedIPs: allowed, PublicKey: n.Annotations[topology.AnnotationKey], Endpoint: ep,
				PersistentKeepalive: e.PersistentKeepalive},
		}
		if err := c.Apply(ctx, p); err != nil {
			return nil, err
		}
		names = append(names, p.Name)
	}
	return names, nil
}

func coveredBy(p netip.Prefix, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func containedIn(ip netip.Addr, nets []netip.Prefix) bool {
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// nodeCovers reports whether the node's own Peer already carries nw: its
// first pod CIDR inside it, or its InternalIP or WireGuard IP in it.
func nodeCovers(n *corev1.Node, nw netip.Prefix) bool {
	if pod, err := netip.ParsePrefix(n.Spec.PodCIDRs[0]); err == nil && coveredBy(pod, []netip.Prefix{nw}) {
		return true
	}
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && nw.Contains(ip) {
			return true
		}
	}
	wgIP, err := netip.ParsePrefix(n.Annotations[topology.AnnotationWireGuardIP])
	return err == nil && nw.Contains(wgIP.Addr())
}

// operatorEndpoint is the operator's endpoint of a node: the first of
// clustermesh-endpoint, force-endpoint, ExternalIP:port that is set (a
// malformed one is an error, not a fall-through).
func operatorEndpoint(n *corev1.Node, port int) (*kilo.PeerEndpoint, error) {
	raw := n.Annotations[topology.AnnotationClusterMeshEndpoint]
	if raw == "" {
		raw = n.Annotations[topology.AnnotationForceEndpoint]
	}
	if raw == "" {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeExternalIP {
				raw = net.JoinHostPort(a.Address, strconv.Itoa(port))
				break
			}
		}
	}
	if raw == "" {
		return nil, fmt.Errorf("node %s: no endpoint the operator would use (clustermesh-endpoint, force-endpoint, ExternalIP)", n.Name)
	}
	host, ps, err := net.SplitHostPort(raw)
	if err != nil {
		return nil, fmt.Errorf("node %s: endpoint %q: %w", n.Name, raw, err)
	}
	p, err := strconv.Atoi(ps)
	if err != nil {
		return nil, fmt.Errorf("node %s: endpoint %q: %w", n.Name, raw, err)
	}
	ep := &kilo.PeerEndpoint{Port: p}
	if _, err := netip.ParseAddr(host); err == nil {
		ep.DNSOrIP.IP = host
	} else {
		ep.DNSOrIP.DNS = host
	}
	return ep, nil
}

// WriteOperatorStatus writes a ClusterMesh's status as the operator does:
// an update of the status subresource under its own field manager, so that
// the fields are the operator's (meshlet's writer then leaves them alone:
// docs/clustermesh.md#status). Every cluster of the mesh gets
// registeredPeers peers and no skipped node; Ready is True.
func (c *Cluster) WriteOperatorStatus(ctx context.Context, name string, registeredPeers map[string]int) error {
	rc, err := cluster.KiloClient(c.RestConfig())
	if err != nil {
		return err
	}
	raw, err := rc.Get().Namespace(Namespace).Resource("clustermeshes").Name(name).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("cluster %s: clustermesh %s: %w", c.Name, name, err)
	}
	var cm map[string]any
	if err := json.Unmarshal(raw, &cm); err != nil {
		return fmt.Errorf("cluster %s: clustermesh %s: %w", c.Name, name, err)
	}
	var clusters []map[string]any
	for _, n := range sortedKeys(registeredPeers) {
		clusters = append(clusters, map[string]any{"name": n, "registeredPeers": registeredPeers[n], "skippedNodes": 0})
	}
	now := time.Now().UTC().Format(time.RFC3339)
	cm["status"] = map[string]any{"clusters": clusters, "conditions": []map[string]any{
		{"type": "NetworksOverlap", "status": "False", "reason": "NoOverlap", "message": "all CIDRs are disjoint", "lastTransitionTime": now},
		{"type": clustermesh.ConditionReady, "status": "True", "reason": "ClusterMeshReady", "message": "all clusters reconciled", "lastTransitionTime": now},
	}}
	body, err := json.Marshal(cm)
	if err != nil {
		return err
	}
	if err := rc.Put().Namespace(Namespace).Resource("clustermeshes").Name(name).SubResource("status").
		Param("fieldManager", "kilo-clustermesh-operator").Body(body).Do(ctx).Error(); err != nil {
		return fmt.Errorf("cluster %s: clustermesh %s status: %w", c.Name, name, err)
	}
	return nil
}

// RemoveClusterMeshCRD deletes the ClusterMesh CRD (meshlet's, which
// AddCluster installs) and waits until it is gone: a cluster whose
// ClusterMeshes were the operator's (which installs its own) or that had
// none (a remote cluster of the operator).
func (c *Cluster) RemoveClusterMeshCRD(ctx context.Context) error {
	dc, err := dynamic.NewForConfig(c.RestConfig())
	if err != nil {
		return err
	}
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if err := crds.Delete(ctx, clustermesh.CRDName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster %s: deleting %s: %w", c.Name, clustermesh.CRDName, err)
	}
	return Poll(ctx, 60*time.Second, 100*time.Millisecond, c.Name+": "+clustermesh.CRDName+" gone", func() (bool, error) {
		_, err := crds.Get(ctx, clustermesh.CRDName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

// GrantSecretsByNameOnly removes the grant of every Secret of the namespace
// that AddCluster gives meshlet's ServiceAccount, and waits until the API
// server refuses it a Secret it is not granted by name: from then on a test
// grants each kubeconfig Secret by name, as a user must
// (manifests/components/remote-secrets).
func (c *Cluster) GrantSecretsByNameOnly(ctx context.Context) error {
	rbac := c.Admin.RbacV1()
	if err := rbac.RoleBindings(Namespace).Delete(ctx, "meshlet-kubeconfigs", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	if err := rbac.Roles(Namespace).Delete(ctx, "meshlet-kubeconfigs", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster %s: %w", c.Name, err)
	}
	tok, err := c.Server.ServiceAccountToken(ctx, Namespace, "meshlet")
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(c.Server.TokenConfig(tok))
	if err != nil {
		return err
	}
	return Poll(ctx, 30*time.Second, 100*time.Millisecond, c.Name+": the namespace's Secrets no longer granted", func() (bool, error) {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: "list", Resource: "secrets", Namespace: Namespace}}}, metav1.CreateOptions{})
		return err == nil && !r.Status.Allowed, err
	})
}

// kgOperatorPoll is how often the kg of an operator's cluster reads the
// cluster (it lists instead of watching: RunKgOperator).
const kgOperatorPoll = 500 * time.Millisecond

// RunKgOperator runs kg on the node in a cluster of kilo-clustermesh-operator:
// RunKg's kg, which also configures the operator's Peers. kg 0.7 knows
// nothing of the operator's labels and configures those Peers as any other;
// the planner RunKg's stand-in plans with is meshlet's, which ignores them
// (they would collide with its own remote peers), so this one plans with the
// Peers as kg reads them: labels dropped. It reads the cluster's Nodes and
// Peers every 0.5 s rather than watching them, and otherwise does what
// RunKg's does (Kilo's rules, the device rewritten whole when kg's
// comparison finds a difference, routes and rules, kg's annotations,
// last-seen every 10 s). StopKg stops it.
func (n *Node) RunKgOperator(ctx context.Context, o KgOptions) (*Kg, error) {
	if n.Running() {
		return nil, fmt.Errorf("node %s: meshlet runs there; kg and meshlet both own kilo0", n.Name)
	}
	n.mu.Lock()
	busy := n.kg != nil
	n.mu.Unlock()
	if busy {
		return nil, fmt.Errorf("node %s: kg already runs", n.Name)
	}
	priv, _, err := wg.LoadOrCreateKey(n.KgKeyFile())
	if err != nil {
		return nil, fmt.Errorf("node %s: kg's key: %w", n.Name, err)
	}
	k := &Kg{n: n, opts: o, priv: priv, pub: priv.PublicKey().String(), reasons: map[string]int{},
		routes: map[string][]string{}, rules: map[string][]string{}, done: make(chan struct{})}
	if err := sysctl(ctx, n.NS, "net.ipv4.ip_forward", "1"); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(n.WGDir, Iface+".sock")); errors.Is(err, os.ErrNotExist) {
		if err := startDevice(ctx, n.env.opts.Meshlet, n.wrap, n.WGDir, Iface); err != nil {
			return nil, fmt.Errorf("kg on %s: %w", n.Name, err)
		}
	}
	d, err := readUAPI(n.WGDir, Iface)
	if err != nil {
		return nil, fmt.Errorf("kg on %s: %w", n.Name, err)
	}
	var set []string
	if d.PublicKey != k.pub {
		set = append(set, "private_key="+HexKey(priv.String()))
	}
	if d.ListenPort != 51820 {
		set = append(set, "listen_port=51820")
	}
	if len(set) > 0 {
		if err := setUAPI(n.WGDir, Iface, set...); err != nil {
			return nil, fmt.Errorf("kg on %s: %w", n.Name, err)
		}
	}
	rc, err := cluster.KiloClient(n.Cluster.RestConfig())
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(n.env.ctx)
	k.cancel = cancel
	n.mu.Lock()
	n.kg = k
	n.mu.Unlock()
	go func() {
		defer close(k.done)
		poll := time.NewTicker(kgOperatorPoll)
		defer poll.Stop()
		last := time.Time{}
		for {
			refresh := time.Since(last) >= kgCheckIn
			err := k.applyAllPeers(cctx, rc, refresh)
			if cctx.Err() != nil {
				return
			}
			if refresh && err == nil {
				last = time.Now()
			}
			k.applies.Add(1)
			k.mu.Lock()
			k.lastErr = err
			k.mu.Unlock()
			select {
			case <-cctx.Done():
				return
			case <-poll.C:
			}
		}
	}()
	return k, nil
}

// applyAllPeers is Kg.applySnapshot on the cluster as listed now, with the
// operator's labels dropped from the Peers (kg does not read labels).
func (k *Kg) applyAllPeers(ctx context.Context, rc rest.Interface, refresh bool) error {
	c := k.n.Cluster
	var objs cluster.Objects
	nodes, err := c.Admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range nodes.Items {
		objs.Nodes = append(objs.Nodes, &nodes.Items[i])
	}
	var peers kilo.PeerList
	if err := rc.Get().Resource("peers").Do(ctx).Into(&peers); err != nil {
		return err
	}
	for i := range peers.Items {
		p := &peers.Items[i]
		for l := range p.Labels {
			if strings.HasPrefix(l, kilo.OperatorLabelPrefix) {
				delete(p.Labels, l)
			}
		}
		objs.Peers = append(objs.Peers, p)
	}
	snap := cluster.Snapshot(objs, nil, c.Name)
	snap.Meshes, snap.Now, snap.Settings = nil, time.Now(), c.KgSettings()
	return k.applySnapshot(ctx, snap, refresh)
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
