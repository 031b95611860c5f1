package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/cluster"
	"github.com/meshlet/meshlet/e2e/apiserver"
)

// Namespace is meshlet's namespace (ClusterMeshes, kubeconfig Secrets).
const Namespace = "kilo-system"

// ClusterSpec describes one cluster.
type ClusterSpec struct {
	Name string
	// PodNet holds the nodes' pod CIDRs (node i gets the i-th /24).
	PodNet netip.Prefix
	// WGSubnet is meshlet's --subnet in this cluster (segment leaders'
	// WireGuard IPs).
	WGSubnet netip.Prefix
	// A PodNet and WGSubnet of IPv6 make an IPv6-only cluster
	// (docs/dual-stack.md#ipv6-only): node i gets the i-th /64 of PodNet
	// and only an IPv6 underlay address.
	//
	// PodNet6, when set, makes the cluster dual-stack (docs/dual-stack.md):
	// node i also gets the i-th /64 of it as its IPv6 pod CIDR, an IPv6
	// underlay address beside its IPv4 one, and meshlet
	// --dual-stack-subnet=WGSubnet6.
	PodNet6, WGSubnet6 netip.Prefix
	// Keepalive is this cluster's persistentKeepalive in ClusterMeshes.
	Keepalive int
	// ExtraArgs are added to every meshlet of this cluster.
	ExtraArgs []string
}

// Cluster is one API server with meshlet's manifests applied.
type Cluster struct {
	ClusterSpec
	env    *Env
	Server *apiserver.Server
	Admin  kubernetes.Interface
	// AgentKubeconfig is the kubeconfig of meshlet's ServiceAccount
	// (manifests/base/rbac.yaml), used by every meshlet of this cluster.
	AgentKubeconfig string
	// RemoteKubeconfig is a kubeconfig of the read-only ServiceAccount of
	// manifests/remote/rbac.yaml: what other clusters' Secrets hold.
	RemoteKubeconfig []byte

	mu       sync.Mutex
	nextPod  int
	fakeKeep map[string]bool // API-only nodes whose last-seen the harness refreshes
}

// repoRoot finds the repository (manifests/) from this source file.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// AddCluster starts an API server and applies, as a user installing
// meshlet would, the namespace, CRDs, meshlet's RBAC and the read-only
// remote RBAC (every cluster of a mesh is remote for the others).
func (e *Env) AddCluster(ctx context.Context, spec ClusterSpec) (*Cluster, error) {
	srv, err := apiserver.StartServer(apiserver.Options{ExtraArgs: e.opts.APIServerArgs, SlowEtcd: e.opts.SlowEtcd}, e.opts.Logf)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", spec.Name, err)
	}
	e.onClose(srv.Close)
	c := &Cluster{ClusterSpec: spec, env: e, Server: srv, fakeKeep: map[string]bool{}}
	admin := srv.AdminConfig()
	c.Admin, err = kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	root := repoRoot()
	for _, f := range []string{"manifests/namespace/namespace.yaml", "manifests/crds/peers.kilo.squat.ai.yaml",
		"manifests/crds/clustermeshes.kilo.squat.ai.yaml", "manifests/base/rbac.yaml", "manifests/remote/rbac.yaml"} {
		if _, err := apiserver.ApplyFile(ctx, admin, filepath.Join(root, f), apiserver.ApplyOptions{}); err != nil {
			return nil, fmt.Errorf("cluster %s: applying %s: %w", spec.Name, f, err)
		}
	}
	// manifests/base grants no Secret: a user adds the kubeconfig Secrets
	// its ClusterMeshes name, by name (manifests/components/remote-secrets).
	// The tests name many, made as they go: every Secret of the namespace
	// stands in for that list.
	if _, err := apiserver.Apply(ctx, admin, []byte(kubeconfigSecretsRBAC), apiserver.ApplyOptions{}); err != nil {
		return nil, fmt.Errorf("cluster %s: kubeconfig Secrets' RBAC: %w", spec.Name, err)
	}
	tok, err := srv.ServiceAccountToken(ctx, Namespace, "meshlet")
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", spec.Name, err)
	}
	dir := filepath.Join(e.dir, "clusters", spec.Name)
	c.AgentKubeconfig = filepath.Join(dir, "meshlet.kubeconfig")
	if err := apiserver.WriteKubeconfig(c.AgentKubeconfig, srv.TokenConfig(tok)); err != nil {
		return nil, err
	}
	// An admin kubeconfig for people poking at the demo with kubectl.
	if err := apiserver.WriteKubeconfig(filepath.Join(dir, "admin.kubeconfig"), admin); err != nil {
		return nil, err
	}
	rtok, err := srv.ServiceAccountToken(ctx, Namespace, "meshlet-remote")
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", spec.Name, err)
	}
	c.RemoteKubeconfig, err = apiserver.Kubeconfig(srv.TokenConfig(rtok), spec.Name)
	if err != nil {
		return nil, err
	}
	// The grants in force before any agent starts: every request of
	// meshlet's must succeed (the audit check at the end of each test).
	if err := apiserver.WaitAuthorized(ctx, srv.TokenConfig(tok), append(apiserver.AgentGrants(Namespace),
		authorizationv1.ResourceAttributes{Verb: "watch", Resource: "secrets", Namespace: Namespace})...); err != nil {
		return nil, fmt.Errorf("cluster %s: agent RBAC: %w", spec.Name, err)
	}
	if err := apiserver.WaitAuthorized(ctx, srv.TokenConfig(rtok), apiserver.RemoteGrants()...); err != nil {
		return nil, fmt.Errorf("cluster %s: remote RBAC: %w", spec.Name, err)
	}
	e.mu.Lock()
	e.clusters = append(e.clusters, c)
	e.mu.Unlock()
	go c.keepFakesFresh(e.ctx)
	e.Logf("cluster %s: API server %s (admin kubeconfig %s)", spec.Name, srv.URL(), filepath.Join(dir, "admin.kubeconfig"))
	return c, nil
}

