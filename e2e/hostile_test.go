package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshlet/meshlet/agent/core/diagnose"
	"github.com/meshlet/meshlet/agent/core/failover"
	"github.com/meshlet/meshlet/agent/core/topology"
	"github.com/meshlet/meshlet/agent/runtime/status"
	"github.com/meshlet/meshlet/e2e/apiserver"
	"github.com/meshlet/meshlet/e2e/harness"
)

// Scenario: a hostile tenant (docs/security.md#claims, #admission). One
// node's agent credentials — a ServiceAccount with meshlet's grants whose
// token is bound to a pod on node a-y1, under the shipped admission policy —
// and one Peer writer try every local row of the threat model against a
// running two-cluster mesh while a-x2 and b-z1 ping each other at 10/s.
// Pass: every attempt is refused (by the API server, or by meshlet with its
// Event), not one ping between the other nodes is lost, and the host's own
// routes are what they were on every node.
func TestHostileTenant(t *testing.T) {
	env, ctx := newEnv(t)
	layout := harness.Small(2, "z")
	layout.Clusters[0].Nodes = append(layout.Clusters[0].Nodes, harness.NodeSpec{Name: "a-y1", Location: "y"})
	must(t, env.Build(ctx, layout))
	a := env.Cluster("cluster-a")
	x1, x2, y1, z1 := env.Node("a-x1"), env.Node("a-x2"), env.Node("a-y1"), env.Node("b-z1") // a-y1 attacks

	// Established before the attack: a Peer (a laptop) and a route of the
	// host's own on a-x1 (a CNI's, say).
	_, laptopKey := harness.NewKeyPair()
	_, err := a.ApplyPeer(ctx, "laptop", "10.5.0.0/24", laptopKey)
	must(t, err)
	_, err = x1.Exec(ctx, "ip", "route", "add", "10.77.0.0/24", "dev", "eth0")
	must(t, err)
	must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "the laptop on a-x1's device", func() (bool, error) {
		return hasAllowedIP(x1, laptopKey, "10.5.0.0/24"), nil
	}))
	hostBefore := map[string][]string{}
	for _, n := range env.Nodes() {
		hostBefore[n.Name] = hostRoutes(t, ctx, n)
	}

	pingX, pingZ := startPinging(t, ctx, x2, z1), startPinging(t, ctx, z1, x2)
	started := time.Now()

	// The attacker's credentials: meshlet's grants, a token of its pod on
	// a-y1, the admission policy for its ServiceAccount.
	evil := hostileAgent(t, ctx, a, "a-y1")

	// 1. The node's own annotations: allowed by the API server (its own
	// Node), refused by meshlet.
	alips := "0.0.0.0/0,0.0.0.0/1,128.0.0.0/1,::/0," + partOf(x1.IP.Masked().String())
	must(t, patchAnnotations(ctx, evil, "a-y1", map[string]*string{
		topology.AnnotationAllowedLocationIPs: &alips,
		topology.AnnotationForceInternalIP:    ptr(x2.IP.String()),
	}))
	// 2. Other objects the API server refuses: another node's key and
	// endpoint, its own labels, a Lease that is not meshlet's.
	denied := []struct {
		what string
		do   func() error
	}{
		{"a-x2's key", func() error {
			return patchAnnotations(ctx, evil, "a-x2", map[string]*string{topology.AnnotationKey: ptr(laptopKey)})
		}},
		{"a-x2's endpoint", func() error {
			return patchAnnotations(ctx, evil, "a-x2", map[string]*string{topology.AnnotationForceEndpoint: ptr(y1.IP.Addr().String() + ":51820")})
		}},
		{"its own labels", func() error {
			_, err := evil.CoreV1().Nodes().Patch(ctx, "a-y1", types.MergePatchType, []byte(`{"metadata":{"labels":{"topology.kubernetes.io/region":"x"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"another component's Lease", func() error {
			_, err := evil.CoordinationV1().Leases(harness.Namespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager"},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr("a-y1")}}, metav1.CreateOptions{})
			return err
		}},
		{"location x's Lease for a-x2", func() error { return setHolder(ctx, evil, failover.LeaseName("x"), "a-x2") }},
	}
	for _, d := range denied {
		if err := d.do(); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("writing %s with a-y1's agent credentials: %v, want refused by the API server", d.what, err)
		} else {
			t.Logf("refused by the API server: %s: %v", d.what, firstLine(err))
		}
	}
	// 3. Location x's Lease taken for itself: the API server lets it (it
	// cannot tell a node's location), location x ignores it.
	must(t, setHolder(ctx, evil, failover.LeaseName("x"), "a-y1"))

	// 4. A Peer writer.
	peers := map[string]string{
		"exit":         `"0.0.0.0/0","0.0.0.0/1","128.0.0.0/1","::/0"`,
		"thief":        fmt.Sprintf(`%q,"10.5.0.7/32"`, halfOf(x1.PodCIDR.String())),
		"remote-thief": `"10.2.0.0/16"`,
		"cni-clash":    `"10.77.0.0/24"`,
	}
	for name, ips := range peers {
		_, key := harness.NewKeyPair()
		must(t, a.Apply(ctx, fmt.Sprintf(`{"apiVersion":"kilo.squat.ai/v1alpha1","kind":"Peer","metadata":{"name":%q},
"spec":{"allowedIPs":[%s],"publicKey":%q}}`, name, ips, key)))
	}
	// A newer Peer with the laptop's prefix and a name that sorts first
	// (created a second later at least: creation times have seconds).
	must(t, harness.Poll(ctx, 5*time.Second, 100*time.Millisecond, "a second after the laptop", func() (bool, error) {
		p, err := a.Admin.CoreV1().RESTClient().Get().AbsPath("/apis/kilo.squat.ai/v1alpha1/peers/laptop").DoRaw(ctx)
		if err != nil {
			return false, err
		}
		var m metav1.PartialObjectMetadata
		if err := json.Unmarshal(p, &m); err != nil {
			return false, err
		}
		return time.Now().After(m.CreationTimestamp.Add(1100 * time.Millisecond)), nil
	}))
	_, err = a.ApplyPeer(ctx, "aaa", "10.5.0.0/24", "")
	must(t, err)

	// Every attempt refused with its Event.
	wants := []eventWant{
		{"Node", "a-y1", []string{string(topology.ReasonDefaultRoute)}, "0.0.0.0/0"},
		{"Node", "a-y1", []string{string(topology.ReasonDefaultRoute)}, "::/0"},
		{"Node", "a-y1", []string{string(topology.ReasonTooBroad)}, "0.0.0.0/1"},
		{"Node", "a-y1", []string{string(topology.ReasonTooBroad)}, "128.0.0.0/1"},
		{"Node", "a-y1", []string{string(topology.ReasonNetworksOverlap)}, partOf(x1.IP.Masked().String())},
		{"Node", "a-y1", []string{string(topology.ReasonDuplicatePrivateIP)}, x2.IP.Addr().String()},
		{"Peer", "exit", []string{string(topology.ReasonDefaultRoute)}, "0.0.0.0/0"},
		{"Peer", "exit", []string{string(topology.ReasonDefaultRoute)}, "::/0"},
		{"Peer", "exit", []string{string(topology.ReasonTooBroad)}, "0.0.0.0/1"},
		{"Peer", "exit", []string{string(topology.ReasonTooBroad)}, "128.0.0.0/1"},
		{"Peer", "thief", []string{string(topology.ReasonDuplicateAllowedIP)}, halfOf(x1.PodCIDR.String())},
		{"Peer", "thief", []string{string(topology.ReasonDuplicateAllowedIP)}, "10.5.0.7/32"},
		{"Peer", "aaa", []string{string(topology.ReasonDuplicateAllowedIP)}, "10.5.0.0/24"},
		{"Peer", "remote-thief", []string{string(topology.ReasonDuplicateAllowedIP)}, "10.2.0.0/16"},
		{"Node", "a-x1", []string{string(topology.ReasonHostRoute)}, "10.77.0.0/24"},
		{"Lease", failover.LeaseName("x"), []string{failover.ReasonForeignLeaseHolder}, "a-y1"},
	}
	_, err = awaitEvents(t, ctx, a, 60*time.Second, "an Event per hostile attempt", wants)
	must(t, err)
	refusedAt := time.Now()
	// The host's route is a finding of a-x1's too, naming the route.
	out, err := x1.Exec(ctx, os.Getenv("MESHLET_BIN"), "status", "-o", "json")
	must(t, err)
	var st status.Status
	must(t, json.Unmarshal([]byte(out), &st))
	found := false
	for _, f := range st.Findings {
		found = found || f.ID == diagnose.IDHostRoute && strings.Contains(f.Message, "10.77.0.0/24 dev eth0")
	}
	if !found {
		t.Errorf("a-x1's status has no %s finding naming the host's route: %+v", diagnose.IDHostRoute, st.Findings)
	}

	// Location x led by one of its own again, holding its Lease.
	must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "location x's Lease back with a node of x", func() (bool, error) {
		l, err := a.Admin.CoordinationV1().Leases(harness.Namespace).Get(ctx, failover.LeaseName("x"), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		h := ptrValue(l.Spec.HolderIdentity)
		return h == "a-x1" || h == "a-x2", fmt.Errorf("held by %q", h)
	}))

	// Nothing of it reached the data plane of the other nodes; the laptop
	// keeps its prefix; the remote cluster stays.
	for _, n := range []*harness.Node{x1, x2, z1} {
		routes, err := n.Routes(ctx)
		must(t, err)
		for _, r := range routes {
			for _, bad := range []string{"default", "0.0.0.0/1", "128.0.0.0/1", partOf(x1.IP.Masked().String()), x2.IP.Addr().String() + " ", halfOf(x1.PodCIDR.String()), "10.5.0.7 "} {
				if strings.HasPrefix(r, bad) {
					t.Errorf("%s routes %q", n.Name, r)
				}
			}
			if n == x1 && strings.HasPrefix(r, "10.77.0.0/24") {
				t.Errorf("a-x1 replaced the host's route: %q", r)
			}
		}
	}
	if !hasAllowedIP(x1, laptopKey, "10.5.0.0/24") {
		t.Error("the laptop lost 10.5.0.0/24 on a-x1")
	}

	// The pings went on throughout.
	holdOn := time.Now().Add(3 * time.Second)
	pace(ctx, time.Until(holdOn))
	for name, p := range map[string]*harness.Pinger{"a-x2 → b-z1": pingX, "b-z1 → a-x2": pingZ} {
		tl := p.Stop()
		w := tl.Window(started, holdOn)
		report(t, "%s: %d of %d lost while %d attempts were made and refused (%.1f s until the last Event), longest gap %s",
			name, w.Lost, w.Sent, len(denied)+len(wants), refusedAt.Sub(started).Seconds(), w.Gap.Round(time.Millisecond))
		if w.Lost > 0 {
			t.Errorf("%s: %d pings lost", name, w.Lost)
		}
	}
	// The host's own routes are what they were on every node.
	for _, n := range env.Nodes() {
		if got := hostRoutes(t, ctx, n); strings.Join(got, "\n") != strings.Join(hostBefore[n.Name], "\n") {
			t.Errorf("%s: the host's routes changed:\nbefore %q\nafter  %q", n.Name, hostBefore[n.Name], got)
		}
	}

	// Undone, the mesh is as it was: no finding left behind.
	must(t, patchAnnotations(ctx, a.Admin, "a-y1", map[string]*string{topology.AnnotationAllowedLocationIPs: nil, topology.AnnotationForceInternalIP: nil}))
	for name := range peers {
		must(t, a.DeletePeer(ctx, name))
	}
	must(t, a.DeletePeer(ctx, "aaa"))
	must(t, a.DeletePeer(ctx, "laptop"))
	_, err = x1.Exec(ctx, "ip", "route", "del", "10.77.0.0/24", "dev", "eth0")
	must(t, err)
	must(t, harness.Poll(ctx, 60*time.Second, 250*time.Millisecond, "the mesh's own routes to 10.77.0.0/24 on a-x1", func() (bool, error) {
		routes, err := x1.Routes(ctx)
		for _, r := range routes {
			if strings.HasPrefix(r, "10.77.0.0/24") {
				return false, fmt.Errorf("still %q", r)
			}
		}
		return err == nil, err
	}))
	must(t, env.WaitConverged(ctx, 60*time.Second))
}

// hostileAgent is a client with meshlet's grants whose token is bound to a
// pod on node (as kubelet's projected token is), under the shipped admission
// policy (manifests/components/admission) bound to its ServiceAccount: the
// credentials of one node's agent.
func hostileAgent(t *testing.T, ctx context.Context, c *harness.Cluster, node string) kubernetes.Interface {
	t.Helper()
	const sa = "meshlet-hostile"
	_, err := c.Admin.CoreV1().ServiceAccounts(harness.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	must(t, err)
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: harness.Namespace}}
	_, err = c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "meshlet"}, Subjects: subject}, metav1.CreateOptions{})
	must(t, err)
	_, err = c.Admin.RbacV1().RoleBindings(harness.Namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "meshlet"}, Subjects: subject}, metav1.CreateOptions{})
	must(t, err)
	policy, err := os.ReadFile(filepath.Join("..", "manifests", "components", "admission", "policy.yaml"))
	must(t, err)
	// The shipped policy, for this ServiceAccount (the e2e agents keep
	// theirs: their tokens are bound to no pod).
	hostile := strings.ReplaceAll(string(policy), "+ ':' + 'meshlet'", "+ ':' + '"+sa+"'")
	hostile = strings.ReplaceAll(hostile, "name: meshlet\n", "name: "+sa+"\n")
	hostile = strings.ReplaceAll(hostile, "policyName: meshlet\n", "policyName: "+sa+"\n")
	if !strings.Contains(hostile, "'"+sa+"'") {
		t.Fatal("the admission policy names its ServiceAccount otherwise than this test expects")
	}
	_, err = apiserver.Apply(ctx, c.RestConfig(), []byte(hostile), apiserver.ApplyOptions{})
	must(t, err)
	pod, err := c.Admin.CoreV1().Pods(harness.Namespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + node},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: "meshlet"}}}}, metav1.CreateOptions{})
	must(t, err)
	exp := int64(3600)
	tr, err := c.Admin.CoreV1().ServiceAccounts(harness.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp, BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
	must(t, err)
	cfg := rest.AnonymousClientConfig(c.RestConfig())
	cfg.BearerToken = tr.Status.Token
	cs, err := kubernetes.NewForConfig(cfg)
	must(t, err)
	// The policy in force: its own Node's annotation goes through, another's
	// does not (the API server compiles a new policy within a second or so).
	must(t, harness.Poll(ctx, 30*time.Second, 200*time.Millisecond, "the admission policy in force", func() (bool, error) {
		err := patchAnnotations(ctx, cs, "a-x1", map[string]*string{"meshlet.io/probe": ptr("x")})
		return apierrors.IsForbidden(err), err
	}))
	return cs
}

// hostRoutes are the node's routes that are the host's own: every table, both
// families, without meshlet's (protocol 109) and what follows meshlet's
// links (kilo0, the tunnel), sorted.
func hostRoutes(t *testing.T, ctx context.Context, n *harness.Node) []string {
	t.Helper()
	var out []string
	for _, fam := range []string{"-4", "-6"} {
		s, err := n.Exec(ctx, "ip", fam, "route", "show", "table", "all")
		must(t, err)
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l == "" || strings.Contains(l, "proto "+harness.RouteProtocol) ||
				strings.Contains(l, "dev kilo0") || strings.Contains(l, "dev tunl0") || strings.Contains(l, "dev cilium_tunl") {
				continue
			}
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

func patchAnnotations(ctx context.Context, cs kubernetes.Interface, node string, ann map[string]*string) error {
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{})
	return err
}

// setHolder makes holder the holder of Lease name, as a candidate taking it.
func setHolder(ctx context.Context, cs kubernetes.Interface, name, holder string) error {
	l, err := cs.CoordinationV1().Leases(harness.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = &holder, &now, &now
	_, err = cs.CoordinationV1().Leases(harness.Namespace).Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// hasAllowedIP tells whether n's device has peer key with allowed IP ip.
func hasAllowedIP(n *harness.Node, key, ip string) bool {
	d, err := n.Device()
	if err != nil || d == nil {
		return false
	}
	for _, a := range d.Peers[key].AllowedIPs {
		if a == ip {
			return true
		}
	}
	return false
}

// partOf is the lower half of a network (192.168.1.0/24 → 192.168.1.0/25);
// halfOf the upper half.
func partOf(network string) string { return halves(network)[0] }
func halfOf(network string) string { return halves(network)[1] }

func halves(network string) [2]string {
	var a, b, c, d, bits int
	if _, err := fmt.Sscanf(network, "%d.%d.%d.%d/%d", &a, &b, &c, &d, &bits); err != nil {
		panic(err)
	}
	v := uint32(a)<<24 | uint32(b)<<16 | uint32(c)<<8 | uint32(d)
	hi := v | 1<<(31-bits)
	f := func(v uint32) string {
		return fmt.Sprintf("%d.%d.%d.%d/%d", v>>24, v>>16&255, v>>8&255, v&255, bits+1)
	}
	return [2]string{f(v), f(hi)}
}

func ptr[T any](v T) *T { return &v }

func ptrValue(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func firstLine(err error) string {
	if err == nil {
		return "<nil>"
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