// kubeconfigSecretsRBAC grants meshlet's agent the Secrets of its
// namespace (AddCluster says why).
const kubeconfigSecretsRBAC = `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: meshlet-kubeconfigs, namespace: ` + Namespace + `}
rules:
- {apiGroups: [""], resources: [secrets], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: meshlet-kubeconfigs, namespace: ` + Namespace + `}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: meshlet-kubeconfigs}
subjects: [{kind: ServiceAccount, name: meshlet, namespace: ` + Namespace + `}]
`

// AdminKubeconfig is the path of a cluster-admin kubeconfig (for kubectl).
func (c *Cluster) AdminKubeconfig() string {
	return filepath.Join(c.env.dir, "clusters", c.Name, "admin.kubeconfig")
}

// APIPort is the API server's port on 127.0.0.1 (on the host and, through
// the harness' forwarders, inside every node).
func (c *Cluster) APIPort() string {
	u := c.Server.URL()
	return u[strings.LastIndex(u, ":")+1:]
}

// allocPodCIDR6 is node i's IPv6 pod CIDR: the i-th /64 of PodNet6
// (after allocPodCIDR, which counts the nodes).
func (c *Cluster) allocPodCIDR6() netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.PodNet6.Addr().As16()
	a[6], a[7] = byte(c.nextPod>>8), byte(c.nextPod)
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// ipv6Only: the cluster's pods (and so its nodes) have IPv6 alone.
func (c *Cluster) ipv6Only() bool { return c.PodNet.Addr().Is6() }

func (c *Cluster) allocPodCIDR() netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextPod++
	if c.ipv6Only() {
		a := c.PodNet.Addr().As16()
		a[6], a[7] = byte(c.nextPod>>8), byte(c.nextPod)
		return netip.PrefixFrom(netip.AddrFrom16(a), 64)
	}
	a := c.PodNet.Addr().As4()
	a[2] = byte(c.nextPod)
	return netip.PrefixFrom(netip.AddrFrom4(a), 24)
}

// MeshEntry is one cluster's entry in a ClusterMesh, as docs/clustermesh.md describes it.
type meshEntry struct {
	Name                string         `json:"name"`
	Local               bool           `json:"local,omitempty"`
	KubeconfigSecretRef map[string]any `json:"kubeconfigSecretRef,omitempty"`
	AllowedNetworks     []string       `json:"allowedNetworks"`
	PersistentKeepalive int            `json:"persistentKeepalive,omitempty"`
}

// SecretName is the kubeconfig Secret of cluster name in other clusters.
func SecretName(cluster string) string { return cluster + "-kubeconfig" }

// ApplyMesh creates, in every given cluster, the kubeconfig Secrets of the
// others (read-only remote credentials) and a ClusterMesh called name
// listing them all, with the cluster's own entry marked local.
func (e *Env) ApplyMesh(ctx context.Context, name string, clusters ...*Cluster) error {
	for _, c := range clusters {
		var entries []meshEntry
		for _, o := range clusters {
			me := meshEntry{Name: o.Name, AllowedNetworks: []string{o.PodNet.String(), o.WGSubnet.String()},
				PersistentKeepalive: o.Keepalive}
			if o.PodNet6.IsValid() {
				me.AllowedNetworks = append(me.AllowedNetworks, o.PodNet6.String(), o.WGSubnet6.String())
			}
			if o == c {
				me.Local = true
			} else {
				me.KubeconfigSecretRef = map[string]any{"name": SecretName(o.Name), "key": "kubeconfig"}
				sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName(o.Name), Namespace: Namespace},
					Data: map[string][]byte{"kubeconfig": o.RemoteKubeconfig}}
				if _, err := c.Admin.CoreV1().Secrets(Namespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return fmt.Errorf("cluster %s: secret: %w", c.Name, err)
				}
			}
			entries = append(entries, me)
		}
		obj := map[string]any{
			"apiVersion": "kilo.squat.ai/v1alpha1", "kind": "ClusterMesh",
			"metadata": map[string]any{"name": name, "namespace": Namespace},
			"spec":     map[string]any{"clusters": entries},
		}
		if err := c.Apply(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}

// Apply server-side applies objects (maps or YAML/JSON bytes) as admin.
func (c *Cluster) Apply(ctx context.Context, objs ...any) error {
	for _, o := range objs {
		var b []byte
		switch v := o.(type) {
		case []byte:
			b = v
		case string:
			b = []byte(v)
		default:
			var err error
			if b, err = json.Marshal(v); err != nil {
				return err
			}
		}
		if _, err := apiserver.Apply(ctx, c.Server.AdminConfig(), b, apiserver.ApplyOptions{}); err != nil {
			return fmt.Errorf("cluster %s: apply: %w", c.Name, err)
		}
	}
	return nil
}

// PatchNodeAnnotations merge-patches a Node's annotations (nil value
// removes one), as a user editing the node would.
func (c *Cluster) PatchNodeAnnotations(ctx context.Context, node string, ann map[string]*string) error {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if _, err := c.Admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cluster %s: patching node %s: %w", c.Name, node, err)
	}
	return nil
}

// Annotations returns a node's annotations.
func (c *Cluster) Annotations(ctx context.Context, node string) (map[string]string, error) {
	n, err := c.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return n.Annotations, nil
}

// createNode creates a Node object as a kubelet would register it: pod CIDR,
// InternalIP, Ready, and the annotations the user set.
func (c *Cluster) createNode(ctx context.Context, name string, pods []netip.Prefix, internal []netip.Addr, ann map[string]string) error {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann,
			Labels: map[string]string{"kubernetes.io/hostname": name}},
		Spec: corev1.NodeSpec{PodCIDR: pods[0].String()},
	}
	for _, p := range pods {
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, p.String())
	}
	created, err := c.Admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("cluster %s: creating node %s: %w", c.Name, name, err)
	}
	now := metav1.Now()
	for _, a := range internal {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := c.Admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("cluster %s: node %s status: %w", c.Name, name, err)
	}
	return nil
}

// FakeNode is a Node that exists only in the API, with the annotations a
// running Kilo agent would publish (as if kg ran there): for changes the
// tests make on "remote nodes" without a namespace and a process each.
type FakeNode struct {
	Name, Location string
	PodCIDR        netip.Prefix // zero: allocate the next one
	Endpoint       string       // host:port
	WireGuardIP    string       // CIDR, "" for a non-leader
	PublicKey      string       // zero: generate
	Extra          map[string]string
}

// AddFakeNode creates f; the harness keeps its last-seen fresh until
// StopRefreshing.
func (c *Cluster) AddFakeNode(ctx context.Context, f FakeNode) (FakeNode, error) {
	if !f.PodCIDR.IsValid() {
		f.PodCIDR = c.allocPodCIDR()
	}
	if f.PublicKey == "" {
		_, f.PublicKey = NewKeyPair()
	}
	ip := f.PodCIDR.Addr().Next()
	ann := map[string]string{
		topology.AnnotationKey:         f.PublicKey,
		topology.AnnotationEndpoint:    f.Endpoint,
		topology.AnnotationInternalIP:  "",
		topology.AnnotationLastSeen:    fmt.Sprint(time.Now().Unix()),
		topology.AnnotationLocation:    f.Location,
		topology.AnnotationWireGuardIP: f.WireGuardIP,
		topology.AnnotationGranularity: "location",
	}
	for k, v := range f.Extra {
		ann[k] = v
	}
	if err := c.createNode(ctx, f.Name, []netip.Prefix{f.PodCIDR}, []netip.Addr{ip}, ann); err != nil {
		return f, err
	}
	c.mu.Lock()
	c.fakeKeep[f.Name] = true
	c.mu.Unlock()
	return f, nil
}

// StopRefreshing stops refreshing a fake node's last-seen (it goes stale
// after Kilo's 60 s, like a node whose agent died).
func (c *Cluster) StopRefreshing(name string) {
	c.mu.Lock()
	delete(c.fakeKeep, name)
	c.mu.Unlock()
}

// DeleteNode deletes a Node object.
func (c *Cluster) DeleteNode(ctx context.Context, name string) error {
	c.StopRefreshing(name)
	return c.Admin.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
}

// keepFakesFresh refreshes last-seen of fake nodes like their agents would
// (Kilo: every 30 s; here every 10 s, well inside the 60 s window).
func (c *Cluster) keepFakesFresh(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		var names []string
		for n := range c.fakeKeep {
			names = append(names, n)
		}
		c.mu.Unlock()
		sort.Strings(names)
		now := fmt.Sprint(time.Now().Unix())
		for _, n := range names {
			_ = c.PatchNodeAnnotations(ctx, n, map[string]*string{topology.AnnotationLastSeen: &now})
		}
	}
}

// Events lists the Events about an object (any namespace).
func (c *Cluster) Events(ctx context.Context, kind, name string) ([]corev1.Event, error) {
	l, err := c.Admin.CoreV1().Events("").List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// RestConfig is an admin config.
func (c *Cluster) RestConfig() *rest.Config { return c.Server.AdminConfig() }

// Nodes returns the cluster's meshlet nodes (not fake ones), in creation order.
func (c *Cluster) Nodes() []*Node {
	var out []*Node
	for _, n := range c.env.Nodes() {
		if n.Cluster == c {
			out = append(out, n)
		}
	}
	return out
}

// ApplyPeer creates or updates a Kilo Peer with one allowed IP and a
// public key (a new one when key is ""); it returns the key.
func (c *Cluster) ApplyPeer(ctx context.Context, name, allowedIP, key string) (string, error) {
	if key == "" {
		_, key = NewKeyPair()
	}
	return key, c.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":%q},
"spec":{"allowedIPs":[%q],"publicKey":%q}}`, name, allowedIP, key))
}

// DeletePeer deletes a Kilo Peer.
func (c *Cluster) DeletePeer(ctx context.Context, name string) error {
	rc, err := cluster.KiloClient(c.RestConfig())
	if err != nil {
		return err
	}
	if err := rc.Delete().Resource("peers").Name(name).Do(ctx).Error(); err != nil {
		return fmt.Errorf("cluster %s: deleting peer %s: %w", c.Name, name, err)
	}
	return nil
}
